"""Halo exchange on a Cartesian grid (halo_exchange, its adjoint, HaloExchange, Communicator.cartesian) against NumPy.

Written from the spec (notes/halo_spec.md), as an independent check of the implementation. Every rank builds the
same global array from a seed; the rank at grid coordinates ``c`` owns the block ``G[lo_c:hi_c, ...]`` (uneven
extents, shared within each grid slab, as a block decomposition of ``G`` is) padded with ``halo`` ghost layers of
random values. The expected result replaces each ghost cell that stands for a global cell inside the domain (after
the periodic wrap) with that cell's value: with ``corners=False`` only the ghosts outside the owned range along
exactly one axis, with ``corners=True`` also those outside along several. The adjoint's reference scatter-adds
every rank's cotangents of those ghosts into the owner's cells (computed on every rank from every rank's seed) and
zeroes the filled ghosts. Ranks are laid out in MPI's row-major order (reorder=False keeps their numbers). Every
verdict is collective (:func:`conftest.agree`), so a failure raises on every rank at once.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from conftest import Verdict, agree, assert_same, make, raises_everywhere
from mpi4py import MPI

import hpccoll
from hpccoll import ArgumentError, DTypeError, MismatchError
from hpccoll.collectives import halo as halo_module
from hpccoll.testing import dottest

pytestmark = pytest.mark.mpi

DTYPES = [np.dtype(n) for n in ["float64", "float32", "int32", "complex128", "bool"]]

#: Grid shapes as functions of the number of ranks P (0 entries: MPI_Dims_create chooses).
GRIDS = {
    "P": lambda p: [p],
    "Px1": lambda p: [p, 1],
    "1xP": lambda p: [1, p],
    "2x2": lambda p: [2, 2],
    "auto2d": lambda p: [0, 0],
    "auto3d": lambda p: [0, 0, 0],
}
PERIODIC = {1: [False, True], 2: [False, True, (True, False), (False, True)], 3: [False, True, (False, True, True)]}
HALOS = {1: [0, 1, 2, (2,)], 2: [0, 1, 2, (2, 1), [0, 2]], 3: [0, 1, 2, [1, 0, 2]]}


def extent(axis, coord):
    """The owned extent along ``axis`` of the blocks at grid coordinate ``coord``: 2, 3 or 4 (uneven)."""
    return 2 + (2 * coord + axis) % 3


def per_axis(value, nd):
    return tuple(value) if isinstance(value, (list, tuple)) else (value,) * nd


class Layout:
    """The block decomposition of a global array over a grid, with ghost layers, and the NumPy references."""

    def __init__(self, dims, periodic, halo, extent=extent):
        self.dims = tuple(int(d) for d in dims)
        self.nd = len(self.dims)
        self.periodic = tuple(bool(p) for p in per_axis(periodic, self.nd))
        self.halo = tuple(int(h) for h in per_axis(halo, self.nd))
        self.sizes = [[extent(a, c) for c in range(d)] for a, d in enumerate(self.dims)]
        self.starts = [np.concatenate([[0], np.cumsum(s)]).astype(int) for s in self.sizes]
        self.N = tuple(int(st[-1]) for st in self.starts)
        self.P = int(np.prod(self.dims))

    def coords(self, r):
        return tuple(int(c) for c in np.unravel_index(r, self.dims))

    def shape(self, r, trailing=()):
        return tuple(self.sizes[a][c] + 2 * self.halo[a] for a, c in enumerate(self.coords(r))) + tuple(trailing)

    def interior(self, r):
        return tuple(slice(self.halo[a], self.halo[a] + self.sizes[a][c]) for a, c in enumerate(self.coords(r)))

    def block(self, r):
        return tuple(slice(self.starts[a][c], self.starts[a][c + 1]) for a, c in enumerate(self.coords(r)))

    def ghosts(self, r, corners):
        """Per axis, the global index each local cell stands for (mod N), and the mask of the ghosts filled."""
        src, ok, outside = [], [], []
        for a, c in enumerate(self.coords(r)):
            h, n = self.halo[a], self.sizes[a][c]
            shape = [1] * self.nd
            shape[a] = n + 2 * h
            g = self.starts[a][c] - h + np.arange(n + 2 * h)
            local = np.arange(n + 2 * h)
            src.append((g % self.N[a]).reshape(shape))
            ok.append((((g >= 0) & (g < self.N[a])) | self.periodic[a]).reshape(shape))
            outside.append(((local < h) | (local >= h + n)).reshape(shape))
        inside_domain = functools.reduce(np.logical_and, ok)
        count = functools.reduce(np.add, [o.astype(int) for o in outside])
        fill = inside_domain & ((count >= 1) if corners else (count == 1))
        return tuple(src), fill

    def make_x(self, r, G, seed, trailing=()):
        """Rank ``r``'s block of ``G`` with random ghosts."""
        x = make(self.shape(r, trailing), G.dtype, seed + 7919 * r)
        x[self.interior(r)] = G[self.block(r)]
        return x

    def forward(self, r, x, G, corners):
        src, fill = self.ghosts(r, corners)
        fill = fill.reshape(fill.shape + (1,) * (x.ndim - self.nd))
        return np.where(fill, G[src], x)

    def adjoint(self, r, gs, corners):
        """The adjoint on rank ``r`` given every rank's cotangent ``gs[q]``."""
        trailing = gs[0].shape[self.nd :]
        acc = np.zeros(self.N + trailing, gs[0].dtype)
        for q, g in enumerate(gs):
            src, fill = self.ghosts(q, corners)
            full = [np.broadcast_to(s, fill.shape)[fill] for s in src]
            np.add.at(acc, tuple(full), g[fill])
        _, fill = self.ghosts(r, corners)
        fill = fill.reshape(fill.shape + (1,) * len(trailing))
        want = np.where(fill, np.zeros((), gs[r].dtype), gs[r])
        want[self.interior(r)] += acc[self.block(r)]
        return want


