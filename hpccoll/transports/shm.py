"""Node-shared-memory transport: NumPy collectives through MPI-3 shared windows, hierarchical across nodes.

Inside a node the ranks read each other's data straight from shared memory
(``MPI_Win_allocate_shared`` on ``Split_type(COMM_TYPE_SHARED)``):

- **all-gather**: each rank writes its block once into the node's scratch
  window; every rank reads the others' blocks from there;
- **reduce-scatter**: each rank publishes its input; each rank reduces its own
  block straight from every rank's input, in rank order;
- **all-reduce**: a reduce-scatter into shared memory, then every rank reads
  the reduced blocks (an all-gather from shared memory).

Inputs that already live in node-shared memory (``Communicator.shared_empty``)
are read where they are, without the copy in; results can stay in shared
memory (``out="shared"``, one read-only array per node). Scratch is a window of
two halves (alternate rounds use alternate halves, so one sync per round
suffices) holding at most :attr:`SharedMemory.chunk_bytes` per rank and half;
larger messages travel in rounds.

Across nodes (more than one node in the communicator) the same node steps run
around one MPI call between the node leaders: all-gather = node stage ->
leaders' ``Allgatherv`` -> every rank reads; reduce-scatter and all-reduce =
node reduction in shared memory -> leaders' ``Reduce_scatter`` /
``Allreduce`` -> every rank reads its part.

Reductions run in rank order inside a node (rank 0 op rank 1 op ...), so an
all-reduce's result is bit-identical on every rank; across nodes the node
partial results are combined by MPI. ``max``/``min`` propagate NaN (NumPy's
rule), where MPI's comparison may drop it.
"""

from __future__ import annotations

import sys
from math import prod
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from .. import _settings
from .._arrays import shape_of
from .._dtypes import check_dtype, movement_dtype
from .._errors import ArgumentError, HpccollError, MismatchError
from .._layout import finish_reduction
from .._request import DONE, Pending
from ._base import WIRE_OPS, Prepared, Transport
from ._control import guarded
from ._mpitypes import displacements as offsets
from ._mpitypes import mpi_datatype, mpi_op
from ._shmseg import NODE_SIZE_ENV, Block, Node, Pool, Segment, holder_of, round_up, split_node
from ._state import remembered

__all__ = ["SharedMemory", "SHARED", "shared_empty", "holder_of"]


#: The ``out=`` spelling of a node-shared result.
SHARED = "shared"

# The logical ufuncs write 0/1 into an integer ``out`` (MPI's result), and read their own 0/1 back.
_UFUNCS = {
    "sum": np.add,
    "prod": np.multiply,
    "max": np.maximum,
    "min": np.minimum,
    "land": np.logical_and,
    "lor": np.logical_or,
    "lxor": np.logical_xor,
    "band": np.bitwise_and,
    "bor": np.bitwise_or,
    "bxor": np.bitwise_xor,
}
_TRUTH_UFUNCS = (np.logical_and, np.logical_or, np.logical_xor)
#: Descriptor kinds: the input's pieces of this round sit packed in the sender's scratch slot,
#: or the whole input sits in a segment (offset of its element 0).
_SCRATCH, _SEGMENT = 1, 2
_MIN_SLOT = 64 << 10


