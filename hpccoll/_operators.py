"""Operator objects: a collective's configuration with ``forward``, ``adjoint`` and ``H``.

An operator remembers the extents its calls discovered, so that the other
direction splits as they did (the way the autograd adapter's backward pass
reuses its forward's): per layout, keyed by the shape that every rank's
array has alike (see :class:`Operator`, "Notes").

A pair of :data:`hpccoll._api.PAIRS` whose operator class this module does
not write out gets one derived from the pair (:func:`__getattr__`): its
result has its input's shape, its keywords are checked by the pair's
``configure``, its signature and docstring come from the forward's.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, Tuple, Type, Union

from . import _api
from ._api import PAIR, CommLike, OpLike, Pair, Sizes
from ._arrays import ArrayT, as_array, split_sizes
from ._comm import Communicator, as_communicator
from ._core.agree import refuse
from ._core.blocks import shape_without, with_extent
from ._core.extents import every_extent, every_rank
from ._core.lists import list_types, survey_list
from ._core.validate import LINEAR_OPS, axis_of, outs_of
from ._dtypes import check_dtype, normalize_op
from ._errors import ArgumentError, HpccollError
from ._plan import Plan
from ._plan import plan as make_plan

__all__ = [
    "Operator",
    "AllGather",
    "ReduceScatter",
    "AllReduce",
    "AllToAll",
    "Broadcast",
    "Reduce",
    "Gather",
    "Scatter",
    "HaloExchange",
    "Shift",
]

#: How many layouts (distinct shapes) an operator remembers; the least recently used is forgotten first.
LAYOUTS = 64

#: A call of one side of a pair with its ``sizes`` (and ``out``) given: ``call(x, sizes, out)``.
_Call = Callable[[Any, Optional[Tuple[int, ...]], Any], Any]


class Operator:
    """A linear (or, for ``max``/``min``/``prod``, forward-only) collective map.

    ``op(x)`` is ``op.forward(x)``; ``op.H`` is the adjoint as an operator,
    with ``op.H.H is op``. Both take one array, or a list of arrays (the
    coalesced form), and return the same form.

    Notes
    -----
    Operators remember what their calls learned about uneven extents, and the
    other direction reuses it, so that ``op.H`` is the adjoint of the ``op``
    that ran (``AllGather``'s shard extents, ``ReduceScatter``'s through its
    adjoint, ``AllToAll``'s ``recv_sizes``). An entry is kept per layout,
    keyed by the shape of the array that goes the other way: ``AllGather``
    remembers, for each shape of gathered result, the extents the latest
    forward that produced it gathered, and its adjoint looks the shape of
    ``y`` up. Two forwards with results of one shape but different splits
    share an entry (the latest wins): give ``sizes`` (or use one operator
    per decomposition) when one operator serves several. The 64 most
    recently used layouts are kept. Where a split
    cannot be known (no ``sizes``, no forward of that layout, and an extent
    that does not divide evenly over the ranks) the adjoint raises
    :class:`~hpccoll.ArgumentError` on every rank instead of guessing.
    """

    comm: Communicator

    def forward(self, x: ArrayT, out: Optional[ArrayT] = None) -> ArrayT:  # pragma: no cover - abstract
        """Apply the collective.

        Parameters
        ----------
        x : array_like (NumPy or CuPy), or list of arrays
            This rank's input.
        out : array or list of arrays, optional
            Where to write the result.

        Returns
        -------
        array or list of arrays
            This rank's result, a new array (or ``out``).
        """
        raise NotImplementedError

    def adjoint(self, y: ArrayT, out: Optional[ArrayT] = None) -> ArrayT:  # pragma: no cover - abstract
        """Apply the adjoint of the collective (the adjoint under the inner product summed over ranks).

        Parameters
        ----------
        y : array_like (NumPy or CuPy), or list of arrays
            A cotangent of this rank's result of :meth:`forward`.
        out : array or list of arrays, optional
            Where to write the result.

        Returns
        -------
        array or list of arrays
            The cotangent of this rank's input, a new array (or ``out``).
        """
        raise NotImplementedError

    def __call__(self, x: ArrayT, out: Optional[ArrayT] = None) -> ArrayT:
        return self.forward(x, out=out)

    def plan(self, x: Any, out: Any = None) -> Plan:  # pragma: no cover - abstract
        """A :class:`~hpccoll.Plan` of :meth:`forward` on the buffer ``x`` (collective).

        Parameters
        ----------
        x : array or list of arrays
            The input buffer(s), read again on every call.
        out : array or list of arrays, optional
            Where every call writes (allocated once when not given).

        Returns
        -------
        Plan
            See :func:`hpccoll.plan`.
        """
        raise NotImplementedError

    def plan_adjoint(self, y: Any, out: Any = None) -> Plan:  # pragma: no cover - abstract
        """A :class:`~hpccoll.Plan` of :meth:`adjoint` on the buffer ``y`` (collective).

        Parameters
        ----------
        y : array or list of arrays
            The cotangent buffer(s), read again on every call.
        out : array or list of arrays, optional
            Where every call writes (allocated once when not given).

        Returns
        -------
        Plan
            See :func:`hpccoll.plan`.
        """
        raise NotImplementedError

    @property
    def H(self) -> "Operator":
        """The adjoint operator (its ``forward`` is this ``adjoint``)."""
        return _Adjoint(self)


class _Adjoint(Operator):
    def __init__(self, base: Operator) -> None:
        self.base = base
        self.comm = base.comm

    def forward(self, x: ArrayT, out: Optional[ArrayT] = None) -> ArrayT:
        return self.base.adjoint(x, out=out)

    def adjoint(self, y: ArrayT, out: Optional[ArrayT] = None) -> ArrayT:
        return self.base.forward(y, out=out)

    def plan(self, x: Any, out: Any = None) -> Plan:
        return self.base.plan_adjoint(x, out=out)

    def plan_adjoint(self, y: Any, out: Any = None) -> Plan:
        return self.base.plan(y, out=out)

    @property
    def H(self) -> Operator:
        return self.base

    def __repr__(self) -> str:
        return f"{self.base!r}.H"


class _Layouts:
    """The extents an operator's calls learned, per layout key; the :data:`LAYOUTS` most recently used."""

    def __init__(self) -> None:
        self._seen: "OrderedDict[Hashable, Any]" = OrderedDict()

    def put(self, key: Hashable, value: Any) -> None:
        self._seen[key] = value
        self._seen.move_to_end(key)
        while len(self._seen) > LAYOUTS:
            self._seen.popitem(last=False)

    def get(self, key: Hashable) -> Any:
        value = self._seen.get(key)
        if value is not None:
            self._seen.move_to_end(key)
        return value

    def __len__(self) -> int:
        return len(self._seen)


def _arrays_of(x: Any) -> Optional[Tuple[List[Any], bool]]:
    """``x``'s arrays and whether ``x`` is a list, or ``None`` where the collective itself is to refuse ``x``."""
    try:
        types = list_types(x)
        if types is not None:
            arrays = list(survey_list(x, types).arrays)
            return (arrays, True) if arrays else None
        a, _ = as_array(x)
        check_dtype(a.dtype, "x")
        return [a], False
    except HpccollError:
        return None


def _found(x: Any, axis: int) -> Optional[Tuple[List[Any], List[int], bool]]:
    """``x``'s arrays, each one's ``axis`` normalised, and whether ``x`` is a list; ``None`` where the collective
    itself is to refuse ``x`` or ``axis``."""
    found = _arrays_of(x)
    if found is None:
        return None
    arrays, many = found
    try:
        return arrays, [axis_of(axis, a.ndim) for a in arrays], many
    except HpccollError:
        return None


def _key(shapes: Sequence[Sequence[int]], many: bool) -> Hashable:
    """A layout's key: its arrays' shapes, and whether they came as a list."""
    return many, tuple(tuple(s) for s in shapes)


def _grouped(call: _Call, x: Any, table: Sequence[Tuple[int, ...]], out: Any, many: bool) -> Any:
    """``call`` on ``x`` with array i's extents ``table[i]``: one call per distinct row (the same on every rank)."""
    if not many or table.count(table[0]) == len(table):
        return call(x, tuple(table[0]), out)
    outs = outs_of(out, len(table))
    groups: Dict[Tuple[int, ...], List[int]] = {}
    for i, row in enumerate(table):
        groups.setdefault(tuple(row), []).append(i)
    results: List[Any] = [None] * len(table)
    for row, idx in groups.items():
        part = call([x[i] for i in idx], row, None if out is None else [outs[i] for i in idx])
        for i, r in zip(idx, part):
            results[i] = r
    return results


class _PairOperator(Operator):
    """An operator over one :class:`~hpccoll._api.Pair`: its keywords bound to both sides."""

    pair: Pair
    keywords: Dict[str, Any]
    sizes: Optional[Tuple[int, ...]] = None
    axis: int = 0

    def __init__(self, comm: CommLike) -> None:
        self.layouts = _Layouts()
        self.comm = as_communicator(comm)

    def _configure(self, **keywords: Any) -> None:
        """``keywords`` checked and normalised by the pair's ``configure`` (the one owner of those checks; ``op``
        mapped to its name first), kept as :attr:`keywords` and as attributes (``op.root``, ``op.offset``...)."""
        if "op" in keywords:
            keywords["op"] = normalize_op(keywords["op"])
        self.keywords = self.pair.configure(self.comm, **keywords)
        for name, value in self.keywords.items():
            setattr(self, name, value)

    def forward(self, x: ArrayT, out: Optional[ArrayT] = None) -> ArrayT:
        """Apply the collective with this operator's settings.

        Parameters
        ----------
        x : array_like (NumPy or CuPy), or list of arrays
            This rank's input, as for the collective's function.
        out : array or list of arrays, optional
            Where to write the result.

        Returns
        -------
        array or list of arrays
            This rank's result, a new array (or ``out``).
        """
        return self._forward(x, out)

    def adjoint(self, y: ArrayT, out: Optional[ArrayT] = None) -> ArrayT:
        """Apply the adjoint with this operator's settings (and the extents its forward learned).

        Parameters
        ----------
        y : array_like (NumPy or CuPy), or list of arrays
            A cotangent of this rank's result of :meth:`forward`.
        out : array or list of arrays, optional
            Where to write the result.

        Returns
        -------
        array or list of arrays
            The cotangent of this rank's input, a new array (or ``out``).

        Raises
        ------
        ArgumentError
            On every rank, where the split of ``y`` cannot be known: no
            ``sizes`` (``recv_sizes`` for :class:`AllToAll`), no forward call
            of this layout, and an extent that does not divide evenly over
            the ranks.
        """
        return self._adjoint(y, out)

    def plan(self, x: Any, out: Any = None) -> Plan:
        """A :class:`~hpccoll.Plan` of :meth:`forward` on ``x`` (collective): ``p()`` runs it on ``x``'s contents.

        Parameters
        ----------
        x : array or list of arrays
            The input buffer(s), read again on every call.
        out : array or list of arrays, optional
            Where every call writes (allocated once when not given).

        Returns
        -------
        Plan
            See :func:`hpccoll.plan`.
        """
        return make_plan(self.pair.forward, x, self.comm, out=out, **self._planned(x, self._forward_keywords(), True))

    def plan_adjoint(self, y: Any, out: Any = None) -> Plan:
        """A :class:`~hpccoll.Plan` of :meth:`adjoint` on ``y`` (collective), with the extents a forward learned.

        Parameters
        ----------
        y : array or list of arrays
            The cotangent buffer(s), read again on every call.
        out : array or list of arrays, optional
            Where every call writes (allocated once when not given).

        Returns
        -------
        Plan
            See :func:`hpccoll.plan`.
        """
        return make_plan(self.pair.adjoint, y, self.comm, out=out, **self._planned(y, dict(self.keywords), False))

    def _planned(self, a: Any, keywords: Dict[str, Any], forward: bool) -> Dict[str, Any]:
        """The keywords a plan of one side gets (an operator that learns extents adds them)."""
        return keywords

    def _forward_keywords(self) -> Dict[str, Any]:
        """This operator's keywords that the forward takes."""
        return {k: v for k, v in self.keywords.items() if k not in self.pair.adjoint_only}

    def _forward(self, x: Any, out: Any) -> Any:
        return self.pair.forward(x, self.comm, out=out, **self._forward_keywords())

    def _adjoint(self, y: Any, out: Any) -> Any:
        return self.pair.adjoint(y, self.comm, out=out, **self.keywords)

    def _call(self, fn: Callable[..., Any]) -> _Call:
        """``fn`` (one side of the pair) with this operator's keywords but ``sizes``."""
        bound = self._forward_keywords() if fn is self.pair.forward else self.keywords
        keywords = {k: v for k, v in bound.items() if k != "sizes"}

        def call(a: Any, sizes: Optional[Tuple[int, ...]], out: Any) -> Any:
            return fn(a, self.comm, out=out, sizes=sizes, **keywords)

        return call

    def _learning(
        self,
        x: Any,
        out: Any,
        fn: Callable[..., Any],
        what: str,
        extent: Callable[[Tuple[int, ...]], Tuple[int, ...]] = tuple,
    ) -> Any:
        """A side that learns every rank's extents (AllGather's forward, ReduceScatter's adjoint, the rooted
        forwards): ``fn`` with the extents learned first (one exchange), kept per array as ``extent`` of every
        rank's extents for the other side (:meth:`_remember`)."""
        call = self._call(fn)
        if self.sizes is not None:
            return call(x, self.sizes, out)
        found = _found(x, self.axis)
        if found is None:
            return call(x, None, out)  # the collective refuses x, as it would have
        arrays, axes, many = found
        c = self.comm
        if c.check:  # check mode's detailed agreement first; then the extents, known to agree
            result = call(x, None, out)
            table = [extent(t) for t in every_extent(c, arrays, axes, what)]
        else:  # one exchange, as the collective's own; the data then moves with the extents known
            table = [extent(t) for t in every_extent(c, arrays, axes, what)]
            result = _grouped(call, x, table, out, many)
        self._remember(arrays, axes, table, many)
        return result

    def _remember(self, arrays: Sequence[Any], axes: Sequence[int], table: List[Tuple[int, ...]], many: bool) -> None:
        """Keep every rank's extents ``table`` by the shapes the gathering side's result has."""
        shapes = [with_extent(a.shape, ax, sum(t)) for a, ax, t in zip(arrays, axes, table)]
        self.layouts.put(_key(shapes, many), table)

    def _sides(self, a: Any, keywords: Dict[str, Any], gathering: bool, what: str) -> Dict[str, Any]:
        """A plan's keywords on one side of an all-gather pair without ``sizes``: the gathering side learns
        every rank's extents now (one small exchange, as its call would), the scattering side reuses them."""
        found = _found(a, self.axis)
        if self.sizes is not None or found is None or found[2]:
            return keywords  # sizes given, a refused by the collective, or a list (which exchanges the extents itself)
        arrays, axes, _ = found
        if gathering:
            table = [tuple(t) for t in every_extent(self.comm, arrays, axes, what)]
            self._remember(arrays, axes, table, False)
        else:
            table = self.layouts.get(_key([arrays[0].shape], False))
            if table is None:
                return keywords
        return {**keywords, "sizes": tuple(table[0])}

    def _scattering(self, y: Any, out: Any, fn: Callable[..., Any], what: str, guess: bool) -> Any:
        """A scattering side (AllGather's adjoint, ReduceScatter's forward): splits as the gathering side did for
        this shape; else like ``numpy.array_split`` where ``guess`` or the extents divide evenly, else refuses."""
        call = self._call(fn)
        if self.sizes is not None:
            return call(y, self.sizes, out)
        found = _found(y, self.axis)
        if found is None:
            return call(y, None, out)
        arrays, axes, many = found
        table = self.layouts.get(_key([a.shape for a in arrays], many))
        if table is not None:
            return _grouped(call, y, table, out, many)
        p = self.comm.size
        odd = None if guess else next((i for i, (a, ax) in enumerate(zip(arrays, axes)) if a.shape[ax] % p), None)
        if odd is not None:  # the shape of y is the same on every rank: so is this verdict
            name, shape, ax = f"y[{odd}]" if many else "y", arrays[odd].shape, axes[odd]
            refuse(
                self.comm,
                what,
                ArgumentError(
                    f"{what}: expected the extents of the shards along axis {ax}: sizes= given to "
                    f"{type(self).__name__}, or a forward call of this operator whose result had {name}'s shape "
                    f"{shape}; got neither, and {name}.shape[{ax}] == {shape[ax]} does not divide evenly over {p} "
                    f"ranks (numpy.array_split's {list(split_sizes(shape[ax], p))} would be a guess)"
                ),
            )
        return call(y, None, out)


class _SameShape(_PairOperator):
    """An operator over a pair whose result has its input's shape: no extents to learn, its configuration
    checked and normalised by the pair's own ``configure`` (the one owner of those checks)."""

    def __init__(self, comm: CommLike = None, **keywords: Any) -> None:
        super().__init__(comm)
        self._configure(**keywords)

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.keywords.items())
        return f"{type(self).__name__}({shown}, size={self.comm.size})"


