"""The list rule: which lists are the coalesced form, at any rank count.

A list (or tuple) is the list form when any item is an array -- a NumPy array (0-D included), a NumPy scalar,
a CuPy array -- and then every item must be one; a list of Python numbers (nested lists included) is one
array-like, as before; a list mixing arrays with anything else raises ``ArgumentError`` naming the item, on
every rank alike. The rule lives in ``hpccoll._arrays.list_types`` (``_core.lists`` re-exports it).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import Verdict, agree, assert_same, raises_everywhere

import hpccoll
from hpccoll import ArgumentError
from hpccoll._arrays import list_types

pytestmark = pytest.mark.mpi

#: (value, is the list form): the rule, item by item.
RULE = [
    ([np.ones(2), np.ones(3, np.float32)], True),
    ([np.array(1.0), np.array(2, np.int32)], True),  # 0-D arrays
    ([np.float32(1), np.float64(2)], True),  # NumPy scalars: 0-D arrays of their dtype
    ((np.int8(1), np.ones(2)), True),  # a tuple, scalars and arrays together
    ([np.bool_(True)], True),
    ([], True),  # an empty list: an empty list back
    ([1.0, 2.0], False),  # Python numbers: one array-like (backward compatible)
    ([[1, 2], [3, 4]], False),  # nested lists of numbers: one 2-D array-like
    ([True, 3, 2.5, 1j], False),
    ([np.ones(2), 3.0], True),  # mixed: the list form, whose x[1] is refused (below)
    ([1.0, np.float64(2)], True),  # numpy.float64 subclasses float, yet it is a NumPy scalar
    ([[1.0], np.ones(1)], True),
    (np.ones((2, 2)), False),  # an array, not a list
    ("ab", False),
]


@pytest.mark.parametrize("value, listed", RULE, ids=[repr(v)[:40] for v, _ in RULE])
def test_the_rule(value, listed):
    assert (list_types(value) is not None) == listed


def values(r):
    """Rank r's list of NumPy scalars, one dtype each, exactly representable sums."""
    return [np.float32(r + 1), np.float64(0.5 * r - 1), np.int32(3 - r), np.complex64(r + 2j)]


def test_all_reduce_of_numpy_scalars(comm):
    """Each scalar keeps its dtype: one 0-D array per item, the sum over ranks (not one float64 array)."""
    P = comm.size
    x = values(comm.rank)
    kept = list(x)
    with Verdict(comm) as v:
        for op in ("sum", "max"):
            want = [
                np.asarray(sum(values(r)[i] for r in range(P)) if op == "sum" else max(values(r)[i] for r in range(P)))
                for i in range(3)
            ]
            got = hpccoll.all_reduce(x[:3], comm, op=op)
            v.true(type(got) is list and len(got) == 3, f"{op}: expected a list of 3 arrays; got {got!r}")
            for i, (g, w) in enumerate(zip(got, want)):
                v.same(g, w.astype(x[i].dtype), f"{op}: item {i}")
        got = hpccoll.all_reduce(tuple(x), comm, async_op=True).wait()
        v.true(type(got) is list and len(got) == 4, f"async: expected a list; got {got!r}")
        v.same(got[3], np.asarray(sum(values(r)[3] for r in range(P)), np.complex64), "async complex64")
        v.true(all(a is b for a, b in zip(x, kept)), "the input list was changed")


def test_all_reduce_mixes_scalars_and_arrays(comm):
    P = comm.size
    x = [np.arange(3.0) + comm.rank, np.float32(comm.rank), np.array(2, np.int64)]
    got = hpccoll.all_reduce(x, comm)
    want = [np.arange(3.0) * P + P * (P - 1) / 2, np.asarray(P * (P - 1) / 2, np.float32), np.asarray(2 * P)]
    for g, w in zip(got, want):
        assert_same(g, w, comm)


def test_broadcast_of_numpy_scalars(comm):
    root = comm.size - 1
    x = values(comm.rank)
    with Verdict(comm) as v:
        for async_op in (False, True):
            got = hpccoll.broadcast(x, comm, root=root, async_op=async_op)
            got = got.wait() if async_op else got
            v.true(type(got) is list and len(got) == 4, f"expected a list of 4; got {got!r}")
            for i, g in enumerate(got):
                v.same(g, np.asarray(values(root)[i]), f"async_op={async_op}: item {i}")


def test_all_gather_of_numpy_scalars(comm):
    """A gather joins along an existing axis: a NumPy scalar in the list is refused by name; atleast_1d gathers."""
    r, P = comm.rank, comm.size
    msg = raises_everywhere(
        comm,
        ArgumentError,
        r"^x\[1\]: expected an array with at least 1 dimension to concatenate along axis; got a 0-D array",
        lambda: hpccoll.all_gather([np.arange(2.0), np.float32(r)], comm),
        same_message=True,
    )
    assert "atleast_1d" in msg
    raises_everywhere(
        comm,
        ArgumentError,
        r"^x\[0\]: expected an array with at least 1 dimension",
        lambda: hpccoll.all_gather([np.float32(1), np.float64(2)], comm),
    )
    got = hpccoll.all_gather([np.arange(2.0) + r, np.atleast_1d(np.float32(r))], comm)
    assert_same(got[0], np.concatenate([np.arange(2.0) + q for q in range(P)]), comm)
    assert_same(got[1], np.arange(P, dtype=np.float32), comm)


