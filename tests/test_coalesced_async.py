"""List forms (coalesced) and non-blocking forms, against NumPy references built from the global data.

Every rank makes every rank's inputs from rank-dependent seeds (conftest's
``make``), so each computes its own expected result with NumPy: a reduction
over the leading rank axis (``reference``), a concatenation, a block of
either, or an all-to-all's blocks. Data movement is compared bit for bit,
reductions with the per-dtype tolerance.
"""

import numpy as np
import pytest
from conftest import SIZE_PATTERNS, all_ranks, assert_close, assert_same, make, reference

import hpccoll

pytestmark = pytest.mark.mpi

DTYPES = ["float64", "float32", "float16", "int32", "bool", "complex64"]


def arrays_for(rank, seed, shapes=((3, 4), (0, 2), (5,), (2, 2, 2), (1,))):
    """Rank ``rank``'s arrays: one per (shape, dtype), different on every rank."""
    out = []
    for k, shape in enumerate(shapes):
        dtype = DTYPES[k % len(DTYPES)]
        out.append(make(shape, dtype, seed + 100 * rank + k))
    return out


def every_rank(comm, build):
    """``[build(r) for every rank r]``: the global data, made on every rank."""
    return [build(r) for r in range(comm.size)]


def block(a, axis, sizes, rank, parts):
    """Rank ``rank``'s block of ``a`` along ``axis``, of ``parts`` (``sizes=None``: numpy.array_split's)."""
    sizes = hpccoll.split_sizes(a.shape[axis], parts) if sizes is None else sizes
    return np.split(a, np.cumsum(sizes)[:-1], axis=axis)[rank]


def alltoall_reference(inputs, split_axis, concat_axis, splits, rank):
    """Block ``rank`` of every rank's input (rank r split along ``split_axis`` by ``splits[r]``), concatenated."""
    P = len(inputs)
    return np.concatenate([block(x, split_axis, s, rank, P) for x, s in zip(inputs, splits)], axis=concat_axis)


def expected(fn, kw, inputs, rank):
    """NumPy's answer on ``rank`` to ``fn(inputs[r], **kw)`` called on every rank r (one array each)."""
    P, name = len(inputs), fn.__name__
    op, axis, sizes = kw.get("op", "sum"), kw.get("axis", 0), kw.get("sizes")
    if name == "all_gather":
        return np.concatenate(inputs, axis=axis)
    if name == "reduce_scatter_adjoint":  # an all-gather (avg: divided by P)
        full = np.concatenate(inputs, axis=axis)
        return full / full.dtype.type(P) if op == "avg" else full
    if name in ("reduce_scatter", "all_gather_adjoint"):
        total = reference(np.stack(inputs), op)
        return block(total, axis % total.ndim, sizes, rank, P)
    if name == "all_reduce" or (name == "all_reduce_adjoint" and kw.get("cotangent", "varying") == "varying"):
        return reference(np.stack(inputs), op)
    if name == "all_reduce_adjoint":  # replicated: the same cotangent everywhere (avg: / P), no communication
        y = inputs[rank]
        return y / y.dtype.type(P) if op == "avg" else y.copy()
    sa, ca = kw.get("split_axis", 0), kw.get("concat_axis", 0)
    if name == "all_to_all_adjoint":  # the all-to-all back: axes swapped
        sa, ca = ca, sa
    return alltoall_reference(inputs, sa, ca, [None] * P, rank)


def expected_list(fn, kw, inputs, rank):
    """``expected`` array by array: ``inputs[r]`` is rank r's list."""
    return [expected(fn, kw, [lst[i] for lst in inputs], rank) for i in range(len(inputs[0]))]


EXACT = {"all_gather", "all_to_all", "all_to_all_adjoint"}


