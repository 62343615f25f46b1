"""all-reduce: one array, a list of arrays, blocking or not; and the replicated-cotangent adjoint.

Every path ends in the transport's ``allreduce`` (or ``iallreduce``). The
first branch of :func:`all_reduce` takes the common case -- a C-contiguous
NumPy array whose (dtype, op) the transport reduces natively, ``out`` absent,
separate or ``x`` itself, no check mode -- with as few Python operations as
it can; anything else takes the general branch, which validates everything
and raises the errors.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Mapping, Sequence, Set, Tuple

import numpy as np

from .._arrays import check_list_items, flat, module_of
from .._core.agree import all_reduce_desc, all_reduce_list_desc, checking, replicated_desc, settle
from .._core.blocks import ALL, in_place_send, in_place_test, may_share
from .._core.launch import Ready, done, launch, scratch
from .._core.lists import is_array_list, list_types, survey_list, total_bytes
from .._core.validate import check_out, cotangent_of, one_array, outs_of, plain_out
from .._dtypes import ReducePlan, direct_plan, normalize_op, reduce_plan, truth_valued
from .._errors import HpccollError
from .._layout import as_wire, buckets, concat, finish_reduction, wire_flat
from .._spec import Bound, Hooks, Meta, register
from ._engine import Call, Road, in_buckets, run

__all__ = [
    "all_reduce",
    "replicated_adjoint",
    "into",
    "finisher",
    "copy_into",
    "alone",
    "alone_list",
    "dtype_groups",
    "plan_groups",
    "list_outs",
    "ALL_REDUCE",
]

_ndarray = np.ndarray


def all_reduce(x: Any, c: Any, op: Any, out: Any, what: str, async_op: bool) -> Any:
    """``hpccoll.all_reduce`` (also a list of arrays); ``what`` names the public call in errors."""
    if type(x) is _ndarray:
        if not c.check and c.size > 1 and x.size and type(op) is str and x.flags.c_contiguous:
            result = _common(x, c, op, out, async_op)
            if result is not None:
                return result
    elif (types := list_types(x)) is not None:
        return _many(x, types, c, op, out, what, async_op)
    return _one(x, c, op, out, what, async_op)


def _common(x: np.ndarray, c: Any, op: str, out: Any, async_op: bool) -> Any:
    """The common case, or ``None`` when the general branch must decide."""
    t = c.transport_of("numpy", x.nbytes, "allreduce", not async_op)
    plan = direct_plan(x.dtype, op, t)
    if plan is None:
        return None
    wire = plan.wire
    if out is None:
        out = np.empty(x.shape, x.dtype)
        send = wire_flat(x, wire)
    elif out is x and x.flags.writeable:  # in place; another view of all of x is the general branch's
        send = None
    elif plain_out(out, x.shape, x.dtype) and not may_share(out, x):
        send = wire_flat(x, wire)
    else:
        return None
    recv = wire_flat(out, wire)
    if async_op or plan.divide:
        return launch(t, "allreduce", (send, recv, plan.op), finisher(recv, out, plan, c.size), async_op)
    t.allreduce(send, recv, plan.op)
    return out


def finisher(recv: Any, out: Any, plan: ReducePlan, parts: int) -> Callable[[], Any]:
    """The finishing step of a reduction whose ``recv`` is a wire view of ``out`` (:func:`finish_reduction`); ``out``."""
    if not plan.divide:
        return Ready(out)

    def finish() -> Any:
        finish_reduction(recv, parts, True)
        return out

    return finish


def _one(x: Any, c: Any, op: Any, out: Any, what: str, async_op: bool) -> Any:
    return run(_ONE, c, what, async_op, x, op, out)


def _check(c: Any, async_op: bool, x: Any, op: Any, out: Any) -> Call:
    x, kind, xp = one_array(x)
    op = normalize_op(op)
    reduce_plan(x.dtype, op)  # raises for unsupported (dtype, op) before any communication
    out = check_out(out, x.shape, x.dtype, x, xp, in_place_test(x, ALL))
    return Call(x, kind, xp, out, x.nbytes, all_reduce_desc(x, op) if c.check else None, op)


def alone(a: Call) -> Any:
    """The one-rank result of a reduction: ``x`` (its truth values for a logical op) in ``out``, or a copy."""
    return copy_into(a.out, a.x, a.op)


def _move(a: Call, c: Any, transport: Any, async_op: bool) -> Any:
    plan = reduce_plan(a.x.dtype, a.op, transport.native_reduce, transport.saturates, transport.reduce_ops)
    out, xp = a.out, a.xp
    # allreduce always has the in-place form (Transport.allreduce: send None), when the buffers allow it
    x, in_place = in_place_send(a.x, out, xp, ALL, not plan.widen and out.flags.c_contiguous)
    if in_place:
        recv = as_wire(flat(out, xp), plan.wire)
        return launch(transport, "allreduce", (None, recv, plan.op), finisher(recv, out, plan, c.size), async_op)
    send = flat(x, xp)
    send = send.astype(plan.wire) if plan.widen else as_wire(send, plan.wire)
    return into(transport, plan, send, out, xp, None, c.size, async_op)


_ONE = Road(_check, alone, _move, "allreduce")


def into(
    transport: Any, plan: ReducePlan, send: Any, out: Any, xp: Any, counts: Any, parts: int, async_op: bool
) -> Any:
    """Reduce-scatter (``counts``) or all-reduce (``None``) from ``send`` into ``out``; return ``out``."""
    # An empty out may point into the input (an empty block of x): MPI would see aliased buffers.
    direct = not plan.widen and out.flags.c_contiguous and out.size > 0
    recv = as_wire(flat(out, xp), plan.wire) if direct else xp.empty(out.size, plan.wire)

    def finish() -> Any:
        finish_reduction(recv, parts, plan.divide, widen=plan.widen, out=None if direct else out, xp=xp)
        return out

    # Where the transport writes the result in place, nothing is left to finish.
    step: Callable[[], Any] = Ready(out) if direct and not plan.divide else finish
    if counts is None:
        return launch(transport, "allreduce", (send, recv, plan.op), step, async_op)
    return launch(transport, "reduce_scatter", (send, recv, counts, plan.op), step, async_op)


# --------------------------------------------------------------------------- lists


def _many(xs: Any, types: Set[type], c: Any, op: Any, out: Any, what: str, async_op: bool) -> Any:
    return run(_MANY, c, what, async_op, xs, types, op, out)


def _check_list(c: Any, async_op: bool, xs: Any, types: Set[type], op: Any, out: Any) -> Call:
    lst = survey_list(xs, types, async_op)
    op = normalize_op(op)
    for dtype in lst.dtypes:
        reduce_plan(dtype, op)  # raises for unsupported (dtype, op) before any communication
    outs = None if out is None else list_outs(lst.arrays, out, lst.kind)
    desc = all_reduce_list_desc(lst.arrays, op) if c.check else None
    return Call(lst, lst.kind, module_of(lst.kind), outs, total_bytes(lst), desc, op)


def dtype_groups(arrays: List[Any], dtypes: Set[np.dtype]) -> Mapping[np.dtype, Sequence[int]]:
    """The positions of the arrays of each dtype, in order: one group per dtype (never per plan: bool and
    uint8 share one, but not their results' dtype)."""
    if len(dtypes) == 1:  # one dtype: one group, in order
        return {next(iter(dtypes)): range(len(arrays))}
    by_dtype: Dict[np.dtype, List[int]] = {}
    for i, a in enumerate(arrays):
        by_dtype.setdefault(a.dtype, []).append(i)
    return by_dtype


def alone_list(a: Call) -> Any:
    """The one-rank result of a list's reduction (:func:`alone`, array by array)."""
    return [copy_into(o, x, a.op) for x, o in zip(a.x.arrays, a.out or [None] * len(a.x.arrays))]


def plan_groups(a: Call, transport: Any, limit: int) -> Iterator[Tuple[ReducePlan, Sequence[int], List[range]]]:
    """A checked list's groups for :func:`in_buckets`: each dtype's plan on ``transport``, its arrays, their buckets
    of at most ``limit`` bytes on the wire."""
    lst = a.x
    arrays = lst.arrays
    for dtype, members in dtype_groups(arrays, lst.dtypes).items():
        plan = reduce_plan(dtype, a.op, transport.native_reduce, transport.saturates, transport.reduce_ops)
        if lst.shape is not None:  # one shape: one size
            each = arrays[0].size * plan.wire.itemsize
            yield plan, members, buckets([each] * len(members), limit, each * len(members))
        else:
            yield plan, members, buckets([arrays[i].size * plan.wire.itemsize for i in members], limit)


def _move_list(a: Call, c: Any, transport: Any, async_op: bool) -> Any:
    lst, outs, xp, total = a.x, a.out, a.xp, a.nbytes
    arrays = lst.arrays
    n = len(arrays)

    def bucket(plan: ReducePlan, idx: Sequence[int], whole: bool) -> Tuple[str, tuple, Callable[[], None]]:
        # No out, one bucket of all arrays, one shape (>= 1-D): the results are the rows of the received buffer.
        rows = outs is None and whole and bool(lst.shape) and not plan.widen
        # One bucket of NumPy arrays moving blocking: pack and move in the communicator's scratch buffers.
        pair = (
            scratch(c, total) if whole and lst.kind == "numpy" and not async_op and not plan.widen and total else None
        )
        group = arrays if len(idx) == n else [arrays[i] for i in idx]
        send = concat(group, plan.wire, plan.widen, xp, pair[0][:total] if pair else None)
        recv = pair[1][:total].view(plan.wire) if pair else xp.empty(send.size, plan.wire)

        def finish() -> None:
            buf = finish_reduction(recv, c.size, plan.divide)
            if pair is not None:
                buf = buf.copy()  # the results' own memory (a copy is cheaper than MPI writing to fresh pages)
            if rows:  # one shape: the rows of a stack, at C speed
                results[:] = as_wire(buf, arrays[0].dtype).reshape((len(arrays),) + arrays[0].shape)
                return
            offset = 0
            for i in idx:
                x = arrays[i]
                piece = buf[offset : offset + x.size]
                offset += x.size
                if x.ndim != 1:
                    piece = piece.reshape(x.shape)
                # out[i], or (a view into this bucket's fresh buffer, unless widened) the piece as a's dtype
                o = outs[i] if outs is not None else None
                results[i] = finish_reduction(piece, c.size, False, widen=plan.widen, out=o, dtype=x.dtype, xp=xp)

        return "allreduce", (send, recv, plan.op), finish

    results: List[Any] = [None] * n  # the rows of one received buffer, or filled array by array
    return in_buckets(c, lst.kind, async_op, results, plan_groups(a, transport, c.bucket_bytes), bucket)


_MANY = Road(_check_list, alone_list, _move_list)


def list_outs(arrays: List[Any], out: Any, kind: str) -> List[Any]:
    """A list form's ``out`` checked array by array (``None`` entries kept; an entry may be its array: in place)."""
    xp = module_of(kind)
    return [
        check_out(o, a.shape, a.dtype, a, xp, in_place_test(a, ALL)) if o is not None else None
        for a, o in zip(arrays, outs_of(out, len(arrays)))
    ]


def copy_into(out: Any, x: Any, op: str) -> Any:
    """The reduction of ``x`` over one rank, into ``out`` (or a copy)."""
    if truth_valued(x.dtype, op):
        x = x.astype(np.bool_).astype(x.dtype)
    if out is None:
        return x.copy()
    if out is not x:
        out[...] = x
    return out


# --------------------------------------------------------------------------- the replicated adjoint


def replicated_adjoint(y: Any, c: Any, op: str, out: Any, async_op: bool) -> Any:
    """``all_reduce_adjoint(..., cotangent="replicated")`` of one array or a list: ``y`` (``y / P`` for avg),
    no traffic.

    ``op`` is already known to be linear; a list comes with its ``out`` list
    (``outs_of``). In check mode the ranks compare one digest per array, in
    one exchange for the whole call (whatever the list's length): a
    replicated cotangent that differs, or lists of different lengths, raise
    :class:`~hpccoll.MismatchError` on every rank.
    """
    many = is_array_list(y)
    ys, outs = (list(y), list(out)) if many else ([y], [out])
    err = None
    modules = []
    try:
        if many:
            check_list_items(ys, set(map(type, ys)), "y")
        for i, (yi, oi) in enumerate(zip(ys, outs)):
            name = f"y[{i}]" if many else "y"
            yi, _, xp = one_array(yi, name)
            if op == "avg":
                reduce_plan(yi.dtype, op)  # avg on bool or integers raises, as in the forward
            ys[i] = yi
            outs[i] = check_out(oi, yi.shape, yi.dtype, yi, xp, in_place_test(yi, ALL))
            modules.append(xp)
    except HpccollError as e:
        err = e
    desc = replicated_desc(ys) if checking(c) and err is None else None
    settle(c, "all_reduce_adjoint", desc, None, err)
    for yi, oi, xp in zip(ys, outs, modules):
        if oi is not yi:
            xp.copyto(oi, yi)
        finish_reduction(oi, c.size, op == "avg")
    return done(outs if many else outs[0], async_op)


# --------------------------------------------------------------------------- the pair's spec


def _configure(comm: Any, keywords: Dict[str, Any]) -> Dict[str, Any]:
    """``op``, and the adjoint's own ``cotangent`` convention checked."""
    return {
        **keywords,
        "op": keywords.get("op", "sum"),
        "cotangent": cotangent_of(keywords.get("cotangent", "varying")),
    }


def _bind(meta: Meta, comm: Any, tracing: bool, keywords: Dict[str, Any]) -> Bound:
    k = _configure(comm, keywords)
    return Bound(k, tuple(meta.shape), k["op"], k["op"])


#: The all-reduce's spec: the result has the input's shape; its adjoint (under ``cotangent``, adjoint-only) is
#: linear only for the linear ops.
ALL_REDUCE = register(Hooks("all_reduce", _configure, _bind, "allreduce", example=lambda size: {"op": "sum"}))
