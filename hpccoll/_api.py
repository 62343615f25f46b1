"""Forward and adjoint collectives: validate, pick a transport, call its primitives.

Everything about axes, uneven shards, dtypes, ``avg`` and adjoints lives here,
once, above the transports (see :mod:`hpccoll.transports._base`).
"""

from __future__ import annotations

import operator
from typing import Any, List, NoReturn, Optional, Sequence, Tuple

import numpy as np

from . import _fast
from ._arrays import as_array, flat, module_of, overlaps, prod, split_sizes
from ._comm import Communicator, as_communicator
from ._dtypes import ReducePlan, check_dtype, movement_dtype, normalize_op, reduce_plan
from ._exchange import exchange_extents
from ._errors import ArgumentError, HpccollError, MismatchError, UnsupportedOpError
from ._relayout import copy_blocks
from ._request import Request
from .transports import select_transport

__all__ = [
    "all_gather",
    "all_gather_adjoint",
    "reduce_scatter",
    "reduce_scatter_adjoint",
    "all_reduce",
    "all_reduce_adjoint",
    "split_sizes",
]

Sizes = Optional[Sequence[int]]
_SEQUENCES = (list, tuple)
COTANGENTS = ("varying", "replicated")


# --------------------------------------------------------------------------- validation


def _axis(axis: Any, ndim: int) -> int:
    if type(axis) is int and -ndim <= axis < ndim:  # the common case, fast
        return axis % ndim
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise ArgumentError(f"axis: expected an int; got {type(axis).__name__} {axis!r}")
    if ndim == 0:
        raise ArgumentError("x: expected an array with at least 1 dimension to split along axis; got a 0-D array")
    if not -ndim <= axis < ndim:
        raise ArgumentError(f"axis: expected an int in [{-ndim}, {ndim - 1}] for a {ndim}-D array; got {axis}")
    return int(axis) % ndim


def _sizes(sizes: Any, parts: int) -> Tuple[int, ...]:
    try:
        vals = tuple(map(operator.index, sizes))
    except TypeError:
        raise ArgumentError(f"sizes: expected a sequence of {parts} non-negative ints; got {sizes!r}") from None
    if len(vals) != parts or (vals and min(vals) < 0):
        raise ArgumentError(f"sizes: expected {parts} non-negative ints (one per rank); got {list(vals)}")
    return vals


def _out(
    out: Any, shape: Tuple[int, ...], dtype: np.dtype, x: Any, xp: Any, in_place: Optional[Any] = None
) -> Any:
    """Validate a user's ``out``; ``None`` allocates a fresh array.

    ``out`` may overlap ``x`` only where ``in_place(out)`` says the overlap is
    the collective's in-place form.
    """
    if out is None:
        return xp.empty(shape, dtype)
    if not isinstance(out, xp.ndarray):
        raise ArgumentError(f"out: expected a {xp.__name__}.ndarray like x; got {type(out).__name__}")
    if out.shape != shape:
        raise ArgumentError(f"out: expected shape {shape}; got {out.shape}")
    if out.dtype != dtype:
        raise ArgumentError(f"out: expected dtype {dtype}; got {out.dtype}")
    if xp is np and not out.flags.writeable:
        raise ArgumentError("out: expected a writeable array; got a read-only one")
    if xp is not np and out.device.id != x.device.id:
        raise ArgumentError(f"out: expected an array on x's GPU {x.device.id}; got one on GPU {out.device.id}")
    # ``out is x`` counts as overlap too (even for zero-size arrays): MPI forbids aliased buffers.
    if (out is x or overlaps(out, x, xp)) and not (in_place is not None and in_place(out)):
        raise ArgumentError(
            "out: expected memory separate from the input (or exactly the in-place layout); "
            "got an array that overlaps it"
        )
    return out


def _own_block(ax: int, sizes: Sequence[int], rank: int) -> tuple:
    start = sum(sizes[:rank])
    return _block(ax, start, start + sizes[rank])


def _gathers_in_place(x: Any, ax: int, sizes: Sequence[int], rank: int) -> Any:
    """All-gather in place: ``x`` is exactly this rank's block of ``out``."""
    return lambda out: _same_view(x, out[_own_block(ax, sizes, rank)])


