"""A hand-written reverse pass over collectives, using hpccoll.adjoint_of on a small tape.

Launch:  mpiexec -n 2 python -m mpi4py examples/adjoint_state.py [--n 9 --m 7]

Forward model (rank r holds the shard x_r of the unknowns, the matrix K_r and its rows
d_r of the data; shard sizes uneven)::

    X   = all_gather(x_r)              every rank gets all unknowns
    Y_r = tanh(K_r @ X)                rank-local nonlinear model, full length m
    z_r = reduce_scatter(Y_r)          rank r's rows of  Z = sum_r tanh(K_r @ X)
    J   = sum_r 0.5 * ||z_r - d_r||^2  the misfit, summed over ranks

The forward pass records each step on a tape: collectives as ``functools.partial`` of
hpccoll functions, the local step as its own reverse function. The reverse pass walks the
tape backwards and takes every collective's adjoint from ``hpccoll.adjoint_of`` (so it
keeps no table of adjoints), passing the forward's ``sizes`` along in the partial.

The gradient dJ/dx_r is checked against the serial gradient of the same misfit and
against a central finite difference of J along a random direction.
"""

from __future__ import annotations

import argparse
import functools
import sys

import numpy as np
from mpi4py import MPI

import hpccoll


def forward(x_r, k_r, d_r, comm, sizes, rows, tape=None):
    """The misfit J (the same on every rank); records the steps on ``tape`` when given."""
    ops = [
        functools.partial(hpccoll.all_gather, comm=comm, sizes=sizes),
        None,  # the local step
        functools.partial(hpccoll.reduce_scatter, comm=comm, sizes=rows),
    ]
    X = ops[0](x_r)
    Y = np.tanh(k_r @ X)
    z = ops[2](Y)
    r = z - d_r
    # J is reported on every rank; the reverse pass starts from this rank's own term
    # 0.5 * ||r||^2, as the objective is their sum over ranks.
    J = float(hpccoll.all_reduce(np.float64(0.5 * r @ r), comm))
    if tape is not None:
        tape.append(("collective", ops[0]))
        tape.append(("local", lambda g: k_r.T @ ((1.0 - Y * Y) * g)))  # reverse of tanh(K_r @ X)
        tape.append(("collective", ops[2]))
        tape.append(("local", lambda g: g * r))  # reverse of 0.5*||z - d||^2
    return J


def reverse(tape):
    """Walk the tape backwards from dJ/dJ = 1."""
    g = 1.0
    for kind, step in reversed(tape):
        g = hpccoll.adjoint_of(step)(g) if kind == "collective" else step(g)
    return g


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=9, help="number of unknowns (all ranks together)")
    ap.add_argument("--m", type=int, default=7, help="number of data")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eps", type=float, default=1e-6, help="finite-difference step")
    ap.add_argument("--tol", type=float, default=1e-10, help="relative error vs the serial gradient")
    args = ap.parse_args(argv)

    comm = hpccoll.Communicator()
    P, rank = comm.size, comm.rank
    rng = np.random.default_rng(args.seed)  # the global problem, the same on every rank
    x = rng.standard_normal(args.n)
    K = rng.standard_normal((P, args.m, args.n)) / np.sqrt(args.n)
    D = rng.standard_normal(args.m)
    v = rng.standard_normal(args.n)  # finite-difference direction
    # Deliberately not numpy.array_split's split: the adjoint needs the forward's sizes.
    sizes = [args.n // P] * P
    sizes[0] += args.n % P
    sizes[0], sizes[-1] = sizes[-1], sizes[0]
    lo, hi = sum(sizes[:rank]), sum(sizes[: rank + 1])
    rows = hpccoll.split_sizes(args.m, P)
    d_r = D[sum(rows[:rank]) : sum(rows[: rank + 1])]

    tape: list = []
    J = forward(x[lo:hi], K[rank], d_r, comm, sizes, rows, tape)
    grad = reverse(tape)  # dJ/dx_r, this rank's shard

    # Serial reference: the whole model on one process.
    Ys = np.tanh(np.einsum("pmn,n->pm", K, x))
    res = Ys.sum(axis=0) - D
    serial = np.einsum("pmn,pm->n", K, (1.0 - Ys * Ys) * res)
    err = comm.mpi.allreduce(float(np.abs(grad - serial[lo:hi]).max() / np.abs(serial).max()), op=MPI.MAX)

    # Central finite difference of J along v, against <grad, v> summed over ranks.
    Jp = forward(x[lo:hi] + args.eps * v[lo:hi], K[rank], d_r, comm, sizes, rows)
    Jm = forward(x[lo:hi] - args.eps * v[lo:hi], K[rank], d_r, comm, sizes, rows)
    fd = (Jp - Jm) / (2 * args.eps)
    ad = float(hpccoll.all_reduce(np.float64(grad @ v[lo:hi]), comm))
    fd_err = abs(fd - ad) / abs(ad)

    ok = err <= args.tol and fd_err <= 1e-6
    if rank == 0:
        print(
            f"adjoint_state: P={P} shard sizes {sizes}: J={J:.6f}; max relative error vs serial gradient "
            f"{err:.3g} (tol {args.tol:g}); finite difference {fd:.10f} vs adjoint {ad:.10f} "
            f"(relative {fd_err:.2g})"
        )
        print("adjoint_state: OK" if ok else "adjoint_state: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
