"""Every example runs: in-process at the suite's rank count, and once under mpiexec as documented."""

import ast
import importlib.util
import inspect
import pathlib
import sys

import pytest
from launch import run_mpiexec
from mpi4py import MPI

import hpccoll
from hpccoll._api import PAIRS

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
SCRIPTS = sorted(p for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))


def load(path):
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.mpi
def test_quickstart_in_process():
    assert load(EXAMPLES / "quickstart.py").main([]) == 0
    assert load(EXAMPLES / "quickstart.py").main(["--check"]) == 0


def test_quickstart_calls_every_collective():
    """``make demo`` shows every collective, its adjoint and its operator: the demo calls each public name that
    :data:`hpccoll._api.PAIRS` declares, and every :class:`hpccoll.Operator` of ``hpccoll``."""
    tree = ast.parse((EXAMPLES / "quickstart.py").read_text())
    called = {
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "hpccoll"
    }
    functions = {fn.__name__ for pair in PAIRS for fn in (pair.forward, pair.adjoint)}
    operators = {
        name
        for name in hpccoll.__all__
        if inspect.isclass(getattr(hpccoll, name))
        and issubclass(getattr(hpccoll, name), hpccoll.Operator)
        and name != "Operator"
    }
    missing = sorted((functions | operators) - called)
    assert not missing, f"examples/quickstart.py does not call hpccoll.{missing}"


@pytest.mark.mpi
@pytest.mark.parametrize("argv", [[], ["--check", "--shape", "7", "3"]], ids=["64x45", "7x3-check"])
def test_pencil_fft_in_process(argv):
    """The pencil FFT checks itself: forward against numpy.fft.fft2, inverse, and the dot test of its adjoint."""
    assert load(EXAMPLES / "pencil_fft.py").main(argv) == 0


@pytest.mark.mpi
def test_shared_field_in_process():
    """Slabs in node-shared memory, gathered without copies, checked against a serial run."""
    assert load(EXAMPLES / "shared_field.py").main(["--n", "256", "--steps", "3", "--particles", "500"]) == 0


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_launch_line_in_header(script):
    assert "mpiexec -n" in script.read_text().split('"""')[1], f"{script.name} must state its launch line"


@pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="launches its own mpiexec; runs in the serial suite")
@pytest.mark.parametrize(
    "script",
    [EXAMPLES / name for name in ("quickstart.py", "pencil_fft.py", "shared_field.py")],
    ids=["quickstart.py", "pencil_fft.py", "shared_field.py"],
)
def test_runs_under_mpiexec(script):
    """The core example under its documented launch line (the adapter examples: test_examples_adapters.py)."""
    proc = run_mpiexec(2, [sys.executable, "-m", "mpi4py", str(script)], timeout=180)
    assert "passed" in proc.stdout or "ok" in proc.stdout.lower(), proc.stdout
    assert "FAILED" not in proc.stdout, proc.stdout


@pytest.mark.mpi
def test_readme_snippet_runs():
    import re

    readme = (EXAMPLES.parent / "README.md").read_text()
    code = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert code, "README.md has a python example"
    for block in code:
        exec(compile(block, "README.md", "exec"), {})
