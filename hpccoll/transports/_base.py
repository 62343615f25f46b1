"""The one contract every transport implements.

A transport moves *flat buffers*: 1-D, C-contiguous arrays of its array
module (NumPy or CuPy) whose dtype is a wire dtype chosen by
:mod:`hpccoll._dtypes`. Counts are in elements, one per rank, and blocks are
laid out rank after rank (displacements are the prefix sums of the counts).
Axes, uneven shards, dtype widening, ``avg``, lists and adjoints are handled
once, above the transports, in :mod:`hpccoll.collectives`; no module outside
this package calls an MPI or NCCL collective.

A transport declares what it can do: the array kind it serves, its place in
``auto``'s order, a collective probe, and optional capabilities the
collectives consult (:attr:`~Transport.in_place`,
:attr:`~Transport.native_reduce`, :attr:`~Transport.saturates`, :attr:`~Transport.reduce_ops`,
:attr:`~Transport.hosts`, :attr:`~Transport.shared_results`, :meth:`~Transport.allgather_into`).
"""

from __future__ import annotations

import abc
import functools
from typing import Any, Callable, ClassVar, Dict, FrozenSet, List, Optional, Sequence, Tuple

import numpy as np

from .._dtypes import BASIC_OPS, WIRE_OPS
from .._request import DONE, Pending

__all__ = ["Transport", "Prepared", "PRIMITIVES", "moved", "sent", "BASIC_OPS", "WIRE_OPS"]

#: The contract's primitives and what each of their arguments is, declared once: what a call reads and
#: writes on a rank (:func:`moved`, :func:`sent`) is derived from it for plans (which calls send the input's
#: own memory), ``staged`` (what a prepared call copies in and back) and ``cuda_mpi`` (which calls wait for
#: the stream first). Each primitive also has a non-blocking ``i`` form with the same arguments.
#: The roles: ``send`` (read; ``None``: in place, the argument after it holds the input), ``send@root``
#: (read at the root, ``None`` elsewhere), ``recv`` (written), ``recv@root`` (written at the root, ``None``
#: elsewhere), ``buf`` (read at the root, written elsewhere), ``sends``/``recvs`` (lists of ``(buffer,
#: rank)``), and values: counts, ``op``, ``root``, ``even``, ``sized``.
PRIMITIVES = {
    "allgatherv": ("send", "recv", "counts"),
    "reduce_scatter": ("send", "recv", "counts", "op"),
    "allreduce": ("send", "recv", "op"),
    "alltoallv": ("send", "recv", "send_counts", "recv_counts", "even"),
    "bcast": ("buf", "root"),
    "reduce": ("send", "recv@root", "op", "root"),
    "gatherv": ("send", "recv@root", "counts", "root"),
    "scatterv": ("send@root", "recv", "counts", "root"),
    "sendrecv": ("sends", "recvs", "sized"),
}


def moved(primitive: str, args: tuple, rank: int) -> Tuple[List[int], List[int]]:
    """The positions in ``args`` of the buffers a call of ``primitive`` reads and of those it writes on ``rank``
    (:data:`PRIMITIVES`; a ``sendrecv``'s lists count as positions 0 and 1)."""
    roles = PRIMITIVES[primitive]
    at_root = "root" not in roles or args[roles.index("root")] == rank
    reads: List[int] = []
    writes: List[int] = []
    for i, role in enumerate(roles):
        if role in ("send", "sends") or (role == "send@root" and at_root) or (role == "buf" and at_root):
            reads.append(i + 1 if args[i] is None else i)  # in place: the receive buffer holds the input
        elif role in ("recv", "recvs") or (role == "recv@root" and at_root) or role == "buf":
            writes.append(i)
    return reads, writes


def measured(primitive: str, args: tuple) -> int:
    """The bytes of a call as every rank measures them alike, which pick its transport
    (``Communicator.transport_of``): a reduction's whole input, an all-gather's result, a broadcast's
    buffer; 0 for the others, whose transport no size decides."""
    roles = PRIMITIVES[primitive]
    if "op" in roles:
        return int((args[1] if args[0] is None else args[0]).nbytes)
    if primitive in ("allgatherv", "bcast"):
        return int(args[roles.index("buf" if primitive == "bcast" else "recv")].nbytes)
    return 0


def sent(primitive: str, args: tuple, rank: int) -> List[Any]:
    """The buffers whose contents a call of ``primitive`` sends from ``rank`` (each message's, for ``sendrecv``)."""
    if primitive == "sendrecv":
        return [buf for buf, _ in args[0]]
    return [args[i] for i in moved(primitive, args, rank)[0]]


