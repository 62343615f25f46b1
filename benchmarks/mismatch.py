"""What a cross-rank mismatch does, with and without check mode: error, abort, hang or wrong answer.

Launch the whole table (it starts one ``mpiexec -n 2`` job per case, each under a time limit):

    python benchmarks/mismatch.py [--np 2] [--limit 10] [--check] [--timeout S] [--case NAME ...]

or one case by hand:

    mpiexec -n 2 python -m mpi4py benchmarks/mismatch.py --run NAME [--check]

In every case the *last* rank calls the collective differently from the others
(another dtype, shape, axis, op, ``sizes``, list length, blocking or not, or
another collective altogether), for every collective including all_to_all, as
one array, as a list of arrays and non-blocking (``async_op=True``).
Each rank reports (one JSON line, and a file for the table): whether its call returned or raised, and whether
what it returned equals the answer it would have got had every rank made its
call. The table classifies the job:

- ``error everywhere``: every rank raised the same exception type (the check mode's promise);
- ``errors differ by rank``: every rank raised, not all the same type (e.g. an MPI error on one);
- ``abort (rank r raised)``: some ranks raised, so ``python -m mpi4py`` aborted the
  job; had the exception been caught (a test, a ``try``), the other ranks would hang;
- ``abort (MPI: ...)``: MPI itself stopped the job with a fatal error (MPICH: a
  message longer than the receive buffer, "Message truncated");
- ``abort (watchdog)``: with ``--timeout S`` (``HPCCOLL_TIMEOUT=S``), a rank's
  collective did not complete in S seconds and the watchdog ended the job;
- ``hang``: no result within ``--limit`` seconds;
- ``wrong answer``: every rank returned, and at least one result is wrong;
- ``benign``: every rank returned the answer to its own call.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

# name -> (description, call); call(comm, odd) returns (result, the answer had every rank made this rank's call);
# a list form's are lists, a non-blocking call's its request's result
Case = Callable[..., Tuple[Any, Any]]
CASES: Dict[str, Tuple[str, Case]] = {}


def case(name: str, text: str) -> Callable[[Case], Case]:
    def register(fn: Case) -> Case:
        CASES[name] = (text, fn)
        return fn

    return register


def _hc():
    import hpccoll

    return hpccoll


def _seq(n: int, rank: int, dtype: str = "float64") -> np.ndarray:
    return (np.arange(n) + 10 * rank).astype(dtype)


@case("dtype/all_reduce", "float32 on the last rank, float64 elsewhere (4 elements)")
def _(c, odd):
    dt = "float32" if odd else "float64"
    x = _seq(4, c.rank, dt)
    want = sum(_seq(4, r, dt) for r in range(c.size))
    return _hc().all_reduce(x, c), want


@case("dtype/reduce_scatter", "float32 on the last rank, float64 elsewhere")
def _(c, odd):
    dt = "float32" if odd else "float64"
    x = _seq(2 * c.size, c.rank, dt)
    return _hc().reduce_scatter(x, c), sum(_seq(2 * c.size, r, dt) for r in range(c.size))[2 * c.rank : 2 * c.rank + 2]


@case("dtype/all_gather", "float32 on the last rank, float64 elsewhere, sizes given")
def _(c, odd):
    dt = "float32" if odd else "float64"
    y = _hc().all_gather(_seq(2, c.rank, dt), c, sizes=[2] * c.size)
    return y, np.concatenate([_seq(2, r, dt) for r in range(c.size)])


@case("dtype/all_gather/discover", "float32 on the last rank, float64 elsewhere, sizes=None")
def _(c, odd):
    dt = "float32" if odd else "float64"
    return _hc().all_gather(_seq(2, c.rank, dt), c), np.concatenate([_seq(2, r, dt) for r in range(c.size)])


@case("shape/all_reduce", "5 elements on the last rank, 4 elsewhere")
def _(c, odd):
    n = 5 if odd else 4
    return _hc().all_reduce(_seq(n, c.rank), c), sum(_seq(n, r) for r in range(c.size))


@case("shape/reduce_scatter", "2P + 2 elements on the last rank, 2P elsewhere")
def _(c, odd):
    n = 2 * c.size + 2 * odd
    got = _hc().reduce_scatter(_seq(n, c.rank), c)
    blocks = np.array_split(sum(_seq(n, r) for r in range(c.size)), c.size)
    return got, blocks[c.rank]


@case("shape/all_gather", "(2, 4) on the last rank, (2, 3) elsewhere, along axis 0, sizes given")
def _(c, odd):
    x = _seq(2 * (3 + odd), c.rank).reshape(2, 3 + odd)
    want = np.concatenate([_seq(2 * (3 + odd), r).reshape(2, 3 + odd) for r in range(c.size)])
    return _hc().all_gather(x, c, sizes=[2] * c.size), want


@case("axis/reduce_scatter", "axis 1 on the last rank, axis 0 elsewhere, (P, P) arrays")
def _(c, odd):
    ax = int(odd)
    x = _seq(c.size * c.size, c.rank).reshape(c.size, c.size)
    total = sum(_seq(c.size * c.size, r).reshape(c.size, c.size) for r in range(c.size))
    return _hc().reduce_scatter(x, c, axis=ax), np.take(total, [c.rank], axis=ax)


@case("axis/all_gather", "axis 1 on the last rank, axis 0 elsewhere, (2, 2) shards, sizes given")
def _(c, odd):
    ax = int(odd)
    x = _seq(4, c.rank).reshape(2, 2)
    want = np.concatenate([_seq(4, r).reshape(2, 2) for r in range(c.size)], axis=ax)
    return _hc().all_gather(x, c, axis=ax, sizes=[2] * c.size), want


@case("op/all_reduce", "max on the last rank, sum elsewhere")
def _(c, odd):
    op = "max" if odd else "sum"
    stack = np.stack([_seq(4, r) for r in range(c.size)])
    return _hc().all_reduce(_seq(4, c.rank), c, op=op), stack.max(0) if odd else stack.sum(0)


@case("op/reduce_scatter", "avg on the last rank, sum elsewhere")
def _(c, odd):
    op = "avg" if odd else "sum"
    total = sum(_seq(2 * c.size, r) for r in range(c.size)) / (c.size if odd else 1)
    return _hc().reduce_scatter(_seq(2 * c.size, c.rank), c, op=op), total[2 * c.rank : 2 * c.rank + 2]


@case("sizes-lie/all_gather", "sizes=[2]*P everywhere, but the last rank's shard has 3 elements")
def _(c, odd):
    x = _seq(2 + odd, c.rank)
    return _hc().all_gather(x, c, sizes=[2] * c.size), np.concatenate(
        [_seq(2 + (r == c.size - 1), r) for r in range(c.size)]
    )


@case("sizes-differ/all_gather", "the last rank passes sizes[0] = 3, the others 2; every shard has 2 elements")
def _(c, odd):
    sizes = [2] * c.size
    if odd:
        sizes[0] = 3
    x = _seq(2, c.rank)
    return _hc().all_gather(x, c, sizes=sizes), np.concatenate([_seq(s, r) for r, s in enumerate(sizes)])


def _scatter_sizes_differ(c, odd, k=None):
    """reduce_scatter with sizes=[3, 1, 2, ...] on the last rank, [2]*P elsewhere: one array, or a list of k."""
    sizes = [2] * c.size
    if odd:
        sizes[0], sizes[1] = 3, 1
    total = sum(_seq(2 * c.size, r) for r in range(c.size))
    lo = sum(sizes[: c.rank])
    x, want = _seq(2 * c.size, c.rank), total[lo : lo + sizes[c.rank]]
    if k is None:
        return _hc().reduce_scatter(x, c, sizes=sizes), want
    return _hc().reduce_scatter([x] * k, c, sizes=sizes), [want] * k


@case("sizes-differ/reduce_scatter", "sizes=[3, 1, 2, ...] on the last rank, [2]*P elsewhere")
def _(c, odd):
    return _scatter_sizes_differ(c, odd)


@case("collective/all_gather+reduce_scatter", "reduce_scatter on the last rank, all_gather elsewhere")
def _(c, odd):
    x = _seq(2 * c.size, c.rank)
    if odd:
        return _hc().reduce_scatter(x, c), sum(_seq(2 * c.size, r) for r in range(c.size))[2 * c.rank : 2 * c.rank + 2]
    return _hc().all_gather(x, c, sizes=[2 * c.size] * c.size), np.concatenate(
        [_seq(2 * c.size, r) for r in range(c.size)]
    )


@case("collective/all_reduce+reduce_scatter", "reduce_scatter on the last rank, all_reduce elsewhere")
def _(c, odd):
    x = _seq(2 * c.size, c.rank)
    total = sum(_seq(2 * c.size, r) for r in range(c.size))
    if odd:
        return _hc().reduce_scatter(x, c), total[2 * c.rank : 2 * c.rank + 2]
    return _hc().all_reduce(x, c), total


@case("collective/all_reduce+all_gather", "all_gather (sizes given) on the last rank, all_reduce elsewhere")
def _(c, odd):
    x = _seq(4, c.rank)
    if odd:
        return _hc().all_gather(x, c, sizes=[4] * c.size), np.concatenate([_seq(4, r) for r in range(c.size)])
    return _hc().all_reduce(x, c), sum(_seq(4, r) for r in range(c.size))


@case("op/reduce_scatter_adjoint", "op='max' (which has no adjoint) on the last rank, 'sum' elsewhere")
def _(c, odd):
    y = _seq(2, c.rank)
    got = _hc().reduce_scatter_adjoint(y, c, op="max" if odd else "sum", sizes=[2] * c.size)
    return got, np.concatenate([_seq(2, r) for r in range(c.size)])


@case("cotangent/all_reduce_adjoint", "cotangent='replicated' on the last rank, 'varying' elsewhere")
def _(c, odd):
    y = _seq(4, c.rank)
    got = _hc().all_reduce_adjoint(y, c, cotangent="replicated" if odd else "varying")
    return got, y if odd else sum(_seq(4, r) for r in range(c.size))


@case("collective/missing", "the last rank does not call at all (all_reduce elsewhere)")
def _(c, odd):
    if odd:
        return np.zeros(0), np.zeros(0)
    return _hc().all_reduce(_seq(4, c.rank), c), sum(_seq(4, r) for r in range(c.size))


@case("shape/shift", "5 elements on the last rank, 4 elsewhere")
def _(c, odd):
    n = [4 + (r == c.size - 1) for r in range(c.size)]
    source = (c.rank - 1) % c.size
    return _hc().shift(_seq(n[c.rank], c.rank), c), _seq(n[source], source)


@case("shape/shift/same-size", "(3, 2) on the last rank, (2, 3) elsewhere")
def _(c, odd):
    shape = (3, 2) if odd else (2, 3)
    source = (c.rank - 1) % c.size
    return _hc().shift(_seq(6, c.rank).reshape(shape), c), _seq(6, source).reshape(shape)


@case("dtype/shift", "float32 on the last rank, float64 elsewhere")
def _(c, odd):
    dt = "float32" if odd else "float64"
    source = (c.rank - 1) % c.size
    return _hc().shift(_seq(4, c.rank, dt), c), _seq(4, source, dt)


@case("shape/broadcast", "5 elements on the last rank, 4 elsewhere (root 0)")
def _(c, odd):
    return _hc().broadcast(_seq(4 + odd, c.rank), c), _seq(4 + odd, 0)


# --------------------------------------------------------------------------- all_to_all


def _a2a_want(c, n: int, dt: str = "float64", shape=None) -> np.ndarray:
    """Block ``c.rank`` (2 elements along axis 0) of every rank's ``_seq``, concatenated: the equal-axes answer."""
    xs = [_seq(n, r, dt) if shape is None else _seq(n, r, dt).reshape(shape) for r in range(c.size)]
    return np.concatenate([x[2 * c.rank : 2 * c.rank + 2] for x in xs])


