"""Halo exchange on a Cartesian process grid, and its adjoint; one array or a list, blocking or not.

A rank's array is its block of a global array *with* its ghost layers:
``halo[i]`` layers on each side of grid axis ``i``. The forward fills every
ghost that stands for a cell inside the domain with the owner's value; the
adjoint adds each such ghost's cotangent into the owned cell it came from and
zeroes the ghost. Both are one ``sendrecv`` of the transport contract: host
MPI posts an ``Irecv`` into each ghost region and an ``Isend`` of each
boundary region, straight from the array, contiguous or strided (MPI derived
datatypes, up to the transport's ``strided_messages``: :func:`_in_place`);
other regions, and every strided one on a transport that moves only
contiguous buffers (NCCL, staged, cuda_mpi), are packed into buffers of the
exchange's own (the contract's default ``sendrecv`` is one all-to-all of the
packed bytes; NCCL groups its sends and receives). A plan (:func:`hpccoll.plan`)
keeps those buffers and repacks them on each call (:class:`_Refilled`); on
host MPI its messages are persistent requests on every layout.

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

Kept exchanges: a stencil code exchanges the same array, in place (or into the
same ``out``), every step. When every rank makes the same such call a second
time (one NumPy array, no check mode), the ranks prepare its messages together
once, as a plan would (:meth:`hpccoll.transports.Selector.form`: MPI
persistent requests on host MPI), and keep them on the
communicator, up to :data:`KEEP` exchanges (each holds its arrays). A region
that the transport cannot move where it lies keeps its own send or receive
buffer: each call packs into it before the messages, or lands from it after
them. From then on every call of a communicator
with kept exchanges starts with one ``Allreduce`` (``MAX``) of two int64 (the serial
number of the kept exchange the call matches and its negative, or -1; an MPI
persistent request where MPI has them): where every rank
finds its call among the exchanges kept together, the prepared messages run and
nothing else is checked (nothing that was agreed can have changed: the same
arrays, shapes, strides, dtype, ``halo`` and ``corners``); else the call takes
the full road above. No rank can take one road while another takes the other.
"""

from __future__ import annotations

import functools
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
from .._request import Request
from .._spec import Hooks, register, same_shape
from ..transports._control import MAX_DIMS, exchange_shapes
from ..transports._mpitypes import contiguous_run, strided
from ..transports.shm import holder_of

__all__ = ["halo_exchange", "halo_of", "corners_of", "HALO_EXCHANGE"]

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


def corners_of(corners: Any) -> bool:
    """``corners`` checked: a bool (NumPy's too)."""
    if not isinstance(corners, (bool, np.bool_)):
        raise ArgumentError(f"corners: expected a bool; got {corners!r}")
    return bool(corners)


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


#: The most exchanges a communicator keeps prepared (each keeps its ``x`` and ``out`` alive until it is
#: dropped, the oldest first, or the communicator is freed).
KEEP = 8
#: ``Communicator.state`` keys: the kept exchanges, the calls seen (those that may be kept when seen again).
_KEPT, _SEEN, _GATE = "halo kept exchanges", "halo calls seen", "halo kept exchanges' agreement"


class _Kept:
    """An exchange prepared once on every rank (together, so its ``serial`` is the same everywhere)."""

    __slots__ = (
        "x",
        "out",
        "key",
        "serial",
        "transport",
        "prepared",
        "first",
        "then",
        "shape",
        "strides",
        "dtype",
        "halo",
        "corners",
        "packs",
        "unpacks",
        "out_layout",
    )

    def __init__(self, x: Any, out: Any, key: tuple, serial: int, transport: Any, prepared: Any, copies: tuple) -> None:
        self.x, self.out, self.key, self.serial = x, out, key, serial  # key: what the call must repeat
        self.transport, self.prepared = transport, prepared  # the Prepared sendrecv
        # the regions that are not contiguous in out, as (destination, source) pairs for numpy.copyto: packed
        # into the prepared send buffers before the messages (buffer, region), landed from the prepared
        # receive buffers after them (region, buffer)
        self.packs, self.unpacks = copies
        # its run as one or two calls made here (a persistent request's Start and Wait), a frame saved
        self.first, self.then = _two_steps(prepared)
        # the key's parts, compared one by one where a call passes the same halo object as the last (an int
        # or a tuple: immutable, so the same value in the same types)
        self.shape, self.strides, self.dtype, _, self.corners = key
        self.halo: Any = None
        # a separate out must keep its layout too (the regions are views of it; a rank whose out was reshaped
        # in place takes the full road, which refuses it on every rank)
        self.out_layout = None if out is x else (out.shape, out.strides, out.dtype)

    def repeats(self, x: Any, out: Any, halo: Any, corners: Any) -> bool:
        """Whether a call of the kept arrays repeats the kept one (remembering a plain ``halo`` that does)."""
        if self.out_layout is not None and (out.shape, out.strides, out.dtype) != self.out_layout:
            return False
        if not out.flags.writeable:  # made read-only since: the full road refuses it on every rank
            return False
        if (
            halo is self.halo
            and corners is self.corners
            and x.shape == self.shape
            and x.strides == self.strides
            and x.dtype is self.dtype
        ):
            return True
        if _call_key(x, halo, corners, len(self.key[3])) != self.key:
            return False
        if type(halo) in (int, tuple):
            self.halo = halo
        return True


