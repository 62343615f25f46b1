"""hpccoll quickstart: every collective and its adjoint on real data, checked against NumPy.

all_gather, reduce_scatter, all_reduce, all_to_all, broadcast, reduce, gather, scatter, halo_exchange (on a
2-D process grid), shift and permute, each with its adjoint, then the collective dot test of every operator
(AllGather, ReduceScatter, AllReduce, AllToAll, Broadcast, Reduce, Gather, Scatter, HaloExchange, Shift,
Permute).

Launch (4 ranks; any number works):

    mpiexec -n 4 python -m mpi4py examples/quickstart.py [--backend numpy|cupy] [--check]

Each rank builds the same global data from a seed, keeps its own shard, runs the
collective, and compares with the serial NumPy computation on the global data.
The shards are uneven on purpose (rank r holds r + 1 columns). Exit status 0
means every check passed on every rank.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from mpi4py import MPI

import hpccoll
from hpccoll.testing import dottest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["numpy", "cupy"], default="numpy", help="array library (default numpy)")
    parser.add_argument("--check", action="store_true", help="turn on the cross-rank argument check")
    args = parser.parse_args(argv)
    xp = np
    if args.backend == "cupy":
        import cupy as xp  # noqa: F811 - needs a GPU transport (see docs)

    comm = hpccoll.Communicator(check=args.check)
    rank, size = comm.rank, comm.size
    say = print if rank == 0 else (lambda *a, **k: None)
    failures = []

    def check(name, got, want, exact=True):
        got = got.get() if hasattr(got, "get") else got
        ok = np.array_equal(got, want) if exact else np.allclose(got, want, rtol=1e-12, atol=1e-12)
        ok = comm.mpi.allreduce(bool(ok), op=MPI.LAND)
        say(f"  [{'ok' if ok else 'FAILED'}] {name}")
        if not ok:
            failures.append(name)

    say(f"hpccoll {hpccoll.__version__} on {size} rank(s), backend={args.backend}, check={comm.check}")
    rng = np.random.default_rng(2026)
    sizes = [r + 1 for r in range(size)]  # uneven shards: rank r holds r + 1 columns
    lo, hi = sum(sizes[:rank]), sum(sizes[: rank + 1])
    n = sum(sizes)

    # 1. all_gather: concatenate the column shards of a 2 x n matrix along axis 1.
    A = rng.standard_normal((2, n))
    y = hpccoll.all_gather(xp.asarray(A[:, lo:hi]), comm, axis=1)
    say("all_gather(axis=1) -> shape", y.shape, "\n", np.round(y.get() if hasattr(y, "get") else y, 2))
    check("all_gather == numpy.concatenate of the shards", y, A)

    # 2. its adjoint: reduce-scatter (sum) of a different cotangent on every rank.
    G = rng.standard_normal((size, 2, n))  # G[r] is rank r's cotangent
    g = hpccoll.all_gather_adjoint(xp.asarray(G[rank]), comm, axis=1, sizes=sizes)
    check("all_gather_adjoint == sum over ranks, this rank's columns", g, G.sum(0)[:, lo:hi], exact=False)

    # 3. reduce_scatter: sum the full arrays, keep this rank's rows (numpy.array_split's split).
    X = rng.standard_normal((size, 3 * size + 1, 2))
    rows = hpccoll.split_sizes(X.shape[1], size)
    r0 = sum(rows[:rank])
    b = hpccoll.reduce_scatter(xp.asarray(X[rank]), comm)
    say("reduce_scatter rows per rank:", rows)
    check("reduce_scatter == sum over ranks, this rank's rows", b, X.sum(0)[r0 : r0 + rows[rank]], exact=False)

    # 4. its adjoint: all-gather of the block cotangents.
    Gb = rng.standard_normal((size, 3 * size + 1, 2))
    gb = hpccoll.reduce_scatter_adjoint(xp.asarray(Gb[rank][r0 : r0 + rows[rank]]), comm)
    want = np.concatenate([Gb[r][sum(rows[:r]) : sum(rows[: r + 1])] for r in range(size)])
    check("reduce_scatter_adjoint == all_gather of the blocks", gb, want)

    # 5. all_reduce and its two adjoint conventions.
    Z = rng.standard_normal((size, 4))
    s = hpccoll.all_reduce(xp.asarray(Z[rank]), comm, op="sum")
    m = hpccoll.all_reduce(xp.asarray(Z[rank]), comm, op="avg")
    say("all_reduce(sum):", np.round(s.get() if hasattr(s, "get") else s, 3))
    check("all_reduce(sum) == Z.sum(0)", s, Z.sum(0), exact=False)
    check("all_reduce(avg) == Z.mean(0)", m, Z.mean(0), exact=False)
    varying = hpccoll.all_reduce_adjoint(xp.asarray(G[rank][0, :1]), comm, cotangent="varying")
    check("all_reduce_adjoint(varying) == sum of the cotangents", varying, G[:, 0, :1].sum(0), exact=False)
    same = np.ones(4)  # the same cotangent on every rank, as after a replicated loss
    replicated = hpccoll.all_reduce_adjoint(xp.asarray(same), comm, cotangent="replicated")
    check("all_reduce_adjoint(replicated) == identity for sum", replicated, same)

    # 6. all_to_all: a distributed transpose. Rank r holds rows of the global (m x k) matrix T (uneven: r + 1 of
    #    them), splits its rows by columns and receives every rank's rows of its own columns.
    m, k = n, 2 * size + 1
    T = rng.standard_normal((m, k))
    cols = hpccoll.split_sizes(k, size)  # numpy.array_split's column blocks
    c0 = sum(cols[:rank])
    t = hpccoll.all_to_all(xp.asarray(T[lo:hi]), comm, split_axis=1, concat_axis=0, recv_sizes=sizes)
    say("all_to_all(split_axis=1, concat_axis=0): rows", sizes, "-> columns", cols)
    check("all_to_all == this rank's columns of the global matrix", t, T[:, c0 : c0 + cols[rank]])

    # 7. its adjoint: the all-to-all back (axes and sizes swapped), of a different cotangent on every rank.
    Gt = rng.standard_normal((size, m, k))  # Gt[r][:, rank r's columns] is rank r's cotangent
    own = [Gt[r][:, sum(cols[:r]) : sum(cols[: r + 1])] for r in range(size)]
    back = hpccoll.all_to_all_adjoint(xp.asarray(own[rank]), comm, split_axis=1, concat_axis=0, recv_sizes=sizes)
    want = np.concatenate([own[r][lo:hi] for r in range(size)], axis=1)
    check("all_to_all_adjoint == the cotangents' blocks sent back", back, want)

    # 8. the rooted collectives, at the last rank as root: broadcast and reduce, gather and scatter, and their adjoints.
    root = size - 1
    B = rng.standard_normal((size, 3))  # B[r] is rank r's array
    check("broadcast == root's array", hpccoll.broadcast(xp.asarray(B[rank]), comm, root=root), B[root])
    check(
        "broadcast_adjoint == sum over ranks at root, zeros elsewhere",
        hpccoll.broadcast_adjoint(xp.asarray(B[rank]), comm, root=root),
        B.sum(0) if rank == root else np.zeros(3),
        exact=False,
    )
    check(
        "reduce(max) == B.max(0) at root, zeros elsewhere",
        hpccoll.reduce(xp.asarray(B[rank]), comm, op="max", root=root),
        B.max(0) if rank == root else np.zeros(3),
    )
    check(
        "reduce_adjoint == root's cotangent everywhere",
        hpccoll.reduce_adjoint(xp.asarray(B[rank]), comm, root=root),
        B[root],
    )
    g = hpccoll.gather(xp.asarray(A[:, lo:hi]), comm, root=root, axis=1)  # uneven column shards
    check("gather == the whole matrix at root, (2, 0) elsewhere", g, A if rank == root else A[:, :0])
    part = hpccoll.scatter(xp.asarray(A if rank == root else A[:, :0]), comm, root=root, axis=1, sizes=sizes)
    check("scatter == this rank's columns of root's matrix", part, A[:, lo:hi])
    C = rng.standard_normal((2, n))  # a cotangent of the gathered matrix (root's counts) and of the scattered one
    back = hpccoll.gather_adjoint(xp.asarray(C if rank == root else C[:, :0]), comm, root=root, axis=1, sizes=sizes)
    check("gather_adjoint == the scatter of root's cotangent", back, C[:, lo:hi])
    back = hpccoll.scatter_adjoint(xp.asarray(C[:, lo:hi]), comm, root=root, axis=1, sizes=sizes)
    check("scatter_adjoint == the gather of the cotangents onto root", back, C if rank == root else C[:, :0])
    say("broadcast, reduce, gather, scatter at root", root, "and their adjoints: see the checks")

    # 9. halo_exchange on a 2-D process grid, periodic along axis 0, not along axis 1. Each rank owns a 3 x 4
    #    block of the global (3 * d0) x (4 * d1) field F and holds it with one ghost layer on each side (5 x 6,
    #    ghosts zero). The exchange fills every ghost with the neighbour's owned cell it stands for (corners
    #    too: corners=True); ghosts beyond the non-periodic edges keep their zeros.
    grid = comm.cartesian([0, 0], periodic=(True, False))  # MPI_Dims_create picks the grid's shape
    d0, d1 = grid.dims
    F = rng.standard_normal((3 * d0, 4 * d1))

    def cells(q):
        """Rank q's 5 x 6 local array as global cells: the rows (wrapped), the columns, and which columns exist."""
        c0, c1 = np.unravel_index(q, grid.dims)  # grid coordinates are the rank in C order
        rows = (3 * c0 + np.arange(-1, 4)) % F.shape[0]
        cols = 4 * c1 + np.arange(-1, 5)
        return rows, np.clip(cols, 0, F.shape[1] - 1), (cols >= 0) & (cols < F.shape[1])

    g_rows, g_cols, exists = cells(rank)  # this rank's cells in F
    want = np.where(exists, F[np.ix_(g_rows, g_cols)], 0.0)  # the owned cells, and every ghost that stands for one
    field = np.zeros((5, 6))
    field[1:-1, 1:-1] = F[np.ix_(g_rows, g_cols)][1:-1, 1:-1]  # this rank's owned cells
    h = hpccoll.halo_exchange(xp.asarray(field), grid, halo=1, corners=True)
    say(f"halo_exchange on a {d0} x {d1} grid (periodic, not periodic): ghosts filled")
    check("halo_exchange == the neighbours' cells in the ghosts", h, want)

    # 10. its adjoint: each filled ghost's cotangent added into the owned cell it stands for, the ghost zeroed.
    Gh = rng.standard_normal((size, 5, 6))  # Gh[q] is rank q's cotangent
    ghost = np.ones((5, 6), bool)
    ghost[1:-1, 1:-1] = False
    added = np.zeros_like(F)
    for q in range(size):
        q_rows, q_cols, q_exists = cells(q)
        a, b = np.nonzero(ghost & q_exists)  # rank q's filled ghosts
        np.add.at(added, (q_rows[a], q_cols[b]), Gh[q][a, b])
    want = np.where(ghost & exists, 0.0, Gh[rank])
    want[1:-1, 1:-1] += added[np.ix_(g_rows, g_cols)][1:-1, 1:-1]
    gh = hpccoll.halo_exchange_adjoint(xp.asarray(Gh[rank]), grid, halo=1, corners=True)
    check("halo_exchange_adjoint == the ghosts' cotangents added where they came from", gh, want, exact=False)

    # 11. shift: the ring step; every rank gets the array of the rank before it, and the adjoint shifts back.
    S = rng.standard_normal((size, 5))  # S[r] is rank r's array
    check("shift == the array of rank (r - 1) mod P", hpccoll.shift(xp.asarray(S[rank]), comm), S[(rank - 1) % size])
    back = hpccoll.shift_adjoint(xp.asarray(S[rank]), comm)
    check("shift_adjoint == the array of rank (r + 1) mod P", back, S[(rank + 1) % size])
    # ... and permute, any permutation: a pipeline step, stage i to i + 1, the first stage receiving zeros.
    pipe = [(i, i + 1) for i in range(size - 1)]
    want = S[rank - 1] if rank else np.zeros(5)
    check(
        "permute == the array of the previous stage (zeros on the first)",
        hpccoll.permute(xp.asarray(S[rank]), comm, perm=pipe),
        want,
    )
    want = S[rank + 1] if rank < size - 1 else np.zeros(5)
    back = hpccoll.permute_adjoint(xp.asarray(S[rank]), comm, perm=pipe)
    check("permute_adjoint == the array of the next stage (zeros on the last)", back, want)

    # 12. collective dot tests: sum_r <F x, y> == sum_r <x, F^H y>, for every operator.
    local = np.random.default_rng(rank)  # different vectors on every rank
    ops = {
        "AllGather": (hpccoll.AllGather(comm, axis=1, sizes=sizes), (2, sizes[rank]), (2, n)),
        "ReduceScatter": (hpccoll.ReduceScatter(comm, sizes=rows), X.shape[1:], (rows[rank], 2)),
        "AllReduce": (hpccoll.AllReduce(comm), (4,), (4,)),
        "AllToAll": (
            hpccoll.AllToAll(comm, split_axis=1, concat_axis=0, recv_sizes=sizes),
            (sizes[rank], k),
            (m, cols[rank]),
        ),
        "Broadcast": (hpccoll.Broadcast(comm, root=root), (3,), (3,)),
        "Reduce": (hpccoll.Reduce(comm, root=root), (3,), (3,)),
        "Gather": (
            hpccoll.Gather(comm, root=root, axis=1, sizes=sizes),
            (2, sizes[rank]),
            (2, n if rank == root else 0),
        ),
        "Scatter": (
            hpccoll.Scatter(comm, root=root, axis=1, sizes=sizes),
            (2, n if rank == root else 0),
            (2, sizes[rank]),
        ),
        "HaloExchange": (hpccoll.HaloExchange(grid, halo=1, corners=True), (5, 6), (5, 6)),
        "Shift": (hpccoll.Shift(comm), (5,), (5,)),
        "Permute": (hpccoll.Permute(comm, perm=pipe), (5,), (5,)),
    }
    for name, (op, xs, ys) in ops.items():
        ok = dottest(
            op, xp.asarray(local.standard_normal(xs)), xp.asarray(local.standard_normal(ys)), raise_error=False
        )
        say(f"  [{'ok' if ok else 'FAILED'}] dottest {name}")
        if not ok:
            failures.append(f"dottest {name}")

    grid.free()
    comm.free()
    if failures:
        say(f"quickstart: {len(failures)} check(s) FAILED: {failures}")
        return 1
    say(f"quickstart: all checks passed on {size} rank(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
