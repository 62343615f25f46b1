"""The Communicator: private duplicates, split, size 1, caching."""

import numpy as np
import pytest
from conftest import agree, assert_same, raises_everywhere
from mpi4py import MPI

import hpccoll

pytestmark = pytest.mark.mpi


def test_private_duplicate(comm):
    assert comm.mpi != MPI.COMM_WORLD
    assert MPI.Comm.Compare(comm.mpi, MPI.COMM_WORLD) == MPI.CONGRUENT
    assert (comm.rank, comm.size) == (MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size)
    assert "Communicator(rank=" in repr(comm)


def test_raw_communicators_are_duplicated_once():
    from hpccoll._comm import as_communicator

    a = as_communicator(MPI.COMM_WORLD)
    assert as_communicator(MPI.COMM_WORLD) is a
    assert as_communicator(None) is a
    assert a.mpi != MPI.COMM_WORLD


def test_split_groups(comm):
    sub = comm.split(comm.rank % 2, key=-comm.rank)
    members = [r for r in range(comm.size) if r % 2 == comm.rank % 2]
    agree(comm, sub.size == len(members), lambda: f"size {sub.size}, members {members}")
    # key reverses the order
    agree(comm, sub.rank == sorted(members, reverse=True).index(comm.rank), lambda: f"rank {sub.rank} in {members}")
    got = hpccoll.all_gather(np.array([comm.rank]), sub)
    assert_same(got, np.array(sorted(members, reverse=True)), comm)
    agree(comm, sub.check == comm.check and sub.transport == comm.transport, "check or transport not inherited")
    sub.free()


def test_split_undefined(comm):
    sub = comm.split(MPI.UNDEFINED if comm.rank != 0 else 0)
    agree(comm, (sub is None) == (comm.rank != 0) and (sub is None or sub.size == 1), lambda: f"got {sub!r}")
    if sub is not None:
        sub.free()
    raises_everywhere(comm, hpccoll.ArgumentError, "color: expected an int", lambda: comm.split("red"))


@pytest.mark.parametrize(
    "fn",
    [
        "all_gather",
        "reduce_scatter",
        "all_reduce",
        "all_gather_adjoint",
        "reduce_scatter_adjoint",
        "all_reduce_adjoint",
    ],
)
def test_size_one_is_a_copy(fn):
    """On one rank every collective is the identity, returns a new array and does not communicate."""
    with hpccoll.Communicator(MPI.COMM_SELF) as one:
        x = np.arange(6.0).reshape(2, 3)
        y = getattr(hpccoll, fn)(x, one)
        np.testing.assert_array_equal(y, x)
        assert not np.shares_memory(x, y)


def test_communicator_wraps_communicator(comm):
    with hpccoll.Communicator(comm, check=True) as c:
        assert c.check and c.size == comm.size and c.mpi != comm.mpi
        agree(c, hpccoll.all_reduce(np.ones(1), c)[0] == c.size, "the sum of ones is not the size")
