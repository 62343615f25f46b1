"""Distributed least squares with SciPy's LSQR on an operator built from AllGather and its adjoint.

Launch:  mpiexec -n 2 python -m mpi4py examples/distributed_lstsq.py [--rows 40 --cols 6]

Problem: minimise ||A x - b|| where rank r holds only the rows A_r, b_r (uneven across
ranks) and the solution x is wanted on every rank.

Why the operator looks the way it does: LSQR runs independently on every rank and its
norms and dot products are *local*. It is a distributed solver only if every vector it
sees is the same on every rank (replicated), so that local norms are global norms, every
rank takes the same steps and all stop at the same iteration (a rank that stopped early
would leave the others waiting in a collective). So the operator maps replicated x to
replicated A x:

    M   = AllGather  o  Local(A_r)  o  AllReduce(avg)
    M^H = AllReduce(avg)^H  o  Local(A_r)^H  o  AllGather^H      (the adjoints, reversed)

``AllReduce(avg)`` is the identity on replicated x (one small all-reduce per product,
kept so that M is a linear map on all of the ranks' vectors and M^H is its exact adjoint
under the inner product summed over ranks; ``hpccoll.testing.dottest`` checks it).
``AllGather^H`` is a reduce-scatter: applied to a replicated u it gives P * u_r, and the
``avg`` all-reduce divides the P back out: M^H u = sum_r A_r^T u_r = A^T u on every rank.
The right-hand side is made replicated with one all_gather of the b_r.

The result is compared with ``numpy.linalg.lstsq`` on the whole A, b (serial).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from mpi4py import MPI
from scipy.sparse.linalg import lsqr

import hpccoll
from hpccoll.adapters.scipy import aslinearoperator
from hpccoll.testing import dottest


class Local(hpccoll.Operator):
    """Rank-local matrix: forward ``A_r @ x``, adjoint ``A_r^T @ y``; no communication."""

    def __init__(self, a: np.ndarray, comm: hpccoll.Communicator) -> None:
        self.a, self.comm = a, comm

    def forward(self, x, out=None):
        return self.a @ x

    def adjoint(self, y, out=None):
        return self.a.conj().T @ y


class Chain(hpccoll.Operator):
    """``ops[0] o ops[1] o ...``: forward applies the last first; adjoint reverses the adjoints."""

    def __init__(self, *ops: hpccoll.Operator) -> None:
        self.ops, self.comm = ops, ops[0].comm

    def forward(self, x, out=None):
        for op in reversed(self.ops):
            x = op.forward(x)
        return x

    def adjoint(self, y, out=None):
        for op in self.ops:
            y = op.adjoint(y)
        return y


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=41, help="rows of A (split unevenly over ranks)")
    ap.add_argument("--cols", type=int, default=6, help="columns of A (the unknowns)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol", type=float, default=1e-8, help="relative error vs numpy.linalg.lstsq")
    args = ap.parse_args(argv)

    comm = hpccoll.Communicator()
    P, rank = comm.size, comm.rank
    rng = np.random.default_rng(args.seed)  # the global problem, made identically on every rank
    A = rng.standard_normal((args.rows, args.cols))
    b = rng.standard_normal(args.rows)
    rows = hpccoll.split_sizes(args.rows, P)
    lo, hi = sum(rows[:rank]), sum(rows[: rank + 1])
    a_r, b_r = A[lo:hi], b[lo:hi]  # all this rank keeps of the problem

    M = Chain(hpccoll.AllGather(comm, sizes=rows), Local(a_r, comm), hpccoll.AllReduce(comm, op="avg"))
    # M^H is M's adjoint on any (even rank-varying) vectors: different x and y on every rank.
    vary = np.random.default_rng([args.seed, rank])
    dottest(M, vary.standard_normal(args.cols), vary.standard_normal(args.rows), rtol=1e-12)

    op = aslinearoperator(M, x_shape=(args.cols,), y_shape=(args.rows,))
    rhs = hpccoll.all_gather(b_r, comm, sizes=rows)  # replicated right-hand side
    x, istop, itn = lsqr(op, rhs, atol=1e-14, btol=1e-14, iter_lim=10 * args.cols)[:3]

    # Every rank must have taken the same path: same iteration count, bit-identical x.
    paths = comm.mpi.allgather((itn, x.tobytes()))
    same = all(p == paths[0] for p in paths)
    want = np.linalg.lstsq(A, b, rcond=None)[0]  # serial reference
    err = comm.mpi.allreduce(float(np.linalg.norm(x - want) / np.linalg.norm(want)), op=MPI.MAX)
    ok = same and err <= args.tol
    if rank == 0:
        print(
            f"distributed_lstsq: P={P} rows per rank {list(rows)}: LSQR stopped with istop={istop} after "
            f"{itn} iterations on every rank: {same}; relative error vs numpy.linalg.lstsq {err:.3g} "
            f"(tol {args.tol:g})"
        )
        print("distributed_lstsq: OK" if ok else "distributed_lstsq: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
