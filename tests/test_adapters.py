"""The framework adapters and adjoint_of: gradients against serial references, dot tests.

Written for any number of ranks. Every rank gets a different cotangent (the weights
``W[rank]`` of its own loss ``<W[rank], f(x)>``), and the reference gradient of the sum
of those losses over ranks is computed with NumPy from the global data.
"""

from __future__ import annotations

import functools
import subprocess
import sys

import numpy as np
import pytest
from conftest import make
from launch import child_env
from mpi4py import MPI

import hpccoll
from hpccoll.testing import dottest

pytestmark = pytest.mark.mpi


def bounds(sizes, rank):
    lo = sum(sizes[:rank])
    return lo, lo + sizes[rank]


def uneven(p):
    return [(2 * r + 1) % 4 for r in range(p)]  # 1, 3, 1, 3: different shard sizes, a zero-free pattern


# --------------------------------------------------------------------------- adjoint_of


def test_adjoint_of_functions_both_ways():
    pairs = [
        (hpccoll.all_gather, hpccoll.all_gather_adjoint),
        (hpccoll.reduce_scatter, hpccoll.reduce_scatter_adjoint),
        (hpccoll.all_reduce, hpccoll.all_reduce_adjoint),
        (hpccoll.all_to_all, hpccoll.all_to_all_adjoint),
    ]
    for f, fa in pairs:
        assert hpccoll.adjoint_of(f) is fa
        assert hpccoll.adjoint_of(fa) is f


def test_adjoint_of_operators(comm):
    for op in (
        hpccoll.AllGather(comm, axis=1),
        hpccoll.ReduceScatter(comm, op="avg"),
        hpccoll.AllReduce(comm),
        hpccoll.AllToAll(comm, split_axis=1),
    ):
        adj = hpccoll.adjoint_of(op)
        assert adj.H is op
        assert hpccoll.adjoint_of(adj) is op


def test_adjoint_of_partials_carry_arguments(comm):
    f = functools.partial(hpccoll.all_reduce_adjoint, comm=comm, op="avg", cotangent="replicated")
    g = hpccoll.adjoint_of(f)
    assert g.func is hpccoll.all_reduce and g.keywords == {"comm": comm, "op": "avg"}
    h = hpccoll.adjoint_of(functools.partial(hpccoll.all_gather, axis=1))
    assert h.func is hpccoll.all_gather_adjoint and h.keywords == {"axis": 1}
    a = hpccoll.adjoint_of(functools.partial(hpccoll.all_to_all_adjoint, comm=comm, split_axis=1, recv_sizes=[1]))
    assert a.func is hpccoll.all_to_all and a.keywords == {"comm": comm, "split_axis": 1, "recv_sizes": [1]}


@pytest.mark.parametrize(
    "bad, match",
    [
        (print, "got builtins.print"),
        ([], "got a list"),
        (functools.partial(np.add, 1), "got a partial of"),
        (functools.partial(hpccoll.all_gather, np.ones(2)), "positional"),
        (functools.partial(hpccoll.all_gather, out=np.ones(2)), "without out="),
    ],
)
def test_adjoint_of_rejects(bad, match):
    with pytest.raises(hpccoll.ArgumentError, match=f"fn_or_operator: expected .*{match}"):
        hpccoll.adjoint_of(bad)


class _Pair:
    """forward/adjoint from two callables, for hpccoll.testing.dottest."""

    def __init__(self, forward, adjoint, comm):
        self.forward, self.adjoint, self.comm = forward, adjoint, comm


def test_adjoint_of_partial_passes_dot_test(comm):
    sizes = uneven(comm.size)
    f = functools.partial(hpccoll.all_gather, comm=comm, axis=1, sizes=sizes)
    op = _Pair(lambda x: f(x), lambda y: hpccoll.adjoint_of(f)(y), comm)
    x = make((2, sizes[comm.rank]), np.float64, seed=10 + comm.rank)
    y = make((2, sum(sizes)), np.float64, seed=20 + comm.rank)
    assert dottest(op, x, y)


# --------------------------------------------------------------------------- frameworks


