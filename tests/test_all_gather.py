"""all_gather and its adjoint's data movement, against a NumPy reference."""

import numpy as np
import pytest
from conftest import DTYPE_IDS, DTYPES, LAYOUTS, SIZE_PATTERNS, agree, assert_same, layout, make, raises_everywhere

import hpccoll
from hpccoll.transports.host_mpi import HostMPI

pytestmark = pytest.mark.mpi


def shards(comm, shape, axis, sizes, dtype, seed=0):
    """Every rank's shard (extent ``sizes[r]`` along ``axis``) and the full concatenation."""
    full_shape = list(shape)
    full_shape[axis] = sum(sizes)
    full = make(tuple(full_shape), dtype, seed)
    bounds = np.cumsum([0] + list(sizes))
    index = [slice(None)] * len(shape)
    index[axis] = slice(bounds[comm.rank], bounds[comm.rank + 1])
    return full[tuple(index)], full


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_every_dtype(comm, dtype):
    x, full = shards(comm, (0, 3), 0, SIZE_PATTERNS["uneven"](comm.size), dtype)
    assert_same(hpccoll.all_gather(x, comm), full, comm)


@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
@pytest.mark.parametrize(
    "shape,axis",
    # the extent at ``axis`` is replaced by the shard size; (3, 0, _) has no elements at all
    [
        ((0,), 0),
        ((0, 5), 0),
        ((4, 0), 1),
        ((4, 0), -1),
        ((3, 0, 2), 1),
        ((3, 4, 0), 2),
        ((0, 4, 2), -3),
        ((3, 0, 0), 2),
        ((2, 3, 0, 2), 2),
        ((2, 3, 2, 0), 3),
        ((2, 3, 2, 0), -2),
    ],
)
@pytest.mark.parametrize("how", LAYOUTS)
@pytest.mark.parametrize("strided", [False, True], ids=["packed", "datatypes"])
def test_axes_layouts_sizes(comm, shape, axis, pattern, how, strided, monkeypatch):
    # "datatypes" lowers the thresholds so that even these small arrays take the
    # MPI-derived-datatype path that large arrays along inner axes take.
    if strided:
        monkeypatch.setattr(HostMPI, "strided_min_bytes", 0)
        monkeypatch.setattr(HostMPI, "strided_min_piece", 0)
    sizes = SIZE_PATTERNS[pattern](comm.size)
    x, full = shards(comm, shape, axis % len(shape), sizes, np.float64, seed=len(shape) + axis % 7)
    x = layout(x, how)
    before = x.copy()
    y = hpccoll.all_gather(x, comm, axis=axis)
    assert_same(y, full, comm)
    assert_same(x, before, comm)  # the input is never modified
    agree(comm, not np.shares_memory(y, x), "the result shares memory with x")
    # the same with the sizes given (no discovery) and into a preallocated, non-contiguous out
    out = layout(np.empty_like(full), how)
    res = hpccoll.all_gather(x, comm, axis=axis, sizes=sizes, out=out)
    agree(comm, res is out, "out= was not returned")
    assert_same(out, full, comm)


@pytest.mark.parametrize("dtype", ["int16", "complex64"])
def test_operator_and_sizes_given(comm, dtype):
    sizes = SIZE_PATTERNS["uneven"](comm.size)
    x, full = shards(comm, (2, 0, 3), 1, sizes, dtype)
    op = hpccoll.AllGather(comm, axis=1, sizes=sizes)
    assert_same(op(x), full, comm)
    assert_same(op.forward(x), full, comm)
    assert op.H.H is op


def test_mpi4py_communicator_accepted(comm):
    from mpi4py import MPI

    x = np.full(2, comm.rank, dtype=np.int64)
    want = np.repeat(np.arange(comm.size), 2)
    assert_same(hpccoll.all_gather(x, comm.mpi), want, comm)
    assert_same(hpccoll.all_gather(x, MPI.COMM_WORLD), want, comm)
    assert_same(hpccoll.all_gather(x), want, comm)
    assert_same(hpccoll.all_gather(x.tolist(), comm), want, comm)  # array-likes become NumPy arrays


def test_mismatched_other_dims_detected_without_check(comm):
    # The size discovery also compares a signature of dtype and the other extents.
    x = np.zeros((2, 3 if comm.rank == 0 else 4))
    if comm.size == 1:
        assert hpccoll.all_gather(x, comm).shape == (2, 3)
    else:  # the message says what this rank has
        raises_everywhere(
            comm, hpccoll.MismatchError, "disagree", lambda: hpccoll.all_gather(x, comm), same_message=False
        )


@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("async_op", [False, True])
def test_in_place(comm, pattern, axis, async_op):
    """x is this rank's block of out: the gather fills in the other blocks."""
    sizes = SIZE_PATTERNS[pattern](comm.size)
    _, full = shards(comm, (3, 0) if axis == 1 else (0, 3), axis, sizes, np.int64, seed=5)
    out = np.zeros_like(full)
    lo = sum(sizes[: comm.rank])
    block = out[:, lo : lo + sizes[comm.rank]] if axis == 1 else out[lo : lo + sizes[comm.rank]]
    block[...] = full[:, lo : lo + sizes[comm.rank]] if axis == 1 else full[lo : lo + sizes[comm.rank]]
    got = hpccoll.all_gather(block, comm, axis=axis, out=out, async_op=async_op)
    agree(comm, (got.wait() if async_op else got) is out, "out= was not returned")
    assert_same(out, full, comm)
    buf = np.zeros(2 * comm.size + 1)
    raises_everywhere(
        comm,
        hpccoll.ArgumentError,
        "in-place layout",  # overlaps, but not at its block
        lambda: hpccoll.all_gather(buf[1:3], comm, out=buf[: 2 * comm.size], sizes=[2] * comm.size),
    )
