"""The axis != 0 block relayout: ``hpccoll._relayout.copy_blocks`` against the code it replaced.

Run: ``python benchmarks/relayout.py`` (NumPy, one process; ``--cupy`` on a GPU).

Each case copies between an array split along axis 1 and the flat wire
buffer (both directions, as all_gather's unpacking and reduce_scatter's
packing do), timed in alternating rounds -- replaced, new, new, replaced,
... -- and reports the best round of each and their ratio (new / replaced:
below 1 is faster). NumPy rounds are timed in the process's CPU time (a
shared machine's preemptions do not count); CuPy rounds in wall time. ``replaced`` is ``hpccoll._api._blocks`` as it was before
issue 12 (one ``copyto`` of a 4-D transposed view for even blocks, one
``copyto`` per block otherwise), kept as the baseline.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from hpccoll._arrays import prod
from hpccoll._relayout import copy_blocks, per_block


def replaced(buf: Any, arr: Any, xp: Any, ax: int, sizes: Sequence[int], to_flat: bool) -> None:
    """The relayout before issue 12 (the old ``hpccoll._api._blocks``), as the baseline.

    Even blocks of a C-contiguous array: one copy of a 4-D transposed view (frozen here); otherwise
    one ``copyto`` per block, which ``hpccoll._relayout.per_block`` still does unchanged.
    """
    lead, trail, parts, first = prod(arr.shape[:ax]), prod(arr.shape[ax + 1 :]), len(sizes), sizes[0]
    if all(s == first for s in sizes) and arr.flags.c_contiguous:
        grid = arr.reshape(lead, parts, first, trail)
        blocks = buf.reshape(parts, lead, first, trail).transpose(1, 0, 2, 3)
        if to_flat:
            xp.copyto(blocks, grid, casting="unsafe")
        else:
            xp.copyto(grid, blocks, casting="unsafe")
        return
    per_block(buf, arr, xp, ax, sizes, to_flat)


#: (lead, sizes along axis 1, trail, dtype[, memory order]): small to 16 MiB, even and uneven, narrow and
#: wide runs, and Fortran-ordered arrays (the path for other layouts).
CASES: List[Tuple] = [
    (2, (1, 1), 3, "float64"),
    (4, (2, 2, 2, 2), 2, "float32"),
    (64, (16, 16, 16, 16), 1, "float32"),
    (1024, (2, 2, 2, 2), 1, "float64"),
    (64, (16, 16, 16, 16), 64, "float32"),
    (64, (16, 16, 16, 16), 1024, "float32"),
    (4096, (1, 1, 1, 1), 3, "int16"),
    (4, (2, 1, 0, 3), 2, "float32"),
    (64, (8, 24, 16, 16), 1, "float32"),
    (1024, (2, 1, 3, 2), 4, "float64"),
    (64, (8, 24, 16, 16), 64, "float32"),
    (64, (8, 24, 16, 16), 1024, "float32"),
    (512, (3, 5, 0, 7, 1, 2, 6, 4), 8, "complex64"),
    (64, (16, 16, 16, 16), 4, "float32", "F"),
    (64, (8, 24, 16, 16), 4, "float32", "F"),
]


def best_of(fn: Callable[[], Any], number: int, sync: Callable[[], None], clock: Callable[[], float]) -> float:
    sync()
    start = clock()
    for _ in range(number):
        fn()
    sync()
    return (clock() - start) / number


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=7, help="alternating rounds; the best of each is kept")
    p.add_argument("--cupy", action="store_true", help="CuPy arrays on the current GPU instead of NumPy")
    args = p.parse_args(argv)
    if args.cupy:
        import cupy as xp

        sync, clock = xp.cuda.get_current_stream().synchronize, time.perf_counter
    else:  # the copies are this process's CPU work: its CPU time holds on a shared machine
        xp, sync, clock = np, (lambda: None), time.process_time
    what = "wall time" if args.cupy else "CPU time"
    print(
        f"# relayout along axis 1, {xp.__name__} {xp.__version__}, Python {sys.version.split()[0]}: {what}, "
        f"best of {args.rounds} alternating rounds; ratio = new / replaced"
    )
    print(
        f"{'lead':>5} {'sizes':<26} {'trail':>5} {'dtype':<12} {'bytes':>9} {'dir':<8}"
        f"{'replaced':>11} {'new':>11} {'ratio':>7}"
    )
    worst = 0.0
    for lead, sizes, trail, dtype, *order in CASES:
        shape = (lead, sum(sizes), trail)
        arr = xp.asarray(np.random.default_rng(0).standard_normal(shape).astype(dtype), order=(order or ["C"])[0])
        buf = xp.empty(arr.size, arr.dtype)
        number = max(3, min(20000, int(2e7 // max(arr.nbytes, 1) // 10)))
        for to_flat in (True, False):
            best = {replaced: float("inf"), copy_blocks: float("inf")}
            for r in range(args.rounds):  # alternating, and which goes first alternates too
                for fn in (replaced, copy_blocks) if r % 2 == 0 else (copy_blocks, replaced):
                    t = best_of(lambda: fn(buf, arr, xp, 1, sizes, to_flat), number, sync, clock)
                    best[fn] = min(best[fn], t)
            old, new = best[replaced], best[copy_blocks]
            worst = max(worst, new / old)
            label = ",".join(map(str, sizes))
            kind = dtype + (f" {order[0]}" if order else "")
            print(
                f"{lead:>5} {label:<26} {trail:>5} {kind:<12} {arr.nbytes:>9} "
                f"{'pack' if to_flat else 'unpack':<8}{old * 1e6:>9.2f}us {new * 1e6:>9.2f}us {new / old:>7.3f}"
            )
    print(f"# worst ratio {worst:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