def _scatters_in_place(x: Any, ax: int, sizes: Sequence[int], rank: int) -> Any:
    """Reduce-scatter in place: ``out`` is exactly this rank's block of ``x``."""
    return lambda out: _same_view(out, x[_own_block(ax, sizes, rank)])


def _same_view(a: Any, b: Any) -> bool:
    return a.shape == b.shape and a.strides == b.strides and _ptr(a) == _ptr(b)


def _ptr(a: Any) -> int:
    return a.__array_interface__["data"][0] if isinstance(a, np.ndarray) else a.data.ptr


def _settle(c: Communicator, what: str, desc: Any, local: Any, err: Optional[HpccollError]) -> Optional[list]:
    """Raise a local error, or (check mode) agree with the other ranks first."""
    if c.check and c.size > 1:
        return c.agree(what, desc, local, err)
    if err is not None:
        raise err
    return None


def _refuse(c: Communicator, what: str, err: HpccollError) -> NoReturn:
    """Raise ``err``, found before the collective's own check: in check mode on every rank.

    The other ranks are then in that check (their first collective call), so
    they learn of ``err`` there instead of waiting for this rank forever.
    """
    _settle(c, what, None, None, err)
    raise err  # _settle raised already; this line only reassures type checkers


def _shape_without(shape: Tuple[int, ...], ax: int) -> Tuple[int, ...]:
    return shape[:ax] + shape[ax + 1 :]


def _with_extent(shape: Tuple[int, ...], ax: int, n: int) -> Tuple[int, ...]:
    return shape[:ax] + (n,) + shape[ax + 1 :]


def _block(ax: int, start: int, stop: int) -> tuple:
    return (slice(None),) * ax + (slice(start, stop),)


# --------------------------------------------------------------------------- layout


def _pack(x: Any, xp: Any, ax: int, sizes: Tuple[int, ...], wire: np.dtype, widen: bool) -> Any:
    """``x``'s blocks along ``ax`` laid out rank after rank, as one flat buffer of ``wire``.

    Converts to ``wire`` when ``widen``, else reinterprets the bytes; a view of
    ``x`` is returned when no copy is needed.
    """
    if prod(x.shape[:ax]) == 1 and x.flags.c_contiguous:
        buf = flat(x, xp)
        return buf.astype(wire) if widen else _as(buf, wire)
    buf = xp.empty(x.size, wire if widen else x.dtype)
    _blocks(buf, x, xp, ax, sizes, to_flat=True)
    return _as(buf, wire)


def _blocks(buf: Any, arr: Any, xp: Any, ax: int, sizes: Tuple[int, ...], to_flat: bool) -> None:
    """Copy between ``arr`` (blocks along ``ax``) and flat ``buf``: :func:`hpccoll._relayout.copy_blocks`."""
    copy_blocks(buf, arr, xp, ax, sizes, to_flat)


def _as(buf: Any, dtype: np.dtype) -> Any:
    """``buf`` reinterpreted as ``dtype`` (same itemsize); no new object when it already is."""
    return buf if buf.dtype == dtype else buf.view(dtype)


def _store(out: Any, result: Any, xp: Any) -> None:
    """Write a C-ordered flat ``result`` into ``out`` (casting from the wire dtype)."""
    xp.copyto(out, result.reshape(out.shape), casting="unsafe")


def _divide(arr: Any, parts: int) -> None:
    arr /= arr.dtype.type(parts)


def _divided(arr: Any, parts: int) -> Any:
    for a in arr if isinstance(arr, list) else (arr,):
        _divide(a, parts)
    return arr


# --------------------------------------------------------------------------- all-gather


