"""permute and permute_adjoint: rank d gets the block of the rank s with (s, d) in perm, zeros where none, vs NumPy.

Data is a global array with a leading rank axis made from a seed on every rank; the permutations come from
a seeded generator too, so every rank passes the same ``perm``. Pure data movement: compared bit for bit.
"""

import numpy as np
import pytest
from conftest import agree, assert_same, make, raises_everywhere
from test_nccl_standin import calls, dev, fresh, gpu, host, runtime  # noqa: F401 (fixtures)
from test_shift import DTYPES, SHAPE, stack

import hpccoll

pytestmark = pytest.mark.mpi


def perms(P):
    """Every rank's same list of permutations on P ranks: empty, identity, pipeline, ring, random partial ones."""
    rng = np.random.default_rng(P)
    found = [[], [(r, r) for r in range(P)], [(i, i + 1) for i in range(P - 1)], [(r, (r + 1) % P) for r in range(P)]]
    for _ in range(4):
        dests = rng.permutation(P)
        keep = rng.random(P) < 0.7
        found.append([(int(s), int(d)) for s, d in zip(range(P), dests) if keep[s]])
    return found


def reference(G, perm, r):
    """What rank r gets: the block of the rank that sends to it, else zeros."""
    source = [s for s, d in perm if d == r]
    return G[source[0]].copy() if source else np.zeros_like(G[r])


def reversed_(perm):
    return [(d, s) for s, d in perm]


@pytest.mark.parametrize("dtype", DTYPES)
def test_permute_against_numpy(comm, dtype):
    G = stack(comm, dtype)
    r = comm.rank
    for perm in perms(comm.size):
        y = hpccoll.permute(G[r], comm, perm=perm)
        assert_same(y, reference(G, perm, r), comm)
        assert_same(hpccoll.permute_adjoint(G[r], comm, perm=perm), reference(G, reversed_(perm), r), comm)
    agree(comm, np.array_equal(G, stack(comm, dtype)), "the input was modified")


@pytest.mark.parametrize("form", ["out", "in place", "fortran", "strided out", "async", "async in place"])
def test_permute_forms_of_one_array(comm, form):
    G = stack(comm)
    r = comm.rank
    for perm in perms(comm.size):
        x = G[r].copy()
        want = reference(G, perm, r)
        if form == "out":
            out = np.full(SHAPE, np.nan)
            got = hpccoll.permute(x, comm, perm=perm, out=out)
            agree(comm, got is out, "out was not returned")
        elif form == "in place":
            got = hpccoll.permute(x, comm, perm=perm, out=x)
            agree(comm, got is x, "out=x was not returned")
        elif form == "fortran":
            got = hpccoll.permute(np.asfortranarray(x), comm, perm=perm)
        elif form == "strided out":
            big = np.zeros((SHAPE[0], 2 * SHAPE[1]))
            got = hpccoll.permute(x, comm, perm=perm, out=big[:, ::2])
            agree(comm, not big[:, 1::2].any(), "the gaps of a strided out were written")
        elif form == "async":
            got = hpccoll.permute(x, comm, perm=perm, async_op=True).wait()
        else:
            got = hpccoll.permute(x, comm, perm=perm, out=x, async_op=True).wait()
        assert_same(np.ascontiguousarray(got), want, comm)
        if "in place" not in form:
            assert_same(x, G[r], comm)


def test_permute_lists(comm):
    P, r = comm.size, comm.rank
    G, H = stack(comm), stack(comm, np.int32, (4,), seed=9)
    E = np.zeros((P, 0, 2))
    for perm in perms(P):
        xs = [G[r], H[r], E[r]]
        got = hpccoll.permute(xs, comm, perm=perm)
        for a, W in zip(got, (G, H, E)):
            assert_same(a, reference(W, perm, r), comm)
        outs = [np.empty_like(a) for a in xs]
        res = hpccoll.permute_adjoint(tuple(xs), comm, perm=perm, out=outs, async_op=True).wait()
        agree(comm, all(a is b for a, b in zip(res, outs)), "the outs were not returned")
        for a, W in zip(outs, (G, H, E)):
            assert_same(a, reference(W, reversed_(perm), r), comm)


