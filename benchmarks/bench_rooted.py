"""hpccoll's rooted collectives over raw mpi4py, side by side in one run: time ratios per message size.

Launch (2 ranks is the reference setting; any number works):

    mpiexec -n 2 python benchmarks/bench_rooted.py [--rounds 11] [--sizes 8,1K,64K,1M,4M,16M] [--root 0]

For each size S (bytes per rank, float64), interleaved round by round on the same buffers (hpccoll._timing:
per-call time of the slowest rank, median over rounds; ratios are the median of the same-round ratios):

- broadcast vs ``Bcast``  : ``out=`` a separate buffer, and in place (``out=x``) against ``Bcast(x)``
  (out of place, root pays one copy of ``x`` into ``out`` that raw ``Bcast(x)`` does not: the result never
  aliases the input; in place is the like-for-like comparison)
- reduce    vs ``Reduce`` : ``out=`` given on every rank (root's holds the sum, the others' zeros: a fill that
  raw ``Reduce`` does not do), and in place

each with the default communicator (``transport="auto"``: on one node it picks node-shared memory for the
middle sizes where that measured faster) and with ``transport="mpi"`` (host MPI only: the overhead of
hpccoll's layer over the same MPI call, the column the 1.05x target is about).

``raw/raw`` times the raw call a second time in every round (the noise floor of the ratios). Then, from 1 MiB,
the in-place broadcast like for like: one buffer, raw ``Bcast`` and the two communicators' calls alone in their
rounds. Then, at one size
(1 MiB per rank by default), gather vs ``Gatherv`` and scatter vs ``Scatterv`` (sizes given and sizes=None),
and, for the small-call overhead the targets compare with, all_reduce vs ``Allreduce`` at 8 B.
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


def parse_bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1:] in units else int(text)


def human(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:g} {unit}"
    return f"{n} B"


def iterations(nbytes: int) -> int:
    """Calls per timed batch: about 50 MB moved per batch, 3 to 2000 calls."""
    return max(3, min(2000, int(2e8 // max(nbytes, 1)) // 4))


def timed(raw: MPI.Intracomm, fns: dict, nbytes: int, rounds: int) -> _timing.Samples:
    iters = iterations(nbytes)
    return _timing.interleave(raw, fns, iters=iters, rounds=rounds, warmup=min(iters, 20))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11, help="interleaved rounds per size (default 11)")
    parser.add_argument(
        "--sizes", default="8,1K,64K,1M,4M,16M", help="bytes per rank, comma-separated (default 8,1K,64K,1M,4M,16M)"
    )
    parser.add_argument("--vsize", default="1M", help="size per rank of the gather/scatter rows (default 1M)")
    parser.add_argument("--root", type=int, default=0, help="the root (default 0)")
    args = parser.parse_args(argv)

    world = MPI.COMM_WORLD
    raw = world.Dup()
    comm = hpccoll.Communicator(world)
    mpic = hpccoll.Communicator(world, transport="mpi")
    P, rank, root = comm.size, comm.rank, args.root
    say = print if rank == 0 else (lambda *a, **k: None)
    sizes = [parse_bytes(s) for s in args.sizes.split(",") if s.strip()]
    D, SUM = MPI.DOUBLE, MPI.SUM
    say(
        f"# hpccoll {hpccoll.__version__} vs mpi4py {__import__('mpi4py').__version__} "
        f"({MPI.Get_library_version().splitlines()[0].strip()}), {P} ranks, float64, root {root}"
    )
    say(
        f"# command: mpiexec -n {P} python benchmarks/bench_rooted.py {' '.join(sys.argv[1:] if argv is None else argv)}"
    )
    say(
        "# times: median over rounds of the per-call time (max over ranks), microseconds; ratio: median over "
        "rounds of the same-round ratio hpccoll/raw; raw/raw: the raw call timed twice per round (noise floor)"
    )
    header = (
        f"{'collective':<11}{'size/rank':>10}{'raw':>11}{'auto out=':>11}{'ratio':>7}{'in place':>11}{'ratio':>7}"
        f"{'mpi out=':>11}{'ratio':>7}{'added':>9}{'mpi x=out':>11}{'ratio':>7}{'raw/raw':>8}"
    )
    say(header)
    say("-" * len(header))
    for nbytes in sizes:
        n = max(1, nbytes // 8)
        x = np.random.default_rng(rank).standard_normal(n)
        buf, out, rout = x.copy(), np.empty(n), np.empty(n)
        cases = {
            "broadcast": {
                "raw": lambda: raw.Bcast([buf, D], root=root),
                "raw_again": lambda: raw.Bcast([buf, D], root=root),
                "out": lambda: hpccoll.broadcast(x, comm, root=root, out=out),
                "inplace": lambda: hpccoll.broadcast(buf, comm, root=root, out=buf),
                "mpi": lambda: hpccoll.broadcast(x, mpic, root=root, out=out),
                "mpi_inplace": lambda: hpccoll.broadcast(buf, mpic, root=root, out=buf),
            },
            "reduce": {
                "raw": lambda: raw.Reduce([x, D], [rout, D], SUM, root=root),
                "raw_again": lambda: raw.Reduce([x, D], [rout, D], SUM, root=root),
                "out": lambda: hpccoll.reduce(x, comm, root=root, out=out),
                "inplace": lambda: hpccoll.reduce(buf, comm, root=root, out=buf),
                "mpi": lambda: hpccoll.reduce(x, mpic, root=root, out=out),
                "mpi_inplace": lambda: hpccoll.reduce(buf, mpic, root=root, out=buf),
            },
        }
        for name, fns in cases.items():
            s = timed(raw, fns, nbytes, args.rounds)
            t = {k: v * 1e6 for k, v in _timing.medians(s).items()}
            r = {k: _timing.paired_ratio(s, k, "raw") for k in s}
            added = _timing.paired_difference(s, "mpi", "raw") * 1e6
            say(
                f"{name:<11}{human(nbytes):>10}{t['raw']:>11.1f}{t['out']:>11.1f}{r['out']:>7.3f}"
                f"{t['inplace']:>11.1f}{r['inplace']:>7.3f}{t['mpi']:>11.1f}{r['mpi']:>7.3f}{added:>+9.1f}"
                f"{t['mpi_inplace']:>11.1f}{r['mpi_inplace']:>7.3f}{r['raw_again']:>8.3f}"
            )

    # like for like: in place on one buffer, nothing else timed in the round (the table above interleaves six
    # callables over four buffers of the size; past 1 MiB, which buffers the others left in the caches moved
    # its broadcast ratios by up to 0.3 in a run, raw/raw included)
    say("\n# broadcast in place, like for like: raw Bcast(buf) and hpccoll.broadcast(buf, out=buf), one buffer")
    say(f"{'collective':<11}{'size/rank':>10}{'raw':>11}{'auto':>11}{'ratio':>7}{'mpi':>11}{'ratio':>7}{'raw/raw':>8}")
    say("-" * len(header))
    for nbytes in [s for s in sizes if s >= 1 << 20]:
        buf = np.random.default_rng(rank).standard_normal(max(1, nbytes // 8))
        s = timed(
            raw,
            {
                "raw": lambda: raw.Bcast([buf, D], root=root),
                "raw_again": lambda: raw.Bcast([buf, D], root=root),
                "inplace": lambda: hpccoll.broadcast(buf, comm, root=root, out=buf),
                "mpi_inplace": lambda: hpccoll.broadcast(buf, mpic, root=root, out=buf),
            },
            nbytes,
            args.rounds,
        )
        t = {k: v * 1e6 for k, v in _timing.medians(s).items()}
        say(
            f"{'broadcast':<11}{human(nbytes):>10}{t['raw']:>11.1f}{t['inplace']:>11.1f}"
            f"{_timing.paired_ratio(s, 'inplace', 'raw'):>7.3f}{t['mpi_inplace']:>11.1f}"
            f"{_timing.paired_ratio(s, 'mpi_inplace', 'raw'):>7.3f}{_timing.paired_ratio(s, 'raw_again', 'raw'):>8.3f}"
        )

    # gather / scatter at one size, uneven-free (every rank vsize): sizes given and discovered
    nbytes = parse_bytes(args.vsize)
    n = max(1, nbytes // 8)
    say(f"\n# gather / scatter at {human(nbytes)} per rank (sizes given; sizes=None discovers them)")
    say(
        f"{'collective':<11}{'size/rank':>10}{'raw':>11}{'sizes':>11}{'ratio':>7}{'None':>11}{'ratio':>7}{'raw/raw':>8}"
    )
    say("-" * len(header))
    x = np.random.default_rng(rank).standard_normal(n)
    counts = [n] * P
    displs = [n * r for r in range(P)]
    at_root = rank == root
    gout = np.empty(n * P if at_root else 0)
    graw = np.empty(n * P) if at_root else None
    src = np.random.default_rng(7).standard_normal(n * P) if at_root else np.empty(0)
    sout = np.empty(n)
    cases = {
        "gather": {
            "raw": lambda: raw.Gatherv([x, D], [graw, (counts, displs), D] if at_root else None, root=root),
            "raw_again": lambda: raw.Gatherv([x, D], [graw, (counts, displs), D] if at_root else None, root=root),
            "sizes": lambda: hpccoll.gather(x, comm, root=root, sizes=counts, out=gout),
            "none": lambda: hpccoll.gather(x, comm, root=root, out=gout),
        },
        "scatter": {
            "raw": lambda: raw.Scatterv([src, (counts, displs), D] if at_root else None, [sout, D], root=root),
            "raw_again": lambda: raw.Scatterv([src, (counts, displs), D] if at_root else None, [sout, D], root=root),
            "sizes": lambda: hpccoll.scatter(src, comm, root=root, sizes=counts, out=sout),
            "none": lambda: hpccoll.scatter(src, comm, root=root, out=sout),
        },
    }
    for name, fns in cases.items():
        s = timed(raw, fns, nbytes * P, args.rounds)
        t = {k: v * 1e6 for k, v in _timing.medians(s).items()}
        say(
            f"{name:<11}{human(nbytes):>10}{t['raw']:>11.1f}{t['sizes']:>11.1f}"
            f"{_timing.paired_ratio(s, 'sizes', 'raw'):>7.3f}{t['none']:>11.1f}{_timing.paired_ratio(s, 'none', 'raw'):>7.3f}"
            f"{_timing.paired_ratio(s, 'raw_again', 'raw'):>8.3f}"
        )

    # the small-call reference: all_reduce's overhead at 8 B, measured in this same run
    say("\n# small-call reference at 8 B per rank (the ratio all_reduce has today), out= given")
    say(f"{'collective':<11}{'size/rank':>10}{'raw':>11}{'out=':>11}{'ratio':>7}{'added':>9}{'':>18}{'raw/raw':>8}")
    say("-" * len(header))
    x = np.random.default_rng(rank).standard_normal(1)
    aout = np.empty(1)
    s = timed(
        raw,
        {
            "raw": lambda: raw.Allreduce([x, D], [aout, D], SUM),
            "raw_again": lambda: raw.Allreduce([x, D], [aout, D], SUM),
            "out": lambda: hpccoll.all_reduce(x, comm, out=aout),
        },
        8,
        args.rounds,
    )
    t = {k: v * 1e6 for k, v in _timing.medians(s).items()}
    say(
        f"{'all_reduce':<11}{human(8):>10}{t['raw']:>11.1f}{t['out']:>11.1f}{_timing.paired_ratio(s, 'out', 'raw'):>7.3f}"
        f"{_timing.paired_difference(s, 'out', 'raw') * 1e6:>+9.1f}{'':>18}{_timing.paired_ratio(s, 'raw_again', 'raw'):>8.3f}"
    )
    comm.free()
    mpic.free()
    raw.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
