"""all-to-all: one array, a list of arrays, blocking or not.

Rank r splits its ``x`` along ``split_axis`` into P blocks (extents
``sizes``), sends block j to rank j, and concatenates the blocks it receives
along ``concat_axis``, in rank order. Every path ends in the transport's
``alltoallv`` (or ``ialltoallv``) on flat buffers: the blocks to send, rank
after rank, and the blocks received, rank after rank.

What rank j receives from rank r has extent ``recv_sizes[r]`` along
``concat_axis``: rank r's ``sizes[j]`` when the two axes are the same, else
rank r's ``x.shape[concat_axis]`` (and then every rank must split alike, so
``sizes`` is the same everywhere). ``recv_sizes=None`` learns them with one
small ``Alltoall`` (:func:`recv_extents`) before the data moves.

The first branch of :func:`all_to_all` takes the common case -- a
C-contiguous NumPy array split and concatenated along its first axis,
``sizes`` and ``recv_sizes`` absent or plain ints, ``out`` absent or a
separate C-contiguous array, no check mode -- with as few Python operations
as it can; anything else takes the general branch, which validates
everything and raises the errors.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from .._arrays import flat, module_of, prod, split_sizes
from .._core.agree import all_to_all_desc, late, settle
from .._core.blocks import block, may_share, shape_without, with_extent
from .._core.extents import TRACING, every_rank
from .._core.launch import Ready, launch
from .._core.lists import list_types, survey_list
from .._core.validate import axis_of, block_sizes, check_out, one_array, outs_of, plain_out, plain_total, sizes_of
from .._dtypes import movement_dtype, wire_of
from .._errors import ArgumentError, HpccollError, MismatchError
from .._layout import as_wire, blocks, pack, wire_flat
from .._spec import Bound, Hooks, Meta, register
from ..transports._control import exchange_rows
from ._engine import Call, Road, copied, run

__all__ = ["all_to_all", "own_recv_sizes", "recv_extents", "ALL_TO_ALL"]

_ndarray = np.ndarray
_BYTES = np.dtype(np.uint8)
#: Checked extents, one per rank (what ``sizes`` and ``recv_sizes`` become once validated or exchanged).
Extents = Tuple[int, ...]


def all_to_all(
    x: Any, c: Any, split_axis: Any, concat_axis: Any, sizes: Any, recv_sizes: Any, out: Any, what: str, async_op: bool
) -> Any:
    """``hpccoll.all_to_all`` (also a list of arrays); ``what`` names the public call in errors."""
    if type(x) is _ndarray:
        if (
            not c.check
            and c.size > 1
            and type(split_axis) is int
            and type(concat_axis) is int
            and x.ndim
            and (split_axis == 0 or split_axis == -x.ndim)
            and (concat_axis == 0 or concat_axis == -x.ndim)
            and x.flags.c_contiguous
        ):
            return _common(x, c, sizes, recv_sizes, out, what, async_op)
    elif (types := list_types(x)) is not None:
        return _many(x, types, c, split_axis, concat_axis, sizes, recv_sizes, out, what, async_op)
    return _one(x, c, split_axis, concat_axis, sizes, recv_sizes, out, what, async_op)


def _common(x: np.ndarray, c: Any, sizes: Any, recv_sizes: Any, out: Any, what: str, async_op: bool) -> Any:
    """The common case (both axes 0); hands anything else to the general branch."""
    wire = wire_of(x.dtype)
    shape, P = x.shape, c.size
    if wire is None:
        return _one(x, c, 0, 0, sizes, recv_sizes, out, what, async_op)  # it raises the DTypeError
    if sizes is None:
        sizes = split_sizes(shape[0], P)
    elif plain_total(sizes, P) != shape[0]:  # -1 when not plain
        return _one(x, c, 0, 0, sizes, recv_sizes, out, what, async_op)
    inner = 1 if len(shape) == 1 else prod(shape[1:])
    send_counts = sizes if inner == 1 else [s * inner for s in sizes]
    if recv_sizes is None:
        [recv_sizes], even = _exchange(c, [x], [0], [0], [sizes], _key(send_counts), what)
        total, nbytes = sum(recv_sizes), _alike(P, send_counts, x.itemsize, even)
    elif (total := plain_total(recv_sizes, P)) < 0 or recv_sizes[c.rank] != sizes[c.rank]:
        return _one(x, c, 0, 0, sizes, recv_sizes, out, what, async_op)
    else:
        even, nbytes = False, 0  # this rank's counts do not tell whether every rank's are even
    oshape = (total,) + shape[1:]
    if out is None and x.size and total:
        out = np.empty(oshape, x.dtype)
    elif not (x.size and total and plain_out(out, oshape, x.dtype) and not may_share(out, x)):
        return _one(x, c, 0, 0, sizes, recv_sizes, out, what, async_op, even)  # another out, or empty
    recv_counts = recv_sizes if inner == 1 else [s * inner for s in recv_sizes]
    t = c.transport_of("numpy", nbytes, "alltoallv", not async_op)
    args = (wire_flat(x, wire), wire_flat(out, wire), send_counts, recv_counts, even)
    if async_op:
        return launch(t, "alltoallv", args, Ready(out), True)
    t.alltoallv(*args)
    return out


def _one(
    x: Any,
    c: Any,
    split_axis: Any,
    concat_axis: Any,
    sizes: Any,
    recv_sizes: Any,
    out: Any,
    what: str,
    async_op: bool,
    even: Optional[bool] = None,
) -> Any:
    """The general branch; ``even`` is the verdict of a size exchange already made (with ``recv_sizes``)."""
    return run(_ONE, c, what, async_op, x, split_axis, concat_axis, sizes, recv_sizes, out, even)


def _check(
    c: Any, async_op: bool, x: Any, split_axis: Any, concat_axis: Any, sizes: Any, recv_sizes: Any, out: Any, even: Any
) -> Call:
    x, kind, xp = one_array(x)
    sa, ca = axis_of(split_axis, x.ndim, "split_axis"), axis_of(concat_axis, x.ndim, "concat_axis")
    sizes = block_sizes(sizes, x.shape[sa], c.size, f"x.shape[{sa}]")
    send_counts = [s * prod(shape_without(x.shape, sa)) for s in sizes]
    if recv_sizes is not None:
        recv_sizes = own_recv_sizes(recv_sizes, c, x, sa, ca, sizes, "x")
        out = _out(out, x, xp, sa, ca, sizes[c.rank], recv_sizes)
    desc = all_to_all_desc([x], [sa], [ca], [sizes]) if c.check else None
    return Call(x, kind, xp, out, 0, desc, None, (sa, ca), sizes, extra=(recv_sizes, send_counts, even))


def _agree(a: Optional[Call], c: Any, what: str, err: Optional[HpccollError], async_op: bool) -> Call:
    """Every rank's blocks for this one (check mode: compared), then ``out`` once its extents are known."""
    if a is None:
        settle(c, what, None, None, err, async_op)  # raises on every rank
    assert a is not None
    (sa, ca), sizes, (recv_sizes, send_counts, even) = a.ax, a.sizes, a.extra
    table, settled = _settle(c, [a.x], [sa], [ca], [sizes], recv_sizes, _key(send_counts), a.desc, err, what, async_op)
    even = settled if even is None else even
    out = a.out
    if recv_sizes is None:
        recv_sizes = table[0]
        out = late(c, what, lambda: _out(a.out, a.x, a.xp, sa, ca, sizes[c.rank], recv_sizes))
    return a._replace(out=out, nbytes=_alike(c.size, send_counts, a.x.itemsize, even), extra=(recv_sizes, even))


