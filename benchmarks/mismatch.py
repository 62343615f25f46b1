"""What a cross-rank mismatch does, with and without check mode: error, abort, hang or wrong answer.

Launch the whole table (it starts one ``mpiexec -n 2`` job per case, each under a time limit):

    python benchmarks/mismatch.py [--np 2] [--limit 10] [--check] [--timeout S] [--case NAME ...]

or one case by hand:

    mpiexec -n 2 python -m mpi4py benchmarks/mismatch.py --run NAME [--check]

In every case the *last* rank calls the collective differently from the others
(another dtype, shape, axis, op, ``sizes``, or another collective altogether).
Each rank reports (one JSON line, and a file for the table): whether its call returned or raised, and whether
what it returned equals the answer it would have got had every rank made its
call. The table classifies the job:

- ``error everywhere``: every rank raised (the check mode's promise);
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
from typing import Callable, Dict, List, Tuple

import numpy as np

# name -> (description, call); call(comm, odd) returns (result, the answer had every rank made this rank's call)
Case = Callable[..., Tuple[np.ndarray, np.ndarray]]
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
    return _hc().all_gather(x, c, sizes=[2] * c.size), np.concatenate([_seq(2 + (r == c.size - 1), r) for r in range(c.size)])


@case("sizes-differ/all_gather", "the last rank passes sizes[0] = 3, the others 2; every shard has 2 elements")
def _(c, odd):
    sizes = [2] * c.size
    if odd:
        sizes[0] = 3
    x = _seq(2, c.rank)
    return _hc().all_gather(x, c, sizes=sizes), np.concatenate([_seq(s, r) for r, s in enumerate(sizes)])


@case("sizes-differ/reduce_scatter", "sizes=[3, 1, 2, ...] on the last rank, [2]*P elsewhere")
def _(c, odd):
    sizes = [2] * c.size
    if odd:
        sizes[0], sizes[1] = 3, 1
    total = sum(_seq(2 * c.size, r) for r in range(c.size))
    lo = sum(sizes[: c.rank])
    return _hc().reduce_scatter(_seq(2 * c.size, c.rank), c, sizes=sizes), total[lo : lo + sizes[c.rank]]


@case("collective/all_gather+reduce_scatter", "reduce_scatter on the last rank, all_gather elsewhere")
def _(c, odd):
    x = _seq(2 * c.size, c.rank)
    if odd:
        return _hc().reduce_scatter(x, c), sum(_seq(2 * c.size, r) for r in range(c.size))[2 * c.rank : 2 * c.rank + 2]
    return _hc().all_gather(x, c, sizes=[2 * c.size] * c.size), np.concatenate([_seq(2 * c.size, r) for r in range(c.size)])


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


def run_case(name: str, check: bool, out: str) -> int:
    """Run one case on this rank (under mpiexec); write what happened to ``out/RANK.json``."""
    hpccoll = _hc()
    comm = hpccoll.Communicator(check=check)
    odd = comm.rank == comm.size - 1
    report = {"rank": comm.rank}
    try:
        got, want = CASES[name][1](comm, odd)
        report["returned"] = True
        report["right"] = bool(got.shape == want.shape and np.array_equal(got, want))
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
    if len(raised) == size:
        return "error everywhere"
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
    env = dict(os.environ, HPCCOLL_TIMEOUT=str(timeout)) if timeout else {k: v for k, v in os.environ.items() if k != "HPCCOLL_TIMEOUT"}
    mode = f"check={'on' if check else 'off'}" + (f", HPCCOLL_TIMEOUT={timeout:g}" if timeout else "")
    print(f"| case | the last of {np_} ranks ... | {mode}: outcome | seconds | what the ranks saw |")
    print("|---|---|---|---|---|")
    for name in names:
        folder = tempfile.mkdtemp(prefix="mismatch-")
        cmd = [mpiexec, "-n", str(np_), sys.executable, "-m", "mpi4py", __file__, "--run", name, "--out", folder]
        if check:
            cmd.append("--check")
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)
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
        fatal = next((line.split("Fatal error in ", 1)[1].split(", error stack")[0]
                      for line in out.splitlines() if "Fatal error in " in line), "")
        saw = "; ".join(
            f"{r['rank']}: " + (("right" if r["right"] else "WRONG") if r["returned"] else r["error"]) for r in results
        ) or "-"
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
    parser.add_argument("--timeout", type=float, default=0.0, help="run the jobs with HPCCOLL_TIMEOUT set to this (default off)")
    args = parser.parse_args(argv)
    if args.run:
        return run_case(args.run, args.check, args.out)
    return run_table(args.case or list(CASES), args.np, args.limit, args.check, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
