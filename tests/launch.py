"""One way for tests to start their own MPI job: the right ``mpiexec``, what its MPI needs, a clean environment.

Tests import it as they import conftest's helpers (pytest puts ``tests/`` on
``sys.path``)::

    from launch import run_mpiexec
    proc = run_mpiexec(2, [sys.executable, "-m", "mpi4py", "script.py"])

What each MPI needs, found out from the library this process runs on
(``MPI.Get_library_version()``): Open MPI's launcher refuses more ranks than
cores unless told to oversubscribe, and refuses to run as root unless both of
its allow-run-as-root variables are set; MPICH's (and the MPICH-derived Intel
MPI's and MVAPICH's) needs neither.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

import pytest

__all__ = ["child_env", "find_mpiexec", "mpi_flavour", "mpiexec_command", "run_mpiexec"]

#: What a launcher sets for the ranks it starts (MPICH's Hydra: PMI_*, HYDI_*, MPI_LOCAL*; Open MPI's
#: PRRTE: OMPI_*, PMIX_*, PRTE_*, OPAL_*). A child mpiexec or MPI program that inherits them takes
#: itself for a rank of this process's job and fails to start.
JOB_PREFIXES = ("PMI_", "PMIX_", "HYDI_", "MPI_LOCALNRANKS", "MPI_LOCALRANKID", "OMPI_", "PRTE_", "OPAL_")
#: ... except the user's own settings among them, which the child needs as much as this process did,
_USER_PREFIXES = ("OMPI_MCA_", "PRTE_MCA_", "PMIX_MCA_", "OMPI_ALLOW_RUN_AS_ROOT", "OPAL_PREFIX")
#: (The MCA values that Open MPI's launcher itself passes to its ranks are left out all the same.)
_LAUNCHER_MCA = (
    "OMPI_MCA_num_procs",
    "OMPI_MCA_initial_wdir",
    "OMPI_MCA_cpu_type",
    "OMPI_MCA_PREFIXES",
    "OMPI_MCA_ess",
    "OMPI_MCA_orte_",
    "OMPI_MCA_pmix",
)
#: How much of the child's stdout and stderr a failure shows.
TAIL = 4000


@functools.lru_cache(maxsize=None)
def mpi_flavour() -> str:
    """The MPI library this process runs on: ``"openmpi"``, ``"mpich"`` (MPICH, Intel MPI, MVAPICH) or ``"other"``."""
    from mpi4py import MPI

    version = MPI.Get_library_version()
    if "Open MPI" in version:
        return "openmpi"
    if any(name in version for name in ("MPICH", "Intel(R) MPI", "MVAPICH")):
        return "mpich"
    return "other"


def find_mpiexec() -> Optional[str]:
    """The ``mpiexec`` of this interpreter's MPI: next to ``sys.executable`` (a venv's MPI wheel), else on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


def _cores() -> int:
    """Physical cores this process may run on: what Open MPI counts as slots on a machine without a host file."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topology / "physical_package_id").read_text(), (topology / "core_id").read_text()))
        except OSError:
            return len(cpus)
    return len(cores)


def child_env(env: Optional[Mapping[str, str]] = None, drop: Iterable[str] = ()) -> Dict[str, str]:
    """This process's environment for a child MPI job or MPI program, without the variables of the job it runs in.

    Parameters
    ----------
    env : mapping, optional
        Variables to set on top.
    drop : iterable of str, optional
        Prefixes of further variables to leave out (``"HPCCOLL_"``: none of the suite's own settings).

    Returns
    -------
    dict
        The environment, with Open MPI's allow-run-as-root pair added when running as root under Open MPI.
    """
    drop = tuple(drop)

    def launcher_set(key: str) -> bool:
        return key.startswith(JOB_PREFIXES) and (key.startswith(_LAUNCHER_MCA) or not key.startswith(_USER_PREFIXES))

    clean = {k: v for k, v in os.environ.items() if not launcher_set(k) and not k.startswith(drop)}
    if mpi_flavour() == "openmpi" and os.geteuid() == 0:
        clean.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    clean.update(env or {})
    return clean


def mpiexec_command(n: int, args: Sequence[str]) -> List[str]:
    """``mpiexec -n n args``, with what this MPI's launcher needs for ``n`` ranks here; skips the test without one.

    Parameters
    ----------
    n : int
        Number of ranks.
    args : sequence of str
        The program and its arguments, e.g. ``[sys.executable, "-m", "mpi4py", "script.py"]``.

    Returns
    -------
    list of str
        The command line (Open MPI's gets ``--oversubscribe`` when ``n`` exceeds the cores).
    """
    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.skip(f"no mpiexec next to {sys.executable} or on PATH")
    extra = ["--oversubscribe"] if mpi_flavour() == "openmpi" and n > _cores() else []
    return [mpiexec, *extra, "-n", str(n), *args]


def _stop(proc: subprocess.Popen) -> None:
    """End a job that ran out of time, its ranks included: SIGTERM to its process group, then SIGKILL."""
    for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace)
            return
        except subprocess.TimeoutExpired:
            pass


def run_mpiexec(
    n: int,
    args: Sequence[str],
    *,
    env: Optional[Mapping[str, str]] = None,
    drop: Iterable[str] = (),
    timeout: float = 120,
    cwd: Optional[os.PathLike] = None,
    check: bool = True,
) -> subprocess.CompletedProcess:
    """Run ``args`` under ``mpiexec -n n`` (see :func:`mpiexec_command`) and return what it printed.

    Parameters
    ----------
    n : int
        Number of ranks.
    args : sequence of str
        The program and its arguments.
    env, drop : optional
        The child's environment: see :func:`child_env`.
    timeout : float, optional
        Seconds before the job counts as hung: it is ended, ranks included, and the test fails.
    cwd : path-like, optional
        The job's working directory.
    check : bool, optional
        Fail the test when the job exits non-zero (pass ``False`` to examine a job meant to fail).

    Returns
    -------
    subprocess.CompletedProcess
        With ``returncode``, and ``stdout`` and ``stderr`` as text.

    Raises
    ------
    pytest.fail.Exception
        On a timeout, or a non-zero exit with ``check``: the message shows the command and the tail of
        both streams.

    Examples
    --------
    >>> proc = run_mpiexec(2, [sys.executable, "-m", "mpi4py", "-c", "print('hi')"])  # doctest: +SKIP
    >>> proc.stdout  # doctest: +SKIP
    'hi\\nhi\\n'
    """
    cmd = mpiexec_command(n, args)
    # its own session: on a timeout the whole job (mpiexec and the ranks it forked) can be ended together
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=child_env(env, drop),
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(proc)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a rank outside the process group still holds the pipes
            out, err = "", ""
        pytest.fail(_report(cmd, f"timed out after {timeout:g} s (ended)", out, err), pytrace=False)
    done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    if check and done.returncode != 0:
        pytest.fail(_report(cmd, f"exit status {done.returncode}", out, err), pytrace=False)
    return done


def _report(cmd: Sequence[str], what: str, out: str, err: str) -> str:
    """A failed job's message: the command, how it ended, and the last :data:`TAIL` characters of each stream."""
    return (
        f"$ {shlex.join(cmd)}\n{what} ({mpi_flavour()}, uid {os.geteuid()})\n"
        f"--- stdout (tail)\n{out[-TAIL:]}\n--- stderr (tail)\n{err[-TAIL:]}"
    )
