"""MPI's logical and bitwise reductions (land, lor, lxor, band, bor, bxor) on the host transports.

Against NumPy references with MPI's semantics: the logical ops on integers treat nonzero as true and
give 0 or 1 in the input's dtype; on bool the bitwise ops are the logical ones. Floating and complex
dtypes are refused as MPI refuses them, adjoints as non-linear, and every error names MPI ops by name.
The NCCL stand-in's share is in tests/test_nccl_standin.py.
"""

import numpy as np
import pytest
from conftest import agree, assert_same, make, raises_everywhere
from mpi4py import MPI

import hpccoll

pytestmark = pytest.mark.mpi

LOGICAL = ["land", "lor", "lxor"]
BITWISE = ["band", "bor", "bxor"]
OPS = LOGICAL + BITWISE
MPI_OPS = {name: getattr(MPI, name.upper()) for name in OPS}
DTYPES = [np.dtype(n) for n in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")]
REFUSED_DTYPES = ["float16", "float32", "float64", "complex64", "complex128"]


def logical_reference(stack, op):
    """MPI's ``op`` over the leading rank axis of ``stack``, in ``stack``'s dtype."""
    dtype = stack.dtype
    if dtype == np.bool_ or op in LOGICAL:
        truth = stack != 0
        kind = op[1:]  # "and", "or", "xor"
        if kind == "and":
            got = truth.all(axis=0)
        elif kind == "or":
            got = truth.any(axis=0)
        else:
            got = truth.sum(axis=0) % 2 == 1
        return got.astype(dtype)
    ufunc = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op]
    return ufunc.reduce(stack, axis=0)


def data(size, shape, dtype, seed):
    """Every rank's data (leading rank axis): zeros and nonzeros, with multiples of 256 among them
    where the dtype holds them (nonzero values whose low byte is zero), and the dtype's extremes."""
    stack = make((size,) + shape, dtype, seed)
    if dtype != np.bool_ and stack[0].size >= 3:
        flat = stack.reshape(size, -1)
        info = np.iinfo(dtype)
        if info.max >= 256:
            flat[:, ::3] *= 256
        flat[:, 1] = info.max
        flat[:, -1] = info.min if info.min else info.max
        flat[0, 1] = 0
    return stack


def bounds(sizes, rank):
    lo = sum(sizes[:rank])
    return slice(lo, lo + sizes[rank])


# --------------------------------------------------------------------------- results


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_form_on_host_mpi(comm, dtype, op):
    stack = data(comm.size, (2 * comm.size + 1, 3), dtype, seed=5)
    x = stack[comm.rank]
    want = logical_reference(stack, op)
    sizes = hpccoll.split_sizes(x.shape[0], comm.size)
    reduced = hpccoll.all_reduce(x, comm, op=op)
    by_mpi_op = hpccoll.all_reduce(x, comm, op=MPI_OPS[op])
    y = x.copy()
    in_place = hpccoll.all_reduce(y, comm, op=op, out=y)
    strided = hpccoll.all_reduce(np.asfortranarray(x), comm, op=op)
    scattered = hpccoll.reduce_scatter(x, comm, op=op)
    scattered_mpi = hpccoll.reduce_scatter(x, comm, op=MPI_OPS[op])
    pending = hpccoll.all_reduce(x, comm, op=op, async_op=True)
    pending_scatter = hpccoll.reduce_scatter(x, comm, op=op, async_op=True)
    waited, waited_scatter = pending.wait(), pending_scatter.wait()
    assert_same(reduced, want, comm)
    assert_same(by_mpi_op, want, comm)
    agree(comm, in_place is y, "out=y did not return y")
    assert_same(y, want, comm)
    assert_same(strided, want, comm)
    assert_same(waited, want, comm)
    assert_same(scattered, want[bounds(sizes, comm.rank)], comm)
    assert_same(scattered_mpi, want[bounds(sizes, comm.rank)], comm)
    assert_same(waited_scatter, want[bounds(sizes, comm.rank)], comm)


@pytest.mark.parametrize("op", OPS)
def test_lists_of_mixed_dtypes(comm, op):
    """One call for a list of bool and integer arrays (one group per dtype), blocking and not."""
    stacks = [
        data(comm.size, shape, np.dtype(d), seed=9 + i)
        for i, (d, shape) in enumerate(
            [("bool", (4,)), ("int32", (2, 3)), ("uint8", (5,)), ("int64", ()), ("bool", (0,)), ("uint16", (7,))]
        )
    ]
    xs = [np.array(s[comm.rank]) for s in stacks]  # 0-D: an array, not a NumPy scalar
    got = hpccoll.all_reduce(xs, comm, op=MPI_OPS[op])
    later = hpccoll.all_reduce(xs, comm, op=op, async_op=True).wait()
    outs = [np.empty_like(a) for a in xs]
    into = hpccoll.all_reduce(xs, comm, op=op, out=outs)
    for g, lt, o, s in zip(got, later, into, stacks):
        want = logical_reference(s, op)
        assert_same(g, want, comm)
        assert_same(lt, want, comm)
        assert_same(o, want, comm)
    agree(comm, all(a is b for a, b in zip(into, outs)), "out= list not returned")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ["bool", "int16", "uint64"])
