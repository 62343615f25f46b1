"""Operators remember the extents their calls learned: ``op.H`` is the adjoint of the ``op`` that ran.

An ``AllGather`` without ``sizes`` gathers shards of any extents; its adjoint
splits ``y`` as that forward gathered (per shape of the gathered result), and
refuses on every rank where the split cannot be known. ``ReduceScatter``
remembers what its adjoint (an all-gather) learned, ``AllToAll`` its
forward's ``recv_sizes``. References are NumPy's, from a global array.
"""

import numpy as np
import pytest
from conftest import agree, assert_close, assert_same, make, raises_everywhere
from test_all_to_all import AXES, case

import hpccoll
from hpccoll import _operators
from hpccoll.testing import dottest

pytestmark = pytest.mark.mpi

#: Shard extents that numpy.array_split of their total would not give (at 2 ranks: 2 and 5, and 3 and 0).
PATTERNS = {
    "growing": lambda p: [2 + 3 * r for r in range(p)],
    "empty-last": lambda p: [3 * (p - 1 - r) for r in range(p)],
}


def lo_hi(sizes, rank):
    return sum(sizes[:rank]), sum(sizes[: rank + 1])


def gathered_case(comm, pattern, axis, seed):
    """This rank's shard of a (3, n, 2) array split along ``axis`` by ``pattern``; the whole array; the sizes."""
    sizes = PATTERNS[pattern](comm.size)
    full = [3, 4, 2]
    full[axis] = sum(sizes)
    whole = make(tuple(full), np.float64, seed)
    lo, hi = lo_hi(sizes, comm.rank)
    index = [slice(None)] * 3
    index[axis] = slice(lo, hi)
    return whole[tuple(index)], whole, sizes, tuple(index)


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("check", [False, True], ids=["plain", "check-mode"])
def test_all_gather_adjoint_splits_as_its_forward_gathered(comm, pattern, axis, check):
    c = hpccoll.Communicator(comm.mpi, check=check)
    shard, whole, sizes, mine = gathered_case(c, pattern, axis, seed=1)
    stack = make((c.size,) + whole.shape, np.float64, seed=2)  # every rank's cotangent
    op = hpccoll.AllGather(c, axis=axis)
    y = op(shard)
    g = op.H(stack[c.rank])
    gg = op.H.H(shard)  # the adjoint operator's adjoint is the forward again
    assert_same(y, whole, c)
    assert_same(gg, whole, c)
    assert_close(g, stack.sum(axis=0)[mine], c)
    assert dottest(op, shard, stack[c.rank] + 1) and dottest(op.H, stack[c.rank], shard - 1)
    c.free()


def test_each_layout_is_remembered(comm):
    """One operator on two layouts (two batch extents), adjoints in reverse order: each splits as its forward."""
    op = hpccoll.AllGather(comm, axis=1)
    first = gathered_case(comm, "growing", 1, seed=3)
    second_sizes = PATTERNS["empty-last"](comm.size)
    lo, hi = lo_hi(second_sizes, comm.rank)
    second_whole = make((5, sum(second_sizes)), np.float64, seed=4)
    y1, y2 = op(first[0]), op(second_whole[:, lo:hi])
    g2 = op.H(2 * y2)
    g1 = op.H(3 * y1)
    P = comm.size
    assert_close(g1, 3 * P * first[1][first[3]], comm)
    assert_close(g2, 2 * P * second_whole[:, lo:hi], comm)
    agree(comm, len(op.layouts) == 2, f"{len(op.layouts)} layouts remembered")


def test_lists_remember_every_array(comm):
    """A list whose arrays have different extents on the ranks: the adjoint splits each as it was gathered."""
    a, whole_a, _, mine_a = gathered_case(comm, "growing", 0, seed=5)
    b, whole_b, _, mine_b = gathered_case(comm, "empty-last", 0, seed=6)
    c_, whole_c, _, mine_c = gathered_case(comm, "growing", 0, seed=7)
    op = hpccoll.AllGather(comm, axis=0)
    ys = op([a, b, c_])
    outs = [np.empty_like(a), np.empty_like(b), np.empty_like(c_)]
    back = op.H([2 * y for y in ys], out=outs)
    P = comm.size
    for got, whole in zip(ys, (whole_a, whole_b, whole_c)):
        assert_same(got, whole, comm)
    for got, o, whole, mine in zip(back, outs, (whole_a, whole_b, whole_c), (mine_a, mine_b, mine_c)):
        agree(comm, got is o, "out was not used")
        assert_close(got, 2 * P * whole[mine], comm)


@pytest.mark.mpi(min_size=2)
def test_an_unknown_uneven_split_is_refused_on_every_rank(comm):
    n = comm.size + 1  # does not divide over P > 1 ranks
    y = make((3, n), np.float64, seed=8)
    for check in (False, True):
        c = hpccoll.Communicator(comm.mpi, check=check)
        op = hpccoll.AllGather(c, axis=1)
        message = raises_everywhere(
            c,
            hpccoll.ArgumentError,
            r"AllGather.adjoint: expected the extents of the shards along axis 1",
            lambda: op.H(y),
        )
        agree(c, f"y.shape[1] == {n} does not divide evenly over {c.size} ranks" in message, message)
        raises_everywhere(c, hpccoll.ArgumentError, r"y\[1\].shape\[1\]", lambda: op.adjoint([y[:, :0], y]))
        op(y)  # a forward of another layout teaches nothing about this one
        raises_everywhere(c, hpccoll.ArgumentError, "does not divide evenly", lambda: op.adjoint(y))
        c.free()