def grid_dims(comm, name):
    dims = GRIDS[name](comm.size)
    if int(np.prod([d or 1 for d in dims])) != comm.size and 0 not in dims:
        pytest.skip(f"grid {name} needs {int(np.prod(dims))} ranks")  # the same on every rank
    return dims


def global_array(lay, dtype, seed, trailing=()):
    return make(lay.N + tuple(trailing), dtype, seed)


def check_exchange(v, cart, lay, halo, corners, dtype, trailing, seed, what, adjoint=True):
    """Forward (and adjoint) of one configuration on ``cart`` against the references."""
    P, me = cart.size, cart.rank
    G = global_array(lay, dtype, seed, trailing)
    x = lay.make_x(me, G, seed + 1, trailing)
    before = x.copy()
    y = hpccoll.halo_exchange(x, cart, halo=halo, corners=corners)
    v.same(y, lay.forward(me, x, G, corners), f"{what} forward")
    v.same(x, before, f"{what}: x modified")
    v.true(not np.shares_memory(y, x), f"{what}: the result shares x's memory")
    if adjoint:
        adt = np.dtype(np.float64) if dtype == np.bool_ else dtype
        gs = [make(lay.shape(q, trailing), adt, seed + 3 + 31 * q) for q in range(P)]
        g = gs[me].copy()
        got = hpccoll.halo_exchange_adjoint(g, cart, halo=halo, corners=corners)
        v.close(got, lay.adjoint(me, gs, corners), f"{what} adjoint ({adt})")
        v.same(g, gs[me], f"{what}: g modified by the adjoint")


def positive(a):
    """``a`` with its real and imaginary parts made >= 0.1: the dot test's sums cannot cancel to a few ulps."""
    if a.dtype.kind == "c":
        return (np.abs(a.real) + 0.1 + 1j * (np.abs(a.imag) + 0.1)).astype(a.dtype)
    return (np.abs(a) + 0.1).astype(a.dtype)


def dot(cart, lay, halo, corners, dtype, trailing, seed):
    """The dot test of HaloExchange (rtol 1e-12 in float64 and complex128, the default in narrower types)."""
    me = cart.rank
    x = positive(make(lay.shape(me, trailing), dtype, seed + 101 * me))
    y = positive(make(lay.shape(me, trailing), dtype, seed + 7 + 101 * me))
    rtol = 1e-12 if np.dtype(dtype).itemsize >= 8 else None
    assert dottest(hpccoll.HaloExchange(cart, halo=halo, corners=corners), x, y, comm=cart, rtol=rtol)


# --------------------------------------------------------------------------- the grid


@pytest.mark.parametrize("grid", list(GRIDS))
def test_cartesian(comm, grid):
    P, me = comm.size, comm.rank
    asked = grid_dims(comm, grid)
    want_dims = tuple(MPI.Compute_dims(P, asked))
    for periodic in PERIODIC[len(asked)]:
        with comm.cartesian(asked, periodic=periodic) as cart, Verdict(comm) as v:
            want_periodic = tuple(bool(p) for p in per_axis(periodic, len(asked)))
            v.true(isinstance(cart, hpccoll.Communicator), f"cartesian() returned {type(cart)}")
            v.true(tuple(cart.dims) == want_dims, f"dims {cart.dims}, want {want_dims}")
            v.true(isinstance(cart.dims, tuple), f"dims is a {type(cart.dims)}")
            v.true((cart.rank, cart.size) == (me, P), f"rank/size {cart.rank}/{cart.size}, want {me}/{P}")
            coords = tuple(int(c) for c in np.unravel_index(me, want_dims))
            v.true(tuple(cart.coords) == coords, f"coords {cart.coords}, want {coords}")
            v.true(tuple(cart.periodic) == want_periodic, f"periodic {cart.periodic}, want {want_periodic}")
            for a, d in enumerate(want_dims):
                want = []
                for step in (-1, 1):
                    c = list(coords)
                    c[a] += step
                    if 0 <= c[a] < d or want_periodic[a]:
                        c[a] %= d
                        want.append(int(np.ravel_multi_index(c, want_dims)))
                    else:
                        want.append(None)
                got = tuple(cart.neighbours(a))
                v.true(got == tuple(want), f"neighbours({a}) {got}, want {tuple(want)} (periodic {periodic})")
            # the new communicator works as any other
            total = hpccoll.all_reduce(np.array([me + 1.0]), cart)
            v.same(total, np.array([P * (P + 1) / 2]), "all_reduce on the Cartesian communicator")


# --------------------------------------------------------------------------- the sweep


@pytest.mark.parametrize("grid", list(GRIDS))
def test_sweep(comm, grid):
    """Every periodicity, halo (0, 1, 2, per axis) and corners setting of a grid: forward, adjoint and dot test."""
    asked = grid_dims(comm, grid)
    nd = len(asked)
    k = 0
    for periodic in PERIODIC[nd]:
        with comm.cartesian(asked, periodic=periodic) as cart, Verdict(cart) as v:
            for halo in HALOS[nd]:
                for corners in (False, True):
                    lay = Layout(cart.dims, periodic, halo)
                    dtype = DTYPES[k % len(DTYPES)]
                    trailing = [(3,), (), (2, 2)][k % 3]
                    what = (
                        f"{grid} dims {cart.dims} periodic {periodic} halo {halo} corners {corners} {dtype} {trailing}"
                    )
                    check_exchange(v, cart, lay, halo, corners, dtype, trailing, 1000 + 10 * k, what)
                    if dtype != np.float64:  # float64 on every configuration
                        check_exchange(v, cart, lay, halo, corners, np.dtype(np.float64), (3,), 5000 + 10 * k, what)
                    try:
                        dot(cart, lay, halo, corners, np.float64, trailing, 9000 + k)
                    except AssertionError as exc:
                        v.errors.append(f"{what} dot test (float64): {exc}"[:1500])
                    k += 1


