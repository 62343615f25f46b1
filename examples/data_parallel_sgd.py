"""Data-parallel SGD with a gradient all-reduce, matching serial SGD step for step.

Launch:  mpiexec -n 2 python -m mpi4py examples/data_parallel_sgd.py [--steps 20 --batch 30 --lr 0.1]

Every rank holds the same parameters of a small MLP regression model
(``y = tanh(x @ W1 + b1) @ W2 + b2``) and its own rows of each global batch (uneven
across ranks when ``--batch`` is not a multiple of P). Each step:

1. every rank computes the gradient of the *sum* of its rows' losses (NumPy, by hand);
2. one in-place ``hpccoll.all_reduce`` per gradient array adds them over ranks
   (a coalesced, list-taking form would do it in one call);
3. every rank divides by the global batch size and takes the same SGD step.

The serial run takes the whole batch on one process. The parameters of both runs are
compared after every step; the example fails when they differ by more than ``--tol``.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from mpi4py import MPI

import hpccoll


def init(rng, din, hidden, dout):
    return [
        rng.standard_normal((din, hidden)) / np.sqrt(din),
        np.zeros(hidden),
        rng.standard_normal((hidden, dout)) / np.sqrt(hidden),
        np.zeros(dout),
    ]


def loss_and_grads(params, x, t):
    """Sum over rows of 0.5 * ||y - t||^2, and its gradient (reverse pass by hand)."""
    W1, b1, W2, b2 = params
    h = np.tanh(x @ W1 + b1)
    r = h @ W2 + b2 - t
    dh = (r @ W2.T) * (1.0 - h * h)
    return 0.5 * float(np.sum(r * r)), [x.T @ dh, dh.sum(axis=0), h.T @ r, r.sum(axis=0)]


def sgd_step(params, grads, lr, n):
    for p, g in zip(params, grads):
        p -= (lr / n) * g


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=29, help="global batch size")
    ap.add_argument("--din", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--dout", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol", type=float, default=1e-12, help="max parameter difference vs serial")
    args = ap.parse_args(argv)

    comm = hpccoll.Communicator()
    P, rank = comm.size, comm.rank
    rng = np.random.default_rng(args.seed)
    params = init(rng, args.din, args.hidden, args.dout)
    serial = [p.copy() for p in params]
    teacher = rng.standard_normal((args.din, args.dout))
    rows = hpccoll.split_sizes(args.batch, P)
    lo, hi = sum(rows[:rank]), sum(rows[: rank + 1])

    worst = 0.0
    for step in range(args.steps):
        x = rng.standard_normal((args.batch, args.din))  # the same global batch on every rank
        t = np.sin(x @ teacher)

        local_loss, grads = loss_and_grads(params, x[lo:hi], t[lo:hi])
        for g in grads:
            hpccoll.all_reduce(g, comm, out=g)  # one all-reduce per array, in place
        loss = float(hpccoll.all_reduce(np.float64(local_loss), comm))
        sgd_step(params, grads, args.lr, args.batch)

        serial_loss, serial_grads = loss_and_grads(serial, x, t)
        sgd_step(serial, serial_grads, args.lr, args.batch)

        diff = max(float(np.abs(p - s).max()) for p, s in zip(params, serial))
        worst = max(worst, comm.mpi.allreduce(diff, op=MPI.MAX))
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(
                f"step {step:3d}  loss {loss / args.batch:.6f}  serial {serial_loss / args.batch:.6f}  "
                f"max |param - serial| {diff:.3g}"
            )

    ok = worst <= args.tol
    if rank == 0:
        print(
            f"data_parallel_sgd: P={P} batch rows per rank {list(rows)}: max parameter difference vs "
            f"serial over {args.steps} steps {worst:.3g} (tol {args.tol:g})"
        )
        print("data_parallel_sgd: OK" if ok else "data_parallel_sgd: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
