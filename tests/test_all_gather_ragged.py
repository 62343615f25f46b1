"""``all_gather(x, axis=None)``: one array per rank, shapes differing in any dimension, and its adjoint.

The reference is mpi4py's lowercase (pickled) ``allgather`` of the same
arrays. Every test makes all its collective calls before its first
assertion, or checks through ``agree``/``raises_everywhere``, so one rank's
failure fails every rank instead of leaving them waiting.
"""

import numpy as np
import pytest
import standin_cupy as cp
import standin_nccl as standin
from conftest import agree, assert_same, make, raises_everywhere
from test_nccl_standin import calls, dev, fresh, gpu, host, runtime  # noqa: F401 - fixtures

import hpccoll
from hpccoll import ArgumentError, DTypeError, MismatchError

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - a test dependency
    ml_dtypes = None

pytestmark = pytest.mark.mpi

#: Rank r's shape is SHAPES[r % 5]: every pair of ranks differs in ndim or in every extent; 0-D and empty included.
SHAPES = [(3, 1, 2), (), (0, 4), (2, 5, 1, 3), (7,)]
DTYPES = ["float32", "complex128", "int8", "bool"] + (["bfloat16"] if ml_dtypes is not None else [])


def dtype_of(name):
    return np.dtype(getattr(ml_dtypes, name)) if name == "bfloat16" else np.dtype(name)


def shape_of(rank, big=False):
    return (300, 5 + rank) if big else SHAPES[rank % len(SHAPES)]


@pytest.fixture(scope="module")
def comms(comm):
    """One communicator per (transport, check mode), made on first use, freed at the end."""
    made = {}

    def get(transport, check):
        if (transport, check) not in made:
            made[transport, check] = hpccoll.Communicator(comm.mpi, transport=transport, check=check)
        return made[transport, check]

    yield get
    for c in made.values():
        c.free()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transport", ["mpi", "shm"])
@pytest.mark.parametrize("check", [False, True], ids=["plain", "check"])
@pytest.mark.parametrize("big", [False, True], ids=["small", "large"])
def test_matches_mpi4py_allgather(comms, dtype, transport, check, big):
    c = comms(transport, check)
    x = make(shape_of(c.rank, big), dtype_of(dtype), seed=10 + c.rank)
    got = hpccoll.all_gather(x, c, axis=None)
    want = c.mpi.allgather(x)
    agree(c, lambda: type(got) is list and len(got) == c.size)
    for g, w in zip(got, want):
        assert_same(g, w, c)
    agree(c, not any(np.may_share_memory(g, x) for g in got), "a result aliases x")


def test_non_contiguous_input_and_0d(comm):
    base = make((4, 6), "float64", seed=comm.rank)
    x = base[::2, ::3] if comm.rank % 2 else np.float64(comm.rank)[()]
    x = np.asarray(x)
    got = hpccoll.all_gather(x, comm, axis=None)
    want = comm.mpi.allgather(x.copy())
    for g, w in zip(got, want):
        assert_same(g, w, comm)


def test_every_rank_empty(comm):
    x = np.zeros((comm.rank, 0, 2), np.int8)
    got = hpccoll.all_gather(x, comm, axis=None)
    agree(comm, lambda: [g.shape for g in got] == [(q, 0, 2) for q in range(comm.size)] and got[0].dtype == np.int8)


@pytest.mark.parametrize("check", [False, True], ids=["plain", "check"])
def test_out_list(comms, check):
    c = comms("mpi", check)
    x = make(shape_of(c.rank), np.float32, seed=c.rank)
    outs = [np.full(shape_of(q), -1, np.float32) for q in range(c.size)]
    got = hpccoll.all_gather(x, c, axis=None, out=outs)
    want = c.mpi.allgather(x)
    agree(c, lambda: all(g is o for g, o in zip(got, outs)), "out's arrays are not the result")
    for g, w in zip(got, want):
        assert_same(g, w, c)


@pytest.mark.parametrize("transport", ["mpi", "shm"])
def test_async(comms, transport):
    c = comms(transport, False)
    x = make(shape_of(c.rank, big=True), np.complex128, seed=c.rank)
    req = hpccoll.all_gather(x, c, axis=None, async_op=True)
    ys = [make(shape_of(q, big=True), np.complex128, seed=100 * c.rank + q, kind="exact") for q in range(c.size)]
    req2 = hpccoll.all_gather_adjoint(ys, c, axis=None, async_op=True)
    got, g = req.wait(), req2.wait()
    want = c.mpi.allgather(x)
    for a, w in zip(got, want):
        assert_same(a, w, c)
    every = c.mpi.allgather(ys)
    assert_same(g, sum(other[c.rank] for other in every), c)


