"""List forms of the collectives: many arrays moved in as few messages as possible.

Arrays are packed into flat buckets of at most ``comm.bucket_bytes`` bytes
(a larger array travels alone), one transport call per bucket, and unpacked
into the results. Reductions group arrays by their reduction plan (same
dtype and op); all-gathers move raw bytes, so any dtypes share a bucket.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from ._api import (
    _as,
    _axis,
    _divide,
    _done,
    _out,
    _same_view,
    _settle,
    _shape_without,
    _sizes,
    _with_extent,
    split_sizes,
)
from ._arrays import as_array, flat, module_of, prod
from ._comm import Communicator
from ._dtypes import check_dtype, movement_dtype, normalize_op, reduce_plan
from ._exchange import exchange_extents
from ._errors import ArgumentError, HpccollError, MismatchError
from ._request import Request
from .transports import select_transport

__all__ = ["is_array_list", "all_gather_many", "reduce_scatter_many", "all_reduce_many"]


def is_array_list(x: Any) -> bool:
    """Whether ``x`` is a list or tuple of arrays (not an array-like of numbers)."""
    if type(x) not in (list, tuple):
        return False
    return all(isinstance(e, np.ndarray) or type(e).__module__.startswith("cupy") for e in x)


def _outs(out: Any, n: int) -> List[Any]:
    if out is None:
        return [None] * n
    if type(out) not in (list, tuple) or len(out) != n:
        got = f"{type(out).__name__} of length {len(out)}" if type(out) in (list, tuple) else type(out).__name__
        raise ArgumentError(f"out: expected None or a list of {n} arrays (one per input); got {got}")
    return list(out)


def _buckets(nbytes: Sequence[int], limit: int) -> List[List[int]]:
    """Consecutive index groups whose byte totals stay within ``limit`` (a larger item goes alone)."""
    groups: List[List[int]] = []
    total = limit + 1
    for i, n in enumerate(nbytes):
        if total + n > limit or not groups:
            groups.append([])
            total = 0
        groups[-1].append(i)
        total += n
    return groups


def _finish_all(pending: List[Any], finishers: List[Callable[[], None]], results: List[Any], async_op: bool) -> Any:
    def finish() -> List[Any]:
        for f in finishers:
            f()
        return results

    if async_op:
        return Request(pending, finish)
    for p in pending:
        p.wait()
    return finish()


def _start(transport: Any, primitive: str, args: tuple, async_op: bool) -> Any:
    if async_op:
        return getattr(transport, "i" + primitive)(*args)
    getattr(transport, primitive)(*args)
    from ._request import DONE

    return DONE


def _prepare(xs: Sequence[Any], what: str) -> Tuple[List[Any], str]:
    """The arrays of ``xs`` and their library, each dtype checked once (not once per array)."""
    if all(type(x) is np.ndarray for x in xs):  # the common case, without per-array calls
        arrays, kind = list(xs), "numpy"
    else:
        pairs = [as_array(x, f"x[{i}]") for i, x in enumerate(xs)]
        kinds = {k for _, k in pairs}
        if len(kinds) > 1:
            raise ArgumentError(f"x: expected arrays of one library (all NumPy or all CuPy); got {sorted(kinds)}")
        arrays, kind = [a for a, _ in pairs], (kinds.pop() if kinds else "numpy")
    for dtype in {a.dtype for a in arrays}:
        try:
            check_dtype(dtype)
        except HpccollError:
            first = next(i for i, a in enumerate(arrays) if a.dtype == dtype)
            check_dtype(dtype, f"x[{first}]")
    return arrays, kind


# --------------------------------------------------------------------------- all-reduce


def all_reduce_many(xs: Sequence[Any], c: Communicator, op: Any, out: Any, what: str, async_op: bool) -> Any:
    """All-reduce every array of ``xs``; return the list of results (or a Request)."""
    err = desc = None
    try:
        arrays, kind = _prepare(xs, what)
        xp = module_of(kind)
        op = normalize_op(op)
        for dtype in {a.dtype for a in arrays}:
            reduce_plan(dtype, op)  # raises for unsupported (dtype, op) before any communication
        outs = [None] * len(arrays) if out is None else [
            _out(o, a.shape, a.dtype, a, xp, lambda oo, a=a: _same_view(oo, a)) if o is not None else None
            for a, o in zip(arrays, _outs(out, len(arrays)))
        ]
        if c.check:
            desc = {"collective": "all_reduce", "op": op, "arrays": [(a.dtype.name, a.shape) for a in arrays]}
    except HpccollError as e:
        err = e
    _settle(c, what, desc, None, err)
    if c.size == 1:
        results = [_copy_into(o, a, xp) for a, o in zip(arrays, outs)]
        return _done(results, async_op)
    transport = select_transport(c, kind)  # collective on first GPU use: after the ranks agree
    plan_of = {dt: reduce_plan(dt, op, transport.native_reduce) for dt in {a.dtype for a in arrays}}
    results: List[Any] = [None] * len(arrays)
    pending, finishers = [], []
    if len(plan_of) == 1:  # one dtype: one group, in order
        groups = {next(iter(plan_of.values())): list(range(len(arrays)))}
    else:
        groups = {}
        for i, a in enumerate(arrays):
            groups.setdefault(plan_of[a.dtype], []).append(i)
    for plan, members in groups.items():
        sizes = [arrays[i].size * plan.wire.itemsize for i in members]
        for bucket in _buckets(sizes, c.bucket_bytes):
            idx = [members[j] for j in bucket]
            send = _concat([arrays[i] for i in idx], plan.wire, plan.widen, xp)
            recv = xp.empty(send.size, plan.wire)
            pending.append(_start(transport, "allreduce", (send, recv, plan.op), async_op))
            finishers.append(_unpacker(recv, idx, arrays, outs, results, plan, c.size, xp))
    return _finish_all(pending, finishers, results, async_op)


def _concat(arrays: List[Any], wire: np.dtype, widen: bool, xp: Any) -> Any:
    """One flat buffer of ``wire`` holding every array's elements, C order, one after another."""
    buf = xp.concatenate(arrays, axis=None) if len(arrays) > 1 else arrays[0].reshape(-1).copy()
    return buf.astype(wire) if widen else _as(buf, wire)


