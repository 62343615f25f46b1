"""Resources: nothing hpccoll allocates (memory, MPI communicators, MPI datatypes) outlives its use."""

import numpy as np
import pytest
from conftest import all_ranks
from mpi4py import MPI

import hpccoll
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


def _memory_benchmark():
    """benchmarks/memory.py as a module: the suite runs its checks small and fast."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "memory.py"
    spec = importlib.util.spec_from_file_location("hpccoll_memory_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def memory():
    return _memory_benchmark()


#: The resource checks do not depend on the rank count beyond 2, and cost seconds on oversubscribed cores:
#: they run at 1 and 2 ranks (a size-dependent skip, the same on every rank, no collective around it).
small_worlds = pytest.mark.skipif(MPI.COMM_WORLD.size > 2, reason="resource checks run at 1 and 2 ranks")


@small_worlds
def test_no_leaks_over_a_hundred_rounds(comm, memory):
    """The leak check of benchmarks/memory.py, 100 rounds instead of 10,000: no MPI handle or traced growth.

    Enough to see one leaked datatype per gather or one communicator per split (every fifth round).
    """
    leaks = memory.leak_check(comm, 100, warmup=20)
    assert memory.no_leak(leaks), leaks


@small_worlds
def test_peak_memory_within_bound_at_1_mib(comm, memory):
    """benchmarks/memory.py's peak cases at 1 MiB: what hpccoll allocates stays within output + one packing buffer."""
    if comm.transport == "shm":  # HPCCOLL_TRANSPORT=shm: node-shared scratch windows by design (docs/shm.md)
        pytest.skip("a named shm keeps node-shared scratch windows of its own, outside this bound")
    for row in memory.measure_peak(comm, 1 << 20):
        assert row["traced"] <= row["bound"] + (64 << 10), row


@pytest.mark.parametrize("kind", ["datatypes", "communicators"])
def test_the_handle_probe_sees_a_leak(memory, kind):
    """The probe is sensitive: 32 datatypes, or 32 communicators, left behind move its gauge of that kind.

    Each kind is leaked alone, so that one gauge cannot pass for the other (on Open MPI the
    datatype gauge is the C heap, which a leaked communicator grows too).
    """
    make = (lambda: MPI.BYTE.Create_contiguous(1)) if kind == "datatypes" else MPI.COMM_SELF.Dup
    which = 0 if kind == "datatypes" else 1
    # MPICH hands out freed handle slots first, last freed first: the datatypes that earlier tests freed (the
    # halo exchange's cached region types, say) would feed the probe slots in no order. Held, they leave it
    # fresh slots, which grow.
    held = [make() for _ in range(2048)] if kind == "datatypes" else []
    before = memory.handle_probe()
    kept = [make() for _ in range(32)]  # never converted to Fortran handles, as a leak inside a library
    after = memory.handle_probe()
    for obj in kept + held:
        obj.Free()
    assert after[which] - before[which] >= 8, (kind, before, after)
