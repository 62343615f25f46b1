"""Cross-rank mismatches in check mode: every kind, every collective, the same error on every rank, fast.

The *last* rank is the odd one out (rank 1 at 2 ranks, rank 2 at 3), so the
messages naming ranks are exercised beyond rank 1. What the same calls do
without check mode is measured by ``benchmarks/mismatch.py`` (docs/reliability.md).
"""

import time

import numpy as np
import pytest

import hpccoll
from conftest import raises_everywhere
from hpccoll import ArgumentError, DTypeError, MismatchError, UnsupportedOpError

pytestmark = pytest.mark.mpi(min_size=2)

#: Seconds within which a mismatch must be reported (the calls are tiny; a hang is minutes).
PROMPT = 5.0


@pytest.fixture(scope="module")
def checked():
    c = hpccoll.Communicator(check=True)
    yield c
    c.free()


def _f(c, odd):
    return np.float32 if odd else np.float64


# Each case: (exception, message pattern, call(comm, odd)); ``odd`` is True on the last rank only.
CASES = {
    # dtype
    "dtype/all_gather": (MismatchError, "dtype", lambda c, o: hpccoll.all_gather(np.ones(2, _f(c, o)), c)),
    "dtype/all_gather/sizes": (MismatchError, "dtype",
                               lambda c, o: hpccoll.all_gather(np.ones(2, _f(c, o)), c, sizes=[2] * c.size)),
    "dtype/reduce_scatter": (MismatchError, "dtype", lambda c, o: hpccoll.reduce_scatter(np.ones(2 * c.size, _f(c, o)), c)),
    "dtype/all_reduce": (MismatchError, "dtype", lambda c, o: hpccoll.all_reduce(np.ones(3, _f(c, o)), c)),
    "dtype/all_gather_adjoint": (MismatchError, "dtype",
                                 lambda c, o: hpccoll.all_gather_adjoint(np.ones(2 * c.size, _f(c, o)), c)),
    "dtype/reduce_scatter_adjoint": (MismatchError, "dtype",
                                     lambda c, o: hpccoll.reduce_scatter_adjoint(np.ones(2, _f(c, o)), c)),
    "dtype/reduce_scatter_adjoint/avg-int": (DTypeError, r"op='avg'.*raised on rank",
                                             lambda c, o: hpccoll.reduce_scatter_adjoint(
                                                 np.ones(2, np.int32 if o else np.float64), c, op="avg")),
    "dtype/all_reduce_adjoint/replicated": (MismatchError, "replicated cotangent", lambda c, o: hpccoll.all_reduce_adjoint(
        np.ones(2, _f(c, o)), c, cotangent="replicated")),
    # shape (the extents that must agree)
    "shape/all_gather": (MismatchError, "shape", lambda c, o: hpccoll.all_gather(np.ones((2, 3 + o)), c)),
    "shape/all_gather/ndim": (MismatchError, "ndim", lambda c, o: hpccoll.all_gather(np.ones((2,) + (1,) * o), c)),
    "shape/reduce_scatter": (MismatchError, "shape", lambda c, o: hpccoll.reduce_scatter(np.ones(2 * c.size + o), c)),
    "shape/all_reduce": (MismatchError, "shape", lambda c, o: hpccoll.all_reduce(np.ones((2, 2 + o)), c)),
    "shape/all_reduce/0-D": (MismatchError, "shape", lambda c, o: hpccoll.all_reduce(np.ones((1,) * o), c)),
    "shape/all_gather_adjoint": (MismatchError, "shape",
                                 lambda c, o: hpccoll.all_gather_adjoint(np.ones((2 * c.size, 1 + o)), c)),
    "shape/reduce_scatter_adjoint": (MismatchError, "shape",
                                     lambda c, o: hpccoll.reduce_scatter_adjoint(np.ones((2, 1 + o)), c)),
    "shape/all_reduce_adjoint": (MismatchError, "shape", lambda c, o: hpccoll.all_reduce_adjoint(np.ones(2 + o), c)),
    # axis
    "axis/all_gather": (MismatchError, "axis", lambda c, o: hpccoll.all_gather(np.ones((2, 2)), c, axis=int(o))),
    "axis/all_gather/negative": (MismatchError, "axis", lambda c, o: hpccoll.all_gather(np.ones((2, 2)), c, axis=-2 + o)),
    "axis/reduce_scatter": (MismatchError, "axis",
                            lambda c, o: hpccoll.reduce_scatter(np.ones((c.size, c.size)), c, axis=int(o))),
    "axis/all_gather_adjoint": (MismatchError, "axis",
                                lambda c, o: hpccoll.all_gather_adjoint(np.ones((c.size, c.size)), c, axis=int(o))),
    "axis/reduce_scatter_adjoint": (MismatchError, "axis",
                                    lambda c, o: hpccoll.reduce_scatter_adjoint(np.ones((2, 2)), c, axis=int(o))),
    # op
    "op/reduce_scatter": (MismatchError, "op", lambda c, o: hpccoll.reduce_scatter(np.ones(c.size), c, op="avg" if o else "sum")),
    "op/all_reduce": (MismatchError, "op", lambda c, o: hpccoll.all_reduce(np.ones(2), c, op="max" if o else "sum")),
    "op/all_reduce/mpi-op": (MismatchError, "op", lambda c, o: hpccoll.all_reduce(np.ones(2), c, op=hpccoll_mpi_op(o))),
    "op/all_reduce_adjoint": (MismatchError, "op",
                              lambda c, o: hpccoll.all_reduce_adjoint(np.ones(2), c, op="avg" if o else "sum")),
    "op/all_reduce_adjoint/no-adjoint": (UnsupportedOpError, r"'max'.*raised on rank",
                                         lambda c, o: hpccoll.all_reduce_adjoint(np.ones(2), c, op="max" if o else "sum")),
    "op/reduce_scatter_adjoint/no-adjoint": (UnsupportedOpError, r"'prod'.*raised on rank", lambda c, o: hpccoll.reduce_scatter_adjoint(
        np.ones(2), c, op="prod" if o else "sum")),
    "op/reduce_scatter_adjoint/unknown": (ArgumentError, r"op: expected.*raised on rank",
                                          lambda c, o: hpccoll.reduce_scatter_adjoint(np.ones(2), c, op="mean" if o else "sum")),
    # sizes that lie about the real extents
    "sizes-lie/all_gather": (ArgumentError, r"sizes\[\d\] == x.shape.*raised on rank",
                             lambda c, o: hpccoll.all_gather(np.ones(2 + o), c, sizes=[2] * c.size)),
    "sizes-lie/reduce_scatter": (ArgumentError, r"summing to.*raised on rank",
                                 lambda c, o: hpccoll.reduce_scatter(np.ones(2 * c.size), c, sizes=[2] * (c.size - 1) + [2 + o])),
    "sizes-lie/all_gather_adjoint": (ArgumentError, r"summing to.*raised on rank",
                                     lambda c, o: hpccoll.all_gather_adjoint(np.ones(2 * c.size), c, sizes=[2] * (c.size - 1) + [2 + o])),
    "sizes-lie/reduce_scatter_adjoint": (ArgumentError, r"sizes\[\d\] == x.shape.*raised on rank",
                                         lambda c, o: hpccoll.reduce_scatter_adjoint(np.ones(2 + o), c, sizes=[2] * c.size)),
    "sizes-lie/count": (ArgumentError, r"sizes: expected \d+ non-negative ints.*raised on rank",
                        lambda c, o: hpccoll.all_gather(np.ones(2), c, sizes=[2] * (c.size + o))),
    # sizes that differ between ranks, each rank's own call consistent
    "sizes-differ/all_gather": (MismatchError, "sizes", lambda c, o: hpccoll.all_gather(
        np.ones(2), c, sizes=[2] * c.size if not o else [2] * (c.size - 2) + [3, 2])),
    "sizes-differ/reduce_scatter": (MismatchError, "sizes", lambda c, o: hpccoll.reduce_scatter(
        np.ones(2 * c.size), c, sizes=[2] * c.size if not o else [3, 1] + [2] * (c.size - 2))),
    "sizes-differ/all_gather_adjoint": (MismatchError, "sizes", lambda c, o: hpccoll.all_gather_adjoint(
        np.ones(2 * c.size), c, sizes=None if not o else [3, 1] + [2] * (c.size - 2))),
    # another collective altogether
    "collective/all_gather+reduce_scatter": (MismatchError, "collective", lambda c, o: (
        hpccoll.reduce_scatter if o else hpccoll.all_gather)(np.ones(2 * c.size), c)),
    "collective/all_gather-sizes+reduce_scatter": (MismatchError, "collective", lambda c, o: (
        hpccoll.reduce_scatter(np.ones(2 * c.size), c) if o else hpccoll.all_gather(np.ones(2 * c.size), c, sizes=[2 * c.size] * c.size))),
    "collective/all_reduce+reduce_scatter": (MismatchError, "collective", lambda c, o: (
        hpccoll.reduce_scatter if o else hpccoll.all_reduce)(np.ones(2 * c.size), c)),
    "collective/all_reduce+all_gather": (MismatchError, "collective", lambda c, o: (
        hpccoll.all_gather if o else hpccoll.all_reduce)(np.ones(2), c)),
    "collective/replicated+varying": (MismatchError, "collective|replicated", lambda c, o: hpccoll.all_reduce_adjoint(
        np.ones(2), c, cotangent="replicated" if o else "varying")),
    "collective/replicated+all_gather": (MismatchError, "collective|replicated", lambda c, o: (
        hpccoll.all_reduce_adjoint(np.ones(2), c, cotangent="replicated") if o else hpccoll.all_gather(np.ones(2), c))),
    # a local error on one rank only, before any communication
    "local/bad-axis": (ArgumentError, r"axis: expected.*raised on rank", lambda c, o: hpccoll.all_gather(np.ones(2), c, axis=3 * o)),
    "local/bad-cotangent": (ArgumentError, r"cotangent: expected.*raised on rank",
                            lambda c, o: hpccoll.all_reduce_adjoint(np.ones(2), c, cotangent="same" if o else "varying")),
    "local/ragged-list": (ArgumentError, r"x: expected an array.*raised on rank",
                          lambda c, o: hpccoll.all_reduce([[1.0], [2.0, 3.0]] if o else np.ones(2), c)),
    "local/unsupported-dtype": (hpccoll.DTypeError, r"x: expected a native.*raised on rank",
                                lambda c, o: hpccoll.reduce_scatter(np.ones(c.size, ">f8" if o else "<f8"), c)),
    "local/out-overlaps": (ArgumentError, r"overlaps.*raised on rank", lambda c, o: (
        lambda x: hpccoll.all_reduce(x, c, out=x[::-1] if o else None))(np.ones(3))),
}


