"""hpccoll.all_to_all over raw mpi4py, and the pencil FFT over mpi4py-fft, side by side in one run.

Launch (2 and 4 ranks are the reference settings; any number works):

    mpiexec -n 2 python benchmarks/bench_alltoall.py [--max-bytes 16M] [--fft-n 2048] [--json FILE]

(a) For each size S (bytes each rank sends, float64), hpccoll.all_to_all with
``out=`` and the raw mpi4py call run on the same buffers, interleaved round by
round (``bench_quick.Timer``: median per-call time, max over ranks; ratios are
medians of same-round ratios):

- even, ``recv_sizes=None``: the size exchange, then ``MPI_Alltoall``, vs raw ``Alltoall``
  (``exchange``: the size exchange alone);
- even, ``sizes`` and ``recv_sizes`` given: not known even on every rank (one
  rank sees one row and one column of the count matrix), so point-to-point
  pairs (``HostMPI._pairwise``; ``MPI_Alltoallv`` above
  ``HostMPI.pairwise_max_ranks`` ranks), blocking and ``async_op=True``, vs raw
  ``Alltoall`` and vs raw ``Alltoallv``; ``pairs``: the same messages in raw mpi4py
  (``Sendrecv`` at 2 ranks, ``Irecv``/``Isend`` per peer at more, the own block
  copied) vs raw ``Alltoall``, and ``g-p``: given minus pairs, what hpccoll's
  Python adds to the data path;
- uneven blocks (rank r sends 2x, 0.5x, 1x ... of S/P), sizes given, vs raw ``Alltoallv``;
- ``split_axis=1, concat_axis=0`` of a (64, S/512) array (a transpose: blocks
  packed first, ``MPI_Alltoall`` since the split and the extents are global) vs raw ``Alltoall``.

``raw/raw`` times the raw call twice per round: the noise floor of the ratios.

(c) At more than 2 ranks: the pairs' two forms in raw mpi4py (all ``Irecv`` and
``Isend`` at once then ``Waitall``, or one ``Sendrecv`` per partner in turn)
against raw ``Alltoall`` on the same buffers, by block size: whether the
blocking pairs should go one partner at a time for large blocks, as MPICH's
``Alltoall`` does (they measured no better: hpccoll posts them all at once).

(b) One forward 2-D FFT of an N x N complex128 array distributed by rows:
``examples/pencil_fft.py``'s ``PencilFFT2`` (NumPy's FFTs, one all_to_all)
against mpi4py-fft's ``PFFT`` (slab decomposition, its FFTW backend and its
NumPy backend), interleaved, with the all_to_all's own share. mpi4py-fft is a
benchmark-only dependency: ``pip install mpi4py-fft`` (it builds against FFTW:
``apt-get install libfftw3-dev``); without it part (b) says so and is skipped.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import statistics
import sys

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from bench_quick import Timer, human, parse_bytes  # noqa: E402
from mpi4py import MPI  # noqa: E402

import hpccoll  # noqa: E402
from hpccoll.collectives.alltoall import recv_extents  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
D = MPI.DOUBLE


def data_cases(raw, comm, n):
    """The callables of part (a) for ``n`` float64 sent per rank (a multiple of P)."""
    P, rank = comm.size, comm.rank
    k = n // P
    x = np.random.default_rng(rank).standard_normal(n)
    out = np.empty(n)
    even = [k] * P
    counts, displs = [k] * P, [j * k for j in range(P)]
    # uneven: rank r sends block j of k * (1, 1.5, 0.5, 1, ...)[(j + r) % P] elements (every row sums differently)
    shape = [2 * k if j == 0 else k // 2 if j == 1 else k for j in range(P)]
    send_u = [shape[(j + rank) % P] for j in range(P)]
    recv_u = [shape[(rank + r) % P] for r in range(P)]
    xu, outu = np.random.default_rng(rank).standard_normal(sum(send_u)), np.empty(sum(recv_u))
    sdu, rdu = [sum(send_u[:j]) for j in range(P)], [sum(recv_u[:j]) for j in range(P)]
    x2 = np.random.default_rng(rank).standard_normal((64, P * k // 64)) if k % 64 == 0 else None

    def pairs():  # the data path of "given" in raw mpi4py: hpccoll's Python is all that "given" adds to it
        if P == 2:
            other = 1 - rank
            raw.Sendrecv([x[other * k :], k, D], other, 3, [out[other * k :], k, D], other, 3)
        else:
            partners = range(1, P)  # in HostMPI._pairwise's order: from rank-1, rank-2, ...; to rank+1, rank+2, ...
            requests = [raw.Irecv([out[(rank - i) % P * k :], k, D], (rank - i) % P, 3) for i in partners]
            requests += [raw.Isend([x[(rank + i) % P * k :], k, D], (rank + i) % P, 3) for i in partners]
        out[rank * k : (rank + 1) * k] = x[rank * k : (rank + 1) * k]
        if P != 2:
            MPI.Request.Waitall(requests)

    out2 = np.empty((P * 64, k // 64))
    return {
        "even": {
            "raw": lambda: raw.Alltoall([x, D], [out, D]),
            "raw_again": lambda: raw.Alltoall([x, D], [out, D]),
            "learned": lambda: hpccoll.all_to_all(x, comm, out=out),
            "given": lambda: hpccoll.all_to_all(x, comm, sizes=even, recv_sizes=even, out=out),
            "async": lambda: hpccoll.all_to_all(x, comm, sizes=even, recv_sizes=even, out=out, async_op=True).wait(),
            "rawv": lambda: raw.Alltoallv([x, (counts, displs), D], [out, (counts, displs), D]),
            "pairs": pairs,
            "exchange": lambda: recv_extents(comm, x, 0, 0, even, "bench"),  # learned's size exchange alone
        },
        "uneven": {
            "raw": lambda: raw.Alltoallv([xu, (send_u, sdu), D], [outu, (recv_u, rdu), D]),
            "raw_again": lambda: raw.Alltoallv([xu, (send_u, sdu), D], [outu, (recv_u, rdu), D]),
            "given": lambda: hpccoll.all_to_all(xu, comm, sizes=send_u, recv_sizes=recv_u, out=outu),
        },
        "transpose": {}
        if x2 is None
        else {  # a transpose packs its blocks first: its cost over a plain exchange
            "raw": lambda: raw.Alltoall([x, D], [out, D]),
            "axis1": lambda: hpccoll.all_to_all(x2, comm, split_axis=1, concat_axis=0, out=out2, recv_sizes=[64] * P),
        },
    }


def part_a(raw, comm, timer, sizes, say):
    say("\n# (a) all_to_all with out= vs raw mpi4py, float64; times in us (median over rounds, max over ranks)")
    header = (
        f"{'size/rank':>10}{'raw A2A':>10}{'learned':>10}{'ratio':>7}{'exchange':>9}{'given':>10}{'ratio':>7}"
        f"{'async':>7}{'pairs':>7}{'g-p':>8}{'raw A2Av':>10}{'g/A2Av':>7}{'raw/raw':>8} | {'uneven raw':>11}{'hpccoll':>10}{'ratio':>7}"
        f"{'raw/raw':>8}"
        f" | {'transpose/raw':>13}"
    )
    say(header)
    say("-" * len(header))
    rows = []
    for nbytes in sizes:
        n = max(comm.size, nbytes // 8 // comm.size * comm.size)
        cases = data_cases(raw, comm, n)
        t = timer.run(cases["even"], nbytes)
        row = {
            "bytes_per_rank": nbytes,
            **{k: v * 1e6 for k, v in t.items()},
            "learned/raw": timer.ratio("learned", "raw"),
            "given/raw": timer.ratio("given", "raw"),
            "async/raw": timer.ratio("async", "raw"),
            "pairs/raw": timer.ratio("pairs", "raw"),
            "given-pairs": timer.added("given", "pairs") * 1e6,
            "given/rawv": timer.ratio("given", "rawv"),
            "noise": timer.ratio("raw_again", "raw"),
        }
        t = timer.run(cases["uneven"], nbytes)
        row.update(
            uneven_raw=t["raw"] * 1e6,
            uneven=t["given"] * 1e6,
            **{"uneven/raw": timer.ratio("given", "raw"), "uneven_noise": timer.ratio("raw_again", "raw")},
        )
        if cases["transpose"]:
            timer.run(cases["transpose"], nbytes)
            row["transpose/raw"] = timer.ratio("axis1", "raw")
        rows.append(row)
        say(
            f"{human(nbytes):>10}{row['raw']:>10.1f}{row['learned']:>10.1f}{row['learned/raw']:>7.3f}{row['exchange']:>9.1f}"
            f"{row['given']:>10.1f}{row['given/raw']:>7.3f}{row['async/raw']:>7.3f}{row['pairs/raw']:>7.3f}"
            f"{row['given-pairs']:>8.1f}{row['rawv']:>10.1f}{row['given/rawv']:>7.3f}"
            f"{row['noise']:>8.3f} | {row['uneven_raw']:>11.1f}{row['uneven']:>10.1f}{row['uneven/raw']:>7.3f}"
            f"{row['uneven_noise']:>8.3f} | {row.get('transpose/raw', float('nan')):>13.3f}"
        )
    return rows


def pair_forms(raw, k):
    """The pairs' two forms in raw mpi4py for ``k`` float64 per block, on the same buffers as a raw ``Alltoall``."""
    P, rank = raw.size, raw.rank
    x, out = np.random.default_rng(rank).standard_normal(k * P), np.empty(k * P)

    def own():
        out[rank * k : (rank + 1) * k] = x[rank * k : (rank + 1) * k]

    def at_once():
        requests = [raw.Irecv([out[r * k :], k, D], r, 3) for r in range(P) if r != rank]
        requests += [raw.Isend([x[j * k :], k, D], j, 3) for j in range(P) if j != rank]
        own()
        MPI.Request.Waitall(requests)

    def steps():
        for i in range(1, P):
            j, r = (rank + i) % P, (rank - i) % P
            raw.Sendrecv([x[j * k :], k, D], j, 3, [out[r * k :], k, D], r, 3)
        own()

    return {"raw": lambda: raw.Alltoall([x, D], [out, D]), "at_once": at_once, "steps": steps}


