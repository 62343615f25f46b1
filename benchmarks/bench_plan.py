"""Planned collectives against raw mpi4py, blocking and persistent, side by side in one run: time ratios.

Launch (2 ranks is the reference setting; any number works):

    mpiexec -n 2 python benchmarks/bench_plan.py [--rounds 11] [--sizes 8,1K,1M] [--method auto]

For each collective and size S (bytes per rank, float64; all_to_all: S sent per rank), interleaved round by
round on the same buffers (hpccoll._timing: per-call time of the slowest rank, median over rounds; ratios are
medians of same-round ratios):

- ``raw``   : the blocking mpi4py call (``Allreduce``, ``Allgather``, ``Reduce_scatter_block``, ``Bcast``,
  ``Alltoall``) on prebuilt buffer specs
- ``pers``  : the raw MPI-4 persistent request (``Allreduce_init`` ... once; ``Start`` + ``Wait`` per call)
- ``call``  : the unplanned hpccoll call with ``out=`` given (``transport="mpi"``: the same MPI calls)
- ``plan``  : ``hpccoll.plan(...)`` made once (``--method``, default ``auto``: profile or measured), ``p()``,
  with ``out=`` the raw calls' receive buffer (like for like: a plan that allocated its own result would
  also measure where that buffer's pages lie, which moved 1 MiB ratios by several percent between runs)

and prints plan/pers, plan/raw, call/raw and the raw call timed twice per round (raw/raw, the noise floor).
The method each plan chose is printed beside it.
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


def iterations(nbytes: int) -> int:
    """Calls per timed batch: about 50 MB moved per batch, 3 to 2000 calls."""
    return max(3, min(2000, int(2e8 // max(nbytes, 1)) // 4))


def cases(raw: MPI.Intracomm, c: hpccoll.Communicator, n: int, method: str) -> dict:
    """Per collective: its raw blocking and persistent calls, the unplanned call and the plan."""
    P, rank = raw.size, raw.rank
    D, SUM = MPI.DOUBLE, MPI.SUM
    rng = np.random.default_rng(rank)
    out = {}

    x, y = rng.standard_normal(n), np.empty(n)
    out["all_reduce"] = (
        lambda: raw.Allreduce([x, D], [y, D], SUM),
        raw.Allreduce_init([x, D], [y, D], SUM),
        lambda: hpccoll.all_reduce(x, c, out=y),
        hpccoll.plan(hpccoll.all_reduce, x, c, out=y, method=method),
    )
    g, gy = rng.standard_normal(n), np.empty(n * P)
    out["all_gather"] = (
        lambda: raw.Allgather([g, D], [gy, D]),
        raw.Allgather_init([g, D], [gy, D]),
        lambda: hpccoll.all_gather(g, c, out=gy),
        hpccoll.plan(hpccoll.all_gather, g, c, out=gy, method=method),
    )
    s, sy = rng.standard_normal(n * P), np.empty(n)
    out["reduce_scatter"] = (
        lambda: raw.Reduce_scatter_block([s, D], [sy, D], SUM),
        raw.Reduce_scatter_block_init([s, D], [sy, D], SUM),
        lambda: hpccoll.reduce_scatter(s, c, out=sy),
        hpccoll.plan(hpccoll.reduce_scatter, s, c, out=sy, method=method),
    )
    b = rng.standard_normal(n)
    out["broadcast"] = (
        lambda: raw.Bcast([b, D], root=0),
        raw.Bcast_init([b, D], root=0),
        lambda: hpccoll.broadcast(b, c, out=b),
        hpccoll.plan(hpccoll.broadcast, b, c, out=b, method=method),
    )
    m = max(n // P, 1)
    a, ay = rng.standard_normal(m * P), np.empty(m * P)
    out["all_to_all"] = (
        lambda: raw.Alltoall([a, D], [ay, D]),
        raw.Alltoall_init([a, D], [ay, D]),
        lambda: hpccoll.all_to_all(a, c, out=ay),
        hpccoll.plan(hpccoll.all_to_all, a, c, out=ay, method=method),
    )
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11, help="interleaved rounds per size (default 11)")
    parser.add_argument("--sizes", default="8,1K,1M", help="bytes per rank, comma-separated (default 8,1K,1M)")
    parser.add_argument("--method", default="auto", choices=hpccoll._plan.METHODS, help="the plans' method")
    parser.add_argument("--collectives", default="", help="comma-separated subset (default: all)")
    args = parser.parse_args(argv)

    world = MPI.COMM_WORLD
    raw = world.Dup()
    c = hpccoll.Communicator(world, transport="mpi")
    P, rank = c.size, c.rank
    say = print if rank == 0 else (lambda *a, **k: None)
    say(
        f"# hpccoll {hpccoll.__version__} vs mpi4py {__import__('mpi4py').__version__} "
        f"({MPI.Get_library_version().splitlines()[0].strip()}), {P} ranks, float64, transport mpi"
    )
    say(f"# command: mpiexec -n {P} python benchmarks/bench_plan.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    say(
        "# times: median over rounds of the per-call time (max over ranks), microseconds; ratios: median over "
        "rounds of same-round ratios"
    )
    header = (
        f"{'collective':<15}{'size/rank':>10}{'raw':>9}{'pers':>9}{'call':>9}{'plan':>9}  {'method':<11}"
        f"{'plan/pers':>10}{'plan/raw':>9}{'call/raw':>9}{'pers/raw':>9}{'raw/raw':>8}"
    )
    say(header)
    say("-" * len(header))
    wanted = [w for w in args.collectives.split(",") if w]
    for nbytes in [parse_bytes(s) for s in args.sizes.split(",") if s.strip()]:
        n = max(1, nbytes // 8)
        for name, (blocking, persistent, call, planned) in cases(raw, c, n, args.method).items():
            if wanted and name not in wanted:
                planned.free()
                persistent.Free()
                continue
            start, wait = persistent.Start, persistent.Wait

            def pers() -> None:
                start()
                wait()

            fns = {"raw": blocking, "raw_again": blocking, "pers": pers, "call": call, "plan": planned}
            iters = iterations(nbytes * (P if name in ("all_gather", "reduce_scatter") else 1))
            s = _timing.interleave(raw, fns, iters=iters, rounds=args.rounds, warmup=min(iters, 20))
            t = {k: v * 1e6 for k, v in _timing.medians(s).items()}
            r = lambda a, b: _timing.paired_ratio(s, a, b)  # noqa: E731
            say(
                f"{name:<15}{human(nbytes):>10}{t['raw']:>9.2f}{t['pers']:>9.2f}{t['call']:>9.2f}{t['plan']:>9.2f}"
                f"  {'/'.join(planned.methods):<11}{r('plan', 'pers'):>10.3f}{r('plan', 'raw'):>9.3f}"
                f"{r('call', 'raw'):>9.3f}{r('pers', 'raw'):>9.3f}{r('raw_again', 'raw'):>8.3f}"
            )
            planned.free()
            persistent.Free()
    c.free()
    raw.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