@pytest.mark.parametrize("dtype", DTYPES, ids=[d.name for d in DTYPES])
def test_dtypes_and_out(comm, dtype):
    me = comm.rank
    periodic = (True, False)
    with comm.cartesian([0, 0], periodic=periodic) as cart, Verdict(cart) as v:
        for halo, corners in [((1, 2), True), (2, False)]:
            lay = Layout(cart.dims, periodic, halo)
            trailing = (3,)
            G = global_array(lay, dtype, 11, trailing)
            x = lay.make_x(me, G, 12, trailing)
            before = x.copy()
            want = lay.forward(me, x, G, corners)
            v.same(hpccoll.halo_exchange(x, cart, halo=halo, corners=corners), want, f"{dtype} {halo}")
            out = np.zeros_like(x)
            got = hpccoll.halo_exchange(x, cart, halo=halo, corners=corners, out=out)
            v.true(got is out, f"{dtype} {halo}: out= not returned")
            v.same(out, want, f"{dtype} {halo} out=")
            v.same(x, before, f"{dtype} {halo}: x modified")
            if dtype != np.bool_:
                gs = [make(lay.shape(q, trailing), dtype, 40 + q) for q in range(cart.size)]
                out = np.zeros_like(gs[me])
                got = hpccoll.halo_exchange_adjoint(gs[me], cart, halo=halo, corners=corners, out=out)
                v.true(got is out, f"{dtype} {halo}: adjoint out= not returned")
                v.close(out, lay.adjoint(me, gs, corners), f"{dtype} {halo} adjoint out=")
            if dtype.kind in "fc":
                try:
                    dot(cart, lay, halo, corners, dtype, trailing, 77)
                except AssertionError as exc:
                    v.errors.append(f"{dtype} dot test: {exc}"[:1500])


@pytest.mark.timeout(60)
def test_out_of_the_wrong_shape_or_dtype(comm):
    me = comm.rank
    with comm.cartesian([0, 0], periodic=True) as cart:
        lay = Layout(cart.dims, True, 1)
        x = make(lay.shape(me, (2,)), np.float64, 3)
        for fn in (hpccoll.halo_exchange, hpccoll.halo_exchange_adjoint):
            wrong = np.empty(x.shape[:-1] + (3,))
            raises_everywhere(cart, ArgumentError, "out", lambda: fn(x, cart, halo=1, out=wrong), same_message=False)
            raises_everywhere(
                cart,
                (ArgumentError, DTypeError),
                "out",
                lambda: fn(x, cart, halo=1, out=np.empty(x.shape, np.float32)),
                same_message=False,
            )
            ok = np.empty_like(x)
            agree(cart, fn(x, cart, halo=1, out=ok) is ok, f"{fn.__name__}: out= not returned after the errors")


def test_layouts(comm):
    """Non-contiguous x and out (a halo exchange is often called on a view)."""
    me = comm.rank
    periodic = (False, True)
    with comm.cartesian([0, 0], periodic=periodic) as cart, Verdict(cart) as v:
        lay = Layout(cart.dims, periodic, (2, 1))
        G = global_array(lay, np.float64, 21, (2,))
        x = lay.make_x(me, G, 22, (2,))
        want = lay.forward(me, x, G, True)
        for name, view in [("F", np.asfortranarray(x)), ("strided", np.repeat(x, 2, axis=1)[:, ::2])]:
            v.same(hpccoll.halo_exchange(view, cart, halo=(2, 1), corners=True), want, f"{name} x")
            out = np.zeros(x.shape[::-1]).T
            hpccoll.halo_exchange(view, cart, halo=(2, 1), corners=True, out=out)
            v.same(out, want, f"{name} x, transposed out")


def test_in_place(comm):
    """out=x (documented by the implementation: the exchange in place), forward and adjoint."""
    P, me = comm.size, comm.rank
    for periodic in [True, (False, True)]:
        with comm.cartesian([0, 0], periodic=periodic) as cart, Verdict(cart) as v:
            for halo, corners in [(1, True), ((2, 1), False)]:
                lay = Layout(cart.dims, periodic, halo)
                G = global_array(lay, np.float64, 25, (3,))
                x = lay.make_x(me, G, 26, (3,))
                want = lay.forward(me, x, G, corners)
                got = hpccoll.halo_exchange(x, cart, halo=halo, corners=corners, out=x)
                v.true(got is x, f"{periodic} {halo}: out=x not returned")
                v.same(x, want, f"{periodic} {halo} {corners} in place")
                gs = [make(lay.shape(q, (3,)), np.float64, 27 + q) for q in range(P)]
                g = gs[me].copy()
                got = hpccoll.halo_exchange_adjoint(g, cart, halo=halo, corners=corners, out=g)
                v.true(got is g, f"{periodic} {halo}: adjoint out=g not returned")
                v.close(g, lay.adjoint(me, gs, corners), f"{periodic} {halo} {corners} adjoint in place")


# --------------------------------------------------------------------------- async, lists, operator


def test_async(comm):
    me = comm.rank
    with comm.cartesian([0, 0], periodic=(True, False)) as cart, Verdict(cart) as v:
        for halo, corners in [(1, False), ((2, 1), True)]:
            lay = Layout(cart.dims, (True, False), halo)
            G = global_array(lay, np.complex128, 31, (3,))
            x = lay.make_x(me, G, 32, (3,))
            g = make(x.shape, np.float32, 33 + me)
            for name, fn, arg in [
                ("forward", hpccoll.halo_exchange, x),
                ("adjoint", hpccoll.halo_exchange_adjoint, g),
            ]:
                want = fn(arg, cart, halo=halo, corners=corners)
                req = fn(arg, cart, halo=halo, corners=corners, async_op=True)
                v.true(isinstance(req, hpccoll.Request), f"{name}: async_op=True returned {type(req)}")
                v.same(req.wait(), want, f"{name} async {halo} {corners}")
                out = np.zeros_like(arg)
                req = fn(arg, cart, halo=halo, corners=corners, out=out, async_op=True)
                v.true(req.wait() is out, f"{name}: async out= not returned")
                v.same(out, want, f"{name} async out= {halo} {corners}")
            v.same(
                hpccoll.halo_exchange(x, cart, halo=halo, corners=corners), lay.forward(me, x, G, corners), "blocking"
            )
            # two in flight at once (the same neighbours), waited in the other order
            G2 = global_array(lay, np.int32, 34, ())
            x2 = lay.make_x(me, G2, 35)
            first = hpccoll.halo_exchange(x, cart, halo=halo, corners=corners, async_op=True)
            second = hpccoll.halo_exchange(x2, cart, halo=halo, corners=corners, async_op=True)
            v.same(second.wait(), lay.forward(me, x2, G2, corners), "second in flight")
            v.same(first.wait(), lay.forward(me, x, G, corners), "first in flight")