class _Gate:
    """The agreement every call of a communicator with kept exchanges makes: one ``Allreduce`` (``MAX``) of
    two int64, prepared once (an MPI persistent request where MPI has them), set and read through
    memoryviews (a few times cheaper than NumPy's scalar indexing)."""

    __slots__ = ("mine", "every", "first", "then", "prepared", "last")

    def __init__(self, c: Any) -> None:
        self.last: Any = None  # the kept exchange last recalled (tried first)
        mine, every = np.zeros(2, np.int64), np.zeros(2, np.int64)
        self.prepared = c.host_transport().prepare("allreduce", (mine, every, "max"), "persistent")
        self.mine, self.every = mine.data, every.data
        self.first, self.then = _two_steps(self.prepared)


def _two_steps(prepared: Any) -> Tuple[Callable[[], Any], Callable[[], Any]]:
    """A Prepared call's run as two calls in a row (the second may do nothing)."""
    steps = prepared.steps
    if len(steps) == 2:
        return steps[0], steps[1]
    return prepared.run, _nothing


_nothing = ().__len__  # a call that does nothing, made in C


def _call_key(x: Any, halo: Any, corners: Any, d: int) -> Any:
    """What a call must repeat to run a kept exchange (shape, strides, dtype, ``halo`` as ``d`` widths,
    ``corners``), or ``None`` where it may not be kept (arguments in types other than the plain ones, which
    the full road checks: an int, or a list or tuple of ints; a bool)."""
    if type(halo) is int:
        halo = (halo,) * d
    elif type(halo) in (tuple, list) and all(type(h) is int for h in halo):
        halo = tuple(halo)
    else:
        return None
    if type(corners) is not bool:
        return None
    return (x.shape, x.strides, x.dtype, halo, corners)


def _recalled(
    c: Any, kept: Dict[Tuple[int, int], _Kept], x: Any, out: Any, halo: Any, corners: Any, async_op: bool, adjoint: bool
) -> Any:
    """The result through a kept exchange where every rank's call is one kept together; else ``None``.

    The cost every kept call pays on top of its messages, so written for speed: the last kept exchange
    recalled is tried before the dictionary, its arguments compared by identity where they can be, then the
    agreement (two int64 set through memoryviews, one small ``Allreduce``)."""
    gate: _Gate = c.state[_GATE]
    entry: Any = None
    if not adjoint:  # the adjoint is never kept, but makes the agreement too
        entry = gate.last
        if entry is None or entry.x is not x or entry.out is not out:
            entry = kept.get((id(x), id(out)))
    serial = -1
    if entry is not None and entry.x is x and entry.out is out and entry.repeats(x, out, halo, corners):
        serial = entry.serial
        gate.last = entry
    mine, every = gate.mine, gate.every
    mine[0], mine[1] = serial, -serial
    gate.first()
    gate.then()
    if every[0] != -every[1] or serial < 0:  # not the same kept exchange on every rank
        return None
    if out is not x:
        np.copyto(out, x)
    for dst, src in entry.packs:
        np.copyto(dst, src)
    if not async_op:
        entry.first()
        entry.then()
        for dst, src in entry.unpacks:
            np.copyto(dst, src)
        return out
    return _start(entry)


