"""Prove hpccoll's GPU paths on a lent GPU machine in one call, and say what could not run (issue 43).

Two commands (standard library only, Python >= 3.9)::

    python3 jobs/gpu/gpu_check.py bundle --out gpu-bundle         # here: needs pip and PyPI
    python3 gpu-bundle/gpu_check.py run --bundle gpu-bundle --out "$OUT"   # on the GPU machine

``bundle`` puts everything a run needs into one folder (``make gpu-bundle``):
the mpich, mpi4py and pytest-mpi wheels for the GPU image's Python (3.12 by
default), the project as git sees its working tree (tracked files and new
files it does not ignore, as a tar), NCCL 2.30.7
built for Hopper (``../shared/gpu/libnccl.so.2.xz``) and this script.

``run`` needs nothing but a Python with NumPy (and CuPy, torch and JAX where
they are to be checked) and the bundle: no MPI library, no package registry
(``make gpu-check``). It installs the wheels into a scratch folder, unpacks
the project and NCCL there, then runs the steps below one after another,
each as a process group capped at its own limit and by one global deadline
(``--deadline``, 480 s): the GPU suite and the benchmark at 1, 2 and 4 ranks,
and which transport moves CuPy, torch and JAX arrays. At 2 and 4 ranks on
one GPU the suite runs on the bundled NCCL with ``NCCL_MULTI_RANK_GPU_ENABLE=1``
(``NCCL_MAX_CTAS=8`` at 4 ranks) when that library loads and says 2.30.7;
otherwise on the image's NCCL, where hpccoll refuses NCCL and tests the
refusal. A failed step does not stop the others. The report, Markdown and
JSON, dated, lands in ``--out``: the machine and every version, then each
step's command, status, time, summary and the tail of its output.

``run --dry`` is the CI rehearsal on a machine without a GPU: the same
bundle layout, installs, launches, deadline and report; the GPU steps find
no GPU and say so.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import lzma
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve()
#: The wheels a run installs: MPI and the launcher's test plugin (the GPU image has neither).
WHEELS = ["mpich==5.0.2", "mpi4py==4.1.2", "pytest-mpi==0.6"]
#: Installed only when the Python that runs the check lacks pytest.
PYTEST_WHEELS = ["pytest==8.3.5", "pluggy==1.5.0", "iniconfig==2.0.0", "packaging==24.2"]
#: The Linux platform tags of the wheels (the GPU image is x86_64, glibc >= 2.28).
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"]
NCCL_XZ = "libnccl.so.2.xz"
#: ``nccl.get_version()`` of the bundled library, checked before the multi-rank steps.
NCCL_VERSION = 23007
SUITE = ["tests/test_gpu.py", "tests/test_gpu_adapters.py"]


# --------------------------------------------------------------------------- bundle


def bundle(out: Path, python_version: Optional[str], nccl: Optional[Path], repo: Path) -> Dict[str, Any]:
    """Fill ``out`` with the wheels, the project archive, NCCL and this script; write MANIFEST.json."""
    out.mkdir(parents=True, exist_ok=True)
    wheels = out / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir()
    target = ["--python-version", python_version] + [a for p in PLATFORMS for a in ("--platform", p)]
    pip = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--no-deps", "-d", str(wheels)]
    subprocess.run(pip + (target if python_version else []) + WHEELS + PYTEST_WHEELS, check=True)
    # the working tree as git sees it: tracked files as they are now, and new files git does not ignore
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=repo, capture_output=True)
    with tarfile.open(out / "hpccoll.tar", "w") as tar:
        for name in sorted(set(listed.stdout.decode().split("\0")) - {""}):
            if (repo / name).is_file():
                tar.add(repo / name, arcname=name, recursive=False)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True)
    changed = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout
    (out / NCCL_XZ).unlink(missing_ok=True)
    if nccl is not None and nccl.is_file():
        shutil.copyfile(nccl, out / NCCL_XZ)
    shutil.copyfile(HERE, out / "gpu_check.py")
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "MANIFEST.json")
    manifest = {
        "made": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": head.stdout.strip() + ("+changes" if changed.strip() else ""),
        "python": python_version or "%d.%d" % sys.version_info[:2],
        "nccl": NCCL_XZ if (out / NCCL_XZ).exists() else f"missing ({nccl} not found)",
        "files": {str(p.relative_to(out)): {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files},
    }
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(f["bytes"] for f in manifest["files"].values())
    print(f"gpu-bundle: {out} ({total / 2**20:.1f} MiB, {len(files)} files; commit {manifest['commit']})")
    return manifest


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# --------------------------------------------------------------------------- steps


class Clock:
    """The global deadline: every step's limit is its own cap or what is left, whichever is less."""

    def __init__(self, seconds: float, reserve: float = 5.0) -> None:
        self.start, self.seconds, self.reserve = time.monotonic(), seconds, reserve

    def left(self) -> float:
        return self.seconds - self.reserve - (time.monotonic() - self.start)

    def used(self) -> float:
        return time.monotonic() - self.start


