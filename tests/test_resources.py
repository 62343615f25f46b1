"""Resources: nothing hpccoll allocates (memory, MPI communicators, MPI datatypes) outlives its use."""

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from conftest import all_ranks
from hpccoll._comm import as_communicator

pytestmark = pytest.mark.mpi


def test_cached_duplicate_is_freed_with_its_communicator(comm):
    """A raw mpi4py communicator gets one cached duplicate, freed when the user frees it.

    It used to outlive it: after about 2000 Split/use/Free rounds MPICH ran out of
    communicators ("Too many communicators").
    """
    for _ in range(3):
        sub = MPI.COMM_WORLD.Split(comm.rank % 2, comm.rank)
        assert all_ranks(comm, hpccoll.all_reduce(np.ones(2), sub)[0] == sub.size)
        cached = as_communicator(sub)
        assert cached.mpi != MPI.COMM_NULL
        sub.Free()
        assert cached.mpi == MPI.COMM_NULL
    world = as_communicator(MPI.COMM_WORLD)
    assert world.mpi != MPI.COMM_NULL and hpccoll.all_reduce(np.ones(1))[0] == comm.size