def test_lists(comm):
    P, me = comm.size, comm.rank
    periodic = (True, True)
    with comm.cartesian([0, 0], periodic=periodic) as cart, Verdict(cart) as v:
        for halo, corners in [(1, True), ((2, 0), False)]:
            lay = Layout(cart.dims, periodic, halo)
            Gs = [global_array(lay, np.float64, 51, (3,)), global_array(lay, np.int32, 52)]
            xs = [lay.make_x(me, G, 53 + i, G.shape[lay.nd :]) for i, G in enumerate(Gs)]
            befores = [a.copy() for a in xs]
            wants = [lay.forward(me, a, G, corners) for a, G in zip(xs, Gs)]
            got = hpccoll.halo_exchange(xs, cart, halo=halo, corners=corners)
            v.true(isinstance(got, list) and len(got) == 2, f"list form returned {type(got)}")
            for j, (a, w) in enumerate(zip(got, wants)):
                v.same(a, w, f"list [{j}] {halo} {corners}")
            outs = [np.zeros_like(a) for a in xs]
            res = hpccoll.halo_exchange(xs, cart, halo=halo, corners=corners, out=outs)
            v.true(all(a is b for a, b in zip(res, outs)), "list out= not returned")
            for j, (a, w) in enumerate(zip(outs, wants)):
                v.same(a, w, f"list out= [{j}]")
            res = hpccoll.halo_exchange(xs, cart, halo=halo, corners=corners, async_op=True).wait()
            for j, (a, w) in enumerate(zip(res, wants)):
                v.same(a, w, f"async list [{j}]")
            for j, (a, b) in enumerate(zip(xs, befores)):
                v.same(a, b, f"list input [{j}] modified")
            gs = [
                [make(lay.shape(q, (3,)), np.float64, 60 + q) for q in range(P)],
                [make(lay.shape(q, (2,)), np.float32, 70 + q) for q in range(P)],
            ]
            got = hpccoll.halo_exchange_adjoint([f[me] for f in gs], cart, halo=halo, corners=corners)
            for j, (a, f) in enumerate(zip(got, gs)):
                v.close(a, lay.adjoint(me, f, corners), f"adjoint list [{j}] {halo} {corners}")


def test_operator_and_pairing(comm):
    me = comm.rank
    assert hpccoll.adjoint_of(hpccoll.halo_exchange) is hpccoll.halo_exchange_adjoint
    assert hpccoll.adjoint_of(hpccoll.halo_exchange_adjoint) is hpccoll.halo_exchange
    for name in ["halo_exchange", "halo_exchange_adjoint", "HaloExchange"]:
        assert name in hpccoll.__all__, name
    periodic = (False, True)
    with comm.cartesian([0, 0], periodic=periodic) as cart, Verdict(cart) as v:
        for halo, corners in [(1, True), ((1, 2), False)]:
            lay = Layout(cart.dims, periodic, halo)
            op = hpccoll.HaloExchange(cart, halo=halo, corners=corners)
            G = global_array(lay, np.float64, 81, (2,))
            x = lay.make_x(me, G, 82, (2,))
            want = lay.forward(me, x, G, corners)
            v.same(op(x), want, f"HaloExchange {halo} {corners}")
            v.same(op.forward(x), want, f"HaloExchange.forward {halo} {corners}")
            gs = [make(lay.shape(q, (2,)), np.float64, 90 + q) for q in range(cart.size)]
            wadj = lay.adjoint(me, gs, corners)
            v.close(op.adjoint(gs[me]), wadj, f"HaloExchange.adjoint {halo} {corners}")
            v.close(op.H(gs[me]), wadj, f"HaloExchange.H {halo} {corners}")
            v.same(op.H.H(x), want, f"HaloExchange.H.H {halo} {corners}")
            out = np.zeros_like(x)
            v.true(op.forward(x, out=out) is out, "HaloExchange.forward out= not returned")
            v.same(out, want, "HaloExchange.forward out=")
            v.close(hpccoll.adjoint_of(op)(gs[me]), wadj, f"adjoint_of(HaloExchange) {halo} {corners}")
            try:
                xs = positive(make(x.shape, np.complex128, 95 + me))
                ys = positive(make(x.shape, np.complex128, 96 + me))
                assert dottest(op.H, ys, xs, comm=cart, rtol=1e-12)
            except AssertionError as exc:
                v.errors.append(f"dot test of .H: {exc}"[:1500])


# --------------------------------------------------------------------------- transports


@pytest.mark.parametrize("transport", ["shm", "mpi"])
def test_transports(comm, transport):
    me = comm.rank
    periodic = (True, False)
    with hpccoll.Communicator(comm.mpi, transport=transport) as base:
        with base.cartesian([0, 0], periodic=periodic) as cart, Verdict(cart) as v:
            for k, (halo, corners) in enumerate([(1, False), (1, True), ((2, 1), True)]):
                lay = Layout(cart.dims, periodic, halo)
                what = f"{transport} halo {halo} corners {corners}"
                check_exchange(v, cart, lay, halo, corners, np.dtype(np.float64), (3,), 300 + 10 * k, what)
                check_exchange(v, cart, lay, halo, corners, np.dtype(np.int32), (), 400 + 10 * k, what)
                G = global_array(lay, np.float64, 500 + k, (40,))  # a few KiB per face: past tiny messages
                x = lay.make_x(me, G, 600 + k, (40,))
                req = hpccoll.halo_exchange(x, cart, halo=halo, corners=corners, async_op=True)
                v.same(req.wait(), lay.forward(me, x, G, corners), f"{what} async")
                try:
                    dot(cart, lay, halo, corners, np.float64, (3,), 700 + k)
                except AssertionError as exc:
                    v.errors.append(f"{what} dot test: {exc}"[:1500])


