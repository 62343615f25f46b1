"""hpccoll's JAX adapter vs mpi4jax vs hpccoll on NumPy: time per call, side by side in one run.

Launch (2 ranks is the reference setting; ``make bench-jax``):

    mpiexec -n 2 python -m mpi4py benchmarks/bench_jax.py [--rounds 15] [--sizes 8,1K,1M,16M]

For each size S (bytes per rank, float64) and each collective the rows time,
interleaved round by round on the same data:

- ``numpy``        hpccoll on a NumPy array directly (no JAX at all)
- ``hcj eager``    ``hpccoll.adapters.jax`` on a concrete ``jax.Array``
- ``hcj jit``      a ``jax.jit`` function holding the adapter's call, in its default lowering
                   (``hcj.LOWERING``: ``"buffer"``, hpccoll on XLA's own buffers, where JAX has
                   ``buffer_callback``)
- ``hcj callback`` the same, lowered as the ordered host callback (``hcj.LOWERING = "callback"``):
                   XLA copies the callback's result into its output
- ``mpi4jax jit``  a ``jax.jit`` function holding mpi4jax's call
- ``jit no-op``    a ``jax.jit`` function of the same input holding one ordered ``io_callback`` that
                   does nothing, returning the input's first element: what JAX itself costs per call
                   of a jitted function with an ordered effect (dispatch, the token, one Python
                   callback), with no collective

Collectives: ``all_reduce`` (sum; mpi4jax ``allreduce``), ``all_gather`` along
axis 0 with ``sizes`` given (mpi4jax ``allgather``, which stacks the shards:
the same bytes) and ``reduce_scatter`` (sum; mpi4jax has none: its
``allreduce`` of the same input stands in, moving more). Every result is
blocked on (``block_until_ready``) inside the timed loop. Times are the median
over rounds of the per-call time (max over ranks); ratios are the median over
rounds of the paired, same-round ratio. ``hcj/hcj`` times the adapter's jitted
call twice per round: how far a ratio wanders when nothing differs. ``(jit-noop)/numpy`` is
``hcj jit`` less ``jit no-op``, over ``numpy`` (medians): what the adapter adds to hpccoll's own
call once JAX's per-call cost is taken out. Without
mpi4jax installed its column says ``-`` (it builds from source: see
docs/bench/jax.md).
"""

from __future__ import annotations

import argparse
import os
import sys

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import io_callback  # noqa: E402
from mpi4py import MPI  # noqa: E402

import hpccoll  # noqa: E402
from hpccoll import _timing  # noqa: E402
from hpccoll.adapters import jax as hcj  # noqa: E402

try:
    import mpi4jax
except ImportError:  # it has no wheel; see docs/bench/jax.md for how it was built
    mpi4jax = None


def parse_bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1:] in units else int(text)


def human(n: int) -> str:
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:g} {unit}"
    return f"{n} B"


def interleaved(comm: MPI.Intracomm, fns: dict, iters: int, rounds: int) -> dict:
    """Per-call seconds of each callable, per round (max over ranks; ``hpccoll._timing``)."""
    return _timing.interleave(comm, fns, iters=iters, rounds=rounds, warmup=min(iters, 20))


def jitted(comm: hpccoll.Communicator, sizes: list, lowering: str) -> dict:
    """The adapter's three collectives, each in a jitted function lowered as ``lowering`` (compiled here)."""
    before, hcj.LOWERING = hcj.LOWERING, lowering
    try:
        return {
            "all_reduce": jax.jit(lambda v: hcj.all_reduce(v, comm)).lower(jnp.zeros(sizes[0])).compile(),
            "all_gather": jax.jit(lambda v: hcj.all_gather(v, comm, sizes=sizes)).lower(jnp.zeros(sizes[0])).compile(),
            "reduce_scatter": jax.jit(lambda v: hcj.reduce_scatter(v, comm)).lower(jnp.zeros(sizes[0])).compile(),
        }
    finally:
        hcj.LOWERING = before


