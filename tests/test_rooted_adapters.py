"""The rooted collectives (broadcast, reduce, gather, scatter) in every framework adapter.

Written for any number of ranks, every root. The data is global (made identically on every rank);
each rank takes its part. A forward is checked against a NumPy reference and against hpccoll's own
function; a gradient, that of the sum over ranks of the rank losses ``<W[rank], f(x)>``, against a
NumPy reference and against hpccoll's adjoint applied to the rank's cotangent ``W[rank]``. Gather
and scatter take uneven shards (an empty one from 3 ranks), scatter's other ranks arrays of any
extent. JAX runs eagerly and under ``jax.jit``. A framework not installed is skipped.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import agree, make, raises_everywhere

import hpccoll

pytestmark = pytest.mark.mpi


def uneven(p):
    return [(3 * r + 2) % 4 for r in range(p)]  # 2, 1, 0, 3: uneven, with an empty shard from P = 3


def bounds(sizes, rank):
    lo = sum(sizes[:rank])
    return lo, lo + sizes[rank]


def close(got, want):
    got = np.asarray(got)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)


# --------------------------------------------------------------------------- frameworks


class Autograd:
    name = "autograd"
    jit = False

    def __init__(self):
        self.ag = pytest.importorskip("autograd")
        from hpccoll.adapters import autograd as mod

        self.mod = mod

    def forward(self, f, x):
        return np.asarray(f(x))

    def grad(self, f, x, w):
        import autograd.numpy as anp

        return self.ag.grad(lambda v: anp.sum(w * f(v)))(x)


class Torch:
    name = "torch"
    jit = False

    def __init__(self):
        self.torch = pytest.importorskip("torch")
        from hpccoll.adapters import torch as mod

        self.mod = mod

    def forward(self, f, x):
        return f(self.torch.from_numpy(np.array(x))).detach().numpy()

    def grad(self, f, x, w):
        t = self.torch.from_numpy(np.array(x)).requires_grad_(True)
        (f(t) * self.torch.from_numpy(np.asarray(w))).sum().backward()
        return t.grad.numpy()


class Jax:
    name = "jax"

    def __init__(self, jit):
        self.jax = pytest.importorskip("jax")
        self.jax.config.update("jax_enable_x64", True)  # float64 as itself (test_jax_adapter.py does the same)
        from hpccoll.adapters import jax as mod

        self.mod, self.jit = mod, jit

    def _run(self, f, *args):
        return (self.jax.jit(f) if self.jit else f)(*args)

    def forward(self, f, x):
        return np.asarray(self._run(f, self.jax.numpy.asarray(x)))

    def grad(self, f, x, w):
        jnp = self.jax.numpy
        return np.asarray(self._run(self.jax.grad(lambda v: jnp.sum(jnp.asarray(w) * f(v))), jnp.asarray(x)))


FRAMEWORKS = {
    "autograd": Autograd,
    "torch": Torch,
    "jax-eager": lambda: Jax(jit=False),
    "jax-jit": lambda: Jax(jit=True),
}


@pytest.fixture(params=list(FRAMEWORKS))
def fw(request):
    return FRAMEWORKS[request.param]()


def roots(comm):
    return list(range(comm.size))


def check(comm, fw, f, x, w, want_y, want_g, core_y, core_g):
    """The forward and the gradient against their NumPy references and hpccoll's function and adjoint."""

    def verify():
        y = fw.forward(f, x)
        close(y, want_y)
        close(y, core_y)
        g = fw.grad(f, x, w)
        close(g, want_g)
        close(g, core_g)

    agree(comm, verify)


# --------------------------------------------------------------------------- broadcast, reduce


def test_broadcast(comm, fw):
    P, r = comm.size, comm.rank
    X, W = make((P, 3, 2), np.float64, seed=1), make((P, 3, 2), np.float64, seed=2)
    for root in roots(comm):
        f = lambda t, root=root: fw.mod.broadcast(t, comm, root=root)  # noqa: E731
        want_g = W.sum(0) if r == root else np.zeros_like(X[r])
        core_y = hpccoll.broadcast(X[r], comm, root=root)
        core_g = hpccoll.broadcast_adjoint(W[r], comm, root=root)
        check(comm, fw, f, X[r], W[r], X[root], want_g, core_y, core_g)