def _key(counts: Sequence[int]) -> int:
    """This rank's part of the evenness verdict: its send count when the same for every rank, else -1."""
    return counts[0] if counts.count(counts[0]) == len(counts) else -1


def _alike(parts: int, send_counts: Sequence[int], itemsize: int, even: bool) -> int:
    """The bytes the whole exchange moves, as every rank measures them alike (for ``transport_of``).

    Known only when every pair of ranks moves the same count; otherwise 0,
    the same on every rank (ranks must never choose different transports).
    """
    return parts * parts * send_counts[0] * itemsize if even else 0


def _sent(x: Any, sa: int, ca: int, sizes: Extents, parts: int) -> Extents:
    """The extents along ``concat_axis`` of the blocks this rank sends to ranks 0, 1, ..., ``parts - 1``."""
    return tuple(sizes) if sa == ca else (x.shape[ca],) * parts


def own_recv_sizes(recv_sizes: Any, c: Any, x: Any, sa: int, ca: int, sizes: Extents, name: str) -> Extents:
    """``recv_sizes`` checked, including the block this rank sends itself (local, no communication)."""
    recv_sizes = sizes_of(recv_sizes, c.size, "recv_sizes")
    mine, rank = _sent(x, sa, ca, sizes, c.size)[c.rank], c.rank
    if recv_sizes[rank] != mine:
        source = f"sizes[{rank}]" if sa == ca else f"{name}.shape[{ca}]"
        raise ArgumentError(
            f"recv_sizes: expected recv_sizes[{rank}] == {source} == {mine} on rank {rank} (the block it sends "
            f"itself); got {recv_sizes[rank]}"
        )
    return recv_sizes


