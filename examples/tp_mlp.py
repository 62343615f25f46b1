"""Tensor-parallel MLP through hpccoll's autograd adapter, checked against the serial model.

Launch:  mpiexec -n 2 python -m mpi4py examples/tp_mlp.py [--batch 6 --din 5 --hidden 8 --dout 4]

The model (every size may be uneven across ranks)::

    h   = tanh(x @ W1 + b1)        column-parallel: rank r holds W1[:, cols_r], b1[cols_r]
    H   = all_gather(h, axis=1)    the full hidden layer, for the RMS norm over all features
    n   = H / rms(H)
    y   = n @ W2 + b2              row-parallel: rank r holds W2[rows_r, :], partial sums
    L   = 0.5 * ||y - t||^2

The row-parallel partial sums are combined in one of two ways (``--mode``):

``all_reduce``      y replicated, the loss computed on every rank and counted once:
                    ``all_reduce(..., cotangent="replicated")`` (identity backward, the
                    TransformerEngine / Megatron convention);
``reduce_scatter``  y split by batch rows (sequence-parallel style): every rank has its own
                    loss and the objective is their sum: plain adjoints, no convention to pick.

x and b2 are replicated; where they feed rank-local computation whose results are summed
over ranks, ``replicate`` (identity forward, all-reduce backward) adds the ranks' parts of
their gradients. The gradients of every parameter shard and of x must equal the serial
model's to ``--tol`` in float64. For contrast the example also reports what
``cotangent="varying"`` gives in the all-reduce model: every gradient upstream of the
all-reduce is P times too large (the classic factor-of-P bug).
"""

from __future__ import annotations

import argparse
import sys

import autograd
import autograd.numpy as anp
import numpy as np
from mpi4py import MPI

import hpccoll
from hpccoll.adapters import autograd as hca

NAMES = ("x", "W1", "b1", "W2", "b2")


def rms_norm(h):
    return h / anp.sqrt(anp.mean(h * h, axis=1, keepdims=True) + 1e-6)


def serial_loss(params, t):
    x, W1, b1, W2, b2 = params
    y = rms_norm(anp.tanh(x @ W1 + b1)) @ W2 + b2
    return 0.5 * anp.sum((y - t) ** 2)


def parallel_loss(params, t, comm, mode, cotangent, cols, rows):
    """This rank's part of the objective; ``params`` holds this rank's shards."""
    x, W1, b1, W2, b2 = params
    r = comm.rank
    h = anp.tanh(hca.replicate(x, comm) @ W1 + b1)  # column-parallel
    H = hca.all_gather(h, comm, axis=1, sizes=cols)  # backward: reduce-scatter
    lo = sum(rows[:r])
    z = rms_norm(H)[:, lo : lo + rows[r]] @ W2  # row-parallel partial sums
    if mode == "all_reduce":
        y = hca.all_reduce(z, comm, cotangent=cotangent) + b2  # replicated; loss counted once
        return 0.5 * anp.sum((y - t) ** 2)
    batch = hpccoll.split_sizes(t.shape[0], comm.size)
    y = hca.reduce_scatter(z, comm, axis=0, sizes=batch) + hca.replicate(b2, comm)
    start = sum(batch[:r])
    return 0.5 * anp.sum((y - t[start : start + batch[r]]) ** 2)  # this rank's rows


def shards(full, cols, rows, rank):
    """This rank's shards of the serial parameters (x and b2 are replicated)."""
    x, W1, b1, W2, b2 = full
    c0, r0 = sum(cols[:rank]), sum(rows[:rank])
    return [x, W1[:, c0 : c0 + cols[rank]], b1[c0 : c0 + cols[rank]], W2[r0 : r0 + rows[rank]], b2]


def max_relative_error(got, want):
    return max(float(np.abs(g - w).max() / max(np.abs(w).max(), 1e-300)) for g, w in zip(got, want))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=6)
    p.add_argument("--din", type=int, default=5)
    p.add_argument("--hidden", type=int, default=7, help="hidden width (uneven across ranks is fine)")
    p.add_argument("--dout", type=int, default=4)
    p.add_argument("--mode", choices=["all_reduce", "reduce_scatter", "both"], default="both")
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
    t = rng.standard_normal((args.batch, args.dout))
    cols = rows = hpccoll.split_sizes(args.hidden, P)

    serial_grads = autograd.grad(serial_loss)(full, t)
    want = shards(serial_grads, cols, rows, rank)
    want_loss = serial_loss(full, t)

    modes = ["all_reduce", "reduce_scatter"] if args.mode == "both" else [args.mode]
    runs = [(m, "replicated") for m in modes]
    if "all_reduce" in modes:
        runs.append(("all_reduce", "varying"))  # the contrast: the wrong convention here
    failed = False
    for mode, cotangent in runs:
        mine = shards(full, cols, rows, rank)
        loss, grads = autograd.value_and_grad(parallel_loss)(mine, t, comm, mode, cotangent, cols, rows)
        if mode == "reduce_scatter":
            loss = float(hpccoll.all_reduce(np.asarray(loss), comm))  # the objective is the sum
        err = comm.mpi.allreduce(max_relative_error(grads, want), op=MPI.MAX)
        loss_err = comm.mpi.allreduce(abs(loss - want_loss) / abs(want_loss), op=MPI.MAX)
        label = f"{mode}(cotangent={cotangent!r})" if mode == "all_reduce" else mode
        if cotangent == "varying":
            ratio = comm.mpi.allreduce(float(np.abs(grads[1]).max() / np.abs(want[1]).max()), op=MPI.MAX)
            if rank == 0:
                print(
                    f"tp_mlp: P={P} contrast {label}: max relative gradient error {err:.3g} "
                    f"(dW1 is {ratio:.3g} x the serial one: the factor-of-P bug)"
                )
            failed |= P > 1 and abs(ratio - P) > 1e-8 * P  # the contrast must show exactly P
            continue
        if rank == 0:
            print(
                f"tp_mlp: P={P} {label}: loss relative error {loss_err:.3g}, "
                f"max relative gradient error vs serial {err:.3g} (tol {args.tol:g})"
            )
        failed |= not (err <= args.tol and loss_err <= args.tol)
    if rank == 0:
        print("tp_mlp: FAILED" if failed else "tp_mlp: OK")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