def all_gather(
    x: Any, comm: Any = None, *, axis: int = 0, sizes: Sizes = None, out: Any = None, async_op: bool = False
) -> Any:
    """Concatenate every rank's ``x`` along ``axis``; every rank gets the result.

    Parameters
    ----------
    x : array_like (NumPy or CuPy)
        This rank's shard. Shards may differ in extent along ``axis``; all
        other dimensions, and the dtype, must match across ranks.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    axis : int
        The axis to concatenate along (negative counts from the end).
    sizes : sequence of int, optional
        Every rank's extent along ``axis``, one int per rank. ``None``
        discovers them with one small exchange.
    out : array, optional
        Where to write the result (shape of the concatenation, dtype of ``x``).
    async_op : bool
        Return a :class:`~hpccoll.Request` at once instead of the result; its
        ``wait()`` returns the result. Any agreement exchange before the data
        moves (``sizes=None`` discovery, check mode) still blocks.

    Returns
    -------
    array
        The concatenation, a new array (or ``out``); it never aliases ``x``.

    Raises
    ------
    ArgumentError
        Bad ``axis``, ``sizes`` or ``out``.
    DTypeError
        Unsupported dtype.
    MismatchError
        Ranks disagree on dtype or the other dimensions (always checked when
        ``sizes`` is None; in check mode, also ``axis`` and ``sizes``).

    Examples
    --------
    >>> y = hpccoll.all_gather(np.full(2, comm.rank))        # doctest: +SKIP
    >>> # on 3 ranks: array([0, 0, 1, 1, 2, 2])
    """
    c = as_communicator(comm)
    if not async_op and (result := _fast.all_gather(x, c, axis, sizes, out, "all_gather")) is not None:
        return result
    return _all_gather(x, c, axis, sizes, out, "all_gather", async_op)


def _all_gather(x: Any, c: Communicator, axis: Any, sizes: Sizes, out: Any, what: str, async_op: bool) -> Any:
    if type(x) in _SEQUENCES and is_array_list(x):
        return all_gather_many(x, c, axis, sizes, out, what, async_op)
    err = None
    try:
        x, kind = as_array(x)
        xp = np if kind == "numpy" else module_of(kind)
        check_dtype(x.dtype)
        ax = _axis(axis, x.ndim)
        if sizes is not None:
            sizes = _sizes(sizes, c.size)
            if sizes[c.rank] != x.shape[ax]:
                raise ArgumentError(
                    f"sizes: expected sizes[{c.rank}] == x.shape[{ax}] == {x.shape[ax]} on rank {c.rank}; "
                    f"got {sizes[c.rank]}"
                )
            out = _gather_out(out, x, xp, ax, sizes, c.rank)
    except HpccollError as e:
        err = e
    if c.check and c.size > 1:
        desc = None if err else {
            "collective": "all_gather",
            "dtype": x.dtype.name,
            "ndim": x.ndim,
            "axis": ax,
            "shape except axis": _shape_without(x.shape, ax),
            "sizes": sizes,
        }
        extents = c.agree(what, desc, None if err else x.shape[ax], err)
        if sizes is None:
            sizes = tuple(extents)
            try:
                out = _gather_out(out, x, xp, ax, sizes, c.rank)
            except HpccollError as e:
                err = e
            c.agree(what, None, None, err)
        elif list(sizes) != extents:
            raise MismatchError(f"{what}: sizes={list(sizes)} but the ranks' extents along axis {ax} are {extents}")
    elif err is not None:
        raise err
    elif sizes is None:
        sizes = exchange_extents(c, (x,), (ax,), what)[0]
        out = _gather_out(out, x, xp, ax, sizes, c.rank)
    if c.size == 1:
        xp.copyto(out, x)
        return _done(out, async_op)
    wire = movement_dtype(x.dtype)
    lead, inner = prod(x.shape[:ax]), prod(x.shape[ax + 1 :])
    counts = [s * lead * inner for s in sizes]
    transport = select_transport(c, kind)
    contiguous = out.flags.c_contiguous
    if out is x or xp.may_share_memory(out, x):  # in place: x is this rank's block of out (checked by _out)
        if lead == 1 and contiguous and transport.in_place:
            return _launch(transport, "allgatherv", (None, _as(flat(out, xp), wire), counts), lambda: out, async_op)
        x = x.copy()
    send = _as(flat(x, xp), wire)
    if lead == 1 and contiguous:
        return _launch(transport, "allgatherv", (send, _as(flat(out, xp), wire), counts), lambda: out, async_op)
    if not async_op and contiguous and transport.allgather_into(send, _as(flat(out, xp), wire), lead, inner, sizes):
        return out
    recv = xp.empty(sum(counts), wire)

    def finish() -> Any:
        _blocks(recv, out.view(wire), xp, ax, sizes, to_flat=False)
        return out

    return _launch(transport, "allgatherv", (send, recv, counts), finish, async_op)