def _out(out: Any, x: Any, xp: Any, sa: int, ca: int, mine: int, recv_sizes: Extents) -> Any:
    """Validate (or allocate) ``out``: extent ``mine`` along ``split_axis``, then ``sum(recv_sizes)`` along
    ``concat_axis``; it may not overlap ``x`` at all (no in-place form)."""
    return check_out(out, with_extent(with_extent(x.shape, sa, mine), ca, sum(recv_sizes)), x.dtype, x, xp)


def _move(a: Call, c: Any, transport: Any, async_op: bool) -> Any:
    """Send ``x``'s blocks along ``sa`` and receive into ``out`` along ``ca``: straight, or through flat buffers."""
    x, xp, (sa, ca), sizes, out, (recv_sizes, even) = a.x, a.xp, a.ax, a.sizes, a.out, a.extra
    wire = movement_dtype(x.dtype)
    unit_send, unit_recv = prod(shape_without(x.shape, sa)), prod(shape_without(out.shape, ca))
    send = pack(x, xp, sa, sizes, wire, False)  # a view when the blocks already lie rank after rank
    if not send.size:
        send = xp.empty(0, wire)  # never the address of an empty view into out
    direct = prod(out.shape[:ca]) == 1 and out.flags.c_contiguous and out.size > 0
    recv = as_wire(flat(out, xp), wire) if direct else xp.empty(out.size, wire)

    def finish() -> Any:
        blocks(recv, out.view(wire), xp, ca, recv_sizes, to_flat=False)
        return out

    counts = ([s * unit_send for s in sizes], [s * unit_recv for s in recv_sizes])
    # blocks received straight into out: nothing to finish (a plan then runs the call alone)
    return launch(transport, "alltoallv", (send, recv) + counts + (even,), Ready(out) if direct else finish, async_op)


_ONE = Road(_check, copied, _move, "alltoallv", _agree)


# --------------------------------------------------------------------------- what every rank receives


def _signature(a: Any, sa: int, ca: int, sizes: Extents) -> tuple:
    """What must match across ranks: dtype, ndim, axes, the extents other than along ``concat_axis``, and
    (axes differing) the split, which is then one decomposition shared by every rank."""
    return (
        (ord(a.dtype.char), a.dtype.itemsize, len(a.shape), sa, ca)
        + shape_without(tuple(a.shape), ca)
        + (tuple(sizes) if sa != ca else ())
    )


def recv_extents(c: Any, x: Any, sa: int, ca: int, sizes: Extents, what: str) -> Extents:
    """Every rank's extent along ``concat_axis`` of its block for this rank (collective when ``c.size > 1``).

    ``x`` needs only ``shape`` and ``dtype`` (the adapters pass stand-ins);
    ``sa``, ``ca`` are normalised and ``sizes`` resolved.
    """
    return _exchange(c, [x], [sa], [ca], [sizes], -1, what)[0][0]


