"""``mpiexec -n N python -m hpccoll bench``: an nccl-tests style bandwidth table.

Definitions follow nccl-tests (``doc/PERFORMANCE.md`` there): ``size`` S is the
full buffer in bytes (the gathered output of all-gather, the input of
reduce-scatter, the array of all-reduce), ``algbw = S / t`` with 1 GB = 1e9 B,
``busbw = algbw * 2(n-1)/n`` for all-reduce and ``algbw * (n-1)/n`` for
all-gather and reduce-scatter, time in microseconds averaged over ranks, and
``#wrong`` the number of wrong elements found by checking the result on every
rank. ``--baseline`` times raw mpi4py buffer calls on the same buffers in the
same run, interleaved, and adds their time and the ratio hpccoll / raw.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

__all__ = ["main", "parse_size", "run"]

COLLECTIVES = ("allgather", "reducescatter", "allreduce")
_BUS = {
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "allreduce": lambda n: 2 * (n - 1) / n,
}
_ALIASES = {
    "float": "float32",
    "half": "float16",
    "double": "float64",
    "int": "int32",
    "bf16": "bfloat16",
    "int8": "int8",
    "uint8": "uint8",
}
_RTOL = {"float16": 1e-2, "bfloat16": 1e-2, "float32": 1e-6, "float64": 1e-12, "complex64": 1e-6, "complex128": 1e-12}


def parse_size(text: str) -> int:
    """``'64M'`` -> 67108864: bytes with an optional K, M or G suffix (powers of 1024)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().rstrip("B")
    try:
        return int(float(t[:-1]) * units[t[-1]]) if t[-1:] in units else int(t)
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"expected a size such as 8, 512K, 64M or 1G; got {text!r}") from None


def _dtype(name: str) -> np.dtype:
    import hpccoll

    name = _ALIASES.get(name, name)
    if name not in hpccoll.SUPPORTED_DTYPES:
        raise argparse.ArgumentTypeError(f"expected a dtype among {', '.join(hpccoll.SUPPORTED_DTYPES)}; got {name!r}")
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _values(count: int, rank: int, dtype: np.dtype, op: str) -> np.ndarray:
    """Rank ``rank``'s deterministic data: small integers, exact in every dtype."""
    i = np.arange(count)
    if dtype == np.bool_:
        return (i + rank) % 3 == 0
    if op == "prod":
        v = 1 + ((i + rank) % 5 == 0)
    else:
        v = (i * 7 + rank * 3) % 13 + (0 if op in ("max", "min") else 1)
    return v.astype(dtype)


def _reduce(parts: List[np.ndarray], op: str, dtype: np.dtype) -> np.ndarray:
    wide = np.complex128 if dtype.kind == "c" else (np.float64 if dtype.kind in "fV" else None)
    acc = parts[0].astype(wide) if wide is not None else parts[0].copy()
    for p in parts[1:]:
        p = p.astype(wide) if wide is not None else p
        if op in ("sum", "avg"):
            acc = acc + p if dtype != np.bool_ else acc | p
        elif op == "prod":
            acc = acc * p if dtype != np.bool_ else acc & p
        elif op == "max":
            acc = np.maximum(acc, p)
        else:
            acc = np.minimum(acc, p)
    if op == "avg":
        acc = acc / len(parts)
    return acc.astype(dtype)


def _wrong(got: np.ndarray, want: np.ndarray) -> int:
    if got.dtype.name in _RTOL:
        wide = np.complex128 if got.dtype.kind == "c" else np.float64
        g, w = got.astype(wide), want.astype(wide)
        return int(np.count_nonzero(~(np.abs(g - w) <= _RTOL[got.dtype.name] * np.abs(w))))
    return int(np.count_nonzero(got != want))