def _gather_out(out: Any, x: Any, xp: Any, ax: int, sizes: Tuple[int, ...], rank: int) -> Any:
    """Validate (or allocate) an all-gather's ``out`` once ``sizes`` are known."""
    return _out(out, _with_extent(x.shape, ax, sum(sizes)), x.dtype, x, xp, _gathers_in_place(x, ax, sizes, rank))


def _launch(transport: Any, primitive: str, args: tuple, finish: Any, async_op: bool) -> Any:
    """Run a transport primitive; blocking: ``finish()``, else a :class:`Request` that finishes later."""
    if not async_op:
        getattr(transport, primitive)(*args)
        return finish()
    return Request([getattr(transport, "i" + primitive)(*args)], finish)


def _done(result: Any, async_op: bool) -> Any:
    return Request.completed(result) if async_op else result


def _then(result: Any, fn: Any) -> Any:
    """Apply ``fn`` to a result now, or when a :class:`Request` completes."""
    return result.then(fn) if isinstance(result, Request) else fn(result)


def all_gather_adjoint(
    y: Any, comm: Any = None, *, axis: int = 0, sizes: Sizes = None, out: Any = None, async_op: bool = False
) -> Any:
    """Adjoint of :func:`all_gather`: reduce-scatter with sum over the same ``axis`` and ``sizes``.

    Parameters
    ----------
    y : array_like
        A cotangent of the gathered array (its full shape), different on
        every rank in general.
    comm, axis, out
        As for :func:`all_gather`.
    sizes : sequence of int, optional
        The forward's shard extents. ``None`` means ``numpy.array_split``'s
        split of ``y.shape[axis]``; pass the forward's sizes when the shards
        were split otherwise.
    async_op : bool
        Return a :class:`~hpccoll.Request` at once instead of the result; its
        ``wait()`` returns the result. Any agreement exchange before the data
        moves (``sizes=None`` discovery, check mode) still blocks.

    Returns
    -------
    array
        This rank's block of the sum over ranks of ``y``.

    Examples
    --------
    >>> g = hpccoll.all_gather_adjoint(np.ones(6))   # doctest: +SKIP
    >>> # on 3 ranks: array([3., 3.]) on every rank
    """
    c = as_communicator(comm)
    if not async_op and (result := _fast.reduce_scatter(y, c, "sum", axis, sizes, out)) is not None:
        return result
    return _reduce_scatter(y, c, "sum", axis, sizes, out, "all_gather_adjoint", async_op)


# --------------------------------------------------------------------------- reduce-scatter


def reduce_scatter(
    x: Any,
    comm: Any = None,
    *,
    op: Any = "sum",
    axis: int = 0,
    sizes: Sizes = None,
    out: Any = None,
    async_op: bool = False,
) -> Any:
    """Reduce ``x`` elementwise over ranks; return this rank's block along ``axis``.

    Parameters
    ----------
    x : array_like (NumPy or CuPy)
        The full array, the same shape and dtype on every rank.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    op : str or mpi4py.MPI.Op
        ``"sum"``, ``"prod"``, ``"max"``, ``"min"`` or ``"avg"`` (or
        ``MPI.SUM``/``PROD``/``MAX``/``MIN``).
    axis : int
        The axis to split the result along.
    sizes : sequence of int, optional
        Every rank's block extent; must sum to ``x.shape[axis]``. ``None``
        splits like ``numpy.array_split``.
    out : array, optional
        Where to write this rank's block.
    async_op : bool
        Return a :class:`~hpccoll.Request` at once instead of the result; its
        ``wait()`` returns the result. Any agreement exchange before the data
        moves (``sizes=None`` discovery, check mode) still blocks.

    Returns
    -------
    array
        This rank's block of the reduction, in ``x``'s dtype.

    Raises
    ------
    ArgumentError
        Bad ``op``, ``axis``, ``sizes`` or ``out``.
    DTypeError
        Unsupported dtype, or an op the dtype does not support (see README).

    Examples
    --------
    >>> b = hpccoll.reduce_scatter(np.arange(6.0))   # doctest: +SKIP
    >>> # on 3 ranks, rank 1 gets array([6., 9.])
    """
    c = as_communicator(comm)
    if not async_op and (result := _fast.reduce_scatter(x, c, op, axis, sizes, out)) is not None:
        return result
    return _reduce_scatter(x, c, op, axis, sizes, out, "reduce_scatter", async_op)