@case("dtype/all_to_all", "float32 on the last rank, float64 elsewhere, recv_sizes given")
def _(c, odd):
    dt = "float32" if odd else "float64"
    return _hc().all_to_all(_seq(2 * c.size, c.rank, dt), c, recv_sizes=[2] * c.size), _a2a_want(c, 2 * c.size, dt)


@case("dtype/all_to_all/discover", "float32 on the last rank, float64 elsewhere, recv_sizes=None")
def _(c, odd):
    dt = "float32" if odd else "float64"
    return _hc().all_to_all(_seq(2 * c.size, c.rank, dt), c), _a2a_want(c, 2 * c.size, dt)


@case("shape/all_to_all", "(2P, 4) on the last rank, (2P, 3) elsewhere, recv_sizes given")
def _(c, odd):
    shape = (2 * c.size, 3 + odd)
    x = _seq(shape[0] * shape[1], c.rank).reshape(shape)
    return _hc().all_to_all(x, c, recv_sizes=[2] * c.size), _a2a_want(c, shape[0] * shape[1], shape=shape)


@case("axis/all_to_all", "concat_axis 1 on the last rank, 0 elsewhere, (2P, 2P) arrays, recv_sizes given")
def _(c, odd):
    P, ca = c.size, int(odd)
    xs = [_seq(4 * P * P, r).reshape(2 * P, 2 * P) for r in range(P)]
    recv = [2 * P] * P if odd else [2] * P  # axes differing: each rank's extent along concat_axis
    want = np.concatenate([x[2 * c.rank : 2 * c.rank + 2] for x in xs], axis=ca)
    return _hc().all_to_all(xs[c.rank], c, concat_axis=ca, recv_sizes=recv), want