def test_an_even_or_given_split_needs_no_forward(comm):
    """As before: an extent that divides splits evenly, and sizes= given are used as given (no forward needed)."""
    P = comm.size
    stack = make((P, 2, 3 * P), np.float64, seed=9)
    got = hpccoll.AllGather(comm, axis=1).H(stack[comm.rank])
    assert_close(got, stack.sum(axis=0)[:, 3 * comm.rank : 3 * comm.rank + 3], comm)
    sizes = PATTERNS["growing"](P)
    lo, hi = lo_hi(sizes, comm.rank)
    ragged = make((P, 2, sum(sizes)), np.float64, seed=10)
    op = hpccoll.AllGather(comm, axis=1, sizes=sizes)
    assert_close(op.H(ragged[comm.rank]), ragged.sum(axis=0)[:, lo:hi], comm)
    agree(comm, len(op.layouts) == 0, "an operator with sizes remembered a layout")


@pytest.mark.mpi(min_size=2)
def test_the_least_recently_used_layout_is_forgotten(comm, monkeypatch):
    monkeypatch.setattr(_operators, "LAYOUTS", 2)
    P = comm.size
    sizes = [3] + [1] * (P - 2) + [0]  # P + 1 rows: never an even split
    shard = make((sizes[comm.rank], 3), np.float64, seed=11)
    op = hpccoll.AllGather(comm, axis=0)
    op(shard[:, :1])
    op(shard[:, :2])
    op.H(np.ones((P + 1, 1)))  # used again: kept
    op(shard)  # the third layout: the (P + 1, 2) one goes
    agree(comm, len(op.layouts) == 2, f"{len(op.layouts)} layouts remembered")
    got = [op.H(np.ones((P + 1, k))).shape for k in (1, 3)]
    agree(comm, got == [(sizes[comm.rank], 1), (sizes[comm.rank], 3)], f"got {got}")
    raises_everywhere(comm, hpccoll.ArgumentError, "does not divide evenly", lambda: op.H(np.ones((P + 1, 2))))


def test_reduce_scatter_forward_splits_as_its_adjoint_gathered(comm):
    """ReduceScatter.H gathers blocks of any extents; op.H.H (the forward) then splits alike."""
    shard, whole, sizes, mine = gathered_case(comm, "growing", 1, seed=12)
    stack = make((comm.size,) + whole.shape, np.float64, seed=13)
    for name, scale in (("sum", 1.0), ("avg", 1.0 / comm.size)):
        op = hpccoll.ReduceScatter(comm, op=name, axis=1)
        gathered = op.H(shard)
        back = op.H.H(stack[comm.rank])
        assert_close(gathered, scale * whole, comm)
        assert_close(back, (stack.sum(axis=0) / comm.size if name == "avg" else stack.sum(axis=0))[mine], comm)
        assert dottest(op.H, shard, stack[comm.rank])


def test_reduce_scatter_forward_without_memory_splits_like_array_split(comm):
    P = comm.size
    stack = make((P, 2 * P + 1), np.float64, seed=14)
    split = hpccoll.split_sizes(2 * P + 1, P)
    lo, hi = lo_hi(split, comm.rank)
    assert_close(hpccoll.ReduceScatter(comm).forward(stack[comm.rank]), stack.sum(axis=0)[lo:hi], comm)


@pytest.mark.parametrize("shape,sa,ca", AXES)
def test_all_to_all_adjoint_reuses_the_forward_recv_sizes(comm, shape, sa, ca):
    x, sizes, recv, want = case(comm, shape, sa, ca, "uneven", np.float64, seed=15)
    op = hpccoll.AllToAll(comm, split_axis=sa, concat_axis=ca, sizes=sizes)
    y = op(x)
    back = op.H(y)
    cotangent = make(want.shape, np.float64, seed=200 + comm.rank)
    assert_same(y, want, comm)
    assert_same(back, x, comm)
    assert dottest(op, x, cotangent)


@pytest.mark.mpi(min_size=2)
def test_all_to_all_adjoint_refuses_what_it_cannot_know(comm):
    P, me = comm.size, comm.rank
    op = hpccoll.AllToAll(comm, split_axis=1, concat_axis=0)
    odd = np.ones((P + 1 if me == 1 else P, 3))  # only rank 1's extent fails to divide
    message = raises_everywhere(
        comm, hpccoll.ArgumentError, "AllToAll.adjoint: expected recv_sizes=", lambda: op.H(odd)
    )
    agree(comm, "on rank(s) [1]" in message, message)
    rows = [2 + 3 * r for r in range(P)]  # rows (along concat_axis) of each rank: not array_split's
    x1 = make((rows[me], 2 * P), np.float64, seed=16)
    x2 = make((rows[me], 3 * P), np.float64, seed=17)
    y1, y2 = op(x1), op(x2)
    # rank 0 hands in the cotangent of the first call, the others that of the second: no split fits both
    raises_everywhere(comm, hpccoll.ArgumentError, "match different forward calls", lambda: op.H(y1 if me == 0 else y2))
    assert_same(op.H(y2), x2, comm)
    assert_same(op.H(y1), x1, comm)