class Case:
    """Buffers, calls and the expected result of one collective at one size."""

    def __init__(self, coll: str, nbytes: int, dtype: np.dtype, op: str, comm: Any, axis: int, uneven: bool):
        import hpccoll

        self.coll, self.dtype, self.op, self.comm = coll, dtype, op, comm
        P, r = comm.size, comm.rank
        lead = 8 if axis == 1 else 1
        units = max(nbytes // dtype.itemsize // lead // P, 1) * P if coll != "allreduce" else 0
        self.count = units * lead if coll != "allreduce" else max(nbytes // dtype.itemsize, 1)
        weights = list(range(1, P + 1)) if uneven else [1] * P
        sizes = [units * w // sum(weights) for w in weights]
        sizes[-1] += units - sum(sizes)
        self.sizes = sizes
        shape = (lambda n: (lead, n)) if axis == 1 else (lambda n: (n,))
        start = sum(sizes[:r])
        if coll == "allgather":
            blocks = [_values(lead * s, q, dtype, op).reshape(shape(s)) for q, s in enumerate(sizes)]
            self.want = np.concatenate(blocks, axis=axis)
            self.x = blocks[r].copy()
            self.out = np.empty_like(self.want)
            self.hpc = lambda: hpccoll.all_gather(self.x, comm, axis=axis, sizes=sizes, out=self.out)
            own = (slice(None),) * axis + (slice(start, start + sizes[r]),)

            def in_place() -> None:
                hpccoll.all_gather(self.out[own], comm, axis=axis, sizes=sizes, out=self.out)

            self.reset = lambda: self.out.__setitem__(own, self.x)
            self.in_place, self.got_in_place = in_place, lambda: self.out
            counts = [lead * s for s in sizes]
            self.flat_out = np.empty(self.count, dtype)
            self.raw = _raw_allgather(comm.mpi, self.x, self.flat_out, counts)
        elif coll == "reducescatter":
            full = [_values(self.count, q, dtype, op).reshape(shape(units)) for q in range(P)]
            own = (slice(None),) * axis + (slice(start, start + sizes[r]),)
            self.want = _reduce(full, op, dtype)[own]
            self.x = full[r]
            self.scratch = self.x.copy()
            self.out = np.empty_like(self.want)
            self.hpc = lambda: hpccoll.reduce_scatter(self.x, comm, op=op, axis=axis, sizes=sizes, out=self.out)

            def in_place() -> None:
                hpccoll.reduce_scatter(self.scratch, comm, op=op, axis=axis, sizes=sizes, out=self.scratch[own])

            self.reset = lambda: np.copyto(self.scratch, self.x)
            self.in_place, self.got_in_place = in_place, lambda: self.scratch[own]
            self.raw = _raw_reduce_scatter(comm.mpi, self.x, [lead * s for s in sizes], op, dtype)
        else:
            parts = [_values(self.count, q, dtype, op) for q in range(P)]
            self.want = _reduce(parts, op, dtype)
            self.x = parts[r]
            self.scratch = self.x.copy()
            self.out = np.empty_like(self.x)
            self.hpc = lambda: hpccoll.all_reduce(self.x, comm, op=op, out=self.out)
            self.in_place = lambda: hpccoll.all_reduce(self.scratch, comm, op=op, out=self.scratch)
            self.reset = lambda: np.copyto(self.scratch, self.x)
            self.got_in_place = lambda: self.scratch
            self.raw = _raw_allreduce(comm.mpi, self.x, op, dtype)
        self.nbytes = self.count * dtype.itemsize

    def wrong(self, in_place: bool) -> int:
        """Run once on fresh data and count wrong elements on this rank."""
        if in_place:
            self.reset()
            self.in_place()
            return _wrong(self.got_in_place(), self.want)
        self.hpc()
        return _wrong(self.out, self.want)


def _raw_allgather(mpi: Any, x: np.ndarray, out: np.ndarray, counts: List[int]) -> Optional[Callable[[], Any]]:
    from ._dtypes import movement_dtype
    from .transports._mpitypes import displacements, mpi_datatype

    wire = movement_dtype(x.dtype)
    t = mpi_datatype(wire)
    send, recv = np.ascontiguousarray(x).reshape(-1).view(wire), out.view(wire)
    if counts.count(counts[0]) == len(counts):
        return lambda: mpi.Allgather([send, t], [recv, t])
    return lambda: mpi.Allgatherv([send, t], [recv, (counts, displacements(counts)), t])


def _raw_plan(op: str, dtype: np.dtype) -> Optional[Tuple[Any, Any]]:
    """Raw MPI can run (op, dtype) directly; None where only hpccoll's plan can (avg, 16-bit floats, bool)."""
    from .transports._mpitypes import mpi_datatype, mpi_op

    if op == "avg" or dtype.kind in "bV" or dtype.itemsize == 2 and dtype.kind == "f":
        return None
    return mpi_datatype(dtype), mpi_op(op)


def _raw_reduce_scatter(mpi: Any, x: np.ndarray, counts: List[int], op: str, dtype: np.dtype) -> Optional[Callable]:
    plan = _raw_plan(op, dtype)
    if plan is None:
        return None
    t, o = plan
    send, recv = np.ascontiguousarray(x).reshape(-1), np.empty(counts[mpi.rank], dtype)
    if counts.count(counts[0]) == len(counts):
        return lambda: mpi.Reduce_scatter_block([send, t], [recv, t], o)
    return lambda: mpi.Reduce_scatter([send, t], [recv, t], counts, o)


def _raw_allreduce(mpi: Any, x: np.ndarray, op: str, dtype: np.dtype) -> Optional[Callable]:
    plan = _raw_plan(op, dtype)
    if plan is None:
        return None
    t, o = plan
    out = np.empty_like(x)
    return lambda: mpi.Allreduce([x, t], [out, t], o)


def _time(comm: Any, fns: Dict[str, Callable[[], Any]], iters: int, warmup: int, rounds: int) -> Dict[str, float]:
    """Average seconds per call (averaged over ranks), median over interleaved rounds."""
    from mpi4py import MPI

    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: Dict[str, List[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            comm.mpi.Barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            dt = (time.perf_counter() - t0) / iters
            samples[name].append(comm.mpi.allreduce(dt, op=MPI.SUM) / comm.size)
    return {k: statistics.median(v) for k, v in samples.items()}


def run(args: argparse.Namespace, comm: Any, say: Callable[[str], None]) -> List[Dict[str, Any]]:
    """Measure every size of every requested collective; print rows as they are measured."""
    from mpi4py import MPI

    colls = COLLECTIVES if args.collective == "all" else (args.collective,)
    P = comm.size
    rows: List[Dict[str, Any]] = []
    for coll in colls:
        op = args.op if coll != "allgather" else "none"
        say(
            f"#\n# {coll}: {P} ranks, dtype {args.datatype.name}, op {op}, axis {args.axis}, "
            f"{'uneven' if args.uneven else 'even'} shards, transport {comm.transport}"
        )
        head = f"#{'size':>11}{'count':>13}{'type':>10}{'redop':>8}{'root':>6}" + "".join(
            f"{'time':>9}{'algbw':>8}{'busbw':>8}{'#wrong':>7}" for _ in range(2)
        )
        if args.baseline:
            head += f"{'base':>9}{'ratio':>7}"
        say("#" + " " * 48 + "out-of-place".center(32) + "in-place".center(32))
        say(head)
        say(
            f"#{'(B)':>11}{'(elements)':>13}{'':>24}"
            + f"{'(us)':>9}{'(GB/s)':>8}{'(GB/s)':>8}{'':>7}" * 2
            + (f"{'(us)':>9}" if args.baseline else "")
        )
        size = args.minbytes
        while size <= args.maxbytes:
            case = Case(coll, size, args.datatype, args.op, comm, args.axis, args.uneven)
            fns: Dict[str, Callable[[], Any]] = {"oop": case.hpc, "ip": case.in_place}
            if args.baseline and case.raw is not None:
                fns["raw"] = case.raw
            iters = args.iters if case.nbytes < (1 << 24) else max(1, args.iters // 4)
            times = _time(comm, fns, iters, args.warmup, args.rounds)
            wrong = [comm.mpi.allreduce(case.wrong(ip), op=MPI.SUM) for ip in (False, True)]
            row: Dict[str, Any] = {
                "collective": coll,
                "size": case.nbytes,
                "count": case.count,
                "type": args.datatype.name,
                "redop": op,
                "root": -1,
            }
            # every field starts with a space, so a wide value never runs into its neighbour
            text = f" {case.nbytes:>11} {case.count:>12} {args.datatype.name:>9} {op:>7} {-1:>5}"
            for key, w in (("oop", wrong[0]), ("ip", wrong[1])):
                t = times[key]
                algbw = case.nbytes / 1e9 / t
                busbw = algbw * _BUS[coll](P)
                row[key] = {"time_us": t * 1e6, "algbw": algbw, "busbw": busbw, "wrong": w}
                text += f" {t * 1e6:>8.1f} {algbw:>7.2f} {busbw:>7.2f} {w:>6}"
            if args.baseline:
                if "raw" in times:
                    row["baseline_us"] = times["raw"] * 1e6
                    row["ratio"] = times["oop"] / times["raw"]
                    text += f" {times['raw'] * 1e6:>8.1f} {row['ratio']:>6.3f}"
                else:
                    text += f" {'n/a':>8} {'-':>6}"  # no raw MPI equivalent (avg, 16-bit floats, bool)
            say(text)
            rows.append(row)
            size *= args.stepfactor
    wrong = sum(r[k]["wrong"] for r in rows for k in ("oop", "ip"))
    say(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    avg = statistics.mean(r["oop"]["busbw"] for r in rows) if rows else 0.0
    say(f"# Avg bus bandwidth    : {avg:.4g}")
    say("#")
    return rows


def _plot(rows: List[Dict[str, Any]], path: str, ranks: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for coll in COLLECTIVES:
        mine = [r for r in rows if r["collective"] == coll]
        if not mine:
            continue
        sizes = [r["size"] for r in mine]
        ax.plot(sizes, [r["oop"]["busbw"] for r in mine], marker="o", label=f"{coll} (hpccoll)")
        base = [
            (r["size"], r["size"] / 1e9 / (r["baseline_us"] / 1e6) * _BUS[coll](ranks))
            for r in mine
            if "baseline_us" in r
        ]
        if base:
            ax.plot(*zip(*base), linestyle="--", marker="x", label=f"{coll} (raw mpi4py)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size S (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"hpccoll bench, {ranks} ranks")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parser() -> argparse.ArgumentParser:
    """The ``bench`` options, modelled on nccl-tests."""
    p = argparse.ArgumentParser(
        prog="python -m hpccoll bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("8"), help="smallest size (default 8)")
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("32M"), help="largest size (default 32M)")
    p.add_argument("-f", "--stepfactor", type=int, default=2, help="size multiplier between rows (default 2)")
    p.add_argument("-c", "--collective", choices=COLLECTIVES + ("all",), default="all", help="default all")
    p.add_argument(
        "-d",
        "--datatype",
        type=_dtype,
        default=np.dtype(np.float32),
        help="float32 (default), float64, float16, bfloat16, int32, ... (nccl-tests names work too)",
    )
    p.add_argument("-o", "--op", choices=("sum", "prod", "max", "min", "avg"), default="sum", help="default sum")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per round (default 20)")
    p.add_argument("-w", "--warmup", type=int, default=5, help="warm-up iterations (default 5)")
    p.add_argument("-r", "--rounds", type=int, default=3, help="interleaved rounds; the median is shown (default 3)")
    p.add_argument("--transport", default="auto", help="transport name (default auto)")
    p.add_argument("--axis", type=int, choices=(0, 1), default=0, help="gather/scatter axis of the arrays")
    p.add_argument("--uneven", action="store_true", help="rank r holds a share proportional to r + 1")
    p.add_argument("--baseline", action="store_true", help="also time raw mpi4py calls, interleaved")
    p.add_argument("--json", metavar="FILE", help="write the rows to FILE (rank 0)")
    p.add_argument("--plot", metavar="FILE.png", help="plot bus bandwidth vs size (needs matplotlib)")
    return p


def main(argv: Any = None) -> int:
    """Run the benchmark; rank 0 prints. Exit status 1 if any result was wrong."""
    import hpccoll

    args = parser().parse_args(argv)
    if args.stepfactor < 2 or args.minbytes < 1 or args.maxbytes < args.minbytes:
        parser().error("expected 1 <= minbytes <= maxbytes and stepfactor >= 2")
    comm = hpccoll.Communicator(transport=args.transport)
    say = (lambda line: print(line, flush=True)) if comm.rank == 0 else (lambda line: None)
    say(
        f"# hpccoll {hpccoll.__version__} bench: mpiexec -n {comm.size} python -m hpccoll bench "
        + " ".join(sys.argv[2:] if argv is None else argv)
    )
    rows = run(args, comm, say)
    if comm.rank == 0 and args.json:
        with open(args.json, "w") as fh:
            json.dump({"ranks": comm.size, "rows": rows}, fh, indent=1)
    if comm.rank == 0 and args.plot:
        _plot(rows, args.plot, comm.size)
    bad = any(r[k]["wrong"] for r in rows for k in ("oop", "ip"))
    comm.free()
    return 1 if bad else 0
