"""The README works as printed: its shell commands run after the two set-up commands (``make demo``, ``make
test``), its Python blocks run under ``mpiexec -n 2``, it documents every public name and signature, and it
gives no measured figures (docs/benchmarks.md does).

The shell commands run one by one, in README order, as in one shell: an earlier ``. .venv/bin/activate``
line is run before each later command, and nothing else is done for them (the venv's ``bin`` is taken off
``PATH`` first, so a command that needs the venv without saying so fails). They run in a scratch
directory that links to every top-level entry of the checkout (so files they write, such as a benchmark's
JSON, land there). Commands this machine cannot run are skipped by pattern, each with its reason; one,
``tune``, runs with a shorter ladder of sizes given on its command line (:data:`SHORTER`).
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
from launch import _stop, child_env, run_mpiexec
from mpi4py import MPI

import hpccoll
import hpccoll.testing

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
VENV = ROOT / ".venv"

pytestmark = pytest.mark.skipif(
    MPI.COMM_WORLD.size > 1, reason="launches the README's commands and its own mpiexec; runs in the serial suite"
)

FENCE = re.compile(r"^```([\w-]*)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
SHELLS = {"sh", "bash", "shell", "console"}
ACTIVATE = re.compile(r"^(\.|source)\s+\.venv/bin/activate\s*(#.*)?$")

#: (pattern, reason): README commands this test does not run, and why. Checked in order.
SKIPS = (
    (r"^make test(\s|$)", "the test suite itself (this test runs inside it)"),
    (r"\bpip install\b", "installs a released hpccoll from PyPI, not this checkout"),
    (r"cuda1[23]|cupy|test-gpu|bench-gpu|--device\s+cupy", "needs an NVIDIA GPU and CuPy"),
    (r"\b(sbatch|qsub|srun|salloc)\b", "needs a cluster scheduler"),
    (r"MPI=(openmpi|system)|test-system", "needs another MPI installation"),
)


def readme_blocks():
    """``(line, language, text)`` for every fenced block of the README, ``line`` that of its first line."""
    text = README.read_text()
    return [(text[: m.start()].count("\n") + 2, m.group(1), m.group(2)) for m in FENCE.finditer(text)]


def shell_commands():
    """``(line, command)`` for every command of the README's shell blocks (continuation lines joined)."""
    out = []
    for first, lang, body in readme_blocks():
        if lang not in SHELLS:
            continue
        pending, start = "", None
        for offset, raw in enumerate(body.splitlines()):
            line = raw.rstrip()
            if start is None:
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                start = first + offset
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            out.append((start, (pending + line).strip()))
            pending, start = "", None
    return out


COMMANDS = shell_commands()
#: Seconds a command may take (the slowest but `tune`, `hpccoll bench`, took 11 s here): far inside the run's own
#: limit (TEST_TIMEOUT in the Makefile), so that a command that hangs fails here, named.
BUDGET = 180
#: (pattern, replacement): commands run with options added where the pattern matches. `tune` times every
#: primitive at 8 B-16 MiB, 7 rounds each: 61-125 s at 4 ranks on this project's 2 cores when quiet, past 180 s
#: with other work on them; its 600 s budget then sat inside test-serial's own 600 s limit, and `make test` died
#: with no test named. Here it proves the printed launch line and the profile it writes, with a ladder to 64 KiB
#: in 3 rounds: 7.5-9 s here when quiet, where the whole ladder took 60 s (tests/test_plan.py tests what tune decides).
SHORTER = ((r"\bhpccoll tune\b", "hpccoll tune --max-bytes 65536 --rounds 3"),)


def as_run(command):
    """``command`` as this test runs it (:data:`SHORTER`)."""
    for pattern, replacement in SHORTER:
        command = re.sub(pattern, replacement, command, count=1)
    return command


PYTHON_BLOCKS = [(line, body) for line, lang, body in readme_blocks() if lang == "python"]


