"""The framework adapters' permute (derived from its spec, not written out): values and gradients against NumPy.

The gradient of sum(w * permute(x)) is permute_adjoint(w): the pairs reversed, zeros on a rank that sent
nothing. torch and autograd; JAX eagerly, jitted (every lowering), grad and vmap; SciPy's LinearOperator.
"""

import numpy as np
import pytest
from conftest import assert_same
from test_permute import perms, reference, reversed_, stack

pytestmark = pytest.mark.mpi


def test_permute_torch_and_autograd(comm):
    r = comm.rank
    G, W = stack(comm), stack(comm, seed=11)
    torch = pytest.importorskip("torch")
    from hpccoll.adapters import torch as hct

    for perm in perms(comm.size):
        t = torch.tensor(G[r], requires_grad=True)
        y = hct.permute(t, comm, perm=perm)
        (y * torch.tensor(W[r])).sum().backward()
        assert_same(y.detach().numpy(), reference(G, perm, r), comm)
        assert_same(t.grad.numpy(), reference(W, reversed_(perm), r), comm)
    autograd = pytest.importorskip("autograd")
    from hpccoll.adapters import autograd as hca

    for perm in perms(comm.size):
        g = autograd.grad(lambda v: (hca.permute(v, comm, perm=perm) * W[r]).sum())(G[r])
        assert_same(g, reference(W, reversed_(perm), r), comm)


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_permute_jax(comm, mode):
    jax = pytest.importorskip("jax")
    from hpccoll.adapters import jax as hcj

    jax.config.update("jax_enable_x64", True)
    r = comm.rank
    G, W = stack(comm), stack(comm, seed=11)
    for lowering in hcj.LOWERINGS:
        before, hcj.LOWERING = hcj.LOWERING, lowering
        try:
            for perm in perms(comm.size):
                f = lambda v: hcj.permute(v, comm, perm=perm)  # noqa: E731
                loss = lambda v: (hcj.permute(v, comm, perm=perm) * W[r]).sum()  # noqa: E731
                grad = jax.grad(loss)
                if mode == "jit":
                    f, grad = jax.jit(f), jax.jit(grad)
                assert_same(np.asarray(f(G[r])), reference(G, perm, r), comm)
                assert_same(np.asarray(grad(G[r])), reference(W, reversed_(perm), r), comm)
        finally:
            hcj.LOWERING = before


def test_permute_jax_vmap(comm):
    """vmap over a leading batch axis: every batch row is permuted as a block of its own."""
    jax = pytest.importorskip("jax")
    from hpccoll.adapters import jax as hcj

    jax.config.update("jax_enable_x64", True)
    r = comm.rank
    B = stack(comm, shape=(4, 3, 5))  # B[q] is rank q's batch of 4 blocks
    for perm in perms(comm.size):
        got = jax.vmap(lambda v: hcj.permute(v, comm, perm=perm))(B[r])
        assert_same(np.asarray(got), reference(B, perm, r), comm)


def test_permute_scipy(comm):
    """SciPy: the Permute operator as a LinearOperator; rmatvec is the permutation back."""
    pytest.importorskip("scipy")
    import hpccoll
    from hpccoll.adapters.scipy import aslinearoperator

    r = comm.rank
    G, W = stack(comm), stack(comm, seed=11)
    shape = G.shape[1:]
    for perm in perms(comm.size):
        A = aslinearoperator(hpccoll.Permute(comm, perm=perm), shape, shape)
        assert_same(A.matvec(G[r].ravel()).reshape(shape), reference(G, perm, r), comm)
        assert_same(A.rmatvec(W[r].ravel()).reshape(shape), reference(W, reversed_(perm), r), comm)
