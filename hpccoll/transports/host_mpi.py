"""Host MPI transport: NumPy buffers through mpi4py's buffer interface."""

from __future__ import annotations

from itertools import accumulate
from typing import Any, Callable, Dict, Optional, Sequence

import numpy as np

from .._faults import _watched, run
from .._request import Pending
from ._base import Transport

__all__ = ["HostMPI", "MPIPending", "mpi_datatype", "mpi_op"]

_DATATYPES: Dict[np.dtype, Any] = {}


def mpi_datatype(dtype: np.dtype) -> Any:
    """The predefined MPI datatype for a wire ``dtype``.

    ``MPI.Datatype.fromcode`` is what ``mpi4py.util.dtlib.from_numpy_dtype``
    uses for elementary types, minus the ``Dup`` that dtlib adds: MPI's
    predefined reduction ops are not defined on duplicated types.
    """
    t = _DATATYPES.get(dtype)
    if t is None:
        from mpi4py import MPI

        t = _DATATYPES[dtype] = MPI.Datatype.fromcode(dtype.char)
    return t


_OPS: Dict[str, Any] = {}


def mpi_op(op: str) -> Any:
    """The MPI op for a wire op name."""
    if not _OPS:
        from mpi4py import MPI

        _OPS.update(sum=MPI.SUM, prod=MPI.PROD, max=MPI.MAX, min=MPI.MIN, in_place=MPI.IN_PLACE)
    return _OPS[op]


def _committed(vector: Any, extent: int) -> Any:
    """``vector`` resized to ``extent`` bytes and committed (``vector`` itself is freed)."""
    try:
        return vector.Create_resized(0, extent).Commit()
    finally:
        vector.Free()


def displacements(counts: Sequence[int]) -> list:
    """Prefix sums of ``counts``, starting at 0."""
    return [0, *accumulate(counts)][:-1]


