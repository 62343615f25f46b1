"""The framework adapters' shift: the gradient of sum(w * shift(x)) is shift_adjoint(w), at any rank count."""

import numpy as np
import pytest
from conftest import assert_same
from test_shift import stack

pytestmark = pytest.mark.mpi


def test_shift_adapters(comm):
    """torch and autograd: the gradient of sum(w * shift(x)) is shift_adjoint(w)."""
    P, r = comm.size, comm.rank
    G, W = stack(comm), stack(comm, seed=11)
    torch = pytest.importorskip("torch")
    from hpccoll.adapters import torch as hct

    t = torch.tensor(G[r], requires_grad=True)
    y = hct.shift(t, comm, offset=2)
    (y * torch.tensor(W[r])).sum().backward()
    assert_same(y.detach().numpy(), G[(r - 2) % P], comm)
    assert_same(t.grad.numpy(), W[(r + 2) % P], comm)
    autograd = pytest.importorskip("autograd")
    from hpccoll.adapters import autograd as hca

    g = autograd.grad(lambda v: (hca.shift(v, comm, offset=2) * W[r]).sum())(G[r])
    assert_same(g, W[(r + 2) % P], comm)


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_shift_jax(comm, mode):
    """JAX, eagerly and jitted (every lowering): the shift, and grad of sum(w * shift(x)) = shift_adjoint(w)."""
    jax = pytest.importorskip("jax")
    from hpccoll.adapters import jax as hcj

    jax.config.update("jax_enable_x64", True)
    P, r = comm.size, comm.rank
    G, W = stack(comm), stack(comm, seed=11)
    for lowering in hcj.LOWERINGS:
        before, hcj.LOWERING = hcj.LOWERING, lowering
        try:
            f = (
                (lambda v: hcj.shift(v, comm, offset=-1))
                if mode == "eager"
                else jax.jit(lambda v: hcj.shift(v, comm, offset=-1))
            )
            loss = lambda v: (hcj.shift(v, comm, offset=2) * W[r]).sum()  # noqa: E731
            grad = jax.grad(loss) if mode == "eager" else jax.jit(jax.grad(loss))
            assert_same(np.asarray(f(G[r])), G[(r + 1) % P], comm)
            assert_same(np.asarray(grad(G[r])), W[(r + 2) % P], comm)
        finally:
            hcj.LOWERING = before


def test_shift_scipy(comm):
    """SciPy: the Shift operator as a LinearOperator; rmatvec is the shift back (matvec's adjoint)."""
    pytest.importorskip("scipy")
    import hpccoll
    from hpccoll.adapters.scipy import aslinearoperator

    P, r = comm.size, comm.rank
    G, W = stack(comm), stack(comm, seed=11)
    shape = G.shape[1:]
    A = aslinearoperator(hpccoll.Shift(comm, offset=2), shape, shape)
    assert_same(A.matvec(G[r].ravel()).reshape(shape), G[(r - 2) % P], comm)
    assert_same(A.rmatvec(W[r].ravel()).reshape(shape), W[(r + 2) % P], comm)
