"""hpccoll over raw mpi4py, side by side in one run: time ratios per message size.

Launch (2 ranks is the reference setting; any number works):

    mpiexec -n 2 python benchmarks/bench_quick.py [--max-bytes 64M] [--json FILE]

For each size S (bytes per rank, float64) every row times hpccoll and the raw
mpi4py buffer call on the same buffers, interleaved round by round, and prints
the median time per call (max over ranks) and the ratio hpccoll / raw (the
median over rounds of the two calls' ratio within a round):

- all_gather     vs ``Allgather``             (S per rank in, P*S out)
- reduce_scatter vs ``Reduce_scatter_block``  (P*S in, S out)
- all_reduce     vs ``Allreduce``             (S in, S out)

``out=`` columns pass preallocated outputs to both; ``alloc`` columns let
hpccoll allocate and have the raw side call ``numpy.empty`` first (the same
work). ``raw/raw`` times the raw call a second time in every round: how far
from 1 a ratio wanders when nothing differs (the noise floor). Each round
starts one callable further along, so none always runs first. A second table
compares layouts at 16 MiB: all_gather along axis 1 vs axis 0, and uneven vs
even shards. Ratios, not absolute times, are the result: these machines are
shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

# One BLAS thread per rank (the ranks fill the cores already): the overlap row's matrix products
# otherwise oversubscribe them, and idle BLAS threads spinning after a product slow MPI down.
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


class Timer:
    """Interleaved timing of several callables over the same communicator (``hpccoll._timing``).

    ``run`` returns the median per-call time of each callable (max over ranks);
    ``ratio`` and ``added`` compare two of them round by round (paired: both ran
    in the same round, under the same machine load) and take the median over
    rounds. This class only adds the iteration count by size and the warm-up.
    """

    def __init__(self, comm: MPI.Intracomm, rounds: int) -> None:
        self.comm = comm
        self.rounds = rounds
        self.samples: dict = {}

    def ratio(self, a: str, b: str) -> float:
        """Median over the last run's rounds of time(a) / time(b)."""
        return _timing.paired_ratio(self.samples, a, b)

    def added(self, a: str, b: str) -> float:
        """Median over the last run's rounds of time(a) - time(b), in seconds."""
        return _timing.paired_difference(self.samples, a, b)

    def iterations(self, nbytes: int) -> int:
        return max(3, min(2000, int(2e8 // max(nbytes, 1)) // 4))

    def run(self, fns: dict, nbytes: int) -> dict:
        iters = self.iterations(nbytes)
        # warm-up: allocations, MPI internal buffers; each round starts one callable further along
        self.samples = _timing.interleave(self.comm, fns, iters=iters, rounds=self.rounds, warmup=min(iters, 20))
        return _timing.medians(self.samples)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-bytes", default="8", help="smallest size per rank (default 8)")
    parser.add_argument("--max-bytes", default="64M", help="largest size per rank (default 64M)")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds per size (default 15)")
    parser.add_argument("--json", help="also write the results to this JSON file (rank 0)")
    args = parser.parse_args(argv)

    world = MPI.COMM_WORLD
    raw = world.Dup()
    comm = hpccoll.Communicator(world)
    P, rank = comm.size, comm.rank
    say = print if rank == 0 else (lambda *a, **k: None)
    timer = Timer(raw, args.rounds)
    # 8 B, 64 B, ... 256 KiB, then 1, 4, 16, 64 MiB
    ladder = [8 << (3 * k) for k in range(6)] + [(1 << 20) << (2 * k) for k in range(6)]
    sizes = [s for s in ladder if parse_bytes(args.min_bytes) <= s <= parse_bytes(args.max_bytes)]
    say(
        f"# hpccoll {hpccoll.__version__} vs mpi4py {__import__('mpi4py').__version__} "
        f"({MPI.Get_library_version().splitlines()[0].strip()}), {P} ranks, float64"
    )
    say(f"# command: mpiexec -n {P} python benchmarks/bench_quick.py {' '.join(argv or sys.argv[1:])}".rstrip())
    say(
        "# times: median over rounds of the per-call time (max over ranks), microseconds; "
        "ratios and 'added': median over rounds of the paired (same-round) ratio and difference"
    )
    say("# raw/raw: the same raw call timed twice in each round, the noise floor of the ratios")
    header = (
        f"{'collective':<15}{'size/rank':>10}{'raw':>11}{'out=':>11}{'ratio':>7}{'added':>9}"
        f"{'raw+alloc':>11}{'alloc':>11}{'ratio':>7}{'raw/raw':>8}"
    )
    say(header)
    say("-" * len(header))
    results = []
    D = MPI.DOUBLE
    for nbytes in sizes:
        n = max(1, nbytes // 8)
        x = np.random.default_rng(rank).standard_normal(n)
        big = np.random.default_rng(rank).standard_normal(n * P)
        g_out, r_out, a_out = np.empty(n * P), np.empty(n), np.empty(n)
        sz = [n] * P
        cases = {
            "all_gather": {
                "raw": lambda: raw.Allgather([x, D], [g_out, D]),
                "raw_again": lambda: raw.Allgather([x, D], [g_out, D]),
                "out": lambda: hpccoll.all_gather(x, comm, sizes=sz, out=g_out),
                "raw_alloc": lambda: raw.Allgather([x, D], [np.empty(n * P), D]),
                "alloc": lambda: hpccoll.all_gather(x, comm, sizes=sz),
                "discover": lambda: hpccoll.all_gather(x, comm, out=g_out),
            },
            "reduce_scatter": {
                "raw": lambda: raw.Reduce_scatter_block([big, D], [r_out, D], MPI.SUM),
                "raw_again": lambda: raw.Reduce_scatter_block([big, D], [r_out, D], MPI.SUM),
                "out": lambda: hpccoll.reduce_scatter(big, comm, out=r_out),
                "raw_alloc": lambda: raw.Reduce_scatter_block([big, D], [np.empty(n), D], MPI.SUM),
                "alloc": lambda: hpccoll.reduce_scatter(big, comm),
            },
            "all_reduce": {
                "raw": lambda: raw.Allreduce([x, D], [a_out, D], MPI.SUM),
                "raw_again": lambda: raw.Allreduce([x, D], [a_out, D], MPI.SUM),
                "out": lambda: hpccoll.all_reduce(x, comm, out=a_out),
                "raw_alloc": lambda: raw.Allreduce([x, D], [np.empty(n), D], MPI.SUM),
                "alloc": lambda: hpccoll.all_reduce(x, comm),
            },
        }
        for name, fns in cases.items():
            t = timer.run(fns, nbytes * (P if name != "all_reduce" else 1))
            row = {"collective": name, "bytes_per_rank": nbytes, **{k: v * 1e6 for k, v in t.items()}}
            row["ratio_out"] = timer.ratio("out", "raw")
            row["noise"] = timer.ratio("raw_again", "raw")
            row["ratio_alloc"] = timer.ratio("alloc", "raw_alloc")
            row["added_us"] = timer.added("out", "raw") * 1e6
            results.append(row)
            say(
                f"{name:<15}{human(nbytes):>10}{row['raw']:>11.1f}{row['out']:>11.1f}{row['ratio_out']:>7.3f}"
                f"{row['added_us']:>+9.1f}{row['raw_alloc']:>11.1f}{row['alloc']:>11.1f}{row['ratio_alloc']:>7.3f}"
                f"{row['noise']:>8.3f}" + (f"   (sizes=None: {row['discover']:.1f})" if "discover" in row else "")
            )

    layout = []
    nbytes = min(16 << 20, parse_bytes(args.max_bytes))
    n = nbytes // 8
    say(f"\n# layouts at {human(nbytes)} per rank (ratio to the first column)")
    x0 = np.random.default_rng(rank).standard_normal((n // 64, 64))
    x1 = np.random.default_rng(rank).standard_normal((64, n // 64))
    out0, out1 = np.empty((P * (n // 64), 64)), np.empty((64, P * (n // 64)))
    rows = n // 64
    even_sz = [rows] * P
    uneven = [rows + rows // 2 if r == 0 else rows - rows // 2 if r == 1 else rows for r in range(P)]
    xu = np.random.default_rng(rank).standard_normal((uneven[rank], 64))
    xe = np.random.default_rng(rank).standard_normal((even_sz[rank], 64))
    oute, outu = np.empty((sum(even_sz), 64)), np.empty(sum(uneven) * 64)
    counts = [u * 64 for u in uneven]
    displs = [sum(counts[:r]) for r in range(P)]
    t = timer.run(
        {
            "axis0": lambda: hpccoll.all_gather(x0, comm, axis=0, out=out0),
            "axis1": lambda: hpccoll.all_gather(x1, comm, axis=1, out=out1),
        },
        nbytes * P,
    )
    layout.append({"case": "all_gather axis=1 / axis=0", "ratio": timer.ratio("axis1", "axis0"), **t})
    say(
        f"all_gather axis=1 / axis=0      {t['axis1'] * 1e6:>11.1f} / {t['axis0'] * 1e6:>11.1f} us = "
        f"{layout[-1]['ratio']:.3f}"
    )
    t = timer.run(
        {
            "raw": lambda: raw.Allgatherv([xu, D], [outu, (counts, displs), D]),
            "uneven": lambda: hpccoll.all_gather(xu, comm, sizes=uneven, out=outu.reshape(-1, 64)),
        },
        nbytes * P,
    )
    layout.append({"case": "all_gather uneven / raw Allgatherv", "ratio": timer.ratio("uneven", "raw"), **t})
    say(
        f"all_gather uneven / Allgatherv  {t['uneven'] * 1e6:>11.1f} / {t['raw'] * 1e6:>11.1f} us = "
        f"{layout[-1]['ratio']:.3f}"
    )
    t = timer.run(
        {
            "even": lambda: hpccoll.all_gather(xe, comm, sizes=even_sz, out=oute),
            "uneven": lambda: hpccoll.all_gather(xu, comm, sizes=uneven, out=outu.reshape(-1, 64)),
        },
        nbytes * P,
    )
    layout.append({"case": "all_gather uneven / even (same total)", "ratio": timer.ratio("uneven", "even"), **t})
    say(
        f"all_gather uneven / even        {t['uneven'] * 1e6:>11.1f} / {t['even'] * 1e6:>11.1f} us = "
        f"{layout[-1]['ratio']:.3f}   (rank 0 holds 1.5x, rank 1 0.5x: bounded by the largest block)"
    )
    # Coalescing: 256 arrays of 1 KiB in one list call, against one 256 KiB call and 256 calls.
    say("\n# coalesced all_reduce: 256 arrays of 1 KiB (float64)")
    many = [np.random.default_rng(rank + i).standard_normal(128) for i in range(256)]
    one = np.concatenate(many)
    one_out = np.empty_like(one)
    t = timer.run(
        {
            "one": lambda: hpccoll.all_reduce(one, comm),
            "list": lambda: hpccoll.all_reduce(many, comm),
            "loop": lambda: [hpccoll.all_reduce(a, comm) for a in many],
            "raw_one": lambda: raw.Allreduce([one, D], [one_out, D], MPI.SUM),
        },
        256 * 1024 * 64,
    )
    coalesced = {
        "list_over_one": timer.ratio("list", "one"),
        "loop_over_list": timer.ratio("loop", "list"),
        "loop_over_raw_one": timer.ratio("loop", "raw_one"),
        **t,
    }
    say(
        f"list of 256 / one 256 KiB call  {t['list'] * 1e6:>11.1f} / {t['one'] * 1e6:>11.1f} us = "
        f"{coalesced['list_over_one']:.2f}   (target <= 2)"
    )
    say(
        f"256 calls / list of 256         {t['loop'] * 1e6:>11.1f} / {t['list'] * 1e6:>11.1f} us = "
        f"{coalesced['loop_over_list']:.1f}x faster   (target >= 10)"
    )
    say(
        f"256 calls / raw 256 KiB Allreduce {t['loop'] * 1e6:>9.1f} / {t['raw_one'] * 1e6:>11.1f} us = "
        f"{coalesced['loop_over_raw_one']:.1f}x   (the ceiling: a list form with no packing, checks or results)"
    )

    # Overlap: a non-blocking all_reduce hidden behind local work of about the same duration.
    nbytes = min(4 << 20, parse_bytes(args.max_bytes))
    g = np.random.default_rng(rank).standard_normal(nbytes // 8)
    out_g = np.empty_like(g)
    a = np.random.default_rng(rank).standard_normal((160, 160))

    def compute() -> None:
        for _ in range(4):
            a @ a

    def together() -> None:
        req = hpccoll.all_reduce(g, comm, out=out_g, async_op=True)
        compute()
        req.wait()

    t = timer.run(
        {
            "comm": lambda: hpccoll.all_reduce(g, comm, out=out_g),
            "compute": compute,
            "together": together,
        },
        nbytes * 16,
    )
    overlap = {"apart": t["comm"] + t["compute"], **t}
    overlap["together_over_apart"] = statistics.median(
        g / (c + k) for g, c, k in zip(*(timer.samples[n] for n in ("together", "comm", "compute")))
    )
    say(f"\n# overlap: all_reduce of {human(nbytes)} with async_op=True around local matrix products")
    say(
        f"comm {t['comm'] * 1e6:.1f} us + compute {t['compute'] * 1e6:.1f} us apart = {overlap['apart'] * 1e6:.1f} us; "
        f"together {t['together'] * 1e6:.1f} us ({overlap['together_over_apart']:.2f} of apart)"
    )

    if rank == 0 and args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "ranks": P,
                    "mpi": MPI.Get_library_version().splitlines()[0].strip(),
                    "rows": results,
                    "layouts": layout,
                    "coalesced": coalesced,
                    "overlap": overlap,
                },
                fh,
                indent=1,
            )
    comm.free()
    raw.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