@case("sizes-differ/all_to_all", "split (0 -> 1) [3, 1, 2, ...] on the last rank, [2]*P elsewhere, recv_sizes given")
def _(c, odd):
    sizes = [2] * c.size
    if odd:
        sizes[0], sizes[1] = 3, 1
    xs = [_seq(4 * c.size, r).reshape(2 * c.size, 2) for r in range(c.size)]
    lo = sum(sizes[: c.rank])
    want = np.concatenate([x[lo : lo + sizes[c.rank]] for x in xs], axis=1)
    got = _hc().all_to_all(xs[c.rank], c, split_axis=0, concat_axis=1, sizes=sizes, recv_sizes=[2] * c.size)
    return got, want


@case("recv_sizes-lie/all_to_all", "the last rank's recv_sizes claim 3 elements from rank 0, which sends 2")
def _(c, odd):
    recv = [2 + (r == 0 and odd) for r in range(c.size)]
    return _hc().all_to_all(_seq(2 * c.size, c.rank), c, recv_sizes=recv), _a2a_want(c, 2 * c.size)


@case(
    "collective/all_to_all+all_gather",
    "all_gather (sizes given) on the last rank, all_to_all (recv_sizes given) elsewhere",
)
def _(c, odd):
    x = _seq(2 * c.size, c.rank)
    if odd:
        return _hc().all_gather(x, c, sizes=[2 * c.size] * c.size), np.concatenate(
            [_seq(2 * c.size, r) for r in range(c.size)]
        )
    return _hc().all_to_all(x, c, recv_sizes=[2] * c.size), _a2a_want(c, 2 * c.size)