def _bytes_of(kind: str, n: int) -> Any:
    """``n`` fresh bytes of the array kind ``kind`` (``"numpy"`` or ``"cupy"``)."""
    if kind == "numpy":
        return np.empty(n, np.uint8)
    import cupy  # the transport moves CuPy arrays, so it is importable

    return cupy.empty(n, np.uint8)


def _by_peer(messages: Sequence[Tuple[Any, int]], parts: int) -> Tuple[List[Any], List[int]]:
    """The buffers of ``(buffer, rank)`` ``messages`` rank after rank (each rank's in message order), and each
    rank's bytes: the default ``sendrecv``'s packing order and ``alltoallv`` counts."""
    peers: List[List[Any]] = [[] for _ in range(parts)]
    for buf, q in messages:
        peers[q].append(buf)
    return [buf for bufs in peers for buf in bufs], [sum(buf.nbytes for buf in bufs) for bufs in peers]


class _Then(Pending):
    """A pending operation, then a step once it completed (the default ``isendrecv``'s unpacking)."""

    __slots__ = ("pending", "step", "owned")

    def __init__(self, pending: Pending, step: Callable[[], None], owned: Any) -> None:
        self.pending = pending
        self.step: Optional[Callable[[], None]] = step
        self.owned = owned

    def _finish(self) -> None:
        if self.step is not None:
            self.step()
            self.step = None
            self.owned = None

    def wait(self) -> None:
        self.pending.wait()
        self._finish()

    def test(self) -> bool:
        if self.pending.test():
            self._finish()
            return True
        return False


