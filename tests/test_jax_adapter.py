"""hpccoll.adapters.jax: values, gradients, transforms and errors against serial references.

Written for any number of ranks. The data is global (a leading rank axis, made identically on
every rank); each rank takes its part, and references are computed from the global data, with
NumPy for values and with JAX on one process (no collectives) for gradients. Every rank's loss
has its own weights, so a gradient is that of the sum over ranks of the rank losses; a Jacobian
(``jax.jacfwd``, ``jax.jacrev``) pushes the same basis vector on every rank, and its serial
reference sums the global Jacobian over ranks accordingly. Each test runs eagerly and under
``jax.jit``. Skipped when JAX is not installed.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)  # float64, int64, uint64 and complex128 as themselves

import jax.numpy as jnp  # noqa: E402
from conftest import (  # noqa: E402
    DTYPE_IDS,
    DTYPES,
    agree,
    all_ranks,
    assert_close,
    assert_same,
    make,
    raises_everywhere,
    reference,
)

import hpccoll  # noqa: E402
from hpccoll.adapters import jax as hcj  # noqa: E402

pytestmark = pytest.mark.mpi

MODES = ["eager", "jit"]


@pytest.fixture(params=hcj.LOWERINGS)
def lowering(request, monkeypatch):
    """Every lowering under jit this JAX has: XLA's buffers (buffer_callback), the host callback emitted directly,
    and io_callback."""
    monkeypatch.setattr(hcj, "LOWERING", request.param)
    return request.param


def run(mode, f, *args):
    return f(*args) if mode == "eager" else jax.jit(f)(*args)


def uneven(p):
    return [(3 * r + 2) % 4 for r in range(p)]  # 2, 1, 0, 3: uneven, with an empty shard from P = 3


def bounds(sizes, rank):
    lo = sum(sizes[:rank])
    return lo, lo + sizes[rank]


def host(a):
    return np.asarray(a)


# --------------------------------------------------------------------------- values, every dtype


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_all_gather_every_dtype_uneven_axis1(comm, mode, dtype, lowering):
    sizes = uneven(comm.size)
    full = make((2, sum(sizes), 3), dtype, seed=1)
    lo, hi = bounds(sizes, comm.rank)
    x = jnp.asarray(full[:, lo:hi])
    y = run(mode, lambda v: hcj.all_gather(v, comm, axis=1, sizes=sizes), x)
    assert isinstance(y, jax.Array)
    assert_same(host(y), full)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_reductions_every_dtype(comm, mode, dtype):
    P, r = comm.size, comm.rank
    stack = make((P, 3, 2 * P + 1), dtype, seed=2, kind="exact")
    sizes = hpccoll.split_sizes(2 * P + 1, P)
    lo, hi = bounds(sizes, r)
    want = reference(stack, "sum")
    got = run(mode, lambda v: hcj.all_reduce(v, comm), jnp.asarray(stack[r]))
    assert_close(host(got), want)
    got = run(mode, lambda v: hcj.reduce_scatter(v, comm, axis=-1), jnp.asarray(stack[r]))
    assert_close(host(got), want[:, lo:hi])
    got = run(mode, lambda v: hcj.replicate(v, comm), jnp.asarray(stack[r]))
    assert_same(host(got), stack[r])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", "avg"])
def test_reduction_ops(comm, mode, op):
    stack = make((comm.size, 5), np.float64, seed=3)
    got = run(mode, lambda v: hcj.all_reduce(v, comm, op=op), jnp.asarray(stack[comm.rank]))
    assert_close(host(got), reference(stack, op))


def _all_to_all_case(P, r, axes):
    """(x shape, sizes, recv_sizes) of rank r: uneven blocks, empty ones from P = 3, extents differing by rank."""
    sa, ca = axes
    rows = uneven(P)
    shape = [2, 2, 3]
    if sa % 3 == ca % 3:  # every rank splits its own way: rank q sends rank r its sizes[r]
        split = lambda q: rows[q:] + rows[:q]  # noqa: E731
        shape[sa] = sum(split(r))
        return tuple(shape), split(r), [split(q)[r] for q in range(P)]
    sizes = hpccoll.split_sizes(2 * P + 1, P)  # one split on every rank; rank q's extent along ca is rows[q]
    shape[sa], shape[ca] = 2 * P + 1, rows[r]
    return tuple(shape), sizes, rows


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("axes", [(0, 0), (1, 1), (1, 0), (0, 2), (-1, -3)])
def test_all_to_all_every_dtype_uneven_axes(comm, mode, dtype, axes, lowering):
    sa, ca = axes
    shape, sizes, recv_sizes = _all_to_all_case(comm.size, comm.rank, axes)
    x = make(shape, dtype, seed=60 + comm.rank)
    want = hpccoll.all_to_all(x, comm, split_axis=sa, concat_axis=ca, sizes=sizes, recv_sizes=recv_sizes)
    f = lambda v: hcj.all_to_all(v, comm, split_axis=sa, concat_axis=ca, sizes=sizes, recv_sizes=recv_sizes)  # noqa: E731
    y = run(mode, f, jnp.asarray(x))
    assert isinstance(y, jax.Array)
    assert_same(host(y), want)
    if mode == "eager":  # recv_sizes=None: learned with one exchange, as hpccoll.all_to_all learns them
        assert_same(host(hcj.all_to_all(jnp.asarray(x), comm, split_axis=sa, concat_axis=ca, sizes=sizes)), want)


def test_all_to_all_learns_extents_eagerly_and_its_gradient_reuses_them(comm):
    """recv_sizes=None: one exchange in the forward; the gradient is hpccoll's adjoint with the learned extents."""
    shape, sizes, recv_sizes = _all_to_all_case(comm.size, comm.rank, (0, 0))
    x = make(shape, np.float64, seed=70 + comm.rank)
    w = make((sum(recv_sizes),) + shape[1:], np.float64, seed=80 + comm.rank)
    g = jax.grad(lambda v: jnp.sum(jnp.asarray(w) * hcj.all_to_all(v, comm, sizes=sizes)))(jnp.asarray(x))
    np.testing.assert_allclose(
        host(g), hpccoll.all_to_all_adjoint(w, comm, sizes=sizes, recv_sizes=recv_sizes), rtol=1e-13, atol=1e-13
    )


def test_all_gather_discovers_uneven_sizes_eagerly(comm):
    sizes = uneven(comm.size)
    full = make((sum(sizes), 2), np.float32, seed=4)
    lo, hi = bounds(sizes, comm.rank)
    y = hcj.all_gather(jnp.asarray(full[lo:hi]), comm)
    assert_same(host(y), full)
    W = make((comm.size, sum(sizes), 2), np.float32, seed=5)
    g = jax.grad(lambda v: jnp.sum(jnp.asarray(W[comm.rank]) * hcj.all_gather(v, comm)))(jnp.asarray(full[lo:hi]))
    np.testing.assert_allclose(host(g), W.sum(0)[lo:hi], rtol=1e-6)


