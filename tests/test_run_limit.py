"""The time limits: no test's own reaches its run's, and a run killed at its limit names the test it was in.

The Makefile runs each suite under ``timeout $(TEST_TIMEOUT)``. Here a tiny suite, with a copy of this
folder's conftest.py, hangs on purpose: rank 0 sleeps in Python, the other rank waits in ``MPI_Barrier``
(inside MPI, where the main thread runs no Python signal handler). ``timeout`` sends the signal the Makefile
sends with this MPI, and every rank must say which test it was in before the run exits with 124.
"""

from __future__ import annotations

import ast
import configparser
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from launch import _stop, child_env, mpi_flavour, mpiexec_command
from mpi4py import MPI

pytestmark = pytest.mark.skipif(
    MPI.COMM_WORLD.size > 1, reason="launches its own pytest under timeout; runs in the serial suite"
)

ROOT = Path(__file__).resolve().parent.parent


def test_no_test_limit_reaches_the_run_limit():
    """Every literal limit in tests/ (``@pytest.mark.timeout(N)``, ``timeout=N`` of a subprocess or a job) and
    setup.cfg's per-test default stay below the Makefile's TEST_TIMEOUT: a test that hangs is then named by
    its own limit, not ended unnamed with the run."""
    run = int(re.search(r"^TEST_TIMEOUT \?= (\d+)$", (ROOT / "Makefile").read_text(), re.M).group(1))
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    limits = [("setup.cfg [tool:pytest] timeout", float(cfg["tool:pytest"]["timeout"]))]
    for path in sorted((ROOT / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            values = [node.args[0]] if name == "timeout" and node.args else []
            values += [k.value for k in node.keywords if k.arg == "timeout"]
            limits += [
                (f"tests/{path.name}:{node.lineno}", v.value)
                for v in values
                if isinstance(v, ast.Constant) and isinstance(v.value, (int, float))
            ]
    assert len(limits) > 10, limits  # the scan found the suite's limits
    over = [f"{where}: {seconds:g} s" for where, seconds in limits if seconds >= run]
    assert not over, f"limits that reach the run's TEST_TIMEOUT={run} s (Makefile): {over}"


HANGS = """
    import pathlib
    import time

    from mpi4py import MPI


    def test_hangs_in_a_collective():
        world = MPI.COMM_WORLD
        pathlib.Path(f"started-{world.rank}").touch()
        if world.rank == 0:
            time.sleep(600)  # in Python: the main thread's handler can run
        world.Barrier()  # the other ranks: inside MPI, only the reporter's thread can
"""
NODEID = "test_hangs.py::test_hangs_in_a_collective (call)"
#: Seconds before ``timeout`` fires: the first that lets every rank reach the test wins (a busy machine is slow
#: to start Python, pytest and MPI; a kill during start-up is retried with the next).
LIMITS = (5, 15, 45)


@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils' timeout")
@pytest.mark.parametrize("n", [1, 2], ids=["serial", "2-ranks"])
def test_a_run_killed_at_its_limit_names_the_test_on_every_rank(tmp_path, n):
    for helper in ("conftest.py", "tiers.py"):  # conftest imports tiers
        shutil.copy(Path(__file__).with_name(helper), tmp_path / helper)
    (tmp_path / "test_hangs.py").write_text(textwrap.dedent(HANGS))
    # the Makefile's choice: Open MPI's mpiexec aborts on TERM and drops what the ranks print; it passes USR2 on
    sig = "USR2" if n > 1 and mpi_flavour() == "openmpi" else "TERM"
    pytest_args = [sys.executable, "-m", "mpi4py", "-m", "pytest", "--with-mpi", "-p", "no:cacheprovider", "-q"]
    # its own basetemp: conftest would give a 2-rank run /tmp/hpccoll-pytest-rankN, which pytest empties first
    pytest_args += ["--basetemp", str(tmp_path / "basetemp"), "test_hangs.py"]
    job = pytest_args if n == 1 else mpiexec_command(n, pytest_args)
    for limit in LIMITS:
        for started in tmp_path.glob("started-*"):
            started.unlink()
        proc = subprocess.Popen(
            ["timeout", "-s", sig, "-k", "30", str(limit), *job],
            cwd=tmp_path,
            env=child_env(drop=("HPCCOLL_",)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=limit + 60)
        except subprocess.TimeoutExpired:
            _stop(proc)
            pytest.fail(f"timeout {limit} did not end the run within 60 s more", pytrace=False)
        if len(list(tmp_path.glob("started-*"))) == n:
            break  # every rank was in the test when the signal came
    else:
        pytest.fail(f"the ranks did not all reach the test within {LIMITS[-1]} s:\n{out[-3000:]}", pytrace=False)
    assert proc.returncode == 124, f"exit status {proc.returncode}, not timeout's 124:\n{out[-3000:]}"
    for rank in range(n):
        said = f"KILLED by SIG{sig} (the run's time limit, make's TEST_TIMEOUT, or another kill) on rank {rank} of {n}"
        assert f"{said}: in {NODEID}" in out, f"rank {rank} did not name the test:\n{out[-3000:]}"
