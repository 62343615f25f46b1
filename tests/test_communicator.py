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


# --------------------------------------------------------------------------- cartesian's dims


@pytest.mark.parametrize("check", [False, True], ids=["plain", "check"])
def test_cartesian_dims_product_is_the_size(comm, check):
    """``dims`` multiply to the communicator's size (zeros filled by MPI_Dims_create), as the docstring says;
    anything else is refused on every rank alike, naming ``dims`` with expected and got."""
    P = comm.size
    tail = r" \(raised on rank 0\)" if check and P > 1 else ""
    with hpccoll.Communicator(comm, check=check) as c:
        for dims in ([P + 1], [P, 2], [1, P, 3], (2 * P,)):
            product = int(np.prod(dims))
            raises_everywhere(
                c,
                hpccoll.ArgumentError,
                rf"^dims: expected extents whose product is the communicator's size, {P}; "
                rf"got \[{', '.join(map(str, dims))}\] \(product {product}\){tail}$",
                lambda: c.cartesian(dims),
            )
        for dims in ([P + 1, 0], [0, 2 * P + 1]):
            raises_everywhere(
                c,
                hpccoll.ArgumentError,
                rf"^dims: expected extents whose product is the communicator's size, {P} \(zeros are filled in\); "
                rf"got \[{', '.join(map(str, dims))}\], whose nonzero extents' product {max(dims)} does not divide "
                rf"{P}{tail}$",
                lambda: c.cartesian(dims),
            )
        for dims in ([-1], [], [1.5], [True]):
            raises_everywhere(
                c,
                hpccoll.ArgumentError,
                r"^dims: expected a non-empty sequence of ints >= 0; got ",
                lambda: c.cartesian(dims),
            )
        for dims, want in (([P], (P,)), ([0], (P,)), ([P, 0], (P, 1)), ([0, 1], (P, 1)), ([1, 0, 1], (1, P, 1))):
            with c.cartesian(dims) as grid:
                agree(c, grid.dims == want and int(np.prod(grid.dims)) == P, lambda: f"{dims}: got {grid.dims}")
        with c.cartesian([0, 0]) as grid:
            agree(c, int(np.prod(grid.dims)) == P and len(grid.dims) == 2, lambda: f"[0, 0]: got {grid.dims}")


@pytest.mark.mpi(min_size=2)
def test_cartesian_dims_that_differ_across_ranks_in_check_mode(comm):
    """In check mode the ranks compare the grid before MPI_Cart_create: a MismatchError on every rank."""
    with hpccoll.Communicator(comm, check=True) as c:
        dims = [c.size] if c.rank == 0 else [c.size, 1]
        raises_everywhere(
            c,
            hpccoll.MismatchError,
            rf"cartesian.*rank 0 has dims=\({c.size},\) but rank 1 has dims=\({c.size}, 1\)",
            lambda: c.cartesian(dims),
        )
        bad = [c.size + 1] if c.rank == c.size - 1 else [c.size]  # one rank's error, shared
        raises_everywhere(
            c, hpccoll.ArgumentError, rf"^dims: expected .*\(raised on rank {c.size - 1}\)$", lambda: c.cartesian(bad)
        )
