"""all_to_all and its adjoint, against a NumPy reference built from every rank's input.

Every rank makes every rank's input from seeds, so each can compute its own
expected result: block j of rank r's ``x`` (split along ``split_axis``)
lands in rank j's result, concatenated along ``concat_axis`` in rank order.
"""

import functools

import numpy as np
import pytest
from conftest import DTYPE_IDS, DTYPES, SIZE_PATTERNS, agree, assert_same, layout, make, raises_everywhere
from test_check_mode import checked  # noqa: F401 - the check-mode communicator fixture

import hpccoll
from hpccoll import ArgumentError, DTypeError, MismatchError
from hpccoll.testing import dottest
from hpccoll.transports import _control
from hpccoll.transports.host_mpi import HostMPI

pytestmark = pytest.mark.mpi


def splits(P, pattern, same_axis, default, extent=None):
    """Every rank's split (``result[r][j]``: rank r's block for rank j)."""
    if default:  # numpy.array_split's, of an extent that differs by rank when the axes are equal
        return [hpccoll.split_sizes(extent + (r if same_axis else 0), P) for r in range(P)]
    base = SIZE_PATTERNS[pattern](P)
    if not same_axis or pattern == "even":
        return [tuple(base)] * P  # with different axes the split is one decomposition, shared
    return [tuple((base[j] + r * j) % 4 for j in range(P)) for r in range(P)]


def case(comm, shape, sa, ca, pattern, dtype, seed=0, default=False):
    """(x, sizes, recv_sizes, want) for this rank; the other extents of ``shape`` are kept."""
    P, me, nd = comm.size, comm.rank, len(shape)
    sa, ca = sa % nd, ca % nd
    S = splits(P, pattern, sa == ca, default, extent=2 * P + 1)
    C = [(r + 1) % 3 for r in range(P)]  # extents along concat_axis (axes differing): 1, 2, 0, 1
    xs = []
    for r in range(P):
        s = list(shape)
        s[sa] = sum(S[r])
        if sa != ca:
            s[ca] = C[r]
        xs.append(make(tuple(s), dtype, seed=seed + r))
    pieces = [np.split(xs[r], np.cumsum(S[r])[:-1], axis=sa)[me] for r in range(P)]
    recv = tuple(S[r][me] if sa == ca else C[r] for r in range(P))
    return xs[me], S[me], recv, np.concatenate(pieces, axis=ca)