def compare(comm, fn, got, want, also=True):
    """Bit for bit for data movement, else by the dtype's tolerance; ``also``: the test's other checks hold.

    The verdict is collective (conftest's ``all_ranks``): a failure on one rank
    fails the test on every rank, and no rank is left waiting in the next call.
    """
    check = assert_same if fn.__name__ in EXACT else assert_close
    try:
        assert also, "a check of the result's identity or of the inputs failed"
        assert len(got) == len(want), (len(got), len(want))
        for g, w in zip(got, want):
            check(g, w)
        err = None
    except Exception as e:  # noqa: BLE001 - shared below, on every rank
        err = f"{type(e).__name__}: {e}"[:2000]
        print(f"rank {comm.rank}: {err}")  # shown with the failure (captured output)
    assert all_ranks(comm, err is None), err


@pytest.mark.parametrize("op", ["sum", "max", "prod"])
@pytest.mark.parametrize("bucket", [1 << 20, 16], ids=["one-bucket", "tiny-buckets"])
def test_all_reduce_list(comm, op, bucket, monkeypatch):
    monkeypatch.setattr(comm, "bucket_bytes", bucket)
    inputs = every_rank(comm, lambda r: arrays_for(r, 1))
    xs = inputs[comm.rank]
    before = [x.copy() for x in xs]
    got = hpccoll.all_reduce(xs, comm, op=op)
    fresh = isinstance(got, list) and not any(np.shares_memory(g, x) for g, x in zip(got, xs))
    untouched = all(np.array_equal(x, b) and x.dtype == b.dtype for x, b in zip(xs, before))
    compare(
        comm,
        hpccoll.all_reduce,
        got,
        expected_list(hpccoll.all_reduce, {"op": op}, inputs, comm.rank),
        also=fresh and untouched,
    )


def test_all_reduce_list_avg_and_out(comm):
    inputs = every_rank(comm, lambda r: [make((4, 3), "float64", 7 + r), make((6,), "float32", 9 + r)])
    outs = [np.empty((4, 3)), np.empty(6, np.float32)]
    got = hpccoll.all_reduce(inputs[comm.rank], comm, op="avg", out=outs)
    compare(
        comm,
        hpccoll.all_reduce,
        got,
        expected_list(hpccoll.all_reduce, {"op": "avg"}, inputs, comm.rank),
        also=got[0] is outs[0] and got[1] is outs[1],
    )
    assert hpccoll.all_reduce([], comm) == []


@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
@pytest.mark.parametrize("axis", [0, -1])
def test_all_gather_list(comm, pattern, axis, monkeypatch):
    monkeypatch.setattr(comm, "bucket_bytes", 64)
    sizes = SIZE_PATTERNS[pattern](comm.size)

    def build(r):
        n = sizes[r]
        return [
            make((n, 3) if axis == 0 else (3, n), "float32", 3 + r),
            make((n,), "bool", 5 + r),
            make((n, 2, 2) if axis == 0 else (2, 2, n), "complex128", 6 + r),
        ]

    inputs = every_rank(comm, build)
    xs = inputs[comm.rank]
    want = expected_list(hpccoll.all_gather, {"axis": axis}, inputs, comm.rank)
    compare(comm, hpccoll.all_gather, hpccoll.all_gather(xs, comm, axis=axis), want)
    compare(comm, hpccoll.all_gather, hpccoll.all_gather(xs, comm, axis=axis, sizes=sizes), want)


@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("axis", [0, 1])
def test_reduce_scatter_list(comm, op, axis, monkeypatch):
    monkeypatch.setattr(comm, "bucket_bytes", 100)
    inputs = every_rank(
        comm,
        lambda r: [
            make((2 * comm.size + 1, 3), "float64", 11 + r),
            make((comm.size + 2, comm.size + 1), "float16", 12 + r),
        ],
    )
    got = hpccoll.reduce_scatter(inputs[comm.rank], comm, op=op, axis=axis)
    compare(
        comm,
        hpccoll.reduce_scatter,
        got,
        expected_list(hpccoll.reduce_scatter, {"op": op, "axis": axis}, inputs, comm.rank),
    )


