"""CUDA-aware MPI transport: CuPy arrays handed to mpi4py directly.

mpi4py reads device buffers through the CUDA array interface (or DLPack).
MPI knows nothing of CUDA streams, so the producing stream, the caller's
current one, is synchronised first (that stream only, not the whole device).

Whether the MPI library is CUDA-aware is asked of it, in this order, the
first source that answers giving the verdict: MPI-4.1's
``mpi_memory_alloc_kinds`` info key on the communicator (CUDA-aware when it
lists ``cuda`` or ``cuda:device``), then Open MPI's
``MPIX_Query_cuda_support()`` and MPICH's ``MPIX_GPU_query_support`` with
``MPIX_GPU_SUPPORT_CUDA``, called through the MPI library mpi4py has loaded.
``HPCCOLL_CUDA_AWARE_MPI=1`` or ``0`` has the last word. The verdict is agreed
by every rank (a yes on only some ranks is a no on all); ``auto`` picks this
transport only on a yes, and when no source answers (nor the variable) it says
so once through :mod:`warnings`. Asking for ``transport="cuda_mpi"``
explicitly is a declaration too, unless the variable says ``0``.

Not capturable in a CUDA graph (it synchronises the host with the stream):
called during stream capture it raises :class:`~hpccoll.TransportUnavailable`
before any MPI call (asked only when CUDA refuses the synchronisation).
"""

from __future__ import annotations

import ctypes
import functools
import os
import warnings
from typing import Any, Callable, NamedTuple, Optional, Sequence, Tuple

from .. import _settings
from .._errors import MismatchError, TransportUnavailable
from .._request import Pending
from ._base import PRIMITIVES, Prepared
from ._cuda import capture_query, get_runtime, raise_if_capturing
from ._state import remembered
from .host_mpi import HostMPI

__all__ = ["CudaMPI", "CudaAwareness", "cuda_aware", "CUDA_AWARE_VARIABLE"]

CUDA_AWARE_VARIABLE = "HPCCOLL_CUDA_AWARE_MPI"
_KEY = "cuda_mpi:aware"
_warned = False
#: A source's answer: (CUDA-aware, what it said), or None when it gave none.
Answer = Optional[Tuple[bool, str]]


class CudaAwareness(NamedTuple):
    """Whether MPI is CUDA-aware (``None``: no source answered), and which source said so, with what."""

    aware: Optional[bool]
    source: str


def cuda_aware(comm: Any) -> CudaAwareness:
    """Whether this MPI is CUDA-aware, as agreed by every rank, and which source answered.

    ``HPCCOLL_CUDA_AWARE_MPI`` (1/0) has the last word; unset, the MPI library is
    asked (see the module's docstring). A yes on only some ranks is a no on all.
    Collective the first time for ``comm`` (one allgather; cached on it).

    Parameters
    ----------
    comm : Communicator
        The communicator asking.

    Returns
    -------
    CudaAwareness
        ``(aware, source)``, e.g. ``(False, "mpi_memory_alloc_kinds='mpi,system'")``.

    Raises
    ------
    ArgumentError
        The variable is not 1/true/yes/on, 0/false/no/off or empty (on every rank).
    MismatchError
        The ranks disagree about the variable (on every rank).
    """
    return remembered(comm, _KEY, lambda: _agreed(comm))


def _agreed(comm: Any) -> CudaAwareness:
    values = comm.mpi.allgather((_settings.raw(CUDA_AWARE_VARIABLE).lower(), _detected(comm)))
    for rank, (value, _) in enumerate(values):
        if value != values[0][0]:
            raise MismatchError(f"{CUDA_AWARE_VARIABLE}: rank 0 has {values[0][0]!r} but rank {rank} has {value!r}")
    declared = _settings.get(CUDA_AWARE_VARIABLE)  # the same value, so the same verdict, on every rank
    if declared is not None:
        return CudaAwareness(declared, f"{CUDA_AWARE_VARIABLE}={int(declared)}")
    found = [answer for _, answer in values]
    for rank, answer in enumerate(found):
        if answer.aware != found[0].aware:
            return CudaAwareness(False, f"ranks disagree (rank 0: {found[0].source}; rank {rank}: {answer.source})")
    return found[0]


def _detected(comm: Any) -> CudaAwareness:
    """This rank's answer from the first source that gives one (nothing here raises)."""
    for source in (_alloc_kinds, _query_cuda_support, _gpu_query_support):
        try:
            answer = source(comm)
        except Exception:  # a source that fails has not answered
            answer = None
        if answer is not None:
            return CudaAwareness(*answer)
    return CudaAwareness(None, "no source answered")


def _alloc_kinds(comm: Any) -> Answer:
    """MPI-4.1's ``mpi_memory_alloc_kinds`` on ``comm``: CUDA-aware if it lists ``cuda`` or ``cuda:device``."""
    info = comm.mpi.Get_info()
    try:
        kinds = info.Get("mpi_memory_alloc_kinds")
    finally:
        info.Free()
    if kinds is None:
        return None
    aware = any(k.strip() in ("cuda", "cuda:device") for k in kinds.split(","))
    return aware, f"mpi_memory_alloc_kinds={kinds!r}"


def _mpi_function(name: str) -> Any:
    """``name`` from the MPI library mpi4py has loaded, or None (``RTLD_NOLOAD``: never loads another)."""
    from mpi4py import MPI

    try:
        return getattr(ctypes.CDLL(MPI.__file__, mode=os.RTLD_NOLOAD | os.RTLD_LAZY), name)
    except (AttributeError, OSError):
        return None


