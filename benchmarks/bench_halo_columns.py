"""hpccoll.halo_exchange of strided faces (columns) against hand-written mpi4py with MPI vector datatypes.

Launch (2 ranks is the reference setting):

    mpiexec -n 2 python benchmarks/bench_halo_columns.py [--rounds 11] [--rows 64,1024,8192]

A float64 field of ``rows`` x 10 owned columns per rank, split along axis 1 over a periodic 1 x P grid,
halo 1: each rank sends its first and last owned column (strided in memory) to its two neighbours and
receives into its ghost columns. The hand-written exchange is what an MPI user writes: one committed
column datatype (``Create_vector``), two ``Irecv`` and two ``Isend`` on the field itself. ``hpccoll`` is
``halo_exchange(u, grid, halo=(0, 1), out=u)`` repeated: kept from its second call on, it packs each strided
face into a send buffer kept with the exchange, runs the prepared messages and copies the received faces
out of their kept buffers (one small agreement per call); ``plan`` the same call planned (it calls the
collective, which then runs the same kept exchange). Times: the
slowest rank's, medians of interleaved rounds; ratios: medians of same-round ratios against the
hand-written exchange.
"""

from __future__ import annotations

import argparse
import os
import sys

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import hpccoll  # noqa: E402
from hpccoll import _timing  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11, help="interleaved rounds per size (default 11)")
    parser.add_argument("--rows", default="64,1024,8192", help="rows (face length), comma-separated")
    args = parser.parse_args(argv)
    world = MPI.COMM_WORLD
    raw = world.Dup()
    grid = hpccoll.Communicator(world).cartesian([1, world.size], periodic=True)
    lower, upper = grid.neighbours(1)
    say = print if world.rank == 0 else (lambda *a, **k: None)
    say(f"# hpccoll {hpccoll.__version__}, {MPI.Get_library_version().splitlines()[0].strip()}, {world.size} ranks")
    say(f"# command: mpiexec -n {world.size} python benchmarks/bench_halo_columns.py {' '.join(sys.argv[1:])}")
    header = f"{'face':>10}{'hand-written':>14}{'hpccoll':>10}{'ratio':>7}{'plan':>10}{'ratio':>7}{'raw/raw':>9}"
    say(header)
    say("-" * len(header))
    for rows in (int(r) for r in args.rows.split(",") if r.strip()):
        u = np.random.default_rng(world.rank).standard_normal((rows, 12))
        v, z = u.copy(), u.copy()
        col = MPI.DOUBLE.Create_vector(rows, 1, 12).Commit()
        flat = u.reshape(-1)  # a column starts at element j of the flat field

        def hand(f=flat, col=col) -> None:
            MPI.Request.Waitall(
                [
                    raw.Irecv([f[0:], 1, col], source=lower, tag=1),
                    raw.Irecv([f[11:], 1, col], source=upper, tag=2),
                    raw.Isend([f[1:], 1, col], dest=lower, tag=2),
                    raw.Isend([f[10:], 1, col], dest=upper, tag=1),
                ]
            )

        planned = hpccoll.plan(hpccoll.halo_exchange, z, grid, out=z, halo=(0, 1))
        fns = {
            "raw": hand,
            "raw_again": hand,
            "hpccoll": lambda: hpccoll.halo_exchange(v, grid, halo=(0, 1), out=v),
            "plan": planned,
        }
        iters = max(10, min(2000, int(2e7 // (rows * 8))))
        s = _timing.interleave(raw, fns, iters=iters, rounds=args.rounds, warmup=20)
        t = {k: x * 1e6 for k, x in _timing.medians(s).items()}
        face = f"{rows * 8 // 1024} KiB" if rows * 8 >= 1024 else f"{rows * 8} B"
        say(
            f"{face:>10}{t['raw']:>14.1f}{t['hpccoll']:>10.1f}{_timing.paired_ratio(s, 'hpccoll', 'raw'):>7.3f}"
            f"{t['plan']:>10.1f}{_timing.paired_ratio(s, 'plan', 'raw'):>7.3f}"
            f"{_timing.paired_ratio(s, 'raw_again', 'raw'):>9.3f}"
        )
        planned.free()
        col.Free()
    grid.free()
    raw.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