@pytest.mark.parametrize("op", ["sum", "avg"])
def test_reduce(comm, fw, op):
    P, r = comm.size, comm.rank
    X, W = make((P, 4), np.float64, seed=3), make((P, 4), np.float64, seed=4)
    scale = 1.0 / P if op == "avg" else 1.0
    for root in roots(comm):
        f = lambda t, root=root: fw.mod.reduce(t, comm, op=op, root=root)  # noqa: E731
        want_y = scale * X.sum(0) if r == root else np.zeros_like(X[r])
        core_y = hpccoll.reduce(X[r], comm, op=op, root=root)
        core_g = hpccoll.reduce_adjoint(W[r], comm, op=op, root=root)
        check(comm, fw, f, X[r], W[r], want_y, scale * W[root], core_y, core_g)


def test_reduce_max_forward_only(comm, fw):
    P, r = comm.size, comm.rank
    X = make((P, 3), np.float64, seed=5)
    root = P - 1
    f = lambda t: fw.mod.reduce(t, comm, op="max", root=root)  # noqa: E731
    agree(comm, lambda: close(fw.forward(f, X[r]), X.max(0) if r == root else np.zeros(3)))
    raises_everywhere(comm, hpccoll.UnsupportedOpError, "op 'sum' or 'avg'", lambda: fw.grad(f, X[r], np.ones(3)))


@pytest.mark.parametrize("name", ["broadcast", "reduce", "gather", "scatter"])
def test_bad_root_is_named(comm, fw, name):
    x = np.ones((2, 2))
    for bad in (comm.size, -1, 0.5):
        raises_everywhere(
            comm,
            hpccoll.ArgumentError,
            r"root: expected an int rank in \[0, ",
            lambda bad=bad: fw.forward(lambda t: getattr(fw.mod, name)(t, comm, root=bad), x),
        )


# --------------------------------------------------------------------------- gather, scatter


@pytest.mark.parametrize("given", [True, False], ids=["sizes", "discovered"])
def test_gather_uneven(comm, fw, given):
    P, r = comm.size, comm.rank
    sizes = uneven(P)
    if fw.jit and not given:
        sizes = [2] * P  # traced without values: every rank's extent is taken to be this rank's
    full = make((3, sum(sizes)), np.float64, seed=6)
    lo, hi = bounds(sizes, r)
    x = full[:, lo:hi]
    for root in roots(comm):
        kw = {"root": root, "axis": 1, "sizes": sizes if given else None}
        f = lambda t, kw=kw: fw.mod.gather(t, comm, **kw)  # noqa: E731
        W = make((3, sum(sizes)), np.float64, seed=7 + root)  # root's cotangent; the others' are empty
        w = W if r == root else np.zeros((3, 0))
        want_y = full if r == root else np.zeros((3, 0))
        core_y = hpccoll.gather(x, comm, **kw)
        core_g = hpccoll.gather_adjoint(w, comm, **{**kw, "sizes": sizes})
        check(comm, fw, f, x, w, want_y, W[:, lo:hi], core_y, core_g)


@pytest.mark.parametrize("given", [True, False], ids=["sizes", "discovered"])
def test_scatter_uneven(comm, fw, given):
    P, r = comm.size, comm.rank
    sizes = uneven(P) if given else hpccoll.split_sizes(2 * P + 1, P)
    full = make((sum(sizes), 2), np.float64, seed=8)
    W = [make((sizes[q], 2), np.float64, seed=9 + q) for q in range(P)]  # rank q's cotangent of its block
    lo, hi = bounds(sizes, r)
    for root in roots(comm):
        # root's array is split; the others' extent along the axis may be anything (here 0 or rank + 1),
        # but under jit with sizes=None it is taken to be root's
        if r == root or (fw.jit and not given):
            x = full
        else:
            x = make((r % 2 * (r + 1), 2), np.float64, seed=20 + r)
        kw = {"root": root, "axis": 0, "sizes": sizes if given else None}
        f = lambda t, kw=kw: fw.mod.scatter(t, comm, **kw)  # noqa: E731
        want_g = np.concatenate(W) if r == root else np.zeros_like(x)
        core_y = hpccoll.scatter(x, comm, **kw)
        core_g = hpccoll.scatter_adjoint(W[r], comm, **{**kw, "sizes": sizes})
        # hpccoll's adjoint gives the other ranks an empty array; their gradient has x's shape
        agree(comm, lambda core_g=core_g, root=root: r == root or close(core_g, np.zeros((0, 2))))
        core_g = core_g if r == root else np.zeros_like(x)
        check(comm, fw, f, x, W[r], full[lo:hi], want_g, core_y, core_g)


def test_gather_then_scatter_round_trip(comm, fw):
    """scatter(gather(x)) is the identity on every shard, and so is its gradient (W itself)."""
    P, r = comm.size, comm.rank
    sizes = uneven(P)
    full = make((sum(sizes), 3), np.float64, seed=30)
    W = make((sum(sizes), 3), np.float64, seed=31)
    lo, hi = bounds(sizes, r)
    root = P // 2
    f = lambda t: fw.mod.scatter(fw.mod.gather(t, comm, root=root, sizes=sizes), comm, root=root, sizes=sizes)  # noqa: E731
    check(comm, fw, f, full[lo:hi], W[lo:hi], full[lo:hi], W[lo:hi], full[lo:hi], W[lo:hi])


