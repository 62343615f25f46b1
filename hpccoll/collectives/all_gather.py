"""all-gather: one array, a list of arrays, blocking or not.

Every path ends in the transport's ``allgatherv`` (or ``iallgatherv``, or
its ``allgather_into`` for inner axes). The first branch of
:func:`all_gather` takes the common case -- a C-contiguous NumPy array
gathered along its first axis, ``sizes`` absent or plain ints, ``out``
absent, separate, or the exact in-place layout, no check mode -- with as few
Python operations as it can; anything else takes the general branch, which
validates everything and raises the errors.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from .._arrays import flat, module_of, prod
from .._core.agree import (
    all_gather_desc,
    all_gather_list_desc,
    checking,
    dtype_code,
    dtype_names,
    late,
    odd_one,
    raise_exchanged,
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
from .._core.extents import gathered_sizes
from .._core.launch import Ready, done, launch, scratch
from .._core.lists import ListOf, list_types, survey_list
from .._core.validate import (
    axes_of,
    axis_of,
    check_out,
    one_array,
    outs_of,
    own_sizes,
    plain_out,
    plain_total,
    sizes_of,
)
from .._dtypes import movement_dtype, wire_of
from .._errors import ArgumentError, HpccollError, MismatchError
from .._layout import as_wire, blocks, buckets, join, wire_flat
from .._spec import Bound, Hooks, Meta, register
from ..transports._control import exchange_extents, exchange_shapes
from ._engine import Call, Road, copied, in_buckets, run

__all__ = ["all_gather", "all_gather_arrays", "ALL_GATHER"]

_ndarray = np.ndarray
_BYTES = np.dtype(np.uint8)


def all_gather(x: Any, c: Any, axis: Any, sizes: Any, out: Any, what: str, async_op: bool) -> Any:
    """``hpccoll.all_gather`` (also a list of arrays); ``what`` names the public call in errors."""
    if type(x) is _ndarray:
        if (
            not c.check
            and c.size > 1
            and type(axis) is int
            and x.ndim
            and (axis == 0 or axis == -x.ndim)
            and x.flags.c_contiguous
        ):
            return _common(x, c, axis, sizes, out, what, async_op)
    elif (types := list_types(x)) is not None:
        return _many(x, types, c, axis, sizes, out, what, async_op)
    return _one(x, c, axis, sizes, out, what, async_op)


def _common(x: np.ndarray, c: Any, axis: int, sizes: Any, out: Any, what: str, async_op: bool) -> Any:
    """The common case; hands anything else to the general branch (with the sizes it exchanged)."""
    wire = wire_of(x.dtype)
    shape = x.shape
    if wire is None:
        return _one(x, c, axis, sizes, out, what, async_op)
    if sizes is None:
        sizes = exchange_extents(c, (x,), (0,), what)[0]
        total = sum(sizes)
    elif (total := plain_total(sizes, c.size)) < 0 or sizes[c.rank] != shape[0]:
        return _one(x, c, axis, sizes, out, what, async_op)
    inner = 1 if len(shape) == 1 else prod(shape[1:])
    oshape = (total,) + shape[1:]
    nbytes = total * inner * x.itemsize
    in_place = False
    if not total * inner:
        send = None  # an empty result: the general branch
    elif out is None:
        out, send = np.empty(oshape, x.dtype), x
    elif plain_out(out, oshape, x.dtype):
        if not may_share(out, x):
            send = x
        elif (
            shape[0]
            and is_in_place(out, x, own_block(0, sizes, c.rank), out_is_whole=True)
            and c.transport_of("numpy", nbytes, "allgatherv", not async_op).in_place
        ):
            send, in_place = x, True  # x is this rank's block of out: in place
        else:
            send = None
    else:
        send = None
    if send is None:
        return _one(x, c, axis, sizes, out, what, async_op)
    counts = sizes if inner == 1 else [s * inner for s in sizes]
    send = None if in_place else wire_flat(send, wire)
    recv = wire_flat(out, wire)
    t = c.transport_of("numpy", nbytes, "allgatherv", not async_op)
    if async_op:
        return launch(t, "allgatherv", (send, recv, counts), Ready(out), True)
    t.allgatherv(send, recv, counts)
    return out


def _one(x: Any, c: Any, axis: Any, sizes: Any, out: Any, what: str, async_op: bool) -> Any:
    return run(_ONE, c, what, async_op, x, axis, sizes, out)


def _check(c: Any, async_op: bool, x: Any, axis: Any, sizes: Any, out: Any) -> Call:
    x, kind, xp = one_array(x)
    ax = axis_of(axis, x.ndim, joins=True)
    if sizes is not None:
        sizes = own_sizes(sizes, c, x.shape[ax], f"x.shape[{ax}]")
        out = _out(out, x, xp, ax, sizes, c.rank)
    return Call(x, kind, xp, out, 0, None, None, ax, sizes)


def _out(out: Any, x: Any, xp: Any, ax: int, sizes: Tuple[int, ...], rank: int) -> Any:
    """Validate (or allocate) ``out`` once ``sizes`` are known; ``x`` may be exactly its own block of it."""
    return check_out(
        out,
        with_extent(x.shape, ax, sum(sizes)),
        x.dtype,
        x,
        xp,
        in_place_test(x, own_block(ax, sizes, rank), out_is_whole=True),
    )


def _agree(a: Optional[Call], c: Any, what: str, err: Optional[HpccollError], async_op: bool) -> Call:
    """Compare the call across ranks in check mode, learn the extents when ``sizes`` is None."""
    if checking(c):
        desc = None if a is None else all_gather_desc(a.x, a.ax, a.sizes)
        extents = settle(c, what, desc, None if a is None else a.x.shape[a.ax], err, async_op)
        assert a is not None and extents is not None, "settle raised, or returns every rank's extent"
        if a.sizes is None:
            sizes, k = tuple(extents), a
            a = a._replace(sizes=sizes, out=late(c, what, lambda: _out(k.out, k.x, k.xp, k.ax, sizes, c.rank)))
        elif list(a.sizes) != extents:
            raise MismatchError(f"{what}: sizes={list(a.sizes)} but the ranks' extents along axis {a.ax} are {extents}")
    elif err is not None:
        raise err
    elif a is not None and a.sizes is None:
        sizes = exchange_extents(c, (a.x,), (a.ax,), what)[0]
        a = a._replace(sizes=sizes, out=_out(a.out, a.x, a.xp, a.ax, sizes, c.rank))
    assert a is not None
    return a._replace(nbytes=a.out.nbytes)


def _move(a: Call, c: Any, transport: Any, async_op: bool) -> Any:
    """Gather the validated ``x`` into ``out``: straight, in place, into place, or through a flat buffer."""
    xp, ax, sizes, out = a.xp, a.ax, a.sizes, a.out
    wire = movement_dtype(a.x.dtype)
    lead, inner = prod(a.x.shape[:ax]), prod(a.x.shape[ax + 1 :])
    counts = [s * lead * inner for s in sizes]
    contiguous = out.flags.c_contiguous
    can = lead == 1 and contiguous and transport.in_place
    x, in_place = in_place_send(a.x, out, xp, own_block(ax, sizes, c.rank), can, out_is_whole=True)
    if in_place:  # x is this rank's block of out
        return launch(transport, "allgatherv", (None, as_wire(flat(out, xp), wire), counts), Ready(out), async_op)
    send = as_wire(flat(x, xp), wire)
    if lead == 1 and contiguous:
        return launch(transport, "allgatherv", (send, as_wire(flat(out, xp), wire), counts), Ready(out), async_op)
    if not async_op and contiguous and transport.allgather_into(send, as_wire(flat(out, xp), wire), lead, inner, sizes):
        return out
    recv = xp.empty(sum(counts), wire)

    def finish() -> Any:
        blocks(recv, out.view(wire), xp, ax, sizes, to_flat=False)
        return out

    return launch(transport, "allgatherv", (send, recv, counts), finish, async_op)


_ONE = Road(_check, copied, _move, "allgatherv", _agree)


# --------------------------------------------------------------------------- lists


def _many(xs: Any, types: Set[type], c: Any, axis: Any, sizes: Any, out: Any, what: str, async_op: bool) -> Any:
    err = desc = lst = None
    axes: List[int] = []
    try:
        lst = survey_list(xs, types, async_op)
        axes = axes_of(lst, axis, joins=True)
        outs = outs_of(out, len(lst.arrays))
        if sizes is not None:
            sizes = sizes_of(sizes, c.size)
            _check_extents(lst, axes, sizes, c)
        if c.check:
            desc = all_gather_list_desc(lst.arrays, axes, sizes)
    except HpccollError as e:
        err = e
    table = _table(lst, axes, sizes, c, desc, what, err, async_op)
    assert lst is not None, "_table raised if the survey failed"
    arrays, kind = lst.arrays, lst.kind
    xp = module_of(kind)
    # Bytes per index along the axis, and each array's share of the message: one value for arrays alike.
    if lst.alike and lst.shape is not None:  # alike: one shape
        unit = [prod(shape_without(lst.shape, axes[0])) * arrays[0].dtype.itemsize] * len(arrays)
    else:
        unit = [prod(shape_without(a.shape, ax)) * a.dtype.itemsize for a, ax in zip(arrays, axes)]
    one_table = table.count(table[0]) == len(table) if table else False  # every rank's arrays of one extent
    if lst.alike and one_table:
        each = [unit[0] * sum(table[0])] * len(arrays)
        total = each[0] * len(arrays)
    else:
        each = [u * sum(t) for u, t in zip(unit, table)]
        total = sum(each)
    groups = buckets(each, c.bucket_bytes, total)
    # One bucket of same-shape arrays along axis 0: the results are the rows of one new array.
    uniform = (
        c.size > 1 and len(groups) == 1 and each[0] > 0 and out is None and lst.alike and axes[0] == 0 and one_table
    )
    if not uniform:
        outs = [
            check_out(o, with_extent(a.shape, ax, sum(t)), a.dtype, a, xp)
            for a, ax, t, o in zip(arrays, axes, table, outs)
        ]
    if c.size == 1:
        for a, o in zip(arrays, outs):
            xp.copyto(o, a)
        return done(outs, async_op, kind)

    def bucket(_: Any, idx: Sequence[int], whole: bool) -> Tuple[str, tuple, Callable[[], None]]:
        if uniform:
            counts = [unit[0] * len(idx) * n for n in table[0]]
        else:
            counts = [sum(unit[i] * table[i][r] for i in idx) for r in range(c.size)]
        pair = scratch(c, sum(counts)) if uniform and kind == "numpy" and not async_op else None
        group = arrays if len(idx) == len(arrays) else [arrays[i] for i in idx]
        send = _send_bytes(group, xp, pair[0][: counts[c.rank]] if pair else None)
        recv = pair[1][: sum(counts)] if pair else xp.empty(sum(counts), _BYTES)
        return "allgatherv", (send, recv, counts), _unpacker(recv, idx, arrays, axes, table, unit, outs, xp, uniform)

    return in_buckets(c, kind, async_op, outs, [(None, range(len(arrays)), groups)], bucket)


def _check_extents(lst: ListOf, axes: List[int], sizes: Tuple[int, ...], c: Any) -> None:
    """Every array's extent along its axis is this rank's ``sizes`` entry (the first that is not raises)."""
    if lst.shape is not None and lst.shape[axes[0]] == sizes[c.rank]:  # one shape: one test
        return
    extents = [s[ax] for s, ax in zip(lst.shapes, axes)]
    if extents.count(sizes[c.rank]) != len(extents):
        i = next(i for i, n in enumerate(extents) if n != sizes[c.rank])
        own_sizes(sizes, c, extents[i], f"x[{i}].shape[{axes[i]}]")


def _table(
    lst: Optional[ListOf],
    axes: List[int],
    sizes: Any,
    c: Any,
    desc: Any,
    what: str,
    err: Optional[HpccollError],
    async_op: bool,
) -> List[Tuple[int, ...]]:
    """Every rank's extent of each array (``table[i][rank]``): agreed in check mode, exchanged, or ``sizes``."""
    local = None if err or not c.check or lst is None else [s[ax] for s, ax in zip(lst.shapes, axes)]
    extents = settle(c, what, desc, local, err, async_op)
    assert lst is not None, "settle raised if the survey failed"
    arrays = lst.arrays
    if extents is None:  # no check mode (or one rank)
        if sizes is not None:
            return [sizes] * len(arrays)  # each array checked against this rank's entry; the ranks' own MPI call agrees
        return (
            exchange_extents(c, arrays, axes, what) if c.size > 1 else [(a.shape[ax],) for a, ax in zip(arrays, axes)]
        )
    table = [tuple(rank_ext[i] for rank_ext in extents) for i in range(len(arrays))]  # every rank's, array by array
    if sizes is not None and any(list(t) != list(sizes) for t in table):
        raise MismatchError(f"{what}: sizes={list(sizes)} but the ranks' extents along the axis are {table}")
    return table


