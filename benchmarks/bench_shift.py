"""shift against raw mpi4py, interleaved: ``mpiexec -n 2 python benchmarks/bench_shift.py [--rounds N]``.

Each round times, one after the other, raw ``Sendrecv``, raw ``Irecv``/``Isend``/``Waitall``, ``hpccoll.shift``
twice (the second is the floor: the same call timed again), the general path (``offset`` as a NumPy integer,
which the common branch does not take) and a plan; the table gives each one's median over rounds, the slowest
rank's time, as a ratio to raw ``Sendrecv``.
"""

import argparse
import time

import numpy as np
from mpi4py import MPI

import hpccoll

p = argparse.ArgumentParser()
p.add_argument("--rounds", type=int, default=11)
p.add_argument("--sizes", default="8,1024,262144,1048576", help="bytes, comma-separated")
args = p.parse_args()
c = hpccoll.Communicator()
m, P, r = c.mpi, c.size, c.rank
to, source = (r + 1) % P, (r - 1) % P
if r == 0:
    print(
        f"# shift / raw Sendrecv, {P} ranks, float64, {args.rounds} interleaved rounds, {MPI.Get_library_version().splitlines()[0]}"
    )
    print(
        f"# {'bytes':>8} {'Sendrecv us':>11} {'Irecv/Isend':>11} {'shift':>6} {'again':>6} {'floor':>6} {'general':>7} {'plan':>6}"
    )
for nbytes in map(int, args.sizes.split(",")):
    n = max(nbytes // 8, 1)
    x, out, y = np.ones(n), np.empty(n), np.empty(n)
    t = MPI.DOUBLE
    plan = hpccoll.plan(hpccoll.shift, x, c, out=out)
    fns = {
        "Sendrecv": lambda: m.Sendrecv([x, t], to, 0, [y, t], source, 0),
        "Irecv/Isend": lambda: MPI.Request.Waitall([m.Irecv([y, t], source, 1), m.Isend([x, t], to, 1)]),
        "shift": lambda: hpccoll.shift(x, c, out=out),
        "again": lambda: hpccoll.shift(x, c, out=out),
        "general": lambda: hpccoll.shift(x, c, out=out, offset=np.int64(1)),
        "plan": plan,
    }
    iters = max(20, min(2000, (16 << 20) // nbytes))
    times = {k: [] for k in fns}
    for _ in range(args.rounds):
        for k, f in fns.items():
            m.Barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                f()
            times[k].append(m.allreduce((time.perf_counter() - t0) / iters, op=MPI.MAX))
    med = {k: float(np.median(v)) for k, v in times.items()}
    base = med["Sendrecv"]
    if r == 0:
        q = {k: v / base for k, v in med.items()}
        print(
            f"  {nbytes:>8} {base * 1e6:>11.2f} {q['Irecv/Isend']:>11.2f} {q['shift']:>6.2f} {q['again']:>6.2f} "
            f"{med['shift'] / med['again']:>6.2f} {q['general']:>7.2f} {q['plan']:>6.2f}"
        )
    plan.free()
c.free()