def test_list_adjoints_match(comm):
    inputs = every_rank(
        comm, lambda r: [make((2 * comm.size, 2), "float64", 13 + r), make((comm.size,), "float64", 14 + r)]
    )
    same = every_rank(comm, lambda r: inputs[0])  # a replicated cotangent: rank 0's, on every rank
    for fn, kw, data in (
        (hpccoll.all_gather_adjoint, {}, inputs),
        (hpccoll.all_reduce_adjoint, {}, inputs),
        (hpccoll.all_reduce_adjoint, {"cotangent": "replicated"}, same),
        (hpccoll.all_to_all_adjoint, {}, inputs),
    ):
        got = fn(data[comm.rank], comm, **kw)
        compare(comm, fn, got, expected_list(fn, kw, data, comm.rank))
    shards = every_rank(comm, lambda r: [make((r + 1, 2), "float64", 15 + r)])
    got = hpccoll.reduce_scatter_adjoint(shards[comm.rank], comm, op="avg")
    compare(
        comm,
        hpccoll.reduce_scatter_adjoint,
        got,
        expected_list(hpccoll.reduce_scatter_adjoint, {"op": "avg"}, shards, comm.rank),
    )


def test_list_errors_name_the_element(comm):
    with pytest.raises(hpccoll.DTypeError, match=r"x\[1\]"):
        hpccoll.all_reduce([np.ones(2), np.array(["a"])], comm)
    with pytest.raises(hpccoll.ArgumentError, match="out: expected None or a list of 2"):
        hpccoll.all_reduce([np.ones(2), np.ones(3)], comm, out=[np.empty(2)])


@pytest.mark.parametrize(
    "fn,kw,shape",
    [
        (hpccoll.all_gather, {"axis": 1}, (2, 3)),
        (hpccoll.all_gather, {}, (3,)),
        (hpccoll.reduce_scatter, {"op": "avg", "axis": 1}, (2, 5)),
        (hpccoll.all_reduce, {"op": "max"}, (4, 2)),
        (hpccoll.all_reduce, {"op": "sum"}, ()),
        (hpccoll.all_gather_adjoint, {}, (6,)),
        (hpccoll.reduce_scatter_adjoint, {"op": "avg"}, (2,)),
        (hpccoll.all_reduce_adjoint, {"cotangent": "replicated", "op": "avg"}, (3,)),
        (hpccoll.all_to_all, {}, (5, 2)),
        (hpccoll.all_to_all, {"split_axis": 1, "concat_axis": 0}, (2, 7)),
        (hpccoll.all_to_all_adjoint, {"split_axis": 1, "concat_axis": 0}, (7, 2)),
    ],
)
def test_async_matches_numpy(comm, fn, kw, shape):
    replicated = kw.get("cotangent") == "replicated"  # the same cotangent on every rank
    inputs = every_rank(comm, lambda r: make(shape, "float64", 17 + (0 if replicated else r)))
    x = inputs[comm.rank]
    req = fn(x, comm, async_op=True, **kw)
    assert isinstance(req, hpccoll.Request)
    while not req.test():  # progresses without blocking; completes eventually
        pass
    compare(comm, fn, [req.wait()], [expected(fn, kw, inputs, comm.rank)], also=req.done)


def test_async_in_place_float16_and_lists(comm):
    inputs = every_rank(comm, lambda r: make((5,), "float64", 19 + r))
    x = inputs[comm.rank].copy()
    req = hpccoll.all_reduce(x, comm, out=x, async_op=True)
    compare(comm, hpccoll.all_reduce, [x], [reference(np.stack(inputs), "sum")], also=req.wait() is x)
    halves = every_rank(comm, lambda r: make((4,), "float16", 20 + r))
    got = hpccoll.all_reduce(halves[comm.rank], comm, async_op=True).wait()
    compare(comm, hpccoll.all_reduce, [got], [reference(np.stack(halves), "sum")])
    lists = every_rank(comm, lambda r: [make((3,), "float32", 21 + r), make((2, 2), "int64", 22 + r)])
    xs = lists[comm.rank]
    reqs = [hpccoll.all_reduce(xs, comm, async_op=True), hpccoll.all_gather(xs, comm, async_op=True)]
    got_r, got_g = (r.wait() for r in reqs)
    compare(comm, hpccoll.all_reduce, got_r, expected_list(hpccoll.all_reduce, {}, lists, comm.rank))
    compare(comm, hpccoll.all_gather, got_g, expected_list(hpccoll.all_gather, {}, lists, comm.rank))


