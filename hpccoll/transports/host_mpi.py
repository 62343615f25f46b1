"""Host MPI transport: NumPy buffers through mpi4py's buffer interface."""

from __future__ import annotations

import functools
import sys
import weakref
from typing import Any, Callable, Optional, Sequence, Tuple

import numpy as np

from .._faults import watched
from .._request import Pending
from ._base import WIRE_OPS, Prepared, Transport
from ._control import receive_buffer, reraise, run, short, truncated
from ._mpitypes import (
    _DATATYPES,
    _OPS,
    committed,
    displacements,
    library,
    mpi_datatype,
    mpi_op,
    region,
    saturating_sums,
    signed_unsigned_extrema,
)

__all__ = ["HostMPI", "MPIPending"]


class HostMPI(Transport):
    """NumPy arrays over MPI (``Allgather(v)``, ``Reduce_scatter(_block)``, ``Allreduce``, ``Alltoall(v)``, pairs,
    ``Bcast`` (one ``Send`` and ``Recv`` between two ranks), ``Reduce``, ``Gather(v)``, ``Scatter(v)``)."""

    name = "mpi"
    array_kind = "numpy"
    priority = 50
    chosen_because = "NumPy arrays use host MPI"
    in_place = True
    hosts = True
    #: Every wire op: MPI's logical and bitwise ones too.
    reduce_ops = WIRE_OPS
    #: Outputs at least this large are gathered along an inner axis with MPI
    #: derived datatypes, straight into place (smaller ones pack and copy).
    strided_min_bytes = 1 << 16
    #: With uneven shards the derived datatype moves ``trail`` elements at a
    #: time; below this many bytes per piece packing is faster.
    strided_min_piece = 512
    #: All-to-alls that are not known even on every rank (``even`` False) among
    #: at most this many ranks go as point-to-point pairs (:meth:`_pairwise`),
    #: which measured faster than MPICH's ``MPI_Alltoallv`` and as fast as its
    #: ``MPI_Alltoall`` (docs/bench/alltoall.md); more ranks keep
    #: ``MPI_Alltoallv`` and MPI's own throttling. The choice
    #: depends only on the communicator's size and on ``even``, both the same
    #: on every rank: a rank in ``MPI_Alltoallv`` and one posting pairs would
    #: hang. 0 turns the pairs off.
    pairwise_max_ranks = 8
    #: Between two ranks a broadcast is one message, and it goes as one: root's ``Send`` (``Isend``,
    #: ``Send_init``) matched by the other's ``Recv`` (``Irecv``, ``Recv_init``) on a tag of its own, faster
    #: than MPI's ``Bcast`` there (docs/benchmarks.md), and every form of it matches every other (a blocking
    #: broadcast on one rank, a non-blocking or a planned one on the other). The choice depends only on the
    #: communicator's size, the same on every rank. False keeps MPI's ``Bcast`` at two ranks too.
    pair_bcast = True
    #: ``sendrecv`` takes NumPy views that are not contiguous (positive strides, multiples of the itemsize:
    #: ``_mpitypes.strided``) and moves them where they lie, as MPI derived datatypes: the halo exchange sends
    #: strided regions of up to this many bytes so, or in contiguous runs of at least this many; it packs
    #: others. 4 KiB on MPICH, whose datatype engine moved larger strided messages in short runs slower than
    #: NumPy's packing plus a contiguous send; any size elsewhere (docs/benchmarks.md, strided messages).
    strided_messages = sys.maxsize

    def __init__(self, comm: Any) -> None:
        super().__init__(comm)
        self._mpi = comm.mpi  # the private duplicate: fixed for the Communicator's life
        if library().startswith("MPICH"):
            self.strided_messages = min(self.strided_messages, 4096)
        self.saturates = saturating_sums()
        self._flip_extrema = signed_unsigned_extrema()
        rank, parts = comm.rank, comm.size
        # _pairwise's partners: receive from rank-1, rank-2, ...; send to rank+1, rank+2, ...
        self._sources = [(rank - step) % parts for step in range(1, parts)]
        self._targets = [(rank + step) % parts for step in range(1, parts)]
        self._pair = parts == 2 and self.pair_bcast  # broadcasts as one send and one receive
        self.bcast_forms_match = self._pair  # Send and Recv match Isend and Irecv
        #: MPI-4 persistent collectives (``MPI_Allreduce_init`` ...) for :meth:`prepare`.
        self.persistent = _persistent_collectives()
        from mpi4py import MPI

        # The receives' statuses, whose sizes are compared with their buffers': one for a blocking receive, a
        # list for Waitall (mpi4py fills the Status objects of a list it is given in place), each refilled by
        # the next call and read right after it (one call at a time on a communicator): nothing allocated.
        self._status = MPI.Status()
        self._statuses: list = []
        self._prepared: "weakref.WeakSet[_Fixed]" = weakref.WeakSet()  # freed by close()

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
            recv_t = committed(base.Create_vector(lead, first * trail, total * trail), first * trail * itemsize)
            try:
                run(self.comm, "Allgather", [send, lead * mine * trail, base], [out, 1, recv_t])
            finally:
                recv_t.Free()
            return True
        # One unit = one index along the axis: lead pieces of trail elements.
        recv_t = committed(base.Create_vector(lead, trail, total * trail), trail * itemsize)
        send_t = committed(base.Create_vector(lead, trail, max(mine, 1) * trail), trail * itemsize)
        try:
            run(self.comm, "Allgatherv", [send, mine, send_t], [out, (list(sizes), displacements(sizes)), recv_t])
        finally:
            recv_t.Free()
            send_t.Free()
        return True

    def allgatherv(self, send: Optional[Any], recv: Any, counts: Sequence[int]) -> None:
        self._blocking(*self._allgatherv(send, recv, counts))

    def iallgatherv(self, send: Optional[Any], recv: Any, counts: Sequence[int]) -> Pending:
        return self._started(*self._allgatherv(send, recv, counts))

    def reduce_scatter(self, send: Optional[Any], recv: Any, counts: Sequence[int], op: str) -> None:
        self._blocking(*self._reduce_scatter(send, recv, counts, op))

    def ireduce_scatter(self, send: Optional[Any], recv: Any, counts: Sequence[int], op: str) -> Pending:
        return self._started(*self._reduce_scatter(send, recv, counts, op))

    def allreduce(self, send: Optional[Any], recv: Any, op: str) -> None:
        self._blocking(*self._allreduce(send, recv, op))

    def iallreduce(self, send: Optional[Any], recv: Any, op: str) -> Pending:
        return self._started(*self._allreduce(send, recv, op))

    def alltoallv(
        self, send: Any, recv: Any, send_counts: Sequence[int], recv_counts: Sequence[int], even: bool = False
    ) -> None:
        if even or self.comm.size > self.pairwise_max_ranks:
            self._blocking(*self._alltoallv(send, recv, send_counts, recv_counts, even))
        elif self.comm.size == 2:
            self._swap(send, recv, send_counts, recv_counts)
        else:
            self._pairwise(send, recv, send_counts, recv_counts).wait()

    def ialltoallv(
        self, send: Any, recv: Any, send_counts: Sequence[int], recv_counts: Sequence[int], even: bool = False
    ) -> Pending:
        if even or self.comm.size > self.pairwise_max_ranks:
            return self._started(*self._alltoallv(send, recv, send_counts, recv_counts, even))
        return self._pairwise(send, recv, send_counts, recv_counts)

    # Both broadcasts are made directly (no name built, no tuple): a small broadcast's cost is mostly these
    # steps, and a large blocking one is the non-blocking call waited on, where every step between MPI's
    # start and its wait delays the message (Selector.OVERLAP_BYTES). Between two ranks each is one message
    # (pair_bcast); _bcast builds the same calls for the watched and the prepared forms.

    def bcast(self, buf: Any, root: int) -> None:
        if self.comm.timeout is not None:
            self._blocking(*self._bcast(buf, root, self._status))
            return
        spec = [buf, _DATATYPES.get(buf.dtype) or mpi_datatype(buf.dtype)]
        try:
            if not self._pair:
                self._mpi.Bcast(spec, root)
            elif self.comm.rank == root:
                self._mpi.Send(spec, 1 - root, _BCAST_TAG)
            else:
                status = self._status
                self._mpi.Recv(spec, root, _BCAST_TAG, status)
                if status.Get_count() != buf.nbytes:  # shorter than buf: MPI accepts it (a longer one raises)
                    raise short("MPI_Recv", buf, status.Get_count(), root)
        except Exception as e:  # noqa: BLE001 - MPI's truncation is translated, anything else raised as it is
            reraise(e, "MPI_Bcast" if not self._pair else "MPI_Recv", buf)

    def ibcast(self, buf: Any, root: int) -> Pending:
        spec = [buf, _DATATYPES.get(buf.dtype) or mpi_datatype(buf.dtype)]
        if not self._pair:
            request = self._mpi.Ibcast(spec, root)
        elif self.comm.rank == root:
            request = self._mpi.Isend(spec, 1 - root, _BCAST_TAG)
        else:
            request = _Sized([self._mpi.Irecv(spec, root, _BCAST_TAG)], [(buf, root)], "MPI_Irecv", self._statuses)
        return MPIPending(request, None, self.comm, "MPI_Bcast")

    def reduce(self, send: Optional[Any], recv: Any, op: str, root: int) -> None:
        name, args, then = self._reduce(send, recv, op, root)
        if then is None and self.comm.timeout is None:
            try:
                self._mpi.Reduce(*args)  # as bcast: no frame between (a small reduce's cost is mostly these steps)
            except Exception as e:  # noqa: BLE001
                reraise(e, "MPI_Reduce", recv)
        else:
            self._blocking(name, args, then)

    def ireduce(self, send: Optional[Any], recv: Any, op: str, root: int) -> Pending:
        return self._started(*self._reduce(send, recv, op, root))

    def gatherv(self, send: Any, recv: Optional[Any], counts: Sequence[int], root: int) -> None:
        self._blocking(*self._gatherv(send, recv, counts, root))

    def igatherv(self, send: Any, recv: Optional[Any], counts: Sequence[int], root: int) -> Pending:
        return self._started(*self._gatherv(send, recv, counts, root))

    def scatterv(self, send: Optional[Any], recv: Any, counts: Sequence[int], root: int) -> None:
        self._blocking(*self._scatterv(send, recv, counts, root))

    def iscatterv(self, send: Optional[Any], recv: Any, counts: Sequence[int], root: int) -> Pending:
        return self._started(*self._scatterv(send, recv, counts, root))

    def sendrecv(self, sends: Sequence[Tuple[Any, int]], recvs: Sequence[Tuple[Any, int]], sized: bool = False) -> None:
        if sized and len(sends) == 1 and len(recvs) == 1:  # a shift of one array: one call, which fills a status
            self._sendrecv_one(sends[0], recvs[0])
        else:
            self._messages(sends, recvs, sized).wait()

    def _sendrecv_one(self, send: Tuple[Any, int], recv: Tuple[Any, int]) -> None:
        """One message each way as one ``MPI_Sendrecv`` (tag ``_MESSAGE_TAG``: it matches :meth:`_messages`'
        ``Irecv``/``Isend`` and a plan's persistent requests), its receive's size compared with its buffer's."""
        (out, to), (into, source) = send, recv
        status = self._status
        args = (region(out), to, _MESSAGE_TAG, region(into), source, _MESSAGE_TAG, status)
        try:
            if self.comm.timeout is None:
                self._mpi.Sendrecv(*args)
            else:
                watched(self.comm, "MPI_Sendrecv", self._mpi.Sendrecv, *args)
        except Exception as e:  # noqa: BLE001 - MPI's truncation is translated, anything else raised as it is
            reraise(e, "MPI_Sendrecv", into, source)
        if status.Get_count() != into.nbytes:  # shorter than into: MPI accepts it (a longer one raises)
            raise short("MPI_Sendrecv", into, status.Get_count(), source)

    def isendrecv(
        self, sends: Sequence[Tuple[Any, int]], recvs: Sequence[Tuple[Any, int]], sized: bool = False
    ) -> Pending:
        return self._messages(sends, recvs, sized)

    def _messages(self, sends: Sequence[Tuple[Any, int]], recvs: Sequence[Tuple[Any, int]], sized: bool) -> Pending:
        """The buffers themselves as ``Irecv``/``Isend`` pairs (every receive posted first), as bytes; ``sized``:
        completing reads the receives' statuses (:class:`_Sized`).

        The k-th message between a pair of ranks has tag ``_MESSAGE_TAG + k`` at both ends, so a pair that
        exchanges several (a periodic axis of extent 2: both faces go to the one neighbour) matches them
        in order; the private duplicate carries no other point-to-point traffic on these tags.
        """
        requests = self._message_requests(sends, recvs, self._mpi.Irecv, self._mpi.Isend)
        pending = _Sized(requests, recvs, "MPI_Irecv", self._statuses) if sized and recvs else _Requests(requests)
        return MPIPending(pending, None, self.comm, "the point-to-point messages")

    @staticmethod
    def _message_requests(
        sends: Sequence[Tuple[Any, int]], recvs: Sequence[Tuple[Any, int]], receive: Any, send: Any
    ) -> list:
        """:meth:`_messages`' requests made by ``receive`` and ``send`` (``Irecv``/``Isend``, or ``Recv_init``/
        ``Send_init``): every receive first, the k-th message of a pair tagged ``_MESSAGE_TAG + k``."""
        requests = []
        for make, messages in ((receive, recvs), (send, sends)):
            seen: dict = {}
            for buf, q in messages:
                k = seen[q] = seen.get(q, -1) + 1
                requests.append(make(region(buf), q, _MESSAGE_TAG + k))
        return requests

    def prepare(self, primitive: str, args: tuple, method: str = "blocking") -> Prepared:
        """The MPI call of ``primitive(*args)`` built once: its blocking form, or (``method="persistent"``,
        MPI >= 4) a persistent request started and completed on each run. ``sendrecv`` is persistent
        requests whatever ``method``: point-to-point ones exist in every MPI, and do strictly less per run
        than the ``Irecv``/``Isend`` pairs they stand for.

        No prepared call reads its receives' statuses: the ranks agreed on a plan's shapes and dtypes when
        it was made, as on a kept halo exchange's, so no message can arrive of another size than its buffer.

        The calls whose arguments change from run to run keep the contract's
        default (the primitive itself each time): uint64 max/min where MPI
        compares them as signed (a flipped copy of the input), all-to-alls as
        point-to-point pairs, and every call under ``HPCCOLL_TIMEOUT`` (watched).
        """
        if primitive not in _BUILDERS or self.comm.timeout is not None or self._flips(primitive, args):
            return Prepared(self, primitive, args)
        if primitive == "alltoallv" and not (args[4] or self.comm.size > self.pairwise_max_ranks):
            return Prepared(self, primitive, args)
        if primitive == "sendrecv":  # persistent whatever the method
            fixed = self._persistent_messages(*args)
        else:
            name, mpi_args, then = _BUILDERS[primitive](self, *args)
            if method == "persistent" and self.persistent:
                request = getattr(self._mpi, name + "_init")(*mpi_args)
                fixed = _Fixed(request, then, self.comm, f"MPI_{name}_init", args)
            else:
                return _Prebuilt(self, primitive, args, getattr(self._mpi, name), mpi_args, then)
        self._prepared.add(fixed)
        return fixed

    def measured_on(self, primitive: str, args: tuple) -> Optional[Tuple[Transport, tuple]]:
        """Where a plan's persistent-or-blocking choice is measured: here, on host buffers; ``None`` (nothing
        to measure) for ``sendrecv``, which :meth:`prepare` makes persistent requests whatever the method, and
        for a subclass on device buffers (``cuda_mpi``: ``"blocking"``)."""
        return None if primitive == "sendrecv" or self.array_kind != "numpy" else (self, args)

    def _flips(self, primitive: str, args: tuple) -> bool:
        """Whether the call is uint64 max/min on an MPI that compares them as signed (:meth:`_flipped`)."""
        if not self._flip_extrema or primitive not in ("allreduce", "reduce_scatter", "reduce"):
            return False
        return bool(args[1].dtype == _UINT64 and args[-1 if primitive != "reduce" else 2] in _EXTREMA)

    def _persistent_messages(
        self, sends: Sequence[Tuple[Any, int]], recvs: Sequence[Tuple[Any, int]], sized: bool = False
    ) -> "_Fixed":
        """:meth:`_messages` as persistent ``Recv_init``/``Send_init`` requests, started and completed together
        on each run: the same messages, tags and datatypes as the ``Irecv``/``Isend`` pairs (a rank running
        them matches a rank running those), strided buffers as one element of their derived datatype
        (:func:`~hpccoll.transports._mpitypes.region`). Local: no rank waits for another to prepare them.

        A persistent ``Neighbor_alltoallw_init`` on a graph of the messages was the form here until the
        strided faces: it measured within the pairs' noise (docs/bench/halo_1205_*), and it is collective,
        so a library that refuses it on one rank only (Open MPI 5.0.11 did, once, in the suite at 3 ranks)
        left the ranks in different forms of one exchange, which hangs.
        """
        pairs = _Requests(self._message_requests(sends, recvs, self._mpi.Recv_init, self._mpi.Send_init))
        return _Fixed(pairs, None, self.comm, "the point-to-point messages", (sends, recvs))

    def close(self) -> None:
        for fixed in list(self._prepared):
            fixed.free()
        self._prepared.clear()

    def _pairwise(self, send: Any, recv: Any, send_counts: Sequence[int], recv_counts: Sequence[int]) -> Pending:
        """Start an all-to-all as point-to-point pairs: one ``Irecv`` per rank that sends this one something,
        one ``Isend`` per rank this one sends something, this rank's own block copied locally.

        Each pair's count is known alike at both ends (``send_counts[j]`` here
        is ``recv_counts[r]`` on rank j), so both skip an empty block. Rank r
        posts to r+1, r+2, ... and receives from r-1, r-2, ... (every receive
        posted first: no order can deadlock). The messages go over hpccoll's
        private duplicate, which carries no other point-to-point traffic; two
        calls in flight at once match in the order they were started (MPI
        never lets messages between one pair overtake on one tag).
        """
        mpi, rank = self._mpi, self.comm.rank
        t = _DATATYPES.get(recv.dtype) or mpi_datatype(recv.dtype)
        sent, got = displacements(send_counts), displacements(recv_counts)
        irecv, isend = mpi.Irecv, mpi.Isend
        blocks = [(recv[got[r] : got[r] + recv_counts[r]], r) for r in self._sources if recv_counts[r]]
        requests = [irecv([block, t], r, _PAIRWISE_TAG) for block, r in blocks]
        requests += [
            isend([send, (send_counts[j], sent[j]), t], j, _PAIRWISE_TAG) for j in self._targets if send_counts[j]
        ]
        n = send_counts[rank]
        if n:
            recv[got[rank] : got[rank] + n] = send[sent[rank] : sent[rank] + n]
        pending = _Sized(requests, blocks, "MPI_Irecv", self._statuses) if blocks else _Requests(requests)
        return MPIPending(pending, None, self.comm, "the all-to-all's point-to-point pairs")

    def _swap(self, send: Any, recv: Any, send_counts: Sequence[int], recv_counts: Sequence[int]) -> None:
        """:meth:`_pairwise` between two ranks, blocking: one ``Sendrecv`` (one call into MPI where the
        pairs make three; it matches the other rank's pairs as well), then the own block copied."""
        rank = self.comm.rank
        other = 1 - rank
        t = _DATATYPES.get(recv.dtype) or mpi_datatype(recv.dtype)
        sent, got = (0, send_counts[0]), (0, recv_counts[0])  # where blocks 0 and 1 start
        count, status = recv_counts[other], self._status
        outgoing, incoming = [send, (send_counts[other], sent[other]), t], [recv, (count, got[other]), t]
        self._blocking("Sendrecv", (outgoing, other, _PAIRWISE_TAG, incoming, other, _PAIRWISE_TAG, status), None)
        if status.Get_count() != count * recv.itemsize:  # shorter than the block: MPI accepts it (a longer one raises)
            raise short("MPI_Sendrecv", recv[got[other] : got[other] + count], status.Get_count(), other)
        n = send_counts[rank]
        if n:  # after MPI is done with the buffers: on a GPU (cuda_mpi) the copy is queued on the stream
            recv[got[rank] : got[rank] + n] = send[sent[rank] : sent[rank] + n]

    def _blocking(self, name: str, args: tuple, then: Optional[Callable[[], None]]) -> None:
        """Run MPI collective ``name`` (watched under ``HPCCOLL_TIMEOUT``), then the completion step; MPI's
        truncation error becomes a :class:`~hpccoll.MismatchError` (:func:`~hpccoll.transports._control.reraise`)."""
        try:
            if self.comm.timeout is None:
                getattr(self._mpi, name)(*args)
            else:
                watched(self.comm, f"MPI_{name}", getattr(self._mpi, name), *args)
        except Exception as e:  # noqa: BLE001
            reraise(e, f"MPI_{name}", receive_buffer(name, args))
        if then is not None:
            then()

    def _started(self, name: str, args: tuple, then: Optional[Callable[[], None]]) -> Pending:
        """Start the non-blocking twin of MPI collective ``name``."""
        request = getattr(self.comm.mpi, "I" + name[0].lower() + name[1:])(*args)
        return MPIPending(request, then, self.comm, f"MPI_{name}")

    # Each of these returns (MPI function name, its arguments, a step to run after completion).

    def _allgatherv(self, send: Optional[Any], recv: Any, counts: Sequence[int]) -> tuple:
        t = _DATATYPES.get(recv.dtype) or mpi_datatype(recv.dtype)
        first = counts[0]
        if counts.count(first) == len(counts):
            return "Allgather", (_in_place() if send is None else [send, first, t], [recv, first, t]), None
        source = _in_place() if send is None else [send, counts[self.comm.rank], t]
        return "Allgatherv", (source, [recv, (list(counts), displacements(counts)), t]), None

    def _flipped(self, build: Callable[..., tuple], send: Optional[Any], recv: Any, *rest: Any) -> tuple:
        """``build``'s call for ``uint64`` max/min where MPI compares them as signed: on ``send`` and
        ``recv`` with the top bit flipped, as ``int64`` (an order-preserving map); its completion step
        then flips ``recv`` back."""
        if send is None:
            recv ^= _TOP  # in place: this rank's own data, flipped back afterwards
            copy = None
        else:
            copy = (send ^ _TOP).view(_INT64)  # a copy: the input is never modified
        name, args, then = build(copy, recv.view(_INT64), *rest)

        def back(out: Any = recv, keep: Any = copy) -> None:  # keep: MPI reads the copy until completion
            if then is not None:
                then()
            out ^= _TOP

        return name, args, back

    def _reduce_scatter(self, send: Optional[Any], recv: Any, counts: Sequence[int], op: str) -> tuple:
        if self._flip_extrema and recv.dtype == _UINT64 and op in _EXTREMA:
            return self._flipped(self._reduce_scatter, send, recv, counts, op)
        t, o = _DATATYPES.get(recv.dtype) or mpi_datatype(recv.dtype), _OPS.get(op) or mpi_op(op)
        first = counts[0]
        even = counts.count(first) == len(counts)
        if send is not None:
            if even:
                return "Reduce_scatter_block", ([send, t], [recv, first, t], o), None
            return "Reduce_scatter", ([send, t], [recv, counts[self.comm.rank], t], list(counts), o), None
        # In place: recv holds the whole input; MPI leaves the result at its start: move it to this rank's block.
        rank = self.comm.rank
        then = _mover(recv, sum(counts[:rank]), counts[rank]) if rank else None
        if even:
            return "Reduce_scatter_block", (_in_place(), [recv, t], o), then
        return "Reduce_scatter", (_in_place(), [recv, t], list(counts), o), then

    def _allreduce(self, send: Optional[Any], recv: Any, op: str) -> tuple:
        if self._flip_extrema and recv.dtype == _UINT64 and op in _EXTREMA:
            return self._flipped(self._allreduce, send, recv, op)
        t = _DATATYPES.get(recv.dtype) or mpi_datatype(recv.dtype)
        return "Allreduce", (_in_place() if send is None else [send, t], [recv, t], _OPS.get(op) or mpi_op(op)), None

    def _bcast(self, buf: Any, root: int, status: Any = None) -> tuple:
        """With a ``status`` (a call, not a plan, whose ranks agreed no size), the receive between two ranks
        reads it, and the completion step compares its size with ``buf``'s."""
        spec = [buf, _DATATYPES.get(buf.dtype) or mpi_datatype(buf.dtype)]
        if not self._pair:
            return "Bcast", (spec, root), None
        if self.comm.rank == root:  # two ranks (pair_bcast): one message
            return "Send", (spec, 1 - root, _BCAST_TAG), None
        if status is None:
            return "Recv", (spec, root, _BCAST_TAG), None

        def sized() -> None:
            if status.Get_count() != buf.nbytes:
                raise short("MPI_Recv", buf, status.Get_count(), root)

        return "Recv", (spec, root, _BCAST_TAG, status), sized

    def _reduce(self, send: Optional[Any], recv: Any, op: str, root: int) -> tuple:
        if self._flip_extrema and recv.dtype == _UINT64 and op in _EXTREMA:
            return self._flipped(self._reduce, send, recv, op, root)
        t, o = _DATATYPES.get(recv.dtype) or mpi_datatype(recv.dtype), _OPS.get(op) or mpi_op(op)
        if send is None:  # MPI_IN_PLACE is root's alone: elsewhere recv is the send buffer
            if self.comm.rank == root:
                return "Reduce", (_in_place(), [recv, t], o, root), None
            return "Reduce", ([recv, t], None, o, root), None
        # root's recv only: MPI ignores the others' (not parsed into a message there)
        return "Reduce", ([send, t], [recv, t] if self.comm.rank == root else None, o, root), None

    def _gatherv(self, send: Any, recv: Optional[Any], counts: Sequence[int], root: int) -> tuple:
        t = _DATATYPES.get(send.dtype) or mpi_datatype(send.dtype)
        first = counts[0]
        if counts.count(first) == len(counts):
            return "Gather", ([send, first, t], None if recv is None else [recv, first, t], root), None
        target = None if recv is None else [recv, (list(counts), displacements(counts)), t]
        return "Gatherv", ([send, counts[self.comm.rank], t], target, root), None

    def _scatterv(self, send: Optional[Any], recv: Any, counts: Sequence[int], root: int) -> tuple:
        t = _DATATYPES.get(recv.dtype) or mpi_datatype(recv.dtype)
        first = counts[0]
        if counts.count(first) == len(counts):
            return "Scatter", (None if send is None else [send, first, t], [recv, first, t], root), None
        source = None if send is None else [send, (list(counts), displacements(counts)), t]
        return "Scatterv", (source, [recv, counts[self.comm.rank], t], root), None

    def _alltoallv(
        self, send: Any, recv: Any, send_counts: Sequence[int], recv_counts: Sequence[int], even: bool
    ) -> tuple:
        t = mpi_datatype(recv.dtype)
        if even:
            return "Alltoall", ([send, send_counts[0], t], [recv, send_counts[0], t]), None
        source = [send, (list(send_counts), displacements(send_counts)), t]
        return "Alltoallv", (source, [recv, (list(recv_counts), displacements(recv_counts)), t]), None


