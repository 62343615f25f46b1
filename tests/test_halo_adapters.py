"""The halo exchange in every framework adapter: forward, gradient, and JAX's transforms.

Written from the spec (notes/halo_spec.md) for any number of ranks. Every rank builds the same global array
``G`` from a seed (uneven owned extents per grid coordinate, one trailing axis carried along); the rank at grid
coordinates ``c`` owns ``G[lo_c:hi_c, ...]`` padded with ghost layers of random values. The reference maps each
local cell to the global cell it is filled from (or to none): a ghost outside the owned range along one axis (or,
with ``corners``, along several), whose global index is inside the domain after the periodic wrap. The forward
replaces those ghosts with ``G``'s values; the gradient of the sum over ranks of ``<w_rank, f(x_rank)>`` zeroes
them in ``w`` and adds every rank's ``w`` at them into the owner's cells (every rank's ``w`` is made on every
rank from its seed). Both are also checked against :func:`hpccoll.halo_exchange` and
:func:`hpccoll.halo_exchange_adjoint`. JAX runs eagerly and under ``jax.jit``, and through ``jax.vmap``,
``jax.jvp`` and ``jax.linear_transpose``. A framework not installed is skipped; every verdict is collective.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import agree, make, raises_everywhere

import hpccoll

pytestmark = pytest.mark.mpi

HALO = 1
TRAILING = 2  # a trailing axis the exchange carries along

#: name -> (dims, periodic)
GRIDS = {
    "1d-periodic": ([0], True),
    "2d-periodic": ([0, 0], True),
    "2d-mixed": ([0, 0], (True, False)),
}


def close(got, want):
    got = np.asarray(got)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)


# --------------------------------------------------------------------------- the NumPy reference


def owned(k):
    """The owned extent at grid coordinate ``k`` (uneven: 2, 3, 2, 3, ...; every one >= HALO)."""
    return 2 + k % 2


class Reference:
    """The global array, every rank's block and cotangent, and where each of a rank's cells is filled from."""

    def __init__(self, grid, corners, seed):
        self.grid, self.corners = grid, corners
        self.dims, self.periodic = grid.dims, grid.periodic
        self.extents = [[owned(k) for k in range(n)] for n in self.dims]
        self.N = tuple(sum(e) for e in self.extents)
        self.G = make(self.N + (TRAILING,), np.float64, seed=seed)
        self.seed = seed

    def block(self, q):
        """Rank q's (lo, n) per grid axis."""
        c = self.grid.grid.coords[q]
        return [(sum(e[:k]), e[k]) for e, k in zip(self.extents, c)]

    def shape(self, q):
        return tuple(n + 2 * HALO for _, n in self.block(q)) + (TRAILING,)

    def source(self, q):
        """For each cell of rank q's padded block (grid axes): the flat global index it is filled from, or -1."""
        blk = self.block(q)
        src = np.full(self.shape(q)[:-1], -1, dtype=np.int64)
        for local in itertools.product(*(range(n + 2 * HALO) for _, n in blk)):
            g, outside, inside = [], 0, True
            for i, ((lo, n), j) in enumerate(zip(blk, local)):
                out = j < HALO or j >= HALO + n
                outside += out
                gi = lo + j - HALO
                if not 0 <= gi < self.N[i]:
                    if not self.periodic[i]:
                        inside = False
                    gi %= self.N[i]
                g.append(gi)
            if outside == 0 or not inside or (outside > 1 and not self.corners):
                continue
            src[local] = np.ravel_multi_index(g, self.N)
        return src

    def x(self, q):
        """Rank q's block with random ghosts."""
        a = make(self.shape(q), np.float64, seed=self.seed + 100 + q)
        own = tuple(slice(HALO, HALO + n) for _, n in self.block(q))
        a[own] = self.G[tuple(slice(lo, lo + n) for lo, n in self.block(q))]
        return a

    def w(self, q):
        """Rank q's cotangent."""
        return make(self.shape(q), np.float64, seed=self.seed + 200 + q)

    def forward(self, q):
        x, src = self.x(q), self.source(q)
        flat = self.G.reshape(-1, TRAILING)
        filled = src >= 0
        x[filled] = flat[src[filled]]
        return x

    def gradient(self, q):
        acc = np.zeros((int(np.prod(self.N)), TRAILING))
        for p in range(len(self.grid.grid.coords)):
            src = self.source(p)
            filled = src >= 0
            np.add.at(acc, src[filled], self.w(p)[filled])
        g, src = self.w(q), self.source(q)
        g[src >= 0] = 0
        own = tuple(slice(HALO, HALO + n) for _, n in self.block(q))
        g[own] += acc.reshape(self.N + (TRAILING,))[tuple(slice(lo, lo + n) for lo, n in self.block(q))]
        return g


# --------------------------------------------------------------------------- frameworks


# The frameworks' forward and gradient runners are the rooted adapters' tests' own.
from test_rooted_adapters import FRAMEWORKS, Jax  # noqa: E402


@pytest.fixture(params=list(FRAMEWORKS))
def fw(request):
    return FRAMEWORKS[request.param]()


@pytest.fixture(scope="module", params=list(GRIDS))
def grid(request, comm):
    dims, periodic = GRIDS[request.param]
    g = comm.cartesian(dims, periodic=periodic)
    yield g
    g.free()


# --------------------------------------------------------------------------- forward and gradient


