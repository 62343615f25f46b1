"""all_to_all over the GPU transports' own code (nccl, staged, cuda_mpi), against the stand-in GPU.

As in ``test_nccl_standin.py`` (whose fixtures and helpers these tests use),
the real transports and the real CuPy code paths of ``hpccoll.collectives``
run on arrays of the CuPy stand-in (``tests/standin_cupy.py``, installed as
``cupy`` for each test, with deferred execution) over the NumPy-over-MPI
stand-in for CuPy's NCCL binding. Inputs go to the stand-in GPU with
``dev``; results are read back with ``host`` and compared with NumPy. No GPU
ran these paths.
"""

import numpy as np
import pytest
import standin_cupy as cp
import standin_nccl as standin
from conftest import DTYPE_IDS, DTYPES, SIZE_PATTERNS, assert_same, make
from test_all_to_all import case
from test_nccl_standin import calls, dev, fresh, gpu, host, nccl_of, runtime  # noqa: F401 - fixtures

import hpccoll

pytestmark = pytest.mark.mpi

# As in test_nccl_standin.py: every test makes all its collective calls
# before its first assertion, so a failure on one rank cannot leave the
# other ranks waiting in a collective.


def peers(c, *names):
    """The peers of the stand-in's point-to-point calls, by call name."""
    return {name: sorted(call[4] for call in calls(c, name)) for name in names}


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("axes", [(1, 0), (0, 0)], ids=["1->0", "equal"])
def test_every_dtype_over_nccl(gpu, dtype, axes):  # noqa: F811 - the fixture
    x, sizes, recv, want = case(gpu, (0, 0, 2), *axes, "uneven", dtype, seed=3)
    got = host(hpccoll.all_to_all(dev(x), gpu, split_axis=axes[0], concat_axis=axes[1], sizes=sizes))
    assert_same(got, want)
    used = {call[0] for call in calls(gpu)}
    assert used <= {"send", "recv"}  # grouped point-to-point: NCCL has no all-to-all
    others = [r for r in range(gpu.size) if r != gpu.rank]
    sends = [r for r in others if sizes[r] * x.size // max(x.shape[axes[0]], 1)]
    if gpu.size > 1:
        assert peers(gpu, "send")["send"] == sends  # never to itself: its own block is a device copy
    assert len({call[2] for call in calls(gpu)}) <= 1  # one NCCL type: the dtype's own, reals or bytes


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize(
    "dtype,nccl_type,scale",
    [
        ("complex128", "NCCL_FLOAT64", 2),
        ("bool", "NCCL_UINT8", 1),
        ("int16", "NCCL_UINT8", 2),
        ("float16", "NCCL_UINT8", 2),
    ],
)
def test_movement_types(gpu, runtime, dtype, nccl_type, scale):  # noqa: F811
    x = make((2 * gpu.size,), dtype, seed=gpu.rank)
    got = host(hpccoll.all_to_all(dev(x), gpu, recv_sizes=[2] * gpu.size))
    want = np.concatenate(
        [make((2 * gpu.size,), dtype, seed=r)[2 * gpu.rank : 2 * gpu.rank + 2] for r in range(gpu.size)]
    )
    assert_same(got, want)
    t, s = getattr(standin, nccl_type), runtime.stream()
    others = [r for r in range(gpu.size) if r != gpu.rank]
    assert sorted(calls(gpu, "send")) == [("send", 2 * scale, t, None, r, s) for r in others]
    assert sorted(calls(gpu, "recv")) == [("recv", 2 * scale, t, None, r, s) for r in others]


def test_chunking_with_a_tiny_limit(gpu):  # noqa: F811
    nccl_of(gpu).max_count = 3
    x, sizes, recv, want = case(gpu, (0, 0), 1, 0, "uneven", np.float64, seed=5)
    got = host(hpccoll.all_to_all(dev(x), gpu, split_axis=1, concat_axis=0, sizes=sizes, recv_sizes=recv))
    assert_same(got, want)
    if gpu.size > 1:
        assert max((call[1] for call in calls(gpu)), default=0) <= 3
        assert sum(call[1] for call in calls(gpu, "send")) == x.size - sizes[gpu.rank] * x.shape[0]


@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
def test_primitive_directly(gpu, pattern):  # noqa: F811
    """The transport's alltoallv on flat device buffers, at every size including one rank."""
    t = nccl_of(gpu)
    t.max_count = 2
    P, me = gpu.size, gpu.rank
    counts = [[(SIZE_PATTERNS[pattern](P)[j] + r) % 4 for j in range(P)] for r in range(P)]  # counts[r][j]: r -> j
    data = [make((sum(counts[r]),), np.int64, seed=r) for r in range(P)]
    offsets = [np.cumsum([0] + counts[r]) for r in range(P)]
    want = np.concatenate([data[r][offsets[r][me] : offsets[r][me + 1]] for r in range(P)])
    recv, recv2 = cp.empty(want.shape, want.dtype), cp.empty(want.shape, want.dtype)
    t.alltoallv(dev(data[me]), recv, counts[me], [counts[r][me] for r in range(P)])
    t.ialltoallv(dev(data[me]), recv2, counts[me], [counts[r][me] for r in range(P)]).wait()
    assert_same(host(recv), want)
    assert_same(host(recv2), want)


@pytest.mark.parametrize("async_op", [False, True])
def test_async_and_lists_over_nccl(gpu, async_op):  # noqa: F811
    x, sizes, recv, want = case(gpu, (0, 0), 1, 0, "empty-last", np.float32, seed=6)
    y, ysizes, _, ywant = case(gpu, (0, 3), 0, 0, "uneven", np.int8, seed=7)
    single = hpccoll.all_to_all(
        dev(x), gpu, split_axis=1, concat_axis=0, sizes=sizes, recv_sizes=recv, async_op=async_op
    )
    listed = hpccoll.all_to_all(dev([x, x]), gpu, split_axis=1, concat_axis=0, sizes=sizes, async_op=async_op)
    other = hpccoll.all_to_all(dev(y), gpu, sizes=ysizes, async_op=async_op)
    if async_op:
        single, listed, other = single.wait(), listed.wait(), other.wait()
    single, listed, other = host(single), host(listed), host(other)
    assert_same(single, want)
    assert_same(listed[0], want)
    assert_same(listed[1], want)
    assert_same(other, ywant)


def test_adjoint_over_nccl(gpu):  # noqa: F811
    x, sizes, recv, want = case(gpu, (0, 2, 0), 2, 0, "uneven", np.complex64, seed=8)
    op = hpccoll.AllToAll(gpu, split_axis=2, concat_axis=0, sizes=sizes, recv_sizes=recv)
    passed = hpccoll.testing.dottest(op, dev(x), dev(make(want.shape, np.complex64, seed=50 + gpu.rank)))
    back = host(op.H(op(dev(x))))
    assert passed
    assert_same(back, x)


# --------------------------------------------------------------------------- staged and cuda_mpi


@pytest.mark.parametrize("axes", [(1, 0), (0, 0)])
def test_staged(fresh, runtime, axes):  # noqa: F811
    c = fresh(transport="staged")
    x, sizes, recv, want = case(c, (0, 0), *axes, "uneven", np.complex128, seed=9)
    got = host(hpccoll.all_to_all(dev(x), c, split_axis=axes[0], concat_axis=axes[1], sizes=sizes))
    again = host(
        hpccoll.all_to_all(
            dev(x), c, split_axis=axes[0], concat_axis=axes[1], sizes=sizes, recv_sizes=recv, async_op=True
        ).wait()
    )
    assert_same(got, want)
    assert_same(again, want)
    if c.size > 1:  # staged through two pinned buffers, reused by the second call
        assert len(runtime.pinned_allocations) == 2 and runtime.syncs == 2


@pytest.mark.parametrize("async_op", [False, True])
def test_cuda_mpi_syncs_before_mpi(fresh, runtime, async_op):  # noqa: F811
    c = fresh(transport="cuda_mpi")
    x, sizes, recv, want = case(c, (0, 3), 0, 0, "even", np.int64, seed=10)
    got = hpccoll.all_to_all(dev(x), c, sizes=sizes, recv_sizes=recv, async_op=async_op)
    got = host(got.wait() if async_op else got)
    assert_same(got, want)
    assert runtime.syncs == (1 if c.size > 1 else 0)