class Autograd:
    """Gradients and VJPs through hpccoll.adapters.autograd."""

    def __init__(self):
        self.ag = pytest.importorskip("autograd")
        from hpccoll.adapters import autograd as mod

        self.mod = mod

    def grad(self, f, x, w):
        import autograd.numpy as anp

        return self.ag.grad(lambda x: anp.sum(w * f(x)))(x)

    def vjp_pair(self, f, comm):
        """forward and its VJP (the framework's adjoint) as NumPy functions."""
        return _Pair(f, lambda y, x: self.ag.make_vjp(f)(x)[0](y), comm)


class Torch:
    """Gradients and VJPs through hpccoll.adapters.torch (CPU tensors)."""

    def __init__(self):
        self.torch = pytest.importorskip("torch")
        from hpccoll.adapters import torch as mod

        self.mod = mod

    def grad(self, f, x, w):
        t = self.torch.from_numpy(np.array(x)).requires_grad_(True)
        (f(t) * self.torch.from_numpy(np.asarray(w))).sum().backward()
        return t.grad.numpy()

    def vjp_pair(self, f, comm):
        torch = self.torch

        def adjoint(y, x):
            t = torch.from_numpy(np.array(x)).requires_grad_(True)
            return torch.autograd.grad(f(t), t, torch.from_numpy(np.asarray(y)))[0].numpy()

        return _Pair(lambda x: f(torch.from_numpy(x)).numpy(), adjoint, comm)


FRAMEWORKS = {"autograd": Autograd, "torch": Torch}


@pytest.fixture(params=sorted(FRAMEWORKS))
def fw(request):
    return FRAMEWORKS[request.param]()


def _case(comm, name):
    """(f(mod), x, w, reference gradient) for collective ``name``; W differs on every rank."""
    P, r = comm.size, comm.rank
    if name == "all_gather":
        sizes = uneven(P)
        full = make((3, sum(sizes)), np.float64, seed=1)
        lo, hi = bounds(sizes, r)
        W = make((P, 3, sum(sizes)), np.float64, seed=2)
        return (lambda m: lambda x: m.all_gather(x, comm, axis=1)), full[:, lo:hi], W[r], W.sum(0)[:, lo:hi]
    if name == "all_to_all":  # rows (uneven, not array_split's) to columns: the backward must learn the rows
        return _all_to_all_case(comm)
    op = name.split(":")[1]
    scale = 1.0 / P if op == "avg" else 1.0
    if name.startswith("reduce_scatter"):
        sizes = hpccoll.split_sizes(2 * P + 1, P)
        X = make((P, 2 * P + 1, 2), np.float64, seed=3)
        blocks = [make((sizes[s], 2), np.float64, seed=40 + s) for s in range(P)]
        return (lambda m: lambda x: m.reduce_scatter(x, comm, op=op)), X[r], blocks[r], scale * np.concatenate(blocks)
    cot = name.split(":")[2]
    X = make((P, 4), np.float64, seed=5)
    W = make((P, 4), np.float64, seed=6)
    if cot == "replicated":  # the loss (and so its cotangent) is the same on every rank
        return (lambda m: lambda x: m.all_reduce(x, comm, op=op, cotangent=cot)), X[r], W[0], scale * W[0]
    return (lambda m: lambda x: m.all_reduce(x, comm, op=op, cotangent=cot)), X[r], W[r], scale * W.sum(0)


def _all_to_all_case(comm):
    P, r = comm.size, comm.rank
    rows, cols = uneven(P), hpccoll.split_sizes(2 * P + 1, P)
    full = make((sum(rows), sum(cols)), np.float64, seed=14)
    W = [make((sum(rows), cols[j]), np.float64, seed=30 + j) for j in range(P)]  # rank j's loss weights
    lo, hi = bounds(rows, r)
    want = np.concatenate([W[j][lo:hi] for j in range(P)], axis=1)
    return (lambda m: lambda x: m.all_to_all(x, comm, split_axis=1, concat_axis=0)), full[lo:hi], W[r], want


CASES = [
    "all_to_all",
    "all_gather",
    "reduce_scatter:sum",
    "reduce_scatter:avg",
    "all_reduce:sum:varying",
    "all_reduce:avg:varying",
    "all_reduce:sum:replicated",
    "all_reduce:avg:replicated",
]