class AllGather(_PairOperator):
    """All-gather along ``axis``; adjoint: reduce-scatter with sum.

    Parameters
    ----------
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    axis : int
        The concatenation axis.
    sizes : sequence of int, optional
        Every rank's shard extent. ``None``: the forward discovers them (one
        small exchange) and the adjoint reuses those of the latest forward
        whose result had ``y``'s shape. With no such forward it splits evenly
        where the extent divides over the ranks, and otherwise raises
        :class:`~hpccoll.ArgumentError` rather than guess.

    Examples
    --------
    >>> op = hpccoll.AllGather(axis=1)                  # doctest: +SKIP
    >>> y = op(x); gx = op.H(gy)                        # doctest: +SKIP
    """

    def __init__(self, comm: CommLike = None, *, axis: int = 0, sizes: Sizes = None) -> None:
        super().__init__(comm)
        self._configure(axis=axis, sizes=sizes)

    pair = PAIR["all_gather"]

    def _forward(self, x: Any, out: Any) -> Any:
        return self._learning(x, out, self.pair.forward, "all_gather")

    def _adjoint(self, y: Any, out: Any) -> Any:
        return self._scattering(y, out, self.pair.adjoint, "AllGather.adjoint", guess=False)

    def _planned(self, a: Any, keywords: Dict[str, Any], forward: bool) -> Dict[str, Any]:
        return self._sides(a, keywords, forward, "AllGather.plan")

    def __repr__(self) -> str:
        return f"AllGather(axis={self.axis}, sizes={self.sizes}, size={self.comm.size})"