#: The first tag of :meth:`HostMPI._messages` (the k-th message between a pair has this plus k).
_MESSAGE_TAG = 1000

#: The tag of :meth:`HostMPI._pairwise`'s messages (any fixed tag would do: nothing else is sent point to point).
_PAIRWISE_TAG = 11

#: The tag of a broadcast between two ranks (:attr:`HostMPI.pair_bcast`): every form of it, so they match.
_BCAST_TAG = 12


class _Requests:
    """Several MPI requests as one (``Wait``, ``Test``), for :class:`MPIPending`."""

    __slots__ = ("requests",)

    def __init__(self, requests: list) -> None:
        self.requests = requests

    def Wait(self) -> None:  # noqa: N802 (mpi4py's names)
        if self.requests:
            self.requests[0].Waitall(self.requests)

    def Test(self) -> bool:  # noqa: N802
        return not self.requests or self.requests[0].Testall(self.requests)


class _Sized(_Requests):
    """:class:`_Requests` whose first ``len(recvs)`` are receives, ``recvs`` their ``(buffer, source)``, where
    no agreement fixed the messages' sizes (``shift``, the all-to-all's pairs, a two-rank broadcast).

    Completing reads their statuses (into ``statuses``, a list the transport keeps, refilled by each call:
    nothing allocated), which MPI fills anyway: a message of another size than its buffer (MPI's truncation
    error, or a shorter one, which MPI accepts) raises :class:`~hpccoll.MismatchError` (:meth:`sized`).
    """

    __slots__ = ("recvs", "what", "statuses")

    def __init__(self, requests: list, recvs: Sequence[Tuple[Any, int]], what: str, statuses: list) -> None:
        self.requests = requests
        self.recvs = recvs
        self.what = what
        self.statuses = statuses

    def Wait(self) -> None:  # noqa: N802 (mpi4py's names)
        requests = self.requests
        try:
            requests[0].Waitall(requests, self.statuses)
        except Exception as e:  # noqa: BLE001
            self.failed(e)
        self.sized()

    def Test(self) -> bool:  # noqa: N802
        requests = self.requests
        try:
            done = requests[0].Testall(requests, self.statuses)
        except Exception as e:  # noqa: BLE001
            self.failed(e)
        if done:
            self.sized()
        return done

    def sized(self) -> None:
        """Raise :class:`~hpccoll.MismatchError` for the first receive whose message was shorter than its buffer."""
        statuses, i = self.statuses, 0
        for buf, source in self.recvs:  # an index, not zip: this runs on every call
            if statuses[i].Get_count() != buf.nbytes:
                raise short(self.what, buf, statuses[i].Get_count(), source)
            i += 1

    def failed(self, e: BaseException) -> None:
        """Raise ``e`` (from ``Waitall``/``Testall``) as the :class:`~hpccoll.MismatchError` of the first truncated
        receive, once every other request completed (MPI must not write or read the buffers after the raise),
        or as it is."""
        from mpi4py import MPI

        if not isinstance(e, MPI.Exception) or e.Get_error_class() != MPI.ERR_IN_STATUS:
            raise e
        for (buf, source), status in zip(self.recvs, self.statuses):
            error = status.Get_error()
            if error != MPI.SUCCESS and MPI.Get_error_class(error) == MPI.ERR_TRUNCATE:
                MPI.Request.Waitall([r for r in self.requests if r])  # the rest (those left pending)
                raise truncated(MPI.Exception(error), self.what, buf, source) or e from e
        raise e


