"""Adjoints: collective dot-product tests with a different cotangent on every rank."""

import numpy as np
import pytest
from conftest import SIZE_PATTERNS, agree, assert_close, make, raises_everywhere, reference

import hpccoll
from hpccoll.testing import InnerProductWarning, dottest

pytestmark = pytest.mark.mpi

REAL_COMPLEX = ["float64", "complex128", "float32", "complex64"]


def per_rank(comm, shape, dtype, seed):
    """Data that differs on every rank."""
    return make(shape, dtype, seed + 1000 * comm.rank)


@pytest.mark.parametrize("dtype", REAL_COMPLEX)
@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_all_gather_pair(comm, dtype, pattern, axis):
    sizes = SIZE_PATTERNS[pattern](comm.size)
    shape = [3, 2, 4]
    shape[axis] = sizes[comm.rank]
    full = list(shape)
    full[axis] = sum(sizes)
    op = hpccoll.AllGather(comm, axis=axis, sizes=sizes)
    assert dottest(op, per_rank(comm, tuple(shape), dtype, 1), per_rank(comm, tuple(full), dtype, 2))
    assert dottest(op.H, per_rank(comm, tuple(full), dtype, 3), per_rank(comm, tuple(shape), dtype, 4))


@pytest.mark.parametrize("dtype", REAL_COMPLEX)
@pytest.mark.parametrize("op_name", ["sum", "avg"])
@pytest.mark.parametrize("axis,pattern", [(0, "even"), (1, "uneven"), (-1, "empty-last")])
def test_reduce_scatter_pair(comm, dtype, op_name, axis, pattern):
    sizes = SIZE_PATTERNS[pattern](comm.size)
    full = [2, 3, 2]
    full[axis] = sum(sizes)
    mine = list(full)
    mine[axis] = sizes[comm.rank]
    op = hpccoll.ReduceScatter(comm, op=op_name, axis=axis, sizes=sizes)
    assert dottest(op, per_rank(comm, tuple(full), dtype, 5), per_rank(comm, tuple(mine), dtype, 6))


@pytest.mark.parametrize("dtype", REAL_COMPLEX)
@pytest.mark.parametrize("op_name", ["sum", "avg"])
def test_all_reduce_pair_varying(comm, dtype, op_name):
    op = hpccoll.AllReduce(comm, op=op_name)
    assert dottest(op, per_rank(comm, (4, 3), dtype, 7), per_rank(comm, (4, 3), dtype, 8))


def test_dottest_catches_a_wrong_adjoint(comm):
    # The replicated convention is *not* the adjoint for varying cotangents; the
    # dot test must say so (at P > 1) on every rank alike.
    op = hpccoll.AllReduce(comm, cotangent="replicated")
    with pytest.warns(InnerProductWarning, match="replicated"):  # and it says why beforehand
        ok = dottest(op, per_rank(comm, (5,), "float64", 9), per_rank(comm, (5,), "float64", 10), raise_error=False)
    agree(comm, ok == (comm.size == 1), f"dottest said {ok} at {comm.size} ranks")


@pytest.mark.parametrize("op_name", ["sum", "avg"])
def test_replicated_convention(comm, op_name):
    """With the same cotangent everywhere, replicated = varying / P (the factor-of-P rule)."""
    y = make((3, 2), "float64", 11)  # same seed on every rank: replicated
    varying = hpccoll.all_reduce_adjoint(y, comm, op=op_name, cotangent="varying")
    replicated = hpccoll.all_reduce_adjoint(y, comm, op=op_name, cotangent="replicated")
    want = y if op_name == "sum" else y / comm.size
    agree(comm, lambda: np.testing.assert_allclose(replicated * comm.size, varying, rtol=1e-14))
    agree(comm, lambda: np.testing.assert_allclose(replicated, want, rtol=1e-15))
    agree(comm, not np.shares_memory(replicated, y), "the replicated adjoint shares memory with y")


def test_adjoint_functions_match_definitions(comm):
    sizes = SIZE_PATTERNS["uneven"](comm.size)
    stack = make((comm.size, 2, sum(sizes)), "float64", 12)
    y = stack[comm.rank]
    got = hpccoll.all_gather_adjoint(y, comm, axis=1, sizes=sizes)
    lo = sum(sizes[: comm.rank])
    assert_close(got, reference(stack, "sum")[:, lo : lo + sizes[comm.rank]], comm)
    g = make((2, sizes[comm.rank]), "float64", 13 + comm.rank)
    back = hpccoll.reduce_scatter_adjoint(g, comm, axis=1, op="avg")
    gathered = hpccoll.all_gather(g, comm, axis=1)
    agree(comm, lambda: np.testing.assert_array_equal(back, gathered / comm.size))


@pytest.mark.parametrize("op_name", ["max", "min", "prod"])
def test_nonlinear_ops_have_no_adjoint(comm, op_name):
    y = np.ones(4)
    for fn in (hpccoll.reduce_scatter_adjoint, hpccoll.all_reduce_adjoint):
        raises_everywhere(comm, hpccoll.UnsupportedOpError, op_name, lambda: fn(y, comm, op=op_name))
    raises_everywhere(comm, hpccoll.UnsupportedOpError, None, lambda: hpccoll.AllReduce(comm, op=op_name).adjoint(y))
