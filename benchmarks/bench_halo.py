"""hpccoll.halo_exchange against a hand-written mpi4py Isend/Irecv exchange of the same faces, in one run.

Launch (2 ranks is the reference setting; any number works):

    mpiexec -n 2 python benchmarks/bench_halo.py [--rounds 11] [--faces 8,1K,64K,1M]

The field is a 2-D float64 array split along axis 0 over a periodic 1-D process grid, halo 1: each rank
exchanges one row (the face) with each of its two neighbours, the code a stencil solver writes around every
sweep. The hand-written exchange posts two ``Irecv`` into the ghost rows and two ``Isend`` of the boundary rows
(contiguous, no packing) and waits for all four; hpccoll runs ``halo_exchange(u, grid, halo=1, out=u)`` in place,
with the default transport (``auto``) and with ``transport="mpi"``; ``plan`` is
``hpccoll.plan(hpccoll.halo_exchange, u, grid, out=u, halo=1)`` made once and called, against ``raw pers``, the
same four messages as persistent requests written by hand (``Recv_init``/``Send_init``, ``Startall``/``Waitall``).
The unplanned calls repeat one in-place call, so from its second call on they run the exchange the
communicator keeps prepared (see ``hpccoll.collectives.halo``): one small ``Allreduce`` and the prepared
messages. ``shared`` is the same field allocated by ``Communicator.shared_empty`` (node-shared memory) and
exchanged in place with ``auto``: each rank reads its neighbours' boundary rows straight from their memory
(one node sync before, one after, no message); ``/hand`` is its ratio to the hand-written exchange.
``1 copy`` is no exchange at all: the same two faces copied by NumPy from another array of the field's
shape into the ghost rows, on every rank at once (the least any method that fills the ghosts must do, with
the same memory traffic: where the faces outgrow the caches, ``shared`` and the hand-written exchange both
run at this floor); ``/hand`` its ratio to the hand-written exchange.
``nbr a2aw`` is the same exchange written as one raw ``Neighbor_alltoallw`` on a periodic MPI Cartesian
communicator (a row datatype, byte displacements into the field), the neighbourhood-collective alternative
to the ``Isend``/``Irecv`` pairs; ``nbr pers`` its MPI-4 persistent form (``Neighbor_alltoallw_init``),
``/pers`` against the persistent ``Isend``/``Irecv`` pairs by hand.
Every column but ``shared`` runs on the same field buffer (each exchange is idempotent: it rewrites the
ghosts from boundary rows it never changes): on separate copies, where each copy's pages lay moved the ratios
at 1 MiB by up to 1.7x between runs. Times: per call, the slowest rank's, median
over interleaved rounds (hpccoll._timing); ratios: the median of the same-round ratios; raw/raw: the
hand-written exchange timed twice per round (the noise floor).
"""

from __future__ import annotations

import argparse
import os
import sys

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import hpccoll  # noqa: E402
from hpccoll import _timing  # noqa: E402


def parse_bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20}
    text = text.strip().upper().rstrip("B")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1:] in units else int(text)


