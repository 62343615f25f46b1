"""The adapters' functions derived from a pair (adapters/_common.derive): a pair that no adapter writes out.

A throwaway pair, ``twin_shift`` (the shift under another name, its hooks the
shift's), is registered for one test and removed after it. Its torch,
autograd and JAX functions, made by the same ``derive`` each adapter runs at
import for the pairs it does not write out, have the core forward's
signature (minus ``out`` and ``async_op``) and give NumPy's values and
gradients: the gradient of sum(w * twin_shift(x)) is shift_adjoint(w).
"""

import functools
import inspect

import numpy as np
import pytest
from conftest import agree, assert_same
from test_shift import stack

import hpccoll
from hpccoll import _api
from hpccoll._spec import HOOKS
from hpccoll.adapters import _common
from hpccoll.collectives.shift import SHIFT

pytestmark = pytest.mark.mpi


@functools.wraps(hpccoll.shift)
def twin_shift(x, comm=None, *, offset: int = 1, out=None, async_op: bool = False):
    return hpccoll.shift(x, comm, offset=offset, out=out, async_op=async_op)


@functools.wraps(hpccoll.shift_adjoint)
def twin_shift_adjoint(y, comm=None, *, offset: int = 1, out=None, async_op: bool = False):
    return hpccoll.shift_adjoint(y, comm, offset=offset, out=out, async_op=async_op)


twin_shift.__name__ = twin_shift.__qualname__ = "twin_shift"
twin_shift_adjoint.__name__ = twin_shift_adjoint.__qualname__ = "twin_shift_adjoint"


@pytest.fixture
def twin(monkeypatch):
    """The pair ``twin_shift``, registered (its hooks, ``PAIRS``, ``PAIR``) for one test; all restored after."""
    pair = _api.Pair(twin_shift, twin_shift_adjoint, "Shift")
    monkeypatch.setitem(HOOKS, "twin_shift", SHIFT._replace(name="twin_shift"))
    monkeypatch.setattr(_api, "PAIRS", _api.PAIRS + (pair,))
    monkeypatch.setattr(_common, "PAIRS", _api.PAIRS)
    monkeypatch.setitem(_api.PAIR, "twin_shift", pair)
    return pair


def test_derived_signature_and_docstring(comm, twin):
    """The core forward's keyword-only parameters minus out and async_op, plus the adjoint's own (all_reduce's
    cotangent); x and the result typed as the framework's array; a numpydoc docstring naming both sides."""
    torch = pytest.importorskip("torch")
    from hpccoll.adapters import torch as hct

    fn = _common.derive(twin, hct._apply, torch.Tensor, "a tensor")
    sig = inspect.signature(fn)

    def check():
        assert fn.__name__ == "twin_shift"
        assert list(sig.parameters) == ["x", "comm", "offset"], sig
        assert sig.parameters["x"].annotation is torch.Tensor and sig.return_annotation is torch.Tensor
        assert sig.parameters["offset"].kind is inspect.Parameter.KEYWORD_ONLY
        assert sig.parameters["offset"].default == 1
        assert fn.__doc__.startswith(
            "Differentiable :func:`hpccoll.twin_shift` of a tensor; backward: :func:`hpccoll.twin_shift_adjoint`."
        )
        assert "\noffset : int\n" in fn.__doc__ and "\ncomm : " in fn.__doc__, fn.__doc__
        reduced = inspect.signature(_common.derive(_api.PAIR["all_reduce"], hct._apply, torch.Tensor, "a tensor"))
        assert list(reduced.parameters) == ["x", "comm", "op", "cotangent"], reduced
        with pytest.raises(TypeError):
            fn(torch.zeros(2), comm, out=None)  # not a keyword of the derived function

    agree(comm, check)


def test_derive_missing_adds_the_pair(comm, twin):
    """What each adapter runs at import: a function for every pair its ``__all__`` lacks, listed there."""
    namespace = {"__name__": "adapter", "__all__": [p.name for p in _api.PAIRS if p.name != "twin_shift"]}
    added = _common.derive_missing(namespace, lambda pair, x, comm, **kw: (pair.name, kw), object, "an array")

    def check():
        assert added == ["twin_shift"] and namespace["__all__"][-1] == "twin_shift"
        assert namespace["twin_shift"].__module__ == "adapter"
        assert namespace["twin_shift"](0, comm) == ("twin_shift", {"offset": 1})
        assert namespace["twin_shift"](0, comm, offset=3) == ("twin_shift", {"offset": 3})

    agree(comm, check)