class Transport(abc.ABC):
    """Buffer-level collectives over one :class:`~hpccoll.Communicator`.

    Subclasses set :attr:`name`, :attr:`array_kind`, :attr:`priority` and
    :attr:`chosen_because`, implement the four abstract primitives (the rooted ones, :meth:`bcast`,
    :meth:`reduce`, :meth:`gatherv` and :meth:`scatterv`, have defaults built
    from them), and are made
    selectable with :func:`hpccoll.transports.register`. A primitive either
    completes (the output is ready for the caller's next operation in its
    stream order) or raises.

    Buffers are 1-D C-contiguous arrays of the transport's
    :attr:`array_kind`, of a dtype the collectives chose for the wire;
    counts are in elements. ``op`` is one of ``"sum"``, ``"prod"``,
    ``"max"``, ``"min"`` (``avg`` is a sum the collectives divide), or one
    of the logical and bitwise ops in :attr:`reduce_ops`.

    Parameters
    ----------
    comm : Communicator
        The communicator the transport serves (``self.comm``).
    """

    #: The name users select the transport by.
    name: ClassVar[str]
    #: ``"numpy"`` or ``"cupy"``: the arrays this transport moves.
    array_kind: ClassVar[str]
    #: ``auto`` tries the transports of an array kind in increasing priority.
    priority: ClassVar[int] = 100
    #: Why ``auto`` picks this transport when it can run (``Communicator.transport_for``).
    chosen_because: ClassVar[str] = "the first usable transport"
    #: ``auto`` uses this transport only for messages of at least this many bytes (a size every rank
    #: computes alike: the whole array of a reduction, the gathered result of an all-gather); smaller
    #: ones go to the next usable transport. 0: every message.
    min_bytes: ClassVar[int] = 0
    #: 16-bit float dtype names reduced natively (others are widened to float32); a class default that
    #: an instance may replace once it knows its library.
    native_reduce: FrozenSet[str] = frozenset()
    #: Integer dtypes whose sums this transport saturates where NumPy wraps (Open MPI's 8- and
    #: 16-bit sums): the collectives widen those sums to 32 bits. A set of ``numpy.dtype``; a class
    #: default that an instance may replace once it knows its library.
    saturates: FrozenSet[Any] = frozenset()
    #: The dtype names the transport's library reduces elementwise natively, or ``None``: every dtype the
    #: collectives hand it (as MPI does). For a dtype outside the set, :mod:`hpccoll._dtypes` decides how it is
    #: reduced (``library_reduction``: int16/uint16 widened to 32 bits, complex sum as twice as many reals,
    #: complex prod by whole blocks, complex max/min refused) and moved (``library_move_wire``: as itself,
    #: as reals, or as bytes). A class default that an instance may replace once it knows its library (NCCL).
    reduce_dtypes: Optional[FrozenSet[str]] = None
    #: The wire ops the transport reduces: :data:`BASIC_OPS` (sum, prod, max, min) by default; :data:`WIRE_OPS` adds MPI's
    #: ``land``, ``lor``, ``lxor`` (integers: nonzero is true, the result 0 or 1 in the buffer's
    #: dtype; ``lxor`` also on bool's 0/1 bytes) and ``band``, ``bor``, ``bxor`` (integers). The
    #: collectives (:func:`hpccoll._dtypes.reduce_plan`) express bool's logical and bitwise ops through
    #: ``min``/``max`` and refuse, clearly, an op on integers that the transport lacks.
    reduce_ops: ClassVar[FrozenSet[str]] = BASIC_OPS
    #: Whether ``allgatherv`` and ``reduce_scatter`` accept ``send=None`` (in
    #: place); without it the caller copies the input first.
    in_place: ClassVar[bool] = False

    #: Whether this transport can be the *host transport* that others compose for what they leave to
    #: host MPI (shm's non-blocking forms, staged's host copies): a NumPy transport that implements
    #: every primitive itself, the non-blocking ones with real asynchronous progress. The registry
    #: hands the first such usable one out (``Communicator.host_transport``), by this capability, not
    #: by name.
    hosts: ClassVar[bool] = False

    #: Whether this transport makes *node-shared results* (``out="shared"``, ``Communicator.shared_empty``):
    #: a NumPy transport that provides :meth:`shared_empty`, :meth:`gathers_shared`, :meth:`gather_shared`,
    #: :meth:`publish_shared` and :meth:`reduce_shared` (the defaults raise ``NotImplementedError``).
    #: ``hpccoll.collectives.shared`` looks the transport up by this capability, not by name.
    shared_results: ClassVar[bool] = False

    #: Whether a blocking :meth:`bcast` on one rank matches a non-blocking :meth:`ibcast` on another (MPI's
    #: point-to-point messages do; its ``Bcast`` and ``Ibcast`` do not). Where it holds, a blocking broadcast
    #: past ``Selector.OVERLAP_BYTES`` is the non-blocking call only on a root that has a copy to make while it
    #: travels; the other ranks, and an in-place root, make the blocking one. A class default that an
    #: instance may replace once it knows its communicator (host MPI's two-rank broadcast).
    bcast_forms_match: bool = False

    #: A transport that composes a host transport (``self.host``) for the messages it does not move faster:
    #: per blocking primitive, the ``[low, high)`` message sizes in bytes worth trying it for (the size every
    #: rank measures alike: the gathered result, the whole reduced array). The communicator's
    #: :class:`~hpccoll.transports.Selector` hands every other message to the host transport, and decides
    #: inside them by the tuning profile, else by a first-use race (``first_use``, ``race_max_bytes``,
    #: ``race_margin``, ``race_rounds``). ``None``: the transport moves every message it is given.
    wins: ClassVar[Optional[Dict[str, Tuple[int, int]]]] = None

    def __init__(self, comm: Any) -> None:
        self.comm = comm

    def leaves(self, primitive: str, blocking: bool) -> bool:
        """Whether every call of ``primitive`` in this form goes to the host transport, whatever its size.

        The one declared place of a transport's hand-offs (read by the
        :class:`~hpccoll.transports.Selector` where :attr:`wins` is set): a
        primitive never hands its message to another transport by itself.

        Parameters
        ----------
        primitive : str
            A primitive's blocking name (``"allreduce"``).
        blocking : bool
            The blocking form (else the non-blocking one).

        Returns
        -------
        bool
            ``True`` where the host transport moves every such call.
        """
        return False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Where a transport implements only the non-blocking form of a primitive, its blocking form is that
        form's ``wait()`` (the contract's defaults otherwise: each ``i`` form runs the blocking one)."""
        super().__init_subclass__(**kwargs)
        for name in PRIMITIVES:
            if getattr(cls, name) is getattr(Transport, name) and getattr(cls, "i" + name) is not getattr(
                Transport, "i" + name
            ):
                setattr(cls, name, _waiting("i" + name))

    @classmethod
    def unavailable_reason(cls, comm: Any) -> Optional[str]:
        """Why this transport cannot run for ``comm`` here, or ``None`` if it can.

        Collective where the answer needs the other ranks (it must be the same
        on every rank); the registry caches what it decides on ``comm``.

        Parameters
        ----------
        comm : Communicator
            The communicator asking.

        Returns
        -------
        str or None
            The reason, for the :class:`~hpccoll.TransportUnavailable` message.
        """
        return None

    @classmethod
    def auto_reason(cls, comm: Any) -> Optional[str]:
        """Why ``auto`` should not pick this transport for ``comm``, or ``None`` if it may.

        Defaults to :meth:`unavailable_reason`; a transport that must be asked
        for by name (or declared, like ``cuda_mpi``) says so here.

        Parameters
        ----------
        comm : Communicator
            The communicator asking.

        Returns
        -------
        str or None
            The reason (``info`` shows it), or ``None``.
        """
        return cls.unavailable_reason(comm)

    @abc.abstractmethod
    def allgatherv(self, send: Optional[Any], recv: Any, counts: Sequence[int]) -> None:
        """Concatenate every rank's ``send`` (``counts[rank]`` elements) into ``recv``.

        Parameters
        ----------
        send : array or None
            This rank's ``counts[rank]`` elements. ``None`` is the in-place
            form (only where :attr:`in_place`): this rank's data is already at
            its block of ``recv``.
        recv : array
            ``sum(counts)`` elements: rank r's block at offset ``sum(counts[:r])``.
        counts : sequence of int
            Every rank's element count.
        """

    @abc.abstractmethod
    def reduce_scatter(self, send: Optional[Any], recv: Any, counts: Sequence[int], op: str) -> None:
        """Reduce ``send`` (``sum(counts)`` elements) over ranks; this rank's block to ``recv``.

        Parameters
        ----------
        send : array or None
            ``sum(counts)`` elements. ``None`` is the in-place form (only
            where :attr:`in_place`): ``recv`` holds all ``sum(counts)`` input
            elements and the result goes to this rank's block of it (the rest
            of ``recv`` is left undefined).
        recv : array
            ``counts[rank]`` elements (``sum(counts)`` in place).
        counts : sequence of int
            Every rank's block size, in elements.
        op : str
            The reduction.
        """

    @abc.abstractmethod
    def allreduce(self, send: Optional[Any], recv: Any, op: str) -> None:
        """Reduce ``send`` over ranks into ``recv``.

        Parameters
        ----------
        send : array or None
            The input, as many elements as ``recv``; ``None`` reduces ``recv``
            in place.
        recv : array
            The result.
        op : str
            The reduction.
        """

    @abc.abstractmethod
    def alltoallv(
        self, send: Any, recv: Any, send_counts: Sequence[int], recv_counts: Sequence[int], even: bool = False
    ) -> None:
        """Send block j of ``send`` to rank j; receive rank r's block for this rank at block r of ``recv``.

        The caller guarantees that ``send_counts[j]`` on rank r equals
        ``recv_counts[r]`` on rank j. There is no in-place form.

        Parameters
        ----------
        send : array
            ``send_counts[j]`` elements for each rank j, blocks rank after rank.
        recv : array
            ``recv_counts[r]`` elements from each rank r, blocks rank after rank.
        send_counts, recv_counts : sequence of int
            The block sizes, in elements, one per rank.
        even : bool
            Every pair of ranks moves the same count, and every rank was told
            so: a transport may then use an even call (``MPI_Alltoall``). It
            cannot decide that from its own counts, which are one row and one
            column of the ranks' count matrix: ranks that chose different MPI
            calls would hang.
        """

    # The rooted primitives. Each has a working default built from the primitives above (exact data
    # movement, no arithmetic a rooted call would not do), so a transport written before they existed
    # keeps working; a transport overrides them with its library's rooted calls.

    def bcast(self, buf: Any, root: int) -> None:
        """Copy root's ``buf`` into every rank's ``buf``.

        The default is an all-gather in which only ``root`` contributes.

        Parameters
        ----------
        buf : array
            The same number of elements on every rank: sent from ``root``,
            overwritten elsewhere.
        root : int
            The rank whose ``buf`` is sent.
        """
        counts = [0] * self.comm.size
        counts[root] = buf.size
        if self.comm.rank == root:  # root's block starts at offset 0: every other count is 0
            send = None if self.in_place else buf.copy()
        else:
            send = buf[:0].copy()  # an empty buffer of its own: MPI forbids aliased buffers, even empty ones
        self.allgatherv(send, buf, counts)

    def reduce(self, send: Optional[Any], recv: Any, op: str, root: int) -> None:
        """Reduce ``send`` over ranks into root's ``recv``.

        The default is an all-reduce (every rank's ``recv`` then holds the
        result, which the contract allows).

        Parameters
        ----------
        send : array or None
            The input, as many elements as ``recv``; ``None`` reduces ``recv``
            in place (on every rank: ``recv`` holds this rank's input).
        recv : array
            As many elements on every rank; root's holds the result, the
            others' are left undefined.
        op : str
            The reduction.
        root : int
            The rank that receives the result.
        """
        self.allreduce(send, recv, op)

    def gatherv(self, send: Any, recv: Optional[Any], counts: Sequence[int], root: int) -> None:
        """Concatenate every rank's ``send`` (``counts[rank]`` elements) into root's ``recv``.

        The default is an all-to-all in which every rank sends only to ``root``.

        Parameters
        ----------
        send : array
            This rank's ``counts[rank]`` elements.
        recv : array or None
            At ``root``: ``sum(counts)`` elements, rank r's block at offset
            ``sum(counts[:r])``. Elsewhere ``None``.
        counts : sequence of int
            Every rank's element count (the same on every rank).
        root : int
            The rank that receives.
        """
        parts, rank = self.comm.size, self.comm.rank
        sends = [0] * parts
        sends[root] = counts[rank]
        if rank != root:
            recv = send[:0].copy()
        self.alltoallv(send, recv, sends, list(counts) if rank == root else [0] * parts)

    def scatterv(self, send: Optional[Any], recv: Any, counts: Sequence[int], root: int) -> None:
        """Send block r of root's ``send`` to rank r's ``recv``.

        The default is an all-to-all in which only ``root`` sends.

        Parameters
        ----------
        send : array or None
            At ``root``: ``sum(counts)`` elements, rank r's block at offset
            ``sum(counts[:r])``. Elsewhere ``None``.
        recv : array
            This rank's ``counts[rank]`` elements.
        counts : sequence of int
            Every rank's element count (the same on every rank).
        root : int
            The rank that sends.
        """
        parts, rank = self.comm.size, self.comm.rank
        receives = [0] * parts
        receives[root] = counts[rank]
        if rank != root:
            send = recv[:0].copy()
        self.alltoallv(send, recv, list(counts) if rank == root else [0] * parts, receives)

    def sendrecv(self, sends: Sequence[Tuple[Any, int]], recvs: Sequence[Tuple[Any, int]], sized: bool = False) -> None:
        """Send each ``(buffer, rank)`` of ``sends`` and receive each ``(buffer, rank)`` of ``recvs`` (collective).

        The messages between one pair of ranks match in order: the k-th send
        to rank q fills q's k-th receive from this rank, which has the same
        number of bytes. Every rank calls it, with empty lists where it has
        nothing to move. The default is one all-to-all of bytes (each pair's
        messages packed in order, then unpacked); a transport with
        point-to-point messages sends the buffers themselves.

        Parameters
        ----------
        sends, recvs : sequence of (array, int)
            1-D C-contiguous buffers (any dtype; they move as bytes) and the
            ranks they go to or come from (this rank included).
        sized : bool
            The ranks did not agree on the messages' sizes (``shift``; the halo
            exchange and plans do): a transport that learns each receive's size
            anyway (host MPI, from its status) raises
            :class:`~hpccoll.MismatchError` for one of another size. The others
            ignore it.
        """
        self._sendrecv(sends, recvs, False).wait()

    def isendrecv(
        self, sends: Sequence[Tuple[Any, int]], recvs: Sequence[Tuple[Any, int]], sized: bool = False
    ) -> Pending:
        """Non-blocking :meth:`sendrecv`.

        Parameters
        ----------
        sends, recvs : sequence of (array, int)
            As for :meth:`sendrecv`.
        sized : bool
            As for :meth:`sendrecv`.

        Returns
        -------
        Pending
            The operation in flight; the receive buffers are filled once it completes.
        """
        return self._sendrecv(sends, recvs, True)

    def _sendrecv(self, sends: Sequence[Tuple[Any, int]], recvs: Sequence[Tuple[Any, int]], started: bool) -> Pending:
        """The default :meth:`sendrecv`: one ``alltoallv`` of bytes, packed per peer in message order."""
        outgoing, send_counts = _by_peer(sends, self.comm.size)
        incoming, recv_counts = _by_peer(recvs, self.comm.size)
        packed = _bytes_of(self.array_kind, sum(send_counts))  # a rank with nothing to move packs none alike
        at = 0
        for buf in outgoing:
            packed[at : at + buf.nbytes] = buf.view(np.uint8)
            at += buf.nbytes
        received = _bytes_of(self.array_kind, sum(recv_counts))

        def unpack() -> None:
            at = 0
            for buf in incoming:
                buf.view(np.uint8)[...] = received[at : at + buf.nbytes]
                at += buf.nbytes

        if started:
            pending = self.ialltoallv(packed, received, send_counts, recv_counts)
            return _Then(pending, unpack, (packed, received))
        self.alltoallv(packed, received, send_counts, recv_counts)
        unpack()
        return DONE

    # Non-blocking forms: return a Pending (``wait()``/``test()``). The defaults
    # run the blocking primitive, for transports without asynchronous progress.

    def iallgatherv(self, send: Any, recv: Any, counts: Sequence[int]) -> Pending:
        """Non-blocking :meth:`allgatherv`.

        Parameters
        ----------
        send : array or None
            As for :meth:`allgatherv`.
        recv : array
            As for :meth:`allgatherv`.
        counts : sequence of int
            As for :meth:`allgatherv`.

        Returns
        -------
        Pending
            The operation in flight (``DONE`` when it completed already).
        """
        self.allgatherv(send, recv, counts)
        return DONE

    def ireduce_scatter(self, send: Any, recv: Any, counts: Sequence[int], op: str) -> Pending:
        """Non-blocking :meth:`reduce_scatter`.

        Parameters
        ----------
        send : array or None
            As for :meth:`reduce_scatter`.
        recv : array
            As for :meth:`reduce_scatter`.
        counts : sequence of int
            As for :meth:`reduce_scatter`.
        op : str
            As for :meth:`reduce_scatter`.

        Returns
        -------
        Pending
            The operation in flight (``DONE`` when it completed already).
        """
        self.reduce_scatter(send, recv, counts, op)
        return DONE

    def iallreduce(self, send: Optional[Any], recv: Any, op: str) -> Pending:
        """Non-blocking :meth:`allreduce`.

        Parameters
        ----------
        send : array or None
            As for :meth:`allreduce`.
        recv : array
            As for :meth:`allreduce`.
        op : str
            As for :meth:`allreduce`.

        Returns
        -------
        Pending
            The operation in flight (``DONE`` when it completed already).
        """
        self.allreduce(send, recv, op)
        return DONE

    def ialltoallv(
        self, send: Any, recv: Any, send_counts: Sequence[int], recv_counts: Sequence[int], even: bool = False
    ) -> Pending:
        """Non-blocking :meth:`alltoallv`.

        Parameters
        ----------
        send : array
            As for :meth:`alltoallv`.
        recv : array
            As for :meth:`alltoallv`.
        send_counts, recv_counts : sequence of int
            As for :meth:`alltoallv`.
        even : bool
            As for :meth:`alltoallv`.

        Returns
        -------
        Pending
            The operation in flight (``DONE`` when it completed already).
        """
        self.alltoallv(send, recv, send_counts, recv_counts, even)
        return DONE

    def ibcast(self, buf: Any, root: int) -> Pending:
        """Non-blocking :meth:`bcast`.

        Parameters
        ----------
        buf : array
            As for :meth:`bcast`.
        root : int
            As for :meth:`bcast`.

        Returns
        -------
        Pending
            The operation in flight (``DONE`` when it completed already).
        """
        self.bcast(buf, root)
        return DONE

    def ireduce(self, send: Optional[Any], recv: Any, op: str, root: int) -> Pending:
        """Non-blocking :meth:`reduce`.

        Parameters
        ----------
        send : array or None
            As for :meth:`reduce`.
        recv : array
            As for :meth:`reduce`.
        op : str
            As for :meth:`reduce`.
        root : int
            As for :meth:`reduce`.

        Returns
        -------
        Pending
            The operation in flight (``DONE`` when it completed already).
        """
        self.reduce(send, recv, op, root)
        return DONE

    def igatherv(self, send: Any, recv: Optional[Any], counts: Sequence[int], root: int) -> Pending:
        """Non-blocking :meth:`gatherv`.

        Parameters
        ----------
        send : array
            As for :meth:`gatherv`.
        recv : array or None
            As for :meth:`gatherv`.
        counts : sequence of int
            As for :meth:`gatherv`.
        root : int
            As for :meth:`gatherv`.

        Returns
        -------
        Pending
            The operation in flight (``DONE`` when it completed already).
        """
        self.gatherv(send, recv, counts, root)
        return DONE

    def iscatterv(self, send: Optional[Any], recv: Any, counts: Sequence[int], root: int) -> Pending:
        """Non-blocking :meth:`scatterv`.

        Parameters
        ----------
        send : array or None
            As for :meth:`scatterv`.
        recv : array
            As for :meth:`scatterv`.
        counts : sequence of int
            As for :meth:`scatterv`.
        root : int
            As for :meth:`scatterv`.

        Returns
        -------
        Pending
            The operation in flight (``DONE`` when it completed already).
        """
        self.scatterv(send, recv, counts, root)
        return DONE

    def bind_finish(self, finish: Callable[[], Any]) -> Callable[[], Any]:
        """The finishing step of a non-blocking call (unpacking, ``avg``'s division), fit to run at ``wait()``.

        Called when the call is launched. The default returns ``finish``
        itself (host memory: any thread, any time). GPU transports bind it to
        the launching stream: ``wait()`` under another stream then still runs
        it where its buffers live, and orders the waiting stream after it.

        Parameters
        ----------
        finish : callable
            The finishing step, taking no arguments.

        Returns
        -------
        callable
            What ``wait()`` runs instead of ``finish``.
        """
        return finish

    #: Whether :meth:`prepare` can fix a call as an MPI-4 persistent request (``method="persistent"``);
    #: the default runs the primitive itself on every call. A class default an instance may replace
    #: once it knows its library (host MPI: MPI >= 4).
    persistent: bool = False

    def prepare(self, primitive: str, args: tuple, method: str = "blocking") -> "Prepared":
        """One call of ``primitive(*args)``, fixed for a plan (:func:`hpccoll.plan`) to run again and again.

        The buffers in ``args`` stay the same on every run; their contents are
        the run's input and output. Collective: every rank prepares the same
        primitives in the same order, with the same ``method``.

        Parameters
        ----------
        primitive : str
            A primitive of this contract (``"allreduce"``, ``"allgatherv"``,
            ``"sendrecv"``, ...), not its ``i`` form.
        args : tuple
            Its arguments, as the primitive takes them.
        method : str, optional
            ``"blocking"`` (default): the blocking call, its arguments built
            once where the transport can; ``"persistent"``: an MPI-4 persistent
            request (only where :attr:`persistent` is true; else the same as
            ``"blocking"``).

        Returns
        -------
        Prepared
            ``run()`` (blocking), ``start()`` (a :class:`~hpccoll.Request`'s
            :class:`Pending`) and ``free()``. The default calls the primitive
            (and its ``i`` form) on ``args`` each time.
        """
        return Prepared(self, primitive, args)

    def allgather_into(self, send: Any, out: Any, lead: int, trail: int, sizes: Sequence[int]) -> bool:
        """Optionally gather straight into a C-contiguous ``out`` seen as ``(lead, sum(sizes), trail)``.

        Parameters
        ----------
        send : array
            This rank's ``(lead, sizes[rank], trail)`` block, C-ordered, flat.
        out : array
            The result, flat: ``lead * sum(sizes) * trail`` elements.
        lead, trail : int
            The extents before and after the gathered axis.
        sizes : sequence of int
            Every rank's extent along the gathered axis.

        Returns
        -------
        bool
            Whether it gathered; ``False`` (the default) lets the caller
            gather into a flat buffer and copy the blocks into place itself.
        """
        return False

    # Node-shared results (only where :attr:`shared_results`): arrays every rank of a node maps, handed out
    # read-only (results) or writeable (``shared_empty``); collective over the node unless said otherwise.

    def shared_empty(self, shape: Optional[Any], dtype: Any, layout: Optional[Sequence[Any]] = None) -> Any:
        """Make this rank's writeable array of ``shape`` in one new node-shared region (collective over the node).

        Parameters
        ----------
        shape : tuple of int or None
            This rank's shape; ``None`` from a rank whose arguments were
            invalid (only when ``layout`` is ``None``).
        dtype : numpy.dtype
            The array's dtype.
        layout : sequence of (int, int), optional
            Every node rank's ``(nbytes, itemsize)``, in local rank order, when
            the caller agreed it already; otherwise the ranks exchange it.

        Returns
        -------
        numpy.ndarray or list of int
            The array; or, when ``layout`` was ``None`` and some ranks passed
            ``shape=None``, those node ranks (nothing is allocated).
        """
        raise NotImplementedError(f"{self.name}: node-shared results (shared_results) are not provided")

    def gathers_shared(self, shape: Sequence[int], ax: int) -> bool:
        """Whether :meth:`gather_shared` can gather a result of ``shape`` along ``ax`` itself (the same on every rank).

        Where it cannot, the caller gathers privately and hands the result to :meth:`publish_shared`.

        Parameters
        ----------
        shape : sequence of int
            The gathered result's shape.
        ax : int
            The gathered axis.

        Returns
        -------
        bool
            Whether to call :meth:`gather_shared`.
        """
        raise NotImplementedError(f"{self.name}: node-shared results (shared_results) are not provided")

    def gather_shared(self, x: Any, shape: Any, ax: int, sizes: Sequence[int], exclusive: bool) -> Any:
        """All-gather ``x`` along ``ax`` into one read-only node-shared array of ``shape``.

        Parameters
        ----------
        x : numpy.ndarray
            This rank's shard (``sizes[rank]`` along ``ax``).
        shape : tuple of int
            The result's shape.
        ax : int
            The gathered axis.
        sizes : sequence of int
            Every rank's extent along ``ax``.
        exclusive : bool
            No other view of ``x`` is alive on this rank (a shard of
            :meth:`shared_empty` may then become the result's memory).

        Returns
        -------
        numpy.ndarray
            The read-only result, the same memory on every rank of a node.
        """
        raise NotImplementedError(f"{self.name}: node-shared results (shared_results) are not provided")

    def publish_shared(self, result: Any) -> Any:
        """A read-only node-shared copy of ``result`` (the same on every rank).

        Parameters
        ----------
        result : numpy.ndarray
            The private result, equal on every rank.

        Returns
        -------
        numpy.ndarray
            The read-only node-shared copy.
        """
        raise NotImplementedError(f"{self.name}: node-shared results (shared_results) are not provided")

    def reduce_shared(self, send: Any, op: str, divide: int, shape: Any, dtype: Any) -> Any:
        """All-reduce the flat wire buffer ``send`` into one read-only node-shared array of ``shape`` and ``dtype``.

        Parameters
        ----------
        send : numpy.ndarray
            This rank's input, flat, in the wire dtype (``dtype``'s bytes).
        op : str
            The wire op.
        divide : int
            Divide the result by this when > 1 (``avg``).
        shape : tuple of int
            The result's shape.
        dtype : numpy.dtype
            The result's dtype.

        Returns
        -------
        numpy.ndarray
            The read-only result, the same memory on every rank of a node.
        """
        raise NotImplementedError(f"{self.name}: node-shared results (shared_results) are not provided")

    def close(self) -> None:  # noqa: B027 (a default that does nothing, not an abstract method)
        """Release resources (pinned buffers, NCCL communicators)."""


def _waiting(form: str) -> Callable[..., None]:
    def blocking(self: Transport, *args: Any) -> None:
        getattr(self, form)(*args).wait()

    blocking.__name__ = blocking.__qualname__ = form[1:]
    blocking.__doc__ = f"``{form}(...).wait()``: the transport implements the non-blocking form only."
    return blocking


class Prepared:
    """A transport call fixed once (:meth:`Transport.prepare`): the default runs the primitive each time.

    Parameters
    ----------
    transport : Transport
        The transport that runs it.
    primitive : str
        The contract's primitive.
    args : tuple
        Its arguments (the buffers stay alive as long as this object).
    """

    __slots__ = ("run", "steps", "_start", "args", "method")

    def __init__(self, transport: Transport, primitive: str, args: tuple, method: str = "blocking") -> None:
        blocking, started = getattr(transport, primitive), getattr(transport, "i" + primitive)
        #: Run the call once, blocking.
        self.run: Callable[[], Any] = functools.partial(blocking, *args)
        #: ``run`` as one or two calls in a row (a persistent request's ``Start`` and ``Wait``), for a caller
        #: that saves a frame by making them itself.
        self.steps: Tuple[Callable[[], Any], ...] = (self.run,)
        self._start: Callable[[], Pending] = functools.partial(started, *args)
        self.args = args
        #: What runs: ``"blocking"`` (the primitive each time) or ``"persistent"`` (an MPI persistent request).
        self.method = method

    def start(self) -> Pending:
        """Start the call (non-blocking); the transport's pending operation."""
        return self._start()

    def free(self) -> None:
        """Release what the call holds (a persistent request); the default holds nothing."""