class HostMPI(Transport):
    """NumPy arrays over MPI (``Allgather(v)``, ``Reduce_scatter(_block)``, ``Allreduce``)."""

    name = "mpi"
    array_kind = "numpy"
    in_place = True
    #: Outputs at least this large are gathered along an inner axis with MPI
    #: derived datatypes, straight into place (smaller ones pack and copy).
    strided_min_bytes = 1 << 16
    #: With uneven shards the derived datatype moves ``trail`` elements at a
    #: time; below this many bytes per piece packing is faster.
    strided_min_piece = 512

    def _run(self, name: str, *args: Any) -> None:
        """The MPI collective ``name``, watched when ``HPCCOLL_TIMEOUT`` is set."""
        run(self.comm, name, *args)

    def allgather_into(self, send: Any, out: Any, lead: int, trail: int, sizes: Sequence[int]) -> bool:
        itemsize = out.itemsize
        if out.nbytes < self.strided_min_bytes:
            return False
        first = sizes[0]
        even = sizes.count(first) == len(sizes)
        if not even and trail * itemsize < self.strided_min_piece:
            return False
        base = mpi_datatype(out.dtype)
        total = sum(sizes)
        mine = sizes[self.comm.rank]
        if even:
            # Rank r's block: lead rows of first*trail elements, row stride total*trail.
            recv_t = _committed(base.Create_vector(lead, first * trail, total * trail), first * trail * itemsize)
            try:
                self._run("Allgather", [send, lead * mine * trail, base], [out, 1, recv_t])
            finally:
                recv_t.Free()
            return True
        # One unit = one index along the axis: lead pieces of trail elements.
        recv_t = _committed(base.Create_vector(lead, trail, total * trail), trail * itemsize)
        send_t = _committed(base.Create_vector(lead, trail, max(mine, 1) * trail), trail * itemsize)
        try:
            self._run("Allgatherv", [send, mine, send_t], [out, (list(sizes), displacements(sizes)), recv_t])
        finally:
            recv_t.Free()
            send_t.Free()
        return True

    def allgatherv(self, send: Optional[Any], recv: Any, counts: Sequence[int]) -> None:
        self._call(*self._allgatherv(send, recv, counts), blocking=True)

    def iallgatherv(self, send: Optional[Any], recv: Any, counts: Sequence[int]) -> Pending:
        return self._call(*self._allgatherv(send, recv, counts), blocking=False)

    def reduce_scatter(self, send: Optional[Any], recv: Any, counts: Sequence[int], op: str) -> None:
        self._call(*self._reduce_scatter(send, recv, counts, op), blocking=True)

    def ireduce_scatter(self, send: Optional[Any], recv: Any, counts: Sequence[int], op: str) -> Pending:
        return self._call(*self._reduce_scatter(send, recv, counts, op), blocking=False)

    def allreduce(self, send: Optional[Any], recv: Any, op: str) -> None:
        self._call(*self._allreduce(send, recv, op), blocking=True)

    def iallreduce(self, send: Optional[Any], recv: Any, op: str) -> Pending:
        return self._call(*self._allreduce(send, recv, op), blocking=False)

    def _call(self, name: str, args: tuple, then: Optional[Callable[[], None]], blocking: bool) -> Any:
        """Run MPI collective ``name`` (blocking, watched under ``HPCCOLL_TIMEOUT``) or start its ``I`` twin."""
        if blocking:
            self._run(name, *args)
            if then is not None:
                then()
            return None
        request = getattr(self.comm.mpi, "I" + name[0].lower() + name[1:])(*args)
        return MPIPending(request, then, self.comm, f"MPI_{name}")

    # Each of these returns (MPI function name, its arguments, a step to run after completion).

    def _allgatherv(self, send: Optional[Any], recv: Any, counts: Sequence[int]) -> tuple:
        t = mpi_datatype(recv.dtype)
        first = counts[0]
        if counts.count(first) == len(counts):
            return "Allgather", (_in_place() if send is None else [send, first, t], [recv, first, t]), None
        source = _in_place() if send is None else [send, counts[self.comm.rank], t]
        return "Allgatherv", (source, [recv, (list(counts), displacements(counts)), t]), None

    def _reduce_scatter(self, send: Optional[Any], recv: Any, counts: Sequence[int], op: str) -> tuple:
        t = mpi_datatype(recv.dtype)
        rank, first = self.comm.rank, counts[0]
        mine = counts[rank]
        even = counts.count(first) == len(counts)
        if send is None:  # in place: recv holds the whole input
            source, target = _in_place(), [recv, t]
        else:
            source, target = [send, t], [recv, first if even else mine, t]
        start = sum(counts[:rank])
        # MPI's in-place reduce-scatter leaves the result at the start of recv: move it to this rank's block.
        then = _mover(recv, start, mine) if send is None and start else None
        if even:
            return "Reduce_scatter_block", (source, target, mpi_op(op)), then
        return "Reduce_scatter", (source, target, list(counts), mpi_op(op)), then

    def _allreduce(self, send: Optional[Any], recv: Any, op: str) -> tuple:
        t = mpi_datatype(recv.dtype)
        return "Allreduce", (_in_place() if send is None else [send, t], [recv, t], mpi_op(op)), None


def _mover(buf: Any, start: int, count: int) -> Callable[[], None]:
    """A step that copies ``buf[:count]`` to ``buf[start:start + count]`` (overlap allowed)."""

    def move() -> None:
        # Overlapping ranges (start < count) are copied out first: NumPy would cope, but on CuPy arrays
        # (transport cuda_mpi) the copy is cudaMemcpyAsync or a parallel kernel, undefined on overlap.
        buf[start : start + count] = buf[:count].copy() if start < count else buf[:count]

    return move


def _in_place() -> Any:
    return mpi_op("in_place")


class MPIPending(Pending):
    """An MPI request as the transport contract's :class:`Pending`, with an optional completion step.

    ``wait()`` is watched like the blocking calls when the communicator has a
    ``timeout`` (``HPCCOLL_TIMEOUT``).
    """

    __slots__ = ("request", "then", "comm", "what")

    def __init__(self, request: Any, then: Optional[Callable[[], None]], comm: Any, what: str) -> None:
        self.request = request
        self.then = then
        self.comm = comm
        self.what = what

    def _finish(self) -> None:
        if self.then is not None:
            self.then()
            self.then = None

    def wait(self) -> None:
        if self.comm.timeout is None:
            self.request.Wait()
        else:
            _watched(self.comm, self.what, self.request.Wait)
        self._finish()

    def test(self) -> bool:
        if self.request.Test():
            self._finish()
            return True
        return False
