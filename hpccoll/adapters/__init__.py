"""Optional adapters that plug hpccoll's collectives into other frameworks.

Each submodule imports its framework when it is imported itself, never
before: ``import hpccoll`` imports none of them.

``hpccoll.adapters.autograd``
    HIPS autograd primitives (``autograd.grad`` flows through the collectives).
``hpccoll.adapters.torch``
    ``torch.autograd.Function``\\ s for CPU tensors (zero-copy NumPy views) and
    CUDA tensors (DLPack to CuPy).
``hpccoll.adapters.jax``
    JAX primitives, eager and under ``jax.jit`` (an ordered host callback),
    differentiable with ``grad``, ``vjp``, ``jvp`` and ``linear_transpose``.
``hpccoll.adapters.scipy``
    ``scipy.sparse.linalg.LinearOperator`` views of hpccoll operators, for LSQR
    and CG.
"""

__all__: list = []