# --------------------------------------------------------------------------- errors


@pytest.mark.timeout(60)
def test_halo_wider_than_a_neighbours_block(comm):
    P, me = comm.size, comm.rank

    def narrow(axis, coord):
        return 1 if coord == P - 1 else 3

    cases = [([P], True)] + ([([1, P], (False, False))] if P > 1 else [])  # same on every rank
    for dims, periodic in cases:
        with comm.cartesian(dims, periodic=periodic) as cart:
            lay = Layout(cart.dims, periodic, 2, extent=lambda a, c: narrow(a, c) if cart.dims[a] == P else 3)
            x = make(lay.shape(me, (2,)), np.float64, 5)
            for fn in (hpccoll.halo_exchange, hpccoll.halo_exchange_adjoint):
                raises_everywhere(cart, ArgumentError, "halo", lambda: fn(x, cart, halo=2), same_message=False)
            # halo == the narrowest extent is fine
            lay1 = Layout(cart.dims, periodic, 1, extent=lambda a, c: narrow(a, c) if cart.dims[a] == P else 3)
            G = global_array(lay1, np.float64, 6, (2,))
            x1 = lay1.make_x(me, G, 7, (2,))
            y = hpccoll.halo_exchange(x1, cart, halo=1, corners=True)
            agree(cart, lambda: assert_same(y, lay1.forward(me, x1, G, True)))


@pytest.mark.timeout(60)
def test_bad_halos(comm):
    me = comm.rank
    with comm.cartesian([0, 0], periodic=True) as cart:
        x = make(Layout(cart.dims, True, 1).shape(me, ()), np.float64, 8)
        for bad in [-1, (1, -1), (1, 1, 1), (1,), 1.5]:
            for fn in (hpccoll.halo_exchange, hpccoll.halo_exchange_adjoint):
                raises_everywhere(cart, ArgumentError, "halo", lambda: fn(x, cart, halo=bad))
            raises_everywhere(cart, ArgumentError, "halo", lambda: hpccoll.HaloExchange(cart, halo=bad)(x))
        # corners: one check, the same message from the functions and (when made) the operator
        for call in (
            lambda: hpccoll.halo_exchange(x, cart, halo=1, corners="yes"),
            lambda: hpccoll.halo_exchange_adjoint(x, cart, halo=1, corners="yes"),
            lambda: hpccoll.HaloExchange(cart, halo=1, corners="yes"),
        ):
            raises_everywhere(cart, ArgumentError, r"corners: expected a bool; got 'yes'", call)


@pytest.mark.timeout(60)
def test_not_a_cartesian_communicator(comm):
    x = np.zeros((4, 3))
    for fn in (hpccoll.halo_exchange, hpccoll.halo_exchange_adjoint):
        raises_everywhere(comm, ArgumentError, "comm", lambda: fn(x, comm, halo=1))
    raises_everywhere(comm, ArgumentError, "comm", lambda: hpccoll.HaloExchange(comm, halo=1)(x))
    # the communicator still works
    total = hpccoll.all_reduce(np.ones(1), comm)
    agree(comm, total[0] == comm.size, lambda: f"got {total}")


@pytest.mark.timeout(60)
def test_bad_cartesian_arguments(comm):
    P = comm.size
    for dims in [[P + 1], [P, 2], [-1], [], 2]:
        raises_everywhere(comm, ArgumentError, "dims", lambda: comm.cartesian(dims))
    for periodic in [(True, False, True), "yes"]:
        raises_everywhere(comm, ArgumentError, "periodic", lambda: comm.cartesian([P, 1], periodic=periodic))
    raises_everywhere(comm, ArgumentError, "comm", lambda: comm.dims)
    with comm.cartesian([P], periodic=False) as cart:
        for axis in [-1, 1]:
            raises_everywhere(cart, ArgumentError, "axis", lambda: cart.neighbours(axis))


@pytest.mark.timeout(60)
def test_default_comm_is_not_cartesian(comm):
    """comm has no default: ``None`` is the world, which has no process grid, refused as any such communicator
    is (the same message); left out, it is Python's TypeError."""
    x = np.zeros((4, 3))
    without_grid = raises_everywhere(comm, ArgumentError, "comm", lambda: hpccoll.halo_exchange(x, comm, halo=1))
    for call in (
        lambda: hpccoll.halo_exchange(x, None, halo=1),
        lambda: hpccoll.halo_exchange_adjoint(x, None, halo=1),
        lambda: hpccoll.HaloExchange(None, halo=1),
    ):
        agree(comm, raises_everywhere(comm, ArgumentError, "comm", call) == without_grid, "another message")
    for call in (
        lambda: hpccoll.halo_exchange(x, halo=1),
        lambda: hpccoll.halo_exchange_adjoint(x, halo=1),
        lambda: hpccoll.HaloExchange(halo=1),
    ):
        raises_everywhere(comm, TypeError, "comm", call)


@pytest.mark.timeout(60)
def test_x_too_small_for_its_ghosts(comm):
    with comm.cartesian([0, 0], periodic=True) as cart:
        for fn in (hpccoll.halo_exchange, hpccoll.halo_exchange_adjoint):
            raises_everywhere(
                cart, ArgumentError, "halo", lambda: fn(np.zeros((1, 5)), cart, halo=1), same_message=False
            )


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60)
def test_faces_that_do_not_match(comm):
    """Neighbours across one axis owning different extents along the other (not a block decomposition)."""
    me = comm.rank
    with comm.cartesian([comm.size, 1], periodic=False) as cart:
        x = np.zeros((4, 4 + 2 * (me == 1), 2))  # rank 1 owns 4 columns, the others 2
        for fn in (hpccoll.halo_exchange, hpccoll.halo_exchange_adjoint):
            raises_everywhere(cart, MismatchError, None, lambda: fn(x, cart, halo=1), same_message=False)


