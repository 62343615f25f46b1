"""shift and shift_adjoint: rank r gets rank (r - offset) mod P's block, against NumPy, at any rank count.

Data is a global array with a leading rank axis made from a seed on every rank; each rank shifts its
slice and compares with the slice of the rank it should have received, bit for bit (pure data movement).
"""

import numpy as np
import pytest
from conftest import agree, assert_same, make, raises_everywhere
from test_nccl_standin import calls, dev, fresh, gpu, host, runtime  # noqa: F401 (fixtures)

import hpccoll

pytestmark = pytest.mark.mpi

DTYPES = ["float64", "float32", "float16", "complex128", "int8", "uint64", "bool"]
SHAPE = (3, 5)


def stack(comm, dtype=np.float64, shape=SHAPE, seed=7):
    return make((comm.size,) + shape, dtype, seed)


def offsets(P):
    return sorted({1, -1, 2, P, P + 1, -3, 0})


@pytest.mark.parametrize("dtype", DTYPES)
def test_shift_against_numpy(comm, dtype):
    G = stack(comm, dtype)
    P, r = comm.size, comm.rank
    for offset in offsets(P):
        y = hpccoll.shift(G[r], comm, offset=offset)
        assert_same(y, G[(r - offset) % P], comm)
        assert_same(hpccoll.shift_adjoint(y, comm, offset=offset), G[r], comm)
    agree(comm, np.array_equal(G, stack(comm, dtype)), "the input was modified")


@pytest.mark.parametrize("form", ["out", "in place", "fortran", "strided out", "async", "async in place"])
def test_shift_forms(comm, form):
    G = stack(comm)
    P, r = comm.size, comm.rank
    x = G[r].copy()
    want = G[(r - 2) % P]
    if form == "out":
        out = np.full(SHAPE, np.nan)
        got = hpccoll.shift(x, comm, offset=2, out=out)
        agree(comm, got is out, "out was not returned")
    elif form == "in place":
        got = hpccoll.shift(x, comm, offset=2, out=x)
        agree(comm, got is x, "out=x was not returned")
    elif form == "fortran":
        got = hpccoll.shift(np.asfortranarray(x), comm, offset=2)
    elif form == "strided out":
        big = np.zeros((SHAPE[0], 2 * SHAPE[1]))
        got = hpccoll.shift(x, comm, offset=2, out=big[:, ::2])
        agree(comm, not big[:, 1::2].any(), "the gaps of a strided out were written")
    elif form == "async":
        got = hpccoll.shift(x, comm, offset=2, async_op=True).wait()
    else:
        req = hpccoll.shift(x, comm, offset=2, out=x, async_op=True)
        got = req.wait()
    assert_same(np.ascontiguousarray(got), want, comm)
    if form not in ("in place", "async in place"):
        assert_same(x, G[r], comm)


def test_shift_lists(comm):
    P, r = comm.size, comm.rank
    G, H = stack(comm), stack(comm, np.int32, (4,), seed=9)
    E = np.zeros((P, 0, 2))
    xs = [G[r], H[r], E[r]]
    got = hpccoll.shift(xs, comm, offset=-1)
    for a, W in zip(got, (G, H, E)):
        assert_same(a, W[(r + 1) % P], comm)
    outs = [np.empty_like(a) for a in xs]
    res = hpccoll.shift(tuple(xs), comm, out=outs, async_op=True).wait()
    agree(comm, all(a is b for a, b in zip(res, outs)), "the outs were not returned")
    for a, W in zip(outs, (G, H, E)):
        assert_same(a, W[(r - 1) % P], comm)


