"""ml_dtypes' 8-bit floats (``float8_e4m3fn``, ``float8_e5m2``): moved as bytes, reduced in float32.

Data movement must be bit-exact; reductions must equal the documented
rounding (``hpccoll._dtypes.reduce_plan``): the stack of every rank's input
widened to float32, reduced there, and cast once back to the float8 dtype.
Every comparison is of the results' ``uint8`` views, so a NaN or a signed zero
counts like any other value.
"""

import subprocess
import sys

import numpy as np
import pytest
from conftest import SIZE_PATTERNS, agree, assert_same, raises_everywhere
from launch import child_env
from mpi4py import MPI

import hpccoll
from hpccoll import _dtypes

ml_dtypes = pytest.importorskip("ml_dtypes")

NAMES = ["float8_e4m3fn", "float8_e5m2"]
REDUCING = ["sum", "prod", "max", "min", "avg"]
LOGICAL = ["land", "lor", "lxor", "band", "bor", "bxor"]
_UFUNC = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def dt(name):
    return np.dtype(getattr(ml_dtypes, name))


def data(shape, name, seed):
    """Standard normal values rounded to ``name``, a few of them large (sums overflow e4m3fn's 448 into NaN).

    The inputs themselves stay finite (within e4m3fn's 448): MPI leaves ``max`` and ``min`` of a NaN
    undefined (MPICH's compare-and-pick keeps whichever operand the comparison favours), NumPy propagates it.
    """
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape).astype(np.float32)
    a[rng.random(shape) < 0.1] *= 200
    return np.clip(a, -440, 440).astype(dt(name))


def stack_of(comm, shape, name, seed):
    """Every rank's input (the leading axis), made alike on every rank; ``[comm.rank]`` is this rank's."""
    return data((comm.size,) + tuple(shape), name, seed)


def reference(stack, op):
    """The documented result: reduce over the rank axis in float32, then cast once to ``stack``'s dtype."""
    wide = stack.astype(np.float32)
    if op == "avg":
        got = np.add.reduce(wide, axis=0) / np.float32(stack.shape[0])
    else:
        got = _UFUNC[op].reduce(wide, axis=0)
    return got.astype(stack.dtype)


def bits_equal(comm, got, want):
    """Same dtype, shape and bytes on every rank (collective)."""
    __tracebackhide__ = True
    return assert_same(got, want, comm)


# --------------------------------------------------------------------------- dtype tables


@pytest.mark.parametrize("name", NAMES)
def test_supported_and_planned(name):
    d = dt(name)
    assert name in hpccoll.SUPPORTED_DTYPES and name in _dtypes.FLOAT8_DTYPES
    assert _dtypes.check_dtype(d) == name
    assert _dtypes.movement_dtype(d) == np.uint8 and _dtypes.wire_of(d) == np.uint8
    assert _dtypes.ml_dtype(name) == d
    for op in REDUCING:
        for native in (frozenset(), frozenset({"float16", "bfloat16", name})):  # never native, whatever it says
            plan = _dtypes.reduce_plan(d, op, native)
            assert plan == _dtypes.ReducePlan(np.dtype(np.float32), "sum" if op == "avg" else op, True, op == "avg")
        assert _dtypes.direct_plan(d, op) is None  # the common branch leaves widened pairs to the general one
    for op in LOGICAL:
        with pytest.raises(hpccoll.DTypeError, match=f"expected a bool or integer dtype.*got {name}"):
            _dtypes.reduce_plan(d, op)


def test_unsupported_dtype_error_lists_float8():
    other = next(
        (getattr(ml_dtypes, n) for n in ("float8_e4m3fnuz", "float8_e4m3b11fnuz", "int4") if hasattr(ml_dtypes, n))
    )
    with pytest.raises(hpccoll.DTypeError, match="float8_e4m3fn, float8_e5m2"):
        _dtypes.check_dtype(np.dtype(other))


