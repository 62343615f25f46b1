"""Cross-rank mismatches in check mode: every kind, every collective, the same error on every rank, fast.

Every collective and adjoint (all-to-all included), as one array, as a list
of arrays and non-blocking (``async_op=True``: check mode's agreement happens
before the call returns, so the error comes from the call, never a Request).
The *last* rank is the odd one out (rank 1 at 2 ranks, rank 2 at 3), so the
messages naming ranks are exercised beyond rank 1.

Without check mode a mismatch is undefined behaviour of the MPI call, except
where a size exchange happens anyway (``all_gather`` with ``sizes=None``,
``all_to_all`` with ``recv_sizes=None``): there it raises on every rank, in
list and non-blocking forms too (tested here). What the other calls do
without check mode is measured by ``benchmarks/mismatch.py`` (docs/reliability.md).

Mismatches that leave one rank inside an MPI call whatever check mode does
run as jobs of their own (``mpiexec -n 2`` under the watchdog, from the serial
run), so that a failure ends that job instead of hanging the suite.
"""

import re
import time

import numpy as np
import pytest
from conftest import raises_everywhere
from mpi4py import MPI
from test_faults import LIMIT, launch, serial_only

import hpccoll
from hpccoll import ArgumentError, DTypeError, MismatchError, UnsupportedOpError

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
    "dtype/all_gather/sizes": (
        MismatchError,
        "dtype",
        lambda c, o: hpccoll.all_gather(np.ones(2, _f(c, o)), c, sizes=[2] * c.size),
    ),
    "dtype/reduce_scatter": (
        MismatchError,
        "dtype",
        lambda c, o: hpccoll.reduce_scatter(np.ones(2 * c.size, _f(c, o)), c),
    ),
    "dtype/all_reduce": (MismatchError, "dtype", lambda c, o: hpccoll.all_reduce(np.ones(3, _f(c, o)), c)),
    "dtype/all_gather_adjoint": (
        MismatchError,
        "dtype",
        lambda c, o: hpccoll.all_gather_adjoint(np.ones(2 * c.size, _f(c, o)), c),
    ),
    "dtype/reduce_scatter_adjoint": (
        MismatchError,
        "dtype",
        lambda c, o: hpccoll.reduce_scatter_adjoint(np.ones(2, _f(c, o)), c),
    ),
    "dtype/reduce_scatter_adjoint/avg-int": (
        DTypeError,
        r"op='avg'.*raised on rank",
        lambda c, o: hpccoll.reduce_scatter_adjoint(np.ones(2, np.int32 if o else np.float64), c, op="avg"),
    ),
    "dtype/all_reduce_adjoint/replicated": (
        MismatchError,
        "replicated cotangent",
        lambda c, o: hpccoll.all_reduce_adjoint(np.ones(2, _f(c, o)), c, cotangent="replicated"),
    ),
    # shape (the extents that must agree)
    "shape/all_gather": (MismatchError, "shape", lambda c, o: hpccoll.all_gather(np.ones((2, 3 + o)), c)),
    "shape/all_gather/ndim": (MismatchError, "ndim", lambda c, o: hpccoll.all_gather(np.ones((2,) + (1,) * o), c)),
    "shape/reduce_scatter": (MismatchError, "shape", lambda c, o: hpccoll.reduce_scatter(np.ones(2 * c.size + o), c)),
    "shape/all_reduce": (MismatchError, "shape", lambda c, o: hpccoll.all_reduce(np.ones((2, 2 + o)), c)),
    "shape/all_reduce/0-D": (MismatchError, "shape", lambda c, o: hpccoll.all_reduce(np.ones((1,) * o), c)),
    "shape/all_gather_adjoint": (
        MismatchError,
        "shape",
        lambda c, o: hpccoll.all_gather_adjoint(np.ones((2 * c.size, 1 + o)), c),
    ),
    "shape/reduce_scatter_adjoint": (
        MismatchError,
        "shape",
        lambda c, o: hpccoll.reduce_scatter_adjoint(np.ones((2, 1 + o)), c),
    ),
    "shape/all_reduce_adjoint": (MismatchError, "shape", lambda c, o: hpccoll.all_reduce_adjoint(np.ones(2 + o), c)),
    # axis
    "axis/all_gather": (MismatchError, "axis", lambda c, o: hpccoll.all_gather(np.ones((2, 2)), c, axis=int(o))),
    "axis/all_gather/negative": (
        MismatchError,
        "axis",
        lambda c, o: hpccoll.all_gather(np.ones((2, 2)), c, axis=-2 + o),
    ),
    "axis/reduce_scatter": (
        MismatchError,
        "axis",
        lambda c, o: hpccoll.reduce_scatter(np.ones((c.size, c.size)), c, axis=int(o)),
    ),
    "axis/all_gather_adjoint": (
        MismatchError,
        "axis",
        lambda c, o: hpccoll.all_gather_adjoint(np.ones((c.size, c.size)), c, axis=int(o)),
    ),
    "axis/reduce_scatter_adjoint": (
        MismatchError,
        "axis",
        lambda c, o: hpccoll.reduce_scatter_adjoint(np.ones((2, 2)), c, axis=int(o)),
    ),
    # op
    "op/reduce_scatter": (
        MismatchError,
        "op",
        lambda c, o: hpccoll.reduce_scatter(np.ones(c.size), c, op="avg" if o else "sum"),
    ),
    "op/all_reduce": (MismatchError, "op", lambda c, o: hpccoll.all_reduce(np.ones(2), c, op="max" if o else "sum")),
    "op/all_reduce/mpi-op": (MismatchError, "op", lambda c, o: hpccoll.all_reduce(np.ones(2), c, op=hpccoll_mpi_op(o))),
    "op/all_reduce_adjoint": (
        MismatchError,
        "op",
        lambda c, o: hpccoll.all_reduce_adjoint(np.ones(2), c, op="avg" if o else "sum"),
    ),
    "op/all_reduce_adjoint/no-adjoint": (
        UnsupportedOpError,
        r"'max'.*raised on rank",
        lambda c, o: hpccoll.all_reduce_adjoint(np.ones(2), c, op="max" if o else "sum"),
    ),
    "op/reduce_scatter_adjoint/no-adjoint": (
        UnsupportedOpError,
        r"'prod'.*raised on rank",
        lambda c, o: hpccoll.reduce_scatter_adjoint(np.ones(2), c, op="prod" if o else "sum"),
    ),
    "op/reduce_scatter_adjoint/unknown": (
        ArgumentError,
        r"op: expected.*raised on rank",
        lambda c, o: hpccoll.reduce_scatter_adjoint(np.ones(2), c, op="mean" if o else "sum"),
    ),
    # sizes that lie about the real extents
    "sizes-lie/all_gather": (
        ArgumentError,
        r"sizes\[\d\] == x.shape.*raised on rank",
        lambda c, o: hpccoll.all_gather(np.ones(2 + o), c, sizes=[2] * c.size),
    ),
    "sizes-lie/reduce_scatter": (
        ArgumentError,
        r"summing to.*raised on rank",
        lambda c, o: hpccoll.reduce_scatter(np.ones(2 * c.size), c, sizes=[2] * (c.size - 1) + [2 + o]),
    ),
    "sizes-lie/all_gather_adjoint": (
        ArgumentError,
        r"summing to.*raised on rank",
        lambda c, o: hpccoll.all_gather_adjoint(np.ones(2 * c.size), c, sizes=[2] * (c.size - 1) + [2 + o]),
    ),
    "sizes-lie/reduce_scatter_adjoint": (
        ArgumentError,
        r"sizes\[\d\] == x.shape.*raised on rank",
        lambda c, o: hpccoll.reduce_scatter_adjoint(np.ones(2 + o), c, sizes=[2] * c.size),
    ),
    "sizes-lie/count": (
        ArgumentError,
        r"sizes: expected \d+ non-negative ints.*raised on rank",
        lambda c, o: hpccoll.all_gather(np.ones(2), c, sizes=[2] * (c.size + o)),
    ),
    # sizes that differ between ranks, each rank's own call consistent
    "sizes-differ/all_gather": (
        MismatchError,
        "sizes",
        lambda c, o: hpccoll.all_gather(np.ones(2), c, sizes=[2] * c.size if not o else [2] * (c.size - 2) + [3, 2]),
    ),
    "sizes-differ/reduce_scatter": (
        MismatchError,
        "sizes",
        lambda c, o: hpccoll.reduce_scatter(
            np.ones(2 * c.size), c, sizes=[2] * c.size if not o else [3, 1] + [2] * (c.size - 2)
        ),
    ),
    "sizes-differ/all_gather_adjoint": (
        MismatchError,
        "sizes",
        lambda c, o: hpccoll.all_gather_adjoint(
            np.ones(2 * c.size), c, sizes=None if not o else [3, 1] + [2] * (c.size - 2)
        ),
    ),
    # another collective altogether
    "collective/all_gather+reduce_scatter": (
        MismatchError,
        "collective",
        lambda c, o: (hpccoll.reduce_scatter if o else hpccoll.all_gather)(np.ones(2 * c.size), c),
    ),
    "collective/all_gather-sizes+reduce_scatter": (
        MismatchError,
        "collective",
        lambda c, o: (
            hpccoll.reduce_scatter(np.ones(2 * c.size), c)
            if o
            else hpccoll.all_gather(np.ones(2 * c.size), c, sizes=[2 * c.size] * c.size)
        ),
    ),
    "collective/all_reduce+reduce_scatter": (
        MismatchError,
        "collective",
        lambda c, o: (hpccoll.reduce_scatter if o else hpccoll.all_reduce)(np.ones(2 * c.size), c),
    ),
    "collective/all_reduce+all_gather": (
        MismatchError,
        "collective",
        lambda c, o: (hpccoll.all_gather if o else hpccoll.all_reduce)(np.ones(2), c),
    ),
    "collective/replicated+varying": (
        MismatchError,
        "collective|replicated",
        lambda c, o: hpccoll.all_reduce_adjoint(np.ones(2), c, cotangent="replicated" if o else "varying"),
    ),
    "collective/replicated+all_gather": (
        MismatchError,
        "collective|replicated",
        lambda c, o: (
            hpccoll.all_reduce_adjoint(np.ones(2), c, cotangent="replicated")
            if o
            else hpccoll.all_gather(np.ones(2), c)
        ),
    ),
    # a local error on one rank only, before any communication
    "local/bad-axis": (
        ArgumentError,
        r"axis: expected.*raised on rank",
        lambda c, o: hpccoll.all_gather(np.ones(2), c, axis=3 * o),
    ),
    "local/bad-cotangent": (
        ArgumentError,
        r"cotangent: expected.*raised on rank",
        lambda c, o: hpccoll.all_reduce_adjoint(np.ones(2), c, cotangent="same" if o else "varying"),
    ),
    "local/ragged-list": (
        ArgumentError,
        r"x: expected an array.*raised on rank",
        lambda c, o: hpccoll.all_reduce([[1.0], [2.0, 3.0]] if o else np.ones(2), c),
    ),
    "local/unsupported-dtype": (
        hpccoll.DTypeError,
        r"x: expected a native.*raised on rank",
        lambda c, o: hpccoll.reduce_scatter(np.ones(c.size, ">f8" if o else "<f8"), c),
    ),
    "local/out-overlaps": (
        ArgumentError,
        r"overlaps.*raised on rank",
        lambda c, o: (lambda x: hpccoll.all_reduce(x, c, out=x[::-1] if o else None))(np.ones(3)),
    ),
}


