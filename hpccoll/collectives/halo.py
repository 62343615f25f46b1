"""Halo exchange on a Cartesian process grid, and its adjoint; one array or a list, blocking or not.

A rank's array is its block of a global array *with* its ghost layers:
``halo[i]`` layers on each side of grid axis ``i``. The forward fills every
ghost that stands for a cell inside the domain with the owner's value; the
adjoint adds each such ghost's cotangent into the owned cell it came from and
zeroes the ghost. Both are one ``sendrecv`` of the transport contract: host
MPI posts an ``Irecv`` into each ghost region and an ``Isend`` of each
boundary region, straight from the array where the region is contiguous
(packed into a buffer where it is not); its default, for every other
transport, is one all-to-all of the packed bytes (NCCL groups its sends and
receives).

The messages: for every direction ``o`` (the ``2d`` faces, and with
``corners`` the edges and corners too, ``3**d - 1`` in all), rank r sends the
owned cells next to side ``o`` to its neighbour there, and receives that
neighbour's cells into its ghosts at side ``o``. Rank r's neighbour at ``o``
has r at ``-o``, so both ends list the regions of one message in the order of
the *sender's* directions: a pair of ranks that neighbour each other along
several directions (a periodic axis of extent 1 or 2) still match.

Before the data moves, one small all-gather of every rank's shape, dtype,
``halo`` and ``corners`` (and any argument error) lets every rank check every
pair of neighbours alike, so a mismatch or a halo wider than a neighbour's
owned cells raises on every rank, never a hang or garbage.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Dict, List, NamedTuple, Sequence, Tuple

import numpy as np

from .._arrays import module_of
from .._core.agree import dtype_code, raise_exchanged, status_of
from .._core.blocks import ALL, in_place_test
from .._core.launch import Ready, done, launch
from .._core.lists import list_types, survey_list
from .._core.validate import check_out, one_array, outs_of
from .._errors import ArgumentError, HpccollError, MismatchError
from ..transports._control import MAX_DIMS, exchange_shapes

__all__ = ["halo_exchange", "halo_of"]

#: A region of an array: one ``slice`` per grid axis (the trailing axes are whole).
Region = Tuple[slice, ...]


def halo_of(halo: Any, d: int) -> Tuple[int, ...]:
    """``halo`` checked: one int >= 0 for every grid axis, or one per axis."""
    if isinstance(halo, (int, np.integer)) and not isinstance(halo, bool):
        widths: Tuple[int, ...] = (int(halo),) * d
    elif (
        type(halo) in (list, tuple)
        and len(halo) == d
        and all(isinstance(h, (int, np.integer)) and not isinstance(h, bool) for h in halo)
    ):
        widths = tuple(int(h) for h in halo)
    else:
        raise ArgumentError(f"halo: expected an int or {d} ints (one per grid axis); got {halo!r}")
    if any(h < 0 for h in widths):
        raise ArgumentError(f"halo: expected widths >= 0; got {list(widths)}")
    return widths


def _directions(d: int, corners: bool) -> List[Tuple[int, ...]]:
    """The directions messages go in: the faces' (one non-zero step), and with ``corners`` every other one."""
    steps = [o for o in itertools.product((-1, 0, 1), repeat=d) if any(o)]
    return steps if corners else [o for o in steps if sum(map(abs, o)) == 1]


def _region(shape: Sequence[int], halo: Sequence[int], o: Sequence[int], ghost: bool) -> Region:
    """The ghosts at side ``o`` (``ghost``), or the owned cells a neighbour at ``o`` needs."""
    out = []
    for n, h, step in zip(shape, halo, o):
        if step == 0:
            out.append(slice(h, n - h))
        elif ghost:
            out.append(slice(0, h) if step < 0 else slice(n - h, n))
        else:
            out.append(slice(h, 2 * h) if step < 0 else slice(n - 2 * h, n - h))
    return tuple(out)


class _Field(NamedTuple):
    """One array of the call, validated."""

    x: Any
    out: Any


class _Layout(NamedTuple):
    """What moves, per field: ``(direction, neighbour, region)`` to send and to receive, in message order."""

    sends: Dict[int, List[Tuple[int, Region]]]  # neighbour rank -> [(field, owned region)], message order
    recvs: Dict[int, List[Tuple[int, Region]]]  # neighbour rank -> [(field, ghost region)], message order