def _exchange(
    c: Any, arrays: Sequence[Any], sas: Sequence[int], cas: Sequence[int], table: Sequence[Extents], key: int, what: str
) -> Tuple[List[Extents], bool]:
    """``result[i][r]``: the extent along array i's ``concat_axis`` of what rank r sends this rank; and
    whether every pair of ranks moves the same count (every rank's ``key`` the same, not -1)."""
    parts = c.size
    sent = [_sent(a, sa, ca, t, parts) for a, sa, ca, t in zip(arrays, sas, cas, table)]
    if parts == 1:
        return sent, False
    signature = hash(tuple([_signature(a, sa, ca, t) for a, sa, ca, t in zip(arrays, sas, cas, table)]))
    received = exchange_rows(c, [[row[j] for row in sent] + [key] for j in range(parts)], signature, what)
    k = len(arrays)
    return [tuple([row[i] for row in received]) for i in range(k)], _same_key([row[k] for row in received])


def _same_key(keys: Sequence[int]) -> bool:
    return keys[0] >= 0 and keys.count(keys[0]) == len(keys)


def _settle(
    c: Any,
    arrays: Sequence[Any],
    sas: Sequence[int],
    cas: Sequence[int],
    table: Sequence[Extents],
    recv_sizes: Optional[Extents],
    key: int,
    desc: Any,
    err: Optional[HpccollError],
    what: str,
    async_op: bool,
) -> Tuple[List[Extents], bool]:
    """Raise a local error (check mode: on every rank); then every array's receive extents, one per rank,
    and whether every pair of ranks moves the same count (the same verdict on every rank).

    Check mode compares ``desc`` across ranks and learns every rank's blocks,
    so a ``recv_sizes`` that does not match what the ranks send raises the
    same :class:`MismatchError` on every rank. Otherwise ``recv_sizes`` is
    trusted, or (``None``) learned with one small exchange.
    """
    k = len(arrays)
    local = (
        None
        if err
        else ([list(_sent(a, sa, ca, t, c.size)) for a, sa, ca, t in zip(arrays, sas, cas, table)], recv_sizes, key)
    )
    everyone = settle(c, what, desc, local, err, async_op)
    if everyone is None:
        if recv_sizes is None:
            return _exchange(c, arrays, sas, cas, table, key, what)
        # even only where global facts say so: axes differ, one split, one extent per rank
        even = all(sa != ca and len(set(t)) == 1 for sa, ca, t in zip(sas, cas, table)) and len(set(recv_sizes)) == 1
        return [recv_sizes] * k, even
    for j, (_, given, _) in enumerate(everyone):
        sent = [tuple(rows[i][j] for rows, _, _ in everyone) for i in range(k)]
        if given is not None and any(list(s) != list(given) for s in sent):
            raise MismatchError(
                f"{what}: rank {j} has recv_sizes={list(given)} but the ranks send it blocks of "
                f"extents {[list(s) for s in sent] if k > 1 else list(sent[0])} along concat_axis"
            )
    return [tuple(rows[i][c.rank] for rows, _, _ in everyone) for i in range(k)], _same_key([e[2] for e in everyone])


# --------------------------------------------------------------------------- lists


def _many(
    xs: Any,
    types: Set[type],
    c: Any,
    split_axis: Any,
    concat_axis: Any,
    sizes: Any,
    recv_sizes: Any,
    out: Any,
    what: str,
    async_op: bool,
) -> Any:
    return run(_MANY, c, what, async_op, xs, types, split_axis, concat_axis, sizes, recv_sizes, out)