def test_readme_has_commands_and_code():
    assert len(COMMANDS) >= 6, COMMANDS
    assert PYTHON_BLOCKS, "README.md: expected a python block"
    assert any(ACTIVATE.match(c) for _, c in COMMANDS), "README.md: expected a `. .venv/bin/activate` command"


def test_introduction_names_every_collective():
    intro = README.read_text().split("```", 1)[0].lower()
    for name in ("all-gather", "reduce-scatter", "all-reduce", "all-to-all"):
        assert name in intro, f"README.md's introduction does not name {name}"


#: A measured figure: a ratio (``0.95-1.10x``, ``1.07x``) or a time in microseconds (``55 us``, ``+6 µs``).
FIGURE = re.compile(r"\b\d+(\.\d+)?(-\d+(\.\d+)?)?\s?[x×](?![\w-])|\b\d+(\.\d+)?\s?(us|µs)\b")


def test_benchmark_figures_live_in_the_benchmarks_page():
    """The README states each performance claim in one line and links to docs/benchmarks.md for its figures."""
    found = [
        f"README.md:{n}: {line.strip()}"
        for n, line in enumerate(README.read_text().splitlines(), 1)
        if FIGURE.search(line)
    ]
    assert not found, "README.md gives measured figures (move them to docs/benchmarks.md):\n" + "\n".join(found)


def venv_is_current(cwd: Path, env: dict) -> bool:
    """Whether ``make venv`` would do nothing (then a ``make`` command installs nothing first)."""
    return subprocess.run(["make", "-q", "venv"], cwd=cwd, env=env, capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def shell(tmp_path_factory):
    """``(cwd, env)``: a scratch directory linking to the checkout's entries, and the environment of a new shell
    in it (the suite's job variables dropped, and the venv's bin taken off PATH)."""
    if Path(sys.prefix).resolve() != VENV.resolve():
        pytest.skip(f"the README's commands use .venv (make demo's); this suite runs on {sys.prefix}")
    cwd = tmp_path_factory.mktemp("readme")
    for entry in ROOT.iterdir():
        (cwd / entry.name).symlink_to(entry)
    env = child_env(drop=("MAKEFLAGS", "MAKELEVEL", "MFLAGS"))  # a new shell, not a recipe of the make running us
    venv_bin = {str(VENV / "bin"), str((VENV / "bin").resolve())}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p not in venv_bin)
    env.pop("VIRTUAL_ENV", None)
    env["HPCCOLL_TUNE_FILE"] = str(cwd / "tune-profile.json")  # the README's `tune` writes here, not for the suite
    return cwd, env


@pytest.mark.parametrize(
    "line, command",
    [pytest.param(ln, c, marks=pytest.mark.timeout(BUDGET + 30)) for ln, c in COMMANDS],
    ids=[f"L{line}" for line, _ in COMMANDS],
)
def test_shell_command_runs_as_printed(shell, line, command):
    cwd, env = shell
    for pattern, reason in SKIPS:
        if re.search(pattern, command):
            pytest.skip(f"README.md:{line}: {reason}")
    if command.startswith("make ") and not venv_is_current(cwd, env):
        pytest.skip(f"README.md:{line}: `make venv` would install first (the venv is older than setup.cfg)")
    if "--plot" in command and find_spec("matplotlib") is None:
        pytest.skip(f"README.md:{line}: needs the plot extra (matplotlib)")
    activations = [c for ln, c in COMMANDS if ln < line and ACTIVATE.match(c)]
    script = "set -e\n" + "".join(f"{a}\n" for a in activations) + as_run(command) + "\n"
    proc = subprocess.Popen(
        ["bash", "-c", script],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a command that hangs is ended with every process it started
    )
    try:
        out, err = proc.communicate(timeout=BUDGET)
    except subprocess.TimeoutExpired:
        _stop(proc)
        pytest.fail(f"README.md:{line}: `{as_run(command)}` did not finish in {BUDGET} s", pytrace=False)
    assert proc.returncode == 0, (
        f"README.md:{line}: `{as_run(command)}` exited with {proc.returncode}\n"
        f"--- stdout (tail)\n{out[-3000:]}\n--- stderr (tail)\n{err[-3000:]}"
    )


