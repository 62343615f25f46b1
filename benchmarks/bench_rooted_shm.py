"""shm's rooted primitives against the host transport's and raw mpi4py's, side by side in one run.

Launch:

    mpiexec -n 2 python -m mpi4py benchmarks/bench_rooted_shm.py [--max-bytes 16M] [--rounds 11] [--json FILE]

For each size S (float64 bytes of the whole buffer) and root 0, every row times,
interleaved round by round on the same buffers (:func:`hpccoll._timing.interleave`:
barrier before each batch, the slowest rank's time, median over rounds):

- ``shm``: ``SharedMemory.bcast`` / ``SharedMemory.reduce`` moving the message
  itself (the transport named, so :attr:`SharedMemory.wins` does not apply);
- ``host``: the same primitive on ``Communicator.host_transport()`` (what shm
  hands messages outside its ``wins`` to);
- ``raw``: mpi4py's ``Bcast`` / ``Reduce`` on the same buffers.

Ratios are paired (the median over rounds of the two times within one round):
``shm/host`` and ``shm/raw`` below 1 mean shm is faster. A ``wins`` range for a
rooted primitive should come from sizes where both stay clearly below 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable, Dict, List

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import hpccoll  # noqa: E402
from hpccoll._timing import interleave, medians, paired_ratio  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_quick import human, parse_bytes  # noqa: E402


def cases(c: hpccoll.Communicator, primitive: str, n: int) -> Dict[str, Callable[[], Any]]:
    """The three callables of one row: shm, host, raw, on the same buffers."""
    shm, host, raw = c.transport_instance("shm"), c.host_transport(), c.mpi
    x = np.random.default_rng(c.rank).standard_normal(n)
    y = np.empty(n)
    D = MPI.DOUBLE
    if primitive == "bcast":
        return {
            "shm": lambda: shm.bcast(x, 0),
            "host": lambda: host.bcast(x, 0),
            "raw": lambda: raw.Bcast([x, D], root=0),
        }
    return {
        "shm": lambda: shm.reduce(x, y, "sum", 0),
        "host": lambda: host.reduce(x, y, "sum", 0),
        "raw": lambda: raw.Reduce([x, D], [y, D], op=MPI.SUM, root=0),
    }


def main() -> None:
    """Run the table (every rank; rank 0 prints)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-bytes", type=parse_bytes, default=parse_bytes("4K"))
    ap.add_argument("--max-bytes", type=parse_bytes, default=parse_bytes("16M"))
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--primitives", default="bcast,reduce")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    c = hpccoll.Communicator(transport="shm")
    rows: List[Dict[str, Any]] = []
    if c.rank == 0:
        print(f"# {c.size} ranks, {MPI.Get_library_version().splitlines()[0]}")
        print(
            f"{'primitive':>9} {'bytes':>8} {'shm us':>9} {'host us':>9} {'raw us':>9} {'shm/host':>9} {'shm/raw':>8}"
        )
    for primitive in args.primitives.split(","):
        nbytes = args.min_bytes
        while nbytes <= args.max_bytes:
            n = nbytes // 8
            fns = cases(c, primitive, n)
            iters = max(3, min(300, int(3e7 // nbytes)))
            s = interleave(c, fns, iters=iters, rounds=args.rounds, warmup=min(iters, 5))
            t = medians(s)
            row = {
                "primitive": primitive,
                "bytes": nbytes,
                **{f"{k}_s": v for k, v in t.items()},
                "shm/host": paired_ratio(s, "shm", "host"),
                "shm/raw": paired_ratio(s, "shm", "raw"),
            }
            rows.append(row)
            if c.rank == 0:
                print(
                    f"{primitive:>9} {human(nbytes):>8} {t['shm'] * 1e6:9.1f} {t['host'] * 1e6:9.1f} "
                    f"{t['raw'] * 1e6:9.1f} {row['shm/host']:9.2f} {row['shm/raw']:8.2f}",
                    flush=True,
                )
            nbytes *= 2
    if args.json and c.rank == 0:
        with open(args.json, "w") as f:
            json.dump({"ranks": c.size, "rows": rows}, f, indent=1)
    c.free()


if __name__ == "__main__":
    main()
