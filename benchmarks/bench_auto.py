"""``auto`` against the best NumPy transport, with and without a ``tune`` profile, side by side in one run.

Launch (2 ranks is the reference setting), after tuning at the same rank count:

    mpiexec -n 2 python -m mpi4py -m hpccoll tune -o docs/bench/tune_2ranks.json
    mpiexec -n 2 python benchmarks/bench_auto.py --profile docs/bench/tune_2ranks.json [--rounds 9]

For each collective and size S per rank (float64, ``out=`` given), interleaved round by round on the same
buffers: the default communicator with the profile in force (``tuned``), one with no profile (``untuned``),
and one per transport named (``mpi``, ``shm``: every message through node-shared memory), plus a second
``mpi`` communicator (``mpi_again``: the same path on another communicator, whose ratio to ``mpi``,
``mpi/mpi``, is the noise floor of every ratio in its row). Printed: each
time (slowest rank, median over rounds), ``tuned / best``, where ``best`` is whichever of ``mpi`` and ``shm``
has the shorter median (the ratio within each round, median over rounds: the per-round minimum of the two,
used before 2026-12-02, was biased low by the noise wherever they are close), and ``untuned / mpi``: the
target is ``tuned <= 1.03x`` the best transport at every size, and ``untuned`` never slower than ``mpi``.
"""

from __future__ import annotations

import argparse
import os
import sys

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from bench_rooted import human, parse_bytes  # noqa: E402 (this directory: the scripts' shared size helpers)
from mpi4py import MPI  # noqa: E402

import hpccoll  # noqa: E402
from hpccoll import _timing  # noqa: E402


def communicator(world: MPI.Intracomm, transport: str, profile: str) -> hpccoll.Communicator:
    """A communicator whose transports are made now, under ``profile`` (``HPCCOLL_TUNE_FILE``)."""
    os.environ["HPCCOLL_TUNE_FILE"] = profile
    c = hpccoll.Communicator(world, transport=transport)
    c.transport_of("numpy", 1 << 40)  # make shm (and read the profile) now, under this profile
    return c


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", required=True, help="the profile `python -m hpccoll tune -o` wrote")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds per size (default 9)")
    parser.add_argument("--sizes", default="256K,1M,4M,16M", help="bytes per rank (default 256K,1M,4M,16M)")
    args = parser.parse_args(argv)
    world = MPI.COMM_WORLD
    comms = {
        "tuned": communicator(world, "auto", args.profile),
        "untuned": communicator(world, "auto", os.path.join(os.path.dirname(args.profile), "no-such-profile.json")),
        "mpi": communicator(world, "mpi", args.profile),
        "mpi_again": communicator(world, "mpi", args.profile),
        "shm": communicator(world, "shm", args.profile),
    }
    P, rank = world.size, world.rank
    say = print if rank == 0 else (lambda *a, **k: None)
    say(
        f"# hpccoll {hpccoll.__version__}, {MPI.Get_library_version().splitlines()[0].strip()}, {P} ranks, float64, "
        f"profile {args.profile}"
    )
    say(f"# command: mpiexec -n {P} python benchmarks/bench_auto.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    say("# times: median over rounds of the per-call time (max over ranks), us; ratios: medians of same-round ratios")
    header = (
        f"{'collective':<15}{'size/rank':>10}{'tuned':>10}{'untuned':>10}{'mpi':>10}{'shm':>10}"
        f"{'tuned/best':>12}{'untuned/mpi':>12}{'mpi/mpi':>9}"
    )
    say(header)
    say("-" * len(header))
    rng = np.random.default_rng(rank)
    for nbytes in [parse_bytes(s) for s in args.sizes.split(",") if s.strip()]:
        n = nbytes // 8
        x, y, g = rng.standard_normal(n), np.empty(n), np.empty(n * P)
        block = np.empty(max(n // P, 1))
        calls = {
            "all_reduce": lambda c: hpccoll.all_reduce(x, c, out=y),
            "reduce_scatter": lambda c: hpccoll.reduce_scatter(x[: block.size * P], c, out=block),
            "reduce": lambda c: hpccoll.reduce(x, c, out=y),
            "all_gather": lambda c: hpccoll.all_gather(x, c, out=g),
            "broadcast": lambda c: hpccoll.broadcast(y, c, out=y),
        }
        iters = max(2, min(200, (64 << 20) // max(nbytes * P, 1)))
        for name, call in calls.items():
            fns = {k: (lambda call=call, c=c: call(c)) for k, c in comms.items()}
            s = _timing.interleave(world, fns, iters=iters, rounds=args.rounds, warmup=2)
            t = {k: v * 1e6 for k, v in _timing.medians(s).items()}
            # the best transport is the one with the shorter median; its same-round ratio (a per-round
            # min(mpi, shm) would be biased low by the noise wherever the two are close)
            best = _timing.paired_ratio(s, "tuned", min(("mpi", "shm"), key=lambda k: t[k]))
            untuned = _timing.paired_ratio(s, "untuned", "mpi")
            floor = _timing.paired_ratio(s, "mpi_again", "mpi")
            say(
                f"{name:<15}{human(nbytes):>10}{t['tuned']:>10.1f}{t['untuned']:>10.1f}{t['mpi']:>10.1f}"
                f"{t['shm']:>10.1f}{best:>12.3f}{untuned:>12.3f}{floor:>9.3f}"
            )
    for c in comms.values():
        c.free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
