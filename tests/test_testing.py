"""hpccoll.testing: the dot test's verdict and messages (real numbers for real data), the warning for an operator
whose adjoint is taken under another inner product, and the default tolerances."""

import re
import warnings

import numpy as np
import pytest
from conftest import agree, raises_everywhere
from test_nccl_standin import dev, fresh, gpu, runtime  # noqa: F401 - the CuPy stand-in's fixtures

import hpccoll
import hpccoll.testing
from hpccoll.testing import InnerProductWarning, default_rtol, dottest

pytestmark = pytest.mark.mpi

NUMBER = r"\(?[-+0-9.e]+(?:[-+][0-9.e]+j\))?"


class Doubled(hpccoll.Operator):
    """All-reduce (sum) with an adjoint twice too large: wrong at every rank count."""

    def __init__(self, comm):
        self.comm = comm
        self.inner = hpccoll.AllReduce(comm)

    def forward(self, x, out=None):
        return self.inner.forward(x)

    def adjoint(self, y, out=None):
        return 2 * self.inner.adjoint(y)


def global_data(comm, dtype, seed, n=6):
    """A (P, n) array, the same on every rank; row r is rank r's vector."""
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((comm.size, n))
    if np.dtype(dtype).kind == "c":
        data = data + 1j * rng.standard_normal((comm.size, n))
    return data.astype(dtype)


def sums_in(message):
    found = re.search(rf"sum <F x, y> = ({NUMBER}) but sum <x, F\^H y> = ({NUMBER}) ", message)
    assert found, message
    return found.group(1), found.group(2)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_failure_message_gives_real_sums_for_real_data(comm, dtype):
    X, Y = global_data(comm, dtype, 1), global_data(comm, dtype, 2)
    message = raises_everywhere(
        comm, AssertionError, "dot test failed", lambda: dottest(Doubled(comm), X[comm.rank], Y[comm.rank])
    )
    lhs, rhs = sums_in(message)

    def check():
        assert "j" not in lhs + rhs, message
        want = float(np.vdot(X.astype(np.float64).sum(0), Y.astype(np.float64).sum(0)))
        # the collective sums in the data's dtype, the reference in float64
        np.testing.assert_allclose([float(lhs), float(rhs)], [want, 2 * want], rtol=10 * default_rtol(dtype))
        assert re.search(r"relative difference 0\.5 > rtol=", message), message

    agree(comm, check)


def test_failure_message_gives_complex_sums_for_complex_data(comm):
    X, Y = global_data(comm, "complex128", 3), global_data(comm, "complex128", 4)
    message = raises_everywhere(
        comm, AssertionError, "dot test failed", lambda: dottest(Doubled(comm), X[comm.rank], Y[comm.rank])
    )
    lhs, rhs = sums_in(message)

    def check():
        want = complex(np.vdot(X.sum(0), Y.sum(0)))
        np.testing.assert_allclose([complex(lhs), complex(rhs)], [want, 2 * want], rtol=1e-12)

    agree(comm, check)


def test_wrong_adjoint_returns_false_without_raise_error(comm):
    X, Y = global_data(comm, "float64", 5), global_data(comm, "float64", 6)
    ok = dottest(Doubled(comm), X[comm.rank], Y[comm.rank], raise_error=False)
    agree(comm, ok is False, f"dottest returned {ok!r}")


@pytest.mark.parametrize("dtype", ["float64", "float32", "complex64", "int64"])
def test_right_adjoint_passes_without_warning(comm, dtype):
    X, Y = global_data(comm, dtype, 7), global_data(comm, dtype, 8)
    sizes = [1] * comm.size
    with warnings.catch_warnings():
        warnings.simplefilter("error", InnerProductWarning)
        ok = dottest(hpccoll.AllGather(comm, sizes=sizes), X[comm.rank][:1], Y[comm.rank][: comm.size])
        ok_h = dottest(hpccoll.AllReduce(comm, cotangent="varying").H, X[comm.rank], Y[comm.rank])
    agree(comm, ok is True and ok_h is True, f"dottest returned {ok!r}, {ok_h!r}")