class ReduceScatter(_PairOperator):
    """Reduce-scatter along ``axis``; adjoint: all-gather (``sum``) or all-gather / P (``avg``).

    Parameters
    ----------
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    op : str or mpi4py.MPI.Op
        The reduction; ``adjoint`` exists for ``"sum"`` and ``"avg"`` only.
    axis : int
        The axis the result is split along.
    sizes : sequence of int, optional
        Every rank's block extent. ``None``: the forward splits like
        ``numpy.array_split``, unless this operator's adjoint gathered an
        array of ``x``'s shape from blocks of other extents (then it splits
        as they were, so that ``op.H.H`` is the adjoint of ``op.H``).
    """

    def __init__(self, comm: CommLike = None, *, op: OpLike = "sum", axis: int = 0, sizes: Sizes = None) -> None:
        super().__init__(comm)
        self._configure(op=op, axis=axis, sizes=sizes)

    pair = PAIR["reduce_scatter"]
    op: str

    def _forward(self, x: Any, out: Any) -> Any:
        return self._scattering(x, out, self.pair.forward, "reduce_scatter", guess=True)

    def _adjoint(self, y: Any, out: Any) -> Any:
        if self.op not in LINEAR_OPS:  # no adjoint: the collective says so, before any exchange
            return super()._adjoint(y, out)
        return self._learning(y, out, self.pair.adjoint, "reduce_scatter_adjoint")

    def _planned(self, a: Any, keywords: Dict[str, Any], forward: bool) -> Dict[str, Any]:
        return self._sides(a, keywords, not forward, "ReduceScatter.plan")

    def __repr__(self) -> str:
        return f"ReduceScatter(op={self.op!r}, axis={self.axis}, sizes={self.sizes}, size={self.comm.size})"


