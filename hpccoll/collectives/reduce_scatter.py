"""reduce-scatter: one array, a list of arrays, blocking or not.

Every path ends in the transport's ``reduce_scatter`` (or
``ireduce_scatter``). The first branch of :func:`reduce_scatter` takes the
common case -- a C-contiguous NumPy array split along its first axis, whose
(dtype, op) the transport reduces natively, ``sizes`` absent or plain ints,
``out`` absent, separate or exactly this rank's block of ``x``, no check
mode -- with as few Python operations as it can; anything else takes the
general branch, which validates everything and raises the errors.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from .._arrays import module_of, prod, split_sizes
from .._core.agree import (
    checking,
    dtype_code,
    gather_adjoint_arrays_desc,
    odd_one,
    raise_exchanged,
    reduce_scatter_desc,
    reduce_scatter_list_desc,
    settle,
    status_of,
)
from .._core.blocks import (
    block,
    in_place_send,
    in_place_test,
    is_in_place,
    may_share,
    own_block,
    shape_without,
    with_extent,
)
from .._core.launch import launch, scratch, then
from .._core.lists import ListOf, list_types, survey_list, total_bytes
from .._core.validate import (
    axes_of,
    axis_of,
    block_sizes,
    check_out,
    one_array,
    outs_of,
    plain_out,
    plain_total,
    sizes_of,
)
from .._dtypes import ReducePlan, direct_plan, normalize_op, reduce_plan
from .._errors import ArgumentError, HpccollError, MismatchError
from .._layout import as_wire, blocks, finish_reduction, joined, pack, wire_flat
from .._spec import Bound, Hooks, Meta, register
from ..transports._control import exchange_shapes
from ._engine import Call, Road, in_buckets, run
from .all_reduce import alone, alone_list, finisher, into, plan_groups

__all__ = ["reduce_scatter", "reduce_scatter_arrays", "REDUCE_SCATTER"]

_ndarray = np.ndarray


def reduce_scatter(x: Any, c: Any, op: Any, axis: Any, sizes: Any, out: Any, what: str, async_op: bool) -> Any:
    """``hpccoll.reduce_scatter`` (also a list of arrays); ``what`` names the public call in errors."""
    if type(x) is _ndarray:
        if (
            not c.check
            and c.size > 1
            and type(axis) is int
            and type(op) is str
            and x.ndim
            and (axis == 0 or axis == -x.ndim)
            and x.flags.c_contiguous
        ):
            result = _common(x, c, op, sizes, out, async_op)
            if result is not None:
                return result
    elif (types := list_types(x)) is not None:
        return _many(x, types, c, op, axis, sizes, out, what, async_op)
    return _one(x, c, op, axis, sizes, out, what, async_op)


def _common(x: np.ndarray, c: Any, op: str, sizes: Any, out: Any, async_op: bool) -> Any:
    """The common case, or ``None`` when the general branch must decide."""
    shape, dtype = x.shape, x.dtype
    if sizes is None:
        sizes = split_sizes(shape[0], c.size)
    elif plain_total(sizes, c.size) != shape[0]:
        return None  # the general branch checks them
    t = c.transport_of("numpy", x.nbytes, "reduce_scatter", not async_op)
    plan = direct_plan(dtype, op, t)
    mine = sizes[c.rank]
    if len(shape) == 1:
        inner, oshape = 1, (mine,)
    else:
        inner, oshape = prod(shape[1:]), (mine,) + shape[1:]
    if plan is None or not mine * inner:
        return None
    wire = plan.wire
    as_is = len(shape) == 1 and dtype is wire  # x and out are already the wire buffers
    if out is None:
        out, send = np.empty(oshape, dtype), wire_flat(x, wire)
    elif plain_out(out, oshape, dtype):
        if not may_share(out, x):
            send = x if as_is else wire_flat(x, wire)
        elif (
            t.in_place
            and x.flags.writeable
            and is_in_place(out, x, block(0, start := sum(sizes[: c.rank]), start + mine))
        ):
            send = None  # out is this rank's block of x: in place
        else:
            return None
    else:
        return None
    counts = sizes if inner == 1 else [s * inner for s in sizes]
    if send is None:
        recv = wire_flat(x, wire)
        mine_flat = recv[start * inner : (start + mine) * inner]
        return launch(
            t, "reduce_scatter", (None, recv, counts, plan.op), finisher(mine_flat, out, plan, c.size), async_op
        )
    recv = out if as_is else wire_flat(out, wire)
    if async_op or plan.divide:
        return launch(t, "reduce_scatter", (send, recv, counts, plan.op), finisher(recv, out, plan, c.size), async_op)
    t.reduce_scatter(send, recv, counts, plan.op)
    return out


def _one(x: Any, c: Any, op: Any, axis: Any, sizes: Any, out: Any, what: str, async_op: bool) -> Any:
    return run(_ONE, c, what, async_op, x, op, axis, sizes, out)


def _check(c: Any, async_op: bool, x: Any, op: Any, axis: Any, sizes: Any, out: Any) -> Call:
    x, kind, xp = one_array(x)
    op = normalize_op(op)
    ax = axis_of(axis, x.ndim)
    sizes = block_sizes(sizes, x.shape[ax], c.size, f"x.shape[{ax}]")
    reduce_plan(x.dtype, op)  # raises for unsupported (dtype, op) before any communication
    out = check_out(
        out, with_extent(x.shape, ax, sizes[c.rank]), x.dtype, x, xp, in_place_test(x, own_block(ax, sizes, c.rank))
    )
    desc = reduce_scatter_desc(x, ax, op, sizes) if c.check else None
    return Call(x, kind, xp, out, x.nbytes, desc, op, ax, sizes)


def _move(a: Call, c: Any, transport: Any, async_op: bool) -> Any:
    out, xp, ax, sizes = a.out, a.xp, a.ax, a.sizes
    plan = reduce_plan(a.x.dtype, a.op, transport.native_reduce, transport.saturates, transport.reduce_ops)
    trail = prod(shape_without(a.x.shape, ax))
    counts = [s * trail for s in sizes]
    can = prod(a.x.shape[:ax]) == 1 and a.x.flags.c_contiguous and not plan.widen and transport.in_place
    x, in_place = in_place_send(a.x, out, xp, own_block(ax, sizes, c.rank), can)
    if in_place:  # out is this rank's block of x
        full = as_wire(x.reshape(-1), plan.wire)
        start = sum(counts[: c.rank])
        mine = full[start : start + counts[c.rank]]
        return launch(
            transport, "reduce_scatter", (None, full, counts, plan.op), finisher(mine, out, plan, c.size), async_op
        )
    send = pack(x, xp, ax, sizes, plan.wire, plan.widen)
    return into(transport, plan, send, out, xp, counts, c.size, async_op)


_ONE = Road(_check, alone, _move, "reduce_scatter")


# --------------------------------------------------------------------------- lists


def _many(
    xs: Any, types: Set[type], c: Any, op: Any, axis: Any, sizes: Any, out: Any, what: str, async_op: bool
) -> Any:
    return run(_MANY, c, what, async_op, xs, types, op, axis, sizes, out)


def _check_list(c: Any, async_op: bool, xs: Any, types: Set[type], op: Any, axis: Any, sizes: Any, out: Any) -> Call:
    lst = survey_list(xs, types, async_op)
    arrays, kind = lst.arrays, lst.kind
    xp = module_of(kind)
    op = normalize_op(op)
    axes = axes_of(lst, axis)
    table = _tables(lst, axes, sizes, c.size)
    for dtype in lst.dtypes:
        reduce_plan(dtype, op)  # raises for unsupported (dtype, op) before any communication
    if out is not None:
        out = [
            check_out(o, with_extent(a.shape, ax, t[c.rank]), a.dtype, a, xp)
            for a, ax, t, o in zip(arrays, axes, table, outs_of(out, len(arrays)))
        ]
    desc = reduce_scatter_list_desc(arrays, axes, op, sizes) if c.check else None
    return Call(lst, kind, xp, out, total_bytes(lst), desc, op, axes, table)


def _buckets(a: Call, c: Any, transport: Any, async_op: bool) -> Any:
    """Reduce-scatter a checked list: one group per dtype, each in buckets of at most ``c.bucket_bytes``.

    Without ``out`` (``a.out`` is ``None``) a uniform list may come back as the rows of one new array.
    """
    lst, axes, table, xp = a.x, a.ax, a.sizes, a.xp
    arrays = lst.arrays
    outs = a.out or [None] * len(arrays)
    shape = lst.shape  # one shape: each array's block extents and trailing size are one value
    if shape is not None:
        inner = [prod(shape_without(shape, axes[0]))] * len(arrays)
    else:
        inner = [prod(shape_without(s, ax)) for s, ax in zip(lst.shapes, axes)]

    def bucket(plan: ReducePlan, idx: Sequence[int], whole: bool) -> Tuple[str, tuple, Callable[[], None]]:
        # One bucket of all arrays, one shape, split along axis 0, no out, no widening: one relayout each way.
        uniform = whole and a.out is None and not plan.widen and shape is not None and axes[0] == 0
        if shape is not None:  # every array of idx alike: k arrays' blocks of one extent per rank
            counts = [len(idx) * inner[0] * n for n in table[0]]
        else:
            counts = [sum(inner[i] * table[i][r] for i in idx) for r in range(c.size)]
        size = plan.wire.itemsize
        pair = (
            scratch(c, sum(counts) * size)
            if uniform and lst.kind == "numpy" and not async_op and counts[c.rank]
            else None
        )
        send = _rank_major(arrays, idx, axes, table, counts, plan, xp, pair, c.size)
        recv = pair[0][: counts[c.rank] * size].view(plan.wire) if pair else xp.empty(counts[c.rank], plan.wire)
        finish = _unpacker(recv, idx, arrays, axes, outs, results, inner, table, c, plan, xp, uniform, pair is not None)
        return "reduce_scatter", (send, recv, counts, plan.op), finish

    results: List[Any] = [None] * len(arrays)  # the rows of one new array, or filled array by array
    return in_buckets(c, lst.kind, async_op, results, plan_groups(a, transport, c.bucket_bytes), bucket)


_MANY = Road(_check_list, alone_list, _buckets)


def _tables(lst: ListOf, axes: List[int], sizes: Any, parts: int) -> List[Tuple[int, ...]]:
    """Each array's block extents (``numpy.array_split``'s, or ``sizes`` checked once against every extent)."""
    n = len(lst.arrays)
    if lst.shape is not None:  # one shape: one extent
        extents = [lst.shape[axes[0]]] * n
    else:
        extents = [s[ax] for s, ax in zip(lst.shapes, axes)]
    if sizes is None:
        return (
            [split_sizes(extents[0], parts)] * n if lst.shape is not None else [split_sizes(e, parts) for e in extents]
        )
    sizes = sizes_of(sizes, parts)
    total = sum(sizes)
    if extents.count(total) != len(extents):
        i = next(i for i, e in enumerate(extents) if e != total)
        block_sizes(sizes, extents[i], parts, f"x[{i}].shape[{axes[i]}]")  # raises, naming the array
    return [sizes] * n


def _rank_major(
    arrays: List[Any],
    idx: Sequence[int],
    axes: List[int],
    table: List[Any],
    counts: List[int],
    plan: ReducePlan,
    xp: Any,
    pair: Any,
    parts: int,
) -> Any:
    """Rank r's block of every array of ``idx``, one after another, for r = 0, 1, ... as one wire buffer."""
    if pair is not None:  # uniform NumPy arrays: pack into scratch, then one relayout
        k, first = len(idx), arrays[idx[0]]
        packed = joined(arrays if k == len(arrays) else [arrays[i] for i in idx])
        send = pair[1][: sum(counts) * plan.wire.itemsize].view(plan.wire)
        blocks(send, as_wire(packed, plan.wire).reshape((k,) + first.shape), np, 1, table[idx[0]], to_flat=True)
        return send
    send = xp.empty(sum(counts), plan.wire if plan.widen else arrays[idx[0]].dtype)
    offset = 0
    for r in range(parts):
        for i in idx:
            a, ax, n = arrays[i], axes[i], table[i][r]
            lo = sum(table[i][:r])
            count = n * (a.size // a.shape[ax] if a.shape[ax] else 0)
            xp.copyto(
                send[offset : offset + count].reshape(with_extent(a.shape, ax, n)),
                a[block(ax, lo, lo + n)],
                casting="unsafe",
            )
            offset += count
    return as_wire(send, plan.wire)


def _unpacker(
    recv: Any,
    idx: Sequence[int],
    arrays: List[Any],
    axes: List[int],
    outs: List[Any],
    results: List[Any],
    inner: List[int],
    table: List[Any],
    c: Any,
    plan: ReducePlan,
    xp: Any,
    uniform: bool,
    scratched: bool,
) -> Callable[[], None]:
    def finish() -> None:
        buf = finish_reduction(recv, c.size, plan.divide)
        if uniform:  # this rank's rows of k arrays: the rows of one new array
            first = arrays[idx[0]]
            mine = table[idx[0]][c.rank]
            buf = buf.copy() if scratched else buf
            results[:] = as_wire(buf, first.dtype).reshape((len(idx), mine) + first.shape[1:])
            return
        offset = 0
        for i in idx:
            a, ax = arrays[i], axes[i]
            count = inner[i] * table[i][c.rank]
            target = outs[i] if outs[i] is not None else xp.empty(with_extent(a.shape, ax, table[i][c.rank]), a.dtype)
            results[i] = finish_reduction(
                buf[offset : offset + count], c.size, False, widen=plan.widen, out=target, xp=xp
            )
            offset += count

    return finish


# --------------------------------------------------------------------------- one array per rank (axis=None)


def reduce_scatter_arrays(ys: Any, c: Any, sizes: Any, out: Any, what: str, async_op: bool) -> Any:
    """``hpccoll.all_gather_adjoint(ys, axis=None)``: the sum over ranks of their ``ys[rank]``.

    ``ys`` holds one array per rank (``ys[q]`` shaped like rank q's forward
    input); every rank's list must have the same shapes and dtype, which one
    small exchange checks (check mode: in detail) before the flat
    concatenation is reduce-scattered in blocks of ``ys[q].size``.
    """
    err: Optional[HpccollError] = None
    arrays: List[Any] = []
    dtype: Any = None
    xp, shapes = np, []
    try:
        if sizes is not None:
            raise ArgumentError(f"sizes: expected None with axis=None (the shapes are y's); got {sizes!r}")
        if type(ys) not in (list, tuple) or len(ys) != c.size:
            got = f"a list of {len(ys)} arrays" if type(ys) in (list, tuple) else type(ys).__name__
            raise ArgumentError(
                f"y: expected a list of {c.size} arrays with axis=None (y[q] shaped like rank q's x); got {got}"
            )
        lst = survey_list(ys, list_types(ys) or set(map(type, ys)), async_op)  # array-likes too: 0-D entries
        arrays, xp = lst.arrays, module_of(lst.kind)
        if len(lst.dtypes) != 1:
            raise ArgumentError(f"y: expected arrays of one dtype; got {sorted(d.name for d in lst.dtypes)}")
        dtype, shapes = arrays[0].dtype, lst.shapes
        reduce_plan(dtype, "sum")  # raises for an unsupported dtype before any communication
        if out is not None:
            for a in arrays:
                out = check_out(out, shapes[c.rank], dtype, a, xp)
    except HpccollError as e:
        err = e
    if checking(c):
        desc = None if err else gather_adjoint_arrays_desc(dtype, shapes)
        settle(c, what, desc, None, err, async_op)
    elif c.size > 1:
        signature = 0 if err else hash((dtype_code(dtype), tuple(shapes)))
        rows = exchange_shapes(c, (), [status_of(err), signature], what, dims=0)
        raise_exchanged([v[0] for _, v in rows], err, what)
        q = odd_one([v[1] for _, v in rows])
        if q is not None:
            raise MismatchError(
                f"y: expected the same dtype and shapes on every rank with axis=None; ranks 0 and {q} differ "
                f"(this rank has {dtype}, shapes {shapes}); set HPCCOLL_CHECK=1 for a detailed report"
            )
    elif err is not None:
        raise err
    assert dtype is not None, "an error was raised if the survey failed"
    mine = shapes[c.rank]
    joined_ys = xp.concatenate([a.reshape(-1) for a in arrays])
    view = out.reshape(-1) if out is not None and out.flags.c_contiguous else None
    result = reduce_scatter(joined_ys, c, "sum", 0, [prod(s) for s in shapes], view, what, async_op)

    def shaped(r: Any) -> Any:
        if out is None:
            return r.reshape(mine)
        if view is None:
            xp.copyto(out, r.reshape(mine))
        return out

    return then(result, shaped)


# --------------------------------------------------------------------------- the pair's spec


def _configure(comm: Any, keywords: Dict[str, Any]) -> Dict[str, Any]:
    sizes = keywords.get("sizes")
    return {
        **keywords,
        "op": keywords.get("op", "sum"),
        "axis": keywords.get("axis", 0),
        "sizes": None if sizes is None else sizes_of(sizes, comm.size),
    }


def _bind(meta: Meta, comm: Any, tracing: bool, keywords: Dict[str, Any]) -> Bound:
    k = _configure(comm, keywords)
    ax = axis_of(k["axis"], meta.ndim)
    sizes = split_sizes(meta.shape[ax], comm.size) if k["sizes"] is None else k["sizes"]  # local
    shape = with_extent(tuple(meta.shape), ax, sizes[comm.rank])
    return Bound({**k, "axis": ax, "sizes": sizes}, shape, k["op"], k["op"])


#: The reduce-scatter's spec: its blocks split like ``numpy.array_split`` unless ``sizes`` says otherwise; its
#: adjoint (the all-gather) is linear only for the linear ops.
REDUCE_SCATTER = register(
    Hooks("reduce_scatter", _configure, _bind, "reduce_scatter", example=lambda size: {"op": "sum", "axis": 0})
)
