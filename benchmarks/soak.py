"""Soak: a random mix of every collective and adjoint, each result checked against NumPy, for a set time.

Launch (4 ranks, check mode on, is the reference setting):

    mpiexec -n 4 python -m mpi4py benchmarks/soak.py [--minutes 10] [--seed S] [--no-check] [--call-limit 60]

Every rank draws the same case from one random stream (rank 0's seed,
broadcast): a collective or adjoint (all_gather, reduce_scatter, all_reduce,
all_to_all, their adjoints, the replicated all-reduce cotangent, an in-place
all_reduce), a dtype (every supported one), an op, 0-D to 4-D shapes with
zero extents, an axis (all_to_all: a split and a concat axis, equal or not),
uneven shards (all_to_all: a split per rank when the axes are equal, with
``sizes`` and ``recv_sizes`` each given or learned), a memory layout for the input and for ``out=``,
derived-datatype gathers forced on for small arrays (one round in four), and
now and then a deliberate cross-rank mismatch that check mode must report
with the same error on every rank. Each rank builds the global data with a
leading rank axis from the case's seed, takes its slice, calls hpccoll and
compares with the NumPy reference (the test suite's, from tests/conftest.py):
bitwise for data movement, per-dtype tolerance for reductions; inputs must
come back unmodified.

Hangs: the communicator runs under the watchdog (``HPCCOLL_TIMEOUT`` =
``--call-limit`` seconds), so a call that never returns ends the job with
status 124 and a message naming it; a finished run therefore had none, and
reports its slowest call. Rank 0 decides when time is up and tells the
others with each round's broadcast, so every rank runs the same rounds.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import secrets
import sys
import time
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
from conftest import DTYPES, LAYOUTS, assert_close, assert_same, forced_datatypes, layout, make, reference  # noqa: E402

import hpccoll  # noqa: E402

KINDS = [
    "all_gather",
    "all_gather_adjoint",
    "reduce_scatter",
    "reduce_scatter_adjoint",
    "all_reduce",
    "all_reduce in place",
    "all_reduce_adjoint",
    "all_reduce_adjoint replicated",
    "all_to_all",
    "all_to_all_adjoint",
]
MISMATCH_EVERY = 25  # about one round in this many is a deliberate cross-rank mismatch (check mode only)


def unsupported(dtype: np.dtype, op: str) -> bool:
    return (op == "avg" and dtype.kind in "biu") or (dtype.kind == "c" and op in ("max", "min"))


class Case:
    """One round's draws, the same on every rank (the random stream is shared)."""

    def __init__(self, rng: np.random.Generator, size: int) -> None:
        self.kind = KINDS[rng.integers(len(KINDS))]
        self.dtype = DTYPES[rng.integers(len(DTYPES))]
        ops = ["sum", "avg"] if "adjoint" in self.kind else list(hpccoll.OPS)
        ops = [op for op in ops if not unsupported(self.dtype, op)] or ["sum"]
        if self.kind.endswith("adjoint") or self.kind.endswith("replicated"):
            ops = [
                op for op in ops if self.dtype.kind != "b"
            ] or ops  # bool sums are OR: no true adjoint, still checked
        self.op = ops[rng.integers(len(ops))]
        gathers = self.kind in (
            "all_gather",
            "all_gather_adjoint",
            "reduce_scatter",
            "reduce_scatter_adjoint",
            "all_to_all",
            "all_to_all_adjoint",
        )
        ndim = int(rng.integers(1 if gathers else 0, 5))
        side = [3, 6, 16, 64, 256][rng.integers(5)] if ndim <= 2 else [3, 5][rng.integers(2)]
        self.shape = tuple(int(rng.integers(0, side + 1)) for _ in range(ndim))
        self.axis = int(rng.integers(-ndim, ndim)) if ndim else 0
        self.concat_axis = int(rng.integers(-ndim, ndim)) if ndim else 0  # all_to_all's (self.axis: its split_axis)
        self.pass_recv_sizes = bool(rng.integers(2))
        self.extents = [int(rng.integers(0, 5)) for _ in range(size)]  # uneven shards, zeros included
        self.pass_sizes = bool(rng.integers(2))
        self.x_layout = LAYOUTS[rng.integers(len(LAYOUTS))]
        self.out_layout = LAYOUTS[rng.integers(len(LAYOUTS))] if rng.integers(2) else None
        self.datatypes = int(rng.integers(4)) == 0  # derived-datatype gathers forced on for small arrays too
        self.seed = int(rng.integers(2**32))
        self.mismatch = int(rng.integers(MISMATCH_EVERY)) == 0

    def __str__(self) -> str:
        return (
            f"{self.kind} {self.dtype} op={self.op} shape={self.shape} axis={self.axis} "
            f"concat_axis={self.concat_axis} recv_sizes given={self.pass_recv_sizes} extents={self.extents} "
            f"sizes given={self.pass_sizes} layout={self.x_layout} out={self.out_layout} "
            f"datatypes={self.datatypes} seed={self.seed}"
        )