class AllReduce(_SameShape):
    """All-reduce; adjoint per the ``cotangent`` convention.

    Its result has its input's shape, so it has no extents to remember.

    Parameters
    ----------
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    op : str or mpi4py.MPI.Op
        The reduction; ``adjoint`` exists for ``"sum"`` and ``"avg"`` only.
    cotangent : {"varying", "replicated"}
        How the adjoint treats its input (see :func:`all_reduce_adjoint`).
        ``"varying"`` (default) is the true adjoint under the inner product
        summed over ranks.
    """

    def __init__(self, comm: CommLike = None, *, op: OpLike = "sum", cotangent: str = "varying") -> None:
        super().__init__(comm, op=op, cotangent=cotangent)

    pair = PAIR["all_reduce"]
    op: str
    cotangent: str


#: AllToAll's layout agreement: what a rank found for ``y`` (a forward call's number counts from 1).
_UNKNOWN, _UNEVEN, _INVALID = 0, -1, -2


class AllToAll(_PairOperator):
    """All-to-all from ``split_axis`` to ``concat_axis``; adjoint: the all-to-all back (axes swapped).

    Parameters
    ----------
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    split_axis, concat_axis : int
        As for :func:`~hpccoll.all_to_all`.
    sizes : sequence of int, optional
        The split of ``x`` along ``split_axis``, one extent per destination;
        ``None``: ``numpy.array_split``'s.
    recv_sizes : sequence of int, optional
        The extents along ``concat_axis`` of the blocks received, one per
        source. ``None``: the forward learns them with one small exchange,
        and the adjoint reuses those of the latest forward whose result had
        ``y``'s shape on this rank. One small exchange checks that every rank
        found the same forward call; with no such call the adjoint splits
        evenly where ``y.shape[concat_axis]`` divides over the ranks on every
        rank, and otherwise raises :class:`~hpccoll.ArgumentError` on every
        rank rather than guess. Give them when the domain is split otherwise.

    Examples
    --------
    >>> op = hpccoll.AllToAll(comm, split_axis=1, concat_axis=0)   # doctest: +SKIP
    >>> cols = op(rows); rows_again = op.H(cols)                   # doctest: +SKIP
    """

    def __init__(
        self,
        comm: CommLike = None,
        *,
        split_axis: int = 0,
        concat_axis: int = 0,
        sizes: Sizes = None,
        recv_sizes: Sizes = None,
    ) -> None:
        super().__init__(comm)
        self._configure(split_axis=split_axis, concat_axis=concat_axis, sizes=sizes, recv_sizes=recv_sizes)
        self._calls = 0  # forward calls that learned recv_sizes: the same count on every rank

    pair = PAIR["all_to_all"]
    split_axis: int
    concat_axis: int
    recv_sizes: Optional[Tuple[int, ...]]

    def _with(self, fn: Callable[..., Any], y: Any, out: Any, sizes: Any, recv_sizes: Any) -> Any:
        axes = dict(split_axis=self.split_axis, concat_axis=self.concat_axis)
        return fn(y, self.comm, out=out, sizes=sizes, recv_sizes=recv_sizes, **axes)

    def _forward(self, x: Any, out: Any) -> Any:
        c = self.comm
        found = None if self.recv_sizes is not None else _arrays_of(x)
        if found is None or found[1]:  # recv_sizes given, x refused by the collective, or a list: as it comes
            return super()._forward(x, out)
        a, bind = found[0][0], self.pair.hooks.bind
        try:  # the axes and the split checked locally: bound as while tracing, nothing exchanged
            bind(a, c, True, self.keywords)
        except HpccollError:
            return super()._forward(x, out)  # the collective raises, as it would have
        if c.check:  # check mode's detailed agreement first; then the extents, known to agree
            result = super()._forward(x, out)
            b = bind(a, c, False, self.keywords)
        else:  # recv_sizes learned with the all-to-all's own small exchange
            b = bind(a, c, False, self.keywords)
            result = self._with(self.pair.forward, x, out, b.keywords["sizes"], b.keywords["recv_sizes"])
        self._calls += 1
        self.layouts.put(_key([b.shape], False), (self._calls, b.keywords["sizes"], b.keywords["recv_sizes"]))
        return result

    def _adjoint(self, y: Any, out: Any) -> Any:
        if self.recv_sizes is not None:
            return super()._adjoint(y, out)
        c, status, entry = self.comm, _INVALID, None
        found = _found(y, self.concat_axis)
        if found is not None:
            arrays, cas, many = found
            entry = None if many else self.layouts.get(_key([arrays[0].shape], False))
            if entry is not None:
                status = entry[0]
            else:
                status = _UNEVEN if any(a.shape[ca] % c.size for a, ca in zip(arrays, cas)) else _UNKNOWN
        # y's shape differs between ranks: they agree first on what each found (instead of hanging apart)
        statuses = [status] if c.size == 1 else [r[0] for r in every_rank(c, (status,), "AllToAll.adjoint")]
        if statuses[0] > 0 and statuses.count(statuses[0]) == len(statuses):
            assert entry is not None, "a forward call's number comes from an entry"
            _, sizes, recv = entry
            return self._with(self.pair.adjoint, y, out, sizes, recv)
        if _INVALID in statuses or statuses.count(_UNKNOWN) == len(statuses):
            return super()._adjoint(y, out)  # as before: the even split, or the collective's own refusal
        raise ArgumentError(_unknown_recv_sizes(statuses, self.concat_axis))

    def __repr__(self) -> str:
        return (
            f"AllToAll(split_axis={self.split_axis}, concat_axis={self.concat_axis}, sizes={self.sizes}, "
            f"recv_sizes={self.recv_sizes}, size={self.comm.size})"
        )


