"""Tensor-parallel MLP in JAX through hpccoll's JAX adapter, jitted, checked against the serial model.

Launch:  mpiexec -n 2 python -m mpi4py examples/jax_tp_mlp.py [--batch 6 --din 5 --hidden 7 --dout 4 --steps 3]

The model (the hidden width and the batch may split unevenly across ranks)::

    h   = tanh(x @ W1 + b1)        column-parallel: rank r holds W1[:, cols_r], b1[cols_r]
    H   = all_gather(h, axis=1)    the full hidden layer, for the RMS norm over all features
    n   = H / rms(H)
    y   = n @ W2 + b2              row-parallel: rank r holds W2[rows_r, :], partial sums
    L   = 0.5 * ||y - t||^2

The row-parallel partial sums are combined in one of two ways (``--mode``):

``all_reduce``      y replicated, the loss computed on every rank and counted once:
                    ``all_reduce(..., cotangent="replicated")`` (identity transpose);
``reduce_scatter``  y split by batch rows: every rank has its own loss and the objective is
                    their sum.

x and b2 are replicated; where they feed rank-local computation whose results are summed over
ranks, ``replicate`` (identity forward, all-reduce transpose) adds the ranks' parts of their
gradients. Each training step is one ``jax.jit`` of ``jax.value_and_grad``: the forward
collectives and their adjoints run inside it as ordered callbacks. After ``--steps`` steps of
SGD on the shards, every rank's shards must equal the serial model's (trained with plain JAX on
one process) to ``--tol`` in float64, and so must the first step's gradients. For contrast the
example also reports what ``cotangent="varying"`` gives: gradients upstream of the all-reduce P
times too large.
"""

from __future__ import annotations

import argparse
import sys

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import hpccoll  # noqa: E402
from hpccoll.adapters import jax as hcj  # noqa: E402


def rms_norm(h):
    return h / jnp.sqrt(jnp.mean(h * h, axis=1, keepdims=True) + 1e-6)


def serial_loss(params, t):
    x, W1, b1, W2, b2 = params
    y = rms_norm(jnp.tanh(x @ W1 + b1)) @ W2 + b2
    return 0.5 * jnp.sum((y - t) ** 2)


def parallel_loss(params, t, comm, mode, cotangent, cols, rows):
    """This rank's part of the objective; ``params`` holds this rank's shards."""
    x, W1, b1, W2, b2 = params
    r = comm.rank
    h = jnp.tanh(hcj.replicate(x, comm) @ W1 + b1)  # column-parallel
    H = hcj.all_gather(h, comm, axis=1, sizes=cols)  # transpose: reduce-scatter
    lo = sum(rows[:r])
    z = rms_norm(H)[:, lo : lo + rows[r]] @ W2  # row-parallel partial sums
    if mode == "all_reduce":
        y = hcj.all_reduce(z, comm, cotangent=cotangent) + b2  # replicated; loss counted once
        return 0.5 * jnp.sum((y - t) ** 2)
    batch = hpccoll.split_sizes(t.shape[0], comm.size)
    y = hcj.reduce_scatter(z, comm, axis=0, sizes=batch) + hcj.replicate(b2, comm)
    start = sum(batch[:r])
    return 0.5 * jnp.sum((y - t[start : start + batch[r]]) ** 2)  # this rank's rows


def shards(full, cols, rows, rank):
    """This rank's shards of the serial parameters (x and b2 are replicated)."""
    x, W1, b1, W2, b2 = full
    c0, r0 = sum(cols[:rank]), sum(rows[:rank])
    return [x, W1[:, c0 : c0 + cols[rank]], b1[c0 : c0 + cols[rank]], W2[r0 : r0 + rows[rank]], b2]


def max_relative_error(got, want):
    return max(
        float(np.abs(np.asarray(g) - np.asarray(w)).max() / max(np.abs(np.asarray(w)).max(), 1e-300))
        for g, w in zip(got, want)
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=6)
    p.add_argument("--din", type=int, default=5)
    p.add_argument("--hidden", type=int, default=7, help="hidden width (uneven across ranks is fine)")
    p.add_argument("--dout", type=int, default=4)
    p.add_argument("--steps", type=int, default=3, help="SGD steps compared with the serial run")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tol", type=float, default=1e-10)
    args = p.parse_args(argv)

    comm = hpccoll.Communicator()
    P, rank = comm.size, comm.rank
    rng = np.random.default_rng(args.seed)  # the same global model on every rank
    full = [
        rng.standard_normal((args.batch, args.din)),
        rng.standard_normal((args.din, args.hidden)) / np.sqrt(args.din),
        rng.standard_normal(args.hidden) * 0.1,
        rng.standard_normal((args.hidden, args.dout)) / np.sqrt(args.hidden),
        rng.standard_normal(args.dout) * 0.1,
    ]
    full = [jnp.asarray(a) for a in full]
    t = jnp.asarray(rng.standard_normal((args.batch, args.dout)))
    cols = rows = hpccoll.split_sizes(args.hidden, P)

    serial_step = jax.jit(jax.value_and_grad(serial_loss))
    want_loss, serial_grads = serial_step(full, t)
    want = shards(serial_grads, cols, rows, rank)
    trained = full
    for _ in range(args.steps):  # plain SGD on the serial model; x is trained too
        _, g = serial_step(trained, t)
        trained = [a - args.lr * b for a, b in zip(trained, g)]
    want_trained = shards(trained, cols, rows, rank)

    failed = False
    for mode, cotangent in (("all_reduce", "replicated"), ("reduce_scatter", "replicated"), ("all_reduce", "varying")):
        step = jax.jit(
            jax.value_and_grad(
                lambda ps, mode=mode, cotangent=cotangent: parallel_loss(ps, t, comm, mode, cotangent, cols, rows)
            )
        )
        mine = shards(full, cols, rows, rank)
        loss, grads = step(mine)
        if mode == "reduce_scatter":
            loss = hpccoll.all_reduce(np.asarray(loss), comm)  # the objective is the sum over ranks
        err = comm.mpi.allreduce(max_relative_error(grads, want), op=MPI.MAX)
        loss_err = comm.mpi.allreduce(abs(float(loss) - float(want_loss)) / abs(float(want_loss)), op=MPI.MAX)
        label = f"{mode}(cotangent={cotangent!r})" if mode == "all_reduce" else mode
        if cotangent == "varying":
            ratio = comm.mpi.allreduce(float(np.abs(grads[1]).max() / np.abs(want[1]).max()), op=MPI.MAX)
            if rank == 0:
                print(
                    f"jax_tp_mlp: P={P} contrast {label}: max relative gradient error {err:.3g} "
                    f"(dW1 is {ratio:.3g} x the serial one: the factor-of-P bug)"
                )
            failed |= P > 1 and abs(ratio - P) > 1e-8 * P  # the contrast must show exactly P
            continue
        for _ in range(args.steps):
            _, g = step(mine)
            mine = [a - args.lr * b for a, b in zip(mine, g)]
        train_err = comm.mpi.allreduce(max_relative_error(mine, want_trained), op=MPI.MAX)
        if rank == 0:
            print(
                f"jax_tp_mlp: P={P} {label}: loss relative error {loss_err:.3g}, max relative gradient error "
                f"vs serial {err:.3g}, after {args.steps} jitted SGD steps {train_err:.3g} (tol {args.tol:g})"
            )
        failed |= not (err <= args.tol and loss_err <= args.tol and train_err <= args.tol)
    if rank == 0:
        print("jax_tp_mlp: FAILED" if failed else "jax_tp_mlp: OK")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
