"""The node-local rank (hpccoll._local), used to pick a GPU before NCCL starts."""

import pytest
from conftest import agree

from hpccoll._local import LOCAL_RANK_VARIABLES, local_rank, local_rank_from_environment

pytestmark = pytest.mark.mpi


def test_launcher_variables_win_in_order():
    env = {"SLURM_LOCALID": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "3", "MPI_LOCALRANKID": "5"}
    assert local_rank(environ=env) == (3, "OMPI_COMM_WORLD_LOCAL_RANK=3")
    assert local_rank_from_environment({"PALS_LOCAL_RANKID": " 2 "}) == (2, "PALS_LOCAL_RANKID=2")
    assert local_rank_from_environment({"SLURM_LOCALID": "1"}) == (1, "SLURM_LOCALID=1")
    assert LOCAL_RANK_VARIABLES.index("SLURM_LOCALID") > LOCAL_RANK_VARIABLES.index("MPI_LOCALRANKID")


def test_unusable_values_are_skipped():
    assert local_rank_from_environment({"OMPI_COMM_WORLD_LOCAL_RANK": "", "MPI_LOCALRANKID": "-1"}) is None
    assert local_rank_from_environment({"MPI_LOCALRANKID": "x", "SLURM_LOCALID": "4"}) == (4, "SLURM_LOCALID=4")


def test_shared_memory_fallback(comm):
    # Collective (the same empty environment on every rank): all test ranks share one node here.
    rank, source = local_rank(comm.mpi, environ={})
    agree(comm, (rank, source) == (comm.rank, "MPI.COMM_TYPE_SHARED split"), lambda: f"got {(rank, source)}")