def test_shift_is_its_adjoints_adjoint(comm):
    """<shift(x), y> summed over ranks == <x, shift_adjoint(y)> summed over ranks (the dot test)."""
    P, r = comm.size, comm.rank
    X, Y = make((P, 6), np.float64, 1), make((P, 6), np.float64, 2)
    for offset in (1, -2, 3):
        lhs = comm.mpi.allreduce(float(hpccoll.shift(X[r], comm, offset=offset) @ Y[r]))
        rhs = comm.mpi.allreduce(float(X[r] @ hpccoll.shift_adjoint(Y[r], comm, offset=offset)))
        agree(comm, abs(lhs - rhs) <= 1e-12 * max(1.0, abs(lhs)), f"offset {offset}: {lhs} != {rhs}")
    agree(comm, hpccoll.adjoint_of(hpccoll.shift) is hpccoll.shift_adjoint)
    agree(comm, hpccoll.adjoint_of(hpccoll.shift_adjoint) is hpccoll.shift)


def test_shift_operator(comm):
    P, r = comm.size, comm.rank
    G = stack(comm)
    op = hpccoll.Shift(comm, offset=3)
    assert_same(op.forward(G[r]), G[(r - 3) % P], comm)
    assert_same(op.adjoint(G[r]), G[(r + 3) % P], comm)
    assert_same(op.H.forward(G[r]), G[(r + 3) % P], comm)
    agree(comm, "offset=3" in repr(op), repr(op))


def test_shift_plan(comm):
    P, r = comm.size, comm.rank
    G = stack(comm)
    x, out = G[r].copy(), np.empty(SHAPE)
    p = hpccoll.plan(hpccoll.shift, x, comm, out=out, offset=1)
    for k in range(3):  # the plan reads x again on every call
        x[...] = G[(r + k) % P]
        agree(comm, p() is out, "the plan did not return its out")
        assert_same(out, G[(r - 1 + k) % P], comm)
    if P > 1 and comm.transport_for(x).name == "mpi":
        agree(comm, p.methods in (("persistent",), ("blocking",)), f"methods {p.methods}")
    p.free()
    inplace = hpccoll.plan(hpccoll.shift_adjoint, x, comm, out=x)
    x[...] = G[r]
    inplace()
    assert_same(x, G[(r + 1) % P], comm)
    inplace.free()


def test_shift_bad_arguments(comm):
    x = np.ones(SHAPE)
    for offset in (1.0, True, "1", None):
        raises_everywhere(
            comm, hpccoll.ArgumentError, "offset: expected an int", lambda: hpccoll.shift(x, comm, offset=offset)
        )
    raises_everywhere(
        comm, hpccoll.ArgumentError, r"out: expected shape \(3, 5\)", lambda: hpccoll.shift(x, comm, out=np.ones(3))
    )
    base = np.ones(20)
    overlapping = base[5:].reshape(SHAPE)  # shares memory with x below, not the in-place layout
    raises_everywhere(
        comm,
        hpccoll.ArgumentError,
        "out: expected memory separate",
        lambda: hpccoll.shift(base[:15].reshape(SHAPE), comm, out=overlapping),
    )
    raises_everywhere(comm, hpccoll.ArgumentError, "offset", lambda: hpccoll.Shift(comm, offset=0.5))
    for bad in (np.array(["a", "b"]), np.array([object(), 1]), np.ones(2, ">f8")):  # the common branch too
        raises_everywhere(
            comm, hpccoll.DTypeError, "x: expected a native-byte-order dtype", lambda: hpccoll.shift(bad, comm)
        )


@pytest.mark.mpi(min_size=2)
def test_shift_check_mode_mismatch(comm):
    """In check mode, ranks whose shapes, dtypes or offsets differ raise MismatchError on every rank."""
    checked = hpccoll.Communicator(comm.mpi, check=True)
    try:
        r = comm.rank
        cases = [
            (np.ones((3, 4 + (r == 1))), 1),
            (np.ones(4, np.float32 if r == 1 else np.float64), 1),
            (np.ones(4), 1 + (r == 1)),
        ]
        for x, offset in cases:
            raises_everywhere(
                checked,
                hpccoll.MismatchError,
                None,
                lambda: hpccoll.shift(x, checked, offset=offset),
                same_message=False,
            )
        y = hpccoll.shift(np.full(4, float(r)), checked)
        agree(comm, np.array_equal(y, np.full(4, float((r - 1) % comm.size))), str(y))
    finally:
        checked.free()


