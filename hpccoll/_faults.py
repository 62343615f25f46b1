"""Faults: end the whole job instead of hanging.

Two tools, both opt-in:

- :func:`abort_on_exception` makes an uncaught exception on one rank abort
  every rank, as ``python -m mpi4py script.py`` does, for scripts that cannot
  be launched that way;
- the ``HPCCOLL_TIMEOUT`` watchdog (seconds): hpccoll's MPI collectives are
  then started nonblocking and polled, and one still incomplete after the
  limit aborts the job with a message naming it, instead of waiting forever
  for a rank that never calls it (or calls another collective).
"""

from __future__ import annotations

import math
import os
import pickle
import sys
import time
from typing import Any, List, NoReturn, Optional

import numpy as np

from ._errors import ArgumentError

__all__ = ["abort_on_exception", "timeout_from_env", "run", "allgather_object", "TIMEOUT_EXIT_CODE"]

_yield = getattr(os, "sched_yield", lambda: time.sleep(0))

#: The status the watchdog aborts with (that of ``timeout(1)`` for a command that timed out).
TIMEOUT_EXIT_CODE = 124


def abort_on_exception(errorcode: int = 1) -> None:
    """Make an uncaught exception on any rank abort the whole MPI job.

    Installs a :data:`sys.excepthook` that prints the traceback as usual, then
    calls ``MPI.COMM_WORLD.Abort(errorcode)``. Without it, a rank that dies of
    an exception leaves the others waiting in their next collective forever.
    ``python -m mpi4py script.py`` does the same (and also covers
    ``sys.exit`` with a non-zero status); use this where the script cannot be
    launched that way (console entry points, embedded interpreters).
    Calling it again does nothing.

    Parameters
    ----------
    errorcode : int
        The exit status the job ends with.

    Examples
    --------
    >>> import hpccoll
    >>> hpccoll.abort_on_exception()   # doctest: +SKIP
    """
    if not isinstance(errorcode, int) or isinstance(errorcode, bool):
        raise ArgumentError(f"errorcode: expected an int; got {type(errorcode).__name__} {errorcode!r}")
    previous = sys.excepthook
    if getattr(previous, "hpccoll_aborts", False):
        return

    def hook(exc_type: Any, exc: BaseException, tb: Any) -> None:
        try:
            previous(exc_type, exc, tb)
        finally:
            from mpi4py import MPI

            sys.stdout.flush()
            sys.stderr.flush()
            MPI.COMM_WORLD.Abort(errorcode)

    hook.hpccoll_aborts = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def timeout_from_env() -> Optional[float]:
    """``HPCCOLL_TIMEOUT`` in seconds, or ``None`` (no watchdog) when unset, empty or 0."""
    raw = os.environ.get("HPCCOLL_TIMEOUT", "").strip()
    if raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (value >= 0 and math.isfinite(value)):
        raise ArgumentError(f"HPCCOLL_TIMEOUT: expected a number of seconds >= 0 (0 or unset: no limit); got {raw!r}")
    return value or None


def run(mpi_comm: Any, name: str, *args: Any, timeout: Optional[float], what: str = "") -> None:
    """``mpi_comm.<name>(*args)``: the blocking collective, or, under a timeout, its nonblocking twin, watched.

    ``name`` is an mpi4py buffer collective (``"Allreduce"``, ``"Allgatherv"``,
    ...); its nonblocking twin is ``"I" + name.lower()``'s first letter
    (``Iallreduce``, ``Iallgatherv``, ...).
    """
    if timeout is None:
        getattr(mpi_comm, name)(*args)
        return
    request = getattr(mpi_comm, "I" + name[0].lower() + name[1:])(*args)
    watch(request, mpi_comm, timeout, what or f"MPI_{name}")


def watch(request: Any, mpi_comm: Any, timeout: float, what: str) -> None:
    """Wait for ``request``, polling; abort the job if it is still incomplete after ``timeout`` seconds."""
    if request.Test():
        return
    deadline = time.monotonic() + timeout
    while not request.Test():
        # Give the core away between polls, as MPI's own blocking waits do: with more ranks than
        # cores, spinning without yielding costs a scheduler time slice (ms) per collective step.
        _yield()
        if time.monotonic() > deadline:
            _abort(mpi_comm, what, timeout)


def allgather_object(mpi_comm: Any, obj: Any, timeout: Optional[float], what: str = "") -> List[Any]:
    """``mpi_comm.allgather(obj)`` (pickled objects), watched under a timeout like :func:`run`."""
    if timeout is None:
        return mpi_comm.allgather(obj)
    blob = np.frombuffer(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
    lengths = np.empty(mpi_comm.Get_size(), dtype=np.int64)
    run(mpi_comm, "Allgather", np.array([blob.size], dtype=np.int64), lengths, timeout=timeout, what=what)
    data = np.empty(int(lengths.sum()), dtype=np.uint8)
    run(mpi_comm, "Allgatherv", blob, [data, lengths.tolist()], timeout=timeout, what=what)
    ends = np.cumsum(lengths).tolist()
    return [pickle.loads(data[end - n : end].tobytes()) for n, end in zip(lengths.tolist(), ends)]


def _abort(mpi_comm: Any, what: str, timeout: float) -> NoReturn:
    from mpi4py import MPI

    sys.stdout.flush()
    sys.stderr.write(
        f"hpccoll: {what} did not complete within HPCCOLL_TIMEOUT={timeout:g} s on rank {mpi_comm.Get_rank()} "
        f"of {mpi_comm.Get_size()} (a rank never called it, or called another collective); aborting the job "
        f"with status {TIMEOUT_EXIT_CODE}\n"
    )
    sys.stderr.flush()
    time.sleep(0.2)  # let the launcher forward the message before Abort tears the job down
    MPI.COMM_WORLD.Abort(TIMEOUT_EXIT_CODE)
    raise SystemExit(TIMEOUT_EXIT_CODE)  # not reached: Abort does not return