# --------------------------------------------------------------------------- errors, on every rank alike


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("check", [False, True], ids=["plain", "check"])
def test_dtype_mismatch_raises_everywhere(comms, check):
    c = comms("mpi", check)
    x = np.zeros(shape_of(c.rank), np.float32 if c.rank == 0 else np.float64)
    msg = raises_everywhere(c, MismatchError, None, lambda: hpccoll.all_gather(x, c, axis=None))
    assert "float32" in msg and "float64" in msg


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("check", [False, True], ids=["plain", "check"])
def test_one_rank_bad_dtype_raises_everywhere(comms, check):
    c = comms("mpi", check)
    x = np.zeros(3, object if c.rank == 1 else np.float32)
    raises_everywhere(c, DTypeError, "rank 1|x", lambda: hpccoll.all_gather(x, c, axis=None), same_message=False)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("check", [False, True], ids=["plain", "check"])
def test_wrong_out_shape_of_another_rank_raises_everywhere(comms, check):
    c = comms("mpi", check)
    x = np.zeros(shape_of(c.rank), np.float32)
    outs = [np.zeros(shape_of(q), np.float32) for q in range(c.size)]
    if c.rank == 0:
        outs[1] = np.zeros((9, 9), np.float32)  # rank 1's x is 0-D
    msg = raises_everywhere(
        c, ArgumentError, "out", lambda: hpccoll.all_gather(x, c, axis=None, out=outs), same_message=False
    )
    assert "out[1]" in msg or "rank 0's out" in msg


@pytest.mark.parametrize(
    "kwargs,x,match",
    [
        ({"sizes": [1]}, np.zeros(1), "sizes: expected None with axis=None"),
        ({}, [np.zeros(1), np.zeros(2)], "x: expected one array with axis=None; got a list of 2"),
        ({"out": "shared"}, np.zeros(1), "out: expected None or a list"),
        ({"out": [np.zeros(1)] * 7}, np.zeros(1), "out: expected None or a list of .* arrays"),
        ({"out": "own"}, np.zeros(3), r"out\[.*\]: expected shape \(3,\)"),
    ],
    ids=["sizes", "list", "shared", "out-length", "out-own-shape"],
)
def test_refusals(comm, kwargs, x, match):
    own = kwargs.get("out") == "own"
    if own:  # each rank's own entry is wrong: the message names its index
        kwargs = {"out": [np.zeros(2) for _ in range(comm.size)]}
    if "sizes" in kwargs:
        kwargs["sizes"] = [1] * comm.size
    raises_everywhere(
        comm, ArgumentError, match, lambda: hpccoll.all_gather(x, comm, axis=None, **kwargs), same_message=not own
    )


# --------------------------------------------------------------------------- the adjoint


@pytest.mark.parametrize("dtype", ["float32", "complex128", "int8", "float64"])
@pytest.mark.parametrize("transport", ["mpi", "shm"])
@pytest.mark.parametrize("check", [False, True], ids=["plain", "check"])
@pytest.mark.parametrize("big", [False, True], ids=["small", "large"])
def test_adjoint_is_the_sum_of_each_ranks_entry(comms, dtype, transport, check, big):
    c = comms(transport, check)
    ys = [make(shape_of(q, big), dtype, seed=1000 * c.rank + q, kind="exact") for q in range(c.size)]
    got = hpccoll.all_gather_adjoint(ys, c, axis=None)
    every = c.mpi.allgather(ys)
    wide = np.complex128 if np.dtype(dtype).kind == "c" else np.float64
    want = np.sum([other[c.rank] for other in every], axis=0, dtype=wide).astype(dtype)
    assert_same(got, np.asarray(want).reshape(shape_of(c.rank, big)), c)


def test_adjoint_out(comm):
    ys = [make(shape_of(q), np.float64, seed=7 * comm.rank + q, kind="exact") for q in range(comm.size)]
    out = np.empty(shape_of(comm.rank))
    inner = np.empty((2,) + shape_of(comm.rank))[1, ...]  # a C-contiguous view: filled in place
    got = hpccoll.all_gather_adjoint(ys, comm, axis=None, out=out)
    got2 = hpccoll.all_gather_adjoint(ys, comm, axis=None, out=inner)
    want = sum(other[comm.rank] for other in comm.mpi.allgather(ys))
    agree(comm, got is out and got2 is inner)
    assert_same(got, np.asarray(want), comm)
    assert_same(got2, np.asarray(want), comm)