def _unpacker(recv: Any, idx: List[int], arrays: List[Any], outs: List[Any], results: List[Any], plan: Any,
              parts: int, xp: Any) -> Callable[[], None]:
    def finish() -> None:
        if plan.divide:
            _divide(recv, parts)
        offset = 0
        for i in idx:
            a = arrays[i]
            n = a.size
            piece = recv[offset : offset + n]
            offset += n
            if a.ndim != 1:
                piece = piece.reshape(a.shape)
            if outs[i] is not None:
                xp.copyto(outs[i], piece, casting="unsafe")
                results[i] = outs[i]
            elif plan.widen:
                results[i] = piece.astype(a.dtype)
            else:
                results[i] = _as(piece, a.dtype)  # a view into this bucket's fresh buffer

    return finish


def _copy_into(out: Any, x: Any, xp: Any) -> Any:
    if out is None:
        return x.copy()
    if out is not x:
        xp.copyto(out, x)
    return out


# --------------------------------------------------------------------------- all-gather


def all_gather_many(xs: Sequence[Any], c: Communicator, axis: Any, sizes: Any, out: Any, what: str,
                    async_op: bool, table: Optional[List[Tuple[int, ...]]] = None) -> Any:
    """All-gather every array of ``xs`` along ``axis``; return the list of results (or a Request).

    ``table`` (with ``sizes=None``): the extents :func:`exchange_extents` returned
    already (the fast path exchanged them, then handed over).
    """
    err = desc = None
    axes: List[int] = []
    try:
        arrays, kind = _prepare(xs, what)
        xp = module_of(kind)
        axes = [_axis(axis, a.ndim) for a in arrays]
        outs = _outs(out, len(arrays))
        if sizes is not None:
            sizes = _sizes(sizes, c.size)
            for i, (a, ax) in enumerate(zip(arrays, axes)):
                if a.shape[ax] != sizes[c.rank]:
                    raise ArgumentError(f"sizes: expected sizes[{c.rank}] == x[{i}].shape[{ax}] == {a.shape[ax]} "
                                        f"on rank {c.rank}; got {sizes[c.rank]}")
        if c.check:
            desc = {"collective": "all_gather", "sizes": sizes,
                    "arrays": [(a.dtype.name, ax, _shape_without(a.shape, ax)) for a, ax in zip(arrays, axes)]}
    except HpccollError as e:
        err = e
    extents = _settle(c, what, desc, None if err else [a.shape[ax] for a, ax in zip(arrays, axes)], err)
    if extents is not None:  # check mode: every rank's extents, array by array
        table = [tuple(rank_ext[i] for rank_ext in extents) for i in range(len(arrays))]
    elif table is not None:
        pass
    elif sizes is None:
        table = exchange_extents(c, arrays, axes, what)
    else:
        table = [sizes] * len(arrays)
    if sizes is not None and any(list(t) != list(sizes) for t in table):
        raise MismatchError(f"{what}: sizes={list(sizes)} but the ranks' extents along the axis are {table}")
    outs = [_out(o, _with_extent(a.shape, ax, sum(t)), a.dtype, a, xp)
            for a, ax, t, o in zip(arrays, axes, table, outs)]
    if c.size == 1:
        for a, o in zip(arrays, outs):
            xp.copyto(o, a)
        return _done(outs, async_op)
    transport = select_transport(c, kind)
    # Bytes of array i that rank r contributes.
    unit = [prod(_shape_without(a.shape, ax)) * a.dtype.itemsize for a, ax in zip(arrays, axes)]
    pending, finishers = [], []
    for idx in _buckets([u * sum(t) for u, t in zip(unit, table)], c.bucket_bytes):
        parts = [_as(flat(arrays[i], xp), movement_dtype(arrays[i].dtype)).view(np.uint8) for i in idx]
        send = xp.concatenate(parts) if len(parts) > 1 else parts[0]
        counts = [sum(unit[i] * table[i][r] for i in idx) for r in range(c.size)]
        recv = xp.empty(sum(counts), np.uint8)
        pending.append(_start(transport, "allgatherv", (send, recv, counts), async_op))
        finishers.append(_gather_unpacker(recv, idx, arrays, axes, table, unit, outs, c.size, xp))
    return _finish_all(pending, finishers, outs, async_op)