@pytest.mark.parametrize("name", CASES)
def test_gradient_matches_serial(comm, fw, name):
    make_f, x, w, want = _case(comm, name)
    got = fw.grad(make_f(fw.mod), x, w)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("name", ["all_gather", "reduce_scatter:avg", "all_reduce:sum:varying", "all_to_all"])
def test_vjp_is_adjoint_dot_test(comm, fw, name):
    make_f, x, w, _ = _case(comm, name)
    pair = fw.vjp_pair(make_f(fw.mod), comm)
    op = _Pair(pair.forward, lambda y: pair.adjoint(y, x), comm)
    assert dottest(op, x, w)


def test_replicate_sums_gradients(comm, fw):
    W = make((comm.size, 3), np.float64, seed=7)
    x = make(3, np.float64, seed=8)
    got = fw.grad(lambda t: fw.mod.replicate(t, comm), x, W[comm.rank])
    np.testing.assert_allclose(got, W.sum(0), rtol=1e-13)


def test_varying_on_replicated_loss_is_p_times_too_large(comm, fw):
    """The factor-of-P bug the 'replicated' convention exists for."""
    x = make(4, np.float64, seed=9)
    w = make(4, np.float64, seed=10)  # same on every rank: a replicated loss
    got = fw.grad(lambda t: fw.mod.all_reduce(t, comm, cotangent="varying"), x, w)
    np.testing.assert_allclose(got, comm.size * w, rtol=1e-13)


def test_nonlinear_op_has_no_gradient(comm, fw):
    x = make((comm.size, 2), np.float64, seed=11)
    with pytest.raises(hpccoll.UnsupportedOpError, match="op 'sum' or 'avg'"):
        fw.grad(lambda t: fw.mod.reduce_scatter(t, comm, op="max"), x, np.ones((1, 2)))


def test_bad_cotangent_is_named(comm, fw):
    with pytest.raises(hpccoll.ArgumentError, match="cotangent: expected 'varying' or 'replicated'; got 'both'"):
        fw.grad(lambda t: fw.mod.all_reduce(t, comm, cotangent="both"), np.ones(2), np.ones(2))


def test_autograd_second_order_and_jvp(comm):
    ag = pytest.importorskip("autograd")
    import autograd.numpy as anp

    from hpccoll.adapters import autograd as hca

    sizes = uneven(comm.size)
    full = make(sum(sizes), np.float64, seed=12)
    lo, hi = bounds(sizes, comm.rank)
    # d/dx_r of sum(all_gather(x)^3)/3 is x_r^2 * P ... per element: P * x^2; second derivative 2 P x
    first = ag.grad(lambda x: anp.sum(hca.all_gather(x, comm) ** 3) / 3)
    second = ag.grad(lambda x: anp.sum(first(x)))(full[lo:hi])
    np.testing.assert_allclose(second, 2 * comm.size * full[lo:hi], rtol=1e-13)
    v = make(hi - lo, np.float64, seed=13 + comm.rank)
    _, tangent = ag.make_jvp(lambda x: hca.all_gather(x, comm))(full[lo:hi])(v)
    np.testing.assert_array_equal(tangent, hpccoll.all_gather(v, comm))


# --------------------------------------------------------------------------- torch specifics


def test_torch_zero_copy_dtypes_and_double_backward(comm):
    torch = pytest.importorskip("torch")
    from hpccoll.adapters import torch as hct

    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    a = hct.to_array(t)
    assert isinstance(a, np.ndarray) and a.dtype == np.float32 and np.shares_memory(a, t.numpy())
    back = hct.from_array(a)
    assert back.data_ptr() == t.data_ptr()
    view = hct.replicate(t, comm)  # the identity forward returns a torch view of its input
    assert view._is_view() and view.data_ptr() == t.data_ptr()

    x = torch.full((2,), float(comm.rank + 1), dtype=torch.float32, requires_grad=True)
    y = hct.all_gather(x, comm)
    assert y.dtype == torch.float32 and y.device.type == "cpu" and y.requires_grad
    (g,) = torch.autograd.grad((y**3).sum(), x, create_graph=True)  # 3 x^2, P times (one per rank's loss)
    (h,) = torch.autograd.grad(g.sum(), x)
    torch.testing.assert_close(h, 6.0 * comm.size * x.detach())


