"""reduce_scatter and all_reduce over every dtype and op, against a NumPy reference."""

import numpy as np
import pytest
from conftest import DTYPE_IDS, DTYPES, LAYOUTS, SIZE_PATTERNS, assert_close, layout, make, reference
from mpi4py import MPI

import hpccoll

pytestmark = pytest.mark.mpi

OPS = ["sum", "prod", "max", "min", "avg"]


def unsupported(dtype, op):
    """The (dtype, op) pairs documented to raise DTypeError."""
    if op == "avg" and dtype.kind in "biu":
        return True
    return dtype.kind == "c" and op in ("max", "min")


def stack_for(comm, shape, dtype, seed):
    """The global data with a leading rank axis, and this rank's slice."""
    stack = make((comm.size,) + shape, dtype, seed)
    return stack, stack[comm.rank]


def block(full, axis, sizes, rank):
    bounds = np.cumsum([0] + list(sizes))
    index = [slice(None)] * full.ndim
    index[axis] = slice(bounds[rank], bounds[rank + 1])
    return full[tuple(index)]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_all_reduce_every_dtype_and_op(comm, dtype, op):
    stack, x = stack_for(comm, (3, 5), dtype, seed=7)
    if unsupported(dtype, op):
        with pytest.raises(hpccoll.DTypeError, match="op="):
            hpccoll.all_reduce(x, comm, op=op)
        return
    before = x.copy()
    got = hpccoll.all_reduce(x, comm, op=op)
    assert_close(got, reference(stack, op))
    np.testing.assert_array_equal(x, before)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_reduce_scatter_every_dtype_and_op(comm, dtype, op):
    stack, x = stack_for(comm, (2 * comm.size + 1, 3), dtype, seed=11)
    if unsupported(dtype, op):
        with pytest.raises(hpccoll.DTypeError, match="op="):
            hpccoll.reduce_scatter(x, comm, op=op)
        return
    got = hpccoll.reduce_scatter(x, comm, op=op)
    sizes = hpccoll.split_sizes(x.shape[0], comm.size)
    assert_close(got, block(reference(stack, op), 0, sizes, comm.rank))


@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
@pytest.mark.parametrize(
    "shape,axis", [((0,), 0), ((4, 0), 1), ((0, 3), -2), ((2, 0, 3), 1), ((2, 3, 0), -1), ((2, 2, 0, 3), 2)]
)
@pytest.mark.parametrize("how", LAYOUTS)
def test_reduce_scatter_axes_layouts_sizes(comm, shape, axis, pattern, how):
    sizes = SIZE_PATTERNS[pattern](comm.size)
    shape = list(shape)
    shape[axis] = sum(sizes)
    stack, x = stack_for(comm, tuple(shape), np.float64, seed=3)
    x = layout(x, how)
    before = x.copy()
    want = block(reference(stack, "sum"), axis % len(shape), sizes, comm.rank)
    got = hpccoll.reduce_scatter(x, comm, axis=axis, sizes=sizes)
    assert_close(got, want)
    np.testing.assert_array_equal(x, before)
    out = layout(np.empty_like(want), how)
    assert hpccoll.reduce_scatter(x, comm, axis=axis, sizes=sizes, out=out) is out
    assert_close(out, want)


@pytest.mark.parametrize("dtype", ["float16", "float32", "int64", "bool"])
@pytest.mark.parametrize("how", LAYOUTS)
def test_all_reduce_layouts_and_out(comm, dtype, how):
    op = "sum" if dtype == "bool" else "max"
    stack, x = stack_for(comm, (3, 4, 2), np.dtype(dtype), seed=5)
    x = layout(x, how)
    want = reference(stack, op)
    out = layout(np.empty_like(want), how)
    assert hpccoll.all_reduce(x, comm, op=op, out=out) is out
    assert_close(out, want)


@pytest.mark.parametrize("dtype", ["float64", "float16", "int32"])
@pytest.mark.parametrize("how", ["C", "strided"])
def test_all_reduce_in_place(comm, dtype, how):
    stack, x = stack_for(comm, (6, 2), np.dtype(dtype), seed=9)
    x = layout(x.copy(), how)
    assert hpccoll.all_reduce(x, comm, out=x) is x
    assert_close(x, reference(stack, "sum"))


