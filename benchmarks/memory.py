"""Peak memory of the collectives at 64 MiB, and a leak check over 10,000 calls.

Launch (2 ranks is the reference setting; any number works):

    mpiexec -n 2 python -m mpi4py benchmarks/memory.py [--mib 64] [--calls 10000] [--json FILE]

**Peak.** Each case allocates its input, then measures one call twice:

- ``traced``: the peak of Python's ``tracemalloc`` during the call, above what
  was allocated before it. NumPy reports its data buffers to tracemalloc, so
  this is exactly what hpccoll allocated: the output and any packing buffer
  (MPI's own buffers are not seen);
- ``rss``: the resident-set high-water mark (``VmHWM``, reset through
  ``/proc/self/clear_refs``) during the call, above the resident size before
  it. It sees everything, MPI's temporary buffers and shared-memory pages
  included, and anything the allocator keeps.

The bound is the issue's: output + one packing buffer, above the input that
exists already (a packing buffer is at most as large as the input or output,
at the width that travels: 16-bit floats reduce in float32, so theirs is twice
as large). ``traced`` must stay within it; ``rss`` shows what MPI adds.

**Leaks.** A mixed loop of every collective and adjoint, with derived
datatypes, check mode (errors raised and caught included), ``Communicator``
splits and raw mpi4py communicators that are split, used and freed, runs
``--calls`` rounds after a warm-up, twice: once watching ``VmRSS`` and an MPI
handle probe (MPI reuses freed handle slots before it grows its tables, so a
fresh datatype's and communicator's handle grows only if hpccoll leaves objects
behind; Open MPI's datatypes are gauged by the C heap instead, see
``handle_probe``), once
watching tracemalloc's current size.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import gc
import json
import sys
import time
import tracemalloc
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
from mpi4py import MPI

import hpccoll
from hpccoll.transports.host_mpi import HostMPI

MiB = 1 << 20


def vm(key: str) -> int:
    """``/proc/self/status`` field ``key`` (VmRSS, VmHWM) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


# --------------------------------------------------------------------------- peak


