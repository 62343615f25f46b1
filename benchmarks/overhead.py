"""hpccoll's own cost per call: the collectives against a null MPI communicator, in one process.

Run: ``python benchmarks/overhead.py`` (no mpiexec).

A :class:`hpccoll.Communicator` of size 2 whose MPI calls do nothing stands
in for a real one, so what is timed is hpccoll's Python work alone --
validation, dispatch, output allocation, packing -- next to a "raw" line that
builds the same mpi4py call arguments and makes the same null call. The
difference is what hpccoll adds to every call, before any data moves; it
does not depend on the network, so it is steadier than a 2-rank timing (which
``benchmarks/bench_quick.py`` does for the real thing).
"""

from __future__ import annotations

import sys
import timeit

import numpy as np
from mpi4py import MPI

import hpccoll
from hpccoll._comm import Communicator


class NullMPI:
    """The mpi4py calls hpccoll's host transport makes, doing nothing."""

    def Allreduce(self, send, recv, op):  # noqa: N802 - mpi4py's names
        pass

    def Allgather(self, send, recv):  # noqa: N802
        pass

    def Reduce_scatter_block(self, send, recv, op):  # noqa: N802
        pass


def best_ns(stmt: str, env: dict, number: int) -> float:
    return min(timeit.repeat(stmt, globals=env, number=number, repeat=7)) / number * 1e9


def main() -> int:
    comm = Communicator(MPI.COMM_SELF)
    comm.size = 2  # as rank 0 of 2: the calls below move nothing, so no buffer needs the second half
    comm._mpi = null = NullMPI()
    x, out = np.ones(1), np.empty(1)
    big, gathered = np.ones(2), np.empty(2)
    many = [np.random.default_rng(i).standard_normal(128) for i in range(256)]
    env = dict(globals(), comm=comm, raw=null, x=x, out=out, big=big, gathered=gathered, many=many,
               D=MPI.DOUBLE, S=MPI.SUM)
    rows = [
        ("all_reduce, out=", "raw.Allreduce([x, D], [out, D], S)", "hpccoll.all_reduce(x, comm, out=out)"),
        ("all_reduce, allocating", "raw.Allreduce([x, D], [np.empty(1), D], S)", "hpccoll.all_reduce(x, comm)"),
        ("all_reduce, in place", "raw.Allreduce(MPI.IN_PLACE, [x, D], S)", "hpccoll.all_reduce(x, comm, out=x)"),
        ("all_gather, out=", "raw.Allgather([x, D], [gathered, D])",
         "hpccoll.all_gather(x, comm, sizes=[1, 1], out=gathered)"),
        ("all_gather, allocating", "raw.Allgather([x, D], [np.empty(2), D])",
         "hpccoll.all_gather(x, comm, sizes=[1, 1])"),
        ("reduce_scatter, out=", "raw.Reduce_scatter_block([big, D], [out, D], S)",
         "hpccoll.reduce_scatter(big, comm, out=out)"),
        ("reduce_scatter, allocating", "raw.Reduce_scatter_block([big, D], [np.empty(1), D], S)",
         "hpccoll.reduce_scatter(big, comm)"),
    ]
    print(f"# hpccoll {hpccoll.__version__}: Python cost per call against a null MPI communicator "
          f"(best of 7 repeats; Python {sys.version.split()[0]}, NumPy {np.__version__})")
    print(f"{'call (1 float64)':<28}{'raw (ns)':>10}{'hpccoll (ns)':>14}{'added (ns)':>12}")
    for name, raw_stmt, stmt in rows:
        t_raw, t = best_ns(raw_stmt, env, 100_000), best_ns(stmt, env, 100_000)
        print(f"{name:<28}{t_raw:>10.0f}{t:>14.0f}{t - t_raw:>12.0f}")
    print()
    for name, stmt in (
        ("list all_reduce of 256 arrays of 1 KiB", "hpccoll.all_reduce(many, comm)"),
        ("list all_gather of 256 arrays of 1 KiB", "hpccoll.all_gather(many, comm, sizes=[128, 128])"),
        ("list reduce_scatter of 256 arrays of 1 KiB", "hpccoll.reduce_scatter(many, comm)"),
    ):
        t_list = best_ns(stmt, env, 300)
        print(f"{name + ':':<44}{t_list / 1e3:>7.1f} us ({t_list / 256:.0f} ns per array)")
    print("(checks, packing into kept scratch buffers, one new result array, 256 views of it)")
    comm._mpi = MPI.COMM_SELF  # not ours to free: restore something Communicator.free can skip
    comm._owned = False
    return 0


if __name__ == "__main__":
    sys.exit(main())
