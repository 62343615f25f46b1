"""The NumPy fast path (hpccoll._fast) against the general path, bit for bit.

The public functions try the fast path first; these tests call both paths
directly on the same inputs, check that the fast path really is taken for
the common case (so a change that quietly disables it fails here), and that
everything it does not handle falls through to the general path's result or
error.
"""

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
import hpccoll._api as api
import hpccoll._fast as fast
from conftest import DTYPE_IDS, DTYPES, SIZE_PATTERNS, make

OPS = ["sum", "prod", "max", "min", "avg"]


def native_or_skip(dtype, op):
    """Whether MPI reduces (dtype, op) natively (the fast path's pairs); skip pairs the general path refuses."""
    try:
        plan = hpccoll._dtypes.reduce_plan(dtype, op)
    except hpccoll.DTypeError:
        pytest.skip("the general path raises for this pair (tests/test_errors.py)")
    return not plan.widen


def same_bits(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_all_reduce_fast_equals_general(comm, dtype, op):
    native = native_or_skip(dtype, op)
    x = make((3, 4), dtype, seed=comm.rank)
    got = fast.all_reduce(x, comm, op, None)
    if not native:
        assert got is None  # widened 16-bit floats take the general path
        return
    same_bits(got, api._all_reduce(x, comm, op, None, "all_reduce", False))
    out = np.empty_like(x)
    assert fast.all_reduce(x, comm, op, out) is out
    same_bits(out, got)
    same_bits(hpccoll.all_reduce(x, comm, op=op), got)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_all_gather_fast_equals_general(comm, dtype, pattern):
    sizes = SIZE_PATTERNS[pattern](comm.size)
    for shape_tail, axis in (((), 0), ((), -1), ((2, 3), 0), ((2, 3), -3)):
        x = make((sizes[comm.rank],) + shape_tail, dtype, seed=comm.rank)
        got = fast.all_gather(x, comm, axis, sizes, None, "all_gather")
        assert got is not None
        same_bits(got, api._all_gather(x, comm, axis, sizes, None, "all_gather", False))
        out = np.empty_like(got)
        assert fast.all_gather(x, comm, axis, tuple(sizes), out, "all_gather") is out
        same_bits(out, got)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("pattern", ["none"] + sorted(SIZE_PATTERNS))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_reduce_scatter_fast_equals_general(comm, dtype, op, pattern):
    native = native_or_skip(dtype, op)
    sizes = None if pattern == "none" else SIZE_PATTERNS[pattern](comm.size)
    n = 2 * comm.size + 1 if sizes is None else sum(sizes)
    x = make((n, 3), dtype, seed=comm.rank)
    mine = (hpccoll.split_sizes(n, comm.size) if sizes is None else sizes)[comm.rank]
    got = fast.reduce_scatter(x, comm, op, 0, sizes, None)
    if got is None:
        # Widened dtypes and empty blocks take the general path, which makes the
        # same MPI call as the fast path on the other ranks.
        assert not native or mine == 0
        got = api._reduce_scatter(x, comm, op, 0, sizes, None, "reduce_scatter", False)
    else:
        assert native and mine > 0
    same_bits(got, api._reduce_scatter(x, comm, op, 0, sizes, None, "reduce_scatter", False))


@pytest.mark.mpi(min_size=2)
def test_fast_path_declines(comm):
    """Cases the fast path leaves to the general path: the result (or error) is the general path's."""
    P, r = comm.size, comm.rank
    x = np.arange(6.0 * P).reshape(2 * P, 3)
    declined = [
        fast.all_reduce(x[:, ::2], comm, "sum", None),  # not C-contiguous
        fast.all_reduce(x, comm, "sum", x[::-1]),  # overlaps, not in place
        fast.all_reduce(x, comm, "sum", np.empty((2 * P, 3), np.float32)),  # wrong out dtype
        fast.all_reduce(x, comm, "sum", np.empty((3, 2 * P))),  # wrong out shape
        fast.all_reduce(x, comm, MPI.SUM, None),  # MPI ops: the general path maps them
        fast.all_reduce(x, comm, "median", None),  # unknown op: the general path raises
        fast.all_reduce(x.astype(np.float16), comm, "sum", None),  # widened
        fast.all_reduce(np.empty(0), comm, "sum", None),  # empty
        fast.all_gather(x, comm, 1, [2 * P] * P, None, "all_gather"),  # inner axis
        fast.all_gather(x, comm, False, [2 * P] * P, None, "all_gather"),  # bool is not an axis
        fast.all_gather(x, comm, 0, [np.int64(2 * P)] * P, None, "all_gather"),  # NumPy ints: the general path converts
        fast.all_gather(x, comm, 0, [2 * P] * (P + 1), None, "all_gather"),  # wrong length: the general path raises
        fast.all_gather(x, comm, 0, [2 * P + 1] * P, None, "all_gather"),  # sizes[rank] != extent
        fast.reduce_scatter(x, comm, "sum", 0, [1] * P, None),  # sizes do not sum to the extent
        fast.reduce_scatter(x, comm, "sum", 1, None, None),  # inner axis
    ]
    assert declined == [None] * len(declined)
    ro = np.empty_like(x)
    ro.flags.writeable = False
    assert fast.all_reduce(x, comm, "sum", ro) is None
    with pytest.raises(hpccoll.ArgumentError, match="out: expected a writeable array"):
        hpccoll.all_reduce(x, comm, out=ro)
    with pytest.raises(hpccoll.ArgumentError, match="op: expected one of"):
        hpccoll.all_reduce(x, comm, op="median")
    with pytest.raises(hpccoll.ArgumentError, match="sizes"):
        hpccoll.all_gather(x, comm, sizes=[2 * P + 1] * P)
    # The general path still gives the right answer where the fast path declined.
    np.testing.assert_array_equal(hpccoll.all_reduce(x, comm, op=MPI.SUM), x * P)
    got = hpccoll.all_gather(x[r : r + 1], comm, sizes=[np.int64(1)] * P)
    np.testing.assert_array_equal(got, x[:P])


@pytest.mark.mpi(min_size=2)
def test_fast_path_not_in_check_mode_or_size_one(comm):
    x = np.ones(4)
    checked = hpccoll.Communicator(comm.mpi, check=True)
    alone = hpccoll.Communicator(MPI.COMM_SELF)
    try:
        assert fast.all_reduce(x, checked, "sum", None) is None
        assert fast.all_reduce(x, alone, "sum", None) is None
        assert fast.all_gather(x, checked, 0, [4] * comm.size, None, "all_gather") is None
        assert fast.reduce_scatter(np.ones(4 * comm.size), checked, "sum", 0, None, None) is None
    finally:
        checked.free()
        alone.free()


@pytest.mark.mpi(min_size=2)
def test_fast_path_watched(comm, monkeypatch):
    """With HPCCOLL_TIMEOUT the fast path's MPI calls go through the watchdog."""
    monkeypatch.setenv("HPCCOLL_TIMEOUT", "60")
    c = hpccoll.Communicator(comm.mpi)
    seen = []
    real = hpccoll._fast.run
    monkeypatch.setattr(hpccoll._fast, "run", lambda *a, **k: (seen.append(a[1]), real(*a, **k)))
    try:
        P = c.size
        np.testing.assert_array_equal(hpccoll.all_reduce(np.ones(3), c), np.full(3, P))
        np.testing.assert_array_equal(hpccoll.all_gather(np.ones(2), c, sizes=[2] * P), np.ones(2 * P))
        np.testing.assert_array_equal(hpccoll.reduce_scatter(np.ones(2 * P), c), np.full(2, P))
        assert seen == ["Allreduce", "Allgather", "Reduce_scatter_block"]
    finally:
        c.free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
def test_ranks_may_take_different_paths(comm, pattern):
    """Whether a rank takes the fast path is a local decision: both paths make the same MPI call."""
    P, r = comm.size, comm.rank
    sizes = SIZE_PATTERNS[pattern](P)
    full = make((sum(sizes), 3), np.float64, seed=7)
    mine = full[sum(sizes[:r]) : sum(sizes[: r + 1])]
    x = np.asfortranarray(mine) if r % 2 else np.ascontiguousarray(mine)  # odd ranks: general path
    np.testing.assert_array_equal(hpccoll.all_gather(x, comm, sizes=sizes), full)
    stack = np.stack([make((sum(sizes), 3), np.float64, seed=q) for q in range(P)])
    y = stack[r] if r % 2 else np.asfortranarray(stack[r])
    block = hpccoll.reduce_scatter(y, comm, sizes=sizes)
    np.testing.assert_allclose(block, stack.sum(0)[sum(sizes[:r]) : sum(sizes[: r + 1])], rtol=1e-12)
    np.testing.assert_allclose(hpccoll.all_reduce(y, comm), stack.sum(0), rtol=1e-12)


LIST_SHAPES = {
    "one shape": [(4,)] * 5,
    "one 2-D shape": [(2, 3)] * 4,
    "mixed shapes": [(3,), (2, 2), (), (1, 0), (5,)],
    "zero-d": [()] * 3,
}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("shapes", sorted(LIST_SHAPES))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_list_all_reduce_fast_equals_general(comm, dtype, op, shapes):
    from hpccoll._coalesced import all_reduce_many

    native = native_or_skip(dtype, op)
    xs = [np.asarray(make(s, dtype, seed=10 * comm.rank + i)) for i, s in enumerate(LIST_SHAPES[shapes])]
    xs[0] = np.asfortranarray(xs[0])  # any layout: concatenated in C order
    xs[-1] = np.repeat(xs[-1], 2, axis=-1)[..., ::2] if xs[-1].ndim else xs[-1]  # a strided view
    before = [x.copy() for x in xs]
    got = fast.all_reduce(xs, comm, op, None)
    if not native:
        assert got is None
        return
    want = all_reduce_many(xs, comm, op, None, "all_reduce", False)
    assert isinstance(got, list) and len(got) == len(xs)
    for g, w in zip(got, want):
        same_bits(g, w)
    for x, b in zip(xs, before):
        same_bits(x, b)  # inputs untouched


@pytest.mark.mpi(min_size=2)
def test_list_fast_path_declines(comm, monkeypatch):
    xs = [np.ones(3), np.ones(2)]
    assert fast.all_reduce(xs, comm, "sum", [np.empty(3), np.empty(2)]) is None  # out given
    assert fast.all_reduce([np.ones(3), np.ones(2, np.float32)], comm, "sum", None) is None  # two dtypes
    assert fast.all_reduce([np.ones(3), [1.0, 2.0]], comm, "sum", None) is None  # not all arrays
    assert fast.all_reduce([], comm, "sum", None) is None
    assert fast.all_reduce([np.empty(0)], comm, "sum", None) is None
    assert fast.all_reduce(xs, comm, "median", None) is None
    monkeypatch.setattr(comm, "bucket_bytes", 32)  # 40 bytes: more than one bucket
    assert fast.all_reduce(xs, comm, "sum", None) is None
    got = hpccoll.all_reduce(xs, comm)
    assert [g.tolist() for g in got] == [[comm.size] * 3, [comm.size] * 2]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
def test_all_gather_discovers_sizes(comm, pattern):
    """sizes=None: one exchange, then the fast path; an out= it declines goes on with the exchanged sizes."""
    P, r = comm.size, comm.rank
    sizes = SIZE_PATTERNS[pattern](P)
    full = make((sum(sizes), 2), np.float64, seed=3)
    x = full[sum(sizes[:r]) : sum(sizes[: r + 1])].copy()
    same_bits(fast.all_gather(x, comm, 0, None, None, "all_gather"), full)
    out = np.empty((sum(sizes), 2), np.float32)  # the general path raises for it, after the exchange
    with pytest.raises(hpccoll.ArgumentError, match="out: expected dtype float64"):
        fast.all_gather(x, comm, 0, None, out, "all_gather")
    strided = np.empty((sum(sizes), 4))[:, ::2]  # valid for the general path only
    assert fast.all_gather(x, comm, 0, None, strided, "all_gather") is strided
    same_bits(strided, full)
    with pytest.raises(hpccoll.MismatchError, match="ranks 0 and 1 disagree"):
        hpccoll.all_gather(np.ones((1, 2 + (r == 1))), comm)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_in_place_fast_equals_general(comm, op, pattern):
    """The in-place forms (out=x; x a block of out; out a block of x) on both paths, bit for bit."""
    P, r = comm.size, comm.rank
    sizes = SIZE_PATTERNS[pattern](P)
    start, stop = sum(sizes[:r]), sum(sizes[: r + 1])
    x = make((sum(sizes), 3), np.float64, seed=r)
    # all_reduce, out=x
    a, b = x.copy(), x.copy()
    assert fast.all_reduce(a, comm, op, a) is a
    assert api._all_reduce(b, comm, op, b, "all_reduce", False) is b
    same_bits(a, b)
    # all_gather: x is this rank's block of out
    full = make((sum(sizes), 3), np.float64, seed=5)
    g1, g2 = np.zeros_like(full), np.zeros_like(full)
    g1[start:stop], g2[start:stop] = full[start:stop], full[start:stop]
    assert fast.all_gather(g1[start:stop], comm, 0, sizes, g1, "all_gather") is g1
    assert api._all_gather(g2[start:stop], comm, 0, sizes, g2, "all_gather", False) is g2
    same_bits(g1, full)
    same_bits(g2, full)
    # reduce_scatter: out is this rank's block of x
    s1, s2 = x.copy(), x.copy()
    o1, o2 = s1[start:stop], s2[start:stop]
    got = fast.reduce_scatter(s1, comm, op, 0, sizes, o1)
    if sizes[r] == 0:  # an empty block: the general path, which makes the same MPI call
        assert got is None
        got = api._reduce_scatter(s1, comm, op, 0, sizes, o1, "reduce_scatter", False)
    assert got is o1
    assert api._reduce_scatter(s2, comm, op, 0, sizes, o2, "reduce_scatter", False) is o2
    same_bits(o1, o2)
    # Views that only overlap (not the exact block) are no in-place form.
    if sizes[r] > 1:
        y = x.copy()
        assert fast.reduce_scatter(y, comm, op, 0, sizes, y[start + 1 : stop + 1]) is None


@pytest.mark.mpi(min_size=2)
def test_in_place_lookalikes_take_the_general_path(comm):
    """Read-only blocks, zero-stride views and array ops: the general path's verdict, whichever path runs."""
    P, r = comm.size, comm.rank
    x = np.arange(2.0 * P) + r
    block = x[2 * r : 2 * r + 2]
    block.flags.writeable = False
    assert fast.reduce_scatter(x, comm, "sum", 0, None, block) is None
    with pytest.raises(hpccoll.ArgumentError, match="writeable"):
        hpccoll.reduce_scatter(x, comm, out=block)
    y = np.arange(3.0 * P).reshape(P, 3)
    assert fast.reduce_scatter(y, comm, "sum", 0, None, y[r][None]) is None  # strides (0, 8): not y[r:r+1]
    with pytest.raises(hpccoll.ArgumentError, match="overlaps"):
        hpccoll.reduce_scatter(y, comm, out=y[r][None])
    with pytest.raises(hpccoll.ArgumentError, match="op: expected"):
        hpccoll.reduce_scatter_adjoint(np.ones(2), comm, op=np.array("sum"), sizes=[2] * P)
    with pytest.raises(hpccoll.ArgumentError, match="op: expected"):
        hpccoll.all_reduce_adjoint(np.ones(2), comm, op=np.array(["sum", "avg"]))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("tail", [(), (3,)])
@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_list_all_gather_fast_equals_general(comm, dtype, pattern, tail):
    from hpccoll._coalesced import all_gather_many

    sizes = SIZE_PATTERNS[pattern](comm.size)
    xs = [np.asarray(make((sizes[comm.rank],) + tail, dtype, seed=10 * comm.rank + i)) for i in range(4)]
    if tail:
        xs[1] = np.asfortranarray(xs[1])  # packed by numpy.concatenate instead of bytes.join
    got = fast.all_gather(xs, comm, 0, sizes, None, "all_gather")
    assert isinstance(got, list) and len(got) == 4
    want = all_gather_many(xs, comm, 0, sizes, None, "all_gather", False)
    for g, w in zip(got, want):
        same_bits(g, w)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("pattern", ["none"] + sorted(SIZE_PATTERNS))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_list_reduce_scatter_fast_equals_general(comm, dtype, op, pattern):
    from hpccoll._coalesced import reduce_scatter_many

    native = native_or_skip(dtype, op)
    sizes = None if pattern == "none" else SIZE_PATTERNS[pattern](comm.size)
    n = 2 * comm.size + 1 if sizes is None else sum(sizes)
    xs = [np.asarray(make((n, 2), dtype, seed=10 * comm.rank + i)) for i in range(3)]
    before = [x.copy() for x in xs]
    mine = (hpccoll.split_sizes(n, comm.size) if sizes is None else sizes)[comm.rank]
    got = fast.reduce_scatter(xs, comm, op, 0, sizes, None)
    if got is None:  # widened dtypes and empty blocks: the general path, with the same MPI call
        assert not native or mine == 0
        got = reduce_scatter_many(xs, comm, op, 0, sizes, None, "reduce_scatter", False)
    want = reduce_scatter_many(xs, comm, op, 0, sizes, None, "reduce_scatter", False)
    for g, w in zip(got, want):
        same_bits(g, w)
    for x, b in zip(xs, before):
        same_bits(x, b)


@pytest.mark.mpi(min_size=2)
def test_list_gather_and_scatter_decline(comm):
    P = comm.size
    xs = [np.ones((2, 3)), np.ones((2, 3))]
    declined = [
        fast.all_gather(xs, comm, 1, [3] * P, None, "all_gather"),  # inner axis
        fast.all_gather([np.ones((2, 3)), np.ones((2, 4))], comm, 0, [2] * P, None, "all_gather"),  # shapes
        fast.all_gather([np.ones(2), np.ones(2, np.float32)], comm, 0, [2] * P, None, "all_gather"),  # dtypes
        fast.all_gather(xs, comm, 0, [2] * P, [np.empty((2 * P, 3))] * 2, "all_gather"),  # out given
        fast.reduce_scatter(xs, comm, "sum", 1, None, None),
        fast.reduce_scatter([np.ones(2, np.float16)] * 2, comm, "sum", 0, None, None),  # widened
        fast.reduce_scatter([], comm, "sum", 0, None, None),
        fast.all_gather([np.ones(2, ">f8")] * 2, comm, 0, [2] * P, None, "all_gather"),  # unsupported dtype
        fast.all_gather([np.ones(2, "M8[s]")] * 2, comm, 0, [2] * P, None, "all_gather"),
    ]
    assert declined == [None] * len(declined)
    with pytest.raises(hpccoll.DTypeError, match="native-byte-order"):
        hpccoll.all_gather([np.ones(2, ">f8")] * 2, comm, sizes=[2] * P)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
def test_list_all_gather_discovers_sizes(comm, pattern):
    """sizes=None: one exchange; uniform extents go on in the fast path, others in the general path."""
    from hpccoll._coalesced import all_gather_many

    P, r = comm.size, comm.rank
    sizes = SIZE_PATTERNS[pattern](P)
    xs = [np.asarray(make((sizes[r], 2), np.float32, seed=10 * r + i)) for i in range(3)]
    got = fast.all_gather(xs, comm, 0, None, None, "all_gather")
    want = all_gather_many(xs, comm, 0, sizes, None, "all_gather", False)
    for g, w in zip(got, want):
        same_bits(g, w)
    # Rank 1's second array is longer: the table is not uniform, the general path finishes after the exchange.
    ys = [np.asarray(make((sizes[r] + (r == 1 and i == 1), 2), np.float32, seed=i)) for i in range(3)]
    got = hpccoll.all_gather(ys, comm)
    want = all_gather_many(ys, comm, 0, None, None, "all_gather", False)
    for g, w in zip(got, want):
        same_bits(g, w)
    assert [g.shape[0] for g in got] == [sum(sizes), sum(sizes) + 1, sum(sizes)]