def _sizes_differ(c, o, n=2):
    """``[n] * P`` on every rank but the last, which moves one element from block 1 to block 0 (same total)."""
    return [n] * c.size if not o else [n + 1, n - 1] + [n] * (c.size - 2)


def _recv_lie(c, o):
    """Equal axes, two elements to every rank: the last rank claims three from rank 0 (its own entry stays right)."""
    return [2 + (r == 0 and o) for r in range(c.size)]


# all_to_all and its adjoint, one array, blocking
CASES.update(
    {
        "dtype/all_to_all": (
            MismatchError,
            "'dtype': 'float32'",
            lambda c, o: hpccoll.all_to_all(np.ones(2 * c.size, _f(c, o)), c),
        ),
        "dtype/all_to_all/recv_sizes": (
            MismatchError,
            "'dtype': 'float32'",
            lambda c, o: hpccoll.all_to_all(np.ones(2 * c.size, _f(c, o)), c, recv_sizes=[2] * c.size),
        ),
        "dtype/all_to_all_adjoint": (
            MismatchError,
            "'dtype': 'float32'",
            lambda c, o: hpccoll.all_to_all_adjoint(np.ones(2 * c.size, _f(c, o)), c),
        ),
        "shape/all_to_all": (
            MismatchError,
            "shape except concat_axis",
            lambda c, o: hpccoll.all_to_all(np.ones((2 * c.size, 3 + o)), c),
        ),
        "shape/all_to_all/ndim": (
            MismatchError,
            "'ndim': 2",
            lambda c, o: hpccoll.all_to_all(np.ones((2 * c.size,) + (1,) * o), c),
        ),
        "shape/all_to_all/transpose": (
            MismatchError,
            "shape except concat_axis",
            lambda c, o: hpccoll.all_to_all(np.ones((2, 2 * c.size + o)), c, split_axis=1, concat_axis=0),
        ),
        "shape/all_to_all_adjoint": (
            MismatchError,
            "shape except concat_axis",
            lambda c, o: hpccoll.all_to_all_adjoint(np.ones((2 * c.size, 1 + o)), c),
        ),
        "axis/all_to_all/split_axis": (
            MismatchError,
            "'split_axis': 1",
            lambda c, o: hpccoll.all_to_all(np.ones((2 * c.size, 2 * c.size)), c, split_axis=int(o)),
        ),
        "axis/all_to_all/concat_axis": (
            MismatchError,
            "'concat_axis': 1",
            lambda c, o: hpccoll.all_to_all(np.ones((2 * c.size, 2 * c.size)), c, concat_axis=int(o)),
        ),
        "axis/all_to_all_adjoint": (
            MismatchError,
            "'split_axis': 1",
            lambda c, o: hpccoll.all_to_all_adjoint(np.ones((2 * c.size, 2 * c.size)), c, concat_axis=int(o)),
        ),
        "sizes-lie/all_to_all": (
            ArgumentError,
            r"sizes: expected ints summing to x.shape\[0\].*raised on rank",
            lambda c, o: hpccoll.all_to_all(np.ones(2 * c.size + o), c, sizes=[2] * c.size),
        ),
        "sizes-lie/all_to_all/recv_sizes": (
            MismatchError,
            r"has recv_sizes=\[3, 2",
            lambda c, o: hpccoll.all_to_all(np.ones(2 * c.size), c, recv_sizes=_recv_lie(c, o)),
        ),
        "sizes-lie/all_to_all_adjoint": (
            MismatchError,
            r"has recv_sizes=\[3, 2",
            lambda c, o: hpccoll.all_to_all_adjoint(np.ones(2 * c.size), c, sizes=_recv_lie(c, o)),
        ),
        "sizes-lie/all_to_all/own-entry": (
            ArgumentError,
            r"recv_sizes: expected recv_sizes\[\d\] == sizes.*raised on rank",
            lambda c, o: hpccoll.all_to_all(np.ones(2 * c.size), c, recv_sizes=[2 + o] * c.size),
        ),
        "sizes-differ/all_to_all": (
            MismatchError,
            r"'sizes': \(3, 1",
            lambda c, o: hpccoll.all_to_all(  # axes differ: one split
                np.ones((2 * c.size, 2)), c, split_axis=0, concat_axis=1, sizes=_sizes_differ(c, o)
            ),
        ),
        "collective/all_to_all+all_gather": (
            MismatchError,
            "collective",
            lambda c, o: (hpccoll.all_gather if o else hpccoll.all_to_all)(np.ones(2 * c.size), c),
        ),
        "collective/all_to_all+reduce_scatter": (
            MismatchError,
            "collective",
            lambda c, o: (hpccoll.reduce_scatter if o else hpccoll.all_to_all)(np.ones(2 * c.size), c),
        ),
        "collective/all_to_all-recv_sizes+all_reduce": (
            MismatchError,
            "collective",
            lambda c, o: (
                hpccoll.all_reduce(np.ones(2 * c.size), c)
                if o
                else hpccoll.all_to_all(np.ones(2 * c.size), c, recv_sizes=[2] * c.size)
            ),
        ),
        "local/all_to_all/bad-axis": (
            ArgumentError,
            r"split_axis: expected.*raised on rank",
            lambda c, o: hpccoll.all_to_all(np.ones(2 * c.size), c, split_axis=3 * o),
        ),
        "local/all_to_all/out-overlaps": (
            ArgumentError,
            r"out: expected memory separate.*raised on rank",
            lambda c, o: (lambda x: hpccoll.all_to_all(x, c, out=x if o else None))(np.ones(2 * c.size)),
        ),
        "local/all_to_all/out-shape": (
            ArgumentError,
            r"out: expected shape.*raised on rank",
            lambda c, o: hpccoll.all_to_all(np.ones((2 * c.size, 2)), c, out=np.empty((2 * c.size, 2 + o))),
        ),
    }
)


