"""The adapter examples: each launched with ``mpiexec -n 2`` and checked against its serial run.

The launching test runs only in the serial suite (it starts its own MPI job); the
in-process test runs each example's ``main`` at whatever size the suite runs at. Each
example compares itself with a serial computation and exits non-zero on a mismatch.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from launch import run_mpiexec
from mpi4py import MPI

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"

#: example -> (modules it needs, flags for a quick run, a line its output must contain)
EXAMPLES = {
    "tp_mlp.py": (("autograd",), [], "max relative gradient error vs serial"),
    "data_parallel_sgd.py": ((), ["--steps", "6"], "max parameter difference vs serial"),
    "distributed_lstsq.py": (("scipy",), [], "relative error vs numpy.linalg.lstsq"),
    "adjoint_state.py": ((), [], "max relative error vs serial gradient"),
    "jax_tp_mlp.py": (("jax",), ["--steps", "2"], "max relative gradient error vs serial"),
}


def _needs(name):
    for module in EXAMPLES[name][0]:
        pytest.importorskip(module)


@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="launches its own mpiexec -n 2; run from the serial suite")
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_at_two_ranks(name):
    _needs(name)
    _, flags, expected = EXAMPLES[name]
    proc = run_mpiexec(2, [sys.executable, "-m", "mpi4py", str(EXAMPLES_DIR / name), *flags], timeout=120)
    report = f"$ {' '.join(proc.args)}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    assert "P=2" in proc.stdout and expected in proc.stdout, report
    assert proc.stdout.rstrip().endswith("OK"), report


def _load(name):
    spec = importlib.util.spec_from_file_location(f"hpccoll_example_{Path(name).stem}", EXAMPLES_DIR / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.mpi
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_in_process(name, capsys):
    _needs(name)
    _, flags, expected = EXAMPLES[name]
    assert _load(name).main(flags) == 0
    out = capsys.readouterr().out
    if MPI.COMM_WORLD.Get_rank() == 0:
        assert expected in out and out.rstrip().endswith("OK"), out