def _gather_unpacker(recv: Any, idx: List[int], arrays: List[Any], axes: List[int], table: List[Any],
                     unit: List[int], outs: List[Any], parts: int, xp: Any) -> Callable[[], None]:
    def finish() -> None:
        offset = 0
        starts = [0] * len(arrays)
        for r in range(parts):
            for i in idx:
                a, ax, n = arrays[i], axes[i], table[i][r]
                nbytes = unit[i] * n
                wire = movement_dtype(a.dtype)
                piece = recv[offset : offset + nbytes].view(wire).reshape(_with_extent(a.shape, ax, n))
                where = (slice(None),) * ax + (slice(starts[i], starts[i] + n),)
                xp.copyto(outs[i].view(wire)[where], piece)
                starts[i] += n
                offset += nbytes

    return finish


# --------------------------------------------------------------------------- reduce-scatter


def reduce_scatter_many(xs: Sequence[Any], c: Communicator, op: Any, axis: Any, sizes: Any, out: Any, what: str,
                        async_op: bool) -> Any:
    """Reduce-scatter every array of ``xs`` along ``axis``; return the list of blocks (or a Request)."""
    err = desc = None
    try:
        arrays, kind = _prepare(xs, what)
        xp = module_of(kind)
        op = normalize_op(op)
        axes = [_axis(axis, a.ndim) for a in arrays]
        if sizes is not None:
            sizes = _sizes(sizes, c.size)
        table = []
        for i, (a, ax) in enumerate(zip(arrays, axes)):
            if sizes is None:
                table.append(split_sizes(a.shape[ax], c.size))
            elif sum(sizes) != a.shape[ax]:
                raise ArgumentError(f"sizes: expected ints summing to x[{i}].shape[{ax}] == {a.shape[ax]}; "
                                    f"got {list(sizes)}")
            else:
                table.append(sizes)
        for a in arrays:
            reduce_plan(a.dtype, op)  # raises for unsupported (dtype, op) before any communication
        outs = [_out(o, _with_extent(a.shape, ax, t[c.rank]), a.dtype, a, xp)
                for a, ax, t, o in zip(arrays, axes, table, _outs(out, len(arrays)))]
        if c.check:
            desc = {"collective": "reduce_scatter", "op": op, "sizes": sizes,
                    "arrays": [(a.dtype.name, a.shape, ax) for a, ax in zip(arrays, axes)]}
    except HpccollError as e:
        err = e
    _settle(c, what, desc, None, err)
    if c.size == 1:
        for a, o in zip(arrays, outs):
            xp.copyto(o, a)
        return _done(outs, async_op)
    transport = select_transport(c, kind)  # collective on first GPU use: after the ranks agree
    plans = [reduce_plan(a.dtype, op, transport.native_reduce) for a in arrays]
    pending, finishers = [], []
    groups: dict = {}
    for i, plan in enumerate(plans):
        groups.setdefault(plan, []).append(i)
    for plan, members in groups.items():
        for bucket in _buckets([arrays[i].size * plan.wire.itemsize for i in members], c.bucket_bytes):
            idx = [members[j] for j in bucket]
            inner = {i: prod(_shape_without(arrays[i].shape, axes[i])) for i in idx}
            counts = [sum(inner[i] * table[i][r] for i in idx) for r in range(c.size)]
            send = xp.empty(sum(counts), plan.wire if plan.widen else arrays[idx[0]].dtype)
            offset = 0
            for r in range(c.size):  # rank r's block of every array, one after another
                for i in idx:
                    a, ax = arrays[i], axes[i]
                    lo = sum(table[i][:r])
                    n = table[i][r]
                    count = inner[i] * n
                    where = (slice(None),) * ax + (slice(lo, lo + n),)
                    xp.copyto(send[offset : offset + count].reshape(_with_extent(a.shape, ax, n)), a[where],
                              casting="unsafe")
                    offset += count
            send = _as(send, plan.wire)
            recv = xp.empty(counts[c.rank], plan.wire)
            pending.append(_start(transport, "reduce_scatter", (send, recv, counts, plan.op), async_op))
            finishers.append(_scatter_unpacker(recv, idx, outs, inner, table, c.rank, plan, c.size, xp))
    return _finish_all(pending, finishers, outs, async_op)


def _scatter_unpacker(recv: Any, idx: List[int], outs: List[Any], inner: dict, table: List[Any], rank: int,
                      plan: Any, parts: int, xp: Any) -> Callable[[], None]:
    def finish() -> None:
        if plan.divide:
            _divide(recv, parts)
        offset = 0
        for i in idx:
            count = inner[i] * table[i][rank]
            piece = recv[offset : offset + count].reshape(outs[i].shape)
            xp.copyto(outs[i], piece if plan.widen else piece.view(outs[i].dtype), casting="unsafe")
            offset += count

    return finish