def test_permute_of_the_ring_is_shift(comm):
    P, r = comm.size, comm.rank
    G = stack(comm)
    ring = [(q, (q + 2) % P) for q in range(P)]
    assert_same(hpccoll.permute(G[r], comm, perm=ring), hpccoll.shift(G[r], comm, offset=2), comm)


def test_permute_is_its_adjoints_adjoint(comm):
    """<permute(x), y> summed over ranks == <x, permute_adjoint(y)> summed over ranks (the dot test)."""
    P, r = comm.size, comm.rank
    X, Y = make((P, 6), np.float64, 1), make((P, 6), np.float64, 2)
    for perm in perms(P):
        lhs = comm.mpi.allreduce(float(hpccoll.permute(X[r], comm, perm=perm) @ Y[r]))
        rhs = comm.mpi.allreduce(float(X[r] @ hpccoll.permute_adjoint(Y[r], comm, perm=perm)))
        agree(comm, abs(lhs - rhs) <= 1e-12 * max(1.0, abs(lhs)), f"perm {perm}: {lhs} != {rhs}")
    agree(comm, hpccoll.adjoint_of(hpccoll.permute) is hpccoll.permute_adjoint)
    agree(comm, hpccoll.adjoint_of(hpccoll.permute_adjoint) is hpccoll.permute)


def test_permute_operator(comm):
    r = comm.rank
    G = stack(comm)
    for perm in perms(comm.size):
        op = hpccoll.Permute(comm, perm=perm)
        assert_same(op.forward(G[r]), reference(G, perm, r), comm)
        assert_same(op.adjoint(G[r]), reference(G, reversed_(perm), r), comm)
        assert_same(op.H.forward(G[r]), reference(G, reversed_(perm), r), comm)
        assert_same(hpccoll.adjoint_of(op).forward(G[r]), reference(G, reversed_(perm), r), comm)
        agree(comm, op.H.H is op, "op.H.H is not op")
        agree(comm, "perm=" in repr(op), repr(op))
    raises_everywhere(comm, hpccoll.ArgumentError, "perm: expected", lambda: hpccoll.Permute(comm, perm=[(0, 0, 0)]))


def test_permute_plan(comm):
    P, r = comm.size, comm.rank
    G = stack(comm)
    for perm in perms(P):
        x, out = G[r].copy(), np.empty(SHAPE)
        p = hpccoll.plan(hpccoll.permute, x, comm, out=out, perm=perm)
        for k in range(3):  # the plan reads x again on every call
            x[...] = G[(r + k) % P]
            agree(comm, p() is out, "the plan did not return its out")
            moved = np.stack([G[(q + k) % P] for q in range(P)])
            assert_same(out, reference(moved, perm, r), comm)
        p.free()


def test_permute_bad_arguments(comm):
    P = comm.size
    x = np.ones(SHAPE)
    cases = [
        (3, "perm: expected a sequence of \\(source, dest\\) pairs of ranks; got 3"),
        ("ab", "perm: expected a sequence of \\(source, dest\\) pairs"),
        ([(0,)], "perm: expected a sequence of \\(source, dest\\) pairs"),
        ([(0.0, 0)], "perm: expected \\(source, dest\\) pairs of ints; got the pair \\(0.0, 0\\)"),
        ([(True, 0)], "perm: expected \\(source, dest\\) pairs of ints"),
        ([(0, P)], f"perm: expected ranks in \\[0, {P}\\); got the pair \\(0, {P}\\)"),
        ([(-1, 0)], f"perm: expected ranks in \\[0, {P}\\)"),
        ([(0, 0), (0, 0)], "perm: expected each rank at most once as a source; got rank 0 twice"),
    ]
    if P > 1:
        cases.append(([(0, 1), (1, 1)], "perm: expected each rank at most once as a destination; got rank 1 twice"))
    for perm, message in cases:
        raises_everywhere(comm, hpccoll.ArgumentError, message, lambda: hpccoll.permute(x, comm, perm=perm))
        raises_everywhere(comm, hpccoll.ArgumentError, message, lambda: hpccoll.permute_adjoint([x], comm, perm=perm))
    raises_everywhere(
        comm,
        hpccoll.ArgumentError,
        r"out: expected shape \(3, 5\)",
        lambda: hpccoll.permute(x, comm, perm=[], out=np.ones(3)),
    )
    for bad in (np.array(["a", "b"]), np.ones(2, ">f8")):
        raises_everywhere(
            comm,
            hpccoll.DTypeError,
            "x: expected a native-byte-order dtype",
            lambda: hpccoll.permute(bad, comm, perm=[]),
        )


