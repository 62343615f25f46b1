"""hpccoll's JAX adapter vs mpi4jax vs hpccoll on NumPy: time per call, side by side in one run.

Launch (2 ranks is the reference setting):

    mpiexec -n 2 python -m mpi4py benchmarks/bench_jax.py [--rounds 15] [--sizes 1K,1M]

For each size S (bytes per rank, float64) and each collective the rows time,
interleaved round by round on the same data:

- ``numpy``        hpccoll on a NumPy array directly (the floor: no JAX at all)
- ``hcj eager``    ``hpccoll.adapters.jax`` on a concrete ``jax.Array``
- ``mpi4jax eager`` the same mpi4jax call outside ``jit``
- ``hcj jit``      a ``jax.jit`` function holding the adapter's call (its default lowering: the
                   host callback emitted directly, as io_callback's own lowering does)
- ``hcj io_callback`` the same, lowered through ``jax.experimental.io_callback`` itself
                   (``hcj.DIRECT_LOWERING = False``), which first copies the argument into a JAX array
- ``mpi4jax jit``  a ``jax.jit`` function holding mpi4jax's call

Collectives: ``all_reduce`` (sum; mpi4jax ``allreduce``) and ``all_gather``
along axis 0 with ``sizes`` given (mpi4jax ``allgather``, which stacks the
shards: the same bytes). Every result is blocked on (``block_until_ready``)
inside the timed loop. Times are the median over rounds of the per-call time
(max over ranks); ratios are the median over rounds of the paired, same-round
ratio. ``hcj/hcj`` times the adapter's jitted call twice per round: how far a
ratio wanders when nothing differs. Without mpi4jax installed its columns say
``-`` (it builds from source: see docs/bench/jax.md).
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


#: Callables timed with only a few calls per round: mpi4jax outside jit compiles on every call (tens of ms).
SLOW = {"mpi4jax eager": 3}


def interleaved(comm: MPI.Intracomm, fns: dict, iters: int, rounds: int) -> dict:
    """Per-call seconds of each callable, per round (max over ranks; ``hpccoll._timing``), SLOW ones fewer times."""
    counts = {name: SLOW.get(name, iters) for name in fns}
    warmup = {name: min(iters, 20, n) for name, n in counts.items()}
    return _timing.interleave(comm, fns, iters=counts, rounds=rounds, warmup=warmup)


def cases(x: jax.Array, xn: np.ndarray, comm: hpccoll.Communicator, raw: MPI.Intracomm) -> dict:
    """collective -> {column: callable}; each callable blocks on its result."""
    P = comm.size
    sizes = [x.shape[0]] * P
    ready = jax.block_until_ready
    hcj_ar = jax.jit(lambda v: hcj.all_reduce(v, comm))
    hcj_ag = jax.jit(lambda v: hcj.all_gather(v, comm, sizes=sizes))
    hcj.DIRECT_LOWERING = False  # the same, lowered through the public io_callback (compiled now, kept)
    io_ar = jax.jit(lambda v: hcj.all_reduce(v, comm))
    io_ag = jax.jit(lambda v: hcj.all_gather(v, comm, sizes=sizes))
    ready(io_ar(x)), ready(io_ag(x))
    hcj.DIRECT_LOWERING = True
    out = {
        "all_reduce": {
            "numpy": lambda: hpccoll.all_reduce(xn, comm),
            "hcj eager": lambda: ready(hcj.all_reduce(x, comm)),
            "hcj jit": lambda: ready(hcj_ar(x)),
            "hcj jit again": lambda: ready(hcj_ar(x)),
            "hcj io_callback": lambda: ready(io_ar(x)),
        },
        "all_gather": {
            "numpy": lambda: hpccoll.all_gather(xn, comm, sizes=sizes),
            "hcj eager": lambda: ready(hcj.all_gather(x, comm, sizes=sizes)),
            "hcj jit": lambda: ready(hcj_ag(x)),
            "hcj jit again": lambda: ready(hcj_ag(x)),
            "hcj io_callback": lambda: ready(io_ag(x)),
        },
    }
    if mpi4jax is not None:
        m_ar = jax.jit(lambda v: mpi4jax.allreduce(v, MPI.SUM, comm=raw))
        m_ag = jax.jit(lambda v: mpi4jax.allgather(v, comm=raw))
        out["all_reduce"].update(
            {
                "mpi4jax eager": lambda: ready(mpi4jax.allreduce(x, MPI.SUM, comm=raw)),
                "mpi4jax jit": lambda: ready(m_ar(x)),
            }
        )
        out["all_gather"].update(
            {
                "mpi4jax eager": lambda: ready(mpi4jax.allgather(x, comm=raw)),
                "mpi4jax jit": lambda: ready(m_ag(x)),
            }
        )
    return out


def check(x: jax.Array, xn: np.ndarray, comm: hpccoll.Communicator, raw: MPI.Intracomm) -> None:
    """Every contender computes the same thing (else the timing compares different work)."""
    want_ar, want_ag = hpccoll.all_reduce(xn, comm), hpccoll.all_gather(xn, comm)
    np.testing.assert_allclose(np.asarray(hcj.all_reduce(x, comm)), want_ar, rtol=1e-14)
    np.testing.assert_array_equal(
        np.asarray(jax.jit(lambda v: hcj.all_gather(v, comm, sizes=[len(xn)] * comm.size))(x)), want_ag
    )
    if mpi4jax is not None:
        np.testing.assert_allclose(np.asarray(mpi4jax.allreduce(x, MPI.SUM, comm=raw)), want_ar, rtol=1e-14)
        np.testing.assert_array_equal(np.asarray(mpi4jax.allgather(x, comm=raw)).reshape(-1), want_ag)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1K,1M", help="bytes per rank, comma-separated (default 1K,1M)")
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
        f"{MPI.Get_library_version().splitlines()[0].strip()}, {P} ranks, float64"
    )
    say(f"# command: mpiexec -n {P} python -m mpi4py benchmarks/bench_jax.py {' '.join(argv or sys.argv[1:])}".rstrip())
    say(
        "# per-call time in microseconds: median over rounds of the max over ranks; ratios: median of same-round ratios"
    )
    cols = ["numpy", "hcj eager", "mpi4jax eager", "hcj jit", "hcj io_callback", "mpi4jax jit"]
    header = (
        f"{'collective':<12}{'size/rank':>10}"
        + "".join(f"{c:>16}" for c in cols)
        + f"{'eager/m4j':>11}{'jit/m4j':>9}{'io_cb/m4j':>11}{'jit/numpy':>11}{'hcj/hcj':>9}"
    )
    say(header)
    say("-" * len(header))
    for nbytes in (parse_bytes(s) for s in args.sizes.split(",")):
        n = max(1, nbytes // 8)
        xn = np.random.default_rng(rank).standard_normal(n)
        x = jnp.asarray(xn)
        check(x, xn, comm, raw)
        iters = args.iters or max(10, min(300, int(2e7 // nbytes)))
        for name, fns in cases(x, xn, comm, raw).items():
            s = interleaved(raw, fns, iters, args.rounds)
            med = {k: v * 1e6 for k, v in _timing.medians(s).items()}

            def ratio(a: str, b: str) -> str:
                if a not in s or b not in s:
                    return "-"
                return f"{_timing.paired_ratio(s, a, b):.3f}"

            say(
                f"{name:<12}{human(nbytes):>10}"
                + "".join(f"{med[c]:>16.1f}" if c in med else f"{'-':>16}" for c in cols)
                + f"{ratio('hcj eager', 'mpi4jax eager'):>11}{ratio('hcj jit', 'mpi4jax jit'):>9}"
                + f"{ratio('hcj io_callback', 'mpi4jax jit'):>11}"
                + f"{ratio('hcj jit', 'numpy'):>11}{ratio('hcj jit again', 'hcj jit'):>9}",
                flush=True,
            )
    raw.Free()
    comm.free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