@pytest.mark.parametrize("corners", [False, True], ids=["faces", "corners"])
def test_forward_and_gradient(grid, fw, corners):
    ref = Reference(grid, corners, seed=11 + 2 * corners)
    r = grid.rank
    x, w = ref.x(r), ref.w(r)
    f = lambda t: fw.mod.halo_exchange(t, grid, halo=HALO, corners=corners)  # noqa: E731
    core_y = hpccoll.halo_exchange(x, grid, halo=HALO, corners=corners)
    core_g = hpccoll.halo_exchange_adjoint(w, grid, halo=HALO, corners=corners)

    def verify():
        y = fw.forward(f, x)
        close(y, ref.forward(r))
        close(y, core_y)
        g = fw.grad(f, x, w)
        close(g, ref.gradient(r))
        close(g, core_g)

    agree(grid, verify)


def test_per_axis_halo_and_repeat(grid, fw):
    """``halo`` as one width per grid axis; two exchanges in a row (the second changes nothing)."""
    ref = Reference(grid, True, seed=31)
    r = grid.rank
    x, w = ref.x(r), ref.w(r)
    halo = [HALO] * len(grid.dims)

    def f(t):
        return fw.mod.halo_exchange(
            fw.mod.halo_exchange(t, grid, halo=halo, corners=True), grid, halo=halo, corners=True
        )

    core_g = hpccoll.halo_exchange_adjoint(w, grid, halo=halo, corners=True)
    core_g = hpccoll.halo_exchange_adjoint(core_g, grid, halo=halo, corners=True)

    def verify():
        close(fw.forward(f, x), ref.forward(r))
        close(fw.grad(f, x, w), core_g)

    agree(grid, verify)


def test_bad_arguments_are_named(comm, grid, fw):
    x = np.zeros((4,) * len(grid.dims) + (TRAILING,))
    cases = [
        (comm, {"halo": 1}, r"comm: expected a Cartesian Communicator"),
        (grid, {"halo": -1}, r"halo: expected widths >= 0"),
        (grid, {"halo": [1] * (len(grid.dims) + 1)}, r"halo: expected an int or"),
        (grid, {"halo": 1, "corners": "yes"}, r"corners: expected a bool"),
    ]
    for c, kw, match in cases:
        raises_everywhere(
            comm,
            hpccoll.ArgumentError,
            match,
            lambda c=c, kw=kw: fw.forward(lambda t: fw.mod.halo_exchange(t, c, **kw), x),
        )


# --------------------------------------------------------------------------- JAX's transforms


@pytest.fixture
def jx():
    return Jax(jit=False)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("axis", [0, -1], ids=["batch-first", "batch-last"])
def test_jax_vmap(grid, jx, jit, axis):
    """vmap over a stack of blocks: each exchanged as by itself (the batch axis is carried after the grid's)."""
    jax, jnp = jx.jax, jx.jax.numpy
    r = grid.rank
    refs = [Reference(grid, True, seed=41 + 10 * i) for i in range(3)]
    X = np.stack([ref.x(r) for ref in refs], axis=axis)
    W = np.stack([ref.w(r) for ref in refs], axis=axis)

    def f(t):
        return jx.mod.halo_exchange(t, grid, halo=HALO, corners=True)

    vf = jax.vmap(f, in_axes=axis, out_axes=axis)
    wrap = jax.jit if jit else (lambda g: g)

    def verify():
        close(np.asarray(wrap(vf)(jnp.asarray(X))), np.stack([ref.forward(r) for ref in refs], axis=axis))
        g = wrap(jax.grad(lambda v: jnp.sum(jnp.asarray(W) * vf(v))))(jnp.asarray(X))
        close(np.asarray(g), np.stack([ref.gradient(r) for ref in refs], axis=axis))

    agree(grid, verify)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_jax_jvp_and_linear_transpose(grid, jx, jit):
    jax, jnp = jx.jax, jx.jax.numpy
    ref = Reference(grid, False, seed=61)
    r = grid.rank
    x, w = ref.x(r), ref.w(r)

    def f(t):
        return jx.mod.halo_exchange(t, grid, halo=HALO)

    wrap = jax.jit if jit else (lambda g: g)
    core_t = hpccoll.halo_exchange(w, grid, halo=HALO)
    core_g = hpccoll.halo_exchange_adjoint(w, grid, halo=HALO)

    def verify():
        y, t = wrap(lambda a, b: jax.jvp(f, (a,), (b,)))(jnp.asarray(x), jnp.asarray(w))
        close(np.asarray(y), ref.forward(r))
        close(np.asarray(t), core_t)  # linear: the JVP is the map on the tangent
        (g,) = wrap(jax.linear_transpose(f, jnp.asarray(x)))(jnp.asarray(w))
        close(np.asarray(g), core_g)
        (gg,) = wrap(jax.linear_transpose(jax.linear_transpose(f, jnp.asarray(x)), jnp.asarray(w)))((jnp.asarray(x),))
        close(np.asarray(gg), ref.forward(r))  # the transpose's transpose is the map again

    agree(grid, verify)


def test_jax_jit_keeps_the_shape(grid, jx):
    """Under jit the result's shape is the input's, known without communicating."""
    jax = jx.jax
    x = np.zeros((5,) * len(grid.dims) + (TRAILING,))
    out = jax.eval_shape(lambda t: jx.mod.halo_exchange(t, grid, halo=HALO, corners=True), x)
    agree(grid, lambda: out.shape == x.shape and out.dtype == x.dtype)