def cases(x: jax.Array, xn: np.ndarray, comm: hpccoll.Communicator, raw: MPI.Intracomm) -> dict:
    """collective -> {column: callable}; each callable blocks on its result."""
    sizes = [x.shape[0]] * comm.size
    ready = jax.block_until_ready
    default, callback = jitted(comm, sizes, hcj.LOWERING), jitted(comm, sizes, "callback")
    numpy = {
        "all_reduce": lambda: hpccoll.all_reduce(xn, comm),
        "all_gather": lambda: hpccoll.all_gather(xn, comm, sizes=sizes),
        "reduce_scatter": lambda: hpccoll.reduce_scatter(xn, comm),
    }
    eager = {
        "all_reduce": lambda: ready(hcj.all_reduce(x, comm)),
        "all_gather": lambda: ready(hcj.all_gather(x, comm, sizes=sizes)),
        "reduce_scatter": lambda: ready(hcj.reduce_scatter(x, comm)),
    }
    theirs = {}
    if mpi4jax is not None:
        m_ar = jax.jit(lambda v: mpi4jax.allreduce(v, MPI.SUM, comm=raw))
        m_ag = jax.jit(lambda v: mpi4jax.allgather(v, comm=raw))
        theirs = {"all_reduce": m_ar, "all_gather": m_ag, "reduce_scatter": m_ar}  # no reduce-scatter in mpi4jax
    noop = jax.jit(lambda v: (io_callback(_nothing, None, ordered=True), v[:1])[1]).lower(x).compile()
    out = {}
    for name in numpy:
        row = {
            "numpy": numpy[name],
            "hcj eager": eager[name],
            "hcj jit": lambda f=default[name]: ready(f(x)),
            "hcj jit again": lambda f=default[name]: ready(f(x)),
            "hcj callback": lambda f=callback[name]: ready(f(x)),
            "jit no-op": lambda: ready(noop(x)),
        }
        if name in theirs:
            row["mpi4jax jit"] = lambda f=theirs[name]: ready(f(x))
        out[name] = row
    return out


def _nothing() -> None:
    return None


def check(rows: dict, xn: np.ndarray, comm: hpccoll.Communicator) -> None:
    """Every contender computes the same thing (else the timing compares different work)."""
    allreduced = hpccoll.all_reduce(xn, comm)  # what mpi4jax's stand-in for reduce_scatter computes
    for name, row in rows.items():
        want = np.asarray(row["numpy"]())
        for column, fn in row.items():
            if column == "jit no-op":
                continue
            expect = allreduced if (column, name) == ("mpi4jax jit", "reduce_scatter") else want
            np.testing.assert_allclose(np.asarray(fn()).reshape(-1), expect.reshape(-1), rtol=1e-14)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,1K,1M,16M", help="bytes per rank, comma-separated (default 8,1K,1M,16M)")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds per size (default 15)")
    parser.add_argument("--iters", type=int, default=0, help="calls per timed batch (default: by size)")
    args = parser.parse_args(argv)

    world = MPI.COMM_WORLD
    raw = world.Dup()  # mpi4jax's communicator and the barriers
    comm = hpccoll.Communicator(world)
    P, rank = comm.size, comm.rank
    say = print if rank == 0 else (lambda *a, **k: None)
    m4j = f"mpi4jax {mpi4jax.__version__}" if mpi4jax is not None else "mpi4jax not installed"
    say(
        f"# hpccoll {hpccoll.__version__}, JAX {jax.__version__} ({jax.default_backend()}), {m4j}, "
        f"{MPI.Get_library_version().splitlines()[0].strip()}, {P} ranks, float64, lowering {hcj.LOWERING!r}"
    )
    say(f"# command: mpiexec -n {P} python -m mpi4py benchmarks/bench_jax.py {' '.join(argv or sys.argv[1:])}".rstrip())
    say(
        "# per-call time in microseconds: median over rounds of the max over ranks; ratios: median of same-round ratios"
    )
    cols = ["numpy", "hcj eager", "hcj jit", "hcj callback", "mpi4jax jit", "jit no-op"]
    header = (
        f"{'collective':<15}{'size/rank':>10}"
        + "".join(f"{c:>14}" for c in cols)
        + f"{'jit/m4j':>9}{'cb/m4j':>8}{'jit/numpy':>11}{'(jit-noop)/numpy':>18}{'hcj/hcj':>9}"
    )
    say(header)
    say("-" * len(header))
    for nbytes in (parse_bytes(s) for s in args.sizes.split(",")):
        n = max(1, nbytes // 8)
        xn = np.random.default_rng(rank).standard_normal(n)
        x = jnp.asarray(xn)
        rows = cases(x, xn, comm, raw)
        check(rows, xn, comm)
        iters = args.iters or max(5, min(300, int(2e7 // nbytes)))
        for name, fns in rows.items():
            s = interleaved(raw, fns, iters, args.rounds)
            med = {k: v * 1e6 for k, v in _timing.medians(s).items()}

            def ratio(a: str, b: str) -> str:
                if a not in s or b not in s:
                    return "-"
                return f"{_timing.paired_ratio(s, a, b):.3f}"

            say(
                f"{name:<15}{human(nbytes):>10}"
                + "".join(f"{med[c]:>14.1f}" if c in med else f"{'-':>14}" for c in cols)
                + f"{ratio('hcj jit', 'mpi4jax jit'):>9}{ratio('hcj callback', 'mpi4jax jit'):>8}"
                + f"{ratio('hcj jit', 'numpy'):>11}"
                + f"{(med['hcj jit'] - med['jit no-op']) / med['numpy']:>18.3f}{ratio('hcj jit again', 'hcj jit'):>9}",
                flush=True,
            )
    raw.Free()
    comm.free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