# --------------------------------------------------------------------------- lists of arrays


@case("dtype/all_reduce/list", "[float64, float32] on the last rank, [float64, float64] elsewhere")
def _(c, odd):
    dt = "float32" if odd else "float64"
    xs = [_seq(4, c.rank), _seq(4, c.rank, dt)]
    return _hc().all_reduce(xs, c), [sum(_seq(4, r) for r in range(c.size)), sum(_seq(4, r, dt) for r in range(c.size))]


@case("length/all_reduce/list", "3 arrays on the last rank, 2 elsewhere")
def _(c, odd):
    k = 2 + odd
    return _hc().all_reduce([_seq(4, c.rank)] * k, c), [sum(_seq(4, r) for r in range(c.size))] * k


@case("length/all_gather/list/discover", "3 arrays on the last rank, 2 elsewhere, sizes=None")
def _(c, odd):
    k = 2 + odd
    return _hc().all_gather([_seq(2, c.rank)] * k, c), [np.concatenate([_seq(2, r) for r in range(c.size)])] * k


@case("shape/all_gather/list/discover", "the last rank's second array (2, 2), (2, 1) elsewhere, sizes=None")
def _(c, odd):
    xs = [_seq(2, c.rank), _seq(4 if odd else 2, c.rank).reshape(2, -1)]
    want = [
        np.concatenate([_seq(2, r) for r in range(c.size)]),
        np.concatenate([_seq(4 if odd else 2, r).reshape(2, -1) for r in range(c.size)]),
    ]
    return _hc().all_gather(xs, c), want


