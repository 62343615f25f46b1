"""Cross-rank check mode: disagreements raise the same error on every rank, never hang."""

import numpy as np
import pytest
from conftest import agree, raises_everywhere

import hpccoll
from hpccoll import ArgumentError, MismatchError


@pytest.fixture(scope="module")
def checked():
    c = hpccoll.Communicator(check=True)
    yield c
    c.free()


@pytest.mark.mpi(min_size=2)
def test_dtype_mismatch(checked):
    x = np.ones(3, np.float32 if checked.rank == 0 else np.float64)
    raises_everywhere(checked, MismatchError, "dtype", lambda: hpccoll.all_reduce(x, checked))


@pytest.mark.mpi(min_size=2)
def test_shape_mismatch(checked):
    x = np.ones(3 + (checked.rank == 1))
    raises_everywhere(checked, MismatchError, "shape", lambda: hpccoll.reduce_scatter(x, checked))


@pytest.mark.mpi(min_size=2)
def test_axis_mismatch(checked):
    x = np.ones((2, 2))
    raises_everywhere(checked, MismatchError, "axis", lambda: hpccoll.all_gather(x, checked, axis=checked.rank % 2))


@pytest.mark.mpi(min_size=2)
def test_op_mismatch(checked):
    op = "max" if checked.rank == 1 else "sum"
    raises_everywhere(checked, MismatchError, "op", lambda: hpccoll.all_reduce(np.ones(2), checked, op=op))


@pytest.mark.mpi(min_size=2)
def test_sizes_that_lie(checked):
    # Every rank passes the same sizes, but rank 1's shard is longer than it says.
    sizes = [2] * checked.size
    x = np.ones(3 if checked.rank == 1 else 2)
    raises_everywhere(
        checked, ArgumentError, r"sizes\[1\].*raised on rank 1", lambda: hpccoll.all_gather(x, checked, sizes=sizes)
    )


@pytest.mark.mpi(min_size=2)
def test_sizes_differ_between_ranks(checked):
    sizes = [2] * checked.size
    sizes[0] += checked.rank  # each rank is locally consistent only on rank 0
    x = np.ones(sizes[checked.rank])
    raises_everywhere(
        checked, (ArgumentError, MismatchError), "sizes", lambda: hpccoll.all_gather(x, checked, sizes=sizes)
    )


@pytest.mark.mpi(min_size=2)
def test_different_collectives(checked):
    x = np.ones(2 * checked.size)
    call = (
        (lambda: hpccoll.all_gather(x, checked)) if checked.rank == 0 else (lambda: hpccoll.reduce_scatter(x, checked))
    )
    raises_everywhere(checked, MismatchError, "collective", call)


@pytest.mark.mpi(min_size=2)
def test_local_error_on_one_rank_reaches_all(checked):
    out = np.empty(5 if checked.rank == 1 else 4)
    raises_everywhere(
        checked,
        ArgumentError,
        "out: expected shape.*raised on rank 1",
        lambda: hpccoll.all_reduce(np.ones(4), checked, out=out),
    )


@pytest.mark.mpi(min_size=2)
def test_replicated_cotangent_that_varies(checked):
    y = np.full(3, float(checked.rank))
    raises_everywhere(
        checked,
        MismatchError,
        "replicated cotangent",
        lambda: hpccoll.all_reduce_adjoint(y, checked, cotangent="replicated"),
    )


@pytest.mark.mpi
def test_agreeing_calls_pass(checked):
    x = np.arange(3.0) + checked.rank
    got = hpccoll.all_gather(x, checked, sizes=[3] * checked.size)
    agree(checked, got.shape == (3 * checked.size,), lambda: f"shape {got.shape}")
    y = hpccoll.all_reduce_adjoint(np.ones(2), checked, cotangent="replicated")
    agree(checked, (y == 1).all(), lambda: f"got {y}")
    # after a detected mismatch the communicator stays usable
    if checked.size > 1:  # the same branch on every rank
        raises_everywhere(
            checked, MismatchError, None, lambda: hpccoll.all_reduce(np.ones(1 + (checked.rank == 0)), checked)
        )
    total = hpccoll.all_reduce(np.ones(2), checked)
    agree(checked, total[0] == checked.size, lambda: f"got {total}")


@pytest.mark.mpi
def test_check_from_environment(monkeypatch):
    monkeypatch.setenv("HPCCOLL_CHECK", "1")
    with hpccoll.Communicator() as c:
        assert c.check
    monkeypatch.setenv("HPCCOLL_CHECK", "off")
    with hpccoll.Communicator() as c:
        assert not c.check