def _unknown_recv_sizes(statuses: Sequence[int], concat_axis: int) -> str:
    """Why AllToAll's adjoint cannot split ``y``, from every rank's status (the same message on every rank)."""
    if all(s <= 0 for s in statuses):
        ranks = [r for r, s in enumerate(statuses) if s == _UNEVEN]
        return (
            "AllToAll.adjoint: expected recv_sizes= given to AllToAll, or a forward call of this operator whose "
            f"result had y's shape on every rank; got neither, and y.shape[{concat_axis}] does not divide evenly "
            f"over {len(statuses)} ranks on rank(s) {ranks} (numpy.array_split's split would be a guess)"
        )
    return (
        "AllToAll.adjoint: expected y with the shape of one forward call's result on every rank (or recv_sizes= "
        "given to AllToAll); got shapes that match different forward calls, or none, on different ranks (the "
        f"forward call each rank's y matches, counting from 1, 0 for none: {[max(s, 0) for s in statuses]})"
    )


# --------------------------------------------------------------------------- the rooted collectives


class Broadcast(_SameShape):
    """Broadcast from ``root``; adjoint: the sum over ranks onto ``root`` (zeros elsewhere).

    Parameters
    ----------
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    root : int
        The rank whose input is sent.
    """

    def __init__(self, comm: CommLike = None, *, root: int = 0) -> None:
        super().__init__(comm, root=root)

    pair = PAIR["broadcast"]
    root: int