def run_step(name: str, argv: List[str], cap: float, clock: Clock, env: Dict[str, str], cwd: Path) -> Dict[str, Any]:
    """Run ``argv`` as its own process group, killed (group and all) at ``min(cap, clock.left())`` seconds."""
    limit = min(cap, clock.left())
    step: Dict[str, Any] = {"step": name, "command": " ".join(argv), "cap_s": cap, "seconds": 0.0}
    if clock.left() < 3:
        return {**step, "status": "skipped", "reason": f"the global deadline ({clock.seconds:.0f} s) was reached"}
    began = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=limit)
        status = "passed" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                output, _ = proc.communicate(timeout=5)
                break
            except subprocess.TimeoutExpired:
                output = b""
        status = f"timed out after {limit:.0f} s" + (" (the global deadline)" if limit < cap else "")
    text = output.decode(errors="replace") if output else ""
    return {**step, "status": status, "seconds": round(time.monotonic() - began, 1), **_summary(text)}


def _summary(text: str) -> Dict[str, Any]:
    """The output's last lines, and its verdict line: pytest's closing line, or what the script said last."""
    lines = [line for line in text.splitlines() if line.strip()]
    verdicts = [line.strip("= ") for line in lines if " passed" in line or " failed" in line or " skipped" in line]
    said = [line for line in lines if line.startswith(("bench_gpu:", "gpu-check:", "skipped"))]
    return {"summary": (verdicts or said or lines or [""])[-1][:200], "tail": "\n".join(lines[-60:])}


def python_step(code: str) -> List[str]:
    return [sys.executable, "-c", code]


FACTS = r"""
import json, platform, sys
facts = {"python": platform.python_version()}
def note(key, fn):
    try:
        facts[key] = fn()
    except Exception as exc:
        facts[key] = f"unavailable ({type(exc).__name__}: {exc})"
def gpu():
    import cupy
    rt = cupy.cuda.runtime
    props = rt.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    return f"{rt.getDeviceCount()} x {name} ({props['totalGlobalMem'] // 2**20} MiB)"
def cuda():
    import cupy
    rt = cupy.cuda.runtime
    return f"runtime {rt.runtimeGetVersion()}, driver API {rt.driverGetVersion()}"
def driver():
    import subprocess
    out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=20)
    return out.stdout.strip() or out.stderr.strip()
def nccl():
    from cupy.cuda import nccl
    return nccl.get_version()
def torch():
    import torch
    return f"{torch.__version__} (CUDA {torch.version.cuda}, available: {torch.cuda.is_available()})"
def jax():
    import jax
    return f"{jax.__version__} ({', '.join(sorted({d.platform for d in jax.devices()}))})"
def mpi():
    from mpi4py import MPI
    import mpi4py
    return f"mpi4py {mpi4py.__version__}, {MPI.Get_library_version().splitlines()[0].strip()}"
note("gpu", gpu); note("cuda", cuda); note("driver", driver); note("nccl", nccl)
note("cupy", lambda: __import__("cupy").__version__); note("numpy", lambda: __import__("numpy").__version__)
note("torch", torch); note("jax", jax); note("mpi", mpi)
print("FACTS " + json.dumps(facts))
"""

NCCL_CHECK = (
    "from cupy.cuda import nccl; v = nccl.get_version(); print('gpu-check: NCCL', v); raise SystemExit(v != %d)"
)