@pytest.mark.timeout(60)
def test_x_with_fewer_dims_than_the_grid(comm):
    with comm.cartesian([0, 0, 0], periodic=False) as cart:
        for x in [np.zeros((4, 4)), np.zeros(5), np.zeros(())]:
            for fn in (hpccoll.halo_exchange, hpccoll.halo_exchange_adjoint):
                raises_everywhere(cart, ArgumentError, r"\bx\b|\bg\b", lambda: fn(x, cart, halo=1), same_message=False)


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60)
@pytest.mark.parametrize("what", ["dtype", "ndim", "halo", "corners"])
def test_disagreements(comm, what):
    """Ranks disagreeing about dtype, ndim, halo or corners: MismatchError on every rank (no hang)."""
    me = comm.rank
    odd = me == 1
    with comm.cartesian([0, 0], periodic=True) as cart:
        halo = 1 + (odd and what == "halo")
        corners = odd and what == "corners"
        dtype = np.float32 if odd and what == "dtype" else np.float64
        trailing = (2, 2) if odd and what == "ndim" else (2,)
        x = make(Layout(cart.dims, True, halo).shape(me, trailing), dtype, 9)
        match = {"dtype": "dtype", "ndim": "ndim|dim", "halo": "halo", "corners": "corners"}[what]
        for fn in (hpccoll.halo_exchange, hpccoll.halo_exchange_adjoint):
            raises_everywhere(
                cart, MismatchError, match, lambda: fn(x, cart, halo=halo, corners=corners), same_message=False
            )
        # the communicator still works afterwards
        lay = Layout(cart.dims, True, 1)
        G = global_array(lay, np.float64, 10, (2,))
        x1 = lay.make_x(me, G, 11, (2,))
        y = hpccoll.halo_exchange(x1, cart, halo=1)
        agree(cart, lambda: assert_same(y, lay.forward(me, x1, G, False)))


# --------------------------------------------------------------------------- kept exchanges


def kept_of(cart):
    """The exchanges ``cart`` keeps prepared (halo's own record: these tests check the kept road is taken)."""
    return cart.state.get(halo_module._KEPT, {})


def refill(lay, me, x, G, seed):
    """New owned cells and ghosts in ``x`` itself (a stencil sweep's update); the new global array."""
    G[...] = global_array(lay, G.dtype, seed, G.shape[lay.nd :])
    x[...] = lay.make_x(me, G, seed + 1, G.shape[lay.nd :])


@pytest.mark.parametrize("periodic", [True, False])
@pytest.mark.parametrize("halo", [1, 2])
def test_kept_in_place(comm, periodic, halo):
    """The same in-place call every step: kept from its second call on (where it moves anything: not one
    rank without a periodic axis), the same result as the full road."""
    me = comm.rank
    moves = periodic or comm.size > 1
    with comm.cartesian([comm.size], periodic=periodic) as cart, Verdict(cart) as v:
        lay = Layout(cart.dims, periodic, halo)
        G = global_array(lay, np.float64, 80, (3,))
        x = lay.make_x(me, G, 81, (3,))
        for step in range(5):
            refill(lay, me, x, G, 82 + 3 * step)
            want = lay.forward(me, x, G, False)
            got = hpccoll.halo_exchange(x, cart, halo=halo, out=x)
            v.true(got is x, f"step {step}: out=x not returned")
            v.same(x, want, f"step {step} in place")
            v.true(len(kept_of(cart)) == (moves and step >= 1), f"step {step}: {len(kept_of(cart))} kept")
        for entry in kept_of(cart).values():
            v.true(entry.prepared.method in ("persistent", "blocking"), f"kept as {entry.prepared.method}")
        req = hpccoll.halo_exchange(x, cart, halo=halo, out=x, async_op=True)  # kept, started
        v.true(isinstance(req, hpccoll.Request) and req.wait() is x, "kept async: the request's result")
        refill(lay, me, x, G, 99)
        want = lay.forward(me, x, G, False)
        req = hpccoll.halo_exchange(x, cart, halo=halo, out=x, async_op=True)
        v.same(req.wait(), want, "kept async")


def test_kept_into_one_out(comm):
    """A fixed out, x refilled each step: kept; x never modified."""
    me = comm.rank
    with comm.cartesian([comm.size], periodic=True) as cart, Verdict(cart) as v:
        lay = Layout(cart.dims, True, 1)
        G = global_array(lay, np.int32, 90)
        x = lay.make_x(me, G, 91)
        out = np.zeros_like(x)
        for step in range(4):
            refill(lay, me, x, G, 92 + 3 * step)
            before = x.copy()
            v.true(hpccoll.halo_exchange(x, cart, halo=1, out=out) is out, "out= not returned")
            v.same(out, lay.forward(me, x, G, False), f"step {step} into out")
            v.same(x, before, f"step {step}: x modified")
        v.true(len(kept_of(cart)) == 1, f"{len(kept_of(cart))} exchanges kept")


def test_kept_beside_other_calls(comm):
    """With an exchange kept: other arrays, the adjoint, lists, out=None and a rank calling another array
    than the others all go the full road, correctly."""
    P, me = comm.size, comm.rank
    with comm.cartesian([P], periodic=True) as cart, Verdict(cart) as v:
        lay = Layout(cart.dims, True, 1)
        G = global_array(lay, np.float64, 100, (2,))
        x = lay.make_x(me, G, 101, (2,))
        for _ in range(2):
            hpccoll.halo_exchange(x, cart, halo=1, out=x)
        v.true(len(kept_of(cart)) == 1, "kept")
        refill(lay, me, x, G, 102)
        other = x.copy() if me == 0 else x  # rank 0 calls a new array, the others their kept one
        want = lay.forward(me, other, G, False)
        v.same(hpccoll.halo_exchange(other, cart, halo=1, out=other), want, "one rank off the kept road")
        v.same(hpccoll.halo_exchange(x, cart, halo=1), lay.forward(me, x, G, False), "out=None")
        v.same(hpccoll.halo_exchange([x, x], cart, halo=1)[1], lay.forward(me, x, G, False), "a list")
        gs = [make(lay.shape(q, (2,)), np.float64, 103 + q) for q in range(P)]
        g = gs[me].copy()
        v.close(hpccoll.halo_exchange_adjoint(g, cart, halo=1, out=g), lay.adjoint(me, gs, False), "adjoint")
        refill(lay, me, x, G, 104)
        v.same(hpccoll.halo_exchange(x, cart, halo=1, out=x), lay.forward(me, x, G, False), "kept again")