def _reduce_scatter(
    x: Any, c: Communicator, op: Any, axis: Any, sizes: Sizes, out: Any, what: str, async_op: bool
) -> Any:
    if type(x) in _SEQUENCES and is_array_list(x):
        return reduce_scatter_many(x, c, op, axis, sizes, out, what, async_op)
    err = desc = None
    try:
        x, kind = as_array(x)
        xp = np if kind == "numpy" else module_of(kind)
        check_dtype(x.dtype)
        op = normalize_op(op)
        ax = _axis(axis, x.ndim)
        n = x.shape[ax]
        if sizes is None:
            sizes = split_sizes(n, c.size)
        else:
            sizes = _sizes(sizes, c.size)
            if sum(sizes) != n:
                raise ArgumentError(f"sizes: expected ints summing to x.shape[{ax}] == {n}; got {list(sizes)}")
        plan = reduce_plan(x.dtype, op)  # raises for unsupported (dtype, op) before any communication
        out = _out(out, _with_extent(x.shape, ax, sizes[c.rank]), x.dtype, x, xp,
                   _scatters_in_place(x, ax, sizes, c.rank))
        if c.check:
            desc = {"collective": "reduce_scatter", "dtype": x.dtype.name, "shape": x.shape, "axis": ax,
                    "op": op, "sizes": sizes}
    except HpccollError as e:
        err = e
    _settle(c, what, desc, None, err)
    if c.size == 1:
        xp.copyto(out, x)
        return _done(out, async_op)
    transport = select_transport(c, kind)  # collective on first GPU use: after the ranks agree
    if transport.native_reduce:
        plan = reduce_plan(x.dtype, op, transport.native_reduce)
    trail = prod(_shape_without(x.shape, ax))
    counts = [s * trail for s in sizes]
    if out is x or xp.may_share_memory(out, x):  # in place: out is this rank's block of x (checked by _out)
        if prod(x.shape[:ax]) == 1 and x.flags.c_contiguous and not plan.widen and transport.in_place:
            full = _as(flat(x, xp), plan.wire)
            start = sum(counts[: c.rank])
            mine = full[start : start + counts[c.rank]]

            def finish() -> Any:
                if plan.divide:
                    _divide(mine, c.size)
                return out

            return _launch(transport, "reduce_scatter", (None, full, counts, plan.op), finish, async_op)
        x = x.copy()
    send = _pack(x, xp, ax, sizes, plan.wire, plan.widen)
    return _reduce(transport, plan, send, out, xp, counts, c.size, async_op)


def _reduce(
    transport: Any, plan: ReducePlan, send: Any, out: Any, xp: Any, counts: Optional[List[int]], parts: int,
    async_op: bool,
) -> Any:
    """Reduce-scatter (``counts``) or all-reduce (``None``) from ``send`` into ``out``; return ``out``."""
    # An empty out may point into the input (an empty block of x): MPI would see aliased buffers.
    direct = not plan.widen and out.flags.c_contiguous and out.size > 0
    recv = _as(flat(out, xp), plan.wire) if direct else xp.empty(out.size, plan.wire)

    def finish() -> Any:
        if plan.divide:
            _divide(recv, parts)
        if not direct:
            _store(out, recv if plan.widen else recv.view(out.dtype), xp)
        return out

    if counts is None:
        return _launch(transport, "allreduce", (send, recv, plan.op), finish, async_op)
    return _launch(transport, "reduce_scatter", (send, recv, counts, plan.op), finish, async_op)


