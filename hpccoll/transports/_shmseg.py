"""Node-shared memory for the ``shm`` transport: the node, its windows, how its ranks meet, its segments.

Everything here is collective over one node communicator unless said otherwise.

Memory ordering
---------------
The windows are MPI-3 shared-memory windows (``MPI_Win_allocate_shared``)
under the *unified* memory model. There, ``MPI_Win_sync`` orders the calling
process's loads and stores to shared memory and makes its stores visible to
the other processes (MPI 4.1, section 12.5.4); it may only be called inside a
passive-target epoch, so every window is locked once, ``Lock_all(MODE_NOCHECK)``,
right after it is made and unlocked just before it is freed. The ranks of a
node meet on counters in a small control window: a rank publishes what it
wrote by ``Win_sync`` (a release fence) then storing its counter, and a rank
that saw every other counter reach its own issues ``Win_sync`` (an acquire
fence) before it reads their data. An aligned 8-byte store or load is a single
instruction on every platform MPI runs Python on, so a counter is never seen
half-written.
"""

from __future__ import annotations

import atexit
import os
import time
from math import prod
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from .. import _settings
from ._control import guarded

__all__ = ["NODE_SIZE_ENV", "split_node", "Block", "Node", "Segment", "Pool", "holder_of"]

#: Group ranks into simulated nodes of this many consecutive ranks (testing the multi-node logic on one machine).
NODE_SIZE_ENV = "HPCCOLL_NODE_SIZE"

#: int64 slots per cache line; each rank's control record is four lines (counter, descriptors of both parities, spare).
_LINE = 8
_RECORD = 4 * _LINE
#: Tight polls before a waiting rank yields its core (``sched_yield``) between polls; seconds before it naps.
_POLLS = 64
_NAP_AFTER = 0.02
_NAP = 50e-6


