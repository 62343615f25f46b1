"""Host MPI transport: NumPy buffers through mpi4py's buffer interface."""

from __future__ import annotations

from itertools import accumulate
from typing import Any, Dict, Optional, Sequence

import numpy as np

from .._faults import run
from ._base import Transport

__all__ = ["HostMPI", "mpi_datatype", "mpi_op"]

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

    def allgatherv(self, send: Any, recv: Any, counts: Sequence[int]) -> None:
        t = mpi_datatype(recv.dtype)
        first = counts[0]
        if counts.count(first) == len(counts):
            self._run("Allgather", [send, first, t], [recv, first, t])
        else:
            self._run("Allgatherv", [send, counts[self.comm.rank], t], [recv, (list(counts), displacements(counts)), t])

    def reduce_scatter(self, send: Any, recv: Any, counts: Sequence[int], op: str) -> None:
        t = mpi_datatype(recv.dtype)
        first = counts[0]
        if counts.count(first) == len(counts):
            self._run("Reduce_scatter_block", [send, t], [recv, first, t], mpi_op(op))
        else:
            self._run("Reduce_scatter", [send, t], [recv, counts[self.comm.rank], t], list(counts), mpi_op(op))

    def allreduce(self, send: Optional[Any], recv: Any, op: str) -> None:
        t = mpi_datatype(recv.dtype)
        self._run("Allreduce", mpi_op("in_place") if send is None else [send, t], [recv, t], mpi_op(op))