def test_torch_bfloat16_all_reduce(comm):
    torch = pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")
    from hpccoll.adapters import torch as hct

    x = torch.full((3,), 0.5, dtype=torch.bfloat16, requires_grad=True)
    y = hct.all_reduce(x, comm)
    assert y.dtype == torch.bfloat16 and torch.all(y == 0.5 * comm.size)
    y.sum().backward()
    assert x.grad.dtype == torch.bfloat16 and torch.all(x.grad == comm.size)


def test_torch_rejects_non_tensor(comm):
    pytest.importorskip("torch")
    from hpccoll.adapters import torch as hct

    with pytest.raises(hpccoll.ArgumentError, match="x: expected a torch.Tensor; got ndarray"):
        hct.all_reduce(np.ones(2), comm)


@pytest.mark.gpu
def test_torch_cuda_via_dlpack(comm):
    torch = pytest.importorskip("torch")
    cupy = pytest.importorskip("cupy")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from hpccoll.adapters import torch as hct

    torch.cuda.set_device(comm.rank % torch.cuda.device_count())
    t = torch.arange(4.0, device="cuda")
    a = hct.to_array(t)
    assert isinstance(a, cupy.ndarray) and a.data.ptr == t.data_ptr()
    x = torch.full((2,), float(comm.rank), device="cuda", requires_grad=True)
    try:
        y = hct.all_gather(x, comm)
    except hpccoll.TransportUnavailable as e:
        pytest.skip(f"no GPU transport: {e}")
    assert y.device == x.device
    np.testing.assert_array_equal(y.detach().cpu().numpy(), np.repeat(np.arange(comm.size, dtype=np.float32), 2))
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.cpu().numpy(), np.full(2, comm.size, dtype=np.float32))


# --------------------------------------------------------------------------- scipy


def test_linear_operator_is_forward_and_adjoint(comm):
    pytest.importorskip("scipy")
    from hpccoll.adapters.scipy import CollectiveLinearOperator, aslinearoperator

    sizes = uneven(comm.size)
    op = hpccoll.AllGather(comm, axis=1, sizes=sizes)
    A = aslinearoperator(op, x_shape=(2, sizes[comm.rank]), y_shape=(2, sum(sizes)))
    assert isinstance(A, CollectiveLinearOperator)
    assert A.shape == (2 * sum(sizes), 2 * sizes[comm.rank]) and A.dtype == np.float64
    x = make((2, sizes[comm.rank]), np.float64, seed=14 + comm.rank)
    y = make((2, sum(sizes)), np.float64, seed=24 + comm.rank)
    np.testing.assert_array_equal(A.matvec(x.ravel()), op.forward(x).ravel())
    np.testing.assert_array_equal(A.rmatvec(y.ravel()), op.adjoint(y).ravel())
    np.testing.assert_array_equal(A.H.matvec(y.ravel()), op.adjoint(y).ravel())
    assert dottest(_Pair(A.matvec, A.rmatvec, comm), x.ravel(), y.ravel())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"op": object()}, "op: expected an operator with forward"),
        ({"x_shape": (2.5,)}, "x_shape: expected a sequence of non-negative ints; got"),
        ({"y_shape": (-1,)}, "y_shape: expected non-negative extents; got"),
        ({"dtype": np.int32}, "dtype: expected a floating or complex dtype"),
    ],
)
def test_linear_operator_errors(comm, kwargs, match):
    pytest.importorskip("scipy")
    from hpccoll.adapters.scipy import aslinearoperator

    args = {"op": hpccoll.AllReduce(comm), "x_shape": (2,), "y_shape": (2,), **kwargs}
    with pytest.raises(hpccoll.ArgumentError, match=match):
        aslinearoperator(**args)


# --------------------------------------------------------------------------- import hygiene


@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="starts a Python subprocess; run from the serial suite")
def test_import_hpccoll_imports_no_framework():
    code = (
        "import sys, hpccoll; bad = [m for m in ('hpccoll.adapters', 'torch', 'autograd', 'scipy', 'jax', 'cupy')"
        " if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=child_env(), timeout=60)
