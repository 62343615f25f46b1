"""The cost of the HPCCOLL_TIMEOUT watchdog: the same calls with and without it, interleaved.

Launch (2 ranks is the reference setting):

    mpiexec -n 2 python -m mpi4py benchmarks/watchdog.py [--rounds 11]

Two Communicators over the same ranks, one made with ``HPCCOLL_TIMEOUT`` set,
time the same calls round after round, taking turns to go first; the table
shows the median time per call (max over ranks) and the ratio. A first line isolates the watchdog's own
work (registering and clearing a deadline) on a one-rank ``MPI_Allreduce``
over ``COMM_SELF``, where there is nothing else to wait for.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import hpccoll
from hpccoll.transports._control import run


def communicators(base: MPI.Intracomm):
    """(plain, watched) Communicators over ``base``."""
    saved = os.environ.pop("HPCCOLL_TIMEOUT", None)
    try:
        plain = hpccoll.Communicator(base)
        os.environ["HPCCOLL_TIMEOUT"] = "600"
        watched = hpccoll.Communicator(base)
    finally:
        os.environ.pop("HPCCOLL_TIMEOUT")
        if saved is not None:
            os.environ["HPCCOLL_TIMEOUT"] = saved
    return plain, watched


def per_call(fn, comm, reps: int) -> float:
    comm.mpi.Barrier()
    start = time.perf_counter()
    for _ in range(reps):
        fn(comm)
    return (time.perf_counter() - start) / reps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11, help="interleaved rounds per row (default 11)")
    args = parser.parse_args(argv)
    plain, watched = communicators(MPI.COMM_WORLD)
    P, say = plain.size, print if plain.rank == 0 else (lambda *a, **k: None)

    one = np.ones(1)
    selves = communicators(MPI.COMM_SELF)
    self_times = [
        [per_call(lambda c: run(c, "Allreduce", one, np.empty(1)), c, 20000) for c in selves]
        for _ in range(args.rounds)
    ]
    bare, dog = (statistics.median(t[i] for t in self_times) for i in (0, 1))
    say(
        f"watchdog bookkeeping per MPI call (COMM_SELF Allreduce, 1 rank): {bare * 1e6:.2f} us -> {dog * 1e6:.2f} us "
        f"(+{(dog - bare) * 1e6:.2f} us)\n"
    )
    say(f"| {P} ranks | bytes per rank | no watchdog (us) | HPCCOLL_TIMEOUT set (us) | ratio |")
    say("|---|---:|---:|---:|---:|")
    for nbytes in (8, 64 << 10, 16 << 20):
        n = max(1, nbytes // 8)
        x, xs = np.ones(n), np.ones(n * P)
        reps = max(5, min(2000, int(2e8 // nbytes) // 8))
        for name, fn in (
            ("all_reduce", lambda c: hpccoll.all_reduce(x, c)),
            ("all_gather", lambda c: hpccoll.all_gather(x, c, sizes=[n] * P)),
            ("reduce_scatter", lambda c: hpccoll.reduce_scatter(xs, c)),
        ):
            times = []
            for i in range(args.rounds):  # alternate which goes first, so drifts in the machine's load cancel
                first, second = (plain, watched) if i % 2 == 0 else (watched, plain)
                t = {first: per_call(fn, first, reps), second: per_call(fn, second, reps)}
                times.append((t[plain], t[watched]))
            a, b = (plain.mpi.allreduce(statistics.median(t[i] for t in times), op=MPI.MAX) for i in (0, 1))
            say(f"| {name} | {nbytes} | {a * 1e6:.1f} | {b * 1e6:.1f} | {b / a:.2f} |")
    for c in (plain, watched) + selves:
        c.free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