#: Which transport moves CuPy arrays, eager JAX GPU arrays and jitted JAX calls (the debug records of hpccoll).
TRANSPORTS = r"""
import logging, os
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import hpccoll
from hpccoll._local import local_rank
seen = []
class Keep(logging.Handler):
    def emit(self, record):
        seen.append(record.getMessage())
log = logging.getLogger("hpccoll")
log.addHandler(Keep()); log.setLevel(logging.DEBUG); log.propagate = False
comm = hpccoll.Communicator()
import cupy
cupy.cuda.Device(local_rank()[0] % cupy.cuda.runtime.getDeviceCount()).use()
choice = comm.transport_for(cupy.ones(4))
said = [f"CuPy arrays: {choice.name} ({choice.reason})"]
try:
    import jax, jax.numpy as jnp
    from hpccoll.adapters import jax as hcj
    gpus = [d for d in jax.devices() if d.platform in ("gpu", "cuda")]
    if gpus:
        x = jax.device_put(jnp.ones(4), gpus[local_rank()[0] % len(gpus)])
        for label, fn in (("eager", lambda v: hcj.all_reduce(v, comm)),
                          (f"jit, lowering {hcj.LOWERING!r}", jax.jit(lambda v: hcj.all_reduce(v, comm)))):
            before = len(seen)
            y = fn(x).block_until_ready()
            moved = [m for m in seen[before:] if m.startswith("transport")] or ["(no new transport record)"]
            right = "right" if float(jnp.max(jnp.abs(y - comm.size))) == 0 else f"WRONG ({y})"
            said.append(f"JAX GPU array, {label}: {right}; on {sorted(y.devices())}; " + "; ".join(moved))
    else:
        said.append("JAX: no GPU backend")
except ImportError as exc:
    said.append(f"JAX: {exc}")
if comm.rank == 0:
    print("\n".join(said))
    print("gpu-check: transports of %d rank(s) reported" % comm.size)
"""


# --------------------------------------------------------------------------- run