def _two(c, o, dtype=None, extra=0, n=2):
    """Two arrays of ``n`` elements; the last rank's second one in ``dtype`` and ``extra`` longer."""
    return [np.ones(n), np.ones(n + extra * o, dtype if o and dtype else np.float64)]


# list forms (a list of arrays; the list as a whole is compared)
CASES.update(
    {
        "list/dtype/all_gather": (
            MismatchError,
            r"arrays=.*'float32'",
            lambda c, o: hpccoll.all_gather(_two(c, o, np.float32), c),
        ),
        "list/dtype/all_gather/sizes": (
            MismatchError,
            r"arrays=.*'float32'",
            lambda c, o: hpccoll.all_gather(_two(c, o, np.float32), c, sizes=[2] * c.size),
        ),
        "list/dtype/reduce_scatter": (
            MismatchError,
            r"arrays=.*'float32'",
            lambda c, o: hpccoll.reduce_scatter(_two(c, o, np.float32, n=2 * c.size), c),
        ),
        "list/dtype/all_reduce": (
            MismatchError,
            r"arrays=.*'float32'",
            lambda c, o: hpccoll.all_reduce(_two(c, o, np.float32), c),
        ),
        "list/dtype/all_to_all": (
            MismatchError,
            r"arrays=.*'float32'",
            lambda c, o: hpccoll.all_to_all(_two(c, o, np.float32, n=2 * c.size), c),
        ),
        "list/dtype/all_gather_adjoint": (
            MismatchError,
            r"arrays=.*'float32'",
            lambda c, o: hpccoll.all_gather_adjoint(_two(c, o, np.float32, n=2 * c.size), c),
        ),
        "list/dtype/reduce_scatter_adjoint": (
            MismatchError,
            r"arrays=.*'float32'",
            lambda c, o: hpccoll.reduce_scatter_adjoint(_two(c, o, np.float32), c),
        ),
        "list/dtype/all_reduce_adjoint": (
            MismatchError,
            r"arrays=.*'float32'",
            lambda c, o: hpccoll.all_reduce_adjoint(_two(c, o, np.float32), c),
        ),
        "list/dtype/all_to_all_adjoint": (
            MismatchError,
            r"arrays=.*'float32'",
            lambda c, o: hpccoll.all_to_all_adjoint(_two(c, o, np.float32, n=2 * c.size), c),
        ),
        "list/shape/all_gather": (
            MismatchError,
            r"arrays=.*\(2,\)\)\]$",
            lambda c, o: hpccoll.all_gather([np.ones((2, 1)), np.ones((2, 1 + o))], c),
        ),
        "list/shape/reduce_scatter": (
            MismatchError,
            r"arrays=.*\(\d+,\), 0\)\]$",
            lambda c, o: hpccoll.reduce_scatter(_two(c, o, extra=1, n=2 * c.size), c),
        ),
        "list/shape/all_reduce": (
            MismatchError,
            r"arrays=.*\(3,\)\)\]$",
            lambda c, o: hpccoll.all_reduce(_two(c, o, extra=1), c),
        ),
        "list/shape/all_to_all": (
            MismatchError,
            r"'shape except concat_axis': \(2,\)",
            lambda c, o: hpccoll.all_to_all([np.ones(c.size), np.ones((c.size, 1 + o))], c),
        ),
        "list/length/all_gather": (
            MismatchError,
            "arrays=",
            lambda c, o: hpccoll.all_gather([np.ones(2)] * (2 + o), c),
        ),
        "list/length/all_gather/sizes": (
            MismatchError,
            "arrays=",
            lambda c, o: hpccoll.all_gather([np.ones(2)] * (2 + o), c, sizes=[2] * c.size),
        ),
        "list/length/reduce_scatter": (
            MismatchError,
            "arrays=",
            lambda c, o: hpccoll.reduce_scatter([np.ones(2 * c.size)] * (2 + o), c),
        ),
        "list/length/all_reduce": (
            MismatchError,
            "arrays=",
            lambda c, o: hpccoll.all_reduce([np.ones(2)] * (2 + o), c),
        ),
        "list/length/all_reduce/empty": (
            MismatchError,
            r"arrays=\[\]",
            lambda c, o: hpccoll.all_reduce([np.ones(2)] * o, c),
        ),
        "list/length/all_to_all": (
            MismatchError,
            "arrays=",
            lambda c, o: hpccoll.all_to_all([np.ones(2 * c.size)] * (2 + o), c),
        ),
        "list/length/all_gather_adjoint": (
            MismatchError,
            "arrays=",
            lambda c, o: hpccoll.all_gather_adjoint([np.ones(2 * c.size)] * (1 + o), c),
        ),
        "list/sizes-differ/all_gather": (
            MismatchError,
            r"sizes=\(2, .*3, 2\)",
            lambda c, o: hpccoll.all_gather(
                [np.ones(2), np.ones((2, 3))], c, sizes=[2] * c.size if not o else [2] * (c.size - 2) + [3, 2]
            ),
        ),
        "list/sizes-differ/reduce_scatter": (
            MismatchError,
            r"sizes=\[3, 1",
            lambda c, o: hpccoll.reduce_scatter(
                [np.ones(2 * c.size), np.ones((2 * c.size, 2))], c, sizes=_sizes_differ(c, o)
            ),
        ),
        "list/sizes-differ/all_to_all": (
            MismatchError,
            r"'sizes': \(3, 1",
            lambda c, o: hpccoll.all_to_all(
                [np.ones((2 * c.size, 2)), np.ones((2 * c.size, 1))],
                c,
                split_axis=0,
                concat_axis=1,
                sizes=_sizes_differ(c, o),
            ),
        ),
        "list/sizes-lie/all_gather": (
            ArgumentError,
            r"sizes: expected sizes\[\d\] == x\[1\].shape\[0\].*raised on rank",
            lambda c, o: hpccoll.all_gather(_two(c, o, extra=1), c, sizes=[2] * c.size),
        ),
        "list/sizes-lie/all_to_all/recv_sizes": (
            MismatchError,
            r"has recv_sizes=\[3, 2",
            lambda c, o: hpccoll.all_to_all(
                [np.ones(2 * c.size), np.ones((2 * c.size, 2))], c, recv_sizes=_recv_lie(c, o)
            ),
        ),
        "list/op/reduce_scatter": (
            MismatchError,
            "op='avg'",
            lambda c, o: hpccoll.reduce_scatter(_two(c, o, n=2 * c.size), c, op="avg" if o else "sum"),
        ),
        "list/op/all_reduce": (
            MismatchError,
            "op='max'",
            lambda c, o: hpccoll.all_reduce(_two(c, o), c, op="max" if o else "sum"),
        ),
        "list/op/all_reduce_adjoint": (
            MismatchError,
            "op='avg'",
            lambda c, o: hpccoll.all_reduce_adjoint(_two(c, o), c, op="avg" if o else "sum"),
        ),
        "list/axis/all_gather": (
            MismatchError,
            r"arrays=.*\('float64', 1, \(2,\)\)\]$",
            lambda c, o: hpccoll.all_gather([np.ones((2, 2))], c, axis=int(o)),
        ),
        "list/axis/reduce_scatter": (
            MismatchError,
            r"arrays=.*, 1\)\]$",
            lambda c, o: hpccoll.reduce_scatter([np.ones((c.size, c.size))], c, axis=int(o)),
        ),
        "list/axis/all_to_all": (
            MismatchError,
            "'split_axis': 1",
            lambda c, o: hpccoll.all_to_all([np.ones((c.size, c.size))], c, split_axis=int(o)),
        ),
        "list/collective/all_reduce+all_gather": (
            MismatchError,
            "collective",
            lambda c, o: (hpccoll.all_gather if o else hpccoll.all_reduce)(_two(c, o), c),
        ),
        "list/collective/all_to_all+reduce_scatter": (
            MismatchError,
            "collective",
            lambda c, o: (hpccoll.reduce_scatter if o else hpccoll.all_to_all)(_two(c, o, n=2 * c.size), c),
        ),
        "list/replicated-varies": (
            MismatchError,
            "replicated cotangent",
            lambda c, o: hpccoll.all_reduce_adjoint([np.ones(2), np.full(2, float(o))], c, cotangent="replicated"),
        ),
        "list/local/unsupported-dtype": (
            DTypeError,
            r"x\[1\]: expected a native.*raised on rank",
            lambda c, o: hpccoll.all_reduce([np.ones(2), np.array(["a"]) if o else np.ones(2)], c),
        ),
        "list/local/out-count": (
            ArgumentError,
            r"out: expected None or a list of 2.*raised on rank",
            lambda c, o: hpccoll.all_reduce(_two(c, o), c, out=[np.empty(2)] if o else None),
        ),
        "list/local/all_to_all/out-shape": (
            ArgumentError,
            r"out: expected shape.*raised on rank",
            lambda c, o: hpccoll.all_to_all(
                _two(c, o, n=2 * c.size), c, out=[np.empty(2), np.empty(2 + o)], recv_sizes=[2] * c.size
            ),
        ),
    }
)