def _start(entry: _Kept) -> Request:
    """Start a kept exchange on ``out``'s current contents (packed already): a request of ``out``."""
    finish: Callable[[], Any] = Ready(entry.out) if not entry.unpacks else functools.partial(_land, entry)
    return Request([entry.prepared.start()], entry.transport.bind_finish(finish), (entry.x, entry.out))


def _land(entry: _Kept) -> Any:
    """A kept exchange's finishing step where some ghost regions are not contiguous: ``out``, landed."""
    for dst, src in entry.unpacks:
        np.copyto(dst, src)
    return entry.out


def _seen_again(c: Any, x: Any, out: Any, key: Any) -> bool:
    """Whether this rank made this call before (it is then worth keeping); remembers it."""
    seen = c.state.setdefault(_SEEN, {})
    mark = (id(x), id(out), key)
    again = seen.pop(mark, False)  # then re-inserted last: marks are dropped oldest first
    seen[mark] = True
    if len(seen) > KEEP:
        del seen[next(iter(seen))]
    return again


def _keep(c: Any, transport: Any, x: Any, out: Any, key: Any, args: tuple, copies: tuple) -> _Kept:
    """Prepare the exchange's messages on every rank (collective) and keep them, dropping the oldest."""
    kept = c.state.setdefault(_KEPT, {})
    serial = c.state[_KEPT + " made"] = c.state.get(_KEPT + " made", 0) + 1
    if _GATE not in c.state:  # the agreement every call makes from now on
        c.state[_GATE] = _Gate(c)
    c.state[_GATE].last = None  # it may be the one dropped below
    prepared = transport.prepare("sendrecv", args, c.selector.form(transport, "sendrecv", args))
    replaced = kept.pop((id(x), id(out)), None)  # the same arrays kept before, with another shape or halo
    if replaced is not None:
        replaced.prepared.free()
    elif len(kept) >= KEEP:
        kept.pop(next(iter(kept))).prepared.free()
    entry = kept[(id(x), id(out))] = _Kept(x, out, key, serial, transport, prepared, copies)
    return entry


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
    kept = c.state.get(_KEPT)
    if kept and not c.check:  # kept together, so every rank has some: every rank asks alike (the adjoint too)
        got = _recalled(c, kept, x, out, halo, corners, async_op, adjoint)
        if got is not None:
            return got
    many = type(x) is not np.ndarray and list_types(x) is not None
    grid, widths, fields, kind, err = _checked(x, c, halo, corners, out, async_op, many)
    if grid is None:  # no process grid: nothing to exchange with; this rank's error is every rank's (same comm)
        assert err is not None
        raise err
    layout = None if err is not None else _layout_of(c, grid, fields, widths, bool(corners))
    key, shared = None, False
    if layout is not None and not (many or adjoint) and type(x) is np.ndarray and out is not None:
        # node-shared: a field from shared_empty exchanged in place, every message a view of out (nothing packed,
        # nothing landed: shm reads the boundaries in place)
        shared = _views(fields[0].out, layout) and out is x and holder_of(x) is not None
        if not c.check:  # worth keeping: a plain call into a fixed out, made before
            key = _call_key(x, halo, corners, len(widths))
            if key is not None and not _seen_again(c, x, out, key):
                key = None
    keep, shared = _agree(
        c, fields, widths, bool(corners) if err is None else False, what, err, key is not None, shared
    )
    assert layout is not None  # _agree raised every rank's error
    xp = module_of(kind)
    results = [f.out for f in fields]
    # Every rank's field in node-shared memory: the transport that reads the neighbours' boundaries in place;
    # else the smallest messages' transport. A choice every rank makes alike.
    transport = c.shared_transport() if shared else c.transport_of(kind)
    # the largest strided face the transport moves where it lies (NumPy views; 0: none)
    limit = getattr(transport, "strided_messages", 0) if kind == "numpy" else 0
    outgoing, incoming, packs, zeros, landing = _messages(results, layout, adjoint, xp, limit)
    copies = [(f.out, f.x) for f in fields if f.out is not f.x]

    def refill() -> None:
        """Everything before the messages: out from x, the sent copies from their regions."""
        for dst, src in itertools.chain(copies, packs):
            xp.copyto(dst, src)

    refill()

    def finish() -> Any:
        for region in zeros:  # the adjoint's sent ghosts (sent as copies)
            region[...] = 0
        for buf, target in landing:
            piece = buf.reshape(target.shape)
            if adjoint:
                target += piece
            else:
                target[...] = piece
        return results if many else results[0]

    if not outgoing and not incoming:
        return done(finish(), async_op, kind)
    if keep:  # every rank wants it: prepared together (its pack and land buffers kept with it), run now
        assert key is not None
        unpacks = [(target, buf.reshape(target.shape)) for buf, target in landing]
        entry = _keep(c, transport, x, out, key, (outgoing, incoming), (packs, unpacks))
        if not async_op:
            entry.prepared.run()
            return _land(entry)
        return _start(entry)
    # Every ghost received straight into place: nothing is left to finish.
    step: Callable[[], Any] = Ready(results[0]) if not landing and not many else finish
    if copies or packs or landing:  # what a plan reruns before the messages, and the result (hpccoll.plan)
        fills = [dst for dst, _ in itertools.chain(copies, packs)]
        step = _Refilled(step, refill, fills, results if many else results[0])
    return launch(transport, "sendrecv", (outgoing, incoming), step, async_op)


