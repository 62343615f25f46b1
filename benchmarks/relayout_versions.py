"""The NumPy block relayout of the working tree against another revision's, interleaved in one process.

Run: ``python benchmarks/relayout_versions.py --before REV [--leads 16,64,1024] [--runs 8192,65536]``.

Each case copies a float64 array split along axis 1 (``lead`` rows, blocks of ``run`` bytes per row; 2 and
4 even blocks, 3 uneven ones) to the flat wire buffer and back with ``hpccoll._relayout.copy_blocks``, the
revision's and the tree's in alternating order, 9 rounds. ``after/before`` is the median of the same-round
ratios, ``floor`` the revision's copy timed twice (the noise floor). Both copies are checked to give the
same bytes.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from bench_versions import load_before
from mpi4py import MPI

from hpccoll._relayout import copy_blocks as after


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="the git revision to compare against")
    p.add_argument("--leads", default="16,64,1024", help="rows per array, comma-separated")
    p.add_argument("--runs", default="8192,65536,262144", help="bytes per block and row, comma-separated")
    args = p.parse_args()
    before = load_before(args.before, MPI.COMM_SELF)._relayout.copy_blocks

    print(f"# python benchmarks/relayout_versions.py {' '.join(sys.argv[1:])}")
    for lead in map(int, args.leads.split(",")):
        for run in map(int, args.runs.split(",")):
            for sizes in ([1, 1], [1, 1, 1, 1], [1, 2, 1]):
                arr = np.random.rand(lead, sum(sizes), run // 8)
                buf, back = np.empty(arr.size), np.empty_like(arr)
                reps = max(3, min(2000, int(2e7 // arr.nbytes)))

                def timed(copy) -> float:
                    t0 = time.perf_counter_ns()
                    for _ in range(reps):
                        copy(buf, arr, np, 1, sizes, True)
                        copy(buf, back, np, 1, sizes, False)
                    return (time.perf_counter_ns() - t0) / reps

                after(buf, arr, np, 1, sizes, True)
                want = buf.copy()
                before(buf, arr, np, 1, sizes, True)
                assert (want == buf).all()
                t = {"before": [], "after": [], "again": []}
                for r in range(9):
                    order = ("before", "after", "again") if r % 2 else ("after", "again", "before")
                    for k in order:
                        t[k].append(timed(after if k == "after" else before))
                ratio = np.median(np.array(t["after"]) / np.array(t["before"]))
                floor = np.median(np.array(t["again"]) / np.array(t["before"]))
                kind = f"{len(sizes)} {'even' if len(set(sizes)) == 1 else 'uneven'}"
                print(
                    f"lead {lead:5d} run {run:7d} B {kind:>8}: before {np.median(t['before']) / 1e3:9.2f} us"
                    f"  after/before {ratio:.3f}  floor {floor:.3f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
