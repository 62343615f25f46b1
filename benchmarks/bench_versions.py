"""Two versions of hpccoll and raw mpi4py, interleaved in one run: per-call cost and large-message ratios.

Launch (2 ranks is the reference setting):

    mpiexec -n 2 python benchmarks/bench_versions.py [--before REV] [--rounds 15]

``--before`` (default ``644ac59``, the last commit before the one-road
restructuring) is extracted with ``git archive`` into a temporary folder and
imported as the package ``hpccoll_before`` next to the working tree's
``hpccoll``; both run over the same communicator, on the same buffers, in the
same rounds (each round starts one callable further along). For each
collective (all-gather, reduce-scatter, all-reduce; broadcast from rank 0 into ``out=`` and in place, against
``Bcast``; reduce to rank 0 likewise, against ``Reduce``; shift against ``Sendrecv``; all-to-all against
``Alltoall``; a halo exchange in place on a periodic ring, one face of the size each way, against two
``Sendrecv``; ``--collectives`` picks some) at 8 B and 1 KiB per
rank with ``out=`` and ``sizes`` given it prints the median per-call time of raw mpi4py, before and after (max over
ranks), and the added time over raw (median over rounds of the paired
difference); at 1 and 16 MiB the ratios to raw. ``raw/raw`` is the noise
floor.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from bench_quick import Timer, human  # noqa: E402
from bench_rooted import parse_bytes  # noqa: E402
from mpi4py import MPI  # noqa: E402

import hpccoll  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_before(rev: str, comm: MPI.Intracomm) -> object:
    """``hpccoll`` as of ``rev``, imported as ``hpccoll_before`` (rank 0 extracts, everyone imports)."""
    where = comm.bcast(tempfile.mkdtemp(prefix="hpccoll-before-") if comm.rank == 0 else None)
    if comm.rank == 0:
        archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "hpccoll"], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", where], input=archive.stdout, check=True)
        os.rename(os.path.join(where, "hpccoll"), os.path.join(where, "hpccoll_before"))
    comm.Barrier()
    sys.path.insert(0, where)
    import hpccoll_before  # noqa: F401

    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(where)
    return sys.modules["hpccoll_before"]


def cases(lib: object, comm: object, grid: object, n: int, P: int, bufs: dict) -> dict:
    """The collectives with ``out=`` (and ``sizes``) given, for one library (``grid``: ``comm`` as a ring)."""
    x, big = bufs["x"], bufs["big"]
    return {
        "all_gather": lambda: lib.all_gather(x, comm, sizes=[n] * P, out=bufs["g"]),
        "reduce_scatter": lambda: lib.reduce_scatter(big, comm, sizes=[n] * P, out=bufs["r"]),
        "all_reduce": lambda: lib.all_reduce(x, comm, out=bufs["a"]),
        "broadcast": lambda: lib.broadcast(x, comm, out=bufs["b"]),
        "broadcast x=out": lambda: lib.broadcast(bufs["b"], comm, out=bufs["b"]),
        "reduce": lambda: lib.reduce(x, comm, out=bufs["d"]),
        "reduce x=out": lambda: lib.reduce(bufs["e"], comm, out=bufs["e"]),
        "shift": lambda: lib.shift(x, comm, out=bufs["s"]),
        "all_to_all": lambda: lib.all_to_all(big, comm, recv_sizes=[n] * P, out=bufs["t"]),
        "halo_exchange": lambda: lib.halo_exchange(bufs["h"], grid, halo=1, out=bufs["h"]),
    }


def raw_cases(mpi: MPI.Intracomm, n: int, bufs: dict) -> dict:
    D = MPI.DOUBLE
    x, big = bufs["x"], bufs["big"]
    return {
        "all_gather": lambda: mpi.Allgather([x, n, D], [bufs["g"], n, D]),
        "reduce_scatter": lambda: mpi.Reduce_scatter_block([big, D], [bufs["r"], n, D], MPI.SUM),
        "all_reduce": lambda: mpi.Allreduce([x, D], [bufs["a"], D], MPI.SUM),
        "broadcast": lambda: mpi.Bcast([bufs["b"], D], 0),
        "broadcast x=out": lambda: mpi.Bcast([bufs["b"], D], 0),
        "reduce": lambda: mpi.Reduce([x, D], [bufs["d"], D], MPI.SUM, 0),
        "reduce x=out": lambda: mpi.Reduce([x, D], [bufs["d"], D], MPI.SUM, 0),
        "shift": lambda: mpi.Sendrecv(
            [x, D], (mpi.rank + 1) % mpi.size, 0, [bufs["s"], D], (mpi.rank - 1) % mpi.size, 0
        ),
        "all_to_all": lambda: mpi.Alltoall([big, n, D], [bufs["t"], n, D]),
        "halo_exchange": lambda: halo(mpi, bufs["h"]),
    }


def halo(mpi: MPI.Intracomm, h: np.ndarray) -> None:
    """Rows 1 (the owned cells) to both neighbours on a periodic ring, into rows 0 and 2."""
    left, right, D = (mpi.rank - 1) % mpi.size, (mpi.rank + 1) % mpi.size, MPI.DOUBLE
    mpi.Sendrecv([h[1], D], right, 1, [h[0], D], left, 1)
    mpi.Sendrecv([h[1], D], left, 2, [h[2], D], right, 2)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="644ac59", help="the git revision to compare against")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--sizes", default="8,1K,1M,16M", help="bytes per rank, comma-separated (default 8,1K,1M,16M)")
    parser.add_argument("--collectives", default=None, help="comma-separated names (default: all)")
    args = parser.parse_args(argv)
    world = MPI.COMM_WORLD
    before = load_before(args.before, world)
    raw, P, rank = world.Dup(), world.size, world.rank
    new, old = hpccoll.Communicator(world), before.Communicator(world)
    new_ring, old_ring = new.cartesian([P], periodic=True), old.cartesian([P], periodic=True)
    timer = Timer(raw, args.rounds)
    say = print if rank == 0 else (lambda *a, **k: None)
    say(
        f"# hpccoll: working tree vs {args.before} vs raw mpi4py ({MPI.Get_library_version().splitlines()[0].strip()}), "
        f"{P} ranks, float64, out= and sizes given"
    )
    say(f"# command: mpiexec -n {P} python benchmarks/bench_versions.py {' '.join(argv or sys.argv[1:])}".rstrip())
    say("# times: median over rounds of the per-call time (max over ranks); added/ratios: median of same-round pairs")
    say(
        f"{'collective':<18}{'size/rank':>10}{'raw us':>9}{'before us':>11}{'after us':>10}"
        f"{'before+':>9}{'after+':>9}{'before x':>10}{'after x':>9}{'raw/raw':>9}"
    )
    for nbytes in (parse_bytes(v) for v in args.sizes.split(",")):
        n = max(1, nbytes // 8)
        rng = np.random.default_rng(rank)
        bufs = dict(
            x=rng.standard_normal(n),
            big=rng.standard_normal(n * P),
            g=np.empty(n * P),
            r=np.empty(n),
            a=np.empty(n),
            b=np.empty(n),
            d=np.empty(n),
            e=rng.standard_normal(n),
            s=np.empty(n),
            t=np.empty(n * P),
            h=np.zeros((3, n)),
        )
        mine, theirs = cases(hpccoll, new, new_ring, n, P, bufs), cases(before, old, old_ring, n, P, bufs)
        base = raw_cases(raw, n, bufs)
        for name in mine if args.collectives is None else args.collectives.split(","):
            timer.run({"raw": base[name], "before": theirs[name], "after": mine[name], "raw2": base[name]}, nbytes)
            t = {k: statistics.median(v) for k, v in timer.samples.items()}
            say(
                f"{name:<18}{human(nbytes):>10}{t['raw'] * 1e6:>9.2f}{t['before'] * 1e6:>11.2f}{t['after'] * 1e6:>10.2f}"
                f"{timer.added('before', 'raw') * 1e6:>9.2f}{timer.added('after', 'raw') * 1e6:>9.2f}"
                f"{timer.ratio('before', 'raw'):>10.3f}{timer.ratio('after', 'raw'):>9.3f}{timer.ratio('raw2', 'raw'):>9.3f}"
            )
    for c in (new_ring, old_ring, new, old):
        c.free()
    raw.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