def test_jitted_results_survive_the_next_call(comm, lowering):
    """A call site's results stay as they were after its later calls, small and large."""
    f = jax.jit(lambda v: hcj.all_reduce(v, comm))
    first = f(jnp.full(3, 1.0))
    second = f(jnp.full(3, 2.0))
    big = f(jnp.ones((4 << 20) // 8 + 1))
    np.testing.assert_array_equal(host(first), np.full(3, 1.0 * comm.size))
    np.testing.assert_array_equal(host(second), np.full(3, 2.0 * comm.size))
    assert float(big[-1]) == comm.size


@pytest.mark.skipif("buffer" not in hcj.LOWERINGS, reason="this JAX has no buffer_callback")
def test_buffer_lowering_works_on_xlas_own_buffers(comm, monkeypatch):
    """On the CPU hpccoll reads XLA's input and writes XLA's output in place: no copy in, none out."""
    monkeypatch.setattr(hcj, "LOWERING", "buffer")
    seen = []
    original = hcj._BUFFER_CALLS["cpu"]

    def spy(fn):
        def recorded(a, out):
            seen.append((a.__array_interface__["data"][0], out.__array_interface__["data"][0], out.flags.writeable))
            return fn(a, out=out)

        return original(recorded)

    monkeypatch.setitem(hcj._BUFFER_CALLS, "cpu", spy)
    x = jnp.asarray(make(1000, np.float64, seed=30 + comm.rank))
    y = jax.jit(lambda v: hcj.all_gather(v, comm, sizes=[1000] * comm.size))(x)
    want = hpccoll.all_gather(host(x), comm)
    agree(comm, len(seen) == 1, f"expected one callback; got {seen}")
    (into, out_of, writeable) = seen[0]
    agree(
        comm,
        into == x.unsafe_buffer_pointer(),
        f"the callback read a copy of x: {into:#x} != {x.unsafe_buffer_pointer():#x}",
    )
    agree(comm, writeable and out_of == y.unsafe_buffer_pointer(), f"hpccoll wrote elsewhere than the result: {seen}")
    assert_same(host(y), want, comm)


def test_numpy_input_and_replicate_needs_no_callback(comm):
    x = np.arange(4.0)
    y = hcj.all_reduce(x, comm)
    assert isinstance(y, jax.Array) and np.array_equal(host(y), comm.size * x)
    assert np.array_equal(x, np.arange(4.0))  # inputs are never modified
    assert not jax.make_jaxpr(lambda v: hcj.replicate(v, comm))(x).effects  # identity forward: no callback
    assert jax.make_jaxpr(lambda v: hcj.all_reduce(v, comm))(x).effects  # a collective: an ordered effect


# --------------------------------------------------------------------------- gradients against serial references


def _case(comm, name):
    """(f, x, w, reference gradient of sum over ranks of <w_r, f(x_r)>); w differs on every rank."""
    P, r = comm.size, comm.rank
    if name == "all_gather":
        sizes = uneven(P)
        full = make((3, sum(sizes)), np.float64, seed=10)
        lo, hi = bounds(sizes, r)
        W = make((P, 3, sum(sizes)), np.float64, seed=11)
        return (lambda v: hcj.all_gather(v, comm, axis=1, sizes=sizes)), full[:, lo:hi], W[r], W.sum(0)[:, lo:hi]
    if name == "all_to_all":  # a transpose: rank r's rows, split by columns; rank j gets every rank's block j
        rows, cols = uneven(P), hpccoll.split_sizes(2 * P + 1, P)
        X = make((sum(rows), sum(cols)), np.float64, seed=21)  # the global array, row blocks on the ranks
        W = make((sum(rows), sum(cols)), np.float64, seed=22)  # rank j weighs its column block j of X
        (lo, hi), (clo, chi) = bounds(rows, r), bounds(cols, r)
        f = lambda v: hcj.all_to_all(v, comm, split_axis=1, concat_axis=0, sizes=cols, recv_sizes=rows)  # noqa: E731
        return f, X[lo:hi], W[:, clo:chi], W[lo:hi]
    if name == "replicate":
        W = make((P, 3), np.float64, seed=13)
        return (lambda v: hcj.replicate(v, comm)), make(3, np.float64, seed=14), W[r], W.sum(0)
    op = name.split(":")[1]
    scale = 1.0 / P if op == "avg" else 1.0
    if name.startswith("reduce_scatter"):
        sizes = hpccoll.split_sizes(2 * P + 1, P)
        X = make((P, 2 * P + 1, 2), np.float64, seed=12)
        blocks = [make((sizes[s], 2), np.float64, seed=40 + s) for s in range(P)]
        return (lambda v: hcj.reduce_scatter(v, comm, op=op)), X[r], blocks[r], scale * np.concatenate(blocks)
    cot = name.split(":")[2]
    X = make((P, 4), np.float64, seed=15)
    W = make((P, 4), np.float64, seed=16)
    f = lambda v: hcj.all_reduce(v, comm, op=op, cotangent=cot)  # noqa: E731
    if cot == "replicated":  # the loss (and so its cotangent) is the same on every rank
        return f, X[r], W[0], scale * W[0]
    return f, X[r], W[r], scale * W.sum(0)


CASES = [
    "all_gather",
    "all_to_all",
    "reduce_scatter:sum",
    "reduce_scatter:avg",
    "all_reduce:sum:varying",
    "all_reduce:avg:varying",
    "all_reduce:sum:replicated",
    "all_reduce:avg:replicated",
    "replicate",
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", CASES)
def test_grad_vjp_jvp_transpose_match_serial(comm, mode, name):
    f, x, w, want = _case(comm, name)
    x, w = jnp.asarray(x), jnp.asarray(w)
    grad = run(mode, jax.grad(lambda v: jnp.sum(w * f(v))), x)
    np.testing.assert_allclose(host(grad), want, rtol=1e-13, atol=1e-13)
    vjp = run(mode, lambda v, ct: jax.vjp(f, v)[1](ct)[0], x, w)
    np.testing.assert_allclose(host(vjp), want, rtol=1e-13, atol=1e-13)
    transposed = run(mode, lambda ct: jax.linear_transpose(f, x)(ct)[0], w)
    np.testing.assert_allclose(host(transposed), want, rtol=1e-13, atol=1e-13)
    t = jnp.asarray(make(x.shape, np.float64, seed=17 + comm.rank))
    primal, tangent = run(mode, lambda v, dv: jax.jvp(f, (v,), (dv,)), x, t)
    np.testing.assert_array_equal(host(primal), host(f(x)))
    np.testing.assert_array_equal(host(tangent), host(f(t)))  # linear: the JVP is the map on the tangent


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "complex64", "complex128"])
def test_vjp_in_every_float_dtype_is_hpccolls_adjoint(comm, mode, dtype):
    if dtype == "bfloat16":
        dtype = jnp.bfloat16
    sizes = uneven(comm.size)
    x = jnp.asarray(make((sizes[comm.rank], 2), dtype, seed=18 + comm.rank, kind="exact"))
    ct = make((sum(sizes), 2), dtype, seed=19 + comm.rank, kind="exact")
    got = run(
        mode, lambda v, c: jax.vjp(lambda u: hcj.all_gather(u, comm, sizes=sizes), v)[1](c)[0], x, jnp.asarray(ct)
    )
    assert got.dtype == x.dtype
    assert_close(host(got), hpccoll.all_gather_adjoint(ct, comm, sizes=sizes))
    w = make(3, dtype, seed=20, kind="exact")
    got = run(
        mode,
        lambda v, c: jax.vjp(lambda u: hcj.all_reduce(u, comm, op="avg"), v)[1](c)[0],
        jnp.asarray(w),
        jnp.asarray(w),
    )
    assert_close(host(got), hpccoll.all_reduce_adjoint(w, comm, op="avg"))


# --------------------------------------------------------------------------- compositions


def _chain(mod, xp, comm, x, A, W, sizes, blocks):
    """all_gather -> local -> reduce_scatter -> local -> all_reduce: three collectives, three adjoints."""
    G = mod.all_gather(x, comm, axis=0, sizes=sizes)
    S = mod.reduce_scatter(xp.tanh(G * A), comm, axis=0, sizes=blocks)
    T = mod.all_reduce(xp.sum(S * S, axis=0), comm)
    return xp.sum(W * T)


def _chain_setup(comm):
    P, r = comm.size, comm.rank
    sizes, blocks = uneven(P), hpccoll.split_sizes(sum(uneven(P)), P)
    X = make((sum(sizes), 3), np.float64, seed=21)
    A = make((P, sum(sizes), 3), np.float64, seed=22)
    W = make((P, 3), np.float64, seed=23)

    def serial(X):  # the same objective, summed over ranks, on one process
        S = sum(jnp.tanh(X * A[q]) for q in range(P))
        return jnp.sum(W.sum(0) * jnp.sum(S * S, axis=0))

    lo, hi = bounds(sizes, r)
    return X[lo:hi], A[r], W[r], sizes, blocks, host(jax.grad(serial)(jnp.asarray(X)))[lo:hi], float(serial(X))


@pytest.mark.parametrize("mode", MODES)
def test_many_collectives_in_one_function_and_its_gradient(comm, mode, lowering):
    x, A, W, sizes, blocks, want_grad, want_sum = _chain_setup(comm)
    loss = lambda v: _chain(hcj, jnp, comm, v, A, W, sizes, blocks)  # noqa: E731
    value, grad = run(mode, jax.value_and_grad(loss), jnp.asarray(x))
    total = hpccoll.all_reduce(np.asarray(float(value)), comm)  # the objective is the sum over ranks
    np.testing.assert_allclose(total, want_sum, rtol=1e-12)
    np.testing.assert_allclose(host(grad), want_grad, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("mode", MODES)
def test_second_order_and_jvp_of_grad(comm, mode):
    sizes = uneven(comm.size)
    full = make(sum(sizes), np.float64, seed=24)
    lo, hi = bounds(sizes, comm.rank)
    x = jnp.asarray(full[lo:hi])
    first = jax.grad(lambda v: jnp.sum(hcj.all_gather(v, comm, sizes=sizes) ** 3) / 3)  # P x^2
    second = run(mode, jax.grad(lambda v: jnp.sum(first(v))), x)  # 2 P x
    np.testing.assert_allclose(host(second), 2 * comm.size * full[lo:hi], rtol=1e-13)
    t = jnp.ones_like(x)
    _, hvp = run(mode, lambda v: jax.jvp(first, (v,), (t,)), x)  # forward over reverse
    np.testing.assert_allclose(host(hvp), 2 * comm.size * full[lo:hi], rtol=1e-13)


@pytest.mark.parametrize("mode", MODES)
def test_inside_scan_and_cond(comm, mode):
    P = comm.size
    x0 = jnp.asarray(make(3, np.float64, seed=25 + comm.rank))

    def steps(x):
        def body(c, _):
            return 0.5 * hcj.all_reduce(c, comm, op="avg") + c, None

        x = jax.lax.scan(body, x, None, length=3)[0]
        return jax.lax.cond(jnp.sum(x) > -1e300, lambda v: hcj.all_reduce(v, comm), lambda v: v * P, x)

    X = np.stack([make(3, np.float64, seed=25 + q) for q in range(P)])
    for _ in range(3):  # c_r <- c_r + mean over ranks / 2
        X = X + 0.5 * X.mean(0)
    np.testing.assert_allclose(host(run(mode, steps, x0)), X.sum(0), rtol=1e-13)
    # d/dx_r of sum over ranks of sum(steps(x)): the scan matrix (I + J/(2P))^3 then all-reduce
    g = run(mode, jax.grad(lambda v: jnp.sum(steps(v))), x0)
    np.testing.assert_allclose(host(g), np.full(3, P * 1.5**3), rtol=1e-13)


def test_independent_collectives_keep_program_order_under_jit(comm):
    """No data dependency between them: only the ordered effect keeps every rank's order the same."""
    a = jnp.asarray(make(4, np.float64, seed=26 + comm.rank))
    b = jnp.asarray(make((2, 3), np.int32, seed=27 + comm.rank))

    @jax.jit
    def f(a, b):
        return [
            hcj.all_reduce(a, comm),
            hcj.all_gather(b, comm, sizes=[2] * comm.size),
            hcj.all_reduce(a, comm, op="max"),
            hcj.reduce_scatter(jnp.tile(b, (comm.size, 1)), comm),
        ]

    got = [host(v) for v in f(a, b)]
    want = [
        hpccoll.all_reduce(host(a), comm),
        hpccoll.all_gather(host(b), comm),
        hpccoll.all_reduce(host(a), comm, op="max"),
        hpccoll.reduce_scatter(np.tile(host(b), (comm.size, 1)), comm),
    ]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


# --------------------------------------------------------------------------- the same gradients as autograd and torch


def _tp_problem(comm):
    P = comm.size
    rng = np.random.default_rng(7)
    din, hidden, dout, batch = 4, 2 * P + 1, 3, 2 * P + 1
    cols = hpccoll.split_sizes(hidden, P)
    rows = hpccoll.split_sizes(batch, P)
    c0 = sum(cols[: comm.rank])
    full = [
        rng.standard_normal((batch, din)),
        rng.standard_normal((din, hidden)),
        rng.standard_normal(hidden),
        rng.standard_normal((hidden, dout)),
        rng.standard_normal(dout),
    ]
    x, W1, b1, W2, b2 = full
    mine = [x, W1[:, c0 : c0 + cols[comm.rank]], b1[c0 : c0 + cols[comm.rank]], W2[c0 : c0 + cols[comm.rank]], b2]
    return mine, rng.standard_normal((batch, dout)), cols, rows


def _tp_loss(mod, xp, params, t, comm, cols, rows):
    """Column-parallel, all-gather, row-parallel, replicated all-reduce, reduce-scatter of the batch."""
    x, W1, b1, W2, b2 = params
    h = xp.tanh(mod.replicate(x, comm) @ W1 + b1)
    H = mod.all_gather(h, comm, axis=1, sizes=cols)
    lo = sum(cols[: comm.rank])
    z = (H[:, lo : lo + cols[comm.rank]] * H[:, :1]) @ W2
    y = mod.all_reduce(z, comm, cotangent="replicated") + b2
    mine = mod.reduce_scatter((y - t) ** 2, comm, op="avg", axis=0, sizes=rows)
    return xp.sum(mine) + 0.1 * xp.sum(mod.all_reduce(xp.sum(h * h, axis=1), comm, op="sum"))


def test_same_gradients_as_autograd_and_torch(comm):
    mine, t, cols, rows = _tp_problem(comm)
    grads = {}
    jloss = lambda p: _tp_loss(hcj, jnp, p, jnp.asarray(t), comm, cols, rows)  # noqa: E731
    jparams = [jnp.asarray(p) for p in mine]
    grads["jax"] = [host(g) for g in jax.grad(jloss)(jparams)]
    grads["jax jit"] = [host(g) for g in jax.jit(jax.grad(jloss))(jparams)]
    try:
        import autograd
        import autograd.numpy as anp

        from hpccoll.adapters import autograd as hca

        grads["autograd"] = autograd.grad(lambda p: _tp_loss(hca, anp, p, t, comm, cols, rows))(mine)
    except ImportError:
        pass
    try:
        import torch

        from hpccoll.adapters import torch as hct

        params = [torch.tensor(p, requires_grad=True) for p in mine]
        _tp_loss(hct, torch, params, torch.tensor(t), comm, cols, rows).backward()
        grads["torch"] = [p.grad.numpy() for p in params]
    except ImportError:
        pass
    if len(grads) == 2:
        pytest.skip("neither autograd nor torch is installed (make test-adapters installs both)")
    for name, got in grads.items():
        for g, w in zip(got, grads["jax"]):
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-15 * np.abs(w).max(), err_msg=name)


# --------------------------------------------------------------------------- vmap, jacfwd, jacrev: serial references


B = 3  # batch size: the same on every rank (a batch size that differs is a mismatch, tested below)


def _global_case(comm, name):
    """(f, X, F, replicated_in, replicated_out) for shapes equal on every rank.

    ``X``: every rank's input, stacked (rank axis first, the same on every rank); ``F``: the
    serial JAX map from that stack to the list of every rank's output (no collectives).
    ``replicated_in``: ``X[r]`` is one value held by every rank (``replicate``);
    ``replicated_out``: the objective counts the output once (``cotangent="replicated"``).
    """
    P = comm.size
    if name.startswith("all_reduce"):
        _, op, cot = name.split(":")
        red = (lambda X: jnp.sum(X, 0)) if op == "sum" else (lambda X: jnp.mean(X, 0))  # noqa: E731
        return (
            (lambda v: hcj.all_reduce(v, comm, op=op, cotangent=cot)),
            make((P, 2, 3), np.float64, seed=90),
            lambda X: [red(X)] * P,
            False,
            cot == "replicated",
        )
    if name.startswith("reduce_scatter"):  # 2 rows of the reduction each
        op = name.split(":")[1]
        red = (lambda X: jnp.sum(X, 0)) if op == "sum" else (lambda X: jnp.mean(X, 0))  # noqa: E731
        return (
            (lambda v: hcj.reduce_scatter(v, comm, op=op)),
            make((P, 2 * P, 2), np.float64, seed=91),
            lambda X: [red(X)[2 * r : 2 * r + 2] for r in range(P)],
            False,
            False,
        )
    if name == "all_gather":  # no sizes: every rank's extent is this rank's (also under jit and vmap)
        return (
            (lambda v: hcj.all_gather(v, comm, axis=1)),
            make((P, 2, 2), np.float64, seed=92),
            lambda X: [jnp.concatenate(list(X), axis=1)] * P,
            False,
            False,
        )
    if name == "all_to_all":  # no recv_sizes: equal splits; rank r gets every rank's column block r
        f = lambda v: hcj.all_to_all(v, comm, split_axis=1, concat_axis=0)  # noqa: E731
        return (
            f,
            make((P, 2, 2 * P), np.float64, seed=93),
            lambda X: [jnp.concatenate([X[q][:, 2 * r : 2 * r + 2] for q in range(P)], axis=0) for r in range(P)],
            False,
            False,
        )
    assert name == "replicate"
    X = np.broadcast_to(make((2, 3), np.float64, seed=94), (P, 2, 3))  # one value, held by every rank
    return (lambda v: hcj.replicate(v, comm)), X, lambda X: [X[r] for r in range(P)], True, False


GLOBAL_CASES = [
    "all_reduce:sum:varying",
    "all_reduce:avg:varying",
    "all_reduce:sum:replicated",
    "all_reduce:avg:replicated",
    "reduce_scatter:sum",
    "reduce_scatter:avg",
    "all_gather",
    "all_to_all",
    "replicate",
]


def _serial_jacobians(comm, F, X, replicated_in, replicated_out):
    """This rank's jacfwd and jacrev, from the serial Jacobian of every rank's output in every rank's input.

    jacfwd pushes the same basis tangent on every rank: ``sum_s dF_r/dX_s``. jacrev pulls the same basis
    cotangent back on every rank, the gradient of the sum over ranks: ``sum_q dF_q/dX_r`` (summed over
    every ``X_s`` too for a replicated input, and over P for an objective counted once).
    """
    P, r = comm.size, comm.rank
    X = jnp.asarray(X)
    full = [jax.jacfwd(lambda Y, q=q: F(Y)[q])(X) for q in range(P)]  # out_q + (P,) + in
    ndim_out = full[r].ndim - X.ndim
    fwd = jnp.sum(full[r], axis=ndim_out)
    rev = sum(jnp.sum(J, axis=ndim_out) if replicated_in else jnp.take(J, r, axis=ndim_out) for J in full)
    return host(fwd), host(rev / P if replicated_out else rev)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", GLOBAL_CASES)
def test_jacfwd_and_jacrev_match_serial(comm, mode, name):
    f, X, F, rep_in, rep_out = _global_case(comm, name)
    want_fwd, want_rev = _serial_jacobians(comm, F, X, rep_in, rep_out)
    x = jnp.asarray(X[comm.rank])
    fwd, rev = host(run(mode, jax.jacfwd(f), x)), host(run(mode, jax.jacrev(f), x))
    agree(
        comm,
        lambda: (
            np.testing.assert_allclose(fwd, want_fwd, rtol=1e-13, atol=1e-15),
            np.testing.assert_allclose(rev, want_rev, rtol=1e-13, atol=1e-15),
        ),
    )


def test_jacobians_of_all_reduce_as_in_mpi4jax(comm):
    """jacfwd of an all-reduce is P I; jacrev with the identity transpose (mpi4jax's) is I."""
    x = jnp.asarray(make(3, np.float64, seed=95 + comm.rank))
    eye = np.eye(3)
    got = [
        host(jax.jacfwd(lambda v: hcj.all_reduce(v, comm))(x)),
        host(jax.jacrev(lambda v: hcj.all_reduce(v, comm, cotangent="replicated"))(x)),
        host(jax.jit(jax.jacrev(lambda v: hcj.all_reduce(v, comm)))(x)),
    ]
    agree(comm, lambda: all(np.array_equal(g, w) for g, w in zip(got, [comm.size * eye, eye, comm.size * eye])))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", GLOBAL_CASES)
@pytest.mark.parametrize("in_axis", [0, 1, -1])
def test_vmap_values_match_serial(comm, mode, name, in_axis):
    """A batch of B inputs, the batch axis anywhere: the collective of each, stacked (out_axes = in_axis)."""
    f, X, F, _, _ = _global_case(comm, name)
    batch = np.stack([(b + 1) * X - b for b in range(B)])  # (B, P, ...): example b of every rank
    want = np.moveaxis(np.stack([host(F(jnp.asarray(Xb))[comm.rank]) for Xb in batch]), 0, in_axis)
    x = jnp.asarray(np.moveaxis(batch[:, comm.rank], 0, in_axis))
    got = host(run(mode, jax.vmap(f, in_axes=in_axis, out_axes=in_axis), x))
    assert_close(got, want, comm)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("in_axis", [0, 2])
def test_vmap_of_uneven_all_gather_and_all_to_all(comm, mode, in_axis, lowering):
    """Uneven shards (an empty one from P = 3): the gathered and split axes move past the batch axis."""
    P, r = comm.size, comm.rank
    sizes = uneven(P)
    full = make((B, 2, sum(sizes)), np.float64, seed=96)  # example b: (2, sum(sizes)), gathered along axis 1
    lo, hi = bounds(sizes, r)
    x = jnp.asarray(np.moveaxis(full[:, :, lo:hi], 0, in_axis))
    got = host(run(mode, jax.vmap(lambda v: hcj.all_gather(v, comm, axis=-1, sizes=sizes), in_axis, in_axis), x))
    assert_same(got, np.moveaxis(full, 0, in_axis), comm)
    shape, split, recv = _all_to_all_case(P, r, (0, 2))
    xs = make((B,) + shape, np.float64, seed=97 + r)
    want = np.moveaxis(
        np.stack([hpccoll.all_to_all(v, comm, split_axis=0, concat_axis=2, sizes=split, recv_sizes=recv) for v in xs]),
        0,
        in_axis,
    )
    f = lambda v: hcj.all_to_all(v, comm, split_axis=0, concat_axis=-1, sizes=split, recv_sizes=recv)  # noqa: E731
    got = host(run(mode, jax.vmap(f, in_axis, in_axis), jnp.asarray(np.moveaxis(xs, 0, in_axis))))
    assert_same(got, want, comm)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", CASES)
def test_vmap_of_vjp_and_jvp_match_serial(comm, mode, name):
    """Per-example cotangents (w_b = (b + 1) w) through the batched transpose: (b + 1) times the serial gradient."""
    f, x, w, want = _case(comm, name)
    scale = np.arange(1, B + 1, dtype=np.float64).reshape((B,) + (1,) * np.ndim(w))
    xs, ws = jnp.asarray(x + 0 * scale), jnp.asarray(w * scale)
    got = host(run(mode, jax.vmap(lambda v, ct: jax.vjp(f, v)[1](ct)[0]), xs, ws))
    y = host(f(jnp.asarray(x)))  # the unbatched value (its own test checks it)
    primal, tangent = run(mode, jax.vmap(lambda v, t: jax.jvp(f, (v,), (t,))), xs, jnp.asarray(x * scale))
    agree(
        comm,
        lambda: (
            np.testing.assert_allclose(got, scale * want, rtol=1e-13, atol=1e-13),
            np.testing.assert_allclose(host(primal), np.broadcast_to(y, (B,) + y.shape), rtol=1e-13),
            np.testing.assert_allclose(host(tangent), scale.reshape((B,) + (1,) * y.ndim) * y, rtol=1e-13, atol=1e-13),
        ),
    )


@pytest.mark.parametrize("mode", MODES)
def test_hessian_matches_serial(comm, mode):
    """jax.hessian (jacfwd of jacrev) of a rank loss through an all-gather and an all-reduce."""
    P, r = comm.size, comm.rank
    X = make((P, 2), np.float64, seed=98)
    W = make((P, 2 * P), np.float64, seed=99)

    def loss(v):
        g = hcj.all_gather(v, comm)
        return jnp.sum(jnp.asarray(W[r]) * g**3) + jnp.sum(hcj.all_reduce(v, comm) ** 2)

    def serial(Y):  # the sum over ranks of the rank losses
        g = Y.reshape(-1)
        return sum(jnp.sum(W[q] * g**3) + jnp.sum(jnp.sum(Y, 0) ** 2) for q in range(P))

    H = jax.hessian(serial)(jnp.asarray(X))  # (P, 2, P, 2)
    want = host(jnp.sum(H[r], axis=1))  # the same tangent pushed on every rank
    got = host(run(mode, jax.hessian(loss), jnp.asarray(X[r])))
    agree(comm, lambda: np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", MODES)
def test_vmap_batch_size_that_differs_between_ranks_is_a_mismatch(mode):
    """Caught like any other shape mismatch: check mode raises MismatchError on every rank."""
    c = hpccoll.Communicator(check=True)
    try:
        x = jnp.ones((1 + c.rank, 3))
        for f in (lambda v: hcj.all_reduce(v, c), lambda v: hcj.all_gather(v, c, sizes=[3] * c.size)):
            raises_everywhere(
                c,
                hpccoll.MismatchError,
                "disagree|differ",
                lambda: _reraised(lambda: run(mode, jax.vmap(f), x)),
                same_message=False,
            )
    finally:
        c.free()


# --------------------------------------------------------------------------- jit without sizes


@pytest.mark.parametrize("mode", ["jit", "vmap"])
def test_all_gather_and_all_to_all_without_sizes_while_tracing(comm, mode, lowering):
    """Equal extents taken from this rank's: values and gradients as with the extents given."""
    P, r = comm.size, comm.rank
    trace = jax.jit if mode == "jit" else (lambda g: lambda v: jax.vmap(g)(v[None])[0])
    full = make((2 * P, 3), np.float64, seed=100)
    W = make((P, 2 * P, 3), np.float64, seed=101)
    x = jnp.asarray(full[2 * r : 2 * r + 2])
    got = host(trace(lambda v: hcj.all_gather(v, comm))(x))
    grad = host(trace(jax.grad(lambda v: jnp.sum(jnp.asarray(W[r]) * hcj.all_gather(v, comm))))(x))
    a = make((2 * P, 3), np.float64, seed=102 + r)
    want = hpccoll.all_to_all(a, comm)
    moved = host(trace(lambda v: hcj.all_to_all(v, comm))(jnp.asarray(a)))
    agree(
        comm,
        lambda: (
            assert_same(got, full),
            assert_same(moved, want),
            np.testing.assert_allclose(grad, W.sum(0)[2 * r : 2 * r + 2], rtol=1e-13),
        ),
    )


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", ["jit", "vmap", "transpose"])
@pytest.mark.parametrize("name", ["all_gather", "all_to_all:0:0", "all_to_all:1:0"])
def test_extents_that_differ_while_tracing_raise_on_every_rank(comm, mode, name):
    """sizes / recv_sizes None while tracing, extents that differ between ranks: the same MismatchError everywhere."""
    P, r = comm.size, comm.rank
    if name == "all_gather":
        x = jnp.ones((1 + r, 2))  # extents 1, 2, ... along axis 0
        f = lambda v: hcj.all_gather(v, comm)  # noqa: E731
        match = (
            r"^all_gather: expected every rank's extent along axis 0 to be the same with sizes=None while JAX "
            r"traces .*; got extents \[1, 2(, \d)*\]: pass sizes=\[1, 2"
        )
    else:  # (0, 0): every rank splits its own way; (1, 0): the extents along concat_axis differ
        sa, ca = map(int, name.split(":")[1:])
        shape, split, _ = _all_to_all_case(P, r, (sa, ca))
        x = jnp.ones(shape)
        f = lambda v: hcj.all_to_all(v, comm, split_axis=sa, concat_axis=ca, sizes=split)  # noqa: E731
        match = (
            r"^all_to_all: expected every rank to send each rank a block of the extent \(along concat_axis\) "
            r"that rank sends itself, with recv_sizes=None while JAX traces .*: pass recv_sizes"
        )
    if mode == "jit":
        call = lambda: jax.jit(f)(x)  # noqa: E731
    elif mode == "vmap":  # eagerly: the exception itself
        call = lambda: jax.vmap(f)(x[None])  # noqa: E731
    else:  # the adjoint alone (the forward never ran) checks too
        transpose = jax.linear_transpose(f, x)
        ct = jnp.ones(jax.eval_shape(f, x).shape)
        call = lambda: jax.jit(lambda c: transpose(c)[0])(ct)  # noqa: E731
    raises_everywhere(comm, hpccoll.MismatchError, match, lambda: _reraised(call))


@pytest.mark.parametrize("mode", MODES)
def test_0d_all_gather_says_what_a_gather_needs(comm, mode):
    raises_everywhere(
        comm,
        hpccoll.ArgumentError,
        r"^x: expected an array with at least 1 dimension to concatenate "
        r"along axis; got a 0-D array \(all_gather joins the shards along an existing axis",
        lambda: run(mode, lambda v: hcj.all_gather(v, comm), jnp.float64(1.0)),
    )


# --------------------------------------------------------------------------- forward mode of max, min, prod


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", ["max", "min", "prod"])
@pytest.mark.parametrize("name", ["all_reduce", "reduce_scatter"])
def test_jvp_of_max_min_prod_is_refused(comm, mode, op, name):
    """Not linear: the reduction of the tangents is not their JVP (at 2 ranks max gave [-1, 2] for [-2, 2])."""
    P, r = comm.size, comm.rank
    f = lambda v: getattr(hcj, name)(v, comm, op=op)  # noqa: E731
    base, tangents = [[1.0, 2.0], [-1.0, 1.0]], [[-2.0, 2.0], [-1.0, 1.0]]  # rank 0 holds both maxima
    X = np.stack([np.broadcast_to(base[q % 2], (P, 2)) for q in range(P)])  # every rank's x, shape (P, 2)
    x, t = jnp.asarray(X[r]), jnp.asarray(np.broadcast_to(tangents[r % 2], (P, 2)))
    match = rf"^{name}: expected op 'sum' or 'avg' \(the linear reductions\) to differentiate in forward mode .*'{op}'"
    for call in (
        lambda: run(mode, lambda v, u: jax.jvp(f, (v,), (u,)), x, t),
        lambda: run(mode, jax.jacfwd(f), x),
        lambda: run(mode, lambda v, u: jax.linearize(f, v)[1](u), x, t),
    ):
        raises_everywhere(comm, hpccoll.UnsupportedOpError, match, call)
    # a tangent that does not reach the collective needs no JVP of it: d/db (b f(x)) = f(x)
    _, dy = run(mode, lambda a: jax.jvp(lambda b: b * f(x), (a,), (jnp.ones(()),)), jnp.ones(()))
    want = reference(X, op)
    assert_close(host(dy), want[r : r + 1] if name == "reduce_scatter" else want, comm)


# --------------------------------------------------------------------------- Python and NumPy scalars


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "point", [0.0, np.float64(0.0), np.float32(0.5), np.arange(2.0)], ids=["py", "np64", "np32", "nd"]
)
def test_autodiff_at_python_and_numpy_values(comm, mode, point):
    """grad, jvp, vjp and linear_transpose at a Python or NumPy scalar (or array), tangents and cotangents too."""
    P, r = comm.size, comm.rank
    w = float(r + 1)  # a different weight on every rank: sum over ranks P (P + 1) / 2
    total = P * (P + 1) / 2
    dtype = np.result_type(point) if isinstance(point, (np.generic, np.ndarray)) else np.float64
    shape = np.shape(point)
    one = (lambda v: type(point)(v)) if np.ndim(point) == 0 else (lambda v: np.full(shape, v, dtype))  # noqa: E731
    f = lambda v: w * hcj.all_reduce(v, comm)  # noqa: E731
    grad = host(run(mode, jax.grad(lambda v: jnp.sum(f(v))), point))
    chained = host(
        run(
            mode,
            jax.grad(
                lambda v: jnp.sum(
                    hcj.all_reduce(v, comm, cotangent="replicated") + hcj.all_reduce(v, comm, cotangent="replicated")
                )
            ),
            point,
        )
    )
    y, dy = run(mode, lambda v, t: jax.jvp(lambda u: hcj.all_reduce(u, comm), (v,), (t,)), point, one(1.0))
    (vjp,) = run(mode, lambda v, ct: jax.vjp(f, v)[1](ct), point, one(1.0))
    (tr,) = run(mode, lambda ct: jax.linear_transpose(lambda u: hcj.all_reduce(u, comm), point)(ct), one(2.0))
    agree(
        comm,
        lambda: (
            np.testing.assert_allclose(grad, np.full(shape, total), rtol=1e-6),
            np.testing.assert_allclose(chained, np.full(shape, 2.0)),  # mpi4jax's chained grad
            np.testing.assert_allclose(host(y), P * np.asarray(point, dtype), rtol=1e-6),
            np.testing.assert_allclose(host(dy), np.full(shape, float(P))),
            np.testing.assert_allclose(host(vjp), np.full(shape, total), rtol=1e-6),
            np.testing.assert_allclose(host(tr), np.full(shape, 2.0 * P)),
        ),
    )
    agree(comm, grad.dtype == dtype and host(y).dtype == dtype)


def test_transposing_twice_gives_the_map_back(comm):
    """mpi4jax's transpose2: the transpose of the transpose is the all-reduce (both conventions)."""
    x = jnp.asarray(make((3, 2), np.float64, seed=103 + comm.rank))
    got = []
    for cot in ("varying", "replicated"):
        f = lambda v: hcj.all_reduce(v, comm, cotangent=cot)  # noqa: E731
        lt = lambda ct: jax.linear_transpose(f, x)(ct)[0]  # noqa: E731
        got += [host(jax.linear_transpose(lt, x)(x)[0]), host(jax.jit(lambda u: jax.linear_transpose(lt, x)(u)[0])(x))]
    want = hpccoll.all_reduce(host(x), comm)
    agree(comm, all(np.allclose(g, want, rtol=1e-13) for g in got))


# --------------------------------------------------------------------------- other transforms around a collective


@pytest.mark.parametrize("mode", MODES)
def test_custom_vjp_and_custom_jvp_around_a_collective(comm, mode):
    """mpi4jax's custom_vjp case, and a custom_jvp, against the serial gradient of the sum over ranks."""
    P, r = comm.size, comm.rank
    X, Y = make((P, 3), np.float64, seed=104), make((P, 3), np.float64, seed=105)

    @jax.custom_vjp
    def f(x, y):
        return hcj.all_reduce(jnp.sum(jnp.sin(x) * y), comm)

    def f_fwd(x, y):
        return f(x, y), (jnp.cos(x), jnp.sin(x), y)

    def f_bwd(res, g):
        g = hcj.all_reduce(g, comm)  # every rank's use of the sum: the varying adjoint
        cos_x, sin_x, y = res
        return cos_x * g * y, sin_x * g

    f.defvjp(f_fwd, f_bwd)
    value = host(run(mode, f, jnp.asarray(X[r]), jnp.asarray(Y[r])))
    gx, gy = run(mode, jax.grad(f, argnums=(0, 1)), jnp.asarray(X[r]), jnp.asarray(Y[r]))

    def serial(X, Y):  # every rank's value, summed
        return P * jnp.sum(jnp.sin(X) * Y)

    wx, wy = jax.grad(serial, argnums=(0, 1))(jnp.asarray(X), jnp.asarray(Y))

    @jax.custom_jvp
    def h(x):
        return hcj.all_reduce(jnp.sin(x), comm)

    h.defjvp(lambda p, t: (h(p[0]), hcj.all_reduce(jnp.cos(p[0]) * t[0], comm)))
    gh = run(mode, jax.grad(lambda v: jnp.sum(h(v))), jnp.asarray(X[r]))  # through the custom JVP's transpose
    agree(
        comm,
        lambda: (
            np.testing.assert_allclose(value, float(serial(X, Y)) / P, rtol=1e-13),
            np.testing.assert_allclose(host(gx), host(wx)[r], rtol=1e-13),
            np.testing.assert_allclose(host(gy), host(wy)[r], rtol=1e-13),
            np.testing.assert_allclose(host(gh), P * np.cos(X[r]), rtol=1e-13),
        ),
    )


@pytest.mark.parametrize("mode", MODES)
def test_while_loop_and_its_jvp(comm, mode):
    """A collective in a while_loop body; forward mode through it (JAX has no reverse mode for while_loop)."""
    P, r = comm.size, comm.rank
    X = make((P, 3), np.float64, seed=106)
    T = make((P, 3), np.float64, seed=107)

    def steps(v):
        return jax.lax.while_loop(
            lambda s: s[0] < 3, lambda s: (s[0] + 1, 2 * hcj.all_reduce(s[1], comm, op="avg")), (0, v)
        )[1]

    y, dy = run(mode, lambda v, t: jax.jvp(steps, (v,), (t,)), jnp.asarray(X[r]), jnp.asarray(T[r]))
    agree(
        comm,
        lambda: (
            np.testing.assert_allclose(host(y), 8 * X.mean(0), rtol=1e-13),
            np.testing.assert_allclose(host(dy), 8 * T.mean(0), rtol=1e-13),
        ),
    )


# --------------------------------------------------------------------------- transforms that cannot work


def test_shard_map_and_pmap_raise_naming_them(comm):
    mesh = jax.make_mesh((1,), ("i",))
    spec = jax.sharding.PartitionSpec
    x = jnp.ones(3)
    if hasattr(jax, "shard_map"):
        smap, exc = jax.shard_map, hpccoll.UnsupportedOpError
    else:  # JAX before 0.6 refuses first: "No replication rule for hpccoll ... shard_map"
        from jax.experimental.shard_map import shard_map as smap

        exc = NotImplementedError
    shard_map = lambda: smap(lambda v: hcj.all_reduce(v, comm), mesh=mesh, in_specs=spec(), out_specs=spec())(x)  # noqa: E731
    raises_everywhere(comm, exc, "shard_map", shard_map)
    # JAX before 0.7 refuses ordered effects in pmap itself ("Ordered effects not supported in `pmap`")
    pmap = lambda: jax.pmap(lambda v: hcj.all_gather(v, comm, sizes=[3] * comm.size))(x[None])  # noqa: E731
    raises_everywhere(comm, ValueError, "pmap", pmap)


def test_checkpoint_is_refused_by_jax_naming_it(comm):
    f = jax.checkpoint(lambda v: jnp.sum(hcj.all_reduce(v, comm) ** 2))
    with pytest.raises(NotImplementedError, match="checkpoint"):  # when tracing, before anything runs
        jax.grad(f)(jnp.ones(3))
    assert all_ranks(comm, True)


# --------------------------------------------------------------------------- errors, on every rank alike


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "call, exc, match",
    [
        (
            lambda c, v: hcj.all_gather(v, c, axis=2, sizes=[2] * c.size),
            hpccoll.ArgumentError,
            r"axis: expected an int in \[-1, 0\] for a 1-D array; got 2",
        ),
        (lambda c, v: hcj.all_gather(v, c, sizes=[2] * (c.size + 1)), hpccoll.ArgumentError, "sizes: expected"),
        (
            lambda c, v: hcj.all_to_all(v, c, concat_axis=1, recv_sizes=[1] * c.size),
            hpccoll.ArgumentError,
            r"concat_axis: expected an int in \[-1, 0\] for a 1-D array; got 1",
        ),
        (
            lambda c, v: hcj.all_to_all(v, c, sizes=[3] * c.size, recv_sizes=[1] * c.size),
            hpccoll.ArgumentError,
            r"^sizes: expected ints summing to x.shape\[0\] == 2",
        ),
        (
            lambda c, v: hcj.all_reduce(v, c, cotangent="both"),
            hpccoll.ArgumentError,
            "cotangent: expected 'varying' or 'replicated'; got 'both'",
        ),
        (lambda c, v: hcj.all_reduce(v.astype(jnp.int32), c, op="avg"), hpccoll.DTypeError, "avg"),
        (lambda c, v: hcj.all_reduce(v, c, op="xor"), hpccoll.ArgumentError, "op: expected one of"),
        (
            lambda c, v: hcj.all_gather(v.astype(jnp.int4), c, sizes=[2] * c.size),
            hpccoll.DTypeError,
            "int4",
        ),
        (lambda c, v: hcj.reduce_scatter(v.astype(jnp.complex64), c, op="max"), hpccoll.DTypeError, "complex"),
        (
            lambda c, v: jax.grad(lambda u: jnp.sum(hcj.reduce_scatter(u, c, op="max")))(v),
            hpccoll.UnsupportedOpError,
            "reduce_scatter_adjoint: expected op 'sum' or 'avg'",
        ),
        (
            lambda c, v: jax.grad(lambda u: jnp.sum(hcj.all_reduce(u, c, op="min")))(v),
            hpccoll.UnsupportedOpError,
            "all_reduce_adjoint: expected op 'sum' or 'avg'",
        ),
    ],
)
def test_errors_are_hpccolls_before_any_communication(comm, mode, call, exc, match):
    v = jnp.ones(2)
    f = (lambda: call(comm, v)) if mode == "eager" else (lambda: jax.jit(lambda u: call(comm, u))(v))
    raises_everywhere(comm, exc, match, f)


