"""The Communicator: private duplicates, split, size 1, caching."""

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from conftest import all_ranks, assert_same

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
    assert sub.size == len(members)
    assert sub.rank == sorted(members, reverse=True).index(comm.rank)  # key reverses the order
    got = hpccoll.all_gather(np.array([comm.rank]), sub)
    assert_same(got, np.array(sorted(members, reverse=True)))
    assert sub.check == comm.check and sub.transport == comm.transport
    sub.free()


def test_split_undefined(comm):
    sub = comm.split(MPI.UNDEFINED if comm.rank != 0 else 0)
    assert (sub is None) == (comm.rank != 0)
    if sub is not None:
        assert sub.size == 1
        sub.free()
    with pytest.raises(hpccoll.ArgumentError, match="color: expected an int"):
        comm.split("red")


@pytest.mark.parametrize("fn", ["all_gather", "reduce_scatter", "all_reduce", "all_gather_adjoint",
                                "reduce_scatter_adjoint", "all_reduce_adjoint"])
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
        assert all_ranks(c, hpccoll.all_reduce(np.ones(1), c)[0] == c.size)
