"""List forms (coalesced) and non-blocking forms, against the blocking single-array results."""

import numpy as np
import pytest

import hpccoll
from conftest import SIZE_PATTERNS, assert_close, assert_same, make

pytestmark = pytest.mark.mpi

DTYPES = ["float64", "float32", "float16", "int32", "bool", "complex64"]


def arrays_for(comm, seed, shapes=((3, 4), (0, 2), (5,), (2, 2, 2), (1,))):
    """One array per (shape, dtype), different on every rank."""
    out = []
    for k, shape in enumerate(shapes):
        dtype = DTYPES[k % len(DTYPES)]
        out.append(make(shape, dtype, seed + 100 * comm.rank + k))
    return out


@pytest.mark.parametrize("op", ["sum", "max", "prod"])
@pytest.mark.parametrize("bucket", [1 << 20, 16], ids=["one-bucket", "tiny-buckets"])
def test_all_reduce_list(comm, op, bucket, monkeypatch):
    monkeypatch.setattr(comm, "bucket_bytes", bucket)
    xs = arrays_for(comm, 1)
    before = [x.copy() for x in xs]
    got = hpccoll.all_reduce(xs, comm, op=op)
    assert isinstance(got, list) and len(got) == len(xs)
    for g, x in zip(got, xs):
        assert_close(g, hpccoll.all_reduce(x, comm, op=op))
        assert not np.shares_memory(g, x)
    for x, b in zip(xs, before):
        assert_same(x, b)


def test_all_reduce_list_avg_and_out(comm):
    xs = [make((4, 3), "float64", 7 + comm.rank), make((6,), "float32", 9 + comm.rank)]
    outs = [np.empty((4, 3)), np.empty(6, np.float32)]
    got = hpccoll.all_reduce(xs, comm, op="avg", out=outs)
    assert got[0] is outs[0] and got[1] is outs[1]
    for g, x in zip(got, xs):
        assert_close(g, hpccoll.all_reduce(x, comm, op="avg"))
    assert hpccoll.all_reduce([], comm) == []


@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
@pytest.mark.parametrize("axis", [0, -1])
def test_all_gather_list(comm, pattern, axis, monkeypatch):
    monkeypatch.setattr(comm, "bucket_bytes", 64)
    n = SIZE_PATTERNS[pattern](comm.size)[comm.rank]
    xs = [make((n, 3) if axis == 0 else (3, n), "float32", 3 + comm.rank),
          make((n,), "bool", 5 + comm.rank),
          make((n, 2, 2) if axis == 0 else (2, 2, n), "complex128", 6 + comm.rank)]
    got = hpccoll.all_gather(xs, comm, axis=axis)
    for g, x in zip(got, xs):
        assert_same(g, hpccoll.all_gather(x, comm, axis=axis))
    sizes = SIZE_PATTERNS[pattern](comm.size)
    again = hpccoll.all_gather(xs, comm, axis=axis, sizes=sizes)
    for g, x in zip(again, xs):
        assert_same(g, hpccoll.all_gather(x, comm, axis=axis, sizes=sizes))


@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("axis", [0, 1])
def test_reduce_scatter_list(comm, op, axis, monkeypatch):
    monkeypatch.setattr(comm, "bucket_bytes", 100)
    xs = [make((2 * comm.size + 1, 3), "float64", 11 + comm.rank),
          make((comm.size + 2, comm.size + 1), "float16", 12 + comm.rank)]
    got = hpccoll.reduce_scatter(xs, comm, op=op, axis=axis)
    for g, x in zip(got, xs):
        assert_close(g, hpccoll.reduce_scatter(x, comm, op=op, axis=axis))


def test_list_adjoints_match(comm):
    ys = [make((2 * comm.size, 2), "float64", 13 + comm.rank), make((comm.size,), "float64", 14 + comm.rank)]
    for fn, kw in ((hpccoll.all_gather_adjoint, {}), (hpccoll.all_reduce_adjoint, {}),
                   (hpccoll.all_reduce_adjoint, {"cotangent": "replicated"})):
        got = fn(ys, comm, **kw)
        for g, y in zip(got, ys):
            np.testing.assert_allclose(g, fn(y, comm, **kw), rtol=1e-14)
    shards = [make((comm.rank + 1, 2), "float64", 15)]
    got = hpccoll.reduce_scatter_adjoint(shards, comm, op="avg")
    np.testing.assert_allclose(got[0], hpccoll.reduce_scatter_adjoint(shards[0], comm, op="avg"))