def _send_bytes(arrays: List[Any], xp: Any, into: Any) -> Any:
    """This rank's shards, each C-ordered, one after another, as bytes (packed ``into`` when given)."""
    if into is not None:
        join(arrays, into)
        return into
    parts = [as_wire(flat(a, xp), movement_dtype(a.dtype)).view(_BYTES) for a in arrays]
    return xp.concatenate(parts) if len(parts) > 1 else parts[0]


def _unpacker(
    recv: Any,
    idx: Sequence[int],
    arrays: List[Any],
    axes: List[int],
    table: List[Any],
    unit: List[int],
    outs: List[Any],
    xp: Any,
    uniform: bool,
) -> Callable[[], None]:
    def finish() -> None:
        if uniform:  # rank-major rows of k arrays -> one (k, total, ...) array, in one relayout
            k, first = len(arrays), arrays[0]
            stacked = xp.empty((k, sum(table[0])) + first.shape[1:], first.dtype)
            blocks(recv, stacked.view(_BYTES).reshape(k, sum(table[0]), unit[0]), xp, 1, table[0], to_flat=False)
            outs[:] = stacked
            return
        offset = 0
        starts = [0] * len(arrays)
        for r in range(len(table[idx[0]])):
            for i in idx:
                a, ax, n = arrays[i], axes[i], table[i][r]
                nbytes = unit[i] * n
                wire = movement_dtype(a.dtype)
                piece = recv[offset : offset + nbytes].view(wire).reshape(with_extent(a.shape, ax, n))
                xp.copyto(outs[i].view(wire)[block(ax, starts[i], starts[i] + n)], piece)
                starts[i] += n
                offset += nbytes

    return finish


