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
``--layouts`` prints another table instead, one row per process grid ((P,), (1, P), (2, P/2); periodic and
not), owned field n x n per rank (``--fields``, default 64, 256, 1024: a 2-D float64 field, its ghosts along the
grid's axes) and halo 1 and 2, faces only: ``hand`` is the hand-written exchange on MPI subarray datatypes of the
field itself (``Create_subarray``; one ``Irecv`` and one ``Isend`` per face), ``pers`` the same messages as
persistent requests (``Recv_init``/``Send_init``), ``plan`` ``hpccoll.plan(halo_exchange, u, grid, out=u,
halo=h)`` on host MPI (``/pers``: its ratio to ``pers``, far below 1 where MPICH's strided faces past
``HostMPI.strided_messages`` are packed; its ``Plan.methods`` at the end of the row), ``auto``
the unplanned in-place call repeated (``/hand``: against ``hand``), ``raw/raw`` the hand-written exchange timed
twice (the floor).
``--strided`` prints a third table: rank pairs (0-1, 2-3, ...) exchanging a strided float64 region (``bytes``
in contiguous runs of ``run`` bytes, a row stride of 8 KiB) as persistent requests: ``types`` on a vector
datatype (what host MPI's derived datatypes do), ``packed`` packed by NumPy into a contiguous buffer and
unpacked after (what the halo exchange does past ``HostMPI.strided_messages``), ``contig`` the same bytes
contiguous (the floor of both).
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


#: The formats of ``--layouts``' timed columns: hand, pers, plan, /pers, auto, /hand, raw/raw.
COLUMNS = (">9.1f", ">9.1f", ">9.1f", ">7.3f", ">9.1f", ">7.3f", ">9.3f")


def timed(raw, fns: dict, iters: int, rounds: int, warmup: int) -> tuple:
    """The interleaved samples of ``fns`` and each one's median microseconds per call (the slowest rank's)."""
    s = _timing.interleave(raw, fns, iters=iters, rounds=rounds, warmup=warmup)
    return s, {k: x * 1e6 for k, x in _timing.medians(s).items()}


def grids(p: int) -> list:
    """``--layouts``' process grids at ``p`` ranks: (P,), (1, P), (2, P/2) and, at 4 ranks, (2, 2), each
    periodic and not (duplicates dropped)."""
    dims = [(p,), (1, p)] + ([(2, p // 2)] if p % 2 == 0 else [])
    return [(d, per) for d in dims for per in (False, True)]


def layouts(args, world) -> int:
    """The ``--layouts`` table: per grid, field and halo, hpccoll against hand-written subarray exchanges."""
    say = print if world.rank == 0 else (lambda *a, **k: None)
    raw = world.Dup()
    D = MPI.DOUBLE
    say(f"# hpccoll {hpccoll.__version__}, {MPI.Get_library_version().splitlines()[0].strip()}, {world.size} ranks")
    say(f"# command: mpiexec -n {world.size} python benchmarks/bench_halo.py {' '.join(sys.argv[1:])}")
    header = (
        f"{'grid':>8}{'per':>5}{'field':>11}{'h':>3}{'face':>10}{'hand':>9}{'pers':>9}{'plan':>9}{'/pers':>7}"
        f"{'auto':>9}{'/hand':>7}{'raw/raw':>9}  plan methods"
    )
    say(header)
    say("-" * len(header))
    for dims, periodic in grids(world.size):
        topo = world.Create_cart(list(dims), periods=[periodic] * len(dims))
        cart = hpccoll.Communicator(world, transport="mpi").cartesian(list(dims), periodic=periodic)
        auto = hpccoll.Communicator(world).cartesian(list(dims), periodic=periodic)
        for n in (int(v) for v in args.fields.split(",")):
            for h in (1, 2):
                nd = len(dims)
                shape = tuple([n + 2 * h] * nd + [n] * (2 - nd))  # a 2-D field; ghosts along the grid's axes
                u = np.random.default_rng(world.rank).standard_normal(shape)
                types, recvs, sends = [], [], []
                for a in range(nd):
                    lower, upper = topo.Shift(a, 1)
                    inner = [n if b != a else h for b in range(2)]
                    start = [h if b < nd else 0 for b in range(2)]
                    for peer, send_at, recv_at, tag_out, tag_in in (
                        (lower, h, 0, 2 * a, 2 * a + 1),
                        (upper, shape[a] - 2 * h, shape[a] - h, 2 * a + 1, 2 * a),
                    ):
                        for at, box in ((send_at, sends), (recv_at, recvs)):
                            st = list(start)
                            st[a] = at
                            t = D.Create_subarray(list(shape), inner, st).Commit()
                            types.append(t)
                            box.append((t, peer, tag_out if box is sends else tag_in))

                def hand(u=u, recvs=recvs, sends=sends) -> None:
                    MPI.Request.Waitall(
                        [raw.Irecv([u, 1, t], source=q, tag=g) for t, q, g in recvs]
                        + [raw.Isend([u, 1, t], dest=q, tag=g) for t, q, g in sends]
                    )

                fixed = [raw.Recv_init([u, 1, t], source=q, tag=g) for t, q, g in recvs]
                fixed += [raw.Send_init([u, 1, t], dest=q, tag=g) for t, q, g in sends]

                def pers(fixed=fixed) -> None:
                    MPI.Prequest.Startall(fixed)
                    MPI.Request.Waitall(fixed)

                planned = hpccoll.plan(hpccoll.halo_exchange, u, cart, out=u, halo=h)
                fns = {
                    "raw": hand,
                    "raw_again": hand,
                    "pers": pers,
                    "plan": planned,
                    "auto": lambda u=u, h=h: hpccoll.halo_exchange(u, auto, halo=h, out=u),
                }
                face = n * h * 8
                iters = max(3, min(100, int(2e7 // max(face, 1))))
                s, t = timed(raw, fns, iters, args.rounds, min(iters, 10))
                plan_pers, auto_hand, floor = (
                    _timing.paired_ratio(s, a, b) for a, b in (("plan", "pers"), ("auto", "raw"), ("raw_again", "raw"))
                )
                cells = zip((t["raw"], t["pers"], t["plan"], plan_pers, t["auto"], auto_hand, floor), COLUMNS)
                where = f"{'x'.join(map(str, dims)):>8}{'yes' if periodic else 'no':>5}{f'{n}x{n}':>11}{h:>3}"
                say(f"{where}{human(face):>10}{''.join(format(v, f) for v, f in cells)}  {'/'.join(planned.methods)}")
                planned.free()
                for r in fixed:
                    r.Free()
                for t_ in types:
                    t_.Free()
        cart.free()
        auto.free()
        topo.Free()
    raw.Free()
    return 0


#: ``--strided``' messages: (bytes, bytes per contiguous run).
STRIDED = [(2048, 8), (4096, 8), (8000, 8), (8184, 8), (8192, 8), (16384, 8), (131072, 8)]
STRIDED += [(16384, 64), (16384, 512), (16384, 4096), (65536, 4096)]


def strided(args, world) -> int:
    """The ``--strided`` table: a strided region between rank pairs, as a datatype, packed, contiguous."""
    say = print if world.rank == 0 else (lambda *a, **k: None)
    raw = world.Dup()
    peer = world.rank ^ 1 if (world.rank ^ 1) < world.size else MPI.PROC_NULL
    say(f"# {MPI.Get_library_version().splitlines()[0].strip()}, {world.size} ranks (pairs)")
    say(f"# command: mpiexec -n {world.size} python benchmarks/bench_halo.py {' '.join(sys.argv[1:])}")
    say(f"{'bytes':>8}{'run':>6}{'types':>9}{'packed':>9}{'contig':>9}{'packed/types':>14}")
    for nbytes, run in STRIDED:
        rows, per = nbytes // run, run // 8
        field = np.zeros((rows, 1024))  # rows of 8 KiB: the region is the first (sent) or last (received) `per`
        region = MPI.DOUBLE.Create_vector(rows, per, 1024).Commit()
        send, recv = np.zeros((rows, per)), np.zeros((rows, per))

        def requests(a, b, t, count=1):
            return [raw.Recv_init([a, count, t], peer, 7), raw.Send_init([b, count, t], peer, 7)]

        typed = requests(field.reshape(-1)[1024 - per :], field.reshape(-1), region)
        packed = requests(recv, send, MPI.DOUBLE, rows * per)

        def run_(r: list, pack: bool = False) -> None:
            if pack:
                np.copyto(send, field[:, :per])
            MPI.Prequest.Startall(r)
            MPI.Request.Waitall(r)
            if pack:
                np.copyto(field[:, -per:], recv)

        fns = {"types": lambda: run_(typed), "packed": lambda: run_(packed, True), "contig": lambda: run_(packed)}
        s, t = timed(raw, fns, 50, args.rounds, 5)
        say(
            f"{nbytes:>8}{run:>6}{t['types']:>9.1f}{t['packed']:>9.1f}{t['contig']:>9.1f}"
            f"{_timing.paired_ratio(s, 'packed', 'types'):>14.3f}"
        )
        for r in typed + packed:
            r.Free()
        region.Free()
    raw.Free()
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11, help="interleaved rounds per size (default 11)")
    parser.add_argument("--faces", default="8,1K,64K,1M", help="bytes per face, comma-separated (default 8,1K,64K,1M)")
    parser.add_argument("--rows", type=int, default=8, help="owned rows per rank (default 8)")
    parser.add_argument(
        "--layouts", action="store_true", help="the process-grid table instead (see the module docstring)"
    )
    parser.add_argument("--strided", action="store_true", help="the strided-column table instead (see above)")
    parser.add_argument("--fields", default="64,256,1024", help="--layouts: owned n x n per rank (default 64,256,1024)")
    args = parser.parse_args(argv)
    world = MPI.COMM_WORLD
    if args.layouts:
        return layouts(args, world)
    if args.strided:
        return strided(args, world)
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
        s, t = timed(raw, fns, iters, args.rounds, min(iters, 20))
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