def test_list_errors_name_the_element(comm):
    with pytest.raises(hpccoll.DTypeError, match=r"x\[1\]"):
        hpccoll.all_reduce([np.ones(2), np.array(["a"])], comm)
    with pytest.raises(hpccoll.ArgumentError, match="out: expected None or a list of 2"):
        hpccoll.all_reduce([np.ones(2), np.ones(3)], comm, out=[np.empty(2)])


@pytest.mark.parametrize("fn,kw,shape", [
    (hpccoll.all_gather, {"axis": 1}, (2, 3)),
    (hpccoll.all_gather, {}, (3,)),
    (hpccoll.reduce_scatter, {"op": "avg", "axis": 1}, (2, 5)),
    (hpccoll.all_reduce, {"op": "max"}, (4, 2)),
    (hpccoll.all_reduce, {"op": "sum"}, ()),
    (hpccoll.all_gather_adjoint, {}, (6,)),
    (hpccoll.reduce_scatter_adjoint, {"op": "avg"}, (2,)),
    (hpccoll.all_reduce_adjoint, {"cotangent": "replicated", "op": "avg"}, (3,)),
])
def test_async_matches_blocking(comm, fn, kw, shape):
    x = make(shape, "float64", 17 + comm.rank)
    req = fn(x, comm, async_op=True, **kw)
    assert isinstance(req, hpccoll.Request)
    while not req.test():  # progresses without blocking; completes eventually
        pass
    assert req.done
    np.testing.assert_allclose(req.wait(), fn(x, comm, **kw), rtol=1e-14)


def test_async_in_place_float16_and_lists(comm):
    x = make((5,), "float64", 19 + comm.rank)
    want = hpccoll.all_reduce(x, comm)
    req = hpccoll.all_reduce(x, comm, out=x, async_op=True)
    assert req.wait() is x
    np.testing.assert_allclose(x, want, rtol=1e-14)
    h = make((4,), "float16", 20 + comm.rank)
    np.testing.assert_array_equal(hpccoll.all_reduce(h, comm, async_op=True).wait(), hpccoll.all_reduce(h, comm))
    xs = [make((3,), "float32", 21 + comm.rank), make((2, 2), "int64", 22 + comm.rank)]
    reqs = [hpccoll.all_reduce(xs, comm, async_op=True), hpccoll.all_gather(xs, comm, async_op=True)]
    got_r, got_g = (r.wait() for r in reqs)
    for a, b in zip(got_r, hpccoll.all_reduce(xs, comm)):
        assert_close(a, b)
    for a, b in zip(got_g, hpccoll.all_gather(xs, comm)):
        assert_same(a, b)


@pytest.mark.parametrize("bucket", [1 << 20, 16], ids=["one-bucket", "tiny-buckets"])
def test_async_list_outlives_the_callers_list(comm, bucket, monkeypatch):
    """A non-blocking list call holds its own list: changing the caller's list before wait() changes nothing."""
    monkeypatch.setattr(comm, "bucket_bytes", bucket)
    n = comm.size * 2
    calls = [
        (hpccoll.all_reduce, {}, lambda k: [make((n,), "float32", 30 + comm.rank + k), make((2, 3), "int64", 31 + k)]),
        (hpccoll.all_gather, {"sizes": [2] * comm.size}, lambda k: [make((2, 3), "float64", 32 + comm.rank + k)] * 3),
        (hpccoll.reduce_scatter, {}, lambda k: [make((n, 2), "float64", 33 + comm.rank + k) for _ in range(3)]),
    ]
    for fn, kw, build in calls:
        xs = build(0)
        want = fn(list(xs), comm, **kw)
        req = fn(xs, comm, async_op=True, **kw)
        xs[:] = build(1)[:1]  # the caller reuses its list while the call is in flight
        got = req.wait()
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert_same(a, b)


def test_bucket_bytes_from_environment(monkeypatch):
    monkeypatch.setenv("HPCCOLL_BUCKET_BYTES", "4096")
    with hpccoll.Communicator() as c:
        assert c.bucket_bytes == 4096
    monkeypatch.setenv("HPCCOLL_BUCKET_BYTES", "lots")
    with pytest.raises(hpccoll.ArgumentError, match="HPCCOLL_BUCKET_BYTES: expected a positive int"):
        hpccoll.Communicator()