@pytest.mark.parametrize("adjoint", [False, True], ids=["op", "op.H"])
def test_replicated_convention_warns(comm, adjoint):
    """AllReduce(cotangent="replicated") is the adjoint under another inner product: dottest says so, and its verdict
    is False at P > 1 (the factor P), True at P = 1, as before."""
    op = hpccoll.AllReduce(comm, cotangent="replicated")
    op = op.H if adjoint else op
    X, Y = global_data(comm, "float64", 9), global_data(comm, "float64", 10)
    with pytest.warns(InnerProductWarning, match=r"cotangent='replicated'.*counts the replicated result once") as seen:
        ok = dottest(op, X[comm.rank], Y[comm.rank], raise_error=False)
    agree(comm, ok == (comm.size == 1), f"dottest said {ok} at {comm.size} ranks")
    agree(comm, "use cotangent='varying'" in str(seen[0].message), str(seen[0].message))
    if comm.size > 1:
        with pytest.warns(InnerProductWarning):
            message = raises_everywhere(
                comm, AssertionError, "dot test failed", lambda: dottest(op, X[comm.rank], Y[comm.rank])
            )
        agree(comm, "counts the replicated result once" in message, message)


@pytest.mark.parametrize("rtol", [-1e-3, float("nan")])
def test_bad_rtol_raises_before_communicating(comm, rtol):
    raises_everywhere(
        comm,
        hpccoll.ArgumentError,
        r"rtol: expected a non-negative float; got",
        lambda: dottest(hpccoll.AllReduce(comm), np.ones(3), np.ones(3), rtol=rtol),
    )


def test_shapes_that_do_not_match_the_operator_raise(comm):
    raises_everywhere(
        comm,
        hpccoll.ArgumentError,
        r"x, y: expected shapes matching op .*; got x \(3,\) and y \(4,\)",
        lambda: dottest(hpccoll.AllReduce(comm), np.ones(3), np.ones(4)),
    )


def test_default_rtol():
    import ml_dtypes

    assert default_rtol("int32") == default_rtol(bool) == 0.0
    assert default_rtol("float16") == default_rtol(ml_dtypes.bfloat16) == 2e-2
    assert default_rtol("float32") == default_rtol("complex64") == 1e-5
    assert default_rtol("float64") == default_rtol("complex128") == 1e-12
    with pytest.raises(hpccoll.ArgumentError, match=r"dtype: expected a boolean, integer, floating or complex dtype"):
        default_rtol("U4")


def test_sums_go_through_hpccoll(comm, monkeypatch):
    """dottest sums the local inner products (and agrees on its verdict) with hpccoll.all_reduce, on the host."""
    seen = []
    real = hpccoll.testing.all_reduce

    def spy(x, c, **kw):
        seen.append((type(x), x.dtype.name, x.shape, kw.get("op", "sum")))
        return real(x, c, **kw)

    monkeypatch.setattr(hpccoll.testing, "all_reduce", spy)
    X, Y = global_data(comm, "complex64", 11), global_data(comm, "complex64", 12)
    ok = dottest(hpccoll.AllReduce(comm), X[comm.rank], Y[comm.rank])
    want = [(np.ndarray, "complex128", (2,), "sum"), (np.ndarray, "int8", (1,), "min")]
    agree(comm, ok is True and seen == want, f"dottest returned {ok!r} after the calls {seen}")


def test_cupy_operands(gpu):  # noqa: F811 - the fixture
    """CuPy operands (the stand-in, over NCCL's stand-in): the inner products are hosted, the verdict is the same
    on every rank, for a right adjoint and a wrong one, with shards that array_split would not give."""
    sizes = [2 + 3 * r for r in range(gpu.size)]
    X = global_data(gpu, "float64", 13, n=max(sizes))
    Y = global_data(gpu, "float64", 14, n=sum(sizes))
    x, y = dev(X[gpu.rank][: sizes[gpu.rank]]), dev(Y[gpu.rank])
    op = hpccoll.AllGather(gpu)
    ok = dottest(op, x, y)
    ok_h = dottest(op.H, y, x)  # op.H splits y as op's forward gathered x
    wrong = dottest(Doubled(gpu), dev(X[gpu.rank]), dev(Y[gpu.rank][: X.shape[1]]), raise_error=False)
    agree(gpu, (ok, ok_h, wrong) == (True, True, False), f"dottest returned {ok!r}, {ok_h!r}, {wrong!r}")