def test_shm_transport_and_shared_results(comm, dtype, op):
    """shm reduces these ops itself in NumPy (and over host MPI between nodes); out='shared' too."""
    dtype = np.dtype(dtype)
    stack = data(comm.size, (3 * comm.size + 2, 4), dtype, seed=13)
    x = stack[comm.rank]
    want = logical_reference(stack, op)
    sizes = hpccoll.split_sizes(x.shape[0], comm.size)
    with hpccoll.Communicator(comm.mpi, transport="shm") as c:
        reduced = hpccoll.all_reduce(x, c, op=op)
        scattered = hpccoll.reduce_scatter(x, c, op=MPI_OPS[op])
        shared = hpccoll.all_reduce(x, c, op=op, out="shared")
        assert_same(reduced, want, c)
        assert_same(scattered, want[bounds(sizes, c.rank)], c)
        assert_same(np.asarray(shared), want, c)


@pytest.mark.parametrize("op", LOGICAL)
def test_logical_results_are_zero_or_one_in_the_input_dtype(comm, op):
    """Even over one rank (nothing travels): 5 and 256 are true, stored as 1."""
    x = np.array([0, 5, 256, -7], np.int32)
    got = hpccoll.all_reduce(x, comm, op=op)
    odd = comm.size % 2
    want = {"land": [0, 1, 1, 1], "lor": [0, 1, 1, 1], "lxor": [0, odd, odd, odd]}[op]
    assert_same(got, np.array(want, np.int32), comm)


def test_ops_are_listed_and_benchable():
    from hpccoll import _bench

    for op in OPS:
        assert op in hpccoll.OPS
        assert _bench.parser().parse_args(["-o", op]).op == op


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", REFUSED_DTYPES)
def test_floating_and_complex_refused(comm, dtype, op):
    x = np.ones(3, dtype)
    label = f"MPI.{op.upper()}"
    kind = "logical" if op in LOGICAL else "bitwise"
    match = rf"op='{op}' \({label}\): expected a bool or integer dtype \(MPI's {kind} ops .*\); got {dtype}"
    raises_everywhere(comm, hpccoll.DTypeError, match, lambda: hpccoll.all_reduce(x, comm, op=MPI_OPS[op]))
    raises_everywhere(comm, hpccoll.DTypeError, match, lambda: hpccoll.reduce_scatter(x, comm, op=op))
    raises_everywhere(comm, hpccoll.DTypeError, match, lambda: hpccoll.all_reduce([x], comm, op=op))


@pytest.mark.parametrize("name", ["MAXLOC", "MINLOC", "REPLACE", "NO_OP"])
def test_refused_mpi_ops_are_named(comm, name):
    x = np.ones(3, np.int32)
    msg = raises_everywhere(
        comm, hpccoll.ArgumentError, rf"got MPI\.{name}$", lambda: hpccoll.all_reduce(x, comm, op=getattr(MPI, name))
    )
    assert "or MPI.SUM/PROD/MAX/MIN/LAND/LOR/LXOR/BAND/BOR/BXOR; got" in msg and "0x" not in msg


def test_user_defined_op_is_named(comm):
    op = MPI.Op.Create(lambda a, b, t: None, commute=True)
    try:
        raises_everywhere(
            comm,
            hpccoll.ArgumentError,
            "got a user-defined MPI.Op$",
            lambda: hpccoll.reduce_scatter(np.ones(comm.size), comm, op=op),
        )
    finally:
        op.Free()


@pytest.mark.parametrize("op", OPS)
def test_adjoints_refused(comm, op):
    """Not linear: the adjoints refuse them (with the op's name), as they refuse max, min and prod."""
    y = np.ones(2, np.int32)
    raises_everywhere(comm, hpccoll.UnsupportedOpError, op, lambda: hpccoll.all_reduce_adjoint(y, comm, op=MPI_OPS[op]))
    raises_everywhere(comm, hpccoll.UnsupportedOpError, op, lambda: hpccoll.reduce_scatter_adjoint(y, comm, op=op))


def test_check_mode_descriptor_carries_the_op(comm):
    """Ranks that pass different ops raise MismatchError naming the op, on every rank."""
    if comm.size < 2:
        with hpccoll.Communicator(comm.mpi, check=True) as c:
            got = hpccoll.all_reduce(np.array([True, False]), c, op=MPI.LXOR)
        assert_same(got, np.array([True, False]), comm)
        return
    op = "land" if comm.rank == 0 else "lor"
    with hpccoll.Communicator(comm.mpi, check=True) as c:
        raises_everywhere(
            c, hpccoll.MismatchError, "op", lambda: hpccoll.all_reduce(np.ones(2, bool), c, op=op), same_message=False
        )