#: The builders of :meth:`HostMPI.prepare`: (MPI function name, its arguments, a step after completion).
_BUILDERS: dict = {
    "allgatherv": HostMPI._allgatherv,
    "reduce_scatter": HostMPI._reduce_scatter,
    "allreduce": HostMPI._allreduce,
    "bcast": HostMPI._bcast,
    "reduce": HostMPI._reduce,
    "gatherv": HostMPI._gatherv,
    "scatterv": HostMPI._scatterv,
    "alltoallv": lambda t, send, recv, sc, rc, even=False: t._alltoallv(send, recv, sc, rc, even),
    "sendrecv": None,  # point-to-point: persistent requests only (_persistent_messages)
}


class _Prebuilt(Prepared):
    """A blocking MPI call whose arguments (buffer specs, datatypes, op) were built once."""

    __slots__ = ()

    def __init__(
        self, t: HostMPI, primitive: str, args: tuple, call: Any, mpi_args: tuple, then: Optional[Callable[[], None]]
    ) -> None:
        super().__init__(t, primitive, args)
        if then is None:
            self.run = functools.partial(call, *mpi_args)
        else:

            def run() -> None:
                call(*mpi_args)
                then()

            self.run = run
        self.steps = (self.run,)


class _Fixed(Prepared):
    """A persistent MPI request (or several, started together): ``Start`` and ``Wait`` on every run."""

    __slots__ = ("request", "then", "comm", "what", "__weakref__")

    def __init__(self, request: Any, then: Optional[Callable[[], None]], comm: Any, what: str, args: tuple) -> None:
        self.request, self.then, self.comm, self.what, self.args = request, then, comm, what, args
        self.method = "persistent"
        if isinstance(request, _Requests):
            from mpi4py import MPI

            requests = request.requests
            startall, waitall = MPI.Prequest.Startall, MPI.Request.Waitall

            def run() -> None:
                startall(requests)
                waitall(requests)

            self.run = run
            self.steps = (functools.partial(startall, requests), functools.partial(waitall, requests))
        else:
            start, wait = request.Start, request.Wait
            self.steps = (start, wait) if then is None else (start, wait, then)
            if then is None:

                def run() -> None:
                    start()
                    wait()

            else:

                def run() -> None:
                    start()
                    wait()
                    then()

            self.run = run

    def start(self) -> Pending:
        self.steps[0]()  # Start, or Startall for several requests
        return MPIPending(self.request, self.then, self.comm, self.what)

    def free(self) -> None:
        request, self.request = self.request, None
        if request is None or _finalized():
            return
        for r in request.requests if isinstance(request, _Requests) else [request]:
            if r:  # not MPI_REQUEST_NULL
                r.Free()

    def __del__(self) -> None:
        try:
            self.free()
        except Exception:  # noqa: BLE001, S110 (interpreter shutdown: MPI may be gone)
            pass