def test_python_numbers_stay_one_array(comm):
    """A list of Python numbers is one array-like, as it always was: one array back, not a list."""
    P, r = comm.size, comm.rank
    with Verdict(comm) as v:
        v.same(hpccoll.all_reduce([1.0, float(r)], comm), np.array([P, P * (P - 1) / 2]), "all_reduce")
        v.same(hpccoll.broadcast([[r, 1], [2, 3]], comm, root=0), np.array([[0, 1], [2, 3]]), "broadcast")
        v.same(hpccoll.all_gather([float(r)], comm), np.arange(P, dtype=float), "all_gather")


MIXED = [
    ([np.ones(2), 3.0], 1, "float"),
    ([[1.0, 2.0], np.ones(2)], 0, "list"),
    ([np.float64(1), 2.0], 1, "float"),
    ((np.ones(1), None), 1, "NoneType"),
]
CALLS = {
    "all_reduce": lambda x, c: hpccoll.all_reduce(x, c),
    "all_reduce async": lambda x, c: hpccoll.all_reduce(x, c, async_op=True).wait(),
    "all_gather": lambda x, c: hpccoll.all_gather(x, c),
    "broadcast": lambda x, c: hpccoll.broadcast(x, c, root=0),
    "reduce_scatter": lambda x, c: hpccoll.reduce_scatter(x, c),
    "all_to_all": lambda x, c: hpccoll.all_to_all(x, c),
    "reduce": lambda x, c: hpccoll.reduce(x, c),
    "all_reduce_adjoint": lambda x, c: hpccoll.all_reduce_adjoint(x, c),
    "all_gather_adjoint": lambda x, c: hpccoll.all_gather_adjoint(x, c),
    "AllReduce": lambda x, c: hpccoll.AllReduce(c)(x),
    "explain": lambda x, c: c.explain(x),
}


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("check", [False, True], ids=["plain", "check"])
def test_a_mixed_list_is_refused_by_name(comm, call, check):
    """Every rank passes the same mixed list: the same ArgumentError, naming the item, expected and got."""
    with hpccoll.Communicator(comm, check=check) as c:
        for x, i, got in MIXED:
            j = 1 - i
            raises_everywhere(
                c,
                ArgumentError,
                rf"^x\[{i}\]: expected an array \(NumPy or CuPy, 0-D arrays and NumPy scalars included\), as "
                rf"x\[{j}\] is: .*; got {got} ",
                lambda: CALLS[call](x, c),
            )
        # the communicator still works
        agree(c, hpccoll.all_reduce(np.ones(1), c)[0] == c.size, "all_reduce after the errors")


@pytest.mark.mpi(min_size=2)
def test_a_mixed_list_on_one_rank_in_check_mode(comm):
    """Check mode shares one rank's mixed list as its error on every rank (no hang)."""
    with hpccoll.Communicator(comm, check=True) as c:
        x = [np.ones(2), 3.0] if c.rank == c.size - 1 else [np.ones(2), np.float64(3)]
        raises_everywhere(
            c,
            ArgumentError,
            rf"^x\[1\]: expected an array .*; got float .*raised on rank {c.size - 1}\)$",
            lambda: hpccoll.all_reduce(x, c),
        )


def test_explain_follows_the_rule(comm):
    """``comm.explain`` reads a list as the collectives do (one float64 array of 2 would be 16 bytes)."""
    e = comm.explain([np.float32(1), np.float64(2)])
    agree(comm, e.nbytes == 12, lambda: f"the list form: a float32 and a float64; got {e}")
    e = comm.explain([1.0, 2.0, 3.0])
    agree(comm, e.nbytes == 24 and e.buckets is None, lambda: f"one array-like: one array; got {e}")
    raises_everywhere(comm, ArgumentError, r"^x\[1\]: expected an array", lambda: comm.explain([np.ones(2), 3.0]))


def test_replicated_adjoint_follows_the_rule(comm):
    """``all_reduce_adjoint(..., cotangent="replicated")`` (no traffic) reads lists as the collectives do: a
    list of Python numbers is one array, NumPy scalars are the list form, a mixed list is refused by name."""
    adjoint = hpccoll.all_reduce_adjoint
    y = adjoint([1.0, 2.0], comm, cotangent="replicated")
    agree(comm, isinstance(y, np.ndarray) and np.array_equal(y, [1.0, 2.0]), lambda: f"one array; got {y!r}")
    ys = adjoint([np.float32(1), np.float64(2)], comm, cotangent="replicated")
    agree(
        comm,
        [(a.dtype, a.shape, a.item()) for a in ys] == [(np.float32, (), 1.0), (np.float64, (), 2.0)],
        lambda: f"the list form, a 0-D array per scalar; got {ys!r}",
    )
    raises_everywhere(
        comm,
        ArgumentError,
        r"^y\[1\]: expected an array .*, as y\[0\] is: .*; got float ",
        lambda: adjoint([np.ones(2), 3.0], comm, cotangent="replicated"),
    )