def with_extent(shape: Tuple[int, ...], axis: int, n: int) -> Tuple[int, ...]:
    return shape[:axis] + (n,) + shape[axis + 1 :]


def block(a: np.ndarray, axis: int, sizes: List[int], rank: int) -> np.ndarray:
    lo = sum(sizes[:rank])
    index = [slice(None)] * a.ndim
    index[axis] = slice(lo, lo + sizes[rank])
    return a[tuple(index)]


def alltoall_reference(inputs: List[np.ndarray], sa: int, ca: int, splits: List[List[int]], rank: int) -> np.ndarray:
    """Block ``rank`` of every rank's input (rank q's split along ``sa`` by ``splits[q]``), concatenated along ``ca``."""
    return np.concatenate([block(x, sa, s, rank) for x, s in zip(inputs, splits)], axis=ca)


def prepare_alltoall(
    case: Case, c: hpccoll.Communicator
) -> Tuple[np.ndarray, Callable[[np.ndarray, Any], Any], np.ndarray, bool]:
    """``prepare`` for all_to_all and its adjoint: every rank's input made on every rank, NumPy's blocks.

    Axes equal: each rank q splits its own way (``table[q]``, extents 0-4, from
    the case's seed). Axes differing: one split (``case.extents``) shared by
    every rank, and each rank's own extent along ``concat_axis``. Not given,
    ``sizes`` is numpy.array_split's; ``recv_sizes`` are learned (the forward)
    or the forward's (the adjoint, whose default would be array_split's).
    """
    P, r, dt = c.size, c.rank, case.dtype
    nd = len(case.shape)
    sa, ca = case.axis % nd, case.concat_axis % nd
    draw = np.random.default_rng(case.seed)
    if sa == ca:
        table = [[int(v) for v in draw.integers(0, 5, P)] for _ in range(P)]
        along = [0] * P
    else:
        table = [list(case.extents)] * P
        along = [int(v) for v in draw.integers(0, 5, P)]  # each rank's extent along concat_axis
    shapes = []
    for q in range(P):
        shape = with_extent(case.shape, sa, sum(table[q]))
        shapes.append(with_extent(shape, ca, along[q]) if sa != ca else shape)
    if not case.pass_sizes:  # what the call will split by: array_split's of each rank's extent
        table = [list(hpccoll.split_sizes(s[sa], P)) for s in shapes]
    recv = [[table[q][j] if sa == ca else along[q] for q in range(P)] for j in range(P)]  # recv[j][q]: j's from q
    xs = [make(shapes[q], dt, case.seed + 1 + q) for q in range(P)]
    sizes = table[r] if case.pass_sizes else None
    if case.kind == "all_to_all":
        call = lambda x, out: hpccoll.all_to_all(  # noqa: E731
            x,
            c,
            split_axis=case.axis,
            concat_axis=case.concat_axis,
            sizes=sizes,
            recv_sizes=recv[r] if case.pass_recv_sizes else None,
            out=out,
        )
        return xs[r], call, alltoall_reference(xs, sa, ca, table, r), True
    # the adjoint: cotangents of every rank's forward result, sent back (split along ca by recv, joined along sa)
    ys = [make(alltoall_reference(xs, sa, ca, table, q).shape, dt, case.seed + 1 + P + q) for q in range(P)]
    call = lambda x, out: hpccoll.all_to_all_adjoint(  # noqa: E731
        x,
        c,
        split_axis=case.axis,
        concat_axis=case.concat_axis,
        sizes=sizes if case.pass_recv_sizes else None,
        recv_sizes=recv[r],
        out=out,
    )
    return ys[r], call, alltoall_reference(ys, ca, sa, recv, r), True


