"""CUDA-aware MPI transport: CuPy arrays handed to mpi4py directly.

mpi4py reads device buffers through the CUDA array interface (or DLPack).
MPI knows nothing of CUDA streams, so the producing stream, the caller's
current one, is synchronised first (that stream only, not the whole device).

Whether an MPI library is CUDA-aware cannot be detected reliably, so it is
declared: ``HPCCOLL_CUDA_AWARE_MPI=1`` (yes), ``0`` (no) or unset (not
declared: ``auto`` does not pick this transport, and says so once through
:mod:`warnings`). Asking for ``transport="cuda_mpi"`` explicitly is a
declaration too, unless the variable says ``0``.

Not capturable in a CUDA graph (it synchronises the host with the stream):
called during stream capture it raises :class:`~hpccoll.TransportUnavailable`
before any MPI call (asked only when CUDA refuses the synchronisation).
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Optional, Sequence, Tuple

from .._env import env_flag
from .._errors import MismatchError, TransportUnavailable
from .._request import Pending
from ._base import Prepared
from ._cuda import capture_query, get_runtime, raise_if_capturing
from ._state import remembered
from .host_mpi import HostMPI

__all__ = ["CudaMPI", "cuda_aware", "CUDA_AWARE_VARIABLE"]

CUDA_AWARE_VARIABLE = "HPCCOLL_CUDA_AWARE_MPI"
_KEY = "cuda_mpi:declared"
_warned = False


def cuda_aware(comm: Any) -> Optional[bool]:
    """``HPCCOLL_CUDA_AWARE_MPI`` as agreed by every rank: True, False or None (unset).

    Collective the first time for ``comm`` (cached on it).

    Raises
    ------
    ArgumentError
        The value is not 1/true/yes/on, 0/false/no/off or empty (on every rank).
    MismatchError
        The ranks disagree about the value (on every rank).
    """
    return remembered(comm, _KEY, lambda: _agreed_flag(comm))


def _agreed_flag(comm: Any) -> Optional[bool]:
    values = comm.mpi.allgather(os.environ.get(CUDA_AWARE_VARIABLE, "").strip().lower())
    for rank, value in enumerate(values):
        if value != values[0]:
            raise MismatchError(f"{CUDA_AWARE_VARIABLE}: rank 0 has {values[0]!r} but rank {rank} has {value!r}")
    return env_flag(CUDA_AWARE_VARIABLE, None)  # the same value, so the same verdict, on every rank


def warn_undeclared() -> None:
    """Say once per process that CuPy arrays take the staged path because CUDA-awareness is undeclared."""
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            f"hpccoll: {CUDA_AWARE_VARIABLE} is not set, so CuPy arrays that cannot use NCCL go through "
            "host memory (transport 'staged'); set it to 1 if your MPI is CUDA-aware (transport 'cuda_mpi') "
            "or to 0 to silence this warning",
            RuntimeWarning,
            stacklevel=4,
        )


class CudaMPI(HostMPI):
    """CuPy arrays through a CUDA-aware MPI (mpi4py buffers from the CUDA array interface)."""

    name = "cuda_mpi"
    array_kind = "cupy"
    priority = 20
    chosen_because = "HPCCOLL_CUDA_AWARE_MPI=1 declares this MPI CUDA-aware"

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
        if cuda_aware(comm) is False:
            return f"{CUDA_AWARE_VARIABLE}=0 declares this MPI not CUDA-aware"
        try:
            get_runtime()
        except TransportUnavailable as exc:
            return str(exc)
        return None

    @classmethod
    def auto_reason(cls, comm: Any) -> Optional[str]:
        declared = cuda_aware(comm)
        if declared:
            return cls.unavailable_reason(comm)
        if declared is None:
            warn_undeclared()
        return f"{CUDA_AWARE_VARIABLE} {'is unset' if declared is None else '=0'}"

    def _sync(self) -> None:
        """MPI knows no streams: wait for the current one (refused during stream capture)."""
        try:
            self._rt.sync_stream()
        except Exception as exc:
            raise_if_capturing(self.name, self._capturing, exc)
            raise

    def allgatherv(self, send: Any, recv: Any, counts: Sequence[int]) -> None:
        self._sync()
        super().allgatherv(send, recv, counts)

    def reduce_scatter(self, send: Any, recv: Any, counts: Sequence[int], op: str) -> None:
        self._sync()
        super().reduce_scatter(send, recv, counts, op)

    def allreduce(self, send: Optional[Any], recv: Any, op: str) -> None:
        self._sync()
        super().allreduce(send, recv, op)

    # MPI reads the buffers as soon as a non-blocking call starts: synchronise first here too.
    def iallgatherv(self, send: Any, recv: Any, counts: Sequence[int]) -> Pending:
        self._sync()
        return super().iallgatherv(send, recv, counts)

    def ireduce_scatter(self, send: Any, recv: Any, counts: Sequence[int], op: str) -> Pending:
        self._sync()
        return super().ireduce_scatter(send, recv, counts, op)

    def iallreduce(self, send: Optional[Any], recv: Any, op: str) -> Pending:
        self._sync()
        return super().iallreduce(send, recv, op)

    def allgather_into(self, send: Any, out: Any, lead: int, trail: int, sizes: Sequence[int]) -> bool:
        # MPI derived datatypes over device memory are slow or unsupported in many CUDA-aware
        # MPIs: gather flat and let the GPU relayout.
        return False

    def alltoallv(
        self, send: Any, recv: Any, send_counts: Sequence[int], recv_counts: Sequence[int], even: bool = False
    ) -> None:
        self._sync()
        super().alltoallv(send, recv, send_counts, recv_counts, even)

    def ialltoallv(
        self, send: Any, recv: Any, send_counts: Sequence[int], recv_counts: Sequence[int], even: bool = False
    ) -> Pending:
        self._sync()
        return super().ialltoallv(send, recv, send_counts, recv_counts, even)

    # The rooted primitives: MPI's own (HostMPI's Bcast, Reduce, Gatherv, Scatterv and I-forms) on the
    # device buffers, after the current stream is synchronised, as for the others.
    def sendrecv(self, sends: Sequence[Tuple[Any, int]], recvs: Sequence[Tuple[Any, int]]) -> None:
        self._sync()
        super().sendrecv(sends, recvs)

    def isendrecv(self, sends: Sequence[Tuple[Any, int]], recvs: Sequence[Tuple[Any, int]]) -> Pending:
        self._sync()
        return super().isendrecv(sends, recvs)

    def bcast(self, buf: Any, root: int) -> None:
        self._sync()
        super().bcast(buf, root)

    def reduce(self, send: Optional[Any], recv: Any, op: str, root: int) -> None:
        self._sync()
        super().reduce(send, recv, op, root)

    def gatherv(self, send: Any, recv: Optional[Any], counts: Sequence[int], root: int) -> None:
        self._sync()
        super().gatherv(send, recv, counts, root)

    def scatterv(self, send: Optional[Any], recv: Any, counts: Sequence[int], root: int) -> None:
        self._sync()
        super().scatterv(send, recv, counts, root)

    def ibcast(self, buf: Any, root: int) -> Pending:
        self._sync()
        return super().ibcast(buf, root)

    def ireduce(self, send: Optional[Any], recv: Any, op: str, root: int) -> Pending:
        self._sync()
        return super().ireduce(send, recv, op, root)

    def igatherv(self, send: Any, recv: Optional[Any], counts: Sequence[int], root: int) -> Pending:
        self._sync()
        return super().igatherv(send, recv, counts, root)

    def iscatterv(self, send: Optional[Any], recv: Any, counts: Sequence[int], root: int) -> Pending:
        self._sync()
        return super().iscatterv(send, recv, counts, root)


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