def halo_exchange(x: Any, c: Any, halo: Any, corners: Any, out: Any, what: str, async_op: bool, adjoint: bool) -> Any:
    """``hpccoll.halo_exchange`` (``adjoint``: its adjoint), one array or a list; ``what`` names the public call."""
    many = type(x) is not np.ndarray and list_types(x) is not None
    fields: List[_Field] = []
    kind, xp, err = "numpy", np, None
    widths: Tuple[int, ...] = ()
    grid = None
    try:
        grid = c.grid
        d = len(grid.dims)
        widths = halo_of(halo, d)
        if not isinstance(corners, (bool, np.bool_)):
            raise ArgumentError(f"corners: expected a bool; got {corners!r}")
        if many:
            lst = survey_list(x, list_types(x) or set(), async_op)
            arrays, kind = lst.arrays, lst.kind
            names = [f"x[{i}]" for i in range(len(arrays))]
            outs = outs_of(out, len(arrays))
        else:
            a, kind, xp = one_array(x)
            arrays, names, outs = [a], ["x"], [out]
        xp = module_of(kind)
        for a, name, o in zip(arrays, names, outs):
            if a.ndim < d:
                raise ArgumentError(
                    f"{name}: expected at least {d} dimensions (one per grid axis); got shape {a.shape}"
                )
            for i, h in enumerate(widths):
                if 2 * h > a.shape[i]:
                    raise ArgumentError(
                        f"halo: expected 2 * halo[{i}] <= {name}.shape[{i}] (ghost layers on both sides of the "
                        f"owned cells); got halo[{i}] == {h} and {name}.shape[{i}] == {a.shape[i]}"
                    )
            fields.append(_Field(a, check_out(o, a.shape, a.dtype, a, xp, in_place_test(a, ALL))))
    except HpccollError as e:
        err = e
    if grid is None:  # no process grid: nothing to exchange with; this rank's error is every rank's (same comm)
        assert err is not None
        raise err
    _agree(c, fields, widths, bool(corners) if err is None else False, what, err)
    results = [f.out for f in fields]
    for f in fields:
        if f.out is not f.x:
            xp.copyto(f.out, f.x)
    key = (tuple(f.x.shape for f in fields), widths, bool(corners))
    layouts = c.state.setdefault("halo layouts", {})
    layout = layouts.get(key)
    if layout is None:
        if len(layouts) >= 64:
            layouts.clear()
        layout = layouts[key] = _layout(c, grid, list(key[0]), widths, bool(corners))
    # The adjoint sends the filled ghosts' cotangents back and adds what arrives into the owned cells.
    sends, recvs = (layout.recvs, layout.sends) if adjoint else (layout.sends, layout.recvs)
    outgoing: List[Tuple[Any, int]] = []
    for q in sorted(sends):
        for i, r in sends[q]:
            piece = results[i][r]
            outgoing.append((_flat(piece, xp, copy=adjoint), q))  # the adjoint zeroes these ghosts next
    if adjoint:
        for regions in sends.values():
            for i, r in regions:
                results[i][r] = 0
    incoming: List[Tuple[Any, int]] = []
    landing: List[Tuple[Any, Any]] = []  # (received buffer, the region it goes to) where it is not the region itself
    for q in sorted(recvs):
        for i, r in recvs[q]:
            target = results[i][r]
            if not adjoint and target.flags.c_contiguous:
                incoming.append((target.reshape(-1), q))  # straight into the ghosts
            else:
                buf = xp.empty(target.size, target.dtype)
                incoming.append((buf, q))
                landing.append((buf, target))

    def finish() -> Any:
        for buf, target in landing:
            piece = buf.reshape(target.shape)
            if adjoint:
                target += piece
            else:
                target[...] = piece
        return results if many else results[0]

    if not outgoing and not incoming:
        return done(finish(), async_op, kind)
    transport = c.transport_of(kind)  # the smallest messages' transport: a choice every rank makes alike
    # Every ghost received straight into place: nothing is left to finish.
    step: Callable[[], Any] = Ready(results[0]) if not landing and not many else finish
    return launch(transport, "sendrecv", (outgoing, incoming), step, async_op)


def _flat(piece: Any, xp: Any, copy: bool) -> Any:
    """``piece`` as a 1-D C-contiguous buffer: a view when it is one (and no ``copy`` is needed), else a copy."""
    if piece.flags.c_contiguous and not copy:
        return piece.reshape(-1)
    return xp.ascontiguousarray(piece).reshape(-1) if not copy else piece.copy().reshape(-1)