def test_kept_bounded(comm):
    """More arrays than a communicator keeps, each exchanged repeatedly: the oldest dropped, all correct."""
    me = comm.rank
    with comm.cartesian([comm.size], periodic=True) as cart, Verdict(cart) as v:
        lay = Layout(cart.dims, True, 1)
        G = global_array(lay, np.float32, 110)
        xs = [lay.make_x(me, G, 111 + i) for i in range(halo_module.KEEP + 3)]
        for rnd in range(3):
            for i, x in enumerate(xs):
                for _ in range(2):
                    got = hpccoll.halo_exchange(x, cart, halo=1, out=x)
                v.same(got, lay.forward(me, x, G, False), f"round {rnd} array {i}")
            v.true(len(kept_of(cart)) <= halo_module.KEEP, f"{len(kept_of(cart))} kept")


def test_kept_argument_forms(comm):
    """One kept exchange answers every plain spelling of its arguments (an int, a tuple or a list of widths,
    a new tuple object each call); other widths, corners or a NumPy integer leave it, correctly, and it is
    kept again afterwards; the last kept exchange recalled first never answers for another array."""
    me = comm.rank
    with comm.cartesian([comm.size], periodic=True) as cart, Verdict(cart) as v:
        lay = Layout(cart.dims, True, 1)
        G = global_array(lay, np.float64, 150, (2,))
        x = lay.make_x(me, G, 151, (2,))
        y = lay.make_x(me, G, 152, (2,))
        for _ in range(2):
            hpccoll.halo_exchange(x, cart, halo=1, out=x)
            hpccoll.halo_exchange(y, cart, halo=1, out=y)
        kept = dict(kept_of(cart))
        v.true(len(kept) == 2, f"{len(kept)} kept")
        one = 1
        for step, (halo, arr) in enumerate(
            [(1, x), ((1,), x), ([1], y), (tuple([one]), x), ((1,), y), (1, x), (1, y), ([1], x)]
        ):
            refill(lay, me, arr, G, 153 + 2 * step)
            want = lay.forward(me, arr, G, False)
            v.same(hpccoll.halo_exchange(arr, cart, halo=halo, out=arr), want, f"step {step}: halo {halo!r}")
            v.true(dict(kept_of(cart)) == kept, f"step {step}: the kept exchanges changed")
        for step, (halo, corners) in enumerate([(np.int64(1), False), (1, np.bool_(False)), (1, True), (1, False)]):
            refill(lay, me, x, G, 170 + 2 * step)
            want = lay.forward(me, x, G, bool(corners))
            got = hpccoll.halo_exchange(x, cart, halo=halo, corners=corners, out=x)
            v.same(got, want, f"halo {halo!r}, corners {corners!r}")
        refill(lay, me, x, G, 180)
        want = lay.forward(me, x, G, False)
        v.same(hpccoll.halo_exchange(x, cart, halo=1, out=x), want, "kept again")


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60)
def test_kept_then_one_rank_changes_its_array(comm):
    """A rank reshapes its kept array in place: every rank leaves the kept road, and the mismatch raises
    on every rank (no hang); the kept exchange works again afterwards."""
    me = comm.rank
    with comm.cartesian([comm.size], periodic=True) as cart:
        lay = Layout(cart.dims, True, 1)
        G = global_array(lay, np.float64, 120, (4,))
        x = lay.make_x(me, G, 121, (4,))
        for _ in range(2):
            hpccoll.halo_exchange(x, cart, halo=1, out=x)
        agree(cart, len(kept_of(cart)) == 1, "kept")
        shape = x.shape
        if me == 1:
            x.shape = (shape[0] * 2, 2)  # the same memory, other trailing extents
        raises_everywhere(
            cart, MismatchError, "trailing extents", lambda: hpccoll.halo_exchange(x, cart, halo=1, out=x)
        )
        x.shape = shape
        refill(lay, me, x, G, 122)
        want = lay.forward(me, x, G, False)
        y = hpccoll.halo_exchange(x, cart, halo=1, out=x)
        agree(cart, lambda: assert_same(y, want))


