"""Plant GPU ordering and lifetime bugs one at a time and see whether the stand-in tests catch them.

    python benchmarks/mutations.py [--np 2] [--scratch /tmp/mut] [--old-ref 644ac59] [--only 1 3 ...]

For each mutation below the script copies the repository (tracked and
untracked, not ignored, files) to ``--scratch``, plants the bug by an exact
text substitution (and says so plainly when the text is no longer there: the
GPU transports are being rewritten, so a pattern may need updating), then runs
``tests/test_nccl_standin.py`` at ``--np`` ranks, stopping at the first
failure, on this checkout's stand-in (``tests/``: deferred streams, race
detector, poisoned lifetimes, NCCL's argument rules).

A run that fails (a failed test, an abort, or a hang cut short by
``HPCCOLL_STANDIN_HANG_SECONDS`` or the time limit) counts as caught, and its
first error is shown. An unmutated copy runs first: it must pass, or the table
means nothing. The table is printed as Markdown (docs/reliability.md holds a
copy with the command that made it).

The "old stand-in" column is **not measured here**: it is the result recorded
on 2026-11-30, when these bugs were planted in the code of that day and run
against the eager stand-in of commit 644ac59 (its three test files). Running
644ac59's tests against today's code proves nothing (they no longer import),
so the column is printed from ``RECORDED_OLD`` and labelled as recorded.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time
from typing import List, NamedTuple, Tuple

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: The old (eager) stand-in's verdicts, commit 644ac59's tests, as recorded on 2026-11-30 (not re-measured).
RECORDED_OLD = {
    "1": "caught (sync counter)",
    "2": "not a detection (NumPy arrays cannot be freed)",
    "2b": "not a detection (NumPy arrays cannot be freed)",
    "2c": "missed",
    "3": "caught (call log)",
    "4": "caught (by chance: numpy.empty held no valid data)",
    "5": "missed",
    "6": "caught (call log)",
    "6b": "missed",
}
NCCL, STAGED = "hpccoll/transports/nccl.py", "hpccoll/transports/staged.py"


class Mutation(NamedTuple):
    key: str
    bug: str
    path: str
    old: str
    new: str


MUTATIONS = [
    Mutation(
        "1",
        "staged: no stream synchronisation before the host reads the pinned copy",
        STAGED,
        "            rt.to_host(recv if send is None else send, hr if send is None else hs)\n"
        "            rt.sync_stream()\n",
        "            rt.to_host(recv if send is None else send, hr if send is None else hs)\n",
    ),
    Mutation(
        "1b",
        "staged plan: no stream synchronisation before host MPI reads the plan's pinned copy",
        STAGED,
        "            rt.sync_stream()  # on every rank, whatever it copied: capture refused alike everywhere\n",
        "",
    ),
    Mutation(
        "1c",
        "cuda_mpi plan: host MPI's prepared call run without the stream synchronisation before it",
        "hpccoll/transports/cuda_mpi.py",
        "        def synchronised_run() -> None:\n            sync()\n",
        "        def synchronised_run() -> None:\n",
    ),
    Mutation(
        "2",
        "nccl: padding temporary freed right after enqueuing its allGather (copies out of it queued later)",
        NCCL,
        "        self._nc.allGather(self._rt.ptr(padded_send), self._rt.ptr(padded), widest, t, stream)\n",
        "        self._nc.allGather(self._rt.ptr(padded_send), self._rt.ptr(padded), widest, t, stream)\n"
        "        padded.data.mem.free()  # planted\n",
    ),
    Mutation(
        "2b",
        "nccl: widening temporary (int16 reduce-scatter) freed right after enqueuing the NCCL call",
        NCCL,
        "            self._enqueue_reduce_scatter(send.astype(route.wire.view), wide, counts, op)\n",
        "            self._enqueue_reduce_scatter(send.astype(route.wire.view), wide, counts, op)\n"
        "            wide.data.mem.free()  # planted\n",
    ),
    Mutation(
        "2c",
        "staged: pinned buffers reused (or regrown) without waiting for the previous copy out of them",
        STAGED,
        "        if self.stream is not None:\n"
        '            assert self.event is not None, "recorded with the stream"\n'
        "            self.event.synchronize()\n"
        "            self.stream = None\n",
        "        self.stream = None  # planted\n",
    ),
    Mutation(
        "3",
        "nccl: every call enqueued on the default stream instead of the caller's",
        NCCL,
        "self._rt.stream()",
        "0",
    ),
    Mutation(
        "4",
        "nccl: result copied out of the padded receive buffer before the reduceScatter is enqueued",
        NCCL,
        "        self._nc.reduceScatter(self._rt.ptr(padded), self._rt.ptr(mine), widest, t, o, stream)\n"
        "        if mine is not recv:\n            recv[...] = mine[: counts[me]]\n",
        "        if mine is not recv:\n            recv[...] = mine[: counts[me]]\n"
        "        self._nc.reduceScatter(self._rt.ptr(padded), self._rt.ptr(mine), widest, t, o, stream)\n",
    ),
    Mutation(
        "5",
        "nccl: misaligned in-place allGather (own block staged at recv's start, sendbuff = recvbuff)",
        NCCL,
        "            nc.allGather(rt.ptr(send), rt.ptr(recv), n, wire.type, rt.stream())\n",
        "            recv[:first] = send  # planted\n"
        "            nc.allGather(rt.ptr(recv), rt.ptr(recv), n, wire.type, rt.stream())\n",
    ),
    Mutation(
        "6",
        "nccl: no chunking: calls above the largest count go out whole",
        NCCL,
        "    for offset in range(0, count, limit):\n        yield offset, min(limit, count - offset)\n",
        "    if count:  # planted\n        yield 0, count\n",
    ),
    Mutation(
        "6b",
        "nccl: default largest count above C int (what older CuPy's broadcast/bcast take)",
        NCCL,
        "    max_count: int = INT_MAX\n",
        "    max_count: int = 2**63 - 1\n",
    ),
]


def repo_files() -> List[str]:
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return [f for f in out.splitlines() if (ROOT / f).is_file()]


def fresh_copy(dest: pathlib.Path, files: List[str]) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    for f in files:
        target = dest / f
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, target)


def plant(tree: pathlib.Path, m: Mutation) -> Tuple[bool, str]:
    """Apply ``m`` in ``tree``; ``(applied, note)``."""
    path = tree / m.path
    text = path.read_text()
    n = text.count(m.old)
    if n == 0:
        first = m.old.strip().splitlines()[0]
        return False, (
            f"PATTERN NO LONGER MATCHES: {m.path} does not contain {first!r} any more; "
            "update benchmarks/mutations.py for the rewritten code"
        )
    path.write_text(text.replace(m.old, m.new))
    return True, f"{n} site{'s' if n > 1 else ''}"


def run_suite(tree: pathlib.Path, np_: int, timeout: int, hang: int) -> Tuple[str, str, float]:
    """Run the stand-in tests in ``tree``; ``(verdict, first error, seconds)``."""
    py = ROOT / ".venv" / "bin" / "python"
    mpiexec = ROOT / ".venv" / "bin" / "mpiexec"
    env = dict(os.environ, PYTHONPATH=str(tree), HPCCOLL_STANDIN_HANG_SECONDS=str(hang), PYTHONDONTWRITEBYTECODE="1")
    for name in ("HPCCOLL_STANDIN_MODE", "HPCCOLL_TIMEOUT", "HPCCOLL_TRANSPORT", "HPCCOLL_NCCL_UNEVEN"):
        env.pop(name, None)
    cmd = [
        str(mpiexec),
        "-n",
        str(np_),
        str(py),
        "-m",
        "mpi4py",
        "-m",
        "pytest",
        "--with-mpi",
        "-q",
        "-x",
        "-p",
        "no:cacheprovider",
        "tests/test_nccl_standin.py",
    ]
    t0 = time.monotonic()
    try:
        done = subprocess.run(
            cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout, start_new_session=True
        )
        out, rc = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        rc = None
    seconds = time.monotonic() - t0
    if rc == 0:
        return "passes", "", seconds
    failed = re.search(r"^FAILED (\S+)", out, re.M)
    where = failed.group(1).split("::")[-1] if failed else "?"
    block = re.search(r"((?:^E .*\n)+)", out, re.M)  # the first failure's E lines
    lines = [ln[1:].strip() for ln in block.group(1).splitlines()] if block else []
    what = re.sub(r"\bstandin_(cupy|nccl)\.", "", " ".join(ln for ln in lines if ln))[:110]
    what = what or ("time limit" if rc is None else f"exit status {rc}")
    if rc is None:
        return "hangs (cut at the time limit)", f"{where}: {what}", seconds
    if what.startswith("AttributeError"):  # the planted code cannot even run on this stand-in's arrays
        return "errors", f"{where}: {what}", seconds
    return "fails", f"{where}: {what}", seconds


def check_imports(tree: pathlib.Path) -> None:
    """The scratch copy's hpccoll must be the one imported (not this checkout's editable install)."""
    py = ROOT / ".venv" / "bin" / "python"
    got = subprocess.run(
        [str(py), "-c", "import hpccoll; print(hpccoll.__file__)"],
        cwd=tree,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(tree)),
    ).stdout.strip()
    if not got.startswith(str(tree)):
        sys.exit(f"mutations: the scratch copy would import hpccoll from {got}, not from {tree}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--np", type=int, default=2, help="MPI ranks (default 2; NCCL is not called at 1)")
    ap.add_argument("--scratch", default="/tmp/mut", help="scratch folder (default /tmp/mut; emptied)")
    ap.add_argument("--only", nargs="*", help="mutation keys to run (default: all)")
    ap.add_argument("--timeout", type=int, default=240, help="seconds per test run (default 240)")
    ap.add_argument("--hang", type=int, default=15, help="HPCCOLL_STANDIN_HANG_SECONDS for the runs (default 15)")
    args = ap.parse_args()

    scratch = pathlib.Path(args.scratch).resolve()
    files = repo_files()
    chosen = [m for m in MUTATIONS if not args.only or m.key in args.only]

    def tree_for(name: str) -> pathlib.Path:
        tree = scratch / name
        fresh_copy(tree, files)
        return tree

    print(f"mutations: {len(chosen)} mutations, tests/test_nccl_standin.py at {args.np} ranks, scratch {scratch}")
    print(
        "mutations: the 'old stand-in' column is the result recorded on 2026-11-30 (commit 644ac59's tests "
        "on that day's code), not measured by this run"
    )
    tree = tree_for("baseline")
    check_imports(tree)
    verdict, error, secs = run_suite(tree, args.np, args.timeout, args.hang)
    print(f"  baseline: {verdict} ({secs:.0f} s) {error}", flush=True)
    baseline_ok = verdict == "passes"
    if not baseline_ok:
        print("mutations: the unmutated copy does not pass; the table below would mean nothing")

    rows: List[Tuple[Mutation, str, str]] = []
    for m in chosen:
        tree = tree_for(f"m{m.key}")
        applied, note = plant(tree, m)
        if not applied:
            print(f"  {m.key}: {note}", flush=True)
            rows.append((m, "NOT RUN: pattern gone", note))
            continue
        verdict, error, secs = run_suite(tree, args.np, args.timeout, args.hang)
        print(f"  {m.key} ({note}): {verdict} ({secs:.0f} s) {error}", flush=True)
        rows.append((m, "missed" if verdict == "passes" else "**caught**", error))

    print()
    print("| # | planted bug | new stand-in (measured now) | old stand-in (recorded 2026-11-30) |")
    print("|---|---|---|---|")
    for m, label, error in rows:
        shown = f"{label}: `{error}`" if error else label
        print(f"| {m.key} | {m.bug} | {shown} | {RECORDED_OLD.get(m.key, 'not recorded')} |")
    caught = sum(1 for _, label, _ in rows if label == "**caught**")
    old_caught = sum(1 for m, _, _ in rows if RECORDED_OLD.get(m.key, "").startswith("caught"))
    print(f"\nnew stand-in: {caught} of {len(rows)} caught; old stand-in (recorded): {old_caught} of {len(rows)}")
    if not baseline_ok or caught < len(rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