# non-blocking forms: the error comes from the call itself, on every rank (the agreement happens before it returns)
CASES.update(
    {
        "async/dtype/all_gather": (
            MismatchError,
            "dtype",
            lambda c, o: hpccoll.all_gather(np.ones(2, _f(c, o)), c, sizes=[2] * c.size, async_op=True),
        ),
        "async/dtype/reduce_scatter": (
            MismatchError,
            "dtype",
            lambda c, o: hpccoll.reduce_scatter(np.ones(2 * c.size, _f(c, o)), c, async_op=True),
        ),
        "async/dtype/all_reduce": (
            MismatchError,
            "dtype",
            lambda c, o: hpccoll.all_reduce(np.ones(3, _f(c, o)), c, async_op=True),
        ),
        "async/dtype/all_to_all": (
            MismatchError,
            "'dtype': 'float32'",
            lambda c, o: hpccoll.all_to_all(np.ones(2 * c.size, _f(c, o)), c, recv_sizes=[2] * c.size, async_op=True),
        ),
        "async/dtype/all_gather_adjoint": (
            MismatchError,
            "dtype",
            lambda c, o: hpccoll.all_gather_adjoint(np.ones(2 * c.size, _f(c, o)), c, async_op=True),
        ),
        "async/dtype/all_to_all_adjoint": (
            MismatchError,
            "'dtype': 'float32'",
            lambda c, o: hpccoll.all_to_all_adjoint(
                np.ones(2 * c.size, _f(c, o)), c, sizes=[2] * c.size, recv_sizes=[2] * c.size, async_op=True
            ),
        ),
        "async/shape/all_gather": (
            MismatchError,
            "shape",
            lambda c, o: hpccoll.all_gather(np.ones((2, 3 + o)), c, sizes=[2] * c.size, async_op=True),
        ),
        "async/shape/reduce_scatter": (
            MismatchError,
            "shape",
            lambda c, o: hpccoll.reduce_scatter(np.ones(2 * c.size + o), c, async_op=True),
        ),
        "async/shape/all_reduce": (
            MismatchError,
            "shape",
            lambda c, o: hpccoll.all_reduce(np.ones((2, 2 + o)), c, async_op=True),
        ),
        "async/shape/all_to_all": (
            MismatchError,
            "shape except concat_axis",
            lambda c, o: hpccoll.all_to_all(np.ones((2 * c.size, 3 + o)), c, recv_sizes=[2] * c.size, async_op=True),
        ),
        "async/op/reduce_scatter": (
            MismatchError,
            "op",
            lambda c, o: hpccoll.reduce_scatter(np.ones(c.size), c, op="avg" if o else "sum", async_op=True),
        ),
        "async/op/all_reduce": (
            MismatchError,
            "op",
            lambda c, o: hpccoll.all_reduce(np.ones(2), c, op="max" if o else "sum", async_op=True),
        ),
        "async/op/all_reduce_adjoint": (
            MismatchError,
            "op",
            lambda c, o: hpccoll.all_reduce_adjoint(np.ones(2), c, op="avg" if o else "sum", async_op=True),
        ),
        "async/axis/all_to_all": (
            MismatchError,
            "'concat_axis': 1",
            lambda c, o: hpccoll.all_to_all(np.ones((2 * c.size, 2 * c.size)), c, concat_axis=int(o), async_op=True),
        ),
        "async/sizes-differ/all_gather": (
            MismatchError,
            "sizes",
            lambda c, o: hpccoll.all_gather(
                np.ones(2), c, sizes=[2] * c.size if not o else [2] * (c.size - 2) + [3, 2], async_op=True
            ),
        ),
        "async/sizes-differ/reduce_scatter": (
            MismatchError,
            "sizes",
            lambda c, o: hpccoll.reduce_scatter(np.ones(2 * c.size), c, sizes=_sizes_differ(c, o), async_op=True),
        ),
        "async/sizes-differ/all_to_all": (
            MismatchError,
            r"'sizes': \(3, 1",
            lambda c, o: hpccoll.all_to_all(
                np.ones((2 * c.size, 2)),
                c,
                split_axis=0,
                concat_axis=1,
                sizes=_sizes_differ(c, o),
                recv_sizes=[2] * c.size,
                async_op=True,
            ),
        ),
        "async/sizes-lie/all_gather": (
            ArgumentError,
            r"sizes\[\d\] == x.shape.*raised on rank",
            lambda c, o: hpccoll.all_gather(np.ones(2 + o), c, sizes=[2] * c.size, async_op=True),
        ),
        "async/sizes-lie/all_to_all/recv_sizes": (
            MismatchError,
            r"has recv_sizes=\[3, 2",
            lambda c, o: hpccoll.all_to_all(np.ones(2 * c.size), c, recv_sizes=_recv_lie(c, o), async_op=True),
        ),
        "async/collective/all_reduce+reduce_scatter": (
            MismatchError,
            "collective",
            lambda c, o: (hpccoll.reduce_scatter if o else hpccoll.all_reduce)(np.ones(2 * c.size), c, async_op=True),
        ),
        "async/collective/all_to_all+all_gather": (
            MismatchError,
            "collective",
            lambda c, o: (hpccoll.all_gather if o else hpccoll.all_to_all)(np.ones(2 * c.size), c, async_op=True),
        ),
        "async/replicated-varies": (
            MismatchError,
            "replicated cotangent",
            lambda c, o: hpccoll.all_reduce_adjoint(np.full(2, float(o)), c, cotangent="replicated", async_op=True),
        ),
        "async/local/out-shape": (
            ArgumentError,
            r"out: expected shape.*raised on rank",
            lambda c, o: hpccoll.all_reduce(np.ones(4), c, out=np.empty(4 + o), async_op=True),
        ),
        "async/local/bad-op": (
            ArgumentError,
            r"op: expected.*raised on rank",
            lambda c, o: hpccoll.reduce_scatter(np.ones(c.size), c, op="mean" if o else "sum", async_op=True),
        ),
        "async/list/dtype/all_gather": (
            MismatchError,
            r"arrays=.*'float32'",
            lambda c, o: hpccoll.all_gather(_two(c, o, np.float32), c, async_op=True),
        ),
        "async/list/length/all_reduce": (
            MismatchError,
            "arrays=",
            lambda c, o: hpccoll.all_reduce([np.ones(2)] * (2 + o), c, async_op=True),
        ),
        "async/list/length/all_to_all": (
            MismatchError,
            "arrays=",
            lambda c, o: hpccoll.all_to_all([np.ones(2 * c.size)] * (2 + o), c, async_op=True),
        ),
        "async/list/shape/reduce_scatter": (
            MismatchError,
            "arrays=",
            lambda c, o: hpccoll.reduce_scatter(_two(c, o, extra=1, n=2 * c.size), c, async_op=True),
        ),
        "async/list/sizes-differ/reduce_scatter": (
            MismatchError,
            r"sizes=\[3, 1",
            lambda c, o: hpccoll.reduce_scatter(_two(c, o, n=2 * c.size), c, sizes=_sizes_differ(c, o), async_op=True),
        ),
        "async/list/op/all_reduce": (
            MismatchError,
            "op='max'",
            lambda c, o: hpccoll.all_reduce(_two(c, o), c, op="max" if o else "sum", async_op=True),
        ),
    }
)


