"""examples/heat_adjoint.py: the adjoint-state gradient of a 2-D heat equation over hpccoll.halo_exchange.

The example checks itself (the gathered field and the gradient against a serial NumPy run,
a finite difference, two dot tests) and exits non-zero when a check fails. It runs here
in-process at the suite's rank count (so ``make test`` runs it at 1, 2, 3 and 4 ranks),
and, from the serial suite only, under its documented launch line at 1 and 4 ranks.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from launch import run_mpiexec
from mpi4py import MPI

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "heat_adjoint.py"
PASSED = "heat_adjoint: all checks passed"

#: Flags for the in-process runs: the defaults (25 x 19, Dirichlet 0), and a small periodic grid.
RUNS = {"25x19-dirichlet": [], "7x5-periodic": ["--periodic", "--shape", "7", "5", "--steps", "3"]}


def _load():
    spec = importlib.util.spec_from_file_location("hpccoll_example_heat_adjoint", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.mpi
@pytest.mark.parametrize("argv", list(RUNS.values()), ids=list(RUNS))
def test_heat_adjoint_in_process(argv, capsys):
    size = MPI.COMM_WORLD.Get_size()
    status = _load().main(argv)
    out = capsys.readouterr().out
    assert status == 0, out
    if MPI.COMM_WORLD.Get_rank() == 0:
        assert f"{PASSED} on {size} rank(s)" in out, out
        assert "[FAILED]" not in out and out.count("[ok]") == 5, out


@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="launches its own mpiexec; runs in the serial suite")
@pytest.mark.parametrize("n", [1, 4])
def test_heat_adjoint_under_mpiexec(n):
    proc = run_mpiexec(n, [sys.executable, "-m", "mpi4py", str(SCRIPT)], timeout=180, check=False)
    report = f"$ {' '.join(map(str, proc.args))}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    assert proc.returncode == 0, report
    assert f"{PASSED} on {n} rank(s)" in proc.stdout, report
    assert "[FAILED]" not in proc.stdout and proc.stdout.count("[ok]") == 5, report