@pytest.mark.parametrize("dtype", ["float64", "complex128"])
@pytest.mark.parametrize("check", [False, True], ids=["plain", "check"])
def test_dot(comms, dtype, check):
    """sum over ranks of <all_gather(x), ys> == sum over ranks of <x, all_gather_adjoint(ys)>."""
    c = comms("mpi", check)
    x = make(shape_of(c.rank), dtype, seed=c.rank)
    ys = [make(shape_of(q), dtype, seed=50 + 13 * c.rank + q) for q in range(c.size)]
    gathered = hpccoll.all_gather(x, c, axis=None)
    back = hpccoll.all_gather_adjoint(ys, c, axis=None)
    lhs = c.mpi.allreduce(sum(np.vdot(y, g) for y, g in zip(ys, gathered)))
    rhs = c.mpi.allreduce(np.vdot(back, x))
    agree(c, lambda: np.isclose(lhs, rhs, rtol=1e-12, atol=1e-12), lambda: f"{lhs} != {rhs}")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("check", [False, True], ids=["plain", "check"])
def test_adjoint_shape_disagreement_raises_everywhere(comms, check):
    c = comms("mpi", check)
    ys = [np.zeros(shape_of(q)) for q in range(c.size)]
    if c.rank == 1:
        ys[0] = np.zeros((4,))  # the totals differ too
    raises_everywhere(  # the message says this rank's shapes
        c, MismatchError, None, lambda: hpccoll.all_gather_adjoint(ys, c, axis=None), same_message=check
    )


@pytest.mark.mpi(min_size=2)
def test_adjoint_same_totals_other_shapes_raise(comm):
    ys = [np.zeros((2, 3)) for _ in range(comm.size)]
    if comm.rank == 1:
        ys[0] = np.zeros((3, 2))
    raises_everywhere(
        comm,
        MismatchError,
        "ranks 0 and 1",
        lambda: hpccoll.all_gather_adjoint(ys, comm, axis=None),
        same_message=False,
    )


@pytest.mark.parametrize(
    "ys,match",
    [
        (lambda n: [np.zeros(1)] * (n + 1), "y: expected a list of .* arrays with axis=None"),
        (lambda n: np.zeros(n), "y: expected a list of"),
        (lambda n: [np.zeros(1, np.float32)] + [np.zeros(1)] * (n - 1) if n > 1 else "a", "y: expected"),
    ],
    ids=["length", "array", "dtypes"],
)
def test_adjoint_refusals(comm, ys, match):
    y = ys(comm.size)
    raises_everywhere(comm, (ArgumentError, DTypeError), match, lambda: hpccoll.all_gather_adjoint(y, comm, axis=None))


def test_adjoint_sizes_refused(comm):
    ys = [np.zeros(1)] * comm.size
    raises_everywhere(
        comm, ArgumentError, "sizes: expected None", lambda: hpccoll.all_gather_adjoint(ys, comm, axis=None, sizes=[1])
    )


# --------------------------------------------------------------------------- CuPy, on the stand-in GPU


@pytest.mark.parametrize("dtype", ["float32", "complex128", "bool"])
def test_cupy_over_nccl_standin(gpu, dtype):  # noqa: F811 - the fixture
    x = make(shape_of(gpu.rank), dtype, seed=gpu.rank)
    got = hpccoll.all_gather(dev(x), gpu, axis=None)
    ys = [make(shape_of(q), dtype, seed=9 * gpu.rank + q, kind="exact") for q in range(gpu.size)]
    back = hpccoll.all_gather_adjoint(dev(ys), gpu, axis=None) if dtype != "bool" else None
    req = hpccoll.all_gather(dev(x), gpu, axis=None, async_op=True)
    later = req.wait()
    want = gpu.mpi.allgather(x)
    every = gpu.mpi.allgather(ys)
    agree(gpu, lambda: all(isinstance(g, cp.ndarray) for g in got))
    for g, h, w in zip(host(got), host(later), want):
        assert_same(g, w, gpu)
        assert_same(h, w, gpu)
    if back is not None:
        assert_same(host(back), np.sum([o[gpu.rank] for o in every], axis=0).astype(dtype), gpu)
    if gpu.size > 1:
        moved = calls(gpu, "broadcast")  # NCCL has no uneven all-gather: one broadcast per rank, of bytes
        agree(gpu, lambda: moved and all(call[2] == standin.NCCL_UINT8 for call in moved), lambda: f"{moved}")


# --------------------------------------------------------------------------- the operator form


def test_operator_form(comm):
    """``AllGather(comm, axis=None)`` is the pair: its forward and adjoint are the functions'."""
    x = make(shape_of(comm.rank), np.float64, seed=comm.rank)
    ys = [make(shape_of(q), np.float64, seed=20 + 5 * comm.rank + q) for q in range(comm.size)]
    op = hpccoll.AllGather(comm, axis=None)
    got, back = op(x), op.H(ys)
    want, want_back = hpccoll.all_gather(x, comm, axis=None), hpccoll.all_gather_adjoint(ys, comm, axis=None)
    agree(comm, lambda: type(got) is list and len(got) == comm.size)
    for g, w in zip(got, want):
        assert_same(g, w, comm)
    assert_same(back, want_back, comm)