class _Refilled:
    """A finishing step, and what a rerun of the same messages does first (:func:`hpccoll.plan` reads it).

    ``refill`` rewrites every buffer in ``fills`` (``out``, the sent copies of regions that are not
    contiguous) from ``x``'s current contents; a plan whose messages send only ``x`` and ``fills`` runs
    ``refill``, the prepared messages and the finishing step, whose ``result`` is known without running it
    (the adjoint's finishing step writes ``out``: run without its messages, it would spoil ``x``).
    """

    __slots__ = ("finish", "refill", "fills", "result")

    def __init__(self, finish: Callable[[], Any], refill: Callable[[], None], fills: List[Any], result: Any) -> None:
        self.finish, self.refill, self.fills, self.result = finish, refill, fills, result

    def __call__(self) -> Any:
        return self.finish()


def _checked(
    x: Any, c: Any, halo: Any, corners: Any, out: Any, async_op: bool, many: bool
) -> Tuple[Any, Tuple[int, ...], List[_Field], str, Any]:
    """The call's arguments checked on this rank: ``(grid, widths, fields, kind, error)``; ``grid`` is
    ``None`` for a communicator without one, and ``error`` this rank's ``HpccollError`` (or ``None``), which
    the agreement hands every rank."""
    fields: List[_Field] = []
    kind, err = "numpy", None
    widths: Tuple[int, ...] = ()
    grid = None
    try:
        grid = c.grid
        d = len(grid.dims)
        widths = halo_of(halo, d)
        corners_of(corners)
        if many:
            lst = survey_list(x, list_types(x) or set(), async_op)
            arrays, kind = lst.arrays, lst.kind
            names = [f"x[{i}]" for i in range(len(arrays))]
            outs = outs_of(out, len(arrays))
        else:
            a, kind, _ = one_array(x)
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
    return grid, widths, fields, kind, err


def _messages(
    results: List[Any], layout: _Layout, adjoint: bool, xp: Any, limit: int
) -> Tuple[list, list, list, list, list]:
    """The exchange's messages on the results: ``(outgoing, incoming, packs, zeros, landing)``.

    ``outgoing``/``incoming`` are the transport's ``(buffer, rank)`` lists in message order: the regions
    themselves where they are contiguous, or strided and moved so (:func:`_in_place`: host MPI's derived
    datatypes), else buffers of their own. ``packs`` pairs each sent buffer that is not its region
    (shaped as the region) with that region, to be filled before the messages (the adjoint sends copies of
    its ghosts, then ``zeros`` them); ``landing`` pairs each receive buffer that is not its region with that
    region (the adjoint adds what arrives into the owned cells).
    """
    sends, recvs = (layout.recvs, layout.sends) if adjoint else (layout.sends, layout.recvs)
    outgoing: List[Tuple[Any, int]] = []
    packs: List[Tuple[Any, Any]] = []
    zeros: List[Any] = []
    for q in sorted(sends):
        for i, r in sends[q]:
            piece = results[i][r]
            if adjoint or not _in_place(piece, limit):
                buf = xp.empty(piece.shape, piece.dtype)
                packs.append((buf, piece))
                outgoing.append((buf.reshape(-1), q))
                if adjoint:
                    zeros.append(piece)
            else:
                outgoing.append((piece.reshape(-1) if piece.flags.c_contiguous else piece, q))
    incoming: List[Tuple[Any, int]] = []
    landing: List[Tuple[Any, Any]] = []
    for q in sorted(recvs):
        for i, r in recvs[q]:
            target = results[i][r]
            if adjoint or not _in_place(target, limit):
                buf = xp.empty(target.size, target.dtype)
                incoming.append((buf, q))
                landing.append((buf, target))
            else:  # straight into the ghosts
                incoming.append((target.reshape(-1) if target.flags.c_contiguous else target, q))
    return outgoing, incoming, packs, zeros, landing