class Reduce(_SameShape):
    """Reduce onto ``root`` (zeros elsewhere); adjoint: the broadcast of root's cotangent (``/ P`` for ``avg``).

    Parameters
    ----------
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    op : str or mpi4py.MPI.Op
        The reduction; ``adjoint`` exists for ``"sum"`` and ``"avg"`` only.
    root : int
        The rank that gets the result.
    """

    def __init__(self, comm: CommLike = None, *, op: OpLike = "sum", root: int = 0) -> None:
        super().__init__(comm, op=op, root=root)

    pair = PAIR["reduce"]
    op: str
    root: int


def _rooted_key(arrays: Sequence[Any], axes: Sequence[int], many: bool) -> Hashable:
    """A rooted layout's key: its arrays' shapes without the split axis, and whether they came as a list."""
    return _key([shape_without(a.shape, ax) for a, ax in zip(arrays, axes)], many)


class _Rooted(_PairOperator):
    """Gather and Scatter: the extents of the split side, remembered by the layout every rank has alike.

    The key of a layout is the arrays' shapes without the gathered (split)
    axis, and whether they came as a list: root's and the other ranks' arrays
    differ along the axis, but agree on the rest, so every rank finds the
    same remembered extents (or none) and takes the same road.
    """

    root: int

    def __init__(self, comm: CommLike, root: int, axis: int, sizes: Sizes) -> None:
        super().__init__(comm)
        self._configure(root=root, axis=axis, sizes=sizes)

    def _remember(self, arrays: Sequence[Any], axes: Sequence[int], table: List[Tuple[int, ...]], many: bool) -> None:
        """Keep every rank's extents ``table`` by the layout every rank has alike."""
        self.layouts.put(_rooted_key(arrays, axes, many), table)

    def _remembered(self, y: Any, out: Any, fn: Callable[..., Any], what: str, unknown: str) -> Any:
        """Run ``fn`` with the extents remembered for ``y``'s layout; without them per ``unknown``."""
        call = self._call(fn)
        if self.sizes is not None:
            return call(y, self.sizes, out)
        found = _found(y, self.axis)
        if found is None:
            return call(y, None, out)
        table = self.layouts.get(_rooted_key(*found))
        if table is not None:
            return _grouped(call, y, table, out, found[2])
        if unknown == "discover":
            return call(y, None, out)
        refuse(  # the layout key is the same on every rank: so is this verdict
            self.comm,
            what,
            ArgumentError(
                f"{what}: expected the extents of the shards along axis {self.axis}: sizes= given to "
                f"{type(self).__name__}, or a forward call of this operator on arrays of this layout; got neither "
                "(the shards' extents cannot be known from root's concatenation)"
            ),
        )