def _check_list(
    c: Any,
    async_op: bool,
    xs: Any,
    types: Set[type],
    split_axis: Any,
    concat_axis: Any,
    sizes: Any,
    recv_sizes: Any,
    out: Any,
) -> Call:
    lst = survey_list(xs, types, async_op)
    arrays, kind = lst.arrays, lst.kind
    xp = module_of(kind)
    sas = [axis_of(split_axis, a.ndim, "split_axis") for a in arrays]
    cas = [axis_of(concat_axis, a.ndim, "concat_axis") for a in arrays]
    if sizes is not None:
        sizes = sizes_of(sizes, c.size)
    table = [
        block_sizes(sizes, a.shape[sa], c.size, f"x[{i}].shape[{sa}]") for i, (a, sa) in enumerate(zip(arrays, sas))
    ]
    unit = [prod(shape_without(a.shape, sa)) * a.dtype.itemsize for a, sa in zip(arrays, sas)]  # bytes/index
    send_counts = [sum(u * t[j] for u, t in zip(unit, table)) for j in range(c.size)]
    if recv_sizes is not None:
        for i, (a, sa, ca, t) in enumerate(zip(arrays, sas, cas, table)):
            recv_sizes = own_recv_sizes(recv_sizes, c, a, sa, ca, t, f"x[{i}]")
    outs = outs_of(out, len(arrays))
    if recv_sizes is not None:
        outs = _outs(outs, arrays, sas, cas, table, [recv_sizes] * len(arrays), c.rank, xp)
    desc = all_to_all_desc(arrays, sas, cas, table) if c.check else None
    return Call(lst, kind, xp, outs, 0, desc, None, (sas, cas), table, extra=(recv_sizes, send_counts))


def _agree_list(a: Optional[Call], c: Any, what: str, err: Optional[HpccollError], async_op: bool) -> Call:
    """Every rank's blocks for this one, array by array (check mode: compared), then the outs."""
    if a is None:
        settle(c, what, None, None, err, async_op)  # raises on every rank
    assert a is not None
    arrays, (sas, cas), table, (recv_sizes, send_counts) = a.x.arrays, a.ax, a.sizes, a.extra
    recv_table, even = _settle(c, arrays, sas, cas, table, recv_sizes, _key(send_counts), a.desc, err, what, async_op)
    outs = a.out
    if recv_sizes is None:
        outs = late(c, what, lambda: _outs(a.out, arrays, sas, cas, table, recv_table, c.rank, a.xp))
    return a._replace(out=outs, nbytes=_alike(c.size, send_counts, 1, even), extra=(recv_table, send_counts, even))


def _move_list(a: Call, c: Any, transport: Any, async_op: bool) -> Any:
    arrays, xp, outs, (sas, cas), (recv_table, send_counts, even) = a.x.arrays, a.xp, a.out, a.ax, a.extra
    send = _pack_list(arrays, sas, a.sizes, xp, c.size)
    unit = [prod(shape_without(o.shape, ca)) * o.dtype.itemsize for o, ca in zip(outs, cas)]  # bytes per index
    recv_counts = [sum(u * rt[r] for u, rt in zip(unit, recv_table)) for r in range(c.size)]
    recv = xp.empty(sum(recv_counts), _BYTES)
    finish = _unpacker(recv, outs, cas, recv_table, xp)
    return launch(transport, "alltoallv", (send, recv, send_counts, recv_counts, even), finish, async_op)


def _copy_each(a: Call) -> List[Any]:
    for x, o in zip(a.x.arrays, a.out):
        a.xp.copyto(o, x)
    return a.out


_MANY = Road(_check_list, _copy_each, _move_list, "alltoallv", _agree_list)


def _outs(
    outs: List[Any],
    arrays: List[Any],
    sas: List[int],
    cas: List[int],
    table: List[Extents],
    recv_table: List[Extents],
    rank: int,
    xp: Any,
) -> List[Any]:
    return [
        _out(o, a, xp, sa, ca, t[rank], rt) for o, a, sa, ca, t, rt in zip(outs, arrays, sas, cas, table, recv_table)
    ]


def _pack_list(arrays: List[Any], sas: List[int], table: List[Extents], xp: Any, parts: int) -> Any:
    """Every array's block for rank j, C-ordered, one after another, for j = 0, 1, ...: as bytes."""
    pieces = []
    starts = [0] * len(arrays)
    for j in range(parts):
        for i, (a, sa) in enumerate(zip(arrays, sas)):
            n = table[i][j]
            piece = xp.ascontiguousarray(a[block(sa, starts[i], starts[i] + n)])
            starts[i] += n
            pieces.append(as_wire(piece.reshape(-1), movement_dtype(a.dtype)).view(_BYTES))
    return xp.concatenate(pieces) if pieces else xp.empty(0, _BYTES)