@case("length/all_to_all/list/discover", "3 arrays on the last rank, 2 elsewhere, recv_sizes=None")
def _(c, odd):
    k = 2 + odd
    return _hc().all_to_all([_seq(2 * c.size, c.rank)] * k, c), [_a2a_want(c, 2 * c.size)] * k


@case("sizes-differ/reduce_scatter/list", "sizes=[3, 1, 2, ...] on the last rank, [2]*P elsewhere, two arrays")
def _(c, odd):
    return _scatter_sizes_differ(c, odd, k=2)


@case("length/all_reduce_adjoint/replicated-list", "a replicated cotangent: 2 arrays on the last rank, 1 elsewhere")
def _(c, odd):
    ys = [_seq(4, 0)] * (1 + odd)
    return _hc().all_reduce_adjoint(ys, c, cotangent="replicated"), ys


# --------------------------------------------------------------------------- non-blocking calls (async_op=True)


@case("dtype/all_reduce/async", "float32 on the last rank, float64 elsewhere, async_op=True")
def _(c, odd):
    dt = "float32" if odd else "float64"
    return _hc().all_reduce(_seq(4, c.rank, dt), c, async_op=True).wait(), sum(_seq(4, r, dt) for r in range(c.size))


@case("op/all_reduce/async", "max on the last rank, sum elsewhere, async_op=True")
def _(c, odd):
    stack = np.stack([_seq(4, r) for r in range(c.size)])
    got = _hc().all_reduce(_seq(4, c.rank), c, op="max" if odd else "sum", async_op=True).wait()
    return got, stack.max(0) if odd else stack.sum(0)


@case("sizes-differ/all_gather/async", "the last rank passes sizes[0] = 3, the others 2, async_op=True")
def _(c, odd):
    sizes = [2] * c.size
    if odd:
        sizes[0] = 3
    got = _hc().all_gather(_seq(2, c.rank), c, sizes=sizes, async_op=True).wait()
    return got, np.concatenate([_seq(s, r) for r, s in enumerate(sizes)])


@case("shape/all_to_all/async/discover", "(2P, 4) on the last rank, (2P, 3) elsewhere, recv_sizes=None, async_op=True")
def _(c, odd):
    shape = (2 * c.size, 3 + odd)
    x = _seq(shape[0] * shape[1], c.rank).reshape(shape)
    return _hc().all_to_all(x, c, async_op=True).wait(), _a2a_want(c, shape[0] * shape[1], shape=shape)


@case("async+blocking/all_reduce", "async_op=True on the last rank, blocking elsewhere")
def _(c, odd):
    got = _hc().all_reduce(_seq(4, c.rank), c, async_op=bool(odd))
    return (got.wait() if odd else got), sum(_seq(4, r) for r in range(c.size))


@case("async+blocking/all_to_all", "async_op=True on the last rank, blocking elsewhere, recv_sizes given")
def _(c, odd):
    got = _hc().all_to_all(_seq(2 * c.size, c.rank), c, recv_sizes=[2] * c.size, async_op=bool(odd))
    return (got.wait() if odd else got), _a2a_want(c, 2 * c.size)


def _right(got, want) -> bool:
    """``got`` equals ``want`` (arrays, or lists of them), shapes included."""
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(_right(g, w) for g, w in zip(got, want))
    return bool(got.shape == want.shape and np.array_equal(got, want))