class Gather(_Rooted):
    """Gather onto ``root`` along ``axis``; adjoint: the scatter of root's cotangent with the forward's extents.

    Parameters
    ----------
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    root : int
        The rank that gets the concatenation.
    axis : int
        The concatenation axis.
    sizes : sequence of int, optional
        Every rank's shard extent. ``None``: the forward discovers them (one
        small exchange) and the adjoint reuses those of the latest forward
        of the same layout (the shapes but for ``axis``); with no such
        forward the adjoint raises :class:`~hpccoll.ArgumentError` on every
        rank rather than guess.
    """

    def __init__(self, comm: CommLike = None, *, root: int = 0, axis: int = 0, sizes: Sizes = None) -> None:
        super().__init__(comm, root, axis, sizes)

    pair = PAIR["gather"]

    def _forward(self, x: Any, out: Any) -> Any:
        return self._learning(x, out, self.pair.forward, "gather", tuple)

    def _adjoint(self, y: Any, out: Any) -> Any:
        return self._remembered(y, out, self.pair.adjoint, "Gather.adjoint", "refuse")

    def __repr__(self) -> str:
        return f"Gather(root={self.root}, axis={self.axis}, sizes={self.sizes}, size={self.comm.size})"


class Scatter(_Rooted):
    """Scatter root's input along ``axis``; adjoint: the gather onto ``root`` with the forward's extents.

    Parameters
    ----------
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    root : int
        The rank whose input is split.
    axis : int
        The split axis.
    sizes : sequence of int, optional
        The blocks' extents. ``None``: ``numpy.array_split`` of root's
        extent; the adjoint reuses the forward's split of the same layout,
        or discovers the blocks' extents (one small exchange).
    """

    def __init__(self, comm: CommLike = None, *, root: int = 0, axis: int = 0, sizes: Sizes = None) -> None:
        super().__init__(comm, root, axis, sizes)

    pair = PAIR["scatter"]

    def _forward(self, x: Any, out: Any) -> Any:
        parts = self.comm.size
        return self._learning(x, out, self.pair.forward, "scatter", lambda t: split_sizes(t[self.root], parts))

    def _adjoint(self, y: Any, out: Any) -> Any:
        return self._remembered(y, out, self.pair.adjoint, "Scatter.adjoint", "discover")

    def __repr__(self) -> str:
        return f"Scatter(root={self.root}, axis={self.axis}, sizes={self.sizes}, size={self.comm.size})"