def test_zero_dim_and_mpi_ops(comm):
    stack, x = stack_for(comm, (), np.float64, seed=1)
    got = hpccoll.all_reduce(x, comm, op=MPI.MAX)
    assert got.shape == () and got == stack.max()
    assert hpccoll.all_reduce(2, comm, op="prod") == 2**comm.size


@pytest.mark.parametrize("op", ["sum", "avg"])
def test_operators_match_functions(comm, op):
    stack, x = stack_for(comm, (comm.size * 2, 3), np.float32, seed=2)
    rs = hpccoll.ReduceScatter(comm, op=op, axis=0)
    ar = hpccoll.AllReduce(comm, op=op)
    np.testing.assert_array_equal(rs(x), hpccoll.reduce_scatter(x, comm, op=op))
    np.testing.assert_array_equal(ar(x), hpccoll.all_reduce(x, comm, op=op))


@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("async_op", [False, True])
def test_reduce_scatter_in_place(comm, pattern, axis, op, async_op):
    """out is this rank's block of x: the reduction lands there (x is consumed)."""
    sizes = SIZE_PATTERNS[pattern](comm.size)
    shape = [2, 2]
    shape[axis] = sum(sizes)
    stack, x = stack_for(comm, tuple(shape), np.float64, seed=13)
    x = x.copy()
    want = block(reference(stack, op), axis, sizes, comm.rank)
    mine = block(x, axis, sizes, comm.rank)
    got = hpccoll.reduce_scatter(x, comm, op=op, axis=axis, sizes=sizes, out=mine, async_op=async_op)
    assert (got.wait() if async_op else got) is mine
    assert_close(mine, want)


# --------------------------------------------------------------------------- small-integer sums wrap on every MPI

SMALL_INTS = ["int8", "uint8", "int16", "uint16"]


def _wrapping_stack(comm, dtype, n):
    """Values near the top of ``dtype`` (a few near the bottom): any two ranks' sum overflows."""
    info = np.iinfo(dtype)
    stack = np.full((comm.size, n), info.max - 3, dtype=dtype)
    stack[:, 1::3] = info.min + 5 if info.min else info.max // 2 + 7
    stack += np.arange(comm.size, dtype=dtype)[:, None]
    return stack


@pytest.mark.parametrize("dtype", SMALL_INTS)
def test_small_integer_sums_wrap_in_every_form(comm, dtype, monkeypatch):
    """Open MPI's vector kernels saturate 8/16-bit sums of >= 64 elements (ompi#8045); hpccoll wraps like NumPy.

    Every form: the common branches, ``out=``, in place, uneven blocks, lists, non-blocking and shm.
    """
    p, n = comm.size, 96 * comm.size
    stack = _wrapping_stack(comm, dtype, n)
    want = np.add.reduce(stack, axis=0, dtype=dtype)
    x = stack[comm.rank]
    sizes = [(3 * r + 2) % 4 * 32 for r in range(p)]
    sizes[-1] += n - sum(sizes)
    lo = sum(sizes[: comm.rank])
    mine = want[lo : lo + sizes[comm.rank]]
    got = {
        "all_reduce": (hpccoll.all_reduce(x, comm), want),
        "all_reduce out=": (hpccoll.all_reduce(x, comm, out=np.empty_like(x)), want),
        "reduce_scatter": (hpccoll.reduce_scatter(x, comm), want[96 * comm.rank : 96 * (comm.rank + 1)]),
        "reduce_scatter uneven": (hpccoll.reduce_scatter(x, comm, sizes=sizes), mine),
        "all_reduce async": (hpccoll.all_reduce(x, comm, async_op=True).wait(), want),
        "reduce_scatter async": (
            hpccoll.reduce_scatter(x, comm, async_op=True).wait(),
            want[96 * comm.rank : 96 * (comm.rank + 1)],
        ),
        "all_reduce list": (hpccoll.all_reduce([x, x[:64]], comm)[1], want[:64]),
        "reduce_scatter list": (
            hpccoll.reduce_scatter([x, x[: 64 * p]], comm)[1],
            want[: 64 * p][64 * comm.rank : 64 * (comm.rank + 1)],
        ),
        "all_gather adjoint": (hpccoll.all_gather_adjoint(x, comm), want[96 * comm.rank : 96 * (comm.rank + 1)]),
    }
    inplace = x.copy()
    got["all_reduce in place"] = (hpccoll.all_reduce(inplace, comm, out=inplace), want)
    with hpccoll.Communicator(transport="shm") if p > 1 else hpccoll.Communicator() as c:
        got["all_reduce shm"] = (hpccoll.all_reduce(x, c), want)
        got["reduce_scatter shm"] = (hpccoll.reduce_scatter(x, c), want[96 * comm.rank : 96 * (comm.rank + 1)])
    bad = sorted(k for k, (g, w) in got.items() if not (g.dtype == w.dtype and np.array_equal(g, w)))
    assert MPI.COMM_WORLD.allreduce(bad, op=MPI.SUM) == bad * p, f"{dtype} sums differ from NumPy's wrap: {bad}"