@functools.cache
def _persistent_collectives() -> bool:
    """Whether this MPI library has MPI-4's persistent collectives (decided once, by trying one on
    ``MPI_COMM_SELF``): Open MPI 5 has them while it reports MPI 3.1; a library without them raises."""
    from mpi4py import MPI

    try:
        MPI.COMM_SELF.Barrier_init().Free()
        return True
    except (NotImplementedError, MPI.Exception):
        return False


def _finalized() -> bool:
    from mpi4py import MPI

    return bool(MPI.Is_finalized())


def _mover(buf: Any, start: int, count: int) -> Callable[[], None]:
    """A step that copies ``buf[:count]`` to ``buf[start:start + count]`` (elements in C order; overlap allowed)."""

    def move() -> None:
        # Overlapping ranges (start < count) are copied out first: NumPy would cope, but on CuPy arrays
        # (transport cuda_mpi) the copy is cudaMemcpyAsync or a parallel kernel, undefined on overlap.
        flat = buf.reshape(-1)
        flat[start : start + count] = flat[:count].copy() if start < count else flat[:count]

    return move


_UINT64, _INT64 = np.dtype(np.uint64), np.dtype(np.int64)
_TOP = np.uint64(1 << 63)
_EXTREMA = frozenset(("max", "min"))


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
            watched(self.comm, self.what, self.request.Wait)
        self._finish()

    def test(self) -> bool:
        if self.request.Test():
            self._finish()
            return True
        return False