@pytest.mark.mpi(min_size=2)
def test_permute_check_mode_mismatch(comm):
    """In check mode, ranks whose shapes, dtypes or perms differ raise MismatchError on every rank."""
    checked = hpccoll.Communicator(comm.mpi, check=True)
    try:
        r, P = comm.rank, comm.size
        ring = [(q, (q + 1) % P) for q in range(P)]
        cases = [
            (np.ones((3, 4 + (r == 1))), ring),
            (np.ones(4, np.float32 if r == 1 else np.float64), ring),
            (np.ones(4), ring if r != 1 else [(0, 1)]),
        ]
        for x, perm in cases:
            raises_everywhere(
                checked,
                hpccoll.MismatchError,
                None,
                lambda: hpccoll.permute(x, checked, perm=perm),
                same_message=False,
            )
        # the same messages named two ways: permute(perm) meets permute_adjoint(perm reversed), in any order
        G = stack(comm)
        pipe = [(i, i + 1) for i in range(P - 1)]
        y = (
            hpccoll.permute(G[r], checked, perm=pipe)
            if r % 2
            else hpccoll.permute_adjoint(G[r], checked, perm=reversed_(pipe)[::-1])
        )
        assert_same(y, reference(G, pipe, r), comm)
    finally:
        checked.free()


def test_permute_node_shared_field(comm):
    """With shm named, a field from shared_empty is read from the sender's node-shared memory."""
    c = hpccoll.Communicator(comm.mpi, transport="shm")
    try:
        r = c.rank
        G = stack(c)
        u = c.shared_empty(SHAPE)
        u[...] = G[r]
        for perm in perms(c.size):
            out = np.empty(SHAPE)
            hpccoll.permute(u, c, perm=perm, out=out)
            assert_same(out, reference(G, perm, r), c)
    finally:
        c.free()


def test_permute_over_nccl_standin(gpu, runtime):  # noqa: F811 (the fixtures imported above)
    """CuPy arrays over NCCL (the CPU stand-in): grouped ncclSend/ncclRecv, no all-to-all."""
    r = gpu.rank
    G, H = stack(gpu), stack(gpu, np.complex64, (4,), seed=3)
    for perm in perms(gpu.size):
        got = hpccoll.permute(dev(G[r]), gpu, perm=perm)
        assert_same(host(got), reference(G, perm, r), gpu)
        outs = [dev(np.empty_like(G[r])), dev(np.empty_like(H[r]))]
        hpccoll.permute_adjoint([dev(G[r]), dev(H[r])], gpu, perm=perm, out=outs, async_op=True).wait()
        assert_same(host(outs[0]), reference(G, reversed_(perm), r), gpu)
        assert_same(host(outs[1]), reference(H, reversed_(perm), r), gpu)
    if gpu.size > 1:
        names = {call[0] for call in calls(gpu)}
        agree(gpu, {"send", "recv"} <= names and "alltoall" not in names, str(names))


@pytest.mark.parametrize("transport", ["staged", "cuda_mpi"])
@pytest.mark.parametrize("async_op", [False, True])
def test_permute_staged_and_cuda_mpi_standin(fresh, runtime, transport, async_op):  # noqa: F811
    """CuPy arrays through host memory (staged) and device pointers handed to MPI (cuda_mpi), on the stand-in."""
    c = fresh(transport=transport)
    r = c.rank
    G = stack(c, np.int64)
    for perm in perms(c.size):
        got = hpccoll.permute(dev(G[r]), c, perm=perm, async_op=async_op)
        got = got.wait() if async_op else got
        assert_same(host(got), reference(G, perm, r), c)