# --------------------------------------------------------------------------- JAX specifics


def test_jax_jit_scatter_sizes_none_mismatch_is_reported(comm):
    jax = pytest.importorskip("jax")
    from hpccoll.adapters import jax as hcj

    if comm.size == 1:
        pytest.skip("needs ranks of different extents")
    x = jax.numpy.ones((comm.rank + 1, 2))

    def call():
        with hcj.reraise():
            jax.block_until_ready(jax.jit(lambda v: hcj.scatter(v, comm))(x))

    message = raises_everywhere(
        comm, hpccoll.MismatchError, "scatter: expected every rank's extent along axis 0 to be root 0's", call
    )
    assert f"pass sizes={list(hpccoll.split_sizes(1, comm.size))}" in message


def test_jax_vmap_gather_and_scatter(comm):
    """vmap batches a rooted collective into one on arrays with one more axis (the gather axis shifted)."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    from hpccoll.adapters import jax as hcj

    P, r = comm.size, comm.rank
    sizes = uneven(P)
    full = make((4, sum(sizes), 2), np.float64, seed=40)  # batch of 4
    lo, hi = bounds(sizes, r)
    root = P - 1
    g = jax.vmap(lambda v: hcj.gather(v, comm, root=root, sizes=sizes))
    got = np.asarray(g(jax.numpy.asarray(full[:, lo:hi])))
    agree(comm, lambda: close(got, full if r == root else np.zeros((4, 0, 2))))
    x = full if r == root else np.zeros((4, 1, 2))  # the other ranks: another extent, a zero gradient
    s = jax.vmap(lambda v: hcj.scatter(v, comm, root=root, sizes=sizes))
    agree(comm, lambda: close(np.asarray(s(jax.numpy.asarray(x))), full[:, lo:hi]))
    W = make((4, sum(sizes), 2), np.float64, seed=41)
    grad = jax.jit(jax.grad(lambda v: jax.numpy.sum(W[:, lo:hi] * s(v))))(jax.numpy.asarray(x))
    agree(comm, lambda: close(np.asarray(grad), W if r == root else np.zeros_like(x)))


# --------------------------------------------------------------------------- torch float8


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_torch_float8_round_trip_through_all_gather(comm, name):
    torch = pytest.importorskip("torch")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from hpccoll.adapters import torch as hct

    tdtype = getattr(torch, name, None)
    if tdtype is None:
        pytest.skip(f"this torch has no {name}")
    P, r = comm.size, comm.rank
    rows = np.array([0.5, -1.5, 2.0], dtype=np.float32) * 2.0 ** np.arange(P)[:, None]  # exact in both formats
    t = torch.from_numpy(rows[r]).to(tdtype)
    a = hct.to_array(t)
    agree(
        comm, lambda: a.dtype == np.dtype(getattr(ml_dtypes, name)) and np.shares_memory(a, t.view(torch.uint8).numpy())
    )
    back = hct.from_array(a)
    agree(comm, lambda: back.dtype == tdtype and back.data_ptr() == t.data_ptr())
    y = hct.all_gather(t, comm)
    want = rows.ravel().astype(getattr(ml_dtypes, name))
    agree(comm, lambda: y.dtype == tdtype and np.array_equal(y.view(torch.uint8).numpy(), want.view(np.uint8)))
    z = hct.broadcast(t, comm, root=P - 1)
    agree(comm, lambda: np.array_equal(hct.to_array(z).view(np.uint8), want[-3:].view(np.uint8)))


def test_torch_unmappable_dtype_is_named(comm):
    torch = pytest.importorskip("torch")
    from hpccoll.adapters import torch as hct

    odd = getattr(torch, "float8_e4m3fnuz", None) or getattr(torch, "complex32", None)
    if odd is None:
        pytest.skip("this torch has no dtype NumPy cannot represent")
    t = torch.zeros(2, dtype=odd)
    raises_everywhere(comm, hpccoll.DTypeError, f"x: expected a tensor dtype .*; got {odd}", lambda: hct.to_array(t))
    raises_everywhere(comm, hpccoll.DTypeError, f"got {odd}", lambda: hct.all_gather(t, comm))
    raises_everywhere(
        comm,
        hpccoll.DTypeError,
        "a: expected a NumPy dtype torch can represent; got object",
        lambda: hct.from_array(np.empty(2, dtype=object)),
    )