def hpccoll_mpi_op(odd):
    from mpi4py import MPI

    return MPI.MIN if odd else "max"


@pytest.mark.mpi(min_size=2)
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


@pytest.mark.mpi(min_size=2)
def test_agreeing_adjoints_still_pass(checked):
    """The shared early errors do not cost agreeing calls anything but the one check."""
    y = np.arange(2.0 * checked.size)
    np.testing.assert_array_equal(
        hpccoll.all_gather_adjoint(y, checked), y[2 * checked.rank : 2 * checked.rank + 2] * checked.size
    )
    g = hpccoll.reduce_scatter_adjoint(np.ones(2), checked, op="avg")
    np.testing.assert_array_equal(g, np.full(2 * checked.size, 1.0 / checked.size))
    r = hpccoll.all_reduce_adjoint(np.ones(2), checked, op="avg", cotangent="replicated")
    np.testing.assert_array_equal(r, np.full(2, 1.0 / checked.size))


@pytest.mark.mpi(min_size=2)
def test_agreeing_lists_and_async_calls_still_pass(checked):
    """The same list and non-blocking calls, made alike on every rank, give NumPy's answers in check mode."""
    P, me = checked.size, checked.rank
    every = [np.arange(2.0 * P) + 10 * r for r in range(P)]
    total = np.sum(every, axis=0)
    lists = [
        (hpccoll.all_reduce([every[me], every[me][:3]], checked), [total, total[:3]]),
        (hpccoll.all_gather([every[me][:2]], checked), [np.concatenate([e[:2] for e in every])]),
        (hpccoll.reduce_scatter([every[me]], checked, sizes=[2] * P), [total[2 * me : 2 * me + 2]]),
        (
            hpccoll.all_to_all([every[me], -every[me]], checked),
            [
                np.concatenate([e[2 * me : 2 * me + 2] for e in every]),
                -np.concatenate([e[2 * me : 2 * me + 2] for e in every]),
            ],
        ),
        (hpccoll.all_reduce_adjoint([every[0]], checked, cotangent="replicated"), [every[0]]),
    ]
    singles = [
        (hpccoll.all_reduce(every[me], checked, async_op=True).wait(), total),
        (
            hpccoll.all_gather(every[me][:2], checked, sizes=[2] * P, async_op=True).wait(),
            np.concatenate([e[:2] for e in every]),
        ),
        (
            hpccoll.all_to_all(every[me], checked, recv_sizes=[2] * P, async_op=True).wait(),
            np.concatenate([e[2 * me : 2 * me + 2] for e in every]),
        ),
        (
            hpccoll.all_to_all_adjoint(every[me], checked, async_op=True).wait(),
            np.concatenate([e[2 * me : 2 * me + 2] for e in every]),
        ),
    ]
    ok = all(len(g) == len(w) and all(np.array_equal(a, b) for a, b in zip(g, w)) for g, w in lists)
    ok = ok and all(np.array_equal(g, w) for g, w in singles)
    assert checked.mpi.allreduce(ok, op=MPI.LAND)