@pytest.mark.parametrize("line, code", PYTHON_BLOCKS, ids=[f"L{line}" for line, _ in PYTHON_BLOCKS])
def test_python_block_runs_under_mpiexec(tmp_path, line, code):
    script = tmp_path / f"readme_L{line}.py"
    script.write_text(code)
    run_mpiexec(2, [sys.executable, "-m", "mpi4py", str(script)], cwd=tmp_path, timeout=120)


# ----------------------------------------------------------------------------- the documented signatures

SIGNED = {
    **{name: getattr(hpccoll, name) for name in hpccoll.__all__ if inspect.isfunction(getattr(hpccoll, name, None))},
    "Communicator": hpccoll.Communicator,
    "AllGather": hpccoll.AllGather,
    "ReduceScatter": hpccoll.ReduceScatter,
    "AllReduce": hpccoll.AllReduce,
    "AllToAll": hpccoll.AllToAll,
    "Broadcast": hpccoll.Broadcast,
    "Reduce": hpccoll.Reduce,
    "Gather": hpccoll.Gather,
    "Scatter": hpccoll.Scatter,
    "HaloExchange": hpccoll.HaloExchange,
    "cartesian": hpccoll.Communicator.cartesian,
    "neighbours": hpccoll.Communicator.neighbours,
    "dottest": hpccoll.testing.dottest,
    "default_rtol": hpccoll.testing.default_rtol,
    "split": hpccoll.Communicator.split,
    "transport_for": hpccoll.Communicator.transport_for,
    "shared_empty": hpccoll.Communicator.shared_empty,
    "explain": hpccoll.Communicator.explain,
    "forward": hpccoll.Operator.forward,
    "adjoint": hpccoll.Operator.adjoint,
}


def documented(name: str) -> list:
    """The parameter lists the README gives ``name`` in code spans: ```name(...)```, ```hpccoll.name(...)```,
    ```.name(...)```."""
    spans = re.findall(r"`([^`\n]*)`", README.read_text())
    return [m.group(1) for s in spans for m in [re.match(rf"(?:[\w.]*\.)?{re.escape(name)}\((.*)\)$", s)] if m]


def parameters(params: str) -> list:
    """``[(name, kind, default)]`` of a parameter list as written (``*`` marks the keyword-only ones)."""
    args = ast.parse(f"def f({params}): pass").body[0].args
    out = []
    positional = args.posonlyargs + args.args
    defaults = [inspect.Parameter.empty] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for a, d in zip(positional, defaults):
        out.append((a.arg, "positional", d))
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        out.append((a.arg, "keyword", inspect.Parameter.empty if d is None else d))
    if args.kwarg is not None:
        out.append((args.kwarg.arg, "var-keyword", inspect.Parameter.empty))
    return [(n, k, d if d is inspect.Parameter.empty else eval(ast.unparse(d), {})) for n, k, d in out]


def actual(obj) -> list:
    sig = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
    kinds = {inspect.Parameter.KEYWORD_ONLY: "keyword", inspect.Parameter.VAR_KEYWORD: "var-keyword"}
    return [(p.name, kinds.get(p.kind, "positional"), p.default) for p in sig.parameters.values() if p.name != "self"]


@pytest.mark.parametrize("name", sorted(SIGNED))
def test_readme_documents_the_whole_signature(name):
    want = actual(SIGNED[name])
    found = documented(name)
    assert found, f"README.md: expected `{name}(...)` with its signature; found none"
    written = []
    for params in found:
        try:
            written.append(parameters(params))
        except (SyntaxError, NameError):  # a call such as `all_reduce(x, out=x)`, not a signature
            continue
    assert want in written, f"README.md: `{name}` is documented as {found}; its signature is {want}"


def test_readme_names_every_public_name():
    text = README.read_text()
    names = [*hpccoll.__all__, *hpccoll.testing.__all__]
    missing = [n for n in names if not re.search(rf"`[^`\n]*\b{re.escape(n)}\b[^`\n]*`", text)]
    assert not missing, f"README.md does not name {missing}"