def part_c(raw, timer, say):
    """Which form of the pairs (all at once, or one partner at a time) is faster, by block size."""
    say("\n# (c) the pairs' two forms in raw mpi4py vs raw Alltoall, by block size (float64, ratios paired)")
    header = f"{'block':>10}{'raw A2A us':>12}{'at once':>9}{'steps':>8}"
    say(header)
    say("-" * len(header))
    rows = []
    for block in (1 << 10, 1 << 14, 1 << 16, 1 << 17, 1 << 18, 1 << 20):
        timer.run(pair_forms(raw, block // 8), block * raw.size)
        row = {
            "block_bytes": block,
            "raw": statistics.median(timer.samples["raw"]) * 1e6,
            "at_once/raw": timer.ratio("at_once", "raw"),
            "steps/raw": timer.ratio("steps", "raw"),
        }
        rows.append(row)
        say(f"{human(block):>10}{row['raw']:>12.1f}{row['at_once/raw']:>9.3f}{row['steps/raw']:>8.3f}")
    return rows


def load_example():
    spec = importlib.util.spec_from_file_location("pencil_fft", HERE.parent / "examples" / "pencil_fft.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def part_b(raw, comm, timer, n, say):
    say(f"\n# (b) forward 2-D FFT of a {n} x {n} complex128 array distributed by rows, {comm.size} ranks")
    try:
        from mpi4py_fft import PFFT
    except ImportError as exc:
        say(f"# skipped: mpi4py-fft is not installed ({exc}); pip install mpi4py-fft (needs libfftw3-dev)")
        return None
    mine = load_example().PencilFFT2(comm, (n, n))
    rows = mine.rows[comm.rank]
    x = np.random.default_rng(comm.rank).standard_normal((rows, n)) + 1j
    fns = {"hpccoll": lambda: mine.forward(x)}
    peers = {}
    for backend in ("fftw", "numpy"):
        fft = PFFT(raw, (n, n), dtype=np.complex128, grid=(-1,), backend=backend)
        if fft.forward.input_array.shape != x.shape:  # both must start from the same rows
            say(
                f"# mpi4py-fft distributes the rows otherwise ({fft.forward.input_array.shape} here, {x.shape} "
                "in hpccoll): skipped"
            )
            return None
        fft.forward.input_array[...] = x  # planned arrays, transformed in place of a copy; no 1/N^2 scaling
        peers[backend] = fft
        fns[f"pfft_{backend}"] = lambda f=fft: f.forward(normalize=False)
    peers["numpy"].forward(normalize=False)
    want = peers["numpy"].forward.output_array
    same = raw.allreduce(bool(np.allclose(mine.forward(x), want, rtol=1e-9, atol=1e-9 * n)), op=MPI.LAND)
    spectra = mine.xp.fft.fft(x, axis=1)
    fns["all_to_all"] = lambda: mine.transpose.forward(spectra, out=mine._columns)
    t = timer.run(fns, 16 * n * n)
    result = {
        "n": n,
        "ranks": comm.size,
        "same_result": same,
        **{k: v * 1e6 for k, v in t.items()},
        "hpccoll/pfft_fftw": timer.ratio("hpccoll", "pfft_fftw"),
        "hpccoll/pfft_numpy": timer.ratio("hpccoll", "pfft_numpy"),
        "all_to_all/hpccoll": timer.ratio("all_to_all", "hpccoll"),
    }
    say(f"  results agree with mpi4py-fft: {same}")
    say(f"  PencilFFT2 (numpy FFTs + all_to_all) {t['hpccoll'] * 1e3:9.2f} ms")
    say(
        f"  mpi4py-fft PFFT, FFTW backend        {t['pfft_fftw'] * 1e3:9.2f} ms   ratio {result['hpccoll/pfft_fftw']:.3f}"
    )
    say(
        f"  mpi4py-fft PFFT, NumPy backend       {t['pfft_numpy'] * 1e3:9.2f} ms   ratio {result['hpccoll/pfft_numpy']:.3f}"
    )
    say(
        f"  of which the all_to_all (out=)       {t['all_to_all'] * 1e3:9.2f} ms   share {result['all_to_all/hpccoll']:.3f}"
    )
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-bytes", default="1M", help="smallest size each rank sends (default 1M)")
    parser.add_argument("--max-bytes", default="16M", help="largest size each rank sends (default 16M)")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds per size (default 15)")
    parser.add_argument("--fft-n", type=int, default=2048, help="N of the N x N FFT, 0 to skip (default 2048)")
    parser.add_argument("--json", help="also write the results to this JSON file (rank 0)")
    args = parser.parse_args(argv)
    raw = MPI.COMM_WORLD.Dup()
    comm = hpccoll.Communicator(MPI.COMM_WORLD)
    say = print if comm.rank == 0 else (lambda *a, **k: None)
    say(
        f"# hpccoll {hpccoll.__version__} vs mpi4py {__import__('mpi4py').__version__} "
        f"({MPI.Get_library_version().splitlines()[0].strip()}), {comm.size} ranks"
    )
    say(
        f"# command: mpiexec -n {comm.size} python benchmarks/bench_alltoall.py {' '.join(argv or sys.argv[1:])}".rstrip()
    )
    timer = Timer(raw, args.rounds)
    lo, hi = parse_bytes(args.min_bytes), parse_bytes(args.max_bytes)
    sizes = [s for s in ((1 << 10) << (2 * k) for k in range(10)) if lo <= s <= hi]
    results = {"a": part_a(raw, comm, timer, sizes, say)}
    if comm.size > 2:  # two ranks have one partner: both forms are one exchange
        results["c"] = part_c(raw, timer, say)
    if args.fft_n:
        results["b"] = part_b(raw, comm, timer, args.fft_n, say)
    if args.json and comm.rank == 0:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1))
    comm.free()
    raw.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