def test_derived_torch_and_autograd(comm, twin):
    """torch and autograd: twin_shift is the shift, and the gradient of sum(w * twin_shift(x)) is shift_adjoint(w)."""
    P, r = comm.size, comm.rank
    G, W = stack(comm), stack(comm, seed=11)
    torch = pytest.importorskip("torch")
    from hpccoll.adapters import torch as hct

    fn = _common.derive(twin, hct._apply, torch.Tensor, "a tensor")
    t = torch.tensor(G[r], requires_grad=True)
    y = fn(t, comm, offset=2)
    (y * torch.tensor(W[r])).sum().backward()
    assert_same(y.detach().numpy(), G[(r - 2) % P], comm)
    assert_same(t.grad.numpy(), W[(r + 2) % P], comm)
    autograd = pytest.importorskip("autograd")
    from hpccoll.adapters import autograd as hca

    fa = _common.derive(twin, hca._apply, np.ndarray, "an array")
    assert_same(fa(G[r], comm), G[(r - 1) % P], comm)
    g = autograd.grad(lambda v: (fa(v, comm, offset=2) * W[r]).sum())(G[r])
    assert_same(g, W[(r + 2) % P], comm)


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_derived_jax(comm, twin, mode):
    """JAX, eagerly and jitted: values, grad and vmap of the derived twin_shift against NumPy."""
    jax = pytest.importorskip("jax")
    from hpccoll.adapters import jax as hcj

    jax.config.update("jax_enable_x64", True)
    P, r = comm.size, comm.rank
    G, W = stack(comm), stack(comm, seed=11)
    fn = _common.derive(twin, hcj._apply, jax.Array, "a JAX array")
    wrap = (lambda f: f) if mode == "eager" else jax.jit
    loss = lambda v: (fn(v, comm, offset=2) * W[r]).sum()  # noqa: E731
    assert_same(np.asarray(wrap(lambda v: fn(v, comm, offset=-1))(G[r])), G[(r + 1) % P], comm)
    assert_same(np.asarray(wrap(jax.grad(loss))(G[r])), W[(r + 2) % P], comm)
    batch = np.stack([G[r], W[r]], axis=1)  # a batch axis at 1: each column shifted alike
    got = np.asarray(wrap(jax.vmap(lambda v: fn(v, comm), in_axes=1, out_axes=1))(batch))
    assert_same(got, np.stack([G[(r - 1) % P], W[(r - 1) % P]], axis=1), comm)


def test_twin_is_gone_after_the_test(comm):
    """The fixture leaves nothing behind (pytest runs this file's tests in order: this one last)."""
    agree(
        comm, lambda: "twin_shift" not in HOOKS and "twin_shift" not in _api.PAIR and "twin_shift" not in _common.PAIRS
    )


@pytest.mark.parametrize("name", ["all_gather", "shift", "scatter"])
def test_scipy_pair_operator(comm, name):
    """SciPy: a LinearOperator of a pair, bound like the adapters: matvec is the forward, rmatvec its adjoint
    (the core functions, themselves checked against NumPy in their own files)."""
    pytest.importorskip("scipy")
    from hpccoll.adapters.scipy import pair_operator

    r = comm.rank
    G = stack(comm)
    shape = G.shape[1:]
    A = pair_operator(name, shape, comm)
    forward, adjoint = getattr(hpccoll, name), getattr(hpccoll, name + "_adjoint")
    want = forward(G[r], comm)
    assert_same(A.matvec(G[r].ravel()).reshape(want.shape), want, comm)
    w = np.random.default_rng(11 + r).standard_normal(want.shape)  # a different cotangent on every rank
    assert_same(A.rmatvec(w.ravel()).reshape(shape), _as(adjoint(w, comm), shape), comm)


def _as(a, shape):
    """The scatter's adjoint off root is empty where the operator gives zeros of the domain's shape."""
    return a if a.shape == shape else np.zeros(shape, a.dtype)