@pytest.mark.mpi(min_size=2)
def test_shift_check_mode_compares_the_messages_not_the_name(comm):
    """``shift(offset=k)`` and ``shift_adjoint(offset=-k)`` send the same messages: check mode lets them meet.

    It used to name its descriptor after the public call and raise MismatchError here; ``shift`` against
    ``shift_adjoint`` with the same offset, other messages from three ranks on, still disagree.
    """
    checked = hpccoll.Communicator(comm.mpi, check=True)
    try:
        P, r = comm.size, comm.rank
        G = stack(comm)
        for k in (1, 2, -1):
            x = G[r].copy()
            y = hpccoll.shift(x, checked, offset=k) if r % 2 == 0 else hpccoll.shift_adjoint(x, checked, offset=-k)
            assert_same(y, G[(r - k) % P], comm)
        if P > 2:
            raises_everywhere(
                checked,
                hpccoll.MismatchError,
                "rank 0 has offset=1 but rank 1 has offset=",
                lambda: (hpccoll.shift if r == 0 else hpccoll.shift_adjoint)(G[r], checked, offset=1),
                same_message=False,
            )
    finally:
        checked.free()


def test_shift_node_shared_field_read_in_place(comm):
    """With shm named, a field from shared_empty is read from the sender's node-shared memory."""
    c = hpccoll.Communicator(comm.mpi, transport="shm")
    try:
        P, r = c.size, c.rank
        G = stack(c)
        u = c.shared_empty(SHAPE)
        u[...] = G[r]
        out = np.empty(SHAPE)
        hpccoll.shift(u, c, out=out)
        assert_same(out, G[(r - 1) % P], c)
    finally:
        c.free()


def test_shift_over_nccl_standin(gpu, runtime):  # noqa: F811 (the fixtures imported above)
    """CuPy arrays over NCCL (the CPU stand-in): one grouped ncclSend/ncclRecv per array, no all-to-all."""
    P, r = gpu.size, gpu.rank
    G, H = stack(gpu), stack(gpu, np.complex64, (4,), seed=3)
    got = hpccoll.shift(dev(G[r]), gpu, offset=-1)
    assert_same(host(got), G[(r + 1) % P], gpu)
    outs = [dev(np.empty_like(G[r])), dev(np.empty_like(H[r]))]
    hpccoll.shift([dev(G[r]), dev(H[r])], gpu, offset=1, out=outs, async_op=True).wait()
    assert_same(host(outs[0]), G[(r - 1) % P], gpu)
    assert_same(host(outs[1]), H[(r - 1) % P], gpu)
    x = dev(G[r])
    hpccoll.shift(x, gpu, offset=1, out=x)
    assert_same(host(x), G[(r - 1) % P], gpu)
    if P > 1:
        names = {call[0] for call in calls(gpu)}
        agree(gpu, {"send", "recv"} <= names and "alltoall" not in names, str(names))


@pytest.mark.parametrize("transport", ["staged", "cuda_mpi"])
@pytest.mark.parametrize("async_op", [False, True])
def test_shift_staged_and_cuda_mpi_standin(fresh, runtime, transport, async_op):  # noqa: F811
    """CuPy arrays through host memory (staged) and device pointers handed to MPI (cuda_mpi), on the stand-in."""
    c = fresh(transport=transport)
    P, r = c.size, c.rank
    G = stack(c, np.int64)
    got = hpccoll.shift(dev(G[r]), c, offset=2, async_op=async_op)
    got = got.wait() if async_op else got
    assert_same(host(got), G[(r - 2) % P], c)