AXES = [  # (shape, split_axis, concat_axis): extents at the two axes are replaced
    ((0, 3), 0, 0),
    ((0,), 0, 0),
    ((3, 0), 1, 1),
    ((0, 0), 1, 0),
    ((0, 0), 0, 1),
    ((0, 0), -1, -2),
    ((2, 0, 0), 1, 2),
    ((0, 3, 0), 2, 0),
    ((2, 0, 3), -2, -2),
    ((0, 2, 0, 2), 0, 2),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("axes", [(0, 0), (1, 0), (0, 1)], ids=["equal", "1->0", "0->1"])
def test_every_dtype(comm, dtype, axes):
    x, sizes, _, want = case(comm, (0, 0), *axes, "uneven", dtype)
    assert_same(hpccoll.all_to_all(x, comm, split_axis=axes[0], concat_axis=axes[1], sizes=sizes), want, comm)


@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
@pytest.mark.parametrize("shape,sa,ca", AXES)
@pytest.mark.parametrize("how", ["C", "strided"])
@pytest.mark.parametrize("given", ["nothing", "sizes", "both"])
def test_axes_sizes_layouts(comm, shape, sa, ca, pattern, how, given):
    x, sizes, recv, want = case(comm, shape, sa, ca, pattern, np.float64, seed=len(shape), default=given == "nothing")
    x = layout(x, how)
    before = x.copy()
    kw = dict(
        split_axis=sa,
        concat_axis=ca,
        sizes=None if given == "nothing" else sizes,
        recv_sizes=recv if given == "both" else None,
    )
    y = hpccoll.all_to_all(x, comm, **kw)
    out = layout(np.empty_like(want), how)
    res = hpccoll.all_to_all(x, comm, out=out, **kw)
    assert_same(y, want, comm)
    assert_same(x, before, comm)  # the input is never modified
    agree(comm, not np.shares_memory(y, x) and res is out, "the result shares memory with x, or out= was not returned")
    assert_same(out, want, comm)


@pytest.mark.parametrize("how", ["F", "reversed"])
@pytest.mark.parametrize("axes", [(0, 0), (1, 0), (2, 1)])
def test_other_layouts(comm, how, axes):
    x, sizes, _, want = case(comm, (0, 0, 2), *axes, "empty-last", np.complex64, seed=3)
    out = layout(np.empty_like(want), how)
    got = hpccoll.all_to_all(layout(x, how), comm, split_axis=axes[0], concat_axis=axes[1], sizes=sizes, out=out)
    agree(comm, got is out, "out= was not returned")
    assert_same(out, want, comm)


def test_array_likes_and_mpi4py_communicators(comm):
    from mpi4py import MPI

    x = [10 * comm.rank + j for j in range(comm.size)]  # one element for every rank
    want = np.array([10 * r + comm.rank for r in range(comm.size)])
    assert_same(hpccoll.all_to_all(x, comm), want, comm)
    assert_same(hpccoll.all_to_all(np.array(x), comm.mpi), want, comm)
    assert_same(hpccoll.all_to_all(np.array(x), MPI.COMM_WORLD), want, comm)


def _recorder(run, names):
    def record(comm, name, *args, **kw):
        names.append(f"exchange {name}")
        return run(comm, name, *args, **kw)

    return record


ROADS = {"pairs": 8, "Alltoallv": 0}  # HostMPI.pairwise_max_ranks for each road of the calls not known even


@pytest.mark.parametrize("road", sorted(ROADS))
@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
@pytest.mark.parametrize("axes", [(0, 0), (1, 0)])
def test_mpi_calls(comm, pattern, axes, road, monkeypatch):
    """MPI_Alltoall only where every rank knows every pair moves the same count, else point-to-point pairs
    (or MPI_Alltoallv above ``pairwise_max_ranks`` ranks).

    One rank's own counts cannot tell (they are a row and a column of the
    count matrix): ranks choosing different calls would hang. Equal axes: the
    size exchange tells; given recv_sizes, not known even. Axes differing: the
    split and the received extents are global, so they tell.
    """
    names = []
    monkeypatch.setattr(HostMPI, "pairwise_max_ranks", ROADS[road])
    monkeypatch.setattr(_control, "run", _recorder(_control.run, names))  # the size exchange
    blocking, pairwise = HostMPI._blocking, HostMPI._pairwise
    pairs = {"Sendrecv": "pairs"}  # two ranks, blocking: the pairs are one Sendrecv
    monkeypatch.setattr(
        HostMPI,
        "_blocking",
        lambda self, name, *args: (names.append(pairs.get(name, name)), blocking(self, name, *args)),
    )
    monkeypatch.setattr(HostMPI, "_pairwise", lambda self, *args: (names.append("pairs"), pairwise(self, *args))[1])
    x, sizes, recv, want = case(comm, (0, 3) if axes == (0, 0) else (0, 0), *axes, pattern, np.int32, seed=1)
    kw = dict(split_axis=axes[0], concat_axis=axes[1], sizes=sizes)
    learned = hpccoll.all_to_all(x, comm, **kw)
    given = hpccoll.all_to_all(x, comm, recv_sizes=recv, out=np.empty_like(want), **kw)
    even = pattern == "even" and (axes == (0, 0) or comm.size == 1)  # axes differing: extents 1, 2, 0, ... differ
    assert_same(learned, want, comm)
    assert_same(given, want, comm)
    data = "Alltoall" if even else road
    calls = ["exchange Alltoall", data, road if axes == (0, 0) else data]
    agree(comm, comm.size == 1 or names == calls, lambda: f"MPI calls {names}, expected {calls}")
    even_extents = hpccoll.all_to_all(np.ones((2, 2 * comm.size)), comm, split_axis=1, recv_sizes=[2] * comm.size)
    agree(comm, even_extents.shape == (2 * comm.size, 2), lambda: f"shape {even_extents.shape}")
    agree(comm, comm.size == 1 or names[-1] == "Alltoall", lambda: f"MPI calls {names}, expected Alltoall last")


@pytest.mark.parametrize("road", sorted(ROADS))
@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("axes", [(0, 0), (1, 0), (0, 1)], ids=["equal", "1->0", "0->1"])
def test_both_roads(comm, dtype, axes, async_op, road, monkeypatch):
    """Calls not known even, by point-to-point pairs and by MPI_Alltoallv: every dtype, blocks of 0 included,
    blocking or not, with ``out=`` (straight into place) and without."""
    monkeypatch.setattr(HostMPI, "pairwise_max_ranks", ROADS[road])
    for pattern in ("uneven", "empty-last"):
        x, sizes, recv, want = case(comm, (0, 0, 2), *axes, pattern, dtype, seed=5)
        kw = dict(split_axis=axes[0], concat_axis=axes[1], sizes=sizes, recv_sizes=recv, async_op=async_op)
        out = np.empty_like(want)
        got = hpccoll.all_to_all(x, comm, **kw)
        res = hpccoll.all_to_all(x, comm, out=out, **kw)
        if async_op:
            got, res = got.wait(), res.wait()
        assert_same(got, want, comm)
        agree(comm, res is out, "out= was not returned")
        assert_same(out, want, comm)


@pytest.mark.parametrize("road", sorted(ROADS))
def test_large_blocks_in_flight_together(comm, road, monkeypatch):
    """Blocks past MPI's eager limit (rendezvous), zero-sized ones, and two calls in flight at once on one
    communicator (each receives its own blocks: pairs match in the order the calls started)."""
    monkeypatch.setattr(HostMPI, "pairwise_max_ranks", ROADS[road])
    P, me = comm.size, comm.rank
    rows = [[(40000 * (1 + (r + j) % 3)) if (r + j) % 4 != 3 else 0 for j in range(P)] for r in range(P)]  # 0.3-1 MB
    xs = [np.arange(sum(rows[r]), dtype=np.float64) + 1e6 * r for r in range(P)]
    want = np.concatenate([np.split(xs[r], np.cumsum(rows[r])[:-1])[me] for r in range(P)])
    recv = [rows[r][me] for r in range(P)]
    first = hpccoll.all_to_all(xs[me], comm, sizes=rows[me], recv_sizes=recv, async_op=True)
    second = hpccoll.all_to_all(-xs[me], comm, sizes=rows[me], recv_sizes=recv, out=np.empty(sum(recv)), async_op=True)
    assert_same(second.wait(), -want, comm)
    assert_same(first.wait(), want, comm)
    assert_same(hpccoll.all_to_all(xs[me], comm, sizes=rows[me]), want, comm)  # learned: the size exchange first


# --------------------------------------------------------------------------- out= and argument errors


def test_out_errors(comm):
    P = comm.size
    x = make((2 * P, 3), np.float64, seed=1)
    good = np.empty((2 * P, 3))
    for out, match in [
        (np.empty((2 * P, 4)), rf"out: expected shape \({2 * P}, 3\)"),
        (np.empty((2 * P, 3), np.float32), "out: expected dtype float64"),
        ([0.0] * 6, "out: expected a numpy.ndarray"),
        (x, "out: expected memory separate from the input"),
    ]:
        raises_everywhere(comm, ArgumentError, match, lambda: hpccoll.all_to_all(x, comm, out=out))
    ro = good.copy()
    ro.flags.writeable = False
    raises_everywhere(
        comm,
        ArgumentError,
        "out: expected a writeable array",
        lambda: hpccoll.all_to_all(x, comm, out=ro, recv_sizes=[2] * P),
    )
    big = np.zeros(4 * P * 3)
    raises_everywhere(
        comm,
        ArgumentError,
        "separate from the input",
        lambda: hpccoll.all_to_all(
            big[: 2 * P * 3].reshape(2 * P, 3), comm, out=big[P * 3 : 3 * P * 3].reshape(2 * P, 3)
        ),
    )


def test_argument_errors(comm):
    P, me = comm.size, comm.rank
    x = np.ones((2 * P, 3))
    cases = [
        (dict(split_axis=2), r"split_axis: expected an int in \[-2, 1\] for a 2-D array; got 2"),
        (dict(concat_axis=-3), r"concat_axis: expected an int in \[-2, 1\] for a 2-D array; got -3"),
        (dict(split_axis=1.0), "split_axis: expected an int; got float"),
        (dict(sizes=[1] * P), rf"sizes: expected ints summing to x.shape\[0\] == {2 * P}"),
        (dict(sizes=[2] * (P + 1)), f"sizes: expected {P} non-negative ints"),
        (dict(sizes=[-1] + [2] * (P - 1)), "sizes: expected"),
        (dict(recv_sizes=[2] * (P + 1)), f"recv_sizes: expected {P} non-negative ints"),
        (dict(recv_sizes=[3] * P), rf"recv_sizes: expected recv_sizes\[{me}\] == sizes\[{me}\] == 2"),
        (
            dict(split_axis=1, sizes=[3] + [0] * (P - 1), recv_sizes=[1] * P),
            rf"recv_sizes: expected recv_sizes\[{me}\] == x.shape\[0\] == {2 * P}",
        ),
    ]
    for kw, match in cases:  # some messages name the rank
        raises_everywhere(comm, ArgumentError, match, lambda: hpccoll.all_to_all(x, comm, **kw), same_message=False)
    raises_everywhere(
        comm,
        ArgumentError,
        "at least 1 dimension to split along split_axis",
        lambda: hpccoll.all_to_all(np.float64(1.0), comm),
    )
    raises_everywhere(
        comm, DTypeError, "x: expected a native-byte-order dtype", lambda: hpccoll.all_to_all(np.array(["a"] * P), comm)
    )
    raises_everywhere(
        comm, ArgumentError, "recv_sizes: expected", lambda: hpccoll.AllToAll(comm, recv_sizes=[1] * (P + 1))
    )


# --------------------------------------------------------------------------- lists, async


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("axes", [(0, 0), (1, 0)])
def test_lists(comm, axes, async_op):
    cases = [
        case(comm, shape, *axes, pattern, dtype, seed=i)
        for i, (shape, pattern, dtype) in enumerate(
            [((0, 2), "uneven", np.float32), ((0, 0), "even", np.int8), ((0, 0, 3), "empty-last", np.complex128)]
        )
    ]
    if axes == (0, 0):  # equal axes: each array keeps its own split, so give none (array_split of each)
        cases = [
            case(comm, shape, 0, 0, "even", dtype, seed=i, default=True)
            for i, (shape, dtype) in enumerate([((0, 2), np.float32), ((0,), np.int8), ((0, 1, 3), np.complex128)])
        ]
        sizes = None
    else:
        sizes = cases[0][1]
        cases = [
            case(comm, shape, *axes, "uneven", dtype, seed=i)
            for i, (shape, dtype) in enumerate([((0, 0), np.float32), ((0, 0, 2), np.int8), ((0, 0), np.bool_)])
        ]
    xs = [c[0] for c in cases]
    got = hpccoll.all_to_all(xs, comm, split_axis=axes[0], concat_axis=axes[1], sizes=sizes, async_op=async_op)
    outs = [np.empty_like(c[3]) for c in cases]
    recv = cases[0][2]
    again = hpccoll.all_to_all(
        tuple(xs),
        comm,
        split_axis=axes[0],
        concat_axis=axes[1],
        sizes=sizes,
        out=outs,
        recv_sizes=recv if axes != (0, 0) else None,
        async_op=async_op,
    )
    if async_op:
        got, again = got.wait(), again.wait()
    agree(comm, isinstance(got, list) and len(got) == 3 and again is not None, lambda: f"got {got!r}, {again!r}")
    for g, o, c in zip(got, outs, cases):
        assert_same(g, c[3], comm)
        assert_same(o, c[3], comm)
    agree(comm, all(a is o for a, o in zip(again, outs)), "out= was not returned")
    agree(comm, hpccoll.all_to_all([], comm) == [], "an empty list did not give an empty list")


def test_list_errors(comm):
    P = comm.size
    raises_everywhere(
        comm,
        ArgumentError,
        r"sizes: expected ints summing to x\[1\].shape\[0\]",
        lambda: hpccoll.all_to_all([np.ones(P), np.ones(P + 1)], comm, sizes=[1] * P),
    )
    raises_everywhere(
        comm,
        ArgumentError,
        "out: expected None or a list of 2 arrays",
        lambda: hpccoll.all_to_all([np.ones(P), np.ones(P)], comm, out=[np.ones(P)]),
    )


@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
def test_async(comm, pattern):
    x, sizes, recv, want = case(comm, (0, 0), 1, 0, pattern, np.float64, seed=7)
    req = hpccoll.all_to_all(x, comm, split_axis=1, concat_axis=0, sizes=sizes, recv_sizes=recv, async_op=True)
    while not req.test():
        pass
    agree(comm, req.done, "req.done is False after req.test() returned True")
    out = np.empty_like(want)
    req2 = hpccoll.all_to_all(x, comm, split_axis=1, concat_axis=0, sizes=sizes, out=out, async_op=True)
    agree(comm, req2.wait() is out, "out= was not returned")
    assert_same(req.wait(), want, comm)
    assert_same(out, want, comm)


def test_size_one_communicator(comm):
    solo = comm.split(comm.rank)
    try:
        x = make((3, 4), np.float32, seed=comm.rank)
        y = hpccoll.all_to_all(x, solo, split_axis=1, concat_axis=0)
        z = hpccoll.all_to_all_adjoint(y, solo, split_axis=1, concat_axis=0, async_op=True).wait()
        [w] = hpccoll.all_to_all([x], solo)
    finally:
        solo.free()
    assert_same(y, x, comm)
    assert_same(z, x, comm)
    assert_same(w, x, comm)
    agree(comm, not np.shares_memory(y, x) and not np.shares_memory(w, x), "a result shares memory with x")


# --------------------------------------------------------------------------- mismatches


@pytest.mark.mpi(min_size=2)
def test_mismatch_detected_without_check_mode(comm):
    """The size exchange compares a signature: the same MismatchError on every rank."""
    P = comm.size
    x = np.ones((2 * P, 3 if comm.rank == 0 else 4))
    raises_everywhere(comm, MismatchError, "ranks 0 and 1 disagree", lambda: hpccoll.all_to_all(x, comm))
    y = np.ones((2 * P, 2))
    sizes = [2] * P if comm.rank == 0 else [2 * P] + [0] * (P - 1)  # the split must be shared when axes differ
    raises_everywhere(
        comm,
        MismatchError,
        "ranks 0 and 1 disagree",
        lambda: hpccoll.all_to_all(y, comm, split_axis=0, concat_axis=1, sizes=sizes),
    )


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("fault", ["dtype", "axes", "shape", "split", "recv_sizes", "local", "out"])
def test_check_mode_mismatches(checked, fault):  # noqa: F811 - the fixture
    P, me = checked.size, checked.rank
    x = np.ones((2 * P, 3), np.float32 if fault == "dtype" and me == 1 else np.float64)
    kw = dict(split_axis=1 if fault == "axes" and me == 1 else 0, concat_axis=1)
    if fault == "shape":
        x = np.ones((2 * P + (me == 1), 3))
    if fault == "split":
        kw["sizes"] = [2] * P if me == 0 else [2 * P] + [0] * (P - 1)
    if fault == "recv_sizes":  # equal axes: rank 1 claims one more from rank 0 than rank 0 sends it
        kw = dict(split_axis=0, concat_axis=0, recv_sizes=[2 + (r == 0 and me == 1) for r in range(P)])
    if fault == "local":
        kw["sizes"] = [1] * P if me == 1 else None
    if fault == "out":
        kw["out"] = np.empty((2, 3 * P + (me == 1)))
    expected = {
        "dtype": (MismatchError, "dtype"),
        "axes": (MismatchError, "split_axis"),
        "shape": (MismatchError, "shape except concat_axis"),
        "split": (MismatchError, "sizes"),
        "recv_sizes": (MismatchError, r"rank 1 has recv_sizes=\[3, 2"),
        "local": (ArgumentError, "raised on rank 1"),
        "out": (ArgumentError, "raised on rank 1"),
    }[fault]
    raises_everywhere(checked, *expected, lambda: hpccoll.all_to_all(x, checked, **kw))


@pytest.mark.mpi(min_size=2)
def test_check_mode_agrees_on_a_good_call(checked):  # noqa: F811
    x, sizes, recv, want = case(checked, (0, 0, 2), 2, 0, "uneven", np.int64, seed=4)
    got = hpccoll.all_to_all(x, checked, split_axis=2, concat_axis=0, sizes=sizes, recv_sizes=recv)
    got2 = hpccoll.all_to_all([x], checked, split_axis=2, concat_axis=0, sizes=sizes)
    assert_same(got, want, checked)
    assert_same(got2[0], want, checked)


# --------------------------------------------------------------------------- the adjoint


@pytest.mark.parametrize("shape,sa,ca", AXES)
@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_adjoint_dot_test(comm, shape, sa, ca, dtype):
    x, sizes, recv, want = case(comm, shape, sa, ca, "uneven", dtype, seed=2)
    op = hpccoll.AllToAll(comm, split_axis=sa, concat_axis=ca, sizes=sizes, recv_sizes=recv)
    y = make(want.shape, dtype, seed=100 + comm.rank)
    assert dottest(op, x, y)  # collective: the same verdict on every rank
    assert_same(op.H(op(x)), x, comm)  # a permutation: the adjoint is the inverse
    assert op.H.H is op and "AllToAll(split_axis" in repr(op)


def test_adjoint_learns_the_sizes(comm):
    """Without sizes, the adjoint learns the blocks coming back; recv_sizes=None is array_split's."""
    n = 2 * comm.size + 1
    rows = hpccoll.split_sizes(n, comm.size)
    x = make((rows[comm.rank], 5), np.float64, seed=comm.rank)
    y = hpccoll.all_to_all(x, comm, split_axis=1, concat_axis=0)
    back = hpccoll.all_to_all_adjoint(y, comm, split_axis=1, concat_axis=0)
    f = functools.partial(hpccoll.all_to_all, comm=comm, split_axis=1, concat_axis=0)
    g = hpccoll.adjoint_of(f)
    assert g.func is hpccoll.all_to_all_adjoint and g.keywords == f.keywords
    assert hpccoll.adjoint_of(g).func is hpccoll.all_to_all
    assert hpccoll.adjoint_of(hpccoll.all_to_all) is hpccoll.all_to_all_adjoint
    assert hpccoll.adjoint_of(hpccoll.all_to_all_adjoint) is hpccoll.all_to_all
    assert_same(back, x, comm)
    assert_same(g(f(x)), x, comm)