def _in_place(region: Any, limit: int) -> bool:
    """Whether a message moves ``region`` where it lies: contiguous, or strided and within ``limit`` bytes or
    in contiguous runs of at least ``limit`` bytes (a transport's ``strided_messages``; 0: never)."""
    if region.flags.c_contiguous:
        return True
    if not limit or not strided(region):
        return False
    return region.nbytes <= limit or contiguous_run(region) >= limit


def _layout_of(c: Any, grid: Any, fields: List[_Field], widths: Tuple[int, ...], corners: bool) -> _Layout:
    """The messages' regions for these arrays' shapes (cached on the communicator)."""
    key = (tuple(f.x.shape for f in fields), widths, corners)
    layouts = c.state.setdefault("halo layouts", {})
    layout = layouts.get(key)
    if layout is None:
        if len(layouts) >= 64:
            layouts.clear()
        layout = layouts[key] = _layout(c, grid, list(key[0]), widths, corners)
    return layout


def _views(out: Any, layout: _Layout) -> bool:
    """Whether every region the forward sends or receives is C-contiguous in ``out`` (moved without copies)."""
    return all(out[r].flags.c_contiguous for side in (layout.sends, layout.recvs) for v in side.values() for _, r in v)


def _agree(
    c: Any, fields: List[_Field], widths: Tuple[int, ...], corners: bool, what: str, err: Any, keep: bool, shared: bool
) -> Tuple[bool, bool]:
    """One all-gather of every rank's arguments: errors, dtypes, shapes, ``halo`` and ``corners`` checked alike.

    Returns whether every rank wants to keep this exchange (``keep``) and whether every rank's
    field is node-shared (``shared``): the same on every rank.
    """
    shape = [n for f in fields for n in f.x.shape]
    codes = [dtype_code(f.x.dtype) for f in fields]
    ndims = [f.x.ndim for f in fields]
    if err is not None or len(shape) > MAX_DIMS:
        if err is None:
            err = ArgumentError(f"x: expected at most {MAX_DIMS} dimensions over all arrays; got {len(shape)}")
        shape, codes, ndims = [], [], []
    values = [
        status_of(err),
        int(corners),
        len(fields),
        *widths,
        hash((tuple(codes), tuple(ndims))),
        int(keep) + 2 * shared,
    ]
    if c.size == 1:  # nothing to exchange; the rank may still be its own neighbour (a periodic axis)
        if err is not None:
            raise err
        rows = [(tuple(shape), values)]
    else:
        rows = exchange_shapes(c, tuple(shape), values, what)
    raise_exchanged([v[0] for _, v in rows], err, what)
    mine = rows[c.rank][1][1:-1]
    odd = next((r for r, (_, v) in enumerate(rows) if v[1:-1] != mine), None)
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
    return all(v[-1] & 1 for _, v in rows), all(v[-1] & 2 for _, v in rows)


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
    steps = _directions(len(grid.dims), corners)
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


# --------------------------------------------------------------------------- the pair's spec


def _configure(comm: Any, keywords: Dict[str, Any]) -> Dict[str, Any]:
    """``halo`` and ``corners`` checked against ``comm``'s process grid (``comm.grid``: an ArgumentError naming
    ``comm`` without one), locally; what depends on the arrays the exchange checks, on every rank alike."""
    widths = halo_of(keywords.get("halo"), len(comm.grid.dims))
    return {**keywords, "halo": widths, "corners": corners_of(keywords.get("corners", False))}


#: The halo exchange's spec: ``halo`` and ``corners`` checked; the result has the input's shape.
HALO_EXCHANGE = register(
    Hooks("halo_exchange", _configure, same_shape(_configure), "sendrecv", example=lambda size: {"halo": 1})
)