def reduce_scatter_adjoint(
    y: Any,
    comm: Any = None,
    *,
    op: Any = "sum",
    axis: int = 0,
    sizes: Sizes = None,
    out: Any = None,
    async_op: bool = False,
) -> Any:
    """Adjoint of :func:`reduce_scatter`: all-gather (``sum``), or all-gather / P (``avg``).

    Parameters
    ----------
    y : array_like
        A cotangent of this rank's block.
    comm, axis, out
        As for :func:`reduce_scatter`.
    op : str or mpi4py.MPI.Op
        The forward's op; only ``"sum"`` and ``"avg"`` are linear.
    sizes : sequence of int, optional
        The forward's block extents; ``None`` discovers them from ``y``.
    async_op : bool
        Return a :class:`~hpccoll.Request` at once instead of the result; its
        ``wait()`` returns the result. Any agreement exchange before the data
        moves (``sizes=None`` discovery, check mode) still blocks.

    Raises
    ------
    UnsupportedOpError
        For ``prod``, ``max`` and ``min``, which are not linear.
    """
    c = as_communicator(comm)
    if (
        type(op) is str and op == "sum" and not async_op
        and (result := _fast.all_gather(y, c, axis, sizes, out, "reduce_scatter_adjoint")) is not None
    ):
        return result
    early = None
    try:
        op = _linear_op(op, "reduce_scatter_adjoint")
        if op == "avg":  # avg on bool or integers raises, as in the forward
            many = type(y) in _SEQUENCES and is_array_list(y)
            for i, yi in enumerate(y if many else (y,)):
                name = f"y[{i}]" if many else "y"
                yi, _ = as_array(yi, name)
                check_dtype(yi.dtype, name)
                reduce_plan(yi.dtype, op)
    except HpccollError as e:
        early = e
    if early is not None:  # outside the except block: no "during handling" chain
        _refuse(c, "reduce_scatter_adjoint", early)
    result = _all_gather(y, c, axis, sizes, out, "reduce_scatter_adjoint", async_op)
    if op == "avg" and c.size > 1:
        return _then(result, lambda r: _divided(r, c.size))
    return result


def _linear_op(op: Any, what: str) -> str:
    op = normalize_op(op)
    if op not in ("sum", "avg"):
        raise UnsupportedOpError(
            f"{what}: expected op 'sum' or 'avg' (the linear reductions); got {op!r}, whose adjoint "
            "depends on which rank held the extreme or on the other factors: differentiate it yourself"
        )
    return op


# --------------------------------------------------------------------------- all-reduce


def all_reduce(x: Any, comm: Any = None, *, op: Any = "sum", out: Any = None, async_op: bool = False) -> Any:
    """Reduce ``x`` elementwise over ranks; every rank gets the full result.

    Parameters
    ----------
    x : array_like (NumPy or CuPy)
        The same shape and dtype on every rank (0-D allowed).
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    op : str or mpi4py.MPI.Op
        ``"sum"``, ``"prod"``, ``"max"``, ``"min"`` or ``"avg"``.
    out : array, optional
        Where to write the result. ``out=x`` reduces in place (the only
        allowed overlap with ``x``).
    async_op : bool
        Return a :class:`~hpccoll.Request` at once instead of the result; its
        ``wait()`` returns the result. Any agreement exchange before the data
        moves (``sizes=None`` discovery, check mode) still blocks.

    Returns
    -------
    array
        The reduction, in ``x``'s dtype.

    Examples
    --------
    >>> hpccoll.all_reduce(np.ones(3), op="sum")   # doctest: +SKIP
    >>> # on 4 ranks: array([4., 4., 4.])
    """
    c = as_communicator(comm)
    if not async_op and (result := _fast.all_reduce(x, c, op, out)) is not None:
        return result
    return _all_reduce(x, c, op, out, "all_reduce", async_op)


def _all_reduce(x: Any, c: Communicator, op: Any, out: Any, what: str, async_op: bool) -> Any:
    if type(x) in _SEQUENCES and is_array_list(x):
        return all_reduce_many(x, c, op, out, what, async_op)
    err = desc = None
    try:
        x, kind = as_array(x)
        xp = np if kind == "numpy" else module_of(kind)
        check_dtype(x.dtype)
        op = normalize_op(op)
        plan = reduce_plan(x.dtype, op)  # raises for unsupported (dtype, op) before any communication
        out = _out(out, x.shape, x.dtype, x, xp, lambda o: _same_view(o, x))
        if c.check:
            desc = {"collective": "all_reduce", "dtype": x.dtype.name, "shape": x.shape, "op": op}
    except HpccollError as e:
        err = e
    _settle(c, what, desc, None, err)
    if c.size == 1:
        if out is not x:
            xp.copyto(out, x)
        return _done(out, async_op)
    transport = select_transport(c, kind)  # collective on first GPU use: after the ranks agree
    if transport.native_reduce:
        plan = reduce_plan(x.dtype, op, transport.native_reduce)
    in_place = out is x or (xp.may_share_memory(out, x) and _same_view(out, x))
    if in_place and not plan.widen and out.flags.c_contiguous:
        recv = _as(flat(out, xp), plan.wire)

        def finish() -> Any:
            if plan.divide:
                _divide(recv, c.size)
            return out

        return _launch(transport, "allreduce", (None, recv, plan.op), finish, async_op)
    send = flat(x, xp)
    send = send.astype(plan.wire) if plan.widen else _as(send, plan.wire)
    return _reduce(transport, plan, send, out, xp, None, c.size, async_op)


