"""The Communicator: a private duplicate of an mpi4py communicator plus settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _settings
from ._arrays import as_array, axis_of, check_list_items, list_types, prod, sizes_of
from ._dtypes import ReducePlan, check_dtype, movement_dtype, normalize_op, reduce_plan
from ._errors import ArgumentError, HpccollError, MismatchError
from ._layout import buckets
from ._log import configure
from ._settings import DEFAULT_BUCKET_BYTES
from ._spec import HOOKS, names
from .transports import (
    Selector,
    host_transport_name,
    make_transport,
    resolve_transport_name,
    shared_transport_name,
)
from .transports._control import allgather_object, exchange_extents
from .transports.shm import holder_of, shared_empty

__all__ = [
    "Communicator",
    "Grid",
    "Explanation",
    "Bucket",
    "as_communicator",
    "DEFAULT_BUCKET_BYTES",
    "explainable",
    "point_to_point",
]


#: The collectives :meth:`Communicator.explain` knows one by one, and the transport primitive each calls.
_EXPLAINED = {
    "all_reduce": "allreduce",
    "reduce_scatter": "reduce_scatter",
    "all_gather": "allgatherv",
}
_REDUCING = ("all_reduce", "reduce_scatter")


def point_to_point() -> List[str]:
    """The registered pairs whose forward sends one message each way per array: those that move by
    ``sendrecv`` and name a rank's peers (``"shift"``...; not the halo exchange, which has many).

    Returns
    -------
    list of str
        Their forwards' names, read from :data:`hpccoll._spec.HOOKS` when asked.
    """
    return [name for name in names("sendrecv") if HOOKS[name].peers is not None]


def explainable() -> Dict[str, str]:
    """The collectives :meth:`Communicator.explain` explains, and the transport primitive each calls.

    Returns
    -------
    dict of str to str
        The reductions and the all-gather, then every point-to-point pair
        (:func:`point_to_point`: ``"shift"``...), read when asked.
    """
    return {**_EXPLAINED, **{name: "sendrecv" for name in point_to_point()}}


class Communicator:
    """A group of MPI ranks that hpccoll's collectives run over.

    The wrapped mpi4py communicator is duplicated, so hpccoll's traffic never
    mixes with the caller's own messages on that communicator.

    Parameters
    ----------
    mpi_comm : mpi4py.MPI.Intracomm or Communicator, optional
        The ranks to use; default ``MPI.COMM_WORLD``. It is duplicated
        (``Dup``, a collective call over ``mpi_comm``).
    transport : str, optional
        ``"auto"`` (default) or a transport name from
        :data:`hpccoll.TRANSPORTS`. With ``"auto"`` the environment variable
        ``HPCCOLL_TRANSPORT`` is honoured when set.
    check : bool, optional
        Check every collective across ranks (dtype, shapes, axis, op, sizes)
        before moving data, and raise the same :class:`MismatchError` on every
        rank on disagreement. Default: the ``HPCCOLL_CHECK`` environment
        variable, else off.

    Attributes
    ----------
    mpi : mpi4py.MPI.Intracomm
        The private duplicate.
    rank, size : int
        This rank and the number of ranks.
    check : bool
        Whether the cross-rank check is on.
    bucket_bytes : int
        The largest message the list forms of the collectives pack arrays
        into (default 64 MiB, or ``HPCCOLL_BUCKET_BYTES``); settable.
    timeout : float or None
        The watchdog's limit in seconds (``HPCCOLL_TIMEOUT``), or ``None``.
    transport : str
        The requested transport name (``"auto"`` unless chosen).
    state : dict
        What the transports remember per Communicator (probe results,
        choices, scratch buffers); cleared by :meth:`free`.

    Notes
    -----
    The ``HPCCOLL_TIMEOUT`` environment variable (seconds; unset or 0: off),
    read here, turns on the watchdog: a collective still incomplete after that
    long dumps every thread's stack and aborts the job (see :mod:`hpccoll._faults`).
    ``HPCCOLL_DEBUG=1``, read when the first Communicator is made, logs the
    transport choices, size exchanges and bucket splits with the rank in each
    record (:mod:`hpccoll._log`); :meth:`explain` returns the same facts for
    one call (docs/diagnostics.md).

    Examples
    --------
    >>> import hpccoll
    >>> comm = hpccoll.Communicator()            # doctest: +SKIP
    >>> rows = comm.split(comm.rank // 2)        # doctest: +SKIP
    """

    __slots__ = (
        "mpi",
        "rank",
        "size",
        "check",
        "transport",
        "timeout",
        "bucket_bytes",
        "state",
        "_transports",
        "selector",
        "_owned",
        "_grid",
    )

    def __init__(self, mpi_comm: Any = None, *, transport: str = "auto", check: Optional[bool] = None):
        base = _intracomm(mpi_comm)
        configure()  # HPCCOLL_DEBUG's handler, once per process (a bad value raises before the collective Dup)
        # everything validated before the collective Dup
        transport = resolve_transport_name(transport)
        if check is None:
            check = _settings.get("HPCCOLL_CHECK")
        elif not isinstance(check, bool):
            raise ArgumentError(f"check: expected True, False or None; got {check!r}")
        timeout = _settings.get("HPCCOLL_TIMEOUT")
        self._setup(base.Dup(), transport, check, timeout)

    def _child(self, mpi_comm: Any) -> "Communicator":
        """Wrap a communicator hpccoll made itself from this one (no further ``Dup``), with this one's settings."""
        child = Communicator.__new__(Communicator)
        child._setup(mpi_comm, self.transport, self.check, self.timeout)
        child.bucket_bytes = self.bucket_bytes
        return child

    def _setup(self, mpi_comm: Any, transport: str, check: bool, timeout: Optional[float]) -> None:
        #: The private duplicate of the MPI communicator (a plain attribute: the control plane reads it per call).
        self.mpi: Any = mpi_comm
        self._owned = True
        self.rank: int = mpi_comm.Get_rank()
        self.size: int = mpi_comm.Get_size()
        self.transport: str = transport
        self.check: bool = check
        self.bucket_bytes: int = _settings.get("HPCCOLL_BUCKET_BYTES")
        self.timeout: Optional[float] = timeout
        self._transports: Dict[str, Any] = {}  # name -> instance
        self.selector = Selector(self)  # which transport moves each message (one object, read by explain too)
        self.state: Dict[str, Any] = {}
        self._grid: Optional[Grid] = None

    def split(self, color: int, key: int = 0) -> Optional["Communicator"]:
        """Split into sub-groups, like ``MPI_Comm_split`` (collective).

        Parameters
        ----------
        color : int
            Ranks with the same color form one group; ``MPI.UNDEFINED`` joins none.
        key : int
            Orders the ranks within a group (ties broken by the current rank).

        Returns
        -------
        Communicator or None
            This rank's group, with the same ``transport`` and ``check``
            settings; ``None`` where ``color`` is ``MPI.UNDEFINED``.
        """
        for name, value in (("color", color), ("key", key)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise ArgumentError(f"{name}: expected an int; got {type(value).__name__} {value!r}")
        sub = self.mpi.Split(color, key)
        from mpi4py import MPI

        if sub == MPI.COMM_NULL:
            return None
        return self._child(sub)

    def cartesian(self, dims: Sequence[int], periodic: Union[bool, Sequence[bool]] = False) -> "Communicator":
        """A Communicator over the same ranks with a Cartesian process grid (``MPI_Cart_create``; collective).

        Ranks keep their numbers (no reordering): rank r's grid coordinates are
        ``MPI_Cart_coords`` of r, in C order (the last axis varies fastest).

        Parameters
        ----------
        dims : sequence of int
            The grid's extent along each axis; zeros are filled by
            ``MPI_Dims_create`` (``[0, 0]``: a 2-D grid as square as the rank
            count allows). The product must be the communicator's size.
        periodic : bool or sequence of bool
            Whether each axis wraps around (one bool for every axis).

        Returns
        -------
        Communicator
            The grid, with the same ``transport`` and ``check`` settings, and
            :attr:`dims`, :attr:`coords`, :attr:`periodic`, :meth:`neighbours`.

        Raises
        ------
        ArgumentError
            Bad ``dims`` or ``periodic``, or ``dims`` whose product is not the
            communicator's size (with zeros: whose nonzero extents' product
            does not divide it). The checks are local, so a call made alike on
            every rank fails alike on every rank; in check mode the ranks also
            compare the grid and share any rank's error first.
        """
        err: Optional[HpccollError] = None
        filled: Tuple[int, ...] = ()
        periods: Tuple[bool, ...] = ()
        try:
            filled, periods = _grid_of(dims, periodic, self.size)
        except HpccollError as e:
            err = e
        if self.check and self.size > 1:
            self.agree("cartesian", {} if err else {"dims": filled, "periodic": periods}, error=err)
        elif err is not None:
            raise err
        cart = self.mpi.Create_cart(list(filled), list(periods), reorder=False)
        child = self._child(cart)
        child._grid = Grid.of(cart, filled, periods)
        return child

    @property
    def grid(self) -> "Grid":
        """The Cartesian process grid (see :meth:`cartesian`).

        Raises
        ------
        ArgumentError
            The communicator has no Cartesian topology.
        """
        if self._grid is None:
            raise ArgumentError(
                "comm: expected a Cartesian Communicator (from comm.cartesian(dims)); got one without a process grid"
            )
        return self._grid

    @property
    def dims(self) -> Tuple[int, ...]:
        """The grid's extents (a Cartesian Communicator's; :meth:`cartesian`)."""
        return self.grid.dims

    @property
    def coords(self) -> Tuple[int, ...]:
        """This rank's grid coordinates (a Cartesian Communicator's; :meth:`cartesian`)."""
        return self.grid.coords[self.rank]

    @property
    def periodic(self) -> Tuple[bool, ...]:
        """Whether each grid axis wraps around (a Cartesian Communicator's; :meth:`cartesian`)."""
        return self.grid.periodic

    def neighbours(self, axis: int) -> Tuple[Optional[int], Optional[int]]:
        """Return this rank's neighbours along grid ``axis``: ``(lower, upper)``, ``None`` beyond a non-periodic edge.

        Parameters
        ----------
        axis : int
            A grid axis, ``0 <= axis < len(dims)``.

        Returns
        -------
        tuple of (int or None, int or None)
            The ranks at coordinate ``-1`` and ``+1`` along ``axis``.
        """
        g = self.grid
        if not isinstance(axis, int) or isinstance(axis, bool) or not 0 <= axis < len(g.dims):
            raise ArgumentError(f"axis: expected an int in [0, {len(g.dims)}); got {axis!r}")
        step = [0] * len(g.dims)
        step[axis] = -1
        lower = g.neighbour(self.rank, tuple(step))
        step[axis] = 1
        return lower, g.neighbour(self.rank, tuple(step))

    def transport_instance(self, name: str) -> Any:
        """The transport ``name`` bound to this communicator (made on first use).

        Parameters
        ----------
        name : str
            A registered transport name (:data:`hpccoll.TRANSPORTS`, not ``"auto"``).

        Returns
        -------
        Transport
            The instance, the same one on every later call.
        """
        inst = self._transports.get(name)
        if inst is None:
            inst = self._transports[name] = make_transport(name, self)
        return inst

    def host_transport(self) -> Any:
        """The host transport other transports compose for what they leave to host MPI.

        The first usable registered transport that declares
        :attr:`~hpccoll.transports.Transport.hosts` (``mpi`` unless another is
        registered before it), made on first use.

        Returns
        -------
        Transport
            The instance, the same one on every later call.
        """
        name = self.state.get("choice:host")
        if name is None:
            name = self.state["choice:host"] = host_transport_name(self)
        return self.transport_instance(name)

    def shared_transport(self) -> Any:
        """The transport that makes node-shared results (``out="shared"``, :meth:`shared_empty`).

        The first usable registered transport that declares
        :attr:`~hpccoll.transports.Transport.shared_results` (``shm``), made on
        first use (collective), whatever ``auto`` picks for private arrays.

        Returns
        -------
        Transport
            The instance, the same one on every later call.
        """
        name = self.state.get("choice:shared")
        if name is None:
            name = self.state["choice:shared"] = shared_transport_name(self)
        return self.transport_instance(name)

    def transport_of(self, kind: str, nbytes: int = 0, primitive: Optional[str] = None, blocking: bool = True) -> Any:
        """The transport instance that moves a message of ``kind`` arrays (``"numpy"``, ``"cupy"``) here.

        The communicator's :class:`~hpccoll.transports.Selector` decides;
        this is its one entry. ``nbytes`` is the message size as every rank
        measures it alike (the whole array of a reduction, the gathered
        result of an all-gather). Collective the first time for a kind whose
        choice needs the other ranks (see :meth:`transport_for`), the first
        time a message reaches a size-limited transport's ``min_bytes`` (its
        probe), and at a first-use race (every rank gets there at the same
        call, since they measure ``nbytes`` alike); a dictionary lookup
        afterwards.

        Parameters
        ----------
        kind : str
            The array kind, ``"numpy"`` or ``"cupy"``.
        nbytes : int, optional
            The message size in bytes, alike on every rank (default 0).
        primitive : str, optional
            The transport primitive that moves it (``"allreduce"``): the
            transport that moves that call, where the one for its size hands
            it on (``shm``: to host MPI). ``None``: the transport for its size.
        blocking : bool, optional
            The blocking form of ``primitive`` (default), else the non-blocking one.

        Returns
        -------
        Transport
            The transport instance that moves that message.
        """
        if primitive is None:
            return self.selector.of(kind, nbytes)
        return self.selector.mover(kind, primitive, nbytes, blocking)

    def transport_for(self, array: Any) -> Any:
        """Which transport ``array`` would use on this communicator, and why.

        Collective the first time it is asked about a CuPy array (the GPU
        transports are probed on every rank); cached afterwards.

        Parameters
        ----------
        array : array_like
            A NumPy or CuPy array (other array-likes count as NumPy).

        Returns
        -------
        TransportChoice
            A named tuple ``(name, reason)``, e.g. ``("nccl", "auto: NCCL is
            usable (one GPU per rank)")``.

        Raises
        ------
        TransportUnavailable
            The requested transport cannot run here; the message names why.
        """
        return self.selector.choice(as_array(array)[1])

    def explain(
        self, x: Any, collective: str = "all_reduce", *, op: Any = "sum", axis: int = 0, sizes: Any = None
    ) -> "Explanation":
        """What ``collective`` would do with ``x`` here: the transport and why, the dtype plan, the buckets.

        The same facts ``HPCCOLL_DEBUG=1`` logs, as data, for the blocking
        form of the call ``hpccoll.<collective>(x, self, op=op, axis=axis,
        sizes=sizes)``. Nothing is moved and nothing is validated beyond what
        the answer needs (the collective itself raises the errors).

        **Call it collectively** (on every rank, with the same arguments, as the
        collective itself): it communicates exactly where the collective's
        first call would -- the first choice of a transport for CuPy arrays
        (the NCCL probe), the first message to reach a size-limited
        transport's threshold (the ``shm`` probe and set-up), and, for
        ``all_gather`` with ``sizes=None``, the size exchange every such call
        makes. :attr:`Explanation.communicated` says whether this call did.
        Everything it learns is cached as the collective would cache it, so
        the collective then makes the same choice without probing again.

        Parameters
        ----------
        x : array_like or list of array_like
            A NumPy or CuPy array, or a list of them (the coalesced form).
        collective : str
            ``"all_reduce"`` (default), ``"reduce_scatter"``, ``"all_gather"``, or
            a point-to-point pair (``"shift"``..., :func:`point_to_point`),
            explained by its messages, one per array, whatever its keywords
            (``offset``...).
        op : str or mpi4py.MPI.Op
            The reduction (``all_reduce``, ``reduce_scatter``); ignored by ``all_gather``.
        axis : int
            The gather axis (``all_gather``); a reduce-scatter's axis does not
            change the transport, the plan or the buckets.
        sizes : sequence of int, optional
            ``all_gather``: every rank's extent along ``axis`` (``None``: exchanged,
            as the collective does). Ignored otherwise.

        Returns
        -------
        Explanation
            A frozen dataclass (``dataclasses.asdict`` turns it into a dict).

        Raises
        ------
        ArgumentError
            An unknown ``collective`` or ``op``, or an ``axis`` out of range.
        DTypeError
            A dtype hpccoll does not move, or a (dtype, op) pair it does not reduce.
        TransportUnavailable
            The requested transport cannot run here.

        Examples
        --------
        >>> e = comm.explain(np.ones(1 << 20, np.float16))  # doctest: +SKIP
        >>> e.transport, e.moved_by, e.plans["float16"].wire  # doctest: +SKIP
        ('shm', ('shm',), dtype('float32'))
        """
        explained = explainable()
        if collective not in explained:
            raise ArgumentError(f"collective: expected one of {', '.join(map(repr, explained))}; got {collective!r}")
        primitive = explained[collective]
        messages = primitive == "sendrecv"  # a point-to-point pair: its messages, one per array
        many, kind, xs, op = _explained_inputs(x, collective, op)
        reducing = collective in _REDUCING
        known = set(self.state)
        notes: List[str] = []
        each, exchanged = self._explained_sizes(xs, collective, axis, sizes, many)
        nbytes = sum(each)
        if self.check and self.size > 1:
            notes.append("check mode: one pickled Allgather compares the call across ranks first")
        if self.size == 1:
            notes.append("one rank: the collective copies its input; no transport moves anything")
            return Explanation(
                collective,
                kind,
                None,
                (),
                "one rank: a local copy",
                nbytes,
                size_exchange=exchanged,
                communicated=exchanged,
                check=self.check,
                notes=tuple(notes),
            )
        choice = self.selector.choice(kind)
        t = self.transport_of(kind) if messages else self.transport_of(kind, nbytes)
        plans, moves_as, wire = _explained_dtypes(xs, op, t, each, reducing, many or messages, notes)
        split, movers = self._explained_buckets(xs, wire, t, kind, nbytes, primitive, reducing, many)
        if t.name != choice.name or movers != (t.name,):
            notes.append(
                f"a message of {nbytes} bytes: {t.name} chosen"
                + (f", which leaves it to {', '.join(m for m in movers if m != t.name)}" if movers != (t.name,) else "")
            )
        communicated = exchanged or any(not k.startswith("choice:") for k in set(self.state) - known)
        return Explanation(
            collective,
            kind,
            t.name,
            movers,
            choice.reason,
            nbytes,
            plans,
            moves_as,
            split,
            exchanged,
            communicated,
            self.check,
            tuple(notes),
        )

    def _explained_sizes(
        self, xs: List[Any], collective: str, axis: int, sizes: Any, many: bool
    ) -> Tuple[List[int], bool]:
        """:meth:`explain`'s message bytes per array (a gather's whole result), and whether the extents were
        exchanged to know them (``sizes=None``, as the collective exchanges them)."""
        if collective != "all_gather":
            return [a.nbytes for a in xs], False
        axes = [axis_of(axis, a.ndim, joins=True, array=f"x[{i}]" if many else "x") for i, a in enumerate(xs)]
        exchanged = False
        if sizes is not None:
            table = [sizes_of(sizes, self.size)] * len(xs)
        elif self.size > 1:
            table, exchanged = exchange_extents(self, xs, axes, f"explain({collective})"), True
        else:
            table = [(a.shape[ax],) for a, ax in zip(xs, axes)]
        each = [prod(a.shape[:ax] + a.shape[ax + 1 :]) * a.dtype.itemsize * sum(t) for a, ax, t in zip(xs, axes, table)]
        return each, exchanged

    def _explained_buckets(
        self,
        xs: List[Any],
        wire: List[int],
        t: Any,
        kind: str,
        nbytes: int,
        primitive: str,
        reducing: bool,
        many: bool,
    ) -> Tuple[Optional[List["Bucket"]], Tuple[str, ...]]:
        """:meth:`explain`'s buckets of a list form (``None`` for one array) and the transports that move them:
        the selector's answers for the blocking calls, asked with the sizes the collective asks with (one
        array: ``nbytes``, its bytes before any widening; a list: each bucket's wire bytes)."""
        if primitive == "sendrecv":  # a shift, a permute: one message per array that has elements, in one call
            mover = _in_place_mover(t, xs)
            if not many:
                return None, (mover,)
            return [Bucket((i,), n, mover) for i, n in enumerate(wire) if n], (mover,)
        if not many:
            return None, (self.transport_of(kind, nbytes, primitive).name,)
        split: List[Bucket] = []
        groups: Dict[Any, List[int]] = {}
        for i, a in enumerate(xs):  # reductions: one group per dtype; all-gathers: raw bytes, one group
            groups.setdefault(a.dtype if reducing else None, []).append(i)
        for members in groups.values():
            for bucket in buckets([wire[i] for i in members], self.bucket_bytes):
                idx = tuple(members[j] for j in bucket)
                size = sum(wire[i] for i in idx)
                split.append(Bucket(idx, size, self.transport_of(kind, size, primitive).name))
        return split, tuple(dict.fromkeys(b.moved_by for b in split))

    def shared_empty(self, shape: Any, dtype: Any = float) -> Any:
        """A new writeable NumPy array for this rank in node-shared memory (collective).

        Compute your shard (or your full input) into it: collectives read it
        in place, without the copy in, and ``all_gather(x, out="shared")`` of
        it returns the shards' own memory (docs/shm.md). ``shape`` may differ
        from rank to rank; the memory is reused once no rank holds a view of
        it, and freed by :meth:`free`.

        Parameters
        ----------
        shape : int or tuple of int
            This rank's shape.
        dtype : data-type, optional
            The element type (default ``float``, i.e. float64).

        Returns
        -------
        numpy.ndarray
            A C-contiguous array of ``shape`` and ``dtype`` in node-shared memory,
            uninitialised.

        Raises
        ------
        ArgumentError
            Bad ``shape`` or ``dtype`` on any rank (on every rank alike).
        TransportUnavailable
            MPI cannot make node-shared windows here.
        """
        return shared_empty(self, shape, dtype)

    def agree(self, what: str, descriptor: Any, local: Any = None, error: Optional[HpccollError] = None) -> list:
        """Compare ``descriptor`` across ranks and share any local ``error`` (collective).

        Raises the lowest failing rank's error on every rank (same type, the
        message naming the rank), or :class:`MismatchError` on every rank when
        the descriptors differ.

        Parameters
        ----------
        what : str
            The name of the call, for the error message.
        descriptor : object
            What must be equal on every rank (picklable, comparable with ``==``).
        local : object, optional
            A rank-local value to share (picklable).
        error : HpccollError, optional
            This rank's own error, raised on every rank if any rank has one.

        Returns
        -------
        list
            Every rank's ``local`` value, in rank order.
        """
        portable = None if error is None else (type(error), str(error))
        gathered = allgather_object(self, (descriptor, local, portable, what), f"{what}'s cross-rank check")
        for rank, (_, _, err, _) in enumerate(gathered):
            if err is not None:
                cls, msg = err
                raise cls(f"{msg} (raised on rank {rank})" if self.size > 1 else msg)
        first, _, _, first_what = gathered[0]
        for rank, (desc, _, _, other_what) in enumerate(gathered):
            if desc != first:
                raise MismatchError(
                    f"ranks disagree on a collective call ({first_what} on rank 0, {other_what} on rank {rank}): "
                    + _difference(first, desc, rank)
                )
        return [loc for _, loc, _, _ in gathered]

    def free(self) -> None:
        """Release the duplicate communicator and transport resources (collective)."""
        for inst in self._transports.values():
            inst.close()
        self._transports.clear()
        self.selector.clear()
        self.state.clear()
        if self._owned and not _finalized():
            self.mpi.Free()
        self._owned = False

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.free()

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, size={self.size}, transport={self.transport!r}, check={self.check})"


@dataclass(frozen=True)
class Grid:
    """A Cartesian process grid: every rank's coordinates, and neighbour lookups (local, no communication).

    Attributes
    ----------
    dims : tuple of int
        The grid's extents.
    periodic : tuple of bool
        Whether each axis wraps around.
    coords : tuple of tuple of int
        Every rank's coordinates, by rank.
    """

    dims: Tuple[int, ...]
    periodic: Tuple[bool, ...]
    coords: Tuple[Tuple[int, ...], ...]
    ranks: Dict[Tuple[int, ...], int] = field(repr=False, compare=False)

    @classmethod
    def of(cls, cart: Any, dims: Tuple[int, ...], periodic: Tuple[bool, ...]) -> "Grid":
        """The grid of an MPI Cartesian communicator (``Get_coords`` of every rank: local calls)."""
        coords = tuple(tuple(int(v) for v in cart.Get_coords(r)) for r in range(cart.Get_size()))
        return cls(dims, periodic, coords, {c: r for r, c in enumerate(coords)})

    def neighbour(self, rank: int, step: Tuple[int, ...]) -> Optional[int]:
        """The rank at ``rank``'s coordinates plus ``step`` (wrapped on periodic axes), ``None`` off the grid."""
        at = []
        for c, s, n, wrap in zip(self.coords[rank], step, self.dims, self.periodic):
            v = c + s
            if not 0 <= v < n:
                if not wrap:
                    return None
                v %= n
            at.append(v)
        return self.ranks[tuple(at)]


@dataclass(frozen=True)
class Bucket:
    """One message of a list form: which arrays travel in it, its bytes on the wire, what moves it.

    Attributes
    ----------
    arrays : tuple of int
        Indices into the list.
    nbytes : int
        The message's bytes as the transport sees them (widened where the plan widens; an all-gather's
        gathered result).
    moved_by : str
        The transport that moves the bytes (``shm`` hands the sizes it does not win to ``mpi``).
    """

    arrays: Tuple[int, ...]
    nbytes: int
    moved_by: str


@dataclass(frozen=True)
class Explanation:
    """What a collective would do with an array here (:meth:`Communicator.explain`).

    Attributes
    ----------
    collective : str
        ``"all_reduce"``, ``"reduce_scatter"``, ``"all_gather"``, ``"shift"`` or another point-to-point pair
        (:func:`explainable`).
    kind : str
        ``"numpy"`` or ``"cupy"``: the arrays' kind, which selects the transports.
    transport : str or None
        The transport the collective calls (``None`` on one rank: a local copy).
    moved_by : tuple of str
        The transports that move the bytes: ``(transport,)``, unless ``shm`` hands (some) messages to ``mpi``.
    reason : str
        Why that transport, as :meth:`Communicator.transport_for` says it.
    nbytes : int
        The message size the choice is made on (a reduction's whole input, an all-gather's gathered result;
        a list's total).
    plans : dict of str to ReducePlan
        Reductions: per dtype name, the wire dtype, wire op, widening and ``avg``'s division.
    moves_as : dict of str to str
        All-gathers and point-to-point pairs: per dtype name, the dtype its bytes move as (16-bit floats as
        ``uint16``; lists, and a shift's or another point-to-point pair's messages, as raw ``uint8``).
    buckets : list of Bucket or None
        Lists: the messages, in order (reductions: per dtype, then by ``comm.bucket_bytes``).
    size_exchange : bool
        Whether the sizes had to be exchanged (``all_gather`` with ``sizes=None``): the collective does it too.
    communicated : bool
        Whether this call communicated: the size exchange, or a transport's first probe or set-up.
    check : bool
        Whether check mode adds its cross-rank agreement.
    notes : tuple of str
        The plan and routing in words (what widens and why, what hands what to whom).
    """

    collective: str
    kind: str
    transport: Optional[str]
    moved_by: Tuple[str, ...]
    reason: str
    nbytes: int
    plans: Dict[str, ReducePlan] = field(default_factory=dict)
    moves_as: Dict[str, str] = field(default_factory=dict)
    buckets: Optional[List[Bucket]] = None
    size_exchange: bool = False
    communicated: bool = False
    check: bool = False
    notes: Tuple[str, ...] = ()


def _in_place_mover(t: Any, xs: List[Any]) -> str:
    """The transport that moves a ``sendrecv`` of ``xs`` for ``t``: ``shm`` reads the messages in place only
    where they lie in node-shared memory (``shared_empty``; on every rank, which this rank cannot see) and
    hands the others to its ``host``."""
    if t.wins is not None and not all(holder_of(a) for a in xs):
        return str(t.host.name)
    return str(t.name)


def _explained_inputs(x: Any, collective: str, op: Any) -> Tuple[bool, str, List[Any], Any]:
    """:meth:`Communicator.explain`'s arrays, checked as the collective checks them before communicating:
    ``(many, kind, arrays, op)`` (``op`` normalised for a reduction)."""
    types = list_types(x)
    many = types is not None
    if types is not None:
        check_list_items(x, types)
    arrays = [as_array(a, f"x[{i}]" if many else "x") for i, a in enumerate(x if many else [x])]
    kinds = {kind for _, kind in arrays}
    if len(kinds) > 1:
        raise ArgumentError("x: expected arrays of one kind (all NumPy or all CuPy); got both")
    kind = kinds.pop() if kinds else "numpy"
    xs = [a for a, _ in arrays]
    for i, a in enumerate(xs):
        check_dtype(a.dtype, f"x[{i}]" if many else "x")
    if collective in _REDUCING:
        op = normalize_op(op)
        for a in xs:
            reduce_plan(a.dtype, op)  # the collective's own refusal, before any communication
    return many, kind, xs, op


def _explained_dtypes(
    xs: List[Any], op: Any, t: Any, each: List[int], reducing: bool, raw: bool, notes: List[str]
) -> Tuple[Dict[str, ReducePlan], Dict[str, str], List[int]]:
    """:meth:`Communicator.explain`'s dtype facts: a reduction's plan per dtype (its notes appended to
    ``notes``) or a movement's wire dtype per dtype (``raw``: bytes), and the bytes each array puts on the
    wire."""
    plans: Dict[str, ReducePlan] = {}
    moves_as: Dict[str, str] = {}
    if not reducing:
        for a in xs:
            moves_as[a.dtype.name] = "uint8" if raw else movement_dtype(a.dtype).name
        return plans, moves_as, each
    for a in xs:
        name = a.dtype.name
        if name not in plans:
            plans[name] = plan = reduce_plan(a.dtype, op, t.native_reduce, t.saturates)
            notes.extend(_plan_notes(a.dtype, op, plan, t))
    return plans, moves_as, [a.size * plans[a.dtype.name].wire.itemsize for a in xs]


def _plan_notes(dtype: np.dtype, op: str, plan: ReducePlan, t: Any) -> List[str]:
    """Why ``plan`` reduces ``dtype`` as it does, in words (nothing when it reduces as it is)."""
    said = []
    if dtype.kind == "b":
        said.append(f"bool {op}: 0/1 bytes reduced as uint8 with {plan.op} (NumPy's bool arithmetic)")
    elif plan.widen and dtype.kind in "iu":
        said.append(
            f"{dtype.name} sum: widened to {plan.wire.name} and wrapped back ({t.name}'s MPI saturates "
            f"{dtype.name} sums where NumPy wraps)"
        )
    elif plan.widen:
        said.append(f"{dtype.name} {op}: widened to {plan.wire.name} ({t.name} does not reduce {dtype.name} natively)")
    if plan.divide:
        said.append(
            f"{dtype.name} avg: a sum, then divided by the number of ranks in "
            f"{plan.wire.name if plan.widen else dtype.name}"
        )
    return said


def _grid_of(dims: Any, periodic: Any, size: int) -> Tuple[Tuple[int, ...], Tuple[bool, ...]]:
    """:meth:`Communicator.cartesian`'s ``(dims, periods)``, zeros filled by ``MPI_Dims_create``; checked."""
    from mpi4py import MPI

    if (
        type(dims) not in (list, tuple)
        or not dims
        or any(not isinstance(d, (int, np.integer)) or isinstance(d, bool) or d < 0 for d in dims)
    ):
        raise ArgumentError(f"dims: expected a non-empty sequence of ints >= 0; got {dims!r}")
    given = [int(d) for d in dims]
    known = prod(d for d in given if d)
    if 0 not in given and known != size:
        raise ArgumentError(
            f"dims: expected extents whose product is the communicator's size, {size}; got {given} (product {known})"
        )
    if size % known:
        raise ArgumentError(
            f"dims: expected extents whose product is the communicator's size, {size} (zeros are filled in); "
            f"got {given}, whose nonzero extents' product {known} does not divide {size}"
        )
    filled = tuple(int(d) for d in MPI.Compute_dims(size, given))
    if isinstance(periodic, (bool, np.bool_)):
        return filled, (bool(periodic),) * len(filled)
    if (
        type(periodic) in (list, tuple)
        and len(periodic) == len(filled)
        and all(isinstance(p, (bool, np.bool_)) for p in periodic)
    ):
        return filled, tuple(bool(p) for p in periodic)
    raise ArgumentError(f"periodic: expected a bool or {len(filled)} bools (one per axis); got {periodic!r}")


def _difference(first: dict, other: dict, rank: int) -> str:
    for key in first:
        if first[key] != other.get(key):
            return f"rank 0 has {key}={first[key]!r} but rank {rank} has {key}={other.get(key)!r}"
    return f"rank 0 and rank {rank} disagree: {first!r} vs {other!r}"


def _finalized() -> bool:
    from mpi4py import MPI

    return MPI.Is_finalized()


def _intracomm(mpi_comm: Any) -> Any:
    from mpi4py import MPI

    if mpi_comm is None:
        return MPI.COMM_WORLD
    if isinstance(mpi_comm, Communicator):
        return mpi_comm.mpi
    if not isinstance(mpi_comm, MPI.Intracomm) or mpi_comm == MPI.COMM_NULL:
        raise ArgumentError(
            "comm: expected an hpccoll.Communicator, an mpi4py Intracomm or None; "
            f"got {type(mpi_comm).__name__}"
            + (" (COMM_NULL)" if isinstance(mpi_comm, MPI.Comm) and mpi_comm == MPI.COMM_NULL else "")
        )
    return mpi_comm


def _release(mpi_comm: Any, keyval: int, cached: "Communicator") -> None:
    """Free the cached duplicate when its communicator is freed (MPI attribute delete callback).

    Without it every ``Comm.Free`` of a communicator hpccoll was given leaked
    one duplicate, and MPICH runs out of communicators after about 2000.
    The predefined communicators are left alone: they are only "freed" by
    ``MPI_Finalize``, when hpccoll no longer calls MPI.
    """
    from mpi4py import MPI

    if mpi_comm != MPI.COMM_WORLD and mpi_comm != MPI.COMM_SELF:
        cached.free()


_KEYVAL: Optional[int] = None
_WORLD: Optional[Communicator] = None


def as_communicator(comm: Any) -> Communicator:
    """Return the :class:`Communicator` for ``comm``.

    ``None`` means the world; an mpi4py communicator gets one duplicate,
    cached on it as an MPI attribute, so repeated calls do not ``Dup`` again.
    """
    global _WORLD, _KEYVAL
    if type(comm) is Communicator:
        return comm
    if comm is None:
        if _WORLD is None:
            _WORLD = as_communicator(_intracomm(None))
        return _WORLD
    if isinstance(comm, Communicator):
        return comm
    mpi_comm = _intracomm(comm)
    from mpi4py import MPI

    if _KEYVAL is None:
        _KEYVAL = MPI.Comm.Create_keyval(delete_fn=_release)
    cached = mpi_comm.Get_attr(_KEYVAL)
    if cached is None:
        cached = Communicator(mpi_comm)
        mpi_comm.Set_attr(_KEYVAL, cached)
    return cached