def test_ops_message_built_from_the_named_tuples():
    with pytest.raises(hpccoll.ArgumentError) as info:
        _dtypes.normalize_op("xor")
    msg = str(info.value)
    assert "'sum', 'prod', 'max', 'min', 'avg' (or MPI's logical and bitwise 'land', 'lor', 'lxor', 'band'" in msg


def test_ml_dtype_refuses_other_names():
    with pytest.raises(hpccoll.ArgumentError, match="name: expected one of 'bfloat16'"):
        _dtypes.ml_dtype("float8_e4m3fnuz")


@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="starts a Python subprocess; run at one rank")
def test_works_without_ml_dtypes():
    code = (
        "import sys; sys.modules['ml_dtypes'] = None\n"
        "import numpy as np, hpccoll\n"
        "from hpccoll import _dtypes\n"
        "assert not any(n.startswith('float8') for n in hpccoll.SUPPORTED_DTYPES), hpccoll.SUPPORTED_DTYPES\n"
        "assert _dtypes.FLOAT8_DTYPES == ()\n"
        "try:\n"
        "    _dtypes.ml_dtype('float8_e5m2')\n"
        "except hpccoll.DTypeError as e:\n"
        "    assert 'ml_dtypes' in str(e), e\n"
        "else:\n"
        "    raise AssertionError('no DTypeError')\n"
        "x = np.arange(4, dtype=np.float32)\n"
        "assert (hpccoll.all_reduce(x) == x).all() and (hpccoll.all_gather(x) == x).all()\n"
        "assert 'ml_dtypes' not in sys.modules or sys.modules['ml_dtypes'] is None\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=child_env(drop=("HPCCOLL_",)), timeout=120)


# --------------------------------------------------------------------------- data movement


@pytest.mark.mpi
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("pattern", ["even", "uneven"])
@pytest.mark.parametrize("axis", [0, 1])
def test_all_gather(comm, name, pattern, axis):
    sizes = SIZE_PATTERNS[pattern](comm.size)
    other = 3
    full = data((sum(sizes), other), name, 11 + axis)
    if axis == 1:
        full = np.ascontiguousarray(full.T)
    lo = sum(sizes[: comm.rank])
    mine = np.take(full, np.arange(lo, lo + sizes[comm.rank]), axis=axis)
    bits_equal(comm, hpccoll.all_gather(mine, comm, axis=axis, sizes=sizes), full)
    bits_equal(comm, hpccoll.all_gather(mine, comm, axis=axis), full)  # extents discovered


@pytest.mark.mpi
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("async_op", [False, True])
def test_all_to_all(comm, name, async_op):
    p, n = comm.size, 2
    full = data((p, p, n, 3), name, 21)  # full[src, dst]: the block src sends dst
    x = full[comm.rank].reshape(p * n, 3)
    got = hpccoll.all_to_all(x, comm, async_op=async_op)
    if async_op:
        got = got.wait()
    bits_equal(comm, got, np.ascontiguousarray(full[:, comm.rank]).reshape(p * n, 3))


# --------------------------------------------------------------------------- reductions


@pytest.mark.mpi
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("op", REDUCING)
def test_all_reduce(comm, name, op):
    stack = stack_of(comm, (7, 5), name, 31)
    want = reference(stack, op)
    bits_equal(comm, hpccoll.all_reduce(stack[comm.rank], comm, op=op), want)
    x = stack[comm.rank].copy()
    got = hpccoll.all_reduce(x, comm, op=op, out=x)  # in place
    agree(comm, got is x)
    bits_equal(comm, x, want)
    bits_equal(comm, hpccoll.all_reduce(stack[comm.rank], comm, op=op, async_op=True).wait(), want)
    f_order = np.asfortranarray(stack[comm.rank])
    bits_equal(comm, hpccoll.all_reduce(f_order, comm, op=op), want)


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("name", NAMES)
def test_sum_is_rounded_once(comm, name):
    """The reference tells a float32 sum rounded once from a sum rounded to float8 at every step."""
    stack = stack_of(comm, (256,), name, 41)
    stepwise = stack[0]
    for row in stack[1:]:
        stepwise = (stepwise.astype(np.float32) + row.astype(np.float32)).astype(stack.dtype)
    want = reference(stack, "sum")
    agree(comm, (stepwise.view(np.uint8) != want.view(np.uint8)).any(), "the data cannot tell the roundings apart")
    bits_equal(comm, hpccoll.all_reduce(stack[comm.rank], comm), want)


@pytest.mark.mpi
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("op", REDUCING)
@pytest.mark.parametrize("pattern", ["even", "uneven"])
def test_reduce_scatter(comm, name, op, pattern):
    sizes = SIZE_PATTERNS[pattern](comm.size)
    stack = stack_of(comm, (sum(sizes), 3), name, 51)
    lo = sum(sizes[: comm.rank])
    want = reference(stack, op)[lo : lo + sizes[comm.rank]]
    bits_equal(comm, hpccoll.reduce_scatter(stack[comm.rank], comm, op=op, sizes=sizes), want)
    cols = np.ascontiguousarray(stack.transpose(0, 2, 1))  # along axis 1
    got = hpccoll.reduce_scatter(cols[comm.rank], comm, op=op, axis=1, sizes=sizes)
    bits_equal(comm, got, np.ascontiguousarray(want.T))


@pytest.mark.mpi
@pytest.mark.parametrize("op", ["sum", "max", "avg"])
def test_list_all_reduce_mixes_float8_and_float32(comm, op):
    e4 = stack_of(comm, (4, 3), "float8_e4m3fn", 61)
    f32 = np.random.default_rng(62).standard_normal((comm.size, 5)).astype(np.float32)
    e5 = stack_of(comm, (6,), "float8_e5m2", 63)
    e4b = stack_of(comm, (2,), "float8_e4m3fn", 64)
    got = hpccoll.all_reduce([e4[comm.rank], f32[comm.rank], e5[comm.rank], e4b[comm.rank]], comm, op=op)
    if op == "avg":
        want32 = np.add.reduce(f32, axis=0) / np.float32(comm.size)
    else:
        want32 = _UFUNC[op].reduce(f32, axis=0)
    for g, w in zip(got, [reference(e4, op), None, reference(e5, op), reference(e4b, op)]):
        if w is not None:
            bits_equal(comm, g, w)
    agree(comm, lambda: np.testing.assert_allclose(got[1], want32, rtol=1e-6, atol=1e-6))


@pytest.mark.mpi
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("op", LOGICAL)
def test_logical_and_bitwise_ops_refused(comm, name, op):
    x = data((4,), name, 71)
    match = f"op='{op}' \\(MPI.{op.upper()}\\): expected a bool or integer dtype.*got {name}"
    raises_everywhere(comm, hpccoll.DTypeError, match, lambda: hpccoll.all_reduce(x, comm, op=op))
    raises_everywhere(comm, hpccoll.DTypeError, match, lambda: hpccoll.all_reduce([x, x], comm, op=op))
    xs = data((2 * comm.size,), name, 72)
    raises_everywhere(comm, hpccoll.DTypeError, match, lambda: hpccoll.reduce_scatter(xs, comm, op=op))


# --------------------------------------------------------------------------- check mode


@pytest.fixture(scope="module")
def checked():
    c = hpccoll.Communicator(check=True)
    yield c
    c.free()


@pytest.mark.mpi
@pytest.mark.parametrize("name", NAMES)
def test_check_mode(checked, name):
    sizes = SIZE_PATTERNS["uneven"](checked.size)
    full = data((sum(sizes), 2), name, 81)
    lo = sum(sizes[: checked.rank])
    bits_equal(checked, hpccoll.all_gather(full[lo : lo + sizes[checked.rank]], checked), full)
    stack = stack_of(checked, (5,), name, 82)
    for op in ("sum", "min", "avg"):
        bits_equal(checked, hpccoll.all_reduce(stack[checked.rank], checked, op=op), reference(stack, op))
    rs = stack_of(checked, (2 * checked.size,), name, 83)
    want = reference(rs, "max")[2 * checked.rank : 2 * checked.rank + 2]
    bits_equal(checked, hpccoll.reduce_scatter(rs[checked.rank], checked, op="max"), want)


@pytest.mark.mpi(min_size=2)
def test_check_mode_tells_the_float8_dtypes_apart(checked):
    x = data((3,), NAMES[checked.rank % 2], 84)
    raises_everywhere(checked, hpccoll.MismatchError, "dtype", lambda: hpccoll.all_reduce(x, checked))
    raises_everywhere(checked, hpccoll.MismatchError, "dtype", lambda: hpccoll.all_gather(x, checked))


@pytest.mark.mpi
def test_check_mode_from_environment(monkeypatch):
    monkeypatch.setenv("HPCCOLL_CHECK", "1")
    with hpccoll.Communicator() as c:
        assert c.check
        stack = stack_of(c, (4,), "float8_e5m2", 85)
        bits_equal(c, hpccoll.all_reduce(stack[c.rank], c), reference(stack, "sum"))
        raises_everywhere(
            c, hpccoll.DTypeError, "got float8_e5m2", lambda: hpccoll.all_reduce(stack[c.rank], c, op="bor")
        )


# --------------------------------------------------------------------------- shm transport


@pytest.fixture(scope="module")
def shm():
    """Shared memory moving every message itself (not handing small ones to host MPI), in 256-byte rounds."""
    c = hpccoll.Communicator(transport="shm")
    t = c.transport_instance("shm")
    t.everything = True
    t.chunk_bytes = 256
    t.direct_bytes = 0
    yield c
    c.free()


@pytest.mark.mpi
@pytest.mark.parametrize("name", NAMES)
def test_shm_movement(shm, name):
    sizes = SIZE_PATTERNS["uneven"](shm.size)
    full = data((sum(sizes), 130), name, 91)  # rows of 130 bytes: several rounds
    lo = sum(sizes[: shm.rank])
    bits_equal(shm, hpccoll.all_gather(full[lo : lo + sizes[shm.rank]], shm, sizes=sizes), full)
    p = shm.size
    blocks = data((p, p, 3, 5), name, 92)
    got = hpccoll.all_to_all(blocks[shm.rank].reshape(p * 3, 5), shm)
    bits_equal(shm, got, np.ascontiguousarray(blocks[:, shm.rank]).reshape(p * 3, 5))


@pytest.mark.mpi
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_shm_sum(shm, name, op):
    stack = stack_of(shm, (300,), name, 93)
    bits_equal(shm, hpccoll.all_reduce(stack[shm.rank], shm, op=op), reference(stack, op))
    sizes = SIZE_PATTERNS["uneven"](shm.size)
    rs = stack_of(shm, (sum(sizes), 70), name, 94)
    lo = sum(sizes[: shm.rank])
    want = reference(rs, op)[lo : lo + sizes[shm.rank]]
    bits_equal(shm, hpccoll.reduce_scatter(rs[shm.rank], shm, op=op, sizes=sizes), want)


# --------------------------------------------------------------------------- rooted collectives

_NO_ROOTED = "hpccoll.broadcast/hpccoll.gather not available in this build (rooted collectives not landed yet)"


@pytest.mark.mpi
@pytest.mark.parametrize("name", NAMES)
def test_broadcast(comm, name):
    if not hasattr(hpccoll, "broadcast"):
        pytest.skip(_NO_ROOTED)
    for root in range(comm.size):
        stack = stack_of(comm, (4, 3), name, 101 + root)
        bits_equal(comm, hpccoll.broadcast(stack[comm.rank], comm, root=root), stack[root])


@pytest.mark.mpi
@pytest.mark.parametrize("name", NAMES)
def test_gather(comm, name):
    if not hasattr(hpccoll, "gather"):
        pytest.skip(_NO_ROOTED)
    sizes = SIZE_PATTERNS["uneven"](comm.size)
    full = data((sum(sizes), 3), name, 111)
    lo = sum(sizes[: comm.rank])
    mine = full[lo : lo + sizes[comm.rank]]
    for root in range(comm.size):
        got = hpccoll.gather(mine, comm, root=root)
        want = full if comm.rank == root else full[:0]
        bits_equal(comm, got, want)
