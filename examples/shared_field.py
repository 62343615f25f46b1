"""A global field computed in slabs, all-gathered without copies, read whole by every rank.

Launch (2-4 ranks on one node; any number works):

    mpiexec -n 4 python -m mpi4py examples/shared_field.py [--n 1024] [--steps 10] [--mode both|shared|plain]

A time-dependent 2-D field on an n x n cell-centred grid is split by rows
(uneven slabs). Every step each rank

1. computes its slab of the field at time t -- with ``--mode shared`` straight
   into node-shared memory (``comm.shared_empty``);
2. all-gathers the field: ``all_gather(slab, out="shared")`` returns the slabs'
   own memory as one read-only array per node (no copy at all), where the plain
   version gives every rank its own copy;
3. reads the whole field: a 5-point Laplacian of its own rows (needing its
   neighbours' boundary rows) and bilinear interpolation at particles spread
   over the whole domain (needing any rank's rows).

Both are checked bit for bit against a serial computation on the full field.
It prints the time per step (max over ranks) and the memory one gathered field
adds once every rank has read all of it (PSS summed over the ranks, from
/proc/self/smaps_rollup, measured first thing in the process) for each version. Exit status 0 means every check passed on every rank.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from mpi4py import MPI

import hpccoll


def slab_of(t: float, lo: int, hi: int, n: int, out: np.ndarray) -> np.ndarray:
    """Rows ``[lo, hi)`` of the field at time ``t``, written into ``out``."""
    y = (np.arange(lo, hi) + 0.5)[:, None] / n
    x = (np.arange(n) + 0.5)[None, :] / n
    np.multiply(np.sin(2 * np.pi * (x - 0.1 * t)), np.cos(2 * np.pi * y), out=out)
    out += 0.5 * t * y
    return out


def laplacian(field: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """The 5-point Laplacian (edges clamped) of rows ``[lo, hi)``: it reads rows ``lo - 1`` and ``hi`` too."""
    n = field.shape[0]
    rows = field[np.clip(np.arange(lo - 1, hi + 1), 0, n - 1)]
    mid = rows[1:-1]
    left = np.concatenate([mid[:, :1], mid[:, :-1]], axis=1)
    right = np.concatenate([mid[:, 1:], mid[:, -1:]], axis=1)
    return (rows[:-2] + rows[2:] + left + right - 4 * mid) * (n * n)


def interpolate(field: np.ndarray, pts: np.ndarray) -> np.ndarray:
    """Bilinear interpolation of the cell-centred field at points in the unit square."""
    n = field.shape[0]
    u = np.clip(pts * n - 0.5, 0, n - 1 - 1e-9)
    i, j = u.astype(np.int64).T
    fy, fx = (u - np.floor(u)).T
    f00, f01, f10, f11 = field[i, j], field[i, j + 1], field[i + 1, j], field[i + 1, j + 1]
    return (f00 * (1 - fx) + f01 * fx) * (1 - fy) + (f10 * (1 - fx) + f11 * fx) * fy


def pss_mib() -> float:
    """This process's proportional set size (shared pages divided among their users), in MiB."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def run(comm: hpccoll.Communicator, mode: str, n: int, steps: int, rows: list, pts: np.ndarray) -> dict:
    """``steps`` steps of the slab -> gather -> read loop; timings, memory and the last step's reads."""
    rank = comm.rank
    lo, hi = sum(rows[:rank]), sum(rows[: rank + 1])
    gather_time = step_time = 0.0
    for step in range(steps):
        t = 0.1 * step
        comm.mpi.Barrier()
        t0 = time.perf_counter()
        slab = comm.shared_empty((hi - lo, n)) if mode == "shared" else np.empty((hi - lo, n))
        slab_of(t, lo, hi, n, slab)
        t1 = time.perf_counter()
        field = hpccoll.all_gather(slab, comm, sizes=rows, out="shared" if mode == "shared" else None)
        gather_time += time.perf_counter() - t1
        del slab
        lap = laplacian(field, lo, hi)
        vals = interpolate(field, pts)
        step_time += time.perf_counter() - t0
        if step < steps - 1:
            del field  # done with this step's field: the next step may reuse its memory

    per = 1.0 / max(steps, 1)
    return {
        "step": comm.mpi.allreduce(step_time * per, op=MPI.MAX),
        "gather": comm.mpi.allreduce(gather_time * per, op=MPI.MAX),
        "lap": lap,
        "vals": vals,
        "t": t,
    }