def run_case(name: str, check: bool, out: str) -> int:
    """Run one case on this rank (under mpiexec); write what happened to ``out/RANK.json``."""
    hpccoll = _hc()
    comm = hpccoll.Communicator(check=check)
    odd = comm.rank == comm.size - 1
    report = {"rank": comm.rank}
    try:
        got, want = CASES[name][1](comm, odd)
        report["returned"] = True
        report["right"] = _right(got, want)
    except Exception as exc:  # noqa: BLE001 - the point is to see what is raised
        report["returned"] = False
        report["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    print(json.dumps(report), flush=True)
    if out:
        pathlib.Path(out, f"{comm.rank}.json").write_text(json.dumps(report))
    if not report["returned"]:
        raise SystemExit(1)  # under python -m mpi4py: MPI_Abort, as for any uncaught exception
    return 0


def classify(results: List[dict], size: int, rc: int, hung: bool, fatal: str) -> str:
    """A few words for what the job did (see the module docstring)."""
    raised = [r["rank"] for r in results if not r["returned"]]
    if len(raised) == size:  # the same exception type on every rank, or not (the messages may name the rank)
        return "error everywhere" if len({r["error"].split(":")[0] for r in results}) == 1 else "errors differ by rank"
    if hung:
        return f"hang (after an error on rank {raised[0]})" if raised else "hang"
    if raised:
        return f"abort (rank {raised[0]} raised)"
    if rc == 124:
        return "abort (watchdog)"
    if len(results) < size or rc != 0:
        return f"abort (MPI: {fatal})" if fatal else f"exit {rc}"
    return "benign" if all(r["right"] for r in results) else "wrong answer"


def run_table(names: List[str], np_: int, limit: float, check: bool, timeout: float) -> int:
    """Launch every case in its own job and print a Markdown table."""
    bindir = pathlib.Path(sys.executable).parent
    mpiexec = os.environ.get("MPIEXEC", str(bindir / "mpiexec"))
    env = (
        dict(os.environ, HPCCOLL_TIMEOUT=str(timeout))
        if timeout
        else {k: v for k, v in os.environ.items() if k != "HPCCOLL_TIMEOUT"}
    )
    mode = f"check={'on' if check else 'off'}" + (f", HPCCOLL_TIMEOUT={timeout:g}" if timeout else "")
    print(f"| case | the last of {np_} ranks ... | {mode}: outcome | seconds | what the ranks saw |")
    print("|---|---|---|---|---|")
    for name in names:
        folder = tempfile.mkdtemp(prefix="mismatch-")
        cmd = [mpiexec, "-n", str(np_), sys.executable, "-m", "mpi4py", __file__, "--run", name, "--out", folder]
        if check:
            cmd.append("--check")
        start = time.monotonic()
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
        )
        try:
            out, _ = proc.communicate(timeout=limit)
            hung = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            hung = True
        elapsed = time.monotonic() - start
        results = [json.loads(p.read_text()) for p in sorted(pathlib.Path(folder).glob("*.json"))]
        shutil.rmtree(folder)
        fatal = next(
            (
                line.split("Fatal error in ", 1)[1].split(", error stack")[0]
                for line in out.splitlines()
                if "Fatal error in " in line
            ),
            "",
        )
        saw = (
            "; ".join(
                f"{r['rank']}: " + (("right" if r["right"] else "WRONG") if r["returned"] else r["error"])
                for r in results
            )
            or "-"
        )
        outcome = classify(results, np_, proc.returncode, hung, fatal)
        print(f"| {name} | {CASES[name][0]} | {outcome} | {elapsed:.1f} | {saw} |", flush=True)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", metavar="NAME", help="run one case on this rank (inside mpiexec)")
    parser.add_argument("--out", default="", help="with --run: a folder for each rank's JSON report")
    parser.add_argument("--case", nargs="*", default=None, help="cases for the table (default: all)")
    parser.add_argument("--check", action="store_true", help="turn on hpccoll's check mode")
    parser.add_argument("--np", type=int, default=2, help="ranks per job (default 2)")
    parser.add_argument("--limit", type=float, default=10.0, help="seconds before a job counts as hung (default 10)")
    parser.add_argument(
        "--timeout", type=float, default=0.0, help="run the jobs with HPCCOLL_TIMEOUT set to this (default off)"
    )
    args = parser.parse_args(argv)
    if args.run:
        return run_case(args.run, args.check, args.out)
    return run_table(args.case or list(CASES), args.np, args.limit, args.check, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