def _agree(c: Any, fields: List[_Field], widths: Tuple[int, ...], corners: bool, what: str, err: Any) -> None:
    """One all-gather of every rank's arguments: errors, dtypes, shapes, ``halo`` and ``corners`` checked alike."""
    shape: List[int] = []
    for f in fields:
        shape.extend(f.x.shape)
    codes = [dtype_code(f.x.dtype) for f in fields]
    ndims = [f.x.ndim for f in fields]
    if err is not None or len(shape) > MAX_DIMS:
        if err is None:
            err = ArgumentError(f"x: expected at most {MAX_DIMS} dimensions over all arrays; got {len(shape)}")
        shape, codes, ndims = [], [], []
    values = [status_of(err), int(corners), len(fields), *widths, hash((tuple(codes), tuple(ndims)))]
    if c.size == 1:  # nothing to exchange; the rank may still be its own neighbour (a periodic axis)
        if err is not None:
            raise err
        rows = [(tuple(shape), values)]
    else:
        rows = exchange_shapes(c, tuple(shape), values, what)
    raise_exchanged([v[0] for _, v in rows], err, what)
    mine = rows[c.rank][1][1:]
    odd = next((r for r, (_, v) in enumerate(rows) if v[1:] != mine), None)
    if odd is not None:
        raise MismatchError(
            f"{what}: ranks {c.rank} and {odd} disagree on the number of arrays, their dtypes or dimensions, "
            f"halo or corners (this rank: {len(fields)} array(s), halo {list(widths)}, corners {corners}); "
            "set HPCCOLL_CHECK=1 for a detailed report"
        )
    # Every pair of neighbours is checked on every rank (the same verdict everywhere), once per layout.
    key = (tuple(row[0] for row in rows), tuple(ndims), widths, corners)
    checked = c.state.setdefault("halo layouts checked", set())
    if key not in checked:
        _check_neighbours(c, list(key[0]), ndims, widths, corners, what)
        if len(checked) >= 64:
            checked.clear()
        checked.add(key)


def _check_neighbours(
    c: Any, shapes: List[Tuple[int, ...]], ndims: List[int], widths: Tuple[int, ...], corners: bool, what: str
) -> None:
    """Every pair of neighbours, on every rank alike: owned cells enough for the halo, matching faces."""
    grid = c.grid
    d = len(grid.dims)
    steps = _directions(d, corners)
    for r in range(c.size):
        split = _split(shapes[r], ndims)
        for o in steps:
            q = grid.neighbour(r, o)
            if q is None:
                continue
            theirs = _split(shapes[q], ndims)
            for k, (mine, other) in enumerate(zip(split, theirs)):
                for i, (step, h) in enumerate(zip(o, widths)):
                    owned_q, owned_r = other[i] - 2 * h, mine[i] - 2 * h
                    if step and h > owned_q:
                        raise ArgumentError(
                            f"halo: expected halo[{i}] == {h} <= the owned extent along axis {i} of every "
                            f"neighbour; got rank {q} (neighbour of rank {r}) with {owned_q} owned cells"
                        )
                    if not step and owned_q != owned_r:
                        raise MismatchError(
                            f"{what}: ranks {r} and {q} neighbour along direction {o} but own {owned_r} and "
                            f"{owned_q} cells along axis {i} of array {k} (a block decomposition gives neighbours "
                            "across one axis the same extents along the others)"
                        )
                if mine[d:] != other[d:]:
                    raise MismatchError(
                        f"{what}: ranks {r} and {q} have different trailing extents {mine[d:]} and {other[d:]} "
                        f"of array {k}"
                    )


def _split(flat_shape: Sequence[int], ndims: List[int]) -> List[Tuple[int, ...]]:
    out, at = [], 0
    for n in ndims:
        out.append(tuple(flat_shape[at : at + n]))
        at += n
    return out


def _layout(c: Any, grid: Any, shapes: List[Tuple[int, ...]], widths: Tuple[int, ...], corners: bool) -> _Layout:
    """The regions of every message, in the order both ends list them (the sender's directions)."""
    d = len(grid.dims)
    steps = _directions(d, corners)
    index = {o: k for k, o in enumerate(steps)}
    sends: Dict[int, List[Tuple[int, int, Region]]] = {}
    recvs: Dict[int, List[Tuple[int, int, Region]]] = {}
    for o in steps:
        if any(step and not h for step, h in zip(o, widths)):
            continue  # no layers on a side this direction crosses: nothing to move
        q = grid.neighbour(c.rank, o)
        if q is None:
            continue
        back = tuple(-s for s in o)
        for i, shape in enumerate(shapes):
            sends.setdefault(q, []).append((index[o], i, _region(shape, widths, o, ghost=False)))
            # what q sent in its direction -o lands in this rank's ghosts at side o
            recvs.setdefault(q, []).append((index[back], i, _region(shape, widths, o, ghost=True)))
    return _Layout(
        {q: [(i, r) for _, i, r in sorted(v, key=lambda t: (t[0], t[1]))] for q, v in sends.items()},
        {q: [(i, r) for _, i, r in sorted(v, key=lambda t: (t[0], t[1]))] for q, v in recvs.items()},
    )