# --------------------------------------------------------------------------- without check mode
#
# Where a size exchange happens anyway (all_gather with sizes=None, all_to_all with
# recv_sizes=None, and their adjoints' counterparts), it compares a signature of what must match:
# every rank raises MismatchError naming ranks 0 and the odd one, list and non-blocking forms too.
# all_gather's message also says what this rank has (so it differs by rank in that part only).

FREE = {
    "all_gather/list/dtype": lambda c, o: hpccoll.all_gather(_two(c, o, np.float32), c),
    "all_gather/list/shape": lambda c, o: hpccoll.all_gather([np.ones(2), np.ones((2, 1 + o))], c),
    "all_gather/list/axis": lambda c, o: hpccoll.all_gather([np.ones((2, 2))], c, axis=int(o)),
    "all_gather/async/dtype": lambda c, o: hpccoll.all_gather(np.ones(2, _f(c, o)), c, async_op=True),
    "all_gather/async/shape": lambda c, o: hpccoll.all_gather(np.ones((2, 2 + o)), c, async_op=True),
    "all_gather/async/list/dtype": lambda c, o: hpccoll.all_gather(_two(c, o, np.float32), c, async_op=True),
    "reduce_scatter_adjoint/async/dtype": lambda c, o: hpccoll.reduce_scatter_adjoint(
        np.ones(2, _f(c, o)), c, async_op=True
    ),
    "all_to_all/dtype": lambda c, o: hpccoll.all_to_all(np.ones(2 * c.size, _f(c, o)), c),
    "all_to_all/shape": lambda c, o: hpccoll.all_to_all(np.ones((2 * c.size, 3 + o)), c),
    "all_to_all/axes": lambda c, o: hpccoll.all_to_all(np.ones((2 * c.size, 2 * c.size)), c, split_axis=int(o)),
    "all_to_all/split": lambda c, o: hpccoll.all_to_all(
        np.ones((2 * c.size, 2)), c, split_axis=0, concat_axis=1, sizes=_sizes_differ(c, o)
    ),
    "all_to_all_adjoint/dtype": lambda c, o: hpccoll.all_to_all_adjoint(np.ones(2 * c.size, _f(c, o)), c),
    "all_to_all/list/dtype": lambda c, o: hpccoll.all_to_all(_two(c, o, np.float32, n=2 * c.size), c),
    "all_to_all/list/shape": lambda c, o: hpccoll.all_to_all([np.ones(c.size), np.ones((c.size, 1 + o))], c),
    "all_to_all/async/shape": lambda c, o: hpccoll.all_to_all(np.ones((2 * c.size, 3 + o)), c, async_op=True),
    "all_to_all/async/axes": lambda c, o: hpccoll.all_to_all(
        np.ones((2 * c.size, 2 * c.size)), c, concat_axis=int(o), async_op=True
    ),
    "all_to_all/async/list/dtype": lambda c, o: hpccoll.all_to_all(
        _two(c, o, np.float32, n=2 * c.size), c, async_op=True
    ),
}