def split_node(mpi: Any) -> Any:
    """The node communicator of ``mpi``: real (``COMM_TYPE_SHARED``) or simulated (``HPCCOLL_NODE_SIZE``).

    ``HPCCOLL_NODE_SIZE=k`` groups ranks ``rank // k`` (consecutive ranks share a node, as ``mpiexec``
    places them by default); ``k,cyclic`` deals them round-robin onto ``ceil(size / k)`` nodes
    (``--map-by node``), so nodes hold non-consecutive ranks.
    """
    from mpi4py import MPI

    me = mpi.Get_rank()
    simulated = _settings.get(NODE_SIZE_ENV)
    if simulated is None:
        return mpi.Split_type(MPI.COMM_TYPE_SHARED, key=me)
    k, cyclic = simulated
    return mpi.Split(me % -(-mpi.Get_size() // k) if cyclic else me // k, me)


def round_up(n: int, to: int) -> int:
    """``n`` rounded up to a multiple of ``to``."""
    return -(-n // to) * to


class Block:
    """One shared window whose memory is a single region every rank of the node maps.

    The whole region is allocated in the node's rank 0 part (the others ask for
    0 bytes), so it is contiguous whatever the MPI library does between ranks'
    parts; pages land on the NUMA node of the rank that first writes them.
    ``u8`` is the library's own writeable byte view; arrays handed to users are
    made separately (see :meth:`Segment.array`).
    """

    __slots__ = ("win", "nbytes", "u8", "address", "sync")

    def __init__(self, node_mpi: Any, nbytes: int) -> None:
        from mpi4py import MPI

        nbytes = round_up(max(int(nbytes), 64), 64)
        # 64 bytes more than asked: MPI promises no alignment for a shared window (Debian's Open MPI 4.1
        # returns bases 8 bytes past a 16-byte boundary), and the block starts at the first 64-byte one.
        win = MPI.Win.Allocate_shared(nbytes + 64 if node_mpi.Get_rank() == 0 else 0, 1, comm=node_mpi)
        buf, _ = win.Shared_query(0)
        win.Lock_all(MPI.MODE_NOCHECK)
        skip = -buf.address % 64
        self.win = win
        self.nbytes = nbytes
        self.address: int = buf.address + skip
        # numpy's stub names a few buffer types only; frombuffer takes any buffer, as mpi4py's here
        self.u8 = np.frombuffer(buf, np.uint8, nbytes, offset=skip)  # type: ignore[call-overload]
        #: The memory fence (``MPI_Win_sync``) of this window.
        self.sync: Callable[[], None] = win.Sync

    def free(self) -> None:
        """Unlock and free the window (collective over the node)."""
        self.u8 = None
        self.win.Unlock_all()
        self.win.Free()


class Node:
    """The ranks of one communicator that share memory: topology, control window and synchronisation.

    The node is ``Split_type(COMM_TYPE_SHARED)`` of the communicator, or a
    simulated one (``HPCCOLL_NODE_SIZE``, see :func:`split_node`). Local ranks follow
    the communicator's rank order; the node's leader is its local rank 0.

    Attributes
    ----------
    mpi : mpi4py.MPI.Intracomm
        The node communicator.
    rank, size : int
        This rank within the node, and the node's size.
    members : list of list of int
        For each node (ordered by their lowest rank), its ranks in the communicator.
    leaders : mpi4py.MPI.Intracomm or None
        The node leaders' communicator, on leaders of a multi-node communicator only.
    multi : bool
        More than one node.
    contiguous : bool
        Each node holds consecutive ranks, so node-major order is rank order.
    """

    def __init__(self, comm: Any) -> None:
        from mpi4py import MPI

        self.comm = comm  # the hpccoll Communicator (for the watchdog's settings)
        world = comm.mpi
        me = world.Get_rank()
        self.mpi = split_node(world)
        self.rank: int = self.mpi.Get_rank()
        self.size: int = self.mpi.Get_size()
        first = self.mpi.bcast(me, root=0)
        heads = world.allgather(first)
        order = sorted(set(heads))
        self.members: List[List[int]] = [[g for g, h in enumerate(heads) if h == n] for n in order]
        self.index: int = order.index(first)
        self.multi = len(order) > 1
        self.contiguous = [g for m in self.members for g in m] == list(range(len(heads)))
        leaders = world.Split(0 if self.rank == 0 else MPI.UNDEFINED, me) if self.multi else MPI.COMM_NULL
        self.leaders = None if leaders == MPI.COMM_NULL else leaders
        self.control = Block(self.mpi, self.size * _RECORD * 8)
        ctl = self.control.u8[: self.size * _RECORD * 8].view(np.int64).reshape(self.size, _RECORD)
        if self.rank == 0:
            ctl[...] = 0
        self.mpi.Barrier()
        self.counters = ctl[:, 0]
        self.fence = self.control.sync
        #: Per parity, every rank's descriptor line (8 int64): written before a sync, read after it.
        self.desc = (ctl[:, _LINE : 2 * _LINE], ctl[:, 2 * _LINE : 3 * _LINE])
        self.seq = 0
        self.others = [q for q in range(self.size) if q != self.rank]

    # ------------------------------------------------------------------ synchronisation

    def mine(self) -> Any:
        """This rank's descriptor line for the next sync (write it, then :meth:`arrive`)."""
        return self.desc[(self.seq + 1) & 1][self.rank]

    def lines(self) -> Any:
        """Every rank's descriptor lines of the last sync (read them after :meth:`wait`)."""
        return self.desc[self.seq & 1]

    def arrive(self) -> None:
        """Publish everything this rank wrote so far and announce it (the first half of :meth:`sync`)."""
        self.seq += 1
        self.fence()
        self.counters[self.rank] = self.seq

    def wait(self, what: str) -> None:
        """Wait until every rank of the node has arrived at this sync (the second half)."""
        seq, counters = self.seq, self.counters
        for q in self.others:
            if counters[q] < seq:
                guarded(self.comm, f"hpccoll shm: {what} (waiting for the other ranks of this node)", self._spin, seq)
                break
        self.fence()

    def sync(self, what: str) -> None:
        """A full barrier of the node's ranks, with the memory fences that make their writes visible."""
        self.arrive()
        self.wait(what)

    def _spin(self, seq: int) -> None:
        """Poll the others' counters: a few tight polls, then yielding the core between polls, then napping.

        Yielding early measured best on this project's shared 2-core machine,
        with and without more ranks than cores: a rank that waits is usually
        waiting for one that is not running, and gives it (or anyone) the core.
        """
        counters = self.counters
        polls = 0
        start = 0.0
        for q in self.others:
            while counters[q] < seq:
                polls += 1
                if polls <= _POLLS:
                    continue
                if polls & 255 == 0:
                    now = time.perf_counter()
                    if not start:
                        start = now
                    elif now - start > _NAP_AFTER:
                        time.sleep(_NAP)  # a long wait (a slow rank): stop taking a core from it
                        continue
                os.sched_yield()

    def free(self) -> None:
        """Free the control window and the node and leader communicators (collective)."""
        self.control.free()
        if self.leaders is not None:
            self.leaders.Free()
        self.mpi.Free()


# ---------------------------------------------------------------------- segments


class _Holder:
    """What a handed-out array's memory hangs on: its death ends this rank's hold on the segment.

    It exposes the memory through ``__array_interface__`` only, with no buffer
    protocol, so an array over it that was made read-only cannot be made
    writeable again (NumPy asks the final base for a writable buffer).
    """

    __slots__ = ("__array_interface__", "segment", "gen", "offset", "nbytes")

    __array_interface__: Dict[str, Any]
    segment: Segment
    gen: int
    offset: int
    nbytes: int

    def __del__(self) -> None:
        try:
            self.segment._drop(self.gen)
        except Exception:  # pragma: no cover - interpreter shutdown: nothing left to release
            pass


def holder_of(a: Any) -> Optional[_Holder]:
    """The :class:`_Holder` under a NumPy array handed out by a :class:`Segment`, else ``None``."""
    base = getattr(a, "base", None)
    if type(base) is np.ndarray:
        base = base.base
    return base if type(base) is _Holder else None


class Segment:
    """A shared region handed out whole and reused only when no rank of the node holds any array over it.

    Each rank counts the arrays it handed out over the current *generation* of
    the segment (one :class:`_Holder` each, released when the array and all its
    views are gone); when its count drops to 0 it writes the generation into its
    slot of the segment's header. The segment is free when every slot holds the
    current generation; the node's leader decides reuse (see :class:`Pool`).
    """

    def __init__(self, node: Node, sid: int, capacity: int) -> None:
        self.sid = sid
        self.rank = node.rank
        header = round_up(node.size * 8, 64)
        self.capacity = capacity
        self.block = Block(node.mpi, header + capacity)
        self.address = self.block.address + header
        self.data = self.block.u8[header : header + capacity]
        self.released = self.block.u8[: node.size * 8].view(np.int64)
        self.gen = 0
        self.held = 0
        self.released[self.rank] = 0

    def start(self) -> None:
        """Begin a new generation (on every rank, as agreed); each rank then hands out at least one array."""
        self.gen += 1
        self.held = 0

    def array(self, offset: int, shape: Tuple[int, ...], dtype: np.dtype, writeable: bool) -> np.ndarray:
        """A NumPy array over ``data[offset:]`` that holds this generation until it and its views are gone.

        The array is a view of one private ``uint8`` anchor (every further view's
        ``base``), so the number of live views is the anchor's reference count.
        """
        nbytes = prod(shape) * dtype.itemsize
        h = _Holder()
        h.__array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (self.address + offset, not writeable),
            "version": 3,
        }
        h.segment, h.gen, h.offset, h.nbytes = self, self.gen, offset, nbytes
        anchor = np.asarray(h)
        self.held += 1
        return anchor.view(dtype).reshape(shape)

    def _drop(self, gen: int) -> None:
        if gen != self.gen:  # pragma: no cover - a generation ends only when every hold on it is gone
            return
        self.held -= 1
        if self.held == 0 and self.block.u8 is not None and not _EXITING:
            self.block.sync()  # this rank's reads of the segment come before its release
            self.released[self.rank] = self.gen

    def is_free(self) -> bool:
        """Whether no rank holds any array of the current generation (as seen now; monotone)."""
        gen = self.gen
        return all(r == gen for r in self.released.tolist())

    def free(self) -> None:
        """Free the window (collective; only when no rank holds anything, or the memory is lost)."""
        self.data = None
        self.block.free()


#: Segments still held when their communicator was freed: kept mapped until the process exits.
_ORPHANS: List[Segment] = []


class Pool:
    """The node's segments, reused by agreement.

    The leader (local rank 0) decides, after a sync at which every rank has
    arrived (so every hold a rank ended before calling is visible), which free
    segment to reuse or that a new one is needed, and which idle ones to free;
    it publishes the decision in its descriptor line at the next sync, and every
    rank applies it in the same order (freeing and allocating windows are
    collective).
    """

    #: Idle segments freed per decision at most (the decision travels in one cache line).
    FREES = 4

    def __init__(self, node: Node) -> None:
        self.node = node
        self.segments: Dict[int, Segment] = {}
        self.next_sid = 1

    def decide(self, nbytes: int) -> Tuple[int, List[int]]:
        """Leader: ``(sid to reuse or -1 for a new one, sids to free)`` for a request of ``nbytes``."""
        best = None
        idle = []
        for seg in self.segments.values():
            if not seg.is_free():
                continue
            if nbytes <= seg.capacity <= 2 * nbytes + (1 << 16) and (best is None or seg.capacity < best.capacity):
                best = seg
            idle.append(seg.sid)
        if best is not None:
            return best.sid, []
        return -1, idle[: self.FREES]

    def publish(self, line: Any, decision: Tuple[int, List[int]]) -> None:
        """Leader: write ``decision`` into descriptor ``line`` (fields 3-7)."""
        sid, frees = decision
        line[3] = sid
        line[4 : 4 + self.FREES] = frees + [0] * (self.FREES - len(frees))

    def apply(self, line: Any, nbytes: int) -> Segment:
        """Every rank: carry out the leader's published decision; return the segment, its new generation begun."""
        sid = int(line[3])
        for f in line[4 : 4 + self.FREES].tolist():
            if f:
                self.segments.pop(f).free()
        if sid < 0:
            seg = Segment(self.node, self.next_sid, round_up(nbytes, 64))
            self.segments[seg.sid] = seg
            self.next_sid += 1
            self.node.sync("a new shared segment")  # every header slot initialised before any rank releases
        else:
            seg = self.segments[sid]
        seg.start()
        return seg

    def obtain(self, nbytes: int, what: str, synced: bool = False) -> Segment:
        """A segment of at least ``nbytes`` whose every hold is gone, agreed by the node (two syncs).

        ``synced``: every rank of the node has just passed a sync, which then
        serves as the first (every hold ended before it is visible).
        """
        node = self.node
        if not synced:
            node.sync(what)  # everyone is here: every hold ended before this call is visible
        line = node.mine()
        if node.rank == 0:
            self.publish(line, self.decide(nbytes))
        node.sync(what)
        return self.apply(node.lines()[0], nbytes)

    def locate(self, address: int, nbytes: int) -> Optional[Tuple[Segment, int]]:
        """The segment holding ``[address, address + nbytes)`` and the offset in its data, else ``None``."""
        for seg in self.segments.values():
            offset = address - seg.address
            if 0 <= offset and offset + nbytes <= seg.capacity:
                return seg, offset
        return None

    def close(self) -> None:
        """Free every segment no rank holds; keep the others mapped until exit (collective)."""
        sids = sorted(self.segments)
        held = np.array([self.segments[s].held > 0 for s in sids], dtype=np.int8)
        anywhere = np.empty_like(held)
        from mpi4py import MPI

        self.node.mpi.Allreduce(held, anywhere, op=MPI.MAX)
        for sid, keep in zip(sids, anywhere.tolist()):
            seg = self.segments.pop(sid)
            if keep:
                _ORPHANS.append(seg)
            else:
                seg.free()


#: Set at interpreter exit, before mpi4py finalizes MPI (atexit runs handlers last registered first,
#: and this module is imported after mpi4py's): arrays dying afterwards release nothing.
_EXITING = False


@atexit.register
def _exiting() -> None:
    global _EXITING
    _EXITING = True