def prepare(bundle_dir: Path, work: Path, py: str) -> Dict[str, Any]:
    """Install the wheels and unpack the project and NCCL under ``work``; the environment every step runs in."""
    shutil.rmtree(work, ignore_errors=True)
    site, prefix, src, lib = work / "site", work / "mpi", work / "src", work / "nccl"
    for d in (site, prefix, src, lib):
        d.mkdir(parents=True)
    wheels = sorted((bundle_dir / "wheels").glob("*.whl"))
    mpich = [str(w) for w in wheels if w.name.startswith("mpich-")]
    others = [str(w) for w in wheels if w.name.startswith(("mpi4py-", "pytest_mpi-"))]
    has_pytest = subprocess.run([py, "-c", "import pytest"], capture_output=True).returncode == 0
    if not has_pytest:
        others += [str(w) for w in wheels if w.name.startswith(("pytest-", "pluggy-", "iniconfig-", "packaging-"))]
    pip = [py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--disable-pip-version-check"]
    quiet = dict(os.environ, PIP_ROOT_USER_ACTION="ignore")
    subprocess.run(pip + ["--target", str(site)] + others, check=True, env=quiet)
    subprocess.run(
        pip + ["--prefix", str(prefix)] + mpich, check=True, env=quiet
    )  # --target would drop the wheel's lib/
    with tarfile.open(bundle_dir / "hpccoll.tar") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(src, filter="data")
        else:  # pragma: no cover - Python < 3.11.4
            tar.extractall(src)
    nccl = None
    if (bundle_dir / NCCL_XZ).exists():
        with lzma.open(bundle_dir / NCCL_XZ) as packed, open(lib / "libnccl.so.2", "wb") as fh:
            shutil.copyfileobj(packed, fh)
        nccl = lib / "libnccl.so.2"
    env = dict(os.environ)
    env.update(
        PATH=f"{prefix / 'bin'}:{env.get('PATH', '')}",
        LD_LIBRARY_PATH=":".join(filter(None, [str(prefix / "lib"), env.get("LD_LIBRARY_PATH")])),
        PYTHONPATH=":".join(filter(None, [str(site), str(src), str(src / "tests"), env.get("PYTHONPATH")])),
        HYDRA_LAUNCHER="fork",
        XLA_PYTHON_CLIENT_PREALLOCATE="false",
        PYTHONDONTWRITEBYTECODE="1",
        PIP_ROOT_USER_ACTION="ignore",
    )
    for name in ("HPCCOLL_TRANSPORT", "HPCCOLL_CHECK", "NCCL_MULTI_RANK_GPU_ENABLE", "LD_PRELOAD"):
        env.pop(name, None)
    return {"env": env, "src": src, "nccl": nccl, "pytest_from_bundle": not has_pytest}


def shared_gpu_env(env: Dict[str, str], nccl: Path, ranks: int) -> Dict[str, str]:
    """``env`` with the bundled NCCL preloaded and NCCL's multi-rank mode on (``NCCL_MAX_CTAS=8`` past 2 ranks)."""
    shared = dict(env, LD_PRELOAD=str(nccl), NCCL_MULTI_RANK_GPU_ENABLE="1")
    if ranks > 2:
        shared["NCCL_MAX_CTAS"] = "8"
    return shared


def run(args: argparse.Namespace) -> int:
    bundle_dir = Path(args.bundle).resolve()
    out = Path(args.out or os.environ.get("OUT") or "gpu-check-report").resolve()
    out.mkdir(parents=True, exist_ok=True)
    clock = Clock(args.deadline)
    py = sys.executable
    manifest = json.loads((bundle_dir / "MANIFEST.json").read_text())
    report: Dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "mode": "dry (CI rehearsal, no GPU expected)" if args.dry else "device",
        "bundle": {k: manifest[k] for k in ("made", "commit", "python", "nccl")},
        "deadline_s": args.deadline,
        "steps": [],
    }
    steps: List[Dict[str, Any]] = report["steps"]
    began = time.monotonic()
    try:
        ready = prepare(bundle_dir, Path(args.work), py)
        steps.append({"step": "install", "status": "passed", "seconds": round(time.monotonic() - began, 1)})
    except Exception as exc:  # nothing else can run: say why
        steps.append({"step": "install", "status": "failed", "reason": f"{type(exc).__name__}: {exc}"})
        return _finish(report, out, clock)
    env, src = ready["env"], ready["src"]
    report["pytest"] = "the bundle's wheels (the image has none)" if ready["pytest_from_bundle"] else "the image's"
    mpiexec = str(Path(args.work) / "mpi" / "bin" / "mpiexec")

    def step(name: str, argv: List[str], cap: float, environ: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        result = run_step(name, argv, cap, clock, environ or env, src)
        steps.append(result)
        print(f"gpu-check: {name}: {result['status']} ({result.get('seconds', 0)} s) {result.get('summary', '')}")
        return result

    facts = step("facts", python_step(FACTS), 60)
    report["facts"] = next(
        (json.loads(line[6:]) for line in facts.get("tail", "").splitlines() if line.startswith("FACTS ")), {}
    )
    facts["summary"] = "the Machine table" if report["facts"] else facts.get("summary", "")
    gpu = str(report["facts"].get("gpu", "unavailable (the facts step failed)"))
    no_gpu = f"no GPU here: {gpu}" if gpu.startswith("unavailable") else None
    shared_ok: Optional[str] = None
    if ready["nccl"] is None:
        shared_ok = f"the bundle has no {NCCL_XZ}"
    elif no_gpu:
        shared_ok = no_gpu
        steps.append({"step": "nccl-2.30", "status": "skipped", "reason": no_gpu})
    else:
        check = step("nccl-2.30", python_step(NCCL_CHECK % NCCL_VERSION), 60, shared_gpu_env(env, ready["nccl"], 2))
        if check["status"] != "passed":
            shared_ok = f"the bundled NCCL did not load as {NCCL_VERSION}: {check.get('summary', '')}"
    report["multi_rank_nccl"] = shared_ok or "on (bundled NCCL 2.30.7, NCCL_MULTI_RANK_GPU_ENABLE=1)"

    pytest = [py, "-m", "mpi4py", "-m", "pytest", "--with-mpi", "-q", "-p", "no:cacheprovider", "-m", "gpu", *SUITE]
    bench = [py, "-m", "mpi4py", "benchmarks/bench_gpu.py", "--sizes", args.bench_sizes, "--rounds", "3"]
    plan: List[tuple] = []
    for ranks, suite_cap in ((1, 150), (2, 120), (4, 150)):
        environ = env
        if ranks > 1 and shared_ok is None:
            environ = shared_gpu_env(env, ready["nccl"], ranks)
        launch = [mpiexec, "-n", str(ranks)]
        plan.append((f"suite-{ranks}", launch + pytest, suite_cap, environ))
        plan.append((f"transports-{ranks}", launch + python_step(TRANSPORTS), 60, environ))
        plan.append((f"bench-{ranks}", launch + bench + ["--json", str(out / f"bench-{ranks}.json")], 90, environ))
    order = sorted(plan, key=lambda p: ("suite", "transports", "bench").index(p[0].split("-")[0]))
    for name, argv, cap, environ in order:  # every suite first, then what it reports, then the benchmarks
        if no_gpu and name.startswith("transports"):
            steps.append({"step": name, "status": "skipped", "reason": no_gpu})
            continue
        step(name, argv, cap, environ)  # the suite and the benchmark say themselves why they skip
    return _finish(report, out, clock)


def _finish(report: Dict[str, Any], out: Path, clock: Clock) -> int:
    report["used_s"] = round(clock.used(), 1)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d-%H%M")
    (out / f"gpu-check-{stamp}.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / f"gpu-check-{stamp}.md").write_text(markdown(report))
    failed = [s["step"] for s in report["steps"] if s["status"] not in ("passed", "skipped")]
    print(f"gpu-check: report {out / f'gpu-check-{stamp}.md'} ({report['used_s']} s; failed: {failed or 'none'})")
    return 1 if failed else 0


def markdown(report: Dict[str, Any]) -> str:
    facts = report.get("facts", {})
    lines = [
        f"# hpccoll gpu-check, {report['date']}",
        "",
        f"Mode: {report['mode']}. Bundle: commit {report['bundle']['commit']}, made {report['bundle']['made']}, "
        f"wheels for Python {report['bundle']['python']}, NCCL: {report['bundle']['nccl']}. "
        f"Deadline {report['deadline_s']:.0f} s, used {report.get('used_s', 0)} s.",
        "",
        f"Multi-rank NCCL on one GPU: {report.get('multi_rank_nccl', 'not reached')}. "
        f"pytest: {report.get('pytest', 'not reached')}.",
        "",
        "## Machine",
        "",
        "| what | version |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in facts.items()],
        "",
        "## Steps",
        "",
        "| step | status | seconds | summary |",
        "|---|---|---|---|",
    ]
    for s in report["steps"]:
        said = s.get("reason") or s.get("summary", "")
        lines.append(f"| {s['step']} | {s['status']} | {s.get('seconds', '')} | {said.replace('|', '/')} |")
    for s in report["steps"]:
        if s.get("tail"):
            lines += ["", f"### {s['step']}", "", f"`{s['command']}`", "", "```", s["tail"], "```"]
    return "\n".join(lines) + "\n"


def parse(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bundle", help="make the bundle (needs pip and PyPI)")
    b.add_argument("--out", default="gpu-bundle")
    b.add_argument("--python-version", default="3.12", help="the GPU image's Python; '' for this one")
    b.add_argument("--nccl", default=str(HERE.parents[3] / "shared" / "gpu" / NCCL_XZ))
    r = sub.add_parser("run", help="run the check from a bundle")
    r.add_argument("--bundle", default=str(HERE.parent))
    r.add_argument("--out", help="report folder (default $OUT, else gpu-check-report)")
    r.add_argument("--deadline", type=float, default=480.0, help="seconds for everything (default 480)")
    r.add_argument("--work", default="/tmp/hpccoll-gpu-check", help="scratch folder (emptied first)")
    r.add_argument("--bench-sizes", default="1K,64M")
    r.add_argument("--dry", action="store_true", help="the CI rehearsal: no GPU expected")
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse(argv)
    if args.command == "bundle":
        repo = Path(
            subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True).stdout.strip()
        )
        bundle(Path(args.out), args.python_version or None, Path(args.nccl), repo or HERE.parents[2])
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