def prepare(
    case: Case, c: hpccoll.Communicator
) -> Tuple[np.ndarray, Callable[[np.ndarray, Any], Any], np.ndarray, bool]:
    """(this rank's input, the call on (input, out), the expected result, whether the comparison is exact)."""
    P, r, dt, op = c.size, c.rank, case.dtype, case.op
    ax = case.axis % len(case.shape) if case.shape else 0
    kind, sizes = case.kind, case.extents
    given = sizes if case.pass_sizes else None
    if kind in ("all_to_all", "all_to_all_adjoint"):
        return prepare_alltoall(case, c)
    if kind == "all_gather":
        full = make(with_extent(case.shape, ax, sum(sizes)), dt, case.seed)
        return (
            block(full, ax, sizes, r),
            lambda x, out: hpccoll.all_gather(x, c, axis=case.axis, sizes=given, out=out),
            full,
            True,
        )
    if kind == "all_gather_adjoint":  # the forward's extents travel with it
        stack = make((P,) + with_extent(case.shape, ax, sum(sizes)), dt, case.seed)
        call = lambda x, out: hpccoll.all_gather_adjoint(x, c, axis=case.axis, sizes=sizes, out=out)  # noqa: E731
        return stack[r, ...], call, block(reference(stack, "sum"), ax, sizes, r), False
    if kind == "reduce_scatter":
        full_shape = with_extent(case.shape, ax, sum(sizes)) if case.pass_sizes else case.shape
        split = sizes if case.pass_sizes else list(hpccoll.split_sizes(full_shape[ax], P))
        stack = make((P,) + full_shape, dt, case.seed)
        call = lambda x, out: hpccoll.reduce_scatter(x, c, op=op, axis=case.axis, sizes=given, out=out)  # noqa: E731
        return stack[r, ...], call, block(reference(stack, op), ax, split, r), False
    if kind == "reduce_scatter_adjoint":
        gathered = make(with_extent(case.shape, ax, sum(sizes)), dt, case.seed)
        want = gathered / dt.type(P) if op == "avg" and P > 1 else gathered
        call = lambda x, out: hpccoll.reduce_scatter_adjoint(x, c, op=op, axis=case.axis, sizes=sizes, out=out)  # noqa: E731
        return block(gathered, ax, sizes, r), call, want, op == "sum"
    stack = make((P,) + case.shape, dt, case.seed)
    if kind == "all_reduce":
        return stack[r, ...], lambda x, out: hpccoll.all_reduce(x, c, op=op, out=out), reference(stack, op), False
    if kind == "all_reduce in place":
        return stack[r, ...], lambda x, out: hpccoll.all_reduce(x, c, op=op, out=x), reference(stack, op), False
    if kind == "all_reduce_adjoint":
        return (
            stack[r, ...],
            lambda x, out: hpccoll.all_reduce_adjoint(x, c, op=op, out=out),
            reference(stack, op),
            False,
        )
    same = stack[0, ...]  # replicated: every rank holds the same cotangent
    want = same / dt.type(P) if op == "avg" and P > 1 else same
    call = lambda x, out: hpccoll.all_reduce_adjoint(x, c, op=op, cotangent="replicated", out=out)  # noqa: E731
    return same.copy(), call, want, op == "sum"


def mismatched(case: Case, c: hpccoll.Communicator) -> Callable[[], Any]:
    """A call in which the last rank differs from the others (by the case's seed): check mode must catch it."""
    odd = c.rank == c.size - 1
    which = case.seed % 5
    if which == 0:
        return lambda: hpccoll.all_reduce(np.ones(3, np.float32 if odd else np.float64), c)
    if which == 1:
        return lambda: hpccoll.reduce_scatter(np.ones(2 * c.size + odd), c)
    if which == 2:
        return lambda: hpccoll.all_reduce(np.ones(2), c, op="max" if odd else "sum")
    if which == 3:
        return lambda: hpccoll.all_to_all(np.ones((2 * c.size, 3 + odd)), c, recv_sizes=[2] * c.size)
    return lambda: (hpccoll.reduce_scatter if odd else hpccoll.all_gather)(np.ones(2 * c.size), c)