@pytest.mark.parametrize("bucket", [1 << 20, 16], ids=["one-bucket", "tiny-buckets"])
def test_async_list_outlives_the_callers_list(comm, bucket, monkeypatch):
    """A non-blocking list call holds its own list: changing the caller's list before wait() changes nothing."""
    monkeypatch.setattr(comm, "bucket_bytes", bucket)
    n = comm.size * 2
    calls = [
        (hpccoll.all_reduce, {}, lambda r, k: [make((n,), "float32", 30 + r + k), make((2, 3), "int64", 31 + k)]),
        (hpccoll.all_gather, {"sizes": [2] * comm.size}, lambda r, k: [make((2, 3), "float64", 32 + r + k)] * 3),
        (hpccoll.reduce_scatter, {}, lambda r, k: [make((n, 2), "float64", 33 + r + k) for _ in range(3)]),
        (hpccoll.all_to_all, {"recv_sizes": [2] * comm.size}, lambda r, k: [make((n, 2), "int32", 34 + r + k)] * 2),
    ]
    for fn, kw, build in calls:
        inputs = every_rank(comm, lambda r: build(r, 0))
        want = expected_list(fn, kw, inputs, comm.rank)
        xs = build(comm.rank, 0)
        req = fn(xs, comm, async_op=True, **kw)
        xs[:] = build(comm.rank, 1)[:1]  # the caller reuses its list while the call is in flight
        compare(comm, fn, req.wait(), want)


@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
@pytest.mark.parametrize("bucket", [1 << 20, 16], ids=["one-bucket", "tiny-buckets"])
def test_all_to_all_list(comm, bucket, async_op, monkeypatch):
    """Lists of all-to-alls, one dtype per array, into new arrays and into ``out``."""
    monkeypatch.setattr(comm, "bucket_bytes", bucket)
    P = comm.size
    inputs = every_rank(
        comm,
        lambda r: [
            make((2 * P + 1, 3), "float16", 40 + r),
            make((P + r,), "bool", 41 + r),
            make((P, 2, 2), "complex64", 42 + r),
        ],
    )
    splits = [[hpccoll.split_sizes(x.shape[0], P) for x in lst] for lst in inputs]
    want = [alltoall_reference([lst[i] for lst in inputs], 0, 0, [s[i] for s in splits], comm.rank) for i in range(3)]
    got = hpccoll.all_to_all(inputs[comm.rank], comm, async_op=async_op)
    outs = [np.empty_like(w) for w in want]
    res = hpccoll.all_to_all(inputs[comm.rank], comm, out=outs, async_op=async_op)
    if async_op:
        got, res = got.wait(), res.wait()
    compare(comm, hpccoll.all_to_all, got, want)
    compare(comm, hpccoll.all_to_all, outs, want, also=all(a is o for a, o in zip(res, outs)))


def test_bucket_bytes_from_environment(monkeypatch):
    monkeypatch.setenv("HPCCOLL_BUCKET_BYTES", "4096")
    with hpccoll.Communicator() as c:
        assert c.bucket_bytes == 4096
    monkeypatch.setenv("HPCCOLL_BUCKET_BYTES", "lots")
    with pytest.raises(hpccoll.ArgumentError, match="HPCCOLL_BUCKET_BYTES: expected a positive int"):
        hpccoll.Communicator()