@pytest.mark.parametrize("mode", MODES)
def test_all_to_all_own_recv_size_checked_before_tracing(comm, mode):
    """recv_sizes[rank] must be the block this rank sends itself: ArgumentError (naming the rank) when traced."""
    f = lambda v: hcj.all_to_all(v, comm, recv_sizes=[3] * comm.size)  # noqa: E731
    with pytest.raises(
        hpccoll.ArgumentError,
        match=rf"^recv_sizes: expected recv_sizes\[{comm.rank}\] == "
        rf"sizes\[{comm.rank}\] == \d on rank {comm.rank} \(the block it sends itself\); got 3",
    ):
        run(mode, f, jnp.ones(2 * comm.size))
    assert all_ranks(comm, True)


def test_bad_input(comm):
    raises_everywhere(
        comm, hpccoll.ArgumentError, "x: expected a JAX array .*; got list", lambda: hcj.all_reduce([1.0, 2.0], comm)
    )


def test_callback_errors_come_back_as_hpccolls_with_reraise(comm):
    """An error only hpccoll's callback sees (sizes that do not match this rank's extent)."""
    bad = [3] * comm.size
    x = jnp.ones(2)
    with pytest.raises(hpccoll.ArgumentError) as eager:
        hcj.all_gather(x, comm, sizes=bad)
    jitted = jax.jit(lambda v: hcj.all_gather(v, comm, sizes=bad))
    with pytest.raises(jax.errors.JaxRuntimeError) as raw:
        jitted(x)
    assert str(eager.value) in str(raw.value)
    with pytest.raises(hpccoll.ArgumentError) as translated:
        with hcj.reraise():
            jitted(x)
    assert str(translated.value) == str(eager.value)
    assert isinstance(translated.value.__cause__, jax.errors.JaxRuntimeError)
    with pytest.raises(ZeroDivisionError):  # anything else passes through
        with hcj.reraise():
            _ = 1 / 0
    assert all_ranks(comm, True)


