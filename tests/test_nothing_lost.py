"""Nothing lost: ``out=`` never aliases the input, zero-size arrays, integer overflow, large counts."""

import numpy as np
import pytest

import hpccoll
from conftest import all_ranks, assert_same
from hpccoll import ArgumentError

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def checked():
    c = hpccoll.Communicator(check=True)
    yield c
    c.free()


def _shifted(shape_a, shape_b, shift):
    """Two arrays over one buffer, ``b`` starting ``shift`` elements after ``a``: they overlap partly."""
    na, nb = int(np.prod(shape_a)), int(np.prod(shape_b))
    buf = np.zeros(max(na, shift + nb))
    return buf[:na].reshape(shape_a), buf[shift : shift + nb].reshape(shape_b)


# (name, call(comm) -> the collective with an overlapping ``out`` on every rank)
OVERLAPS = [
    ("all_gather/x-inside-out", lambda c: (lambda out: hpccoll.all_gather(out[:3], c, out=out))(np.zeros((3 * c.size, 2)))),
    ("all_gather/x-strided-in-out", lambda c: (lambda out: hpccoll.all_gather(out[:: c.size], c, out=out))(np.zeros((3 * c.size, 2)))),
    ("all_gather/x-reversed-in-out", lambda c: (lambda out: hpccoll.all_gather(out[::-1][:3], c, out=out))(np.zeros((3 * c.size, 2)))),
    ("all_gather/inner-axis-window", lambda c: (lambda out: hpccoll.all_gather(out[:, :3], c, axis=1, out=out))(np.zeros((2, 3 * c.size)))),
    ("all_gather/one-element-shared", lambda c: (lambda x, out: hpccoll.all_gather(x, c, out=out))(*_shifted((3, 2), (3 * c.size, 2), 5))),
    ("reduce_scatter/out-head-of-x", lambda c: (lambda x: hpccoll.reduce_scatter(x, c, out=x[:2]))(np.ones((2 * c.size, 3)))),
    ("reduce_scatter/out-reversed-tail", lambda c: (lambda x: hpccoll.reduce_scatter(x, c, out=x[-2:][::-1]))(np.ones((2 * c.size, 3)))),
    ("reduce_scatter/out-strided", lambda c: (lambda x: hpccoll.reduce_scatter(x, c, out=x[:: c.size]))(np.ones((2 * c.size, 3)))),
    ("reduce_scatter/inner-axis", lambda c: (lambda x: hpccoll.reduce_scatter(x, c, axis=1, out=x[:, :: c.size]))(np.ones((3, 2 * c.size)))),
    ("all_reduce/reversed", lambda c: (lambda x: hpccoll.all_reduce(x, c, out=x[::-1]))(np.ones((4, 3)))),
    ("all_reduce/transposed", lambda c: (lambda x: hpccoll.all_reduce(x, c, out=x.T))(np.ones((3, 3)))),
    ("all_reduce/shifted", lambda c: (lambda x, out: hpccoll.all_reduce(x, c, out=out))(*_shifted((4, 3), (4, 3), 1))),
    ("all_gather_adjoint/out-inside-y", lambda c: (lambda y: hpccoll.all_gather_adjoint(y, c, out=y[:3]))(np.ones((3 * c.size, 2)))),
    ("reduce_scatter_adjoint/y-inside-out", lambda c: (lambda out: hpccoll.reduce_scatter_adjoint(out[:2], c, out=out))(np.zeros((2 * c.size, 3)))),
    ("all_reduce_adjoint/varying-reversed", lambda c: (lambda y: hpccoll.all_reduce_adjoint(y, c, out=y[::-1]))(np.ones(5))),
    ("all_reduce_adjoint/replicated-reversed", lambda c: (lambda y: hpccoll.all_reduce_adjoint(y, c, cotangent="replicated", out=y[::-1]))(np.ones(5))),
    ("all_gather/zero-size-out-is-x", lambda c: (lambda x: hpccoll.all_gather(x, c, sizes=[0] * c.size, out=x))(np.zeros((0, 2)))),
]


@pytest.mark.parametrize("call", [c for _, c in OVERLAPS], ids=[n for n, _ in OVERLAPS])
def test_overlapping_out_is_refused(comm, call):
    """Every rank passes an ``out`` that shares memory with its input: every rank raises, before MPI sees it."""
    with pytest.raises(ArgumentError, match="out: expected memory separate from the input"):
        call(comm)


@pytest.mark.parametrize("fn", ["all_gather", "reduce_scatter", "all_gather_adjoint", "reduce_scatter_adjoint"])
def test_out_is_x_is_refused(checked, fn):
    """``out=x`` where the shapes allow it (rank 0 holds everything) used to reach MPI as aliased buffers.

    Only rank 0 can alias, so the check mode shares its error; on one rank the plain call raises too.
    """
    sizes = [4] + [0] * (checked.size - 1)
    if fn in ("all_gather", "reduce_scatter_adjoint"):
        x = np.ones((sizes[checked.rank], 2))
    else:
        x = np.ones((4, 2))
    out = x if checked.rank == 0 else None
    with pytest.raises(ArgumentError, match="overlaps"):
        getattr(hpccoll, fn)(x, checked, sizes=sizes, out=out)
    if checked.size == 1:
        with hpccoll.Communicator(check=False) as plain:
            with pytest.raises(ArgumentError, match="overlaps"):
                getattr(hpccoll, fn)(x, plain, sizes=sizes, out=x)


@pytest.mark.parametrize("make_out", [lambda x: x, lambda x: x[...], lambda x: x.view()], ids=["x", "x[...]", "x.view()"])
@pytest.mark.parametrize("cotangent", [None, "replicated"])
def test_the_one_allowed_overlap_is_in_place(comm, make_out, cotangent):
    """``all_reduce(x, out=x)`` (or the same view under another name) reduces in place."""
    x = np.arange(6.0).reshape(2, 3) + 1
    want = x * comm.size if cotangent is None else x.copy()
    out = make_out(x)
    if cotangent is None:
        got = hpccoll.all_reduce(x, comm, out=out)
    else:
        got = hpccoll.all_reduce_adjoint(x, comm, cotangent=cotangent, out=out)
    assert got is out
    assert all_ranks(comm, np.array_equal(x, want))


def test_non_overlapping_views_of_one_buffer_are_fine(comm):
    buf = np.zeros((4 * comm.size, 3))
    x, out = buf[: 2 * comm.size], buf[2 * comm.size : 2 * comm.size + 2]
    x[...] = comm.rank + 1
    got = hpccoll.reduce_scatter(x, comm, out=out)
    assert got is out
    assert_same(out, np.full((2, 3), comm.size * (comm.size + 1) / 2))