def human(n: int) -> str:
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:g} {unit}"
    return f"{n} B"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11, help="interleaved rounds per size (default 11)")
    parser.add_argument("--faces", default="8,1K,64K,1M", help="bytes per face, comma-separated (default 8,1K,64K,1M)")
    parser.add_argument("--rows", type=int, default=8, help="owned rows per rank (default 8)")
    args = parser.parse_args(argv)
    world = MPI.COMM_WORLD
    raw = world.Dup()
    topo = world.Create_cart([world.size], periods=[True])  # for the neighbourhood collective
    auto = hpccoll.Communicator(world).cartesian([world.size], periodic=True)
    mpi = hpccoll.Communicator(world, transport="mpi").cartesian([world.size], periodic=True)
    lower, upper = auto.neighbours(0)
    say = print if world.rank == 0 else (lambda *a, **k: None)
    say(f"# hpccoll {hpccoll.__version__}, {MPI.Get_library_version().splitlines()[0].strip()}, {world.size} ranks")
    say(
        f"# command: mpiexec -n {world.size} python benchmarks/bench_halo.py {' '.join(sys.argv[1:] if argv is None else argv)}"
    )
    header = (
        f"{'face':>9}{'hand-written':>14}{'auto':>10}{'ratio':>7}{'mpi':>10}{'ratio':>7}{'added mpi':>11}"
        f"{'raw pers':>10}{'plan':>9}{'ratio':>7}{'/pers':>7}{'shared':>9}{'/hand':>7}"
        f"{'1 copy':>9}{'/hand':>7}{'nbr a2aw':>10}{'/hand':>7}{'nbr pers':>10}{'/pers':>7}{'raw/raw':>9}"
    )
    say(header)
    say("-" * len(header))
    for face in (parse_bytes(s) for s in args.faces.split(",") if s.strip()):
        m = max(1, face // 8)
        u = np.random.default_rng(world.rank).standard_normal((args.rows + 2, m))
        D = MPI.DOUBLE

        def hand(u=u) -> None:
            MPI.Request.Waitall(
                [
                    raw.Irecv([u[0], D], source=lower, tag=1),
                    raw.Irecv([u[-1], D], source=upper, tag=2),
                    raw.Isend([u[1], D], dest=lower, tag=2),
                    raw.Isend([u[-2], D], dest=upper, tag=1),
                ]
            )

        nb = u
        row = D.Create_contiguous(m).Commit()
        rb = m * 8  # bytes per row
        # the neighbourhood collective on the same rows: to/from the lower neighbour first (MPI's order)
        nbr_send = [nb, ([1, 1], [rb, args.rows * rb]), [row, row]]
        nbr_recv = [nb, ([1, 1], [0, (args.rows + 1) * rb]), [row, row]]

        def neighbourhood() -> None:
            topo.Neighbor_alltoallw(nbr_send, nbr_recv)

        nbr_fixed = topo.Neighbor_alltoallw_init(nbr_send, nbr_recv)  # MPI-4 persistent neighbourhood collective

        def neighbourhood_persistent() -> None:
            nbr_fixed.Start()
            nbr_fixed.Wait()

        w = u  # every exchange of the field runs on the same buffer (its placement moved ratios by 0.3x)
        fixed = [
            raw.Recv_init([w[0], D], source=lower, tag=1),
            raw.Recv_init([w[-1], D], source=upper, tag=2),
            raw.Send_init([w[1], D], dest=lower, tag=2),
            raw.Send_init([w[-2], D], dest=upper, tag=1),
        ]

        def hand_persistent(fixed=fixed) -> None:  # the same four messages as persistent requests, by hand
            MPI.Prequest.Startall(fixed)
            MPI.Request.Waitall(fixed)

        planned = hpccoll.plan(hpccoll.halo_exchange, u, auto, out=u, halo=1)  # auto: profile or measured
        shared = auto.shared_empty(u.shape, u.dtype)
        shared[...] = u
        other, floor = u.copy(), u  # floor: the field's own ghost rows, filled from another array

        def one_copy() -> None:  # the ghosts filled from memory of another field: no exchange
            np.copyto(floor[0], other[-2])
            np.copyto(floor[-1], other[1])

        fns = {
            "raw": hand,
            "raw_again": hand,
            "auto": lambda: hpccoll.halo_exchange(u, auto, halo=(1,), out=u),
            "mpi": lambda: hpccoll.halo_exchange(u, mpi, halo=(1,), out=u),
            "pers": hand_persistent,
            "plan": planned,
            "shared": lambda f=shared: hpccoll.halo_exchange(f, auto, halo=1, out=f),
            "copy": one_copy,
            "nbr": neighbourhood,
            "nbr_pers": neighbourhood_persistent,
        }
        iters = max(3, min(2000, int(5e7 // max(face, 1))))
        s = _timing.interleave(raw, fns, iters=iters, rounds=args.rounds, warmup=min(iters, 20))
        t = {k: x * 1e6 for k, x in _timing.medians(s).items()}
        say(
            f"{human(face):>9}{t['raw']:>14.1f}{t['auto']:>10.1f}{_timing.paired_ratio(s, 'auto', 'raw'):>7.3f}"
            f"{t['mpi']:>10.1f}{_timing.paired_ratio(s, 'mpi', 'raw'):>7.3f}"
            f"{_timing.paired_difference(s, 'mpi', 'raw') * 1e6:>+11.1f}{t['pers']:>10.1f}{t['plan']:>9.1f}"
            f"{_timing.paired_ratio(s, 'plan', 'raw'):>7.3f}{_timing.paired_ratio(s, 'plan', 'pers'):>7.3f}"
            f"{t['shared']:>9.1f}{_timing.paired_ratio(s, 'shared', 'raw'):>7.3f}"
            f"{t['copy']:>9.1f}{_timing.paired_ratio(s, 'copy', 'raw'):>7.3f}"
            f"{t['nbr']:>10.1f}{_timing.paired_ratio(s, 'nbr', 'raw'):>7.3f}"
            f"{t['nbr_pers']:>10.1f}{_timing.paired_ratio(s, 'nbr_pers', 'pers'):>7.3f}"
            f"{_timing.paired_ratio(s, 'raw_again', 'raw'):>9.3f}"
        )
        planned.free()
        nbr_fixed.Free()
        row.Free()
        for r in fixed:
            r.Free()
    auto.free()
    mpi.free()
    topo.Free()
    raw.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