@pytest.mark.mpi(min_size=2)
def test_check_mode_mismatch_inside_jit_raises_on_every_rank():
    c = hpccoll.Communicator(check=True)
    try:
        x = jnp.ones(2 + c.rank)  # a different shape on every rank
        msg = raises_everywhere(c, hpccoll.MismatchError, "disagree|differ", lambda: hcj.all_reduce(x, c))
        with hcj.reraise():
            again = raises_everywhere(
                c,
                hpccoll.MismatchError,
                "disagree|differ",
                lambda: _reraised(lambda: jax.jit(lambda v: hcj.all_reduce(v, c))(x)),
            )
        assert again == msg
    finally:
        c.free()


def _reraised(call):
    with hcj.reraise():
        return call()


# --------------------------------------------------------------------------- GPU (DLPack to CuPy); unverified here


@pytest.mark.gpu
def test_gpu_arrays_eagerly_through_dlpack(comm):
    pytest.importorskip("cupy")
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        pytest.skip("JAX sees no GPU")
    x = jax.device_put(jnp.full(2, float(comm.rank)), gpus[comm.rank % len(gpus)])
    try:
        y = hcj.all_gather(x, comm, sizes=[2] * comm.size)
    except hpccoll.TransportUnavailable as e:
        pytest.skip(f"no GPU transport: {e}")
    assert y.devices() == x.devices()
    np.testing.assert_array_equal(host(y), np.repeat(np.arange(comm.size, dtype=np.float64), 2))
    g = jax.grad(lambda v: jnp.sum(hcj.all_gather(v, comm, sizes=[2] * comm.size)))(x)
    np.testing.assert_array_equal(host(g), np.full(2, comm.size, dtype=np.float64))
    yj = jax.jit(lambda v: hcj.all_gather(v, comm, sizes=[2] * comm.size))(x)  # host round trip inside
    np.testing.assert_array_equal(host(yj), host(y))
