"""The ``shm`` transport against raw mpi4py, side by side in one run: paired ratios per message size.

Launch (``make bench-shm`` runs it at 2 and 4 ranks):

    mpiexec -n 2 python -m mpi4py benchmarks/bench_shm.py [--max-bytes 16M] [--rounds 9] [--json FILE]
    mpiexec -n 4 python -m mpi4py benchmarks/bench_shm.py --memory      # PSS of a 64 MiB gathered result
    mpiexec -n 2 python -m mpi4py benchmarks/bench_shm.py --chunks      # sizes of the scratch rounds

For each size S (float64; bytes per rank for all-gather, bytes of the full input
for the reductions) every row times, interleaved round by round on the same
buffers:

- ``raw``: the mpi4py buffer call (``Allgather``, ``Reduce_scatter_block``,
  ``Allreduce``) into a preallocated output;
- ``private``: hpccoll on the ``shm`` transport, plain NumPy input, ``out=`` a
  preallocated NumPy array (the same work as raw);
- ``mpi``: hpccoll on the ``mpi`` transport, the same call;
- ``auto``: hpccoll on the default transport choice (shm where it measured
  faster, see ``SharedMemory.wins``; host MPI elsewhere), the same call;
- ``shared``: the input in node-shared memory (``Communicator.shared_empty``),
  and for all-gather and all-reduce the result too (``out="shared"``). For
  all-gather the shard is new each call (a shard gathered without copies
  becomes read-only): the ``shared`` column times the collective alone, the
  ``step`` columns a whole step, ``shared_empty`` + filling the shard + the
  gather, against filling a NumPy shard + raw ``Allgather``.

Times are the median over rounds of the per-call time (the max over ranks);
ratios are raw time / hpccoll time (above 1: hpccoll is faster), the median over
rounds of the two calls' ratio within one round (paired: same machine load).
``raw/raw`` times the raw call twice per round: the noise floor. Run on a
shared machine, the absolute times wander; the paired ratios much less.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import hpccoll  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_quick import human, parse_bytes  # noqa: E402

#: The communicator with the default transport choice (``auto``), made in :func:`main`.
AUTO: hpccoll.Communicator

Once = Callable[[], float]  # runs one call, returns the seconds it took (its own setup excluded)


def timed(fn: Callable[[], object]) -> Once:
    def once() -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    return once


class Paired:
    """Interleaved rounds of several timed callables; the round's start rotates so none always runs first."""

    def __init__(self, comm: MPI.Intracomm, rounds: int) -> None:
        self.comm, self.rounds = comm, rounds
        self.samples: Dict[str, List[float]] = {}

    def run(self, cases: Dict[str, Once], nbytes: int) -> Dict[str, float]:
        iters = max(3, min(400, int(5e7 // max(nbytes, 1))))
        for once in cases.values():
            for _ in range(min(iters, 5)):
                once()
        self.samples = {name: [] for name in cases}
        order = list(cases.items())
        for r in range(self.rounds):
            for name, once in order[r % len(order) :] + order[: r % len(order)]:
                self.comm.Barrier()
                per = sum(once() for _ in range(iters)) / iters
                self.samples[name].append(self.comm.allreduce(per, op=MPI.MAX))
        return {name: statistics.median(v) for name, v in self.samples.items()}

    def speedup(self, base: str, other: str) -> float:
        """Median over rounds of time(base) / time(other)."""
        return statistics.median(b / o for b, o in zip(self.samples[base], self.samples[other]))


def gather_cases(raw, shm, mpi, n: int, P: int, rank: int) -> Dict[str, Once]:
    x = np.random.default_rng(rank).standard_normal(n)
    out = np.empty(n * P)
    sizes = [n] * P
    D = MPI.DOUBLE

    def zero_copy() -> float:
        s = shm.shared_empty(n)
        s[...] = x
        raw.Barrier()  # every shard written: time the collective, not the slowest rank's fill
        t0 = time.perf_counter()
        hpccoll.all_gather(s, shm, sizes=sizes, out="shared")
        return time.perf_counter() - t0

    def step_shared() -> float:
        t0 = time.perf_counter()
        s = shm.shared_empty(n)
        s[...] = x
        hpccoll.all_gather(s, shm, sizes=sizes, out="shared")
        return time.perf_counter() - t0

    shard = np.empty(n)

    def step_raw() -> float:
        t0 = time.perf_counter()
        shard[...] = x
        raw.Allgather([shard, D], [out, D])
        return time.perf_counter() - t0

    return {
        "raw": timed(lambda: raw.Allgather([x, D], [out, D])),
        "raw_again": timed(lambda: raw.Allgather([x, D], [out, D])),
        "private": timed(lambda: hpccoll.all_gather(x, shm, sizes=sizes, out=out)),
        "mpi": timed(lambda: hpccoll.all_gather(x, mpi, sizes=sizes, out=out)),
        "auto": timed(lambda: hpccoll.all_gather(x, AUTO, sizes=sizes, out=out)),
        "shared": zero_copy,
        "step_raw": step_raw,
        "step_shared": step_shared,
    }


def scatter_cases(raw, shm, mpi, n: int, P: int, rank: int) -> Dict[str, Once]:
    full = np.random.default_rng(rank).standard_normal(n)
    out = np.empty(n // P)
    D = MPI.DOUBLE
    return _reduction_cases(
        lambda: raw.Reduce_scatter_block([full, D], [out, D], MPI.SUM), hpccoll.reduce_scatter, full, out, out, shm, mpi
    )


def reduce_cases(raw, shm, mpi, n: int, P: int, rank: int) -> Dict[str, Once]:
    x = np.random.default_rng(rank).standard_normal(n)
    out = np.empty(n)
    D = MPI.DOUBLE
    return _reduction_cases(
        lambda: raw.Allreduce([x, D], [out, D], MPI.SUM), hpccoll.all_reduce, x, out, "shared", shm, mpi
    )


def _reduction_cases(
    raw_call: Callable[[], Any],
    collective: Callable[..., Any],
    x: np.ndarray,
    out: np.ndarray,
    shared_out: Any,
    shm,
    mpi,
) -> Dict[str, Once]:
    """A reduction's rows: the raw call (twice: the noise floor), ``collective`` on ``x`` over the shm, mpi and
    auto communicators into ``out``, and on a node-shared copy of ``x`` into ``shared_out``."""
    s = shm.shared_empty(x.size)
    s[...] = x
    return {
        "raw": timed(raw_call),
        "raw_again": timed(raw_call),
        "private": timed(lambda: collective(x, shm, out=out)),
        "mpi": timed(lambda: collective(x, mpi, out=out)),
        "auto": timed(lambda: collective(x, AUTO, out=out)),
        "shared": timed(lambda: collective(s, shm, out=shared_out)),
    }


def pss_kib() -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    raise RuntimeError("no Pss line in /proc/self/smaps_rollup")


def memory(shm, say, result_bytes: int) -> dict:
    """PSS added by one all-gathered result of ``result_bytes``: private arrays vs one shared result."""
    world = shm.mpi
    P, rank = shm.size, shm.rank
    n = result_bytes // 8 // P
    x = np.random.default_rng(rank).standard_normal(n)
    rows = {}
    for kind in ("private", "shared"):
        world.Barrier()
        before = pss_kib()
        if kind == "private":
            y = hpccoll.all_gather(x, shm)
        else:
            s = shm.shared_empty(n)
            s[...] = x
            y = hpccoll.all_gather(s, shm, out="shared")
        y.sum()  # every rank reads the whole result
        world.Barrier()
        added = world.allreduce(pss_kib() - before, op=MPI.SUM)
        rows[kind] = added / 1024
        del y
        if kind == "shared":
            del s
        world.Barrier()
    say(
        f"# memory: {P} ranks, all_gather result of {human(result_bytes)} read by every rank; "
        "PSS added over all ranks of the node (/proc/self/smaps_rollup), MiB"
    )
    say(f"private results (one per rank, MPI buffers too):{rows['private']:9.1f} MiB")
    say(f"shared result (one per node, shards included):  {rows['shared']:9.1f} MiB")
    say(
        f"ratio private / shared: {rows['private'] / rows['shared']:.2f} (ideal {P}: one copy per rank vs one per node)"
    )
    return {"ranks": P, "result_bytes": result_bytes, **rows}


def chunks(raw, world, say, rounds: int) -> list:
    """Private reduce-scatter and all-reduce against raw MPI with scratch rounds of several sizes."""
    P = world.size
    rows = []
    say("# scratch rounds (SharedMemory.chunk_bytes): raw / shm, paired per round")
    for what, nbytes in (("reduce_scatter", 1 << 20), ("reduce_scatter", 4 << 20), ("all_reduce", 16 << 20)):
        n = nbytes // 8
        x = np.random.default_rng(world.rank).standard_normal(n)
        out = np.empty(n // P if what == "reduce_scatter" else n)
        line = f"{what:<15}{human(nbytes):>9}:"
        for cb in (512 << 10, 1 << 20, 2 << 20, 4 << 20, 16 << 20):
            c = hpccoll.Communicator(world, transport="shm")
            c.transport_instance("shm").chunk_bytes = cb
            call = getattr(hpccoll, what)
            if what == "reduce_scatter":
                base = timed(lambda: raw.Reduce_scatter_block([x, MPI.DOUBLE], [out, MPI.DOUBLE], MPI.SUM))
            else:
                base = timed(lambda: raw.Allreduce([x, MPI.DOUBLE], [out, MPI.DOUBLE], MPI.SUM))
            timer = Paired(raw, rounds)
            timer.run({"raw": base, "shm": timed(lambda: call(x, c, out=out))}, nbytes)
            ratio = timer.speedup("raw", "shm")
            rows.append({"collective": what, "bytes": nbytes, "chunk_bytes": cb, "x": ratio})
            line += f"  {human(cb)} x{ratio:.2f}"
            c.free()
        say(line)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-bytes", default="1K")
    parser.add_argument("--max-bytes", default="16M")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--memory", action="store_true", help="only the PSS measurement (64 MiB result)")
    parser.add_argument("--chunks", action="store_true", help="only the sweep over scratch round sizes")
    parser.add_argument("--json", help="also write the results to this JSON file (rank 0)")
    args = parser.parse_args(argv)

    world = MPI.COMM_WORLD
    raw = world.Dup()
    shm = hpccoll.Communicator(world, transport="shm")
    mpi = hpccoll.Communicator(world, transport="mpi")
    global AUTO
    AUTO = hpccoll.Communicator(world, transport="auto")
    P, rank = shm.size, shm.rank
    say = print if rank == 0 else (lambda *a, **k: None)
    say(
        f"# hpccoll shm transport vs raw mpi4py {__import__('mpi4py').__version__} "
        f"({MPI.Get_library_version().splitlines()[0].strip()}), {P} ranks, float64, "
        f"{os.cpu_count()} cores shared with other jobs"
    )
    say(f"# command: mpiexec -n {P} python -m mpi4py benchmarks/bench_shm.py {' '.join(argv or sys.argv[1:])}".rstrip())
    say(f"# load average at the start: {' '.join(f'{v:.1f}' for v in os.getloadavg())} (1, 5, 15 min)")
    results: dict = {"ranks": P, "load_start": os.getloadavg()}
    if args.memory:
        results["memory"] = memory(shm, say, 64 << 20)
    elif args.chunks:
        results["chunks"] = chunks(raw, world, say, args.rounds)
    else:
        say("# times in us (median over rounds, max over ranks); x: raw / hpccoll, paired per round (>1: faster)")
        header = (
            f"{'collective':<15}{'size':>9}{'raw':>10}{'private':>10}{'x':>7}{'mpi':>10}{'x':>7}"
            f"{'auto':>10}{'x':>7}{'shared':>10}{'x':>7}{'raw/raw':>8}"
        )
        say(header)
        say("-" * len(header))
        ladder = [1 << k for k in range(10, 31, 2)]
        sizes = [s for s in ladder if parse_bytes(args.min_bytes) <= s <= parse_bytes(args.max_bytes)]
        timer = Paired(raw, args.rounds)
        rows = []
        for name, make in (
            ("all_gather", gather_cases),
            ("reduce_scatter", scatter_cases),
            ("all_reduce", reduce_cases),
        ):
            for nbytes in sizes:
                n = nbytes // 8 if name == "all_gather" else max(P, nbytes // 8 // P * P)
                t = timer.run(make(raw, shm, mpi, n, P, rank), n * 8 * (P if name == "all_gather" else 1))
                row = {"collective": name, "bytes": n * 8, **{k: v * 1e6 for k, v in t.items()}}
                for k in ("private", "mpi", "auto", "shared"):
                    row["x_" + k] = timer.speedup("raw", k)
                row["noise"] = timer.speedup("raw", "raw_again")
                extra = ""
                if "step_raw" in t:
                    row["x_step"] = timer.speedup("step_raw", "step_shared")
                    extra = f"   step: {row['step_raw']:.1f} vs {row['step_shared']:.1f} = x{row['x_step']:.2f}"
                rows.append(row)
                say(
                    f"{name:<15}{human(n * 8):>9}{row['raw']:>10.1f}{row['private']:>10.1f}{row['x_private']:>7.2f}"
                    f"{row['mpi']:>10.1f}{row['x_mpi']:>7.2f}{row['auto']:>10.1f}{row['x_auto']:>7.2f}{row['shared']:>10.1f}{row['x_shared']:>7.2f}"
                    f"{row['noise']:>8.2f}{extra}"
                )
        results["rows"] = rows
    say(f"# load average at the end: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    results["load_end"] = os.getloadavg()
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    shm.free()
    mpi.free()
    AUTO.free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