def hpccoll_mpi_op(odd):
    from mpi4py import MPI

    return MPI.MIN if odd else "max"


@pytest.mark.parametrize("name", sorted(CASES))
def test_mismatch_raises_the_same_error_everywhere_promptly(checked, name):
    exc, match, call = CASES[name]
    odd = checked.rank == checked.size - 1
    start = time.monotonic()
    message = raises_everywhere(checked, exc, match, lambda: call(checked, odd))
    elapsed = checked.mpi.allreduce(time.monotonic() - start, op=_max())
    assert elapsed < PROMPT, f"{name}: took {elapsed:.1f} s"
    if exc is MismatchError:
        assert f"rank {checked.size - 1}" in message, message  # names the odd rank
    # the communicator stays usable after the error
    assert checked.mpi.allreduce(1) == checked.size


def _max():
    from mpi4py import MPI

    return MPI.MAX


def test_agreeing_adjoints_still_pass(checked):
    """The shared early errors do not cost agreeing calls anything but the one check."""
    y = np.arange(2.0 * checked.size)
    np.testing.assert_array_equal(hpccoll.all_gather_adjoint(y, checked), y[2 * checked.rank : 2 * checked.rank + 2] * checked.size)
    g = hpccoll.reduce_scatter_adjoint(np.ones(2), checked, op="avg")
    np.testing.assert_array_equal(g, np.full(2 * checked.size, 1.0 / checked.size))
    r = hpccoll.all_reduce_adjoint(np.ones(2), checked, op="avg", cotangent="replicated")
    np.testing.assert_array_equal(r, np.full(2, 1.0 / checked.size))