def _unpacker(recv: Any, outs: List[Any], cas: List[int], recv_table: List[Extents], xp: Any) -> Callable[[], Any]:
    def finish() -> List[Any]:
        offset = 0
        starts = [0] * len(outs)
        for r in range(len(recv_table[0]) if recv_table else 0):
            for i, (o, ca) in enumerate(zip(outs, cas)):
                n = recv_table[i][r]
                wire = movement_dtype(o.dtype)
                target = o.view(wire)[block(ca, starts[i], starts[i] + n)]
                nbytes = target.size * wire.itemsize
                xp.copyto(target, recv[offset : offset + nbytes].view(wire).reshape(target.shape))
                starts[i] += n
                offset += nbytes
        return outs

    return finish


# --------------------------------------------------------------------------- the pair's spec


def _configure(comm: Any, keywords: Dict[str, Any]) -> Dict[str, Any]:
    sizes, recv_sizes = keywords.get("sizes"), keywords.get("recv_sizes")
    return {
        **keywords,
        "split_axis": keywords.get("split_axis", 0),
        "concat_axis": keywords.get("concat_axis", 0),
        "sizes": None if sizes is None else sizes_of(sizes, comm.size),
        "recv_sizes": None if recv_sizes is None else sizes_of(recv_sizes, comm.size, "recv_sizes"),
    }


def _bind(meta: Meta, comm: Any, tracing: bool, keywords: Dict[str, Any]) -> Bound:
    """The split and received extents resolved: ``recv_sizes=None`` learned with the all-to-all's own small
    exchange, or, ``tracing``, assumed (every rank sends this one a block like the one it sends itself)."""
    k = _configure(comm, keywords)
    shape = tuple(meta.shape)
    sa, ca = axis_of(k["split_axis"], len(shape), "split_axis"), axis_of(k["concat_axis"], len(shape), "concat_axis")
    sizes = block_sizes(k["sizes"], shape[sa], comm.size, f"x.shape[{sa}]")
    verify = None
    if k["recv_sizes"] is not None:  # checked here, before any tracing or communication, like the core call
        recv_sizes = own_recv_sizes(k["recv_sizes"], comm, meta, sa, ca, sizes, "x")
    elif tracing:
        recv_sizes, verify = _assumed_recv_sizes(meta, comm, sa, ca, sizes)
    else:
        recv_sizes = recv_extents(comm, meta, sa, ca, sizes, "all_to_all")
    result = with_extent(with_extent(shape, sa, sizes[comm.rank]), ca, sum(recv_sizes))
    keywords = {**k, "split_axis": sa, "concat_axis": ca, "sizes": sizes, "recv_sizes": recv_sizes}
    return Bound(keywords, result, verify=verify)


def _assumed_recv_sizes(meta: Meta, c: Any, sa: int, ca: int, sizes: Extents) -> Tuple[Extents, Any]:
    """``recv_sizes=None`` while tracing: every rank sends this one a block like the one it sends itself.

    Returns those ``recv_sizes`` and the check, run with the collective, that
    every rank's blocks match them (``None`` at one rank).
    """
    sent = _sent(meta, sa, ca, sizes, c.size)  # extents along ca of my blocks for each rank

    def verify() -> None:
        table = np.asarray(every_rank(c, sent, "all_to_all"))  # table[q][r]: what rank q sends rank r
        bad = [(q, r) for r in range(c.size) for q in range(c.size) if table[q, r] != table[r, r]]
        if bad:
            q, r = bad[0]
            raise MismatchError(
                f"all_to_all: expected every rank to send each rank a block of the extent (along concat_axis) that "
                f"rank sends itself, with recv_sizes=None {TRACING}; got a block of {table[q, r]} from rank {q} to "
                f"rank {r}, which sends itself {table[r, r]} (what each rank sends each, a row per rank: "
                f"{table.tolist()}): pass recv_sizes, on rank r column r of that table"
            )

    return (sent[c.rank],) * c.size, verify if c.size > 1 else None


#: The all-to-all's spec: the extents it receives learned (or, tracing, assumed) once, so that the adjoint
#: (the all-to-all back) splits by them.
ALL_TO_ALL = register(
    Hooks("all_to_all", _configure, _bind, "alltoallv", example=lambda size: {"split_axis": 0, "concat_axis": 0})
)