def cases(
    comm: hpccoll.Communicator, nbytes: int
) -> List[Tuple[str, Callable[[], Any], Callable[[Any], Any], Callable[[int, int], int]]]:
    """(name, make the input, the call, the packing buffers it may use: bytes from input and output bytes)."""
    P, n = comm.size, nbytes // 8
    rows = 1024
    none = lambda i, o: 0  # noqa: E731
    return [
        ("all_gather axis 0", lambda: np.ones(n), lambda x: hpccoll.all_gather(x, comm, sizes=[n] * P), none),
        (
            "all_gather axis 1 (datatypes)",
            lambda: np.ones((rows, n // rows)),
            lambda x: hpccoll.all_gather(x, comm, axis=1, sizes=[n // rows] * P),
            none,
        ),
        # extents 1, 2, ..., P along the last axis: pieces too small for derived datatypes, so it packs
        (
            "all_gather axis 1 uneven (packs)",
            lambda: np.ones((n // P, comm.rank + 1)),
            lambda x: hpccoll.all_gather(x, comm, axis=1),
            lambda i, o: o,
        ),
        (
            "all_gather strided input",
            lambda: np.ones(2 * n)[::2],
            lambda x: hpccoll.all_gather(x, comm, sizes=[n] * P),
            lambda i, o: i,
        ),
        ("reduce_scatter axis 0", lambda: np.ones(n), lambda x: hpccoll.reduce_scatter(x, comm), none),
        (
            "reduce_scatter axis 1 (packs)",
            lambda: np.ones((rows, n // rows)),
            lambda x: hpccoll.reduce_scatter(x, comm, axis=1),
            lambda i, o: i,
        ),
        # 16-bit floats reduce in float32: the packed input and the received block are both twice as wide
        (
            "reduce_scatter float16 (widens)",
            lambda: np.ones(4 * n, np.float16),
            lambda x: hpccoll.reduce_scatter(x, comm),
            lambda i, o: 2 * i + 2 * o,
        ),
        ("all_reduce", lambda: np.ones(n), lambda x: hpccoll.all_reduce(x, comm), none),
        ("all_reduce in place", lambda: np.ones(n), lambda x: hpccoll.all_reduce(x, comm, out=x), none),
    ]


def measure_peak(comm: hpccoll.Communicator, nbytes: int) -> List[Dict[str, Any]]:
    rows = []
    for name, make, call, pack in cases(comm, nbytes):
        x = make()
        x_bytes = x.nbytes
        out_bytes = call(x).nbytes  # warm-up: plans, datatypes, MPI's own first-use buffers
        in_place = "in place" in name
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        result = call(x)
        traced = tracemalloc.get_traced_memory()[1] - before
        tracemalloc.stop()
        del result
        gc.collect()
        comm.mpi.Barrier()
        rss_before = vm("VmRSS")
        reset_hwm()
        result = call(x)
        rss = vm("VmHWM") - rss_before
        del result, x
        bound = (0 if in_place else out_bytes) + pack(x_bytes, out_bytes)
        row = {"case": name, "input": x_bytes, "output": out_bytes, "bound": bound, "traced": traced, "rss": rss}
        rows.append({k: comm.mpi.allreduce(v, op=MPI.MAX) if isinstance(v, int) else v for k, v in row.items()})
    return rows


# --------------------------------------------------------------------------- leaks


def handle_probe(count: int = 16) -> Tuple[int, int]:
    """Gauges of the MPI datatypes and communicators alive, each up to a constant: ``(datatypes, communicators)``.

    Each is the largest handle value among ``count`` fresh datatypes and
    communicators (then freed). MPICH reuses the free slots of its handle
    tables before it grows them, and Open MPI hands out the lowest free slot of
    its Fortran handle tables, so these stay put unless something keeps slots
    occupied: a leak.
    Open MPI gives a *datatype* its Fortran slot only when the handle is first
    converted (``MPI_Type_c2f``), so a leaked datatype holds none; there the
    datatype gauge is the C heap in use (glibc's ``mallinfo2``, after a garbage
    collection) in units of what one fresh datatype takes, which a leaked
    datatype (or any other C memory left behind) grows.
    """
    types = [MPI.BYTE.Create_contiguous(1) for _ in range(count)]
    comms = [MPI.COMM_SELF.Dup() for _ in range(count)]
    probe = max(t.py2f() & 0xFFFFFFFF for t in types), max(c.py2f() & 0xFFFFFFFF for c in comms)
    for obj in types + comms:
        obj.Free()
    if "Open MPI" in MPI.Get_library_version():
        probe = _heap_in_datatypes(count), probe[1]
    return probe


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@functools.lru_cache(maxsize=None)
def _mallinfo2() -> Callable[[], _Mallinfo2]:
    try:
        call = ctypes.CDLL(None).mallinfo2  # glibc 2.33 or later
    except AttributeError:
        raise RuntimeError(
            "handle_probe: Open MPI's datatypes are counted by glibc's mallinfo2, which this C library lacks"
        ) from None
    call.restype = _Mallinfo2
    return call


def _heap_bytes() -> int:
    """Bytes of C heap in use (``malloc`` arenas; Python's small objects live outside them), after a collection."""
    gc.collect()
    return _mallinfo2()().uordblks


@functools.lru_cache(maxsize=None)
def _datatype_bytes(count: int) -> int:
    """The heap one fresh datatype takes (measured once, so that every reading uses the same unit)."""
    before = _heap_bytes()
    types = [MPI.BYTE.Create_contiguous(1) for _ in range(count)]
    taken = _heap_bytes() - before
    for t in types:
        t.Free()
    return max(taken // count, 1)


def _heap_in_datatypes(count: int) -> int:
    unit = _datatype_bytes(count)  # before the reading: the first measurement may grow MPI's tables
    return _heap_bytes() // unit


def mixed_calls(comm: hpccoll.Communicator, checked: hpccoll.Communicator, i: int) -> None:
    """One round of every collective and adjoint, small and varied (round ``i``)."""
    P, r = comm.size, comm.rank
    x = np.full((3, r + 1 + i % 2), float(i))
    hpccoll.all_gather(x, comm, axis=1)
    hpccoll.all_gather_adjoint(np.ones((3, 2 * P)), comm, axis=1)
    hpccoll.reduce_scatter(np.ones((2 * P + 1, 5), np.float16), comm, op="avg")
    hpccoll.reduce_scatter_adjoint(np.ones((2, 3)), checked, axis=0)
    y = np.ones(7)
    hpccoll.all_reduce(y, comm, out=y)
    hpccoll.all_reduce_adjoint(np.ones(3), checked, cotangent="replicated")
    hpccoll.all_reduce(np.ones((2, 3))[:, ::2], checked, op="max")
    try:  # a mismatch every round: the error path must not leak either
        hpccoll.all_reduce(np.ones(2 + (r == P - 1)), checked)
    except hpccoll.MismatchError:
        pass
    if i % 5 == 0:
        sub = comm.split(r % 2)
        hpccoll.all_gather(np.ones(2), sub)
        sub.free()
        raw = MPI.COMM_WORLD.Split(r % 2, r)  # the cached duplicate is freed with it
        hpccoll.all_reduce(np.ones(2), raw)
        raw.Free()


def leak_check(comm: hpccoll.Communicator, calls: int, warmup: int = 200) -> Dict[str, Any]:
    """Run :func:`mixed_calls` ``calls`` times, twice; what grew (max over ranks).

    The first pass watches ``VmRSS`` (after each quarter) and the MPI handle
    probe; the second, tracemalloc's current size (tracing costs memory of
    its own, so it is kept out of the first pass's RSS).
    """
    saved = HostMPI.strided_min_bytes, HostMPI.strided_min_piece
    HostMPI.strided_min_bytes = HostMPI.strided_min_piece = 0  # derived datatypes on every gather
    checked = hpccoll.Communicator(comm, check=True)
    quarters = [calls // 4] * 3 + [calls - 3 * (calls // 4)]
    try:
        for i in range(warmup):
            mixed_calls(comm, checked, i)
        gc.collect()
        probe0, rss = handle_probe(), [vm("VmRSS")]
        start = time.perf_counter()
        done = 0
        for quarter in quarters:
            for i in range(done, done + quarter):
                mixed_calls(comm, checked, i)
            done += quarter
            gc.collect()
            rss.append(vm("VmRSS"))
        seconds = time.perf_counter() - start
        probe1 = handle_probe()
        tracemalloc.start()
        for i in range(warmup):
            mixed_calls(comm, checked, i)
        gc.collect()
        traced0 = tracemalloc.get_traced_memory()[0]
        for i in range(calls):
            mixed_calls(comm, checked, i)
        gc.collect()
        traced1 = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
    finally:
        HostMPI.strided_min_bytes, HostMPI.strided_min_piece = saved
        checked.free()
    growth = {
        "rounds": calls,
        "seconds": seconds,
        "rss_growth": rss[-1] - rss[0],
        "rss_growth_after_first_quarter": rss[-1] - rss[1],
        "traced_growth": traced1 - traced0,
        "datatype_handle_growth": probe1[0] - probe0[0],
        "comm_handle_growth": probe1[1] - probe0[1],
    }
    return {k: comm.mpi.allreduce(v, op=MPI.MAX) for k, v in growth.items()}


def no_leak(leaks: Dict[str, Any]) -> bool:
    """The verdict: no MPI handles left behind, and no traced Python/NumPy memory growth beyond noise."""
    return (
        leaks["traced_growth"] < 64 * 1024 and leaks["datatype_handle_growth"] < 8 and leaks["comm_handle_growth"] < 8
    )


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64, help="input size per rank in MiB (default 64)")
    parser.add_argument("--calls", type=int, default=10_000, help="rounds of the leak loop (default 10000)")
    parser.add_argument("--json", help="also write the numbers to this file (rank 0)")
    args = parser.parse_args(argv)
    comm = hpccoll.Communicator()
    say = print if comm.rank == 0 else (lambda *a, **k: None)
    say(f"hpccoll {hpccoll.__version__}, {comm.size} ranks, {MPI.Get_library_version().splitlines()[0]}")
    peak = measure_peak(comm, args.mib * MiB)
    say(
        f"\nPeak memory of one call, {args.mib} MiB of input per rank (MiB, max over ranks; bound = output + one packing buffer)"
    )
    say("| case | input | output | bound | traced (hpccoll) | within bound | RSS high-water (all, MPI included) |")
    say("|---|---:|---:|---:|---:|---|---:|")
    ok = True
    for row in peak:
        within = row["traced"] <= row["bound"] + MiB // 16  # + small Python objects
        ok &= within
        say(
            f"| {row['case']} | {row['input'] / MiB:.0f} | {row['output'] / MiB:.0f} | {row['bound'] / MiB:.0f} | "
            f"{row['traced'] / MiB:.1f} | {'yes' if within else 'NO'} | {row['rss'] / MiB:.1f} |"
        )
    leaks = leak_check(comm, args.calls)
    say(f"\nLeak check: {leaks['rounds']} rounds of the mixed loop ({leaks['seconds']:.1f} s), growth max over ranks:")
    say(
        f"  RSS {leaks['rss_growth'] / 1024:.0f} KiB ({leaks['rss_growth_after_first_quarter'] / 1024:.0f} KiB after the "
        f"first quarter), tracemalloc {leaks['traced_growth'] / 1024:.1f} KiB, datatype handles "
        f"{leaks['datatype_handle_growth']}, communicator handles {leaks['comm_handle_growth']}"
    )
    ok &= no_leak(leaks)
    say(f"\n{'PASS' if ok else 'FAIL'}: peaks within bound, no growth")
    if args.json and comm.rank == 0:
        with open(args.json, "w") as f:
            json.dump({"peak": peak, "leaks": leaks}, f, indent=1)
    comm.free()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