def _query_cuda_support(comm: Any) -> Answer:
    """Open MPI's (and MPICH's) ``int MPIX_Query_cuda_support(void)``."""
    query = _mpi_function("MPIX_Query_cuda_support")
    if query is None:
        return None
    answer = query()
    return bool(answer), f"MPIX_Query_cuda_support()={answer}"


def _gpu_query_support(comm: Any) -> Answer:
    """MPICH's ``MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &supported)`` (``MPIX_GPU_SUPPORT_CUDA`` is 0)."""
    query = _mpi_function("MPIX_GPU_query_support")
    supported = ctypes.c_int(-1)
    if query is None or query(0, ctypes.byref(supported)) != 0 or supported.value not in (0, 1):
        return None
    return bool(supported.value), f"MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA)={supported.value}"


def warn_undeclared() -> None:
    """Say once per process that CuPy arrays take the staged path because CUDA-awareness is unknown."""
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            f"hpccoll: {CUDA_AWARE_VARIABLE} is not set and MPI does not say whether it is CUDA-aware, so CuPy "
            "arrays that cannot use NCCL go through host memory (transport 'staged'); set it to 1 if your MPI "
            "is CUDA-aware (transport 'cuda_mpi') or to 0 to silence this warning",
            RuntimeWarning,
            stacklevel=4,
        )


class CudaMPI(HostMPI):
    """CuPy arrays through a CUDA-aware MPI (mpi4py buffers from the CUDA array interface)."""

    name = "cuda_mpi"
    array_kind = "cupy"
    priority = 20
    chosen_because = "this MPI is CUDA-aware"

    @classmethod
    def chosen_for(cls, comm: Any) -> str:
        """Why ``auto`` picks this transport for ``comm``: :attr:`chosen_because` and the source that said so."""
        return f"{cls.chosen_because} ({cuda_aware(comm).source})"

    def __init__(self, comm: Any) -> None:
        super().__init__(comm)  # persistent: host MPI's (MPI-4); a plan gets them only when asked for
        self._rt = get_runtime()
        self._capturing = capture_query(self._rt)

    def bind_finish(self, finish: Callable[[], Any]) -> Callable[[], Any]:
        return self._rt.on_this_stream(finish)

    def prepare(self, primitive: str, args: tuple, method: str = "blocking") -> Prepared:
        """Host MPI's call built once on the device buffers (``method="persistent"``: an MPI-4 persistent
        request on them), each run and start preceded by the current stream's synchronisation, which MPI
        needs and host MPI's prepared calls would skip. A plan's ``method="auto"`` gets the blocking call:
        neither ``tune``'s profile nor a plan's race measures device buffers. Not yet run on a GPU."""
        if primitive == "sendrecv":  # messages at device addresses: no graph of MPI_BOTTOM displacements
            return Prepared(self, primitive, args)
        fixed = super().prepare(primitive, args, method)
        if type(fixed) is Prepared:  # the contract's default: each run is this transport's synchronising primitive
            return fixed
        return _Synchronised(self, primitive, args, fixed)

    @classmethod
    def unavailable_reason(cls, comm: Any) -> Optional[str]:
        found = cuda_aware(comm)
        if found.aware is False and found.source.startswith(CUDA_AWARE_VARIABLE):
            return f"{found.source} declares this MPI not CUDA-aware"
        try:
            get_runtime()
        except TransportUnavailable as exc:
            return str(exc)
        return None

    @classmethod
    def auto_reason(cls, comm: Any) -> Optional[str]:
        found = cuda_aware(comm)
        if found.aware:
            return cls.unavailable_reason(comm)
        if found.aware is None:
            warn_undeclared()
            return f"CUDA-awareness unknown ({found.source}; {CUDA_AWARE_VARIABLE} is unset)"
        return f"not CUDA-aware ({found.source})"

    def _sync(self) -> None:
        """MPI knows no streams: wait for the current one (refused during stream capture)."""
        try:
            self._rt.sync_stream()
        except Exception as exc:
            raise_if_capturing(self.name, self._capturing, exc)
            raise

    def allgather_into(self, send: Any, out: Any, lead: int, trail: int, sizes: Sequence[int]) -> bool:
        # MPI derived datatypes over device memory are slow or unsupported in many CUDA-aware
        # MPIs: gather flat and let the GPU relayout.
        return False


def _synchronising(form: str) -> Callable[..., Any]:
    """Host MPI's ``form`` (a primitive or its ``i`` form) on the device buffers, after the current stream's
    synchronisation: MPI knows no streams, and reads the buffers as soon as a call, even a non-blocking one, starts."""
    host = getattr(HostMPI, form)

    @functools.wraps(host)
    def call(self: CudaMPI, *args: Any) -> Any:
        self._sync()
        return host(self, *args)

    return call


for _name in PRIMITIVES:
    for _form in (_name, "i" + _name):
        setattr(CudaMPI, _form, _synchronising(_form))


class _Synchronised(Prepared):
    """A prepared host MPI call on device buffers, the current stream synchronised before each run or start."""

    __slots__ = ("_fixed",)

    def __init__(self, t: CudaMPI, primitive: str, args: tuple, fixed: Prepared) -> None:
        super().__init__(t, primitive, args, fixed.method)
        self._fixed = fixed
        sync, run, start = t._sync, fixed.run, fixed.start

        def synchronised_run() -> None:
            sync()
            run()

        def synchronised_start() -> Pending:
            sync()
            return start()

        self.run = synchronised_run
        self.steps = (synchronised_run,)
        # the prebuilt blocking call starts through this transport's own non-blocking primitive, which
        # synchronises already; a persistent request's Start does not
        self._start = synchronised_start if fixed.method == "persistent" else start

    def free(self) -> None:
        self._fixed.free()