@pytest.mark.parametrize("grid", ["1xP", "auto2d"])
@pytest.mark.parametrize("halo, corners", [(1, False), (2, True), ((1, 2), True)])
def test_kept_strided_faces(comm, grid, halo, corners):
    """Faces that are not contiguous in the array (across grid axis 1): kept too, moved where they lie
    (host MPI's derived datatypes: nothing packed or landed); in place, into one out (x never modified) and
    started, every step the reference's, on a periodic and a non-periodic grid."""
    me = comm.rank
    dims = grid_dims(comm, grid)
    for periodic in (True, False):
        with comm.cartesian(dims, periodic=periodic) as cart, Verdict(cart) as v:
            lay = Layout(cart.dims, periodic, halo)
            G = global_array(lay, np.float32, 190, (2,))
            x = lay.make_x(me, G, 191, (2,))
            y = lay.make_x(me, G, 192, (2,))
            out = np.zeros_like(y)
            moves = comm.size > 1 or periodic
            for step in range(4):
                refill(lay, me, x, G, 193 + 2 * step)
                want = lay.forward(me, x, G, corners)
                v.same(hpccoll.halo_exchange(x, cart, halo=halo, corners=corners, out=x), want, f"step {step}")
                refill(lay, me, y, G, 194 + 2 * step)
                before = y.copy()
                want = lay.forward(me, y, G, corners)
                got = hpccoll.halo_exchange(y, cart, halo=halo, corners=corners, out=out, async_op=step % 2 == 1)
                got = got.wait() if step % 2 else got
                v.true(got is out, f"step {step}: out= not returned")
                v.same(out, want, f"step {step} into out")
                v.same(y, before, f"step {step}: y modified")
            kept = kept_of(cart)
            v.true(len(kept) == (2 if moves else 0), f"{len(kept)} kept")
            # the columns' faces are strided: host MPI moves them where they lie (derived datatypes)
            v.true(not any(e.packs or e.unpacks for e in kept.values()), "packed regions")


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60)
def test_kept_then_one_rank_reshapes_its_out(comm):
    """A kept exchange into a separate out; one rank reshapes that out in place, then makes it read-only:
    each time the call raises ArgumentError on every rank (no hang), and works again once out is restored."""
    me = comm.rank
    with comm.cartesian([comm.size], periodic=True) as cart:
        lay = Layout(cart.dims, True, 1)
        G = global_array(lay, np.float64, 200, (4,))
        x = lay.make_x(me, G, 201, (4,))
        out = np.zeros_like(x)
        for _ in range(2):
            hpccoll.halo_exchange(x, cart, halo=1, out=out)
        agree(cart, len(kept_of(cart)) == 1, "kept")
        shape = out.shape
        if me == 1:
            out.shape = (shape[0], 2, 2)  # the same memory, another shape than x's
        raises_everywhere(
            cart,
            ArgumentError,
            "out|rank 1 refused its arguments",  # rank 1 names out; the others, rank 1's refusal
            lambda: hpccoll.halo_exchange(x, cart, halo=1, out=out),
            same_message=False,
        )
        out.shape = shape
        got = hpccoll.halo_exchange(x, cart, halo=1, out=out)
        agree(cart, lambda: assert_same(got, lay.forward(me, x, G, False)))
        if me == 1:
            out.flags.writeable = False  # the same arrays, made read-only since
        raises_everywhere(
            cart,
            ArgumentError,
            "writeable|rank 1 refused its arguments",
            lambda: hpccoll.halo_exchange(x, cart, halo=1, out=out),
            same_message=False,
        )
        out.flags.writeable = True
        got = hpccoll.halo_exchange(x, cart, halo=1, out=out)
        agree(cart, lambda: assert_same(got, lay.forward(me, x, G, False)))


def test_not_kept(comm):
    """Check mode and arguments of other types than the plain ones are never kept, and stay correct."""
    me = comm.rank
    with hpccoll.Communicator(check=True).cartesian([comm.size], periodic=True) as cart, Verdict(cart) as v:
        lay = Layout(cart.dims, True, 1)
        G = global_array(lay, np.float64, 130)
        x = lay.make_x(me, G, 131)
        for _ in range(3):
            v.same(hpccoll.halo_exchange(x, cart, halo=1, out=x), lay.forward(me, x, G, False), "check mode")
        v.true(not kept_of(cart), "kept in check mode")
    with comm.cartesian([comm.size], periodic=True) as cart, Verdict(cart) as v:
        lay = Layout(cart.dims, True, 1)
        G = global_array(lay, np.float64, 134)
        x = lay.make_x(me, G, 135)
        for _ in range(3):
            v.same(hpccoll.halo_exchange(x, cart, halo=np.int64(1), out=x), lay.forward(me, x, G, False), "np.int64")
        v.true(not kept_of(cart), "kept with a NumPy integer halo")


# --------------------------------------------------------------------------- node-shared fields


@pytest.mark.parametrize("grid", ["P", "Px1", "1xP", "auto2d"])
@pytest.mark.parametrize("transport", ["shm", "auto"])
def test_shared_fields(comm, grid, transport):
    """Fields from ``shared_empty`` exchanged in place, shm named or ``auto``: the neighbours' boundaries read
    straight from shared memory where every boundary region is contiguous (host MPI otherwise), the result
    the reference's; a rank with a private field sends every rank to host MPI, still correct."""
    me = comm.rank
    dims = grid_dims(comm, grid)
    with hpccoll.Communicator(comm.mpi, transport=transport) as base:
        for periodic in (True, False):
            with base.cartesian(dims, periodic=periodic) as cart, Verdict(cart) as v:
                t = cart.shared_transport()
                host_calls = []
                real = t.host.sendrecv
                t.host.sendrecv = lambda *a: (host_calls.append(1), real(*a))[1]
                try:
                    for halo, corners, dtype in [(1, False, np.float64), (2, True, np.int16), (1, True, np.complex64)]:
                        lay = Layout(cart.dims, periodic, halo)
                        G = global_array(lay, dtype, 140, (3,))
                        for private in (False, me == 0):
                            before = len(host_calls)
                            x = cart.shared_empty(lay.shape(me, (3,)), dtype)
                            if private:
                                x = np.empty_like(x)
                            for step in range(3):
                                x[...] = lay.make_x(me, G, 141 + step, (3,))
                                want = lay.forward(me, x, G, corners)
                                got = hpccoll.halo_exchange(x, cart, halo=halo, corners=corners, out=x)
                                v.true(got is x, "out=x not returned")
                                v.same(x, want, f"{grid} {periodic} {halo} {corners} {dtype} private={private}")
                            moves = comm.size > 1 and not periodic and cart.dims[1:].count(1) == len(cart.dims) - 1
                            everyone_shared = cart.mpi.allreduce(not private, op=MPI.LAND)
                            if moves and everyone_shared:
                                # messages along axis 0 only, every field shared: read in place where every
                                # rank's boundary rows are contiguous, else through host MPI
                                h, inner = lay.halo[0], lay.interior(me)[1:]
                                rows = [slice(h, 2 * h), slice(x.shape[0] - 2 * h, x.shape[0] - h)]
                                flat = all(x[(r, *inner)].flags.c_contiguous for r in rows)
                                flat = cart.mpi.allreduce(flat, op=MPI.LAND)
                                calls = len(host_calls) - before
                                v.true((calls == 0) == flat, f"{calls} host MPI calls, flat boundaries: {flat}")
                finally:
                    t.host.sendrecv = real