# --------------------------------------------------------------------------- one array per rank (axis=None)


def all_gather_arrays(x: Any, c: Any, sizes: Any, out: Any, what: str, async_op: bool) -> Any:
    """``hpccoll.all_gather(x, axis=None)``: every rank's ``x`` as it is, a list of ``c.size`` arrays.

    Every rank's shape (any) and dtype (one for all) are exchanged first, in
    one small collective; then the bytes move in one ``allgatherv``, and the
    result is a view of each rank's bytes (``out``: copied into its arrays).
    """
    err: Optional[HpccollError] = None
    kind, xp, outs = "numpy", np, None
    try:
        if sizes is not None:
            raise ArgumentError(f"sizes: expected None with axis=None (the shapes are exchanged); got {sizes!r}")
        if list_types(x) is not None:
            raise ArgumentError(
                f"x: expected one array with axis=None; got a list of {len(x)} arrays (give an axis to gather "
                "the list, or gather each array on its own)"
            )
        if type(out) is str:
            raise ArgumentError(f"out: expected None or a list of {c.size} arrays with axis=None; got {out!r}")
        x, kind, xp = one_array(x)
        outs = _outs_per_rank(out, x, xp, c)
    except HpccollError as e:
        err = e
    shapes = _shapes_of_ranks(x, c, outs, what, err, async_op)
    itemsize = x.dtype.itemsize
    counts = [prod(s) * itemsize for s in shapes]
    if c.size == 1 or not sum(counts):
        if outs is None:
            outs = [x.copy()] if c.size == 1 else [xp.empty(s, x.dtype) for s in shapes]
        elif c.size == 1:
            xp.copyto(outs[0], x)
        return done(outs, async_op, kind)
    send = flat(x, xp).view(_BYTES)
    recv = xp.empty(sum(counts), _BYTES)
    dtype = x.dtype

    def finish() -> List[Any]:
        pieces, start = [], 0
        for shape, n in zip(shapes, counts):
            pieces.append(recv[start : start + n].view(dtype).reshape(shape))
            start += n
        if outs is None:
            return pieces
        for o, piece in zip(outs, pieces):
            xp.copyto(o, piece)
        return outs

    transport = c.transport_of(kind, recv.nbytes, "allgatherv", not async_op)
    return launch(transport, "allgatherv", (send, recv, counts), finish, async_op)