def _without_this_rank(message):
    """The message less all_gather's per-rank part, ``(this rank has ...)``."""
    return re.sub(r" \(this rank has .*?\);", ";", message)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name", sorted(FREE))
def test_without_check_mode_the_size_exchange_still_reports(comm, name):
    """No check mode: the mismatch the size exchange sees raises on every rank, from the call itself."""
    assert not comm.check
    odd = comm.rank == comm.size - 1
    try:
        FREE[name](comm, odd)
        seen = ("returned", "")
    except Exception as e:  # noqa: BLE001 - compared below, on every rank
        seen = (type(e).__name__, _without_this_rank(str(e)))
    everyone = comm.mpi.allgather(seen)
    pattern = rf"ranks 0 and {comm.size - 1} disagree"
    assert all(t == "MismatchError" and re.search(pattern, m) for t, m in everyone), everyone
    assert len({m for _, m in everyone}) == 1, everyone
    assert comm.mpi.allreduce(1) == comm.size  # still usable


# --------------------------------------------------------------------------- jobs of their own
#
# Today check mode lets these through and a rank is left inside an MPI call that no other rank
# will match (a blocking collective against a non-blocking one; one more replicated-cotangent
# check than the others make), so each runs as its own ``mpiexec -n 2`` job in check mode under
# the watchdog: a failure ends that job (status 124) instead of hanging the suite.