class SharedMemory(Transport):
    """NumPy arrays through node-shared memory (MPI-3 shared windows), hierarchical across nodes.

    Collective to construct: it splits the communicator into nodes (or into
    simulated nodes of ``HPCCOLL_NODE_SIZE`` consecutive ranks) and allocates
    the node's control window.
    """

    name = "shm"
    #: Its own NumPy reductions (``_UFUNCS``) and host MPI's: every wire op.
    reduce_ops = WIRE_OPS
    array_kind = "numpy"
    priority = 40  # before ``mpi``, for the messages it wins (``min_bytes`` and :attr:`wins`)
    chosen_because = (
        "node-shared memory where it measured faster (every rank on one node; a tuning profile's verdict, "
        "else a race against host MPI at the first message of each size class, for all-reduce and reduce "
        "from 256 KiB and reduce-scatter from 1 MiB; host MPI for the rest)"
    )
    in_place = True
    #: It makes node-shared results (``out="shared"``, ``shared_empty``): see :attr:`Transport.shared_results`.
    shared_results = True
    #: ``sendrecv`` takes strided NumPy views up to its host transport's size (which moves them: they are never
    #: read in place); see :attr:`HostMPI.strided_messages <hpccoll.transports.host_mpi.HostMPI.strided_messages>`.
    strided_messages = 0
    #: Per primitive, the ``[low, high)`` message sizes worth trying shm for (:attr:`Transport.wins`); the
    #: communicator's :class:`~hpccoll.transports.Selector` gives every other message to host MPI, unless shm
    #: was named. Not in the table: a private all-gather (it copies every block once more than MPI's
    #: single-copy transfers do: into shared memory, then out by each of the P ranks) and a broadcast (root
    #: writes each round once, every rank copies it out; host MPI's ``Ibcast`` also lets root copy its input
    #: while the message travels). A ``python -m hpccoll tune`` profile's verdict decides inside and outside
    #: these ranges; without one, a first-use race decides inside them (:attr:`first_use`). The figures behind
    #: the ranges: docs/bench/shm.md and docs/benchmarks.md (the rooted collectives).
    wins = {
        "reduce_scatter": (1 << 20, 1 << 62),
        "allreduce": (256 << 10, 1 << 62),
        "reduce": (256 << 10, 1 << 62),
    }
    #: The smallest message (bytes of the gathered result of an all-gather, of the whole array of a
    #: reduction: a size every rank computes alike) that shm moves faster than the ``mpi`` transport,
    #: measured with private inputs and outputs at 2 and 4 ranks on this project's machine
    #: (docs/bench/shm.md): ``auto`` offers shm the messages from there on.
    min_bytes = min(low for low, _ in wins.values())
    #: Where no profile decides a message in :attr:`wins`' ranges, its first call of a primitive in each
    #: power-of-two size class times shm against host MPI on scratch buffers of that size (collective:
    #: every rank reaches the same call with the same size), the slowest rank's times deciding, and the
    #: winner moves every later message of that class: ``auto`` measures in the job's own process, whose
    #: shm speed may differ from another process's (a mode that holds for the process's life). False takes
    #: :attr:`wins` as the verdict. Messages past :attr:`race_max_bytes` take the verdict raced there.
    first_use = True
    #: The largest message a first-use race allocates and times (its scratch: two buffers of this size).
    race_max_bytes = 16 << 20
    #: A first-use race gives shm the size class only where shm took at most this fraction of host MPI's
    #: time: host MPI is the steady choice, and a closer verdict is within a short race's noise.
    race_margin = 0.95
    #: Interleaved rounds of a first-use race (each a batch of about 8 MiB moved per side, at least 4 calls).
    race_rounds = 11
    #: Most scratch bytes per rank and per half: larger messages travel in rounds. 1 MiB (this machine's
    #: L2 per core) measured best (docs/bench/shm.md, ``bench_shm.py --chunks``).
    chunk_bytes = 1 << 20
    #: All-reduces up to this many bytes are reduced whole by every rank (one sync per round); larger
    #: ones are reduce-scattered in shared memory, then read by all (two syncs, less arithmetic).
    direct_bytes = 1 << 20

    def __init__(self, comm: Any) -> None:
        super().__init__(comm)
        self.node = guarded(comm, "hpccoll shm: setting up the node's shared memory", Node, comm)
        self.pool = Pool(self.node)
        self._scratch: Optional[Block] = None
        self._slot = 0
        self._round = 0
        self._stage: Optional[Block] = None
        self._closed = False
        #: Named (``transport="shm"``, ``HPCCOLL_TRANSPORT=shm``): every blocking message through shared
        #: memory; chosen by ``auto``: only the sizes in :attr:`wins`.
        self.everything = comm.transport == self.name
        #: The communicator's host transport (``Communicator.host_transport``: the first usable one declaring
        #: :attr:`~Transport.hosts`, ``mpi`` by default), for what shm leaves to host MPI.
        self.host: Transport = comm.host_transport()
        self.strided_messages = getattr(self.host, "strided_messages", 0)
        self.saturates = self.host.saturates  # what shm does not move itself, host MPI reduces

    @classmethod
    def unavailable_reason(cls, comm: Any) -> Optional[str]:
        """Why node-shared windows cannot be made on ``comm`` (collective, cached), or ``None``."""
        return _probed(comm)[0]

    @classmethod
    def auto_reason(cls, comm: Any) -> Optional[str]:
        """``auto`` takes shm only where every rank shares one node (hierarchical shm must be named)."""
        reason, nodes = _probed(comm)
        if reason is None and nodes > 1:
            return (
                f"the communicator spans {nodes} nodes (MPI's own collectives serve them; "
                "HPCCOLL_TRANSPORT=shm runs shm within nodes and MPI between them)"
            )
        return reason

    def leaves(self, primitive: str, blocking: bool) -> bool:
        """Host MPI moves the non-blocking forms (MPI progresses them while the caller computes; shared
        memory would need a progress thread) but ``isendrecv``'s reads in place, all-to-alls (each pair's
        block crosses once either way), rooted gathers and scatters (through shared memory every block
        would be copied twice, where MPI's transfers copy it once), and across nodes ``reduce`` and
        ``bcast`` (no hierarchical form here)."""
        if not blocking:
            return primitive != "sendrecv"
        return primitive in ("alltoallv", "gatherv", "scatterv") or (
            self.node.multi and primitive in ("reduce", "bcast")
        )

    def sendrecv(self, sends: Sequence[Tuple[Any, int]], recvs: Sequence[Tuple[Any, int]], sized: bool = False) -> None:
        """On one node, where every rank of the node sends only from node-shared memory (a field from
        ``shared_empty`` exchanged in place: the halo exchange sends such fields here whatever transport was
        named), each rank reads its messages straight from the senders' memory (one copy, no message);
        anything else goes to host MPI."""
        if not self._read_in_place(sends, recvs):
            self.host.sendrecv(sends, recvs, sized)

    def isendrecv(
        self, sends: Sequence[Tuple[Any, int]], recvs: Sequence[Tuple[Any, int]], sized: bool = False
    ) -> Pending:
        """As :meth:`sendrecv`, and done when it returns where the messages were read in place (the same
        protocol as the blocking form, so ranks that mix the two still meet)."""
        if self._read_in_place(sends, recvs):
            return DONE
        return self.host.isendrecv(sends, recvs, sized)

    def prepare(self, primitive: str, args: tuple, method: str = "blocking") -> Prepared:
        """A ``sendrecv`` of node-shared messages prepared once: where each message comes from is read when
        it is prepared, and each run is a node sync, the copies and a second sync. Others: the contract
        default (shm's primitive each run)."""
        if primitive != "sendrecv":
            return super().prepare(primitive, args, method)
        found = None if self.node.multi else self._match(args[0], args[1])
        if found is None:
            return self.host.prepare(primitive, args, method)
        pairs, bad = found
        self.node.sync("prepared halo exchange (the senders' tables read)")
        if bad is not None:
            raise bad
        return _ReadInPlace(self, args, pairs)

    def _read_in_place(self, sends: Sequence[Tuple[Any, int]], recvs: Sequence[Tuple[Any, int]]) -> bool:
        """Every message of the node read from the sender's shared memory (``False``: none was, on every rank)."""
        found = None if self.node.multi else self._match(sends, recvs)
        if found is None:
            return False
        pairs, bad = found
        _copy_and_release(self.node, pairs)
        if bad is not None:
            raise bad
        return True

    def _match(
        self, sends: Sequence[Tuple[Any, int]], recvs: Sequence[Tuple[Any, int]]
    ) -> Optional[Tuple[List[Tuple[np.ndarray, np.ndarray]], Optional[HpccollError]]]:
        """Where every message this rank receives lies in its sender's shared memory (one node sync).

        Every rank publishes a table of its messages (receiver, segment, offset, bytes) in its scratch
        slot; after the sync, the k-th message rank q addresses to this one is q's k-th table row for it
        (the order MPI matches messages between a pair in). Returns the (this rank's receive buffer as bytes,
        the sender's bytes) pairs and the error of messages that do not match, or ``None`` on every rank
        where some rank sends memory that is not node-shared.
        """
        node = self.node
        u8 = self._ensure_scratch(_MIN_SLOT).u8  # the same size on every rank: tables of up to 2048 rows
        _, line, base = self._begin_round()
        table = u8[base : base + 32 * len(sends)].view(np.int64).reshape(-1, 4)
        # strided buffers are not one run of bytes: host MPI moves them (as derived datatypes)
        ok = len(sends) <= _MIN_SLOT // 32 and all(buf.flags.c_contiguous for buf, _ in recvs)
        for k, (buf, q) in enumerate(sends if ok else ()):
            found = self._locate(buf) if buf.flags.c_contiguous else None
            if found is None:
                ok = False
                break
            table[k] = (q, found[0].sid, found[1], buf.nbytes)
        line[0], line[1], line[2] = int(ok), len(sends), base
        node.sync("halo exchange (publishing the boundaries)")
        lines = node.lines()
        if not all(lines[q, 0] for q in range(node.size)):  # someone sends private memory: host MPI for all
            return None
        me = self.comm.rank
        taken: dict = {}  # sender -> its table rows addressed to this rank, last first
        pairs, bad = [], None
        for buf, q in recvs:
            rows = taken.get(q)
            if rows is None:
                n, at = int(lines[q, 1]), int(lines[q, 2])
                theirs = u8[at : at + 32 * n].view(np.int64).reshape(-1, 4).tolist()
                rows = taken[q] = [row for row in theirs if row[0] == me][::-1]
            if not rows or rows[-1][3] != buf.nbytes:
                got = f"{rows[-1][3]} bytes" if rows else "nothing more"
                bad = bad or MismatchError(
                    f"sendrecv: expected rank {q} to send this rank {buf.nbytes} bytes; it sends {got}"
                )
                continue
            _, sid, off, nbytes = rows.pop()
            pairs.append((buf.reshape(-1).view(np.uint8), self.pool.segments[sid].data[off : off + nbytes]))
        return pairs, bad

    def alltoallv(
        self, send: Any, recv: Any, send_counts: Sequence[int], recv_counts: Sequence[int], even: bool = False
    ) -> None:
        self.host.alltoallv(send, recv, send_counts, recv_counts, even)

    def ialltoallv(
        self, send: Any, recv: Any, send_counts: Sequence[int], recv_counts: Sequence[int], even: bool = False
    ) -> Pending:
        return self.host.ialltoallv(send, recv, send_counts, recv_counts, even)

    def ibcast(self, buf: Any, root: int) -> Pending:
        return self.host.ibcast(buf, root)

    def ireduce(self, send: Optional[Any], recv: Any, op: str, root: int) -> Pending:
        return self.host.ireduce(send, recv, op, root)

    def igatherv(self, send: Any, recv: Optional[Any], counts: Sequence[int], root: int) -> Pending:
        return self.host.igatherv(send, recv, counts, root)

    def iscatterv(self, send: Optional[Any], recv: Any, counts: Sequence[int], root: int) -> Pending:
        return self.host.iscatterv(send, recv, counts, root)

    # Rooted gathers and scatters, too: through shared memory every block would be copied twice (into the
    # node's memory, then out by its one reader), where MPI's transfers copy it once, or twice at worst.

    def gatherv(self, send: Any, recv: Optional[Any], counts: Sequence[int], root: int) -> None:
        self.host.gatherv(send, recv, counts, root)

    def scatterv(self, send: Optional[Any], recv: Any, counts: Sequence[int], root: int) -> None:
        self.host.scatterv(send, recv, counts, root)

    def allgather_into(self, send: Any, out: Any, lead: int, trail: int, sizes: Sequence[int]) -> bool:
        # Gathers along an inner axis: MPI's derived datatypes write each block in place, where shm
        # would gather into a flat buffer first (one more copy and buffer), unless shm was named.
        return not self.everything and self.host.allgather_into(send, out, lead, trail, sizes)

    # ------------------------------------------------------------------ helpers

    def _locate(self, a: Optional[np.ndarray]) -> Optional[Tuple[Segment, int]]:
        """``(segment, offset)`` when ``a`` (C-contiguous) lies in one of this node's segments."""
        if a is None or not self.pool.segments or not a.size:
            return None
        from mpi4py import MPI

        return self.pool.locate(MPI.Get_address(a), a.nbytes)

    def _ensure_scratch(self, need: int) -> Block:
        """Grow the scratch window so one slot holds ``need`` bytes, up to :attr:`chunk_bytes` (collective).

        ``need`` is computed from arguments every rank shares, so every rank
        grows (or not) together. Returns the scratch window.
        """
        want = min(self.chunk_bytes, max(need, _MIN_SLOT))
        if want <= self._slot:
            assert self._scratch is not None, "a slot of this size exists in a scratch window"
            return self._scratch
        want = min(self.chunk_bytes, 1 << (want - 1).bit_length())
        if self._scratch is not None:
            self.node.sync("growing the scratch window")  # nobody still reads the old one
            self._scratch.free()
            self._scratch = None
        scratch = self._scratch = Block(self.node.mpi, 2 * self.node.size * want)
        self._slot = want
        return scratch

    def _begin_round(self) -> Tuple[int, Any, int]:
        """``(half, descriptor line, slot offset)``: the scratch half this round uses, and this rank's parts."""
        half = self._round & 1
        self._round += 1
        return half, self.node.mine(), (half * self.node.size + self.node.rank) * self._slot

    def _stage_view(self, count: int, dtype: np.dtype) -> np.ndarray:
        """A flat view of ``count`` elements of the node's staging window (grown on demand, collective)."""
        nbytes = count * dtype.itemsize
        if self._stage is None or self._stage.nbytes < nbytes:
            if self._stage is not None:
                self._stage.free()
            self._stage = Block(self.node.mpi, round_up(max(nbytes, 1), _MIN_SLOT))
        return self._stage.u8[:nbytes].view(dtype)

    def _piece(self, lines: Any, q: int, packed: int, start: int, count: int, dtype: np.dtype) -> np.ndarray:
        """Rank ``q``'s published input: element ``start`` of its full input, or byte ``packed`` of its slot."""
        isz = dtype.itemsize
        if lines[q, 0] == _SCRATCH:
            off = int(lines[q, 2]) + packed
            scratch = self._scratch
            assert scratch is not None, "published from scratch, so made by _ensure_scratch"
            return scratch.u8[off : off + count * isz].view(dtype)
        off = int(lines[q, 2]) + start * isz
        return self.pool.segments[int(lines[q, 1])].data[off : off + count * isz].view(dtype)

    def _leaders(self, name: str, *args: Any) -> None:
        """MPI collective ``name`` among the node leaders (watched under ``HPCCOLL_TIMEOUT``)."""
        guarded(self.comm, f"MPI_{name} (shm: between node leaders)", getattr(self.node.leaders, name), *args)

    # ------------------------------------------------------------------ all-gather

    def allgatherv(self, send: Optional[Any], recv: Any, counts: Sequence[int]) -> None:
        counts = list(counts)
        if self.node.multi:
            self._gather_nodes(send, recv, counts)
        else:
            self._gather_node(send, recv, counts)

    def _gather_node(self, send: Optional[Any], recv: Any, counts: List[int]) -> None:
        node = self.node
        me = node.rank
        top = max(counts)
        if top == 0:
            return
        dt = recv.dtype
        isz = dt.itemsize
        displs = offsets(counts)
        own = recv[displs[me] : displs[me] + counts[me]]
        src = own if send is None else send
        found = self._locate(send)
        u8 = self._ensure_scratch(top * isz).u8
        step = self._slot // isz
        shared = False
        for a in range(0, top, step):
            _, line, base = self._begin_round()
            if found is None:
                hi = min(counts[me], a + step)
                if hi > a:
                    u8[base : base + (hi - a) * isz].view(dt)[...] = src[a:hi]
                line[0], line[2] = _SCRATCH, base
            else:
                line[0], line[1], line[2] = _SEGMENT, found[0].sid, found[1]
            node.arrive()
            if a == 0 and send is not None:
                own[...] = send  # this rank's own block, while the others arrive
            node.wait("all_gather")
            lines = node.lines()
            if a == 0:
                shared = _any_segment(lines)
            for q in node.others:
                hi = min(counts[q], a + step)
                if hi > a:
                    recv[displs[q] + a : displs[q] + hi] = self._piece(lines, q, 0, a, hi - a, dt)
        if shared:  # the owners may write their inputs again once every rank has read them
            node.sync("all_gather (releasing shared inputs)")

    def _node_layout(self, counts: Sequence[int]) -> Tuple[List[int], List[int], List[int]]:
        """``(pos, node_counts, node_displs)``: each rank's block start in node-major order, per-node totals."""
        pos = [0] * len(counts)
        node_counts, node_displs = [], []
        cursor = 0
        for members in self.node.members:
            node_displs.append(cursor)
            for r in members:
                pos[r] = cursor
                cursor += counts[r]
            node_counts.append(cursor - node_displs[-1])
        return pos, node_counts, node_displs

    def _gather_nodes(self, send: Optional[Any], recv: Any, counts: List[int]) -> None:
        total = sum(counts)
        if total == 0:
            return
        node, g = self.node, self.comm.rank
        displs = offsets(counts)
        own = recv[displs[g] : displs[g] + counts[g]]
        stage = self._stage_view(total, recv.dtype)
        pos, node_counts, node_displs = self._node_layout(counts)
        stage[pos[g] : pos[g] + counts[g]] = own if send is None else send
        self._exchange_gather(stage, node_counts, node_displs)
        if node.contiguous:
            recv[...] = stage
        else:
            for r, c in enumerate(counts):
                recv[displs[r] : displs[r] + c] = stage[pos[r] : pos[r] + c]
        node.sync("all_gather (staging free again)")

    def _exchange_gather(self, stage: np.ndarray, node_counts: List[int], node_displs: List[int]) -> None:
        """Node sync, the leaders' in-place ``Allgatherv`` of the nodes' blocks of ``stage``, node sync."""
        node = self.node
        node.sync("all_gather (node blocks staged)")
        if node.leaders is not None:
            self._leaders(
                "Allgatherv", mpi_op("in_place"), [stage, (node_counts, node_displs), mpi_datatype(stage.dtype)]
            )
        node.sync("all_gather (waiting for the node leader)")

    # ------------------------------------------------------------------ reductions

    def _reduce_node(
        self,
        src: np.ndarray,
        found: Optional[Tuple[Segment, int]],
        blocks: List[int],
        op: str,
        dest: Callable[[int, int, int, int], np.ndarray],
        what: str,
        own: Optional[int] = None,
        extra: int = 0,
        after: Optional[Callable[[int, int, int], None]] = None,
        ready: Optional[Callable[[], None]] = None,
        aliased: bool = False,
    ) -> bool:
        """Rounds of: publish this rank's input, sync, reduce this rank's block piece into ``dest``.

        ``blocks`` split the input (``own``: the one this rank reduces, default
        its node rank). A rank's input is read in place when ``found`` (a
        segment), else its pieces of every block for this round are packed into
        its scratch slot. ``dest(lo, hi, half, step)`` is where the reduced
        elements ``[lo, hi)`` of the block go; ``ready()`` runs once, after the
        first sync (every rank is in the call); ``after(lo, step, half)`` ends
        each round; ``extra`` reserves that many more pieces per slot. A rank
        reads its own piece of its own block from ``src`` (nobody else needs
        it) unless ``dest`` may overwrite it first (``aliased``). Returns
        whether any rank's input was a segment (the caller then syncs before
        returning, so its owner may write it again, unless ``after`` synced).
        """
        node = self.node
        me, size = node.rank, node.size
        # Each rank reduces its own block (unless ``own`` names one block for all): then this rank's piece
        # of it is read by nobody else and stays in src, unless dest may overwrite it first.
        direct = own is None and not aliased and found is None
        own = me if own is None else own
        top = max(blocks)
        if top == 0:
            if ready is not None:
                node.sync(what)
                ready()
            return False
        dt = src.dtype
        isz = dt.itemsize
        displs = offsets(blocks)
        pieces = len(blocks) + extra
        u8 = self._ensure_scratch(pieces * top * isz).u8
        step = max(1, self._slot // (pieces * isz))
        ufunc = _UFUNCS[op]
        shared = False
        mine, at = blocks[own], displs[own]
        for a in range(0, top, step):
            half, line, base = self._begin_round()
            if found is None:
                for b, count in enumerate(blocks):
                    hi = min(count, a + step)
                    if hi > a and not (direct and b == me):
                        p = base + b * step * isz
                        u8[p : p + (hi - a) * isz].view(dt)[...] = src[displs[b] + a : displs[b] + hi]
                line[0], line[2] = _SCRATCH, base
            else:
                line[0], line[1], line[2] = _SEGMENT, found[0].sid, found[1]
            node.sync(what)
            lines = node.lines()
            if a == 0:
                shared = _any_segment(lines)
                if ready is not None:
                    ready()
            hi = min(mine, a + step)
            if hi > a:
                packed = own * step * isz
                srcs = [self._piece(lines, q, packed, at + a, hi - a, dt) for q in range(size)]
                if direct:
                    srcs[me] = src[at + a : at + hi]
                _combine(ufunc, srcs, dest(a, hi, half, step))
            if after is not None:
                after(a, step, half)
        return shared

    def reduce_scatter(self, send: Optional[Any], recv: Any, counts: Sequence[int], op: str) -> None:
        counts = list(counts)
        g = self.comm.rank  # on one node, the node rank too
        start = sum(counts[:g])
        out = recv[start : start + counts[g]] if send is None else recv
        src = recv if send is None else send
        if self.node.multi:
            self._reduce_scatter_nodes(src, self._locate(send), out, counts, op)
        elif self._reduce_node(
            src, self._locate(send), counts, op, lambda lo, hi, h, s: out[lo:hi], "reduce_scatter", aliased=send is None
        ):
            self.node.sync("reduce_scatter (releasing shared inputs)")

    def _reduce_scatter_nodes(
        self, src: np.ndarray, found: Optional[Tuple[Segment, int]], out: np.ndarray, counts: List[int], op: str
    ) -> None:
        n = sum(counts)
        if n == 0:
            return
        node, g = self.node, self.comm.rank
        pos, node_counts, node_displs = self._node_layout(counts)
        mine = node_counts[node.index]
        spare = 0 if node.contiguous else n
        stage = self._stage_view(n + spare + max(mine, 1), out.dtype)  # never an empty (aliased) receive buffer
        partial, result = stage[:n], stage[n + spare :]
        self._reduce_to(src, found, op, "reduce_scatter (within the node)", partial)
        if node.leaders is not None:
            if spare:  # the nodes' blocks in node-major order, as Reduce_scatter wants them
                permuted = stage[n : 2 * n]
                displs = offsets(counts)
                for r, c in enumerate(counts):
                    permuted[pos[r] : pos[r] + c] = partial[displs[r] : displs[r] + c]
                partial = permuted
            t = mpi_datatype(out.dtype)
            self._leaders("Reduce_scatter", [partial, t], [result, mine, t], node_counts, mpi_op(op))
        node.sync("reduce_scatter (waiting for the node leader)")
        at = pos[g] - node_displs[node.index]
        out[...] = result[at : at + counts[g]]
        node.sync("reduce_scatter (staging free again)")

    def _reduce_to(
        self,
        src: np.ndarray,
        found: Optional[Tuple[Segment, int]],
        op: str,
        what: str,
        dest: Optional[np.ndarray] = None,
        obtain: Optional[Callable[[], np.ndarray]] = None,
    ) -> np.ndarray:
        """Reduce every node rank's ``src`` into node-shared ``dest`` (each rank its block), then sync.

        With ``obtain`` instead of ``dest``, the destination is ``obtain()``'s,
        called once every rank has arrived (a result segment agreed then).
        """
        node = self.node
        blocks, mine = _node_block(src.size, node, src.itemsize)
        start = mine.start
        target: List[np.ndarray] = [] if dest is None else [dest]
        self._reduce_node(
            src,
            found,
            blocks,
            op,
            lambda lo, hi, h, s: target[0][start + lo : start + hi],
            what,
            ready=None if obtain is None else lambda: target.append(obtain()),
        )
        node.sync(what)
        return target[0]

    def allreduce(self, send: Optional[Any], recv: Any, op: str) -> None:
        if self.node.multi:
            self._allreduce_nodes(send, recv, op)
            return
        node = self.node
        size = node.size
        src = recv if send is None else send
        found = self._locate(send)
        if recv.nbytes <= self.direct_bytes:
            # Every rank reduces the whole array (one sync per round): rank order, so the same bits everywhere.
            if self._reduce_node(src, found, [recv.size], op, lambda lo, hi, h, s: recv[lo:hi], "all_reduce", own=0):
                node.sync("all_reduce (releasing shared inputs)")
            return
        dt = recv.dtype
        isz = dt.itemsize
        blocks = _split(recv.size, size, isz)
        displs = offsets(blocks)

        def out_piece(q: int, lo: int, hi: int, half: int, step: int) -> np.ndarray:
            at = (half * size + q) * self._slot + size * step * isz
            scratch = self._scratch
            assert scratch is not None, "made by _ensure_scratch before the rounds"
            return scratch.u8[at : at + (hi - lo) * isz].view(dt)

        def gather(lo: int, step: int, half: int) -> None:
            node.sync("all_reduce (blocks reduced)")
            for q, count in enumerate(blocks):
                hi = min(count, lo + step)
                if hi > lo:
                    recv[displs[q] + lo : displs[q] + hi] = out_piece(q, lo, hi, half, step)

        self._reduce_node(
            src,
            found,
            blocks,
            op,
            lambda lo, hi, half, step: out_piece(node.rank, lo, hi, half, step),
            "all_reduce",
            extra=1,
            after=gather,
        )

    def _allreduce_nodes(self, send: Optional[Any], recv: Any, op: str) -> None:
        if recv.size == 0:
            return
        stage = self._stage_view(recv.size, recv.dtype)
        self._allreduce_into(recv if send is None else send, self._locate(send), op, stage)
        recv[...] = stage
        self.node.sync("all_reduce (staging free again)")

    def _allreduce_into(
        self,
        src: np.ndarray,
        found: Optional[Tuple[Segment, int]],
        op: str,
        dest: Optional[np.ndarray] = None,
        obtain: Optional[Callable[[], np.ndarray]] = None,
    ) -> np.ndarray:
        """All-reduce every rank's ``src`` into node-shared ``dest`` (or ``obtain()``'s, see :meth:`_reduce_to`), synced."""
        dest = self._reduce_to(src, found, op, "all_reduce (within the node)", dest, obtain)
        if self.node.multi:
            if self.node.leaders is not None:
                self._leaders("Allreduce", mpi_op("in_place"), [dest, mpi_datatype(dest.dtype)], mpi_op(op))
            self.node.sync("all_reduce (waiting for the node leader)")
        return dest

    # ------------------------------------------------------------------ rooted

    def bcast(self, buf: Any, root: int) -> None:
        if self.leaves("bcast", True):  # called directly across nodes (the selector never sends it here)
            self.host.bcast(buf, root)
            return
        node = self.node
        n = buf.size
        if n == 0 or node.size == 1:
            return
        dt = buf.dtype
        isz = dt.itemsize
        sender = node.rank == root  # one node: node ranks are the communicator's ranks
        found = self._locate(buf) if sender else None
        u8 = self._ensure_scratch(-(-n * isz // node.size)).u8
        room = node.size * self._slot  # root writes a whole half of the scratch window per round
        step = room // isz
        shared = False
        for a in range(0, n, step):
            hi = min(n, a + step)
            half, line, _ = self._begin_round()
            base = half * room
            if sender:
                if found is None:
                    u8[base : base + (hi - a) * isz].view(dt)[...] = buf[a:hi]
                    line[0], line[2] = _SCRATCH, base
                else:
                    line[0], line[1], line[2] = _SEGMENT, found[0].sid, found[1]
            node.sync("bcast")
            lines = node.lines()
            if a == 0:
                shared = lines[root, 0] == _SEGMENT
            if not sender:
                buf[a:hi] = self._piece(lines, root, 0, a, hi - a, dt)
        if shared:  # root may write its buffer again once every rank has read it
            node.sync("bcast (releasing root's shared input)")

    def reduce(self, send: Optional[Any], recv: Any, op: str, root: int) -> None:
        if self.leaves("reduce", True):  # called directly across nodes (the selector never sends it here)
            self.host.reduce(send, recv, op, root)
            return
        node = self.node
        size, me = node.size, node.rank
        n = recv.size
        if n == 0:
            return
        src = recv if send is None else send
        found = self._locate(send)
        dt = recv.dtype
        isz = dt.itemsize
        u8 = self._ensure_scratch(n * isz).u8
        step = self._slot // isz
        ufunc = _UFUNCS[op]
        # Root reduces in rank order into its recv; in place at a root after rank 1, the partial result of
        # the ranks before it would overwrite root's own input before it is read: root then packs it too.
        packs = me != root or (send is None and root > 1)
        shared = False
        for a in range(0, n, step):
            hi = min(n, a + step)
            _, line, base = self._begin_round()
            if found is None:
                if packs:
                    u8[base : base + (hi - a) * isz].view(dt)[...] = src[a:hi]
                line[0], line[2] = _SCRATCH, base
            else:
                line[0], line[1], line[2] = _SEGMENT, found[0].sid, found[1]
            node.sync("reduce")
            lines = node.lines()
            if a == 0:
                shared = _any_segment(lines)
            if me == root:
                srcs = [self._piece(lines, q, 0, a, hi - a, dt) for q in range(size)]
                if not packs and found is None:
                    srcs[me] = src[a:hi]
                _combine(ufunc, srcs, recv[a:hi])
        if shared:  # the owners may write their inputs again once root has read them
            node.sync("reduce (releasing shared inputs)")

    # ------------------------------------------------------------------ shared arrays

    def shared_empty(
        self, shape: Optional[Tuple[int, ...]], dtype: np.dtype, layout: Optional[Sequence[Tuple[int, int]]] = None
    ) -> Any:
        """This rank's writeable array of ``shape`` in one new segment of the node (collective over the node).

        ``layout`` is every node rank's ``(nbytes, itemsize)``, in local rank
        order, when the caller agreed it already; otherwise the ranks exchange
        it here, a rank with invalid arguments passing ``shape=None``; then the
        local ranks that failed are returned (a list) and nothing is allocated.
        The shards sit one after the other in local rank order, each aligned to
        its itemsize (no gaps when they share a dtype, so their concatenation
        is the segment's memory).
        """
        node = self.node
        synced = layout is None  # exchanged below by a node sync, which serves as the pool's first
        if layout is None:
            line = node.mine()
            line[0] = -1 if shape is None else prod(shape) * dtype.itemsize
            line[1] = 1 if shape is None else dtype.itemsize
            node.sync("shared_empty")
            lines = node.lines()
            failed = [q for q in range(node.size) if lines[q, 0] < 0]
            if failed:
                return failed
            layout = [(int(lines[q, 0]), int(lines[q, 1])) for q in range(node.size)]
        starts, end = [], 0
        for nbytes, itemsize in layout:
            end = round_up(end, itemsize)
            starts.append(end)
            end += nbytes
        assert shape is not None, "no rank failed, this one included"
        seg = self.pool.obtain(end, "shared_empty", synced)
        return seg.array(starts[node.rank], shape, dtype, writeable=True)

    def gathers_shared(self, shape: Sequence[int], ax: int) -> bool:
        """Whether :meth:`gather_shared` gathers this layout itself: one node, or nodes of consecutive ranks
        gathered along their first non-trivial axis (else the caller gathers privately and publishes)."""
        return not (self.node.multi and (not self.node.contiguous or prod(shape[:ax]) != 1))

    def gather_shared(
        self, x: np.ndarray, shape: Tuple[int, ...], ax: int, sizes: Sequence[int], exclusive: bool
    ) -> np.ndarray:
        """All-gather ``x`` along ``ax`` into one read-only node-shared array of ``shape``.

        Zero copy when every rank passes exactly the array ``shared_empty``
        gave it, of one segment, in rank order, gathered along its first
        non-trivial axis, on one node; ``exclusive`` says that no other view of
        this rank's shard is alive (checked by the caller before anything else
        referenced it). The shards are then frozen (read-only, for good) and the
        result is their memory. Otherwise each rank copies its block into a
        result segment.
        """
        node = self.node
        h = holder_of(x)
        lead = prod(shape[:ax])
        candidate = (
            not node.multi
            and lead == 1
            and h is not None
            and self.pool.segments.get(h.segment.sid) is h.segment
            and x.flags.c_contiguous
            and x.nbytes == h.nbytes
            and (exclusive or not x.flags.writeable)
        )
        line = node.mine()
        line[0] = _SEGMENT if candidate else 0
        if candidate:
            assert h is not None  # candidate says so
            line[1], line[2] = h.segment.sid, h.offset
        node.sync("all_gather (shared result)")
        lines = node.lines()
        row = prod(shape[ax + 1 :]) * x.itemsize
        if _contiguous_shards(lines, [s * row for s in sizes]):
            seg = self.pool.segments[int(lines[0, 1])]
            if x.flags.writeable:
                x.setflags(write=False)
                anchor = x.base  # the segment's anchor (holder_of found it)
                assert anchor is not None
                anchor.setflags(write=False)
            return seg.array(int(lines[0, 2]), shape, x.dtype, writeable=False)
        nbytes = prod(shape) * x.itemsize
        seg = self.pool.obtain(nbytes, "all_gather (shared result)", synced=True)
        out = seg.data[:nbytes].view(x.dtype).reshape(shape)
        g = self.comm.rank
        start = sum(sizes[:g])
        if node.multi:  # lead == 1 and contiguous nodes (the caller sees to it): gather the nodes' blocks in place
            flat = out.reshape(-1)
            inner = prod(shape[ax + 1 :])
            counts = [s * inner for s in sizes]
            flat[start * inner : (start + sizes[g]) * inner] = x.reshape(-1)
            _, node_counts, node_displs = self._node_layout(counts)
            self._exchange_gather(flat.view(movement_dtype(x.dtype)), node_counts, node_displs)
        else:
            out[(slice(None),) * ax + (slice(start, start + sizes[g]),)] = x
            node.sync("all_gather (shared result written)")
        return seg.array(0, shape, x.dtype, writeable=False)

    def publish_shared(self, result: np.ndarray) -> np.ndarray:
        """A read-only node-shared copy of ``result`` (the same on every rank), each rank copying its share."""
        node = self.node
        seg = self.pool.obtain(result.nbytes, "shared result")
        flat = result.reshape(-1)
        _, mine = _node_block(flat.size, node, flat.itemsize)
        out = seg.data[: result.nbytes].view(result.dtype)
        out[mine] = flat[mine]
        node.sync("shared result written")
        return seg.array(0, result.shape, result.dtype, writeable=False)

    def reduce_shared(
        self, send: np.ndarray, op: str, divide: int, shape: Tuple[int, ...], dtype: np.dtype
    ) -> np.ndarray:
        """All-reduce the flat ``send`` into one read-only node-shared array of ``shape`` and ``dtype``.

        ``send`` is in the wire dtype (``dtype``'s bytes); the result is divided by ``divide`` when it is > 1.
        The first sync of the reduction is also the pool's arrival sync.
        """
        node = self.node
        holder: List[Segment] = []

        def obtain() -> np.ndarray:
            holder.append(self.pool.obtain(send.nbytes, "all_reduce (shared result)", synced=True))
            return holder[0].data[: send.nbytes].view(send.dtype)

        dest = self._allreduce_into(send, self._locate(send), op, obtain=obtain)
        if divide > 1:
            part = dest[_node_block(dest.size, node, dest.itemsize)[1]]
            finish_reduction(part, divide, True)
            node.sync("all_reduce (shared result divided)")
        return holder[0].array(0, shape, dtype, writeable=False)

    # ------------------------------------------------------------------ teardown

    def close(self) -> None:
        """Free the scratch and staging windows, the segments no rank holds, and the node (collective)."""
        if self._closed:
            return
        self._closed = True
        if _finalized():
            return
        for block in (self._scratch, self._stage):
            if block is not None:
                block.free()
        self._scratch = self._stage = None
        self.pool.close()
        self.node.free()


def _copy_and_release(node: Node, pairs: List[Tuple[np.ndarray, np.ndarray]]) -> None:
    """Copy each sender's bytes into this rank's receive buffer, then a node sync: every rank has read, so the
    senders may write their boundaries again."""
    for dst, src in pairs:
        dst[...] = src
    node.sync("halo exchange (boundaries read)")


class _ReadInPlace(Prepared):
    """A prepared exchange of node-shared messages: a sync (the senders' boundaries are written), the copies
    from the senders' memory, a sync (read: they may write them again). Done at ``start()``."""

    __slots__ = ("_node", "_pairs")

    def __init__(self, t: SharedMemory, args: tuple, pairs: List[Tuple[np.ndarray, np.ndarray]]) -> None:
        super().__init__(t, "sendrecv", args)
        self._node, self._pairs = t.node, pairs
        self.run = self._run
        self.steps = (self._run,)
        self._start = self._started

    def _run(self) -> None:
        self._node.sync("halo exchange (boundaries written)")
        _copy_and_release(self._node, self._pairs)

    def _started(self) -> Pending:
        self._run()
        return DONE


def shared_empty(c: Any, shape: Any, dtype: Any) -> np.ndarray:
    """This rank's new writeable array in node-shared memory (collective; see ``Communicator.shared_empty``).

    The ranks exchange their sizes through the node's control window (two
    node syncs in all); in check mode, or across nodes, through
    ``Communicator.agree`` first, which shares a rank's exact error with
    every rank.
    """
    err = local = None
    try:
        shape = shape_of("shape", (shape,) if isinstance(shape, (int, np.integer)) else shape)
        try:
            dtype = np.dtype(dtype)
        except TypeError as exc:
            raise ArgumentError(f"dtype: expected a NumPy dtype; got {dtype!r} ({exc})") from None
        check_dtype(dtype, "dtype")
        local = (prod(shape) * dtype.itemsize, dtype.itemsize)
    except HpccollError as exc:
        err = exc
    t = c.shared_transport()
    if c.check or t.node.multi:
        layout = c.agree("shared_empty", None, local, err)  # raises any rank's error on every rank
        return t.shared_empty(shape, dtype, [layout[g] for g in t.node.members[t.node.index]])
    got = t.shared_empty(None if err else shape, dtype)
    if err is not None:
        raise err
    if isinstance(got, list):
        raise ArgumentError(
            f"shared_empty: expected valid shape and dtype on every rank; rank(s) {got} of this node raised "
            "(their own messages say why; HPCCOLL_CHECK=1 shows them on every rank)"
        )
    return got


def _combine(ufunc: Any, srcs: List[np.ndarray], out: np.ndarray) -> None:
    """``out = srcs[0] op srcs[1] op ...``, left to right."""
    if len(srcs) == 1:
        if ufunc in _TRUTH_UFUNCS:  # MPI's logical ops give truth values (0/1), even of one operand
            np.not_equal(srcs[0], 0, out=out)
        else:
            out[...] = srcs[0]
        return
    ufunc(srcs[0], srcs[1], out=out)
    for s in srcs[2:]:
        ufunc(out, s, out=out)


def _node_block(n: int, node: Node, itemsize: int) -> Tuple[List[int], slice]:
    """The node's split of ``n`` elements (:func:`_split`), and this node rank's block of it."""
    blocks = _split(n, node.size, itemsize)
    start = sum(blocks[: node.rank])
    return blocks, slice(start, start + blocks[node.rank])


def _split(n: int, parts: int, itemsize: int) -> List[int]:
    """``n`` elements in ``parts`` blocks, each a whole number of 64-byte lines where it can be."""
    unit = max(1, 64 // itemsize)
    per = round_up(-(-n // parts), unit)  # the ceiling of n / parts, in whole lines
    return [max(0, min(per, n - q * per)) for q in range(parts)]


def _any_segment(lines: Any) -> bool:
    """Whether any rank's published input is a segment."""
    return _SEGMENT in lines[:, 0].tolist()


def _contiguous_shards(lines: Any, nbytes: Sequence[int]) -> bool:
    """Whether every rank published a shard of one segment, laid end to end in rank order."""
    rows = lines.tolist()  # one conversion: Python ints compare several times faster than NumPy scalars
    _, sid, at = rows[0][:3]
    for row, n in zip(rows, nbytes):
        if row[0] != _SEGMENT or row[1] != sid or row[2] != at:
            return False
        at += n
    return True


def _probed(comm: Any) -> Tuple[Optional[str], int]:
    """``(why node-shared windows cannot be made on comm or None, number of nodes)``: collective, cached."""
    return remembered(
        comm, "shm probe", lambda: guarded(comm, "hpccoll shm: probing for node-shared memory", _probe, comm)
    )


def _probe(comm: Any) -> Tuple[Optional[str], int]:
    """Collective: can every rank allocate a node-shared window, and how many nodes are there?"""
    from mpi4py import MPI

    reason, head = None, -1
    _settings.get(NODE_SIZE_ENV)  # a bad HPCCOLL_NODE_SIZE raises ArgumentError (on every rank alike)
    try:
        node = split_node(comm.mpi)
        try:
            head = node.bcast(comm.rank, root=0)
            win = MPI.Win.Allocate_shared(64 if node.Get_rank() == 0 else 0, 1, comm=node)
            win.Shared_query(0)
            win.Free()
        finally:
            node.Free()
    except (MPI.Exception, NotImplementedError) as exc:
        reason = f"MPI_Win_allocate_shared failed: {exc}"
    said = comm.mpi.allgather((reason, head))
    for rank, (why, _) in enumerate(said):
        if why is not None:
            return f"{why} (on rank {rank})", 0
    return None, len({h for _, h in said})


def _finalized() -> bool:
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is None or mpi.Is_finalized()
