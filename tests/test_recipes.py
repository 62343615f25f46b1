"""The recipes run as printed: README.md's first autodiff block and every block of docs/autodiff.md's "Recipes".

The Python blocks run in this process at the suite's rank count (1-4 under ``make test``), each checking
itself against a serial computation or finite differences; the verdict is agreed across ranks. Their checks
can fail: with the wrong convention put back (``cotangent="varying"``, no ``/ P``, no ``replicate``) the same
block fails on every rank at P > 1. A block whose first line reads ``# NAME.py: [VAR=value ...] mpiexec -n N
python -m mpi4py NAME.py`` is a script with its launch line: the serial suite runs it that way (with its
environment) at 2 and 3 ranks, and compares what it prints with what the text says it prints.
"""

from __future__ import annotations

import re
import shlex
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
from conftest import agree
from launch import run_mpiexec
from mpi4py import MPI

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```([\w-]*)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
LAUNCH = re.compile(r"^# (\w+\.py): ((?:\w+=\S+ )*)mpiexec -n \d+ python -m mpi4py \1\n")


def section(path: Path, heading: str) -> tuple:
    """``(first line number, text)`` of the section of ``path`` under ``heading``, to the next heading of its
    level or above (``#`` lines inside fenced blocks are code, not headings)."""
    lines = path.read_text().splitlines(keepends=True)
    level = len(heading.split(" ", 1)[0])
    start = next(i for i, line in enumerate(lines) if line.rstrip("\n") == heading)
    fenced, end = False, len(lines)
    for i in range(start + 1, len(lines)):
        if lines[i].startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(rf"#{{1,{level}}} ", lines[i]):
            end = i
            break
    return start + 1, "".join(lines[start:end])


def blocks(path: Path, heading: str, lang: str = "python") -> list:
    """``(where, code)`` of each ``lang`` block of that section, ``where`` as ``file:line`` (the opening fence's)."""
    first, text = section(path, heading)
    return [
        (f"{path.name}:{first + text[: m.start()].count(chr(10))}", m.group(2))
        for m in FENCE.finditer(text)
        if m.group(1) == lang
    ]


README_AUTODIFF = blocks(ROOT / "README.md", "## Autodiff, adjoints and solvers")[:1]
RECIPES = blocks(ROOT / "docs" / "autodiff.md", "## Recipes")
IN_PROCESS = README_AUTODIFF + [(w, c) for w, c in RECIPES if not LAUNCH.match(c)]
LAUNCHED = [(w, c) for w, c in RECIPES if LAUNCH.match(c)]


def run(comm, where: str, code: str) -> str | None:
    """Run a block here on every rank; this rank's failure (``None``: passed). Blocks that need a framework
    that is not installed are skipped, alike on every rank."""
    for module in ("jax", "autograd", "torch"):
        if re.search(rf"^\s*(import|from) {module}\b", code, re.M) and find_spec(module) is None:
            pytest.skip(f"{where}: needs {module}")
    try:
        exec(compile(code, where, "exec"), {"__name__": "__recipe__"})
    except Exception as exc:  # noqa: BLE001 - this rank's failure, agreed on by the caller
        return f"{type(exc).__name__}: {exc}"
    return None


def test_the_recipes_are_there():
    assert README_AUTODIFF and 'cotangent="replicated"' in README_AUTODIFF[0][1], "README.md: the autodiff recipe"
    text = " ".join(code for _, code in RECIPES)
    for needed in ('cotangent="replicated"', "replicate(", "/ comm.size", "hpccoll.plan(", "MismatchError"):
        assert needed in text, f"docs/autodiff.md's recipes: expected {needed}"
    assert LAUNCHED, "docs/autodiff.md: expected a recipe with its launch line (check mode)"


@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("where, code", IN_PROCESS, ids=[w for w, _ in IN_PROCESS])
def test_recipe_runs(comm, where, code):
    failed = run(comm, where, code)
    agree(comm, failed is None, lambda: f"{where}: {failed}")


#: (block, text, replacement): the mistake each recipe warns of, put back. Each must fail the block's checks.
MISTAKES = [
    ("README.md", 'cotangent="replicated"', 'cotangent="varying"'),
    ("README.md", "/ comm.size", "/ 1"),
    ("autodiff.md", 'cotangent="replicated"', 'cotangent="varying"'),
    ("autodiff.md", "/ comm.size", "/ 1"),
    ("autodiff.md", "hcj.replicate(w, comm)", "w"),
]


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name, text, replacement", MISTAKES, ids=[f"{n}:{r}" for n, _, r in MISTAKES])
def test_the_mistake_fails_the_recipe(comm, name, text, replacement):
    """At P > 1 the wrong convention gives gradients off by a factor (P, or a rank's part): the recipe's own
    assertion catches it, on every rank."""
    found = [(w, c) for w, c in IN_PROCESS if w.startswith(name + ":") and text in c]
    assert found, f"{name}: no recipe holds {text!r}"
    where, code = found[0]
    failed = run(comm, where, code.replace(text, replacement))
    agree(comm, failed is not None and failed.startswith("AssertionError"), lambda: f"{where}: {failed}")


@pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="launches its own mpiexec; runs in the serial suite")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("where, code", LAUNCHED, ids=[w for w, _ in LAUNCHED])
def test_launched_recipe(tmp_path, where, code, n):
    """The check-mode recipe under its own launch line: the same MismatchError, printed by every rank, as the
    text says (without check mode that call is MPI's undefined behaviour, so it is not run)."""
    name, assignments = LAUNCH.match(code).groups()
    env = dict(a.split("=", 1) for a in shlex.split(assignments))
    assert env.get("HPCCOLL_CHECK") == "1" and float(env["HPCCOLL_TIMEOUT"]) > 0, env
    (tmp_path / name).write_text(code)
    proc = run_mpiexec(n, [sys.executable, "-m", "mpi4py", name], env=env, cwd=tmp_path, timeout=180)
    text = (ROOT / "docs" / "autodiff.md").read_text()
    promised = re.search(r"prints on every rank `([^`]*)`", text)
    assert promised, "docs/autodiff.md: expected what check.py prints"
    message = " ".join(promised.group(1).split())
    # the ranks' lines may reach mpiexec's stdout interleaved: find each rank's message, not each line
    seen = sorted(int(r) for r in re.findall(rf"rank (\d+): {re.escape(message)}", proc.stdout))
    assert seen == list(range(n)), f"expected {message!r} from every rank; got\n{proc.stdout}{proc.stderr}"


def test_section_reader():
    """The helper finds a section's blocks and stops at the next heading of its level."""
    where, code = blocks(ROOT / "docs" / "autodiff.md", "### A plan reads the buffer it was made with")[0]
    assert "hpccoll.plan(" in code and where.startswith("autodiff.md:")
    line = int(where.split(":")[1])
    assert (ROOT / "docs" / "autodiff.md").read_text().splitlines()[line - 1] == "```python"
    assert (
        where in dict(RECIPES)
        and "### While developing"
        not in section(ROOT / "docs" / "autodiff.md", "### A plan reads the buffer it was made with")[1]
    )