def _outs_per_rank(out: Any, x: Any, xp: Any, c: Any) -> Optional[List[Any]]:
    """``out`` of ``all_gather(axis=None)`` checked as far as this rank knows: ``None``, or one array per rank."""
    if out is None:
        return None
    if type(out) not in (list, tuple) or len(out) != c.size:
        got = f"{type(out).__name__} of length {len(out)}" if type(out) in (list, tuple) else type(out).__name__
        raise ArgumentError(f"out: expected None or a list of {c.size} arrays (one per rank) with axis=None; got {got}")
    outs = list(out)
    for q, o in enumerate(outs):
        shape = x.shape if q == c.rank else getattr(o, "shape", ())
        try:
            check_out(o, shape, x.dtype, x, xp)
        except ArgumentError as e:
            raise ArgumentError(f"out[{q}]:{str(e)[4:]}") from None
    return outs


def _shapes_of_ranks(
    x: Any, c: Any, outs: Optional[List[Any]], what: str, err: Optional[HpccollError], async_op: bool
) -> List[Tuple[int, ...]]:
    """Every rank's ``x.shape``, once every rank's arguments (and its dtype, and ``out``'s shapes) agree."""
    if c.size == 1:
        if err is not None:
            raise err
        shapes = [x.shape]
    elif c.check:
        desc = None if err else all_gather_desc(x, None, None)
        gathered = settle(c, what, desc, None if err else x.shape, err, async_op)
        assert gathered is not None, "settle returns every rank's shape in check mode"
        shapes = [tuple(s) for s in gathered]
        late(c, what, lambda: _check_outs(outs, shapes))
        return shapes
    else:
        signature = hash(tuple(o.shape for o in outs)) if outs is not None else 0
        values = [status_of(err), 0 if err else dtype_code(x.dtype), outs is not None, signature]
        rows = exchange_shapes(c, None if err else x.shape, values, what)
        raise_exchanged([v[0] for _, v in rows], err, what)
        codes = [v[1] for _, v in rows]
        q = odd_one(codes)
        if q is not None:
            names = dtype_names()
            raise MismatchError(
                f"x: expected one dtype on every rank with axis=None; got {names.get(codes[0], 'one dtype')} on "
                f"rank 0 and {names.get(codes[q], 'another')} on rank {q}"
            )
        shapes = [s for s, _ in rows]  # no rank's shape is None: none raised
        bad = [q for q, (_, v) in enumerate(rows) if v[2] and v[3] != hash(tuple(shapes))]
        if bad:
            if c.rank in bad:
                _check_outs(outs, shapes)
            raise ArgumentError(f"out: rank {bad[0]}'s out does not have the ranks' shapes {shapes}")
    _check_outs(outs, shapes)
    return shapes