def all_reduce_adjoint(
    y: Any,
    comm: Any = None,
    *,
    op: Any = "sum",
    cotangent: str = "varying",
    out: Any = None,
    async_op: bool = False,
) -> Any:
    """Adjoint of :func:`all_reduce` under the inner product summed over ranks.

    Parameters
    ----------
    y : array_like
        The cotangent of the all-reduced result.
    comm, out
        As for :func:`all_reduce`.
    op : str or mpi4py.MPI.Op
        The forward's op; only ``"sum"`` and ``"avg"`` are linear.
    cotangent : {"varying", "replicated"}
        ``"varying"``: every rank holds its own cotangent (the true adjoint,
        itself an all-reduce). ``"replicated"``: every rank holds the same
        cotangent, as in tensor-parallel codes where the reduced result is
        used identically everywhere: the identity for ``sum``, ``y / P`` for
        ``avg``, with no communication. Using ``"varying"`` on replicated
        cotangents overcounts by a factor of P. In check mode, a
        ``"replicated"`` cotangent that differs across ranks raises
        :class:`MismatchError`.
    async_op : bool
        Return a :class:`~hpccoll.Request` at once instead of the result; its
        ``wait()`` returns the result. Any agreement exchange before the data
        moves (``sizes=None`` discovery, check mode) still blocks.

    Returns
    -------
    array
        The cotangent of this rank's input, a new array (or ``out``).
    """
    c = as_communicator(comm)
    if (
        cotangent == "varying" and type(op) is str and (op == "sum" or op == "avg") and not async_op
        and (result := _fast.all_reduce(y, c, op, out)) is not None
    ):
        return result
    early = None
    many = type(y) in _SEQUENCES and is_array_list(y)
    try:
        op = _linear_op(op, "all_reduce_adjoint")
        if cotangent not in COTANGENTS:
            raise ArgumentError(f"cotangent: expected 'varying' or 'replicated'; got {cotangent!r}")
        if cotangent == "replicated" and many:
            outs = [None] * len(y) if out is None else out
            if type(outs) not in _SEQUENCES or len(outs) != len(y):
                raise ArgumentError(f"out: expected None or a list of {len(y)} arrays (one per input); got {out!r}")
        elif cotangent == "replicated":
            y, kind = as_array(y, "y")
            xp = np if kind == "numpy" else module_of(kind)
            check_dtype(y.dtype, "y")
            if op == "avg":
                reduce_plan(y.dtype, op)  # avg on bool or integers raises, as in the forward
            out = _out(out, y.shape, y.dtype, y, xp, lambda o: _same_view(o, y))
    except HpccollError as e:
        early = e
    if early is not None:  # outside the except block: no "during handling" chain
        _refuse(c, "all_reduce_adjoint", early)
    if cotangent == "varying":
        return _all_reduce(y, c, op, out, "all_reduce_adjoint", async_op)
    if many:  # replicated: no communication but the check, array by array
        results = [all_reduce_adjoint(yi, c, op=op, cotangent=cotangent, out=oi) for yi, oi in zip(y, outs)]
        return _done(results, async_op)
    if c.check and c.size > 1:
        c.agree("all_reduce_adjoint", {"replicated cotangent": _digest(y)}, None, None)
    if out is not y:
        xp.copyto(out, y)
    if op == "avg" and c.size > 1:
        _divide(out, c.size)
    return _done(out, async_op)


def _digest(y: Any) -> str:
    import hashlib

    data = y if isinstance(y, np.ndarray) else y.get()
    return hashlib.blake2b(np.ascontiguousarray(data).tobytes(), digest_size=16).hexdigest()


from ._coalesced import all_gather_many, all_reduce_many, is_array_list, reduce_scatter_many  # noqa: E402
