"""The torch and JAX adapters on CUDA arrays, forward and gradient, against NumPy (``make gpu-check``).

Skipped without CuPy and a GPU, and per framework without torch or a JAX
GPU backend (the same on every rank). Eager JAX arrays on a GPU reach
hpccoll as CuPy views (DLPack); a jitted call is an ordered host callback,
so XLA hands it host buffers. ``make gpu-check`` reports which transport
moved each.
"""

import os

import numpy as np
import pytest
from conftest import agree

try:
    import cupy

    GPUS = cupy.cuda.runtime.getDeviceCount()
except Exception:  # no CuPy, no driver, no GPU
    cupy, GPUS = None, 0

pytestmark = [pytest.mark.gpu, pytest.mark.mpi, pytest.mark.skipif(GPUS < 1, reason="needs CuPy and a CUDA GPU")]

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # several ranks (and CuPy) share one GPU


def _gathered(P, n=3):
    """Each rank's shard (``arange(n) + 10 * rank``), the all-gather of them, and a weight seen by every rank."""
    shards = [np.arange(n, dtype=np.float32) + 10 * r for r in range(P)]
    return shards, np.concatenate(shards), np.arange(n * P, dtype=np.float32) + 1


def test_torch_on_cuda_forward_and_gradient(comm):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")  # the same on every rank
    from hpccoll._local import local_rank
    from hpccoll.adapters import torch as hct

    torch.cuda.set_device(local_rank()[0] % torch.cuda.device_count())
    P, me = comm.size, comm.rank
    shards, whole, w = _gathered(P)
    x = torch.tensor(shards[me], device="cuda", requires_grad=True)
    y = hct.all_gather(x, comm)
    z = hct.all_reduce(x * 2, comm)
    (y * torch.tensor(w, device="cuda")).sum().backward()
    got = (y.device.type, y.detach().cpu().numpy(), z.detach().cpu().numpy(), x.grad.cpu().numpy())

    def check():
        assert got[0] == "cuda", got[0]
        np.testing.assert_array_equal(got[1], whole)
        np.testing.assert_array_equal(got[2], 2 * sum(shards))
        np.testing.assert_array_equal(got[3], P * w[3 * me : 3 * me + 3])  # the reduce-scatter of P cotangents

    agree(comm, check)


def test_jax_on_gpu_forward_and_gradient(comm):
    jax = pytest.importorskip("jax")
    gpus = [d for d in jax.devices() if d.platform in ("gpu", "cuda")]
    if not gpus:
        pytest.skip("JAX has no GPU backend")  # the same on every rank
    import jax.numpy as jnp

    from hpccoll._local import local_rank
    from hpccoll.adapters import jax as hcj

    P, me = comm.size, comm.rank
    shards, whole, w = _gathered(P)
    x = jax.device_put(jnp.asarray(shards[me]), gpus[local_rank()[0] % len(gpus)])
    weight = jnp.asarray(w)
    eager = hcj.all_gather(x, comm)
    jitted = jax.jit(lambda v: hcj.all_gather(v, comm))(x)
    reduced = jax.jit(lambda v: hcj.all_reduce(2 * v, comm))(x)
    grad = jax.jit(jax.grad(lambda v: (hcj.all_gather(v, comm) * weight).sum()))(x)
    got = [np.asarray(a) for a in (eager, jitted, reduced, grad)]
    platforms = {next(iter(a.devices())).platform for a in (eager, jitted, reduced, grad)}

    def check():
        assert platforms <= {"gpu", "cuda"}, platforms
        np.testing.assert_array_equal(got[0], whole)
        np.testing.assert_array_equal(got[1], whole)
        np.testing.assert_array_equal(got[2], 2 * sum(shards))
        np.testing.assert_array_equal(got[3], P * w[3 * me : 3 * me + 3])

    agree(comm, check)