class HaloExchange(_SameShape):
    """Halo exchange on a Cartesian grid; adjoint: the ghosts' cotangents added back into their owners' cells.

    Its result has its input's shape, so it has no extents to remember.

    Parameters
    ----------
    comm : Communicator
        A Cartesian Communicator (:meth:`Communicator.cartesian`); no default (``None``, the world, has no
        process grid and raises :class:`~hpccoll.ArgumentError`).
    halo : int or sequence of int
        The ghost layers on each side of every grid axis (or per axis).
    corners : bool
        Also fill the corner ghosts (see :func:`hpccoll.halo_exchange`).
    """

    def __init__(self, comm: CommLike, *, halo: Union[int, Sequence[int]], corners: bool = False) -> None:
        super().__init__(comm, halo=halo, corners=corners)

    pair = PAIR["halo_exchange"]
    halo: Tuple[int, ...]
    corners: bool

    def __repr__(self) -> str:
        return f"HaloExchange(halo={self.halo}, corners={self.corners}, dims={self.comm.dims})"


class Shift(_SameShape):
    """Shift along the ring: rank ``r`` gets rank ``(r - offset) mod P``'s block; adjoint: the shift by ``-offset``.

    Its result has its input's shape, so it has no extents to remember.

    Parameters
    ----------
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks, in ring order; ``None`` is the world.
    offset : int
        How many ranks along the ring each block moves (see :func:`hpccoll.shift`).
    """

    def __init__(self, comm: CommLike = None, *, offset: int = 1) -> None:
        super().__init__(comm, offset=offset)

    pair = PAIR["shift"]


# --------------------------------------------------------------------------- operators derived from the pairs

#: The classes derived so far, by name (each remembers its pair: a pair replaced gets a new class).
_DERIVED: Dict[str, Type[_SameShape]] = {}


def __getattr__(name: str) -> Type[Operator]:
    """The operator class of a pair this module does not write out (``Permute``), derived once and kept."""
    for pair in _api.PAIRS:  # read when asked: a pair added after import gets its class too
        if pair.operator == name:
            cls = _DERIVED.get(name)
            if cls is None or cls.pair is not pair:
                cls = _DERIVED[name] = _derive(pair)
            return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _derive(pair: Pair) -> Type[_SameShape]:
    """The :class:`_SameShape` operator of ``pair``: named ``pair.operator``, its ``__init__`` showing the
    forward's ``comm`` and configuration keywords, its docstring made from the forward's."""
    forward = inspect.signature(pair.forward)
    shown = pair.configuration
    signature = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD), forward.parameters["comm"], *shown],
        return_annotation=None,
    )

    def __init__(self: _SameShape, *args: Any, **keywords: Any) -> None:
        given = signature.bind(self, *args, **keywords)  # a TypeError for a keyword the forward does not take
        given.apply_defaults()
        arguments = dict(given.arguments)
        del arguments["self"]
        comm = arguments.pop("comm")
        _SameShape.__init__(self, comm, **arguments)

    __init__.__signature__ = signature  # type: ignore[attr-defined]
    __init__.__qualname__ = f"{pair.operator}.__init__"
    return type(
        pair.operator,
        (_SameShape,),
        {"__init__": __init__, "pair": pair, "__doc__": _derived_doc(pair, shown), "__module__": __name__},
    )


def _derived_doc(pair: Pair, shown: Sequence[inspect.Parameter]) -> str:
    """A derived operator's docstring: the forward's summary, its adjoint, and the forward's own entries for
    ``comm`` and the configuration keywords."""
    doc = inspect.cleandoc(pair.forward.__doc__ or "")
    summary = doc.split("\n\n")[0].replace("\n", " ").strip()
    entries = pair.documented()
    lines = [
        f"{summary.rstrip('.')}; adjoint: :func:`~hpccoll.{pair.adjoint.__name__}`.",
        "",
        f"The operator of :func:`~hpccoll.{pair.name}`, derived from its pair.",
        "Its result has its input's shape, so it has no extents to remember.",
        "",
        "Parameters",
        "----------",
    ]
    for name in ["comm", *(p.name for p in shown)]:
        lines.append(entries.get(name, f"{name}\n    As for :func:`~hpccoll.{pair.name}`."))
    return "\n".join(lines) + "\n"
