"""GPU benchmark: hpccoll against the raw calls it wraps, ratios side by side in one run.

Launch (``make bench-gpu`` runs both)::

    mpiexec -n 1 python -m mpi4py benchmarks/bench_gpu.py   # NCCL overhead, relayout, staged
    mpiexec -n 2 python -m mpi4py benchmarks/bench_gpu.py   # + staged through MPI; NCCL and the
                                                            #   uneven designs need a GPU per rank

Sections (each row: hpccoll, the reference, their ratio, the target of issue 12):

``nccl``      all_gather / reduce_scatter / all_reduce (float32, ``out=`` and ``sizes`` given; at one
              rank the transport itself) against ``NcclCommunicator.allGather/reduceScatter/allReduce``
              on the same communicator and buffers, then plans of all_gather and all_reduce against the
              same raw calls. Targets (issue 43): per call at <= 1 KiB, <= 1.3x unplanned and <= 1.05x
              planned; <= 1.01x at >= 64 MiB, where the rows give GB/s.
``uneven``    the NCCL transport's two uneven-shard designs (grouped, pad) and, as a floor, one raw
              allGather/reduceScatter of the padded size. Needs >= 2 ranks with a GPU each.
``relayout``  the axis != 0 relayout (``hpccoll._relayout.copy_blocks``, all_gather's unpacking) against
              a plain device-to-device copy of the same bytes, and against the relayout it replaced
              (one copyto of a 4-D view, or one per uneven block). Targets: >= 90% of the copy's GB/s
              at >= 64 MiB, <= 3x its time at 1 MiB.
``staged``    the staged transport's all-reduce against D2H + MPI Allreduce + H2D written by
              hand with pinned buffers. Target: <= 1.2x at every size.
``cuda_mpi``  (only where MPI is CUDA-aware, detected or HPCCOLL_CUDA_AWARE_MPI=1) against mpi4py's
              Allreduce on device buffers.

Times are per call: the slowest rank's mean over a timed loop that starts and ends with a stream
sync, the median of ``--rounds`` interleaved rounds (``hpccoll._timing``, as every benchmark here);
ratios and added microseconds are the medians of the same-round pairs. Without CuPy or a GPU the script says so and exits 0.
The transports' Python per call is also measured without a GPU: ``make bench-overhead``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np

KIB, MIB = 1 << 10, 1 << 20


def parse(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="1K,1M,64M", help="message sizes per rank, e.g. 1K,1M,64M,256M")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median is kept (default 3)")
    p.add_argument("--quick", action="store_true", help="a smoke run: small sizes, few iterations")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON (rank 0)")
    return p.parse_args(argv)


def nbytes(text: str) -> int:
    scale = {"K": KIB, "M": MIB, "G": 1 << 30}.get(text[-1].upper(), 1)
    return int(text.rstrip("KkMmGg")) * scale


class Bench:
    """Timing and the table; everything collective is called on every rank."""

    def __init__(self, cupy: Any, comm: Any, rounds: int, quick: bool) -> None:
        self.cp, self.comm, self.rounds, self.quick = cupy, comm, rounds, quick
        self.rows: List[Dict[str, Any]] = []

    def iters(self, size: int) -> int:
        if self.quick:
            return 3
        return 300 if size <= 64 * KIB else 50 if size <= 4 * MIB else 10

    def compare(
        self,
        section: str,
        case: str,
        size: int,
        ours: Callable[[], Any],
        ref: Callable[[], Any],
        target: str = "",
        bandwidth: bool = False,
    ) -> None:
        """Time ``ours`` and ``ref`` in interleaved rounds (``hpccoll._timing``) and record the medians."""
        from hpccoll import _timing

        samples = _timing.interleave(
            self.comm,
            {"ours": ours, "ref": ref},
            iters=self.iters(size),
            rounds=self.rounds,
            warmup=3,  # kernels compiled, buffers allocated, NCCL connected
            sync=lambda: self.cp.cuda.get_current_stream().synchronize(),
        )
        t = _timing.medians(samples)
        row = {
            "section": section,
            "case": case,
            "bytes": size,
            "hpccoll_s": t["ours"],
            "reference_s": t["ref"],
            "ratio": _timing.paired_ratio(samples, "ours", "ref"),
            "added_us": _timing.paired_difference(samples, "ours", "ref") * 1e6,
            "target": target,
        }
        if bandwidth:
            row["hpccoll_GBps"], row["reference_GBps"] = size / t["ours"] / 1e9, size / t["ref"] / 1e9
        self.rows.append(row)

    def note(self, section: str, text: str) -> None:
        self.rows.append({"section": section, "case": text})

    def report(self) -> str:
        lines = [
            f"{'section':9} {'case':58} {'size':>8} {'hpccoll':>11} {'reference':>11} {'ratio':>6} {'added':>9}  target"
        ]
        for r in self.rows:
            if "ratio" not in r:
                lines.append(f"{r['section']:9} {r['case']}")
                continue
            size = r["bytes"]
            label = f"{size // MIB}M" if size >= MIB else f"{size // KIB}K" if size >= KIB else f"{size}B"
            if "hpccoll_GBps" in r:
                a, b = f"{r['hpccoll_GBps']:.1f}GB/s", f"{r['reference_GBps']:.1f}GB/s"
            else:
                a, b = f"{r['hpccoll_s'] * 1e6:.1f}us", f"{r['reference_s'] * 1e6:.1f}us"
            lines.append(
                f"{r['section']:9} {r['case']:58} {label:>8} {a:>11} {b:>11} {r['ratio']:6.3f} "
                f"{r['added_us']:8.1f}u  {r['target']}"
            )
        return "\n".join(lines)


# --------------------------------------------------------------------------- sections


def bench_nccl(b: Bench, hpccoll: Any, sizes: List[int]) -> None:
    cp, comm = b.cp, b.comm
    choice = hpccoll.transports.choose_transport(comm, "cupy")
    if choice.name != "nccl":
        b.note("nccl", f"skipped: {choice.reason}")
        return
    t = comm.transport_instance("nccl")
    nc, stream, P = t.communicator, lambda: cp.cuda.get_current_stream().ptr, comm.size
    f32, SUM = t.nccl_datatype(np.float32), t.nccl_op("sum")
    for size in sizes:
        n = max(size // 4, 1)
        x, g, r = cp.ones(n, cp.float32), cp.empty(n * P, cp.float32), cp.empty(n, cp.float32)
        big = cp.ones(n * P, cp.float32)
        large = size >= 64 * MIB
        target = "<= 1.01x" if large else "<= 1.3x" if size <= KIB else ""
        even = [n] * P
        raw_gather = lambda: nc.allGather(x.data.ptr, g.data.ptr, n, f32, stream())  # noqa: E731
        raw_reduce = lambda: nc.allReduce(x.data.ptr, r.data.ptr, n, f32, SUM, stream())  # noqa: E731
        gather = hpccoll.plan(hpccoll.all_gather, x, comm, sizes=even, out=g)
        reduce = hpccoll.plan(hpccoll.all_reduce, x, comm, out=r)
        with gather, reduce:
            planned = "<= 1.01x" if large else "<= 1.05x" if size <= KIB else ""
            b.compare("nccl", "plan(all_gather, out=) vs allGather", size, gather, raw_gather, planned, large)
            b.compare("nccl", "plan(all_reduce, out=) vs allReduce", size, reduce, raw_reduce, planned, large)
        if P == 1:  # the API copies without communicating at one rank: time the transport itself
            b.compare(
                "nccl",
                "transport.allgatherv vs allGather (1 rank)",
                size,
                lambda: t.allgatherv(x, g, even),
                raw_gather,
                target,
                large,
            )
            b.compare(
                "nccl",
                "transport.reduce_scatter vs reduceScatter",
                size,
                lambda: t.reduce_scatter(big, r, even, "sum"),
                lambda: nc.reduceScatter(big.data.ptr, r.data.ptr, n, f32, SUM, stream()),
                target,
                large,
            )
            b.compare(
                "nccl",
                "transport.allreduce vs allReduce",
                size,
                lambda: t.allreduce(x, r, "sum"),
                raw_reduce,
                target,
                large,
            )
            continue
        b.compare(
            "nccl",
            "all_gather(sizes=, out=) vs allGather",
            size,
            lambda: hpccoll.all_gather(x, comm, sizes=even, out=g),
            raw_gather,
            target,
            large,
        )
        b.compare(
            "nccl",
            "reduce_scatter(out=) vs reduceScatter",
            size,
            lambda: hpccoll.reduce_scatter(big, comm, out=r),
            lambda: nc.reduceScatter(big.data.ptr, r.data.ptr, n, f32, SUM, stream()),
            target,
            large,
        )
        b.compare(
            "nccl",
            "all_reduce(out=) vs allReduce",
            size,
            lambda: hpccoll.all_reduce(x, comm, out=r),
            raw_reduce,
            target,
            large,
        )


def bench_uneven(b: Bench, hpccoll: Any, sizes: List[int]) -> None:
    cp, comm = b.cp, b.comm
    if comm.size < 2 or hpccoll.transports.choose_transport(comm, "cupy").name != "nccl":
        b.note("uneven", "skipped: needs >= 2 ranks with one GPU each (NCCL)")
        return
    t = comm.transport_instance("nccl")
    nc, f32, SUM, P = t.communicator, t.nccl_datatype(np.float32), t.nccl_op("sum"), comm.size
    for size in sizes:
        n = max(size // 4, 2)
        for name, counts in (
            ("halves", [n if r % 2 else n // 2 for r in range(P)]),
            ("one empty", [0] + [n] * (P - 1)),
            ("near-even", [n - r for r in range(P)]),
        ):
            widest, mine = max(counts), counts[comm.rank]
            send, recv = cp.ones(mine, cp.float32), cp.empty(sum(counts), cp.float32)
            pad_send, pad_recv = cp.ones(widest, cp.float32), cp.empty(widest * P, cp.float32)
            full, part = cp.ones(sum(counts), cp.float32), cp.empty(mine, cp.float32)
            pad_full, pad_part = cp.ones(widest * P, cp.float32), cp.empty(widest, cp.float32)
            stream = cp.cuda.get_current_stream().ptr
            for design in ("grouped", "pad"):

                def gather(design=design):
                    t.uneven = design
                    t.allgatherv(send, recv, counts)

                def scatter(design=design):
                    t.uneven = design
                    t.reduce_scatter(full, part, counts, "sum")

                b.compare(
                    "uneven",
                    f"allgatherv {design:7} {name} vs padded allGather",
                    size,
                    gather,
                    lambda: nc.allGather(pad_send.data.ptr, pad_recv.data.ptr, widest, f32, stream),
                )
                b.compare(
                    "uneven",
                    f"reduce_scatter {design:7} {name} vs padded reduceScatter",
                    size,
                    scatter,
                    lambda: nc.reduceScatter(pad_full.data.ptr, pad_part.data.ptr, widest, f32, SUM, stream),
                )
    t.uneven = "auto"


def bench_relayout(b: Bench, hpccoll: Any, sizes: List[int]) -> None:
    from relayout import replaced  # benchmarks/relayout.py: the relayout before issue 12, frozen

    from hpccoll._relayout import copy_blocks

    cp = b.cp
    parts = 4
    for size in sizes:
        if size < MIB:
            continue
        lead = 64
        trail = max(size // 4 // (lead * parts * 16), 1)
        shape = (lead, parts * 16, trail)  # all_gather along axis 1, 16 rows per rank on average
        flat, out = cp.ones(lead * parts * 16 * trail, cp.float32), cp.empty(shape, cp.float32)
        dst = cp.empty_like(flat)
        target = ">= 90% of its GB/s (ratio <= 1.11)" if size >= 64 * MIB else "<= 3x its time" if size <= MIB else ""
        for label, sizes_ in (("even", (16,) * parts), ("uneven", (8, 24, 16, 16))):
            b.compare(
                "relayout",
                f"axis=1 copy_blocks ({label}) vs D2D copy",
                flat.nbytes,
                lambda s=sizes_: copy_blocks(flat, out, cp, 1, s, False),
                lambda: dst.data.copy_from_device_async(flat.data, flat.nbytes),
                target,
                bandwidth=True,
            )
            b.compare(
                "relayout",
                f"axis=1 copy_blocks ({label}) vs the relayout it replaced",
                flat.nbytes,
                lambda s=sizes_: copy_blocks(flat, out, cp, 1, s, False),
                lambda s=sizes_: replaced(flat, out, cp, 1, s, False),
                "< 1",
                bandwidth=True,
            )


@contextlib.contextmanager
def transport_of(comm: Any, hpccoll: Any, name: str) -> Iterator[Any]:
    """A Communicator asking for transport ``name``, and that transport (freed afterwards)."""
    c = hpccoll.Communicator(comm.mpi, transport=name)
    try:
        yield c, c.transport_instance(name)
    finally:
        c.free()


def bench_staged(b: Bench, hpccoll: Any, sizes: List[int]) -> None:
    cp, comm = b.cp, b.comm
    with transport_of(comm, hpccoll, "staged") as (staged, t):
        for size in sizes:
            n = max(size // 4, 1)
            x, y = cp.ones(n, cp.float32), cp.empty(n, cp.float32)
            host_in = np.frombuffer(cp.cuda.alloc_pinned_memory(x.nbytes), np.float32, n)
            host_out = np.frombuffer(cp.cuda.alloc_pinned_memory(x.nbytes), np.float32, n)

            def by_hand() -> None:
                stream = cp.cuda.get_current_stream()
                x.data.copy_to_host_async(_addr(host_in), x.nbytes, stream)
                stream.synchronize()
                comm.mpi.Allreduce(host_in, host_out)
                y.data.copy_from_host_async(_addr(host_out), y.nbytes, stream)

            b.compare(
                "staged",
                "staged allreduce vs D2H+Allreduce+H2D by hand",
                size,
                lambda: t.allreduce(x, y, "sum"),
                by_hand,
                "<= 1.2x",
            )
            if comm.size > 1:
                b.compare(
                    "staged",
                    "all_reduce(transport='staged') vs by hand",
                    size,
                    lambda: hpccoll.all_reduce(x, staged, out=y),
                    by_hand,
                    "<= 1.2x",
                )


def bench_cuda_mpi(b: Bench, hpccoll: Any, sizes: List[int]) -> None:
    cp, comm = b.cp, b.comm
    from hpccoll.transports.cuda_mpi import cuda_aware

    aware = cuda_aware(comm)
    if not aware.aware:
        b.note("cuda_mpi", f"skipped: MPI is not known to be CUDA-aware ({aware.source})")
        return
    with transport_of(comm, hpccoll, "cuda_mpi") as (_, t):
        for size in sizes:
            n = max(size // 4, 1)
            x, y = cp.ones(n, cp.float32), cp.empty(n, cp.float32)

            def raw() -> None:
                cp.cuda.get_current_stream().synchronize()
                comm.mpi.Allreduce(x, y)

            b.compare(
                "cuda_mpi", "transport.allreduce vs mpi4py Allreduce", size, lambda: t.allreduce(x, y, "sum"), raw
            )


def _addr(a: np.ndarray) -> Any:
    import ctypes

    return ctypes.c_void_p(a.ctypes.data)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse(argv)
    try:
        import cupy

        gpus = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no CuPy, no driver or no GPU: nothing to measure here
        print(f"bench_gpu: skipped: needs CuPy and a CUDA GPU ({type(exc).__name__}: {exc})")
        return 0
    import hpccoll
    import hpccoll.transports
    from hpccoll._local import local_rank

    cupy.cuda.Device(local_rank()[0] % gpus).use()  # one GPU per rank where there are enough
    comm = hpccoll.Communicator()
    sizes = [nbytes(s) for s in ("1K,64K" if args.quick else args.sizes).split(",")]
    b = Bench(cupy, comm, 1 if args.quick else args.rounds, args.quick)
    for section in (bench_nccl, bench_uneven, bench_relayout, bench_staged, bench_cuda_mpi):
        section(b, hpccoll, sizes)
    if comm.rank == 0:
        dev = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
        name = dev.decode() if isinstance(dev, bytes) else dev
        print(
            f"# bench_gpu: {comm.size} rank(s), {gpus} GPU(s) visible ({name}), CuPy {cupy.__version__}, "
            f"{time.strftime('%Y-%m-%d %H:%M:%S')}"
        )
        print(b.report())
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(b.rows, fh, indent=1)
    comm.free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
