"""The rooted collectives: broadcast, reduce, gather and scatter; one array or a list, blocking or not.

Every path ends in the transport's ``bcast``, ``reduce``, ``gatherv`` or
``scatterv`` (or their ``i`` forms). Every rank passes an array: where only
root's values count (broadcast's and scatter's input), the others' still
give the dtype and the shape the result takes. Where only root receives
(reduce, gather), the other ranks get zeros (reduce) or an array of extent 0
along the axis (gather): the results every rank can hold of a linear map
whose adjoint is the other collective of its pair.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .._arrays import flat, module_of, prod, split_sizes
from .._core.agree import checking, descriptor, late, refuse, settle
from .._core.blocks import ALL, in_place_send, in_place_test, may_share, shape_without, with_extent
from .._core.extents import TRACING, every_rank, extents, gathered_sizes
from .._core.launch import Batch, Ready, done, launch
from .._core.lists import list_types, survey_list, total_bytes
from .._core.validate import axis_of, check_out, one_array, outs_of, own_sizes, plain_out, sizes_of
from .._dtypes import ReducePlan, direct_plan, movement_dtype, normalize_op, reduce_plan, wire_of
from .._errors import ArgumentError, HpccollError, MismatchError
from .._layout import as_wire, blocks, concat, finish_reduction, pack, wire_flat
from .._spec import Bound, Hooks, Meta, register
from ..transports import Selector
from ..transports._control import exchange_extents
from ._engine import Call, Road, agreed, copied, run
from .all_reduce import alone, alone_list, dtype_groups, list_outs

__all__ = ["broadcast", "reduce", "gather", "scatter", "root_of", "BROADCAST", "REDUCE", "GATHER", "SCATTER"]

_ndarray = np.ndarray
_BYTES = np.dtype(np.uint8)


def root_of(root: Any, parts: int) -> int:
    """``root`` checked: a rank of a ``parts``-rank communicator (an int, NumPy's too; not a bool)."""
    if isinstance(root, (int, np.integer)) and not isinstance(root, (bool, np.bool_)) and 0 <= root < parts:
        return int(root)
    got = f"{root!r} ({type(root).__name__})" if not isinstance(root, (int, np.integer)) else repr(root)
    raise ArgumentError(f"root: expected an int rank in [0, {parts}); got {got}")


def _many_of(x: Any) -> Any:
    """The set of array types of a list form's ``x``, or ``None`` for a single array."""
    return None if type(x) is _ndarray else list_types(x)


# --------------------------------------------------------------------------- broadcast


def _plain(x: Any, c: Any, root: Any) -> bool:
    """The common case's test: a non-empty C-contiguous NumPy array, a plain int root, no check mode, P > 1."""
    return (
        not c.check and c.size > 1 and type(root) is int and 0 <= root < c.size and x.flags.c_contiguous and x.size > 0
    )


def broadcast(x: Any, c: Any, root: Any, out: Any, what: str, async_op: bool) -> Any:
    """``hpccoll.broadcast`` (also a list of arrays); ``what`` names the public call in errors."""
    if type(x) is _ndarray:
        if _plain(x, c, root):
            result = _broadcast_common(x, c, root, out, async_op)
            if result is not None:
                return result
    elif (types := list_types(x)) is not None:
        return run(_BROADCAST_MANY, c, what, async_op, x, types, None, root, out)
    return run(_BROADCAST, c, what, async_op, x, root, out)


def _broadcast_common(x: np.ndarray, c: Any, root: int, out: Any, async_op: bool) -> Any:
    """The common case (the general branch's transport call on the same buffers), or ``None``."""
    wire = wire_of(x.dtype)
    if wire is None:
        return None
    if out is x:
        if not x.flags.writeable:
            return None
    elif out is None:
        out = np.empty(x.shape, x.dtype)
    elif not plain_out(out, x.shape, x.dtype) or may_share(out, x):
        return None
    t = c.transport_of("numpy", x.nbytes, "bcast", not async_op)
    copy = c.rank == root and out is not x
    if copy and not x.flags.writeable:
        np.copyto(out, x)  # a read-only x: root sends its copy
        copy = False
    # root sends straight from x, then copies it (a transport's default bcast may write root's own values
    # back: only into a writeable x), or copies it while host MPI sends it
    buf = wire_flat(x if copy else out, wire)
    if async_op:
        return _bcast(c, t, buf, root, _copier(out, x, np) if copy else Ready(out), True)
    if x.nbytes < Selector.OVERLAP_BYTES or not c.selector.overlaps(t, x.nbytes, copy):  # the first spares a frame
        t.bcast(buf, root)  # the transport's call itself, no frames between
        if copy:
            out[...] = x  # out has x's shape and dtype: assignment is the cheapest copy (docs/benchmarks.md)
        return out
    pending = t.ibcast(buf, root)  # _bcast's overlapped form: root's copy is all that runs before the wait
    if copy:
        np.copyto(out, x)
    pending.wait()
    return out


def _bcast(c: Any, t: Any, buf: Any, root: int, finish: Callable[[], Any], async_op: bool, early: bool = False) -> Any:
    """Every broadcast's transport call but the common road's blocking ones, in the form every rank makes.

    Blocking where the selector overlaps it (:meth:`~hpccoll.transports.Selector.overlaps`), it is the
    non-blocking call waited on, and an ``early`` ``finish`` (one that reads nothing that arrives: root's
    copy of ``x`` into ``out``) runs while the message travels. The common
    road (:func:`_broadcast_common`) makes the same choice inline, so a rank
    on either road makes the form the others make, whatever its layout.
    """
    if async_op or not c.selector.overlaps(t, buf.nbytes, early):
        return launch(t, "bcast", (buf, root), finish, async_op)
    pending = t.ibcast(buf, root)
    if not early:
        pending.wait()
        return finish()
    result = finish()
    pending.wait()
    return result


def _copier(out: Any, x: Any, xp: Any) -> Callable[[], Any]:
    """A finishing step that copies ``x`` into ``out``; ``out``."""

    def copy() -> Any:
        xp.copyto(out, x)
        return out

    return copy


def _check_broadcast(c: Any, async_op: bool, x: Any, root: Any, out: Any) -> Call:
    x, kind, xp = one_array(x)
    r = root_of(root, c.size)
    out = check_out(out, x.shape, x.dtype, x, xp, in_place_test(x, ALL))
    desc = descriptor("broadcast", dtype=x.dtype.name, shape=x.shape, root=r) if c.check else None
    return Call(x, kind, xp, out, x.nbytes, desc, root=r)


def _alone(a: Call) -> Any:
    return _copied(a.out, a.x, a.xp)


def _move_broadcast(a: Call, c: Any, transport: Any, async_op: bool) -> Any:
    x, xp, out, r = a.x, a.xp, a.out, a.root
    wire = movement_dtype(x.dtype)
    mine = c.rank == r
    if mine and out is not x and x.flags.c_contiguous and getattr(x.flags, "writeable", True):
        # root sends straight from x, then copies it (a transport's default bcast may write root's own
        # values back: only into a writeable x)
        return _bcast(c, transport, as_wire(flat(x, xp), wire), r, _copier(out, x, xp), async_op, early=True)
    if out.flags.c_contiguous:
        if mine and out is not x:
            xp.copyto(out, x)
        return _bcast(c, transport, wire_flat(out, wire), r, Ready(out), async_op)
    buf = as_wire(flat(x, xp), wire).copy() if mine else xp.empty(x.size, wire)

    def finish() -> Any:
        xp.copyto(out, as_wire(buf, x.dtype).reshape(out.shape))
        return out

    return _bcast(c, transport, buf, r, finish, async_op)


_BROADCAST = Road(_check_broadcast, _alone, _move_broadcast, "bcast", alone_empty=True)


def _check_list(c: Any, async_op: bool, xs: Any, types: Any, op: Any, root: Any, out: Any) -> Call:
    """A list of a broadcast (``op`` ``None``) or a reduce, checked."""
    lst = survey_list(xs, types, async_op)
    arrays, kind = lst.arrays, lst.kind
    if op is not None:
        op = normalize_op(op)
        for dtype in lst.dtypes:
            reduce_plan(dtype, op)  # raises for an unsupported (dtype, op) before any communication
    r = root_of(root, c.size)
    if op is None:
        outs = list_outs(arrays, out, kind)
    else:  # every rank's results are arrays (zeros off the root)
        outs = [
            check_out(o, a.shape, a.dtype, a, module_of(kind), in_place_test(a, ALL))
            for a, o in zip(arrays, outs_of(out, len(arrays)))
        ]
    desc = None
    if c.check:
        fields = {"root": r, "arrays": [(a.dtype.name, a.shape) for a in arrays]}
        desc = descriptor("broadcast", **fields) if op is None else descriptor("reduce", op=op, **fields)
    return Call(lst, kind, module_of(kind), outs, total_bytes(lst), desc, op, root=r)


def _move_broadcast_many(call: Call, c: Any, transport: Any, async_op: bool) -> Any:
    """A list: every array's bytes in one buffer, one broadcast, the results views of what arrived."""
    arrays, outs, xp, r, total = call.x.arrays, call.out, call.xp, call.root, call.nbytes
    mine = c.rank == r
    buf = xp.empty(total, _BYTES)
    if mine:
        offset = 0
        for a in arrays:
            buf[offset : offset + a.nbytes] = as_wire(flat(a, xp), movement_dtype(a.dtype)).view(_BYTES)
            offset += a.nbytes

    def finish() -> List[Any]:
        results, offset = [], 0
        for a, o in zip(arrays, outs):
            piece = buf[offset : offset + a.nbytes].view(movement_dtype(a.dtype)).view(a.dtype).reshape(a.shape)
            offset += a.nbytes
            results.append(piece if o is None else _copied(o, piece, xp))
        return results

    return _bcast(c, transport, buf, r, finish, async_op)


_BROADCAST_MANY = Road(
    _check_list,
    lambda a: [x.copy() if o is None else _copied(o, x, a.xp) for x, o in zip(a.x.arrays, a.out)],
    _move_broadcast_many,
    "bcast",
)


def _copied(out: Any, a: Any, xp: Any) -> Any:
    if out is not a:
        xp.copyto(out, a)
    return out


# --------------------------------------------------------------------------- reduce


def reduce(x: Any, c: Any, op: Any, root: Any, out: Any, what: str, async_op: bool) -> Any:
    """``hpccoll.reduce`` (also a list of arrays); ``what`` names the public call in errors."""
    if type(x) is _ndarray:
        if type(op) is str and _plain(x, c, root):
            result = _reduce_common(x, c, op, root, out, async_op)
            if result is not None:
                return result
    elif (types := list_types(x)) is not None:
        return run(_REDUCE_MANY, c, what, async_op, x, types, op, root, out)
    return run(_REDUCE, c, what, async_op, x, op, root, out)


def _reduce_common(x: np.ndarray, c: Any, op: str, root: int, out: Any, async_op: bool) -> Any:
    """The common case (the general branch's transport call on the same buffers), or ``None``.

    Without ``out``, a non-root rank's result is a fresh array of zeros (pages the kernel zeroes when
    first touched: no pass over memory here) and MPI gets a scratch receive buffer it never writes.
    """
    t = c.transport_of("numpy", x.nbytes, "reduce", not async_op)
    plan = direct_plan(x.dtype, op, t)
    if plan is None:
        return None
    wire, mine = plan.wire, c.rank == root
    zero = not mine
    if out is None:
        if mine:
            out = np.empty(x.shape, x.dtype)
            recv = wire_flat(out, wire)
        else:
            out, zero = np.zeros(x.shape, x.dtype), False
            recv = np.empty(x.size, wire)
        send = wire_flat(x, wire)
    elif out is x and x.flags.writeable:
        send, recv = None, wire_flat(x, wire)
    elif plain_out(out, x.shape, x.dtype) and not may_share(out, x):
        send, recv = wire_flat(x, wire), wire_flat(out, wire)
    else:
        return None
    if async_op or plan.divide:
        return launch(
            t, "reduce", (send, recv, plan.op, root), _reduced(recv, out, plan, c.size, mine, True, np, zero), async_op
        )
    t.reduce(send, recv, plan.op, root)
    if zero:
        out.fill(0)
    return out


def _check_reduce(c: Any, async_op: bool, x: Any, op: Any, root: Any, out: Any) -> Call:
    x, kind, xp = one_array(x)
    op = normalize_op(op)
    reduce_plan(x.dtype, op)  # raises for an unsupported (dtype, op) before any communication
    r = root_of(root, c.size)
    out = check_out(out, x.shape, x.dtype, x, xp, in_place_test(x, ALL))
    desc = descriptor("reduce", dtype=x.dtype.name, shape=x.shape, op=op, root=r) if c.check else None
    return Call(x, kind, xp, out, x.nbytes, desc, op, root=r)


def _move_reduce(a: Call, c: Any, transport: Any, async_op: bool) -> Any:
    x, xp, out, op, r = a.x, a.xp, a.out, a.op, a.root
    plan = reduce_plan(x.dtype, op, transport.native_reduce, transport.saturates, transport.reduce_ops)
    mine = c.rank == r
    direct = not plan.widen and out.flags.c_contiguous
    send, in_place = in_place_send(x, out, xp, ALL, direct)  # the contract's reduce takes send=None everywhere
    recv = as_wire(flat(out, xp), plan.wire) if direct else xp.empty(x.size, plan.wire)
    if not in_place:
        send = flat(send, xp)
        send = send.astype(plan.wire) if plan.widen else as_wire(send, plan.wire)
    return launch(
        transport,
        "reduce",
        (None if in_place else send, recv, plan.op, r),
        _reduced(recv, out, plan, c.size, mine, direct, xp),
        async_op,
    )


_REDUCE = Road(_check_reduce, alone, _move_reduce, "reduce", alone_empty=True)


def _reduced(
    recv: Any, out: Any, plan: ReducePlan, parts: int, mine: bool, direct: bool, xp: Any, zero: bool = True
) -> Callable[[], Any]:
    """The finishing step: root's ``avg`` divided and stored once; zeros elsewhere (``zero``: ``out`` is
    filled; else it is zeros already)."""

    def finish() -> Any:
        if not mine:
            if zero:
                out.fill(0)
            return out
        finish_reduction(recv, parts, plan.divide, widen=plan.widen, out=None if direct else out, xp=xp)
        return out

    return finish


def _move_reduce_many(a: Call, c: Any, transport: Any, async_op: bool) -> Any:
    """A list: one reduce per dtype (the arrays of a dtype packed in one buffer)."""
    lst, outs, xp, op, r = a.x, a.out, a.xp, a.op, a.root
    arrays, kind = lst.arrays, lst.kind
    mine = c.rank == r
    batch = Batch(c, kind, async_op)
    for dtype, members in dtype_groups(arrays, lst.dtypes).items():
        plan = reduce_plan(dtype, op, transport.native_reduce, transport.saturates, transport.reduce_ops)
        send = concat([arrays[i] for i in members], plan.wire, plan.widen, xp)
        recv = xp.empty(send.size, plan.wire)
        batch.start("reduce", (send, recv, plan.op, r), _unpacker(recv, members, arrays, outs, plan, c.size, mine, xp))
    return batch.finish(outs)


_REDUCE_MANY = Road(_check_list, alone_list, _move_reduce_many)


def _unpacker(
    recv: Any,
    members: Sequence[int],
    arrays: List[Any],
    outs: List[Any],
    plan: ReducePlan,
    parts: int,
    mine: bool,
    xp: Any,
) -> Callable[[], None]:
    def finish() -> None:
        if mine:
            finish_reduction(recv, parts, plan.divide)
        offset = 0
        for i in members:
            a, o = arrays[i], outs[i]
            if not mine:
                o.fill(0)
                continue
            piece = recv[offset : offset + a.size]
            offset += a.size
            finish_reduction(piece, parts, False, widen=plan.widen, out=o, xp=xp)

    return finish


# --------------------------------------------------------------------------- gather and scatter


def gather(x: Any, c: Any, root: Any, axis: Any, sizes: Any, out: Any, what: str, async_op: bool) -> Any:
    """``hpccoll.gather`` (also a list of arrays); ``what`` names the public call in errors."""
    if (types := _many_of(x)) is not None:
        return _per_array(_GATHER, _gather_step, x, types, c, root, axis, sizes, out, what, async_op)
    return run(_GATHER, c, what, async_op, x, root, axis, sizes, out)


def scatter(x: Any, c: Any, root: Any, axis: Any, sizes: Any, out: Any, what: str, async_op: bool) -> Any:
    """``hpccoll.scatter`` (also a list of arrays); ``what`` names the public call in errors."""
    if (types := _many_of(x)) is not None:
        return _per_array(_SCATTER, _scatter_step, x, types, c, root, axis, sizes, out, what, async_op)
    return run(_SCATTER, c, what, async_op, x, root, axis, sizes, out)


Step = Tuple[str, tuple, Callable[[], Any]]


def _launched(step: Callable[[Call, Any], Step]) -> Callable[[Call, Any, Any, bool], Any]:
    """The engine's ``move`` of a gather or scatter: ``step``'s transport call, launched."""
    return lambda a, c, transport, async_op: launch(transport, *step(a, c), async_op)


def _known(a: Call, sizes: Sequence[int], out: Any) -> Call:
    """``a`` with its extents known; its message size every rank computes alike: the whole gathered (scattered) array."""
    return a._replace(
        sizes=tuple(sizes), out=out, nbytes=sum(sizes) * prod(with_extent(a.x.shape, a.ax, 1)) * a.x.itemsize
    )


def _check_rooted(collective: str, c: Any, x: Any, root: Any, axis: Any, sizes: Any, out: Any) -> Call:
    """A gather's or scatter's own arguments checked (``sizes`` as given; the out once they are known)."""
    x, kind, xp = one_array(x)
    r = root_of(root, c.size)
    return Call(x, kind, xp, out, 0, None, None, axis_of(axis, x.ndim), sizes, r, collective)


def _check_gather(c: Any, async_op: bool, *args: Any) -> Call:
    a = _check_rooted("gather", c, *args)
    if a.sizes is None:
        return a
    sizes = own_sizes(a.sizes, c, a.x.shape[a.ax], f"x.shape[{a.ax}]")
    return a._replace(sizes=sizes, out=_out(a, sizes, c.rank))


def _agree(a: Optional[Call], c: Any, what: str, err: Optional[HpccollError], async_op: bool) -> Call:
    """Agree in check mode, learn the extents when ``sizes`` is None (a gather's every rank's, a scatter's root's)."""
    if checking(c):
        desc = None if a is None else _desc(a.extra, a.x, a.ax, a.root, a.sizes)
        extents = settle(c, what, desc, None if a is None else a.x.shape[a.ax], err, async_op)
        assert a is not None and extents is not None, "settle raised, or returns every rank's extent"
        if a.sizes is None:
            sizes = tuple(extents) if a.extra == "gather" else split_sizes(extents[a.root], c.size)
            return _known(a, sizes, late(c, what, lambda: _out(a, sizes, c.rank)))
        if a.extra == "gather" and list(a.sizes) != extents:
            raise MismatchError(f"{what}: sizes={list(a.sizes)} but the ranks' extents along axis {a.ax} are {extents}")
    elif err is not None:
        raise err
    assert a is not None
    if a.sizes is None:
        ranks = exchange_extents(c, (a.x,), (a.ax,), what)[0] if c.size > 1 else (a.x.shape[a.ax],)
        sizes = ranks if a.extra == "gather" else split_sizes(ranks[a.root], c.size)
        return _known(a, sizes, _out(a, sizes, c.rank))
    return _known(a, a.sizes, a.out)


def _desc(collective: str, x: Any, ax: int, r: int, sizes: Any) -> Dict[str, Any]:
    """Check mode's descriptor of a gather or scatter: what every rank must pass alike."""
    return descriptor(collective, dtype=x.dtype.name, shape=shape_without(x.shape, ax), axis=ax, root=r, sizes=sizes)


def _out(a: Call, sizes: Sequence[int], rank: int) -> Any:
    """``out`` checked (or allocated): a gather's concatenation at root (extent 0 along the axis elsewhere), a
    scatter's block of root's array."""
    extent = (sum(sizes) if rank == a.root else 0) if a.extra == "gather" else sizes[rank]
    return check_out(a.out, with_extent(a.x.shape, a.ax, extent), a.x.dtype, a.x, a.xp)


def _gather_step(a: Call, c: Any) -> Step:
    """The transport call of a gather, and its finishing step."""
    x, xp, out, r = a.x, a.xp, a.out, a.root
    lead, inner = prod(x.shape[: a.ax]), prod(x.shape[a.ax + 1 :])
    counts = [s * lead * inner for s in a.sizes]
    wire = movement_dtype(x.dtype)
    send = as_wire(flat(x, xp), wire)
    if c.rank != r:
        return "gatherv", (send, None, counts, r), Ready(out)
    if lead == 1 and out.flags.c_contiguous:
        return "gatherv", (send, as_wire(flat(out, xp), wire), counts, r), Ready(out)
    recv = xp.empty(sum(counts), wire)

    def finish() -> Any:
        blocks(as_wire(recv, x.dtype), out, xp, a.ax, a.sizes, to_flat=False)
        return out

    return "gatherv", (send, recv, counts, r), finish


_GATHER = Road(_check_gather, copied, _launched(_gather_step), "gatherv", _agree)


def _check_scatter(c: Any, async_op: bool, *args: Any) -> Call:
    a = _check_rooted("scatter", c, *args)
    if a.sizes is None:
        return a
    x, ax, r = a.x, a.ax, a.root
    sizes = sizes_of(a.sizes, c.size)
    if c.rank == r and sum(sizes) != x.shape[ax]:
        raise ArgumentError(
            f"sizes: expected a sum of x.shape[{ax}] == {x.shape[ax]} on the root (rank {r}); "
            f"got {list(sizes)}, summing to {sum(sizes)}"
        )
    return a._replace(sizes=sizes, out=_out(a, sizes, c.rank))


def _scatter_step(a: Call, c: Any) -> Step:
    """The transport call of a scatter, and its finishing step."""
    x, xp, out, r = a.x, a.xp, a.out, a.root
    lead, inner = prod(x.shape[: a.ax]), prod(x.shape[a.ax + 1 :])
    counts = [s * lead * inner for s in a.sizes]
    wire = movement_dtype(x.dtype)
    send = pack(x, xp, a.ax, a.sizes, wire, False) if c.rank == r else None
    if out.flags.c_contiguous:
        return "scatterv", (send, as_wire(flat(out, xp), wire), counts, r), Ready(out)
    recv = xp.empty(counts[c.rank], wire)

    def finish() -> Any:
        xp.copyto(out, as_wire(recv, x.dtype).reshape(out.shape))
        return out

    return "scatterv", (send, recv, counts, r), finish


_SCATTER = Road(_check_scatter, copied, _launched(_scatter_step), "scatterv", _agree)


def _per_array(
    road: Road,
    step: Callable[[Call, Any], Step],
    xs: Any,
    types: Any,
    c: Any,
    root: Any,
    axis: Any,
    sizes: Any,
    out: Any,
    what: str,
    async_op: bool,
) -> Any:
    """A list of gathers or scatters: one transport call per array, started together, finished together.

    ``sizes`` is ``None`` or one entry per array (each ``None`` or that
    array's sizes); ``out`` likewise.
    """
    err = None
    arrays: List[Any] = []
    outs: List[Any] = []
    per: List[Any] = []
    kind = "numpy"
    try:
        lst = survey_list(xs, types, async_op)
        arrays, kind = lst.arrays, lst.kind
        outs = outs_of(out, len(arrays))
        per = [None] * len(arrays) if sizes is None else _sizes_per_array(sizes, len(arrays))
    except HpccollError as e:
        err = e
    if err is not None:
        refuse(c, what, err)
    items = [agreed(road, c, what, async_op, a, root, axis, s, o) for a, s, o in zip(arrays, per, outs)]
    if c.size == 1:
        return done([copied(a) for a in items], async_op, kind)
    batch = Batch(c, kind, async_op)
    for a in items:
        batch.start(*step(a, c))
    return batch.finish([a.out for a in items])


def _sizes_per_array(sizes: Any, n: int) -> List[Any]:
    if type(sizes) not in (list, tuple) or len(sizes) != n:
        got = f"{type(sizes).__name__} of length {len(sizes)}" if type(sizes) in (list, tuple) else repr(sizes)
        raise ArgumentError(f"sizes: expected None or a list of {n} entries (one per input array); got {got}")
    return list(sizes)


# --------------------------------------------------------------------------- the pairs' specs


def _configure(comm: Any, keywords: Dict[str, Any]) -> Dict[str, Any]:
    """``root`` checked (every rooted pair's), and ``sizes`` where given."""
    k = {**keywords, "root": root_of(keywords.get("root", 0), comm.size)}
    if k.get("sizes") is not None:
        k["sizes"] = sizes_of(k["sizes"], comm.size)
    return k


def _configure_reduce(comm: Any, keywords: Dict[str, Any]) -> Dict[str, Any]:
    return {**_configure(comm, keywords), "op": keywords.get("op", "sum")}


def _bind_broadcast(meta: Meta, comm: Any, tracing: bool, keywords: Dict[str, Any]) -> Bound:
    return Bound(_configure(comm, keywords), tuple(meta.shape))


def _bind_reduce(meta: Meta, comm: Any, tracing: bool, keywords: Dict[str, Any]) -> Bound:
    k = _configure_reduce(comm, keywords)
    return Bound(k, tuple(meta.shape), k["op"], k["op"])


def _bind_gather(meta: Meta, comm: Any, tracing: bool, keywords: Dict[str, Any]) -> Bound:
    """Every rank's extent learned (or, tracing, assumed) once, for the adjoint's scatter; empty off root."""
    k = _configure(comm, keywords)
    ax, sizes, verify = gathered_sizes(meta, comm, k.get("axis", 0), k.get("sizes"), tracing, "gather")
    shape = with_extent(tuple(meta.shape), ax, sum(sizes) if comm.rank == k["root"] else 0)
    return Bound({**k, "axis": ax, "sizes": sizes}, shape, verify=verify)


def _bind_scatter(meta: Meta, comm: Any, tracing: bool, keywords: Dict[str, Any]) -> Bound:
    """The blocks' extents resolved (``sizes=None``: root's extent split like ``numpy.array_split``, learned with
    one small exchange, or, tracing, taken to be this rank's); off root the adjoint gives zeros of the input's
    extent, where the gather gives an empty array (the scatter does not depend on those values)."""
    k = _configure(comm, keywords)
    r, ax = k["root"], axis_of(k.get("axis", 0), meta.ndim)
    n, verify = int(meta.shape[ax]), None
    if k.get("sizes") is not None:
        sizes = k["sizes"]
    elif not tracing:
        sizes = split_sizes(extents(comm, meta, ax, "scatter")[r], comm.size)
    else:
        sizes, verify = split_sizes(n, comm.size), _same_extents(comm, n, r, ax)
    zeros = None if comm.rank == r or n == 0 else functools.partial(_zeros_as, axis=ax, extent=n)
    keywords = {**k, "axis": ax, "sizes": sizes}
    return Bound(keywords, with_extent(tuple(meta.shape), ax, sizes[comm.rank]), verify=verify, adjoint_as=zeros)


def _same_extents(c: Any, n: int, root: int, ax: int) -> Any:
    """The check that root's extent along ``ax`` is this rank's ``n``, as assumed while tracing (None at one rank)."""

    def verify() -> None:
        found = [row[0] for row in every_rank(c, (n,), "scatter")]
        if len(set(found)) > 1:  # every rank holds the same table: the same verdict and message everywhere
            raise MismatchError(
                f"scatter: expected every rank's extent along axis {ax} to be root {root}'s with sizes=None "
                f"{TRACING}; got extents {found}: pass sizes={list(split_sizes(found[root], c.size))}"
            )

    return verify if c.size > 1 else None


def _zeros_as(adjoint: Callable[..., Any], *, axis: int, extent: int) -> Callable[..., Any]:
    """``adjoint`` (the gather to root) on a rank other than root, whose input had ``extent`` along ``axis``."""
    return functools.partial(_gather_as, adjoint=adjoint, axis=axis, extent=extent)


def _gather_as(y: Any, *, adjoint: Callable[..., Any], axis: int, extent: int, out: Any = None) -> Any:
    """``adjoint(y)`` (empty off root) as zeros of ``extent`` along ``axis``, the cotangent's shape a framework
    requires; ``axis`` is passed on (a framework batching the call moves it)."""
    got = adjoint(y, axis=axis)
    shape = with_extent(tuple(got.shape), axis, extent)
    if out is None:
        return np.zeros_like(got, shape=shape)  # NumPy or CuPy, as got (__array_function__)
    out[...] = 0
    return out


def _example(size: int) -> Dict[str, Any]:
    return {"root": 0}


#: The rooted pairs' specs: ``root`` checked; the gather's and scatter's extents resolved once for their adjoints.
BROADCAST = register(Hooks("broadcast", _configure, _bind_broadcast, "bcast", example=_example))
REDUCE = register(Hooks("reduce", _configure_reduce, _bind_reduce, "reduce", example=_example))
GATHER = register(Hooks("gather", _configure, _bind_gather, "gatherv", example=_example))
SCATTER = register(Hooks("scatter", _configure, _bind_scatter, "scatterv", example=_example))
