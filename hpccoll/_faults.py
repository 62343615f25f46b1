"""Faults: end the whole job instead of hanging.

Two tools, both opt-in:

- :func:`abort_on_exception` makes an uncaught exception on one rank abort
  every rank, as ``python -m mpi4py script.py`` does, for scripts that cannot
  be launched that way;
- the ``HPCCOLL_TIMEOUT`` watchdog (seconds): each of hpccoll's MPI calls
  registers a deadline before it starts and clears it when it returns; a
  daemon thread that wakes every timeout/20 (at most every 0.5 s) aborts the
  job, naming the call, once a deadline passes -- instead of waiting forever
  for a rank that never calls it (or calls another collective). The MPI
  calls themselves stay the blocking ones (mpi4py releases the GIL in them),
  so a mismatch behaves as without the watchdog (nonblocking collectives,
  polled, were tried: MPICH then completes many mismatched calls silently
  with wrong data instead of failing or hanging). Before it aborts, the
  watchdog writes every thread's Python stack to stderr, each line prefixed
  with ``[rank R/N]`` (:func:`dump_stacks`): the rank whose watchdog fires
  shows where it is stuck, and in a real hang every stuck rank's own
  watchdog fires and dumps its own.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._errors import ArgumentError
from ._log import world_tag

__all__ = ["abort_on_exception", "watched", "dump_stacks", "stack_dump", "TIMEOUT_EXIT_CODE"]

#: The status the watchdog ends the job with (that of ``timeout(1)`` for a command that timed out).
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
            time.sleep(0.5)  # let the launcher forward the traceback before Abort tears the job down
            MPI.COMM_WORLD.Abort(errorcode)

    hook.hpccoll_aborts = True  # type: ignore[attr-defined]
    sys.excepthook = hook


# thread id -> (deadline, what, timeout, rank, size) of the MPI call that thread is in
_ACTIVE: Dict[int, Tuple[float, str, float, int, int]] = {}
_PATROL: List[threading.Thread] = []
_LOCK = threading.Lock()


def watched(comm: Any, what: str, call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)`` under the watchdog: the job aborts if it has not returned within ``comm.timeout``."""
    key = threading.get_ident()
    _ACTIVE[key] = (time.monotonic() + comm.timeout, what, comm.timeout, comm.rank, comm.size)
    if not _PATROL:
        _start_patrol()
    try:
        return call(*args)
    finally:
        del _ACTIVE[key]


def _start_patrol() -> None:
    from mpi4py import MPI

    with _LOCK:
        if _PATROL:
            return
        # Only under MPI_THREAD_MULTIPLE may the patrol thread call MPI_Abort; otherwise it ends
        # its process, and the launcher (mpiexec, srun) ends the job on that abnormal exit.
        multiple = MPI.Query_thread() == MPI.THREAD_MULTIPLE
        world_tag()  # the dump's rank tag, known before the patrol thread needs it (no MPI call there)
        thread = threading.Thread(target=_patrol, args=(multiple,), name="hpccoll-watchdog", daemon=True)
        thread.start()
        _PATROL.append(thread)


def _patrol(multiple: bool) -> None:
    while True:
        now = time.monotonic()
        active = list(_ACTIVE.values())
        for deadline, what, timeout, rank, size in active:
            if now > deadline:
                _abort(what, timeout, rank, size, multiple)
        shortest = min((entry[2] for entry in active), default=10.0)
        time.sleep(min(max(shortest / 20, 0.01), 0.5))


def _abort(what: str, timeout: float, rank: int, size: int, multiple: bool) -> None:
    message = (
        f"hpccoll: {what} did not complete within HPCCOLL_TIMEOUT={timeout:g} s on rank {rank} of {size} "
        f"(a rank never called it, or called another collective); aborting the job with status {TIMEOUT_EXIT_CODE}"
    )
    dump_stacks(message)  # os.write, not sys.stderr: no Python-level lock the main thread might hold
    time.sleep(0.5)  # let the launcher forward the message before the job is torn down
    if multiple:
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(TIMEOUT_EXIT_CODE)
    os._exit(TIMEOUT_EXIT_CODE)


def stack_dump(header: str = "", tag: Optional[str] = None) -> bytes:
    """Every thread's Python stack, as :func:`faulthandler.dump_traceback` writes it, each line rank-tagged.

    faulthandler writes to a file descriptor: the dump goes to a temporary
    file first, then every line gets the prefix ``[rank R/N] ``. A line
    naming each thread (faulthandler shows only their ids) comes first.

    Parameters
    ----------
    header : str
        A first line (the prefix is added to it too); none when empty.
    tag : str, optional
        ``"R/N"``; default :func:`hpccoll._log.world_tag` (the rank in ``MPI.COMM_WORLD``).

    Returns
    -------
    bytes
        The tagged lines, each ending in a newline.
    """
    prefix = f"[rank {tag or world_tag()}] ".encode()
    names = ", ".join(f"0x{t.ident:016x} {t.name}" for t in threading.enumerate() if t.ident is not None)
    lines = ([header.encode()] if header else []) + [f"threads: {names}".encode()]
    try:
        with tempfile.TemporaryFile() as f:
            faulthandler.dump_traceback(file=f, all_threads=True)
            f.seek(0)
            lines += f.read().splitlines()
    except OSError as exc:  # no temporary file: say so rather than lose the header
        lines.append(f"(no stack dump: {type(exc).__name__}: {exc})".encode())
    return b"".join(prefix + line + b"\n" for line in lines)


def dump_stacks(header: str = "", tag: Optional[str] = None, fd: int = 2) -> None:
    """Write :func:`stack_dump` to ``fd`` (stderr) with one ``os.write`` (more only if the pipe takes less).

    The watchdog calls it before it aborts; another abort path (a transport's
    own timeout) may call it before it raises, so that a stuck rank shows
    every thread's stack.

    Parameters
    ----------
    header : str
        The first line: what timed out.
    tag : str, optional
        ``"R/N"``; default the rank in ``MPI.COMM_WORLD``.
    fd : int
        The file descriptor to write to.
    """
    data = stack_dump(header, tag)
    while data:
        try:
            written = os.write(fd, data)
        except OSError:
            return  # stderr is gone: nothing left to tell
        data = data[written:]