def field_memory(comm: hpccoll.Communicator, mode: str, n: int, rows: list) -> float:
    """MiB (PSS, summed over ranks) one gathered field adds once every rank has read all of it.

    Measured on a fresh communicator, so no memory kept from the loop (a
    shared result's segment waits in the node's pool for reuse) hides it.
    """
    with hpccoll.Communicator(comm.mpi) as c:
        lo, hi = sum(rows[: c.rank]), sum(rows[: c.rank + 1])
        tiny = c.shared_empty(1) if mode == "shared" else np.ones(1)  # set up the communicator's own buffers
        hpccoll.all_gather(tiny, c, out="shared" if mode == "shared" else None)
        del tiny
        c.mpi.Barrier()
        before = pss_mib()
        slab = c.shared_empty((hi - lo, n)) if mode == "shared" else np.empty((hi - lo, n))
        slab_of(0.0, lo, hi, n, slab)
        field = hpccoll.all_gather(slab, c, sizes=rows, out="shared" if mode == "shared" else None)
        del slab
        field.sum()
        c.mpi.Barrier()
        added = c.mpi.allreduce(pss_mib() - before, op=MPI.SUM)
        del field
    return added


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1024, help="grid points per side (default 1024: an 8 MiB field)")
    parser.add_argument("--steps", type=int, default=10, help="time steps per version (default 10)")
    parser.add_argument("--mode", choices=["both", "shared", "plain"], default="both")
    parser.add_argument("--particles", type=int, default=20000, help="interpolation points per rank")
    args = parser.parse_args(argv)
    comm = hpccoll.Communicator()
    rank, size = comm.rank, comm.size
    say = print if rank == 0 else (lambda *a, **k: None)
    n = args.n
    rows = [n // size + (1 if r < n % size else 0) for r in range(size)]
    rows[0], rows[-1] = rows[0] + size // 2, rows[-1] - size // 2  # uneven on purpose (numbers of rows still >= 0)
    pts = np.random.default_rng(rank).random((args.particles, 2))
    lo, hi = sum(rows[:rank]), sum(rows[: rank + 1])
    say(
        f"shared_field: {n} x {n} float64 field ({n * n * 8 / 2**20:.0f} MiB) in {size} slabs {rows}, "
        f"{args.steps} steps"
    )
    modes = ["shared", "plain"] if args.mode == "both" else [args.mode]
    failures = []
    results = {}
    # Memory first, in a fresh process: freed private arrays stay in the allocator's heap afterwards.
    memory = {mode: field_memory(comm, mode, n, rows) for mode in sorted(modes)}
    for mode in modes:
        results[mode] = r = run(comm, mode, n, args.steps, rows, pts)
        r["memory"] = memory[mode]
        whole = slab_of(r["t"], 0, n, n, np.empty((n, n)))  # the serial computation, on this rank
        ok = np.array_equal(r["lap"], laplacian(whole, lo, hi)) and np.array_equal(r["vals"], interpolate(whole, pts))
        ok = comm.mpi.allreduce(bool(ok), op=MPI.LAND)
        if not ok:
            failures.append(mode)
        say(
            f"  {mode:>6}: {r['step'] * 1e3:8.2f} ms per step, all_gather {r['gather'] * 1e3:8.3f} ms, "
            f"field memory, all ranks {r['memory']:7.1f} MiB (PSS)  [{'ok' if ok else 'FAILED'}: "
            "stencil and interpolation equal the serial run]"
        )
    if len(results) == 2:
        s, p = results["shared"], results["plain"]
        say(
            f"  shared vs plain: all_gather {p['gather'] / s['gather']:.1f}x faster, step "
            f"{p['step'] / s['step']:.2f}x, memory {p['memory'] / max(s['memory'], 1e-9):.1f}x less "
            f"(the plain version holds {size} copies of the field, the shared one 1 per node)"
        )
    comm.free()
    say("passed" if not failures else f"FAILED: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