def test_saturating_sums_are_widened_to_32_bits(comm, monkeypatch):
    """A transport that declares saturated sums gets them as 32-bit integers (and the result wraps back);
    other ops keep their dtype. Checked on every MPI by declaring it on this run's transport."""
    t = comm.transport_of("numpy", 1)
    monkeypatch.setattr(t, "saturates", frozenset(np.dtype(d) for d in SMALL_INTS))
    seen = []
    real = t.allreduce
    monkeypatch.setattr(t, "allreduce", lambda send, recv, op: (seen.append((recv.dtype, op)), real(send, recv, op)))
    stack = _wrapping_stack(comm, "int16", 8)
    for op, wire in (("sum", np.int32), ("max", np.int16), ("prod", np.int16)):
        seen.clear()
        got = hpccoll.all_reduce(stack[comm.rank], comm, op=op)
        want = (np.add if op == "sum" else np.maximum if op == "max" else np.multiply).reduce(
            stack, axis=0, dtype=np.int16
        )
        assert got.dtype == np.int16 and np.array_equal(got, want), op
        assert comm.size == 1 or seen == [(np.dtype(wire), op)], (op, seen)


def test_the_saturation_probe_agrees_with_the_library():
    """``saturating_sums`` says what this MPI does: a 4096-element MPI_SUM of int8 maxima wraps or saturates."""
    from hpccoll.transports._mpitypes import library, saturating_sums

    a = np.full(4096, 127, np.int8)
    b = a.copy()
    MPI.SUM.Reduce_local(a, b)
    saturates = bool((b == 127).all())
    assert (np.dtype(np.int8) in saturating_sums()) == (saturates or library().startswith("Open MPI"))


@pytest.mark.parametrize("op", ["max", "min"])
def test_uint64_extrema_beyond_2_63(comm, op):
    """uint64 values >= 2**63 are the largest, on every MPI (Debian's Open MPI 4.1.4 compares them as signed)."""
    p = comm.size
    stack = np.array([[(1 << 63) + 5 + r, 7 + r, (1 << 64) - 1 - r] * p for r in range(p)], np.uint64)
    want = (np.maximum if op == "max" else np.minimum).reduce(stack, axis=0)
    x = stack[comm.rank]
    inplace = x.copy()
    got = {
        "all_reduce": (hpccoll.all_reduce(x, comm, op=op), want),
        "async": (hpccoll.all_reduce(x, comm, op=op, async_op=True).wait(), want),
        "in place": (hpccoll.all_reduce(inplace, comm, op=op, out=inplace), want),
        "reduce_scatter": (hpccoll.reduce_scatter(x, comm, op=op), want[3 * comm.rank : 3 * comm.rank + 3]),
        "reduce_scatter async": (
            hpccoll.reduce_scatter(x, comm, op=op, async_op=True).wait(),
            want[3 * comm.rank : 3 * comm.rank + 3],
        ),
    }
    bad = sorted(k for k, (g, w) in got.items() if not np.array_equal(g, w))
    assert MPI.COMM_WORLD.allreduce(bad, op=MPI.SUM) == bad * p, f"uint64 {op} wrong: {bad}"
    assert np.array_equal(x, stack[comm.rank])  # the input is untouched
