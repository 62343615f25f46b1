"""examples/cg_poisson.py: Conjugate Gradient on the 2-D Poisson problem over planned hpccoll collectives.

The example checks itself (convergence, the gathered solution against a serial direct solve,
the planned loop against the same loop in raw mpi4py) and exits non-zero when a check fails.
It runs here in-process at the suite's rank count (so ``make test`` runs it at 1, 2, 3 and 4
ranks), and, from the serial suite only, under its documented launch line at 1, 2, 3 and 4
ranks. Its distributed solver is also checked directly against a dense NumPy solve written
here, and a planted bug in its stencil must make it fail.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from launch import run_mpiexec
from mpi4py import MPI

import hpccoll

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "cg_poisson.py"
PASSED = "cg_poisson: all checks passed"

#: Flags for the in-process runs: the defaults (61 x 61, uneven rows at 2, 3 and 4 ranks), and a
#: 5 x 5 grid (at 4 ranks, rows 2, 1, 1, 1: a ghost row is a neighbour's only row).
RUNS = {"61x61-default": [], "5x5-tiny": ["--n", "5", "--rounds", "2"]}


def _load():
    spec = importlib.util.spec_from_file_location("hpccoll_example_cg_poisson", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.mpi
@pytest.mark.parametrize("argv", list(RUNS.values()), ids=list(RUNS))
def test_cg_poisson_in_process(argv, capsys):
    size = MPI.COMM_WORLD.Get_size()
    status = _load().main(argv)
    out = capsys.readouterr().out
    assert status == 0, out
    if MPI.COMM_WORLD.Get_rank() == 0:
        assert f"{PASSED} on {size} rank(s)" in out, out
        assert "[FAILED]" not in out and out.count("[ok]") == 3, out
        assert "ratio planned/raw" in out, out


@pytest.mark.mpi
def test_solution_matches_dense_solve():
    """The distributed planned CG, gathered, against ``numpy.linalg.solve`` of the assembled 5-point matrix."""
    module = _load()
    n = 13
    comm = hpccoll.Communicator()
    cart = comm.cartesian((comm.size,), periodic=False)
    try:
        u, iterations, relres = module.solve_distributed(n, cart, rtol=1e-12)
    finally:
        cart.free()
    t = 2.0 * np.eye(n) - np.eye(n, k=1) - np.eye(n, k=-1)
    a = np.kron(t, np.eye(n)) + np.kron(np.eye(n), t)  # row-major: index i * n + j
    h = 1.0 / (n + 1)
    x = h * np.arange(1, n + 1)
    want = np.linalg.solve(a, (h * h * np.outer(1.0 + x, np.exp(x))).ravel()).reshape(n, n)
    err = float(np.abs(u - want).max() / np.abs(want).max())
    # one verdict on every rank (no rank left waiting in a collective that another skipped)
    worst = comm.mpi.allreduce(err, op=MPI.MAX)
    assert u.shape == (n, n)
    assert relres <= 1e-12 and 0 < iterations < n * n, (iterations, relres)
    assert worst <= 1e-9, f"max relative error {worst:.3g} (this rank {err:.3g})"


@pytest.mark.mpi
def test_cg_poisson_fails_on_a_wrong_stencil(capsys, monkeypatch):
    """A stencil missing its left neighbour (same in both loops) must fail the serial check, at any rank count."""
    module = _load()

    def wrong(p, out):
        c = p[1:-1]
        np.multiply(c, 4.0, out=out)
        out -= p[:-2]
        out -= p[2:]
        out[:, :-1] -= c[:, 1:]
        return out

    monkeypatch.setattr(module, "apply_operator", wrong)
    status = module.main(["--n", "9", "--maxiter", "30", "--rounds", "1"])
    out = capsys.readouterr().out
    assert status == 1, out
    if MPI.COMM_WORLD.Get_rank() == 0:
        assert "[FAILED] gathered solution == serial direct solve" in out, out


@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="launches its own mpiexec; runs in the serial suite")
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_cg_poisson_under_mpiexec(n):
    proc = run_mpiexec(n, [sys.executable, "-m", "mpi4py", str(SCRIPT)], timeout=180, check=False)
    report = f"$ {' '.join(map(str, proc.args))}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    assert proc.returncode == 0, report
    assert f"{PASSED} on {n} rank(s)" in proc.stdout, report
    assert "[FAILED]" not in proc.stdout and proc.stdout.count("[ok]") == 3, report