def run_round(case: Case, c: hpccoll.Communicator, stats: Dict[str, Any]) -> None:
    """One round: call, compare, count (locally; summed over ranks at the end)."""
    start = time.perf_counter()
    if case.mismatch and c.check and c.size > 1:
        try:
            mismatched(case, c)()
            ok, what = False, "a deliberate mismatch was not reported"
        except hpccoll.MismatchError as exc:
            messages = c.mpi.allgather(str(exc))
            ok, what = len(set(messages)) == 1, "mismatch reported differently on different ranks"
        stats["mismatches reported"] += ok
    else:
        x, call, want, exact = prepare(case, c)
        x = layout(x, case.x_layout)
        before = x.copy()
        out = None if case.out_layout is None else layout(np.zeros(want.shape, want.dtype), case.out_layout)
        what = ""
        try:
            with forced_datatypes(case.datatypes):
                got = call(x, out)
            (assert_same if exact else assert_close)(got, want)
            if case.kind != "all_reduce in place":
                assert_same(x, before)
            ok = True
        except Exception as exc:  # noqa: BLE001 - counted and reported
            ok, what = False, f"{type(exc).__name__}: {str(exc)[:300]}"
    seconds = time.perf_counter() - start
    stats["calls"][case.kind if not case.mismatch or c.size == 1 or not c.check else "mismatch (check mode)"] += 1
    stats["dtypes"][case.dtype.name] += 1
    stats["slowest"] = max(stats["slowest"], seconds)
    if not ok:
        stats["wrong"] += 1
        if len(stats["failures"]) < 5:
            stats["failures"].append(f"rank {c.rank}: {case}: {what}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to run (default 10)")
    parser.add_argument("--seed", type=int, default=None, help="the random stream's seed (default: rank 0 picks one)")
    parser.add_argument(
        "--no-check", action="store_true", help="run without check mode (and without the mismatch rounds)"
    )
    parser.add_argument(
        "--call-limit", type=float, default=60.0, help="HPCCOLL_TIMEOUT for every call, seconds (default 60)"
    )
    parser.add_argument("--json", help="also write the summary to this file (rank 0)")
    args = parser.parse_args(argv)
    os.environ["HPCCOLL_TIMEOUT"] = str(args.call_limit)
    c = hpccoll.Communicator(check=not args.no_check)
    seed = c.mpi.bcast(args.seed if args.seed is not None else secrets.randbits(32), root=0)
    rng = np.random.default_rng(seed)
    stats: Dict[str, Any] = {
        "calls": collections.Counter(),
        "dtypes": collections.Counter(),
        "wrong": 0,
        "mismatches reported": 0,
        "slowest": 0.0,
        "failures": [],
    }
    deadline = time.monotonic() + 60 * args.minutes
    start, rounds = time.monotonic(), 0
    while c.mpi.bcast(time.monotonic() < deadline if c.rank == 0 else None, root=0):
        run_round(Case(rng, c.size), c, stats)
        rounds += 1
    elapsed = time.monotonic() - start
    everyone = c.mpi.gather(stats, root=0)
    if c.rank == 0:
        calls = collections.Counter()
        dtypes = collections.Counter()
        for s in everyone:
            calls.update(s["calls"])
            dtypes.update(s["dtypes"])
        wrong = sum(s["wrong"] for s in everyone)
        summary = {
            "ranks": c.size,
            "check mode": c.check,
            "seed": seed,
            "minutes": round(elapsed / 60, 2),
            "rounds": rounds,
            "wrong results (all ranks)": wrong,
            "hangs": 0,
            "call limit (s)": args.call_limit,
            "slowest call (s)": round(max(s["slowest"] for s in everyone), 3),
            "mismatches reported on every rank": sum(s["mismatches reported"] for s in everyone) // c.size,
            "rounds per kind": dict(sorted((k, v // c.size) for k, v in calls.items())),
            "rounds per dtype": dict(sorted((k, v // c.size) for k, v in dtypes.items())),
            "failures": [f for s in everyone for f in s["failures"]][:10],
        }
        print(f"soak: {c.size} ranks, check mode {'on' if c.check else 'off'}, seed {seed}, {elapsed / 60:.1f} min")
        for key, value in summary.items():
            print(f"  {key}: {value}")
        print("PASS: 0 wrong results, 0 hangs" if wrong == 0 else f"FAIL: {wrong} wrong results")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(summary, f, indent=1)
    ok = c.mpi.bcast(everyone is not None and all(s["wrong"] == 0 for s in everyone) if c.rank == 0 else None, root=0)
    c.free()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