def _check_outs(outs: Optional[List[Any]], shapes: List[Tuple[int, ...]]) -> None:
    for q, (o, shape) in enumerate(zip(outs or (), shapes)):
        if o.shape != shape:
            raise ArgumentError(f"out[{q}]: expected shape {shape} (rank {q}'s x); got {o.shape}")


# --------------------------------------------------------------------------- the pair's spec


def _configure(comm: Any, keywords: Dict[str, Any]) -> Dict[str, Any]:
    sizes = keywords.get("sizes")
    return {**keywords, "axis": keywords.get("axis", 0), "sizes": None if sizes is None else sizes_of(sizes, comm.size)}


def _bind(meta: Meta, comm: Any, tracing: bool, keywords: Dict[str, Any]) -> Bound:
    k = _configure(comm, keywords)
    ax, sizes, verify = gathered_sizes(meta, comm, k["axis"], k["sizes"], tracing, "all_gather")
    shape = with_extent(tuple(meta.shape), ax, sum(sizes))
    return Bound({**k, "axis": ax, "sizes": sizes}, shape, None, "sum", verify)


#: The all-gather's spec: every rank's extent along ``axis`` learned (or, tracing, assumed) once, so that
#: the adjoint (the reduce-scatter, a sum) splits with the same sizes.
ALL_GATHER = register(Hooks("all_gather", _configure, _bind, "allgatherv", example=lambda size: {"axis": 0}))