ALONE_LIMIT = 2  # HPCCOLL_TIMEOUT of those jobs, seconds (the calls themselves take milliseconds)

ALONE = {
    # MPI never matches a blocking collective with a non-blocking one: check mode must compare the two forms
    "async-on-one-rank/all_reduce": "hpccoll.all_reduce(np.ones(3), c, async_op=odd)",
    "async-on-one-rank/all_gather": "hpccoll.all_gather(np.ones(3), c, sizes=[3] * c.size, async_op=odd)",
    "async-on-one-rank/all_to_all": "hpccoll.all_to_all(np.ones(2 * c.size), c, recv_sizes=[2] * c.size, async_op=odd)",
    "async-on-one-rank/list/all_reduce": "hpccoll.all_reduce([np.ones(3), np.ones(2)], c, async_op=odd)",
    # a replicated cotangent's check, array by array: lists of different lengths
    "list/length/all_reduce_adjoint/replicated": "hpccoll.all_reduce_adjoint([np.ones(2)] * (1 + odd), c, cotangent='replicated')",
    "list/length/all_reduce_adjoint/replicated-empty": "hpccoll.all_reduce_adjoint([np.ones(2)] * odd, c, cotangent='replicated')",
}

ALONE_JOB = """
    import numpy as np
    import hpccoll
    c = hpccoll.Communicator(check=True)
    odd = c.rank == c.size - 1
    try:
        r = {call}
        if isinstance(r, hpccoll.Request):
            r.wait()
        line = f"rank {{c.rank}} returned"
    except hpccoll.HpccollError as e:
        line = f"rank {{c.rank}} raised {{type(e).__name__}}: {{e}}"
    # One printer: lines printed by two ranks at once can interleave in mpiexec's output.
    lines = c.mpi.gather(line, root=0)
    if c.rank == 0:
        print("\\n".join(lines), flush=True)
"""


@serial_only
@pytest.mark.parametrize("name", sorted(ALONE))
def test_check_mode_mismatch_in_a_job_of_its_own(name):
    status, seconds, output = launch(ALONE_JOB.format(call=ALONE[name]), env={"HPCCOLL_TIMEOUT": str(ALONE_LIMIT)})
    raised = sorted(set(re.findall(r"rank (\d) raised MismatchError", output)))
    assert status == 0 and raised == ["0", "1"] and seconds < LIMIT, (name, status, seconds, output)
