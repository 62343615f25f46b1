"""The GPU transports' own logic in CPU-only CI, on a stand-in GPU that defers work like a real one.

The real ``hpccoll/transports/nccl.py`` (and ``staged.py``, ``cuda_mpi.py``)
and the real CuPy code paths of ``hpccoll.collectives`` run here on arrays of the
CuPy stand-in (``tests/standin_cupy.py``, installed as ``cupy`` for each
test), with the NumPy-over-MPI stand-in for CuPy's NCCL binding
(``tests/standin_nccl.py``). Both are test fixtures, never transports.

Device work runs only when something waits for it, so a result read before
its collective ran, a temporary freed or reused while queued work still
needs it, or work on the wrong stream gives wrong data or a ``StandInRace``
here, as it would on a GPU. Each test runs on a non-blocking stream of its
own (never the default stream) unless it says otherwise; results are read
with ``get()`` and compared with NumPy.
"""

import functools
import gc
import sys

import numpy as np
import pytest
import standin_cupy as cp
import standin_nccl as standin
from conftest import (
    DTYPE_IDS,
    DTYPES,
    EPS16,
    SIZE_PATTERNS,
    agree,
    assert_close,
    assert_same,
    make,
    raises_everywhere,
    reference,
    widening_error,
)
from standin_cupy import StandInHang, StandInRace
from standin_nccl import MPIStandInNcclCommunicator, NcclError, StandInRuntime
from test_all_gather import shards
from test_reductions import OPS, block, stack_for, unsupported

import hpccoll
from hpccoll.transports import _cuda, choose_transport, cuda_mpi
from hpccoll.transports import nccl as nccl_mod

pytestmark = pytest.mark.mpi

# Every test makes all its collective calls before its first assertion, so a
# failure on one rank cannot leave the other ranks waiting in a collective.


# --------------------------------------------------------------------------- fixtures and helpers


@pytest.fixture
def runtime(request, monkeypatch):
    """The stand-in GPU: CuPy stand-in installed as ``cupy``, a fresh device, the caller on its own stream.

    A test parametrised with ``standin_mode`` runs in that mode (``random``:
    queued work also runs at random earlier points, seeded by
    ``HPCCOLL_STANDIN_SEED``, printed in the session header). Afterwards
    everything still queued runs, and any race or use after free fails the test.
    """
    for name in ("HPCCOLL_CUDA_AWARE_MPI", "HPCCOLL_NCCL_UNEVEN", "HPCCOLL_TRANSPORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(nccl_mod, "_CHOSEN", None)
    monkeypatch.setattr(cuda_mpi, "_warned", False)
    monkeypatch.setitem(sys.modules, "cupy", cp)
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    rt = StandInRuntime(mode=params.get("standin_mode"))
    if cp.GPU.mode == "random":  # shown with a failure's captured output
        print(f"GPU stand-in: random mode, HPCCOLL_STANDIN_SEED={cp.GPU.seed}")
    with _cuda.use_runtime(rt), cp.cuda.Stream(non_blocking=True):
        yield rt
        cp.GPU.synchronize()


@pytest.fixture
def fresh(comm, runtime):
    """Make fresh Communicators (freed after the test), so probes and choices start clean."""
    made = []

    def new(**kwargs):
        made.append(hpccoll.Communicator(comm.mpi, **kwargs))
        return made[-1]

    yield new
    for c in reversed(made):
        c.free()


@pytest.fixture
def gpu(fresh, runtime):
    """A Communicator whose CuPy arrays take the NCCL transport (over the stand-in).

    Each rank selects its GPU first, as a job must before allocating (one
    node here: the rank is the node-local rank); hpccoll then keeps it.
    """
    c = fresh()
    cp.cuda.Device(c.rank % runtime.devices).use()
    return c


def dev(a):
    """``a`` on the stand-in GPU (a list: each array)."""
    return [cp.asarray(x) for x in a] if isinstance(a, list) else cp.asarray(a)


def host(a):
    """``a`` read back (``get()``: waits for the current stream only, as CuPy's does)."""
    return [x.get() for x in a] if isinstance(a, list) else a.get()


def nccl_of(c):
    return c.transport_instance("nccl")


def calls(c, *names):
    """The NCCL calls the communicator's transport made (optionally only those named)."""
    log = nccl_of(c)._nc.calls
    return [call for call in log if not names or call[0] in names]


# --------------------------------------------------------------------------- the public API over NCCL


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_reductions_every_dtype_and_op(gpu, dtype, op):
    stack, x = stack_for(gpu, (2 * gpu.size + 1, 3), dtype, seed=11)
    if unsupported(dtype, op):
        with pytest.raises(hpccoll.DTypeError, match="op="):
            hpccoll.reduce_scatter(dev(x), gpu, op=op)
        return
    scattered = hpccoll.reduce_scatter(dev(x), gpu, op=op)
    reduced = hpccoll.all_reduce(dev(x), gpu, op=op)
    y = dev(x)
    in_place = hpccoll.all_reduce(y, gpu, op=op, out=y)
    want = reference(stack, op)
    sizes = hpccoll.split_sizes(x.shape[0], gpu.size)
    # NCCL adds float16 and bfloat16 in their own type: every partial sum rounds there, not in float32.
    native = np.dtype(dtype).name in nccl_of(gpu).native_reduce
    slack = widening_error(stack, op, EPS16[np.dtype(dtype).name] / 2 if native else None)
    assert_close(host(scattered), block(want, 0, sizes, gpu.rank), gpu, slack=block(slack, 0, sizes, gpu.rank))
    assert_close(host(reduced), want, gpu, slack=slack)
    agree(gpu, in_place is y, "all_reduce(y, out=y) did not return y")
    assert_close(host(y), want, gpu, slack=slack)
    assert choose_transport(gpu, "cupy").name == "nccl"


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_all_gather_every_dtype(gpu, dtype):
    sizes = SIZE_PATTERNS["uneven"](gpu.size)
    x, full = shards(gpu, (2, 0, 3), 1, sizes, dtype)
    assert_same(host(hpccoll.all_gather(dev(x), gpu, axis=1)), full)


@pytest.mark.parametrize("standin_mode", ["deferred", "random"])
@pytest.mark.parametrize("design", ["grouped", "pad", "auto"])
@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
def test_uneven_designs(gpu, design, pattern, standin_mode):
    nccl_of(gpu).uneven = design
    sizes = SIZE_PATTERNS[pattern](gpu.size)
    x, full = shards(gpu, (3, 0, 2), 1, sizes, np.float32, seed=4)
    gathered = hpccoll.all_gather(dev(x), gpu, axis=1, sizes=sizes)
    stack, z = stack_for(gpu, (3, sum(sizes), 2), np.int64, seed=5)
    scattered = hpccoll.reduce_scatter(dev(z), gpu, axis=-2, sizes=sizes)
    stack16, w = stack_for(gpu, (sum(sizes) + 1,), np.int16, seed=6)  # widened to 32 bits, then narrowed
    sizes16 = hpccoll.split_sizes(w.size, gpu.size)
    scattered16 = hpccoll.reduce_scatter(dev(w), gpu, op="prod", sizes=sizes16)
    assert_same(host(gathered), full)
    assert_close(host(scattered), block(reference(stack, "sum"), 1, sizes, gpu.rank))
    assert_close(host(scattered16), block(reference(stack16, "prod"), 0, sizes16, gpu.rank))
    counts = [s * 6 for s in sizes]
    even = len(set(counts)) == 1
    padded = gpu.size * max(counts) <= (1 + nccl_mod.PAD_SLACK) * sum(counts)
    used = {call[0] for call in calls(gpu, "allGather", "broadcast")} | {
        call[0] for call in calls(gpu) if call[2] == standin.NCCL_INT64
    }
    if gpu.size == 1:
        assert used == set()  # one rank: the API copies, NCCL is not called
    elif even or design == "pad" or (design == "auto" and padded):
        assert used == {"allGather", "reduceScatter"}
    else:
        assert used == {"broadcast", "reduce"}


def test_axis_and_layouts_with_out(gpu):
    sizes = SIZE_PATTERNS["empty-last"](gpu.size)
    x, full = shards(gpu, (2, 3, 0), 2, sizes, np.complex128, seed=8)
    out = cp.asfortranarray(cp.empty(full.shape, full.dtype))
    got = hpccoll.all_gather(cp.asfortranarray(dev(x)), gpu, axis=-1, out=out)
    assert got is out
    assert_same(host(out), full)


# --------------------------------------------------------------------------- dtypes and ops on the wire


def wire_types(c, *names):
    return {call[2] for call in calls(c, *names)}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize(
    "dtype,nccl_type,scale",
    [
        ("bool", "NCCL_UINT8", 1),
        ("int16", "NCCL_UINT8", 2),
        ("uint16", "NCCL_UINT8", 2),
        ("complex64", "NCCL_FLOAT32", 2),
        ("complex128", "NCCL_FLOAT64", 2),
        ("float16", "NCCL_UINT8", 2),
        ("bfloat16", "NCCL_UINT8", 2),
        ("int64", "NCCL_INT64", 1),
    ],
)
def test_movement_types(gpu, runtime, dtype, nccl_type, scale):
    dtype = [d for d in DTYPES if d.name == dtype][0]
    x, full = shards(gpu, (0,), 0, [2] * gpu.size, dtype)
    assert_same(host(hpccoll.all_gather(dev(x), gpu)), full)
    assert calls(gpu) == [("allGather", 2 * scale, getattr(standin, nccl_type), None, None, runtime.stream())]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize(
    "dtype,op,nccl_type,nccl_op,scale",
    [
        ("int16", "sum", "NCCL_INT32", "NCCL_SUM", 1),
        ("uint16", "prod", "NCCL_UINT32", "NCCL_PROD", 1),
        ("bool", "sum", "NCCL_UINT8", "NCCL_MAX", 1),
        ("bool", "prod", "NCCL_UINT8", "NCCL_MIN", 1),
        ("float16", "avg", "NCCL_FLOAT16", "NCCL_SUM", 1),
        ("bfloat16", "max", "NCCL_BFLOAT16", "NCCL_MAX", 1),
        ("complex64", "sum", "NCCL_FLOAT32", "NCCL_SUM", 2),
        ("complex128", "avg", "NCCL_FLOAT64", "NCCL_SUM", 2),
    ],
)
def test_reduction_types(gpu, runtime, dtype, op, nccl_type, nccl_op, scale):
    dtype = [d for d in DTYPES if d.name == dtype][0]
    stack, x = stack_for(gpu, (5,), dtype, seed=3)
    assert_close(host(hpccoll.all_reduce(dev(x), gpu, op=op)), reference(stack, op))
    want = ("allReduce", 5 * scale, getattr(standin, nccl_type), getattr(standin, nccl_op), None, runtime.stream())
    assert calls(gpu) == [want]


@pytest.mark.mpi(min_size=2)
def test_bfloat16_widened_before_nccl_2_10(gpu, monkeypatch):
    monkeypatch.setattr(standin, "VERSION", 20903)
    dtype = [d for d in DTYPES if d.name == "bfloat16"][0]
    stack, x = stack_for(gpu, (4,), dtype, seed=2)
    got = hpccoll.all_reduce(dev(x), gpu, op="sum")
    assert "bfloat16" not in nccl_of(gpu).native_reduce
    assert_close(host(got), reference(stack, "sum"))
    assert wire_types(gpu) == {standin.NCCL_FLOAT32}


def test_native_reduce(gpu):
    assert nccl_of(gpu).native_reduce == frozenset({"float16", "bfloat16"})


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_complex_prod_by_all_to_all(gpu, dtype):
    stack, x = stack_for(gpu, (2 * gpu.size + 1,), np.dtype(dtype), seed=6)
    scattered = hpccoll.reduce_scatter(dev(x), gpu, op="prod")
    reduced = hpccoll.all_reduce(dev(x), gpu, op="prod")
    y = dev(x)
    hpccoll.all_reduce(y, gpu, op="prod", out=y)
    want = reference(stack, "prod")
    assert_close(host(scattered), block(want, 0, hpccoll.split_sizes(x.size, gpu.size), gpu.rank))
    assert_close(host(reduced), want)
    assert_close(host(y), want)
    if gpu.size > 1:  # complex products are not elementwise on reals: blocks travel, then multiply
        assert {"send", "recv"} <= {call[0] for call in calls(gpu)}
        real = standin.NCCL_FLOAT32 if dtype == "complex64" else standin.NCCL_FLOAT64
        assert wire_types(gpu, "send", "recv") == {real}


def test_complex_max_refused(gpu):
    x = cp.ones(3, np.complex64)
    with pytest.raises(hpccoll.DTypeError, match="op='max'"):
        hpccoll.all_reduce(x, gpu, op="max")
    t = nccl_of(gpu)
    with pytest.raises(hpccoll.DTypeError, match="op='min'"):
        t.allreduce(None, x, "min")
    assert calls(gpu) == []


# --------------------------------------------------------------------------- chunking at the binding's limit


def test_chunking_at_the_bindings_limit(gpu, monkeypatch):
    """The binding refuses counts above its limit (declared small here): every path must split its calls."""
    monkeypatch.setattr(standin, "MAX_COUNT", 3)
    monkeypatch.setattr(standin, "INT_COUNT_CALLS", frozenset({"broadcast", "bcast"}))
    t = nccl_of(gpu)
    t.max_count = 3
    got, want = [], []
    stack, x = stack_for(gpu, (7, 2), np.float64, seed=1)
    got.append(hpccoll.all_reduce(dev(x), gpu))
    want.append(reference(stack, "sum"))
    even = [4] * gpu.size  # 4 elements per rank > 3: the even path must split too
    g, full = shards(gpu, (0,), 0, even, np.int32)
    got.append(hpccoll.all_gather(dev(g), gpu, sizes=even))
    want.append(full)
    stack, z = stack_for(gpu, (4 * gpu.size,), np.int32, seed=2)
    got.append(hpccoll.reduce_scatter(dev(z), gpu, sizes=even))
    want.append(block(reference(stack, "sum"), 0, even, gpu.rank))
    stack, c = stack_for(gpu, (3 * gpu.size,), np.complex64, seed=3)
    got.append(hpccoll.all_reduce(dev(c), gpu, op="prod"))
    want.append(reference(stack, "prod"))
    t.uneven = "pad"  # a padded block above the limit falls back to grouped calls
    uneven = [5 if r == 0 else 1 for r in range(gpu.size)]
    g, full = shards(gpu, (0,), 0, uneven, np.float32)
    got.append(hpccoll.all_gather(dev(g), gpu, sizes=uneven))
    want.append(full)
    stack, u = stack_for(gpu, (sum(uneven),), np.float64, seed=4)
    got.append(hpccoll.reduce_scatter(dev(u), gpu, sizes=uneven))
    want.append(block(reference(stack, "sum"), 0, uneven, gpu.rank))
    for a, b in zip(got, want):
        assert_close(host(a), b)
    if gpu.size > 1:
        assert calls(gpu) and max(call[1] for call in calls(gpu)) <= 3


def test_default_limit_fits_the_binding(monkeypatch):
    """The transport's default largest count passes the binding's C count type for every call it makes
    (C ``int`` for broadcast and bcast in older CuPy)."""
    monkeypatch.setattr(standin, "INT_COUNT_CALLS", frozenset({"broadcast", "bcast"}))
    limit = nccl_mod.NcclTransport.max_count
    for call in ("allGather", "allReduce", "reduceScatter", "broadcast", "bcast", "reduce", "send", "recv"):
        assert standin._count(limit, call) == limit
    with pytest.raises(OverflowError, match="value too large to convert to int"):
        standin._count(limit + 1, "broadcast")


@pytest.mark.parametrize("design", ["grouped", "pad"])
def test_primitives_directly(gpu, design):
    """The transport's primitives on flat buffers, at every size including one rank."""
    t = nccl_of(gpu)
    t.uneven = design
    t.max_count = 5
    counts = [r % 3 + 2 for r in range(gpu.size)]
    full = make((sum(counts),), np.float64, seed=9)
    start = sum(counts[: gpu.rank])
    recv = cp.empty(full.shape)
    t.allgatherv(dev(full[start : start + counts[gpu.rank]]), recv, counts)
    stack = make((gpu.size, sum(counts)), np.float64, seed=10)
    mine = cp.empty(counts[gpu.rank])
    t.reduce_scatter(dev(stack[gpu.rank]), mine, counts, "max")
    y = dev(stack[gpu.rank])
    t.allreduce(None, y, "min")
    assert_same(host(recv), full)
    assert_close(host(mine), stack.max(axis=0)[start : start + counts[gpu.rank]])
    assert_close(host(y), stack.min(axis=0))


# --------------------------------------------------------------------------- streams


def test_streams_are_the_callers(gpu, runtime):
    """Every NCCL call goes on the caller's current stream; results are right on that stream."""
    stack, x = stack_for(gpu, (6,), np.float32, seed=0)
    first = runtime.stream()
    reduced = hpccoll.all_reduce(dev(x), gpu)
    blocking = cp.cuda.Stream()  # a blocking stream, then the legacy default stream
    with blocking:
        scattered = hpccoll.reduce_scatter(dev(x), gpu)
        scattered_got = host(scattered)
    with cp.cuda.Stream.null:
        gathered = hpccoll.all_gather(dev(x), gpu)
        gathered_got = host(gathered)
    want = reference(stack, "sum")
    assert_close(host(reduced), want)
    assert_close(scattered_got, block(want, 0, hpccoll.split_sizes(6, gpu.size), gpu.rank))
    assert_same(gathered_got, stack.reshape(-1))
    streams = [call[5] for call in calls(gpu)]
    runs = [s for i, s in enumerate(streams) if i == 0 or streams[i - 1] != s]
    if gpu.size > 1:
        assert first != 0 and runs == [first, blocking.ptr, 0]


@pytest.mark.parametrize("standin_mode", ["deferred"])  # what it checks is deferral itself
def test_results_wait_for_their_collective(gpu, standin_mode):
    """Nothing runs until something waits: a read that skips the wait sees fresh memory, not the result."""
    stack, x = stack_for(gpu, (5,), np.float64, seed=1)
    y = hpccoll.all_reduce(dev(x), gpu)
    queued = cp.GPU.pending()
    unsynchronised = y._v.copy()  # what the host would read without waiting (bypassing get())
    got = host(y)
    assert queued > 0 and (unsynchronised.view(np.uint8) == cp.UNINITIALISED).all()
    assert_close(got, reference(stack, "sum"))


def test_another_stream_needs_an_event(gpu):
    """A consumer on a second stream must wait for an event after the collective; without one: a race."""
    stack, x = stack_for(gpu, (4,), np.float64, seed=2)
    side = cp.cuda.Stream(non_blocking=True)
    y = hpccoll.all_reduce(dev(x), gpu)
    done = cp.cuda.get_current_stream().record()
    side.wait_event(done)
    with side:
        doubled = y * 2
    ordered = doubled.get(stream=side)
    z = hpccoll.all_reduce(dev(x), gpu)
    with side:
        racing = z * 2
        with pytest.raises(StandInRace, match="race on the device buffer"):
            racing.get()
    assert_close(ordered, 2 * reference(stack, "sum"))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("standin_mode", ["deferred"])  # what it checks is deferral itself
def test_padding_temporaries_outlive_their_calls(gpu, standin_mode):
    """Padded calls free their temporaries at return, queued work still pending: fine in stream order."""
    t = nccl_of(gpu)
    t.uneven = "pad"
    sizes = [3 if r % 2 else 2 for r in range(gpu.size)]
    x, full = shards(gpu, (0, 2), 0, sizes, np.float64, seed=3)
    stack, z = stack_for(gpu, (sum(sizes), 2), np.float64, seed=4)
    gathered = hpccoll.all_gather(dev(x), gpu, sizes=sizes)
    scattered = hpccoll.reduce_scatter(dev(z), gpu, sizes=sizes)
    queued = cp.GPU.pending()
    assert_same(host(gathered), full)
    assert_close(host(scattered), block(reference(stack, "sum"), 0, sizes, gpu.rank))
    assert queued > 0 and {"allGather", "reduceScatter"} <= {call[0] for call in calls(gpu)}


# --------------------------------------------------------------------------- async, in place and lists, against NumPy


@pytest.mark.parametrize("standin_mode", ["deferred", "random"])
@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
def test_lists_and_requests_against_numpy(gpu, pattern, standin_mode):
    """List and non-blocking forms, each result compared with NumPy on the global data."""
    sizes = SIZE_PATTERNS[pattern](gpu.size)
    a, full_a = shards(gpu, (0, 3), 0, sizes, np.float32, seed=1)
    b, full_b = shards(gpu, (2, 0), 1, sizes, np.int16, seed=2)
    stack_c, c = stack_for(gpu, (2 * gpu.size + 1, 2), np.float64, seed=3)
    stack_d, d = stack_for(gpu, (gpu.size + 2,), np.complex64, seed=4)
    stack_e, e = stack_for(gpu, (5,), np.float16, seed=5)
    gathered = hpccoll.all_gather(dev([a]) + dev([b.T.copy()]), gpu, sizes=sizes)
    req_gathered = hpccoll.all_gather(dev([b, b]), gpu, axis=1, sizes=sizes, async_op=True)
    req_max = hpccoll.all_reduce(dev([c, e]), gpu, op="max", async_op=True)
    polled = req_max.test()  # nothing has run yet: really pending (deferred mode)
    scattered = hpccoll.reduce_scatter(dev([c, d]), gpu)
    req_avg = hpccoll.reduce_scatter(dev([c, d]), gpu, op="avg", async_op=True)
    req_one = hpccoll.reduce_scatter(dev(c), gpu, op="min", async_op=True)
    reduced = hpccoll.all_reduce(dev([c, e, d]), gpu)
    got = [
        host(gathered),
        host(req_gathered.wait()),
        host(req_max.wait()),
        host(scattered),
        host(req_avg.wait()),
        host(req_one.wait()),
        host(reduced),
    ]
    rows = [hpccoll.split_sizes(n, gpu.size) for n in (c.shape[0], d.shape[0])]
    want = [
        [full_a, full_b.T],
        [full_b, full_b],
        [reference(stack_c, "max"), reference(stack_e, "max")],
        [
            block(reference(stack_c, "sum"), 0, rows[0], gpu.rank),
            block(reference(stack_d, "sum"), 0, rows[1], gpu.rank),
        ],
        [
            block(reference(stack_c, "avg"), 0, rows[0], gpu.rank),
            block(reference(stack_d, "avg"), 0, rows[1], gpu.rank),
        ],
        block(reference(stack_c, "min"), 0, rows[0], gpu.rank),
        [reference(stack_c, "sum"), reference(stack_e, "sum"), reference(stack_d, "sum")],
    ]
    if standin_mode == "deferred" and gpu.size > 1:  # (one rank: no transport, the request is born done)
        assert not polled
    assert req_max.done
    for g, w in zip(got, want):
        for gi, wi in zip(g, w) if isinstance(w, list) else [(g, w)]:
            assert_close(gi, wi)


@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
def test_async_and_in_place(gpu, pattern):
    """Event-backed requests, and in-place forms (copied first: the NCCL transport has no send=None)."""
    sizes = SIZE_PATTERNS[pattern](gpu.size)
    x, full = shards(gpu, (0, 3), 0, sizes, np.float32, seed=3)
    req = hpccoll.all_gather(dev(x), gpu, sizes=sizes, async_op=True)
    got_async = host(req.wait())
    out = cp.zeros(full.shape, full.dtype)
    lo = sum(sizes[: gpu.rank])
    out[lo : lo + sizes[gpu.rank]] = x
    got_in_place = hpccoll.all_gather(out[lo : lo + sizes[gpu.rank]], gpu, sizes=sizes, out=out)
    stack, y = stack_for(gpu, (2 * gpu.size + 1, 2), np.float64, seed=4)
    rs_sizes = hpccoll.split_sizes(y.shape[0], gpu.size)
    whole = dev(y)
    mine = whole[sum(rs_sizes[: gpu.rank]) : sum(rs_sizes[: gpu.rank + 1])]
    scattered_in_place = hpccoll.reduce_scatter(whole, gpu, out=mine)
    assert_same(got_async, full)
    assert got_in_place is out and scattered_in_place is mine
    assert_same(host(out), full)
    assert_close(host(mine), block(reference(stack, "sum"), 0, rs_sizes, gpu.rank))


# --------------------------------------------------------------------------- the stand-in's own rules (so they cannot rot)


def test_standin_enforces_nccls_argument_rules(gpu, runtime, monkeypatch):
    """In-place layouts, C count types and limits, device pointers, streams, ncclAvg, the device id."""
    t = nccl_of(gpu)
    nc, s, f64, P, r = t._nc, runtime.stream(), standin.NCCL_FLOAT64, gpu.size, gpu.rank
    buf = cp.zeros(4 * P + 4)
    p, size = buf.data.ptr, 8
    nc.allGather(p + r * 4 * size, p, 4, f64, s)  # in place: send == recv + rank*count
    with pytest.raises(NcclError, match="allGather: sendbuff and recvbuff overlap but are not in place"):
        nc.allGather(p + size, p, 4, f64, s)
    nc.reduceScatter(p, p + r * 4 * size, 4, f64, standin.NCCL_SUM, s)  # in place: recv == send + rank*count
    with pytest.raises(NcclError, match="reduceScatter: .* not in place"):
        nc.reduceScatter(p, p + r * 4 * size + size, 4, f64, standin.NCCL_SUM, s)
    with pytest.raises(NcclError, match="allReduce: .* not in place"):
        nc.allReduce(p, p + size, 4, f64, standin.NCCL_SUM, s)
    with pytest.raises(NcclError, match="runs past the end of its allocation"):
        nc.allReduce(p, p, 4 * P + 5, f64, standin.NCCL_SUM, s)
    with pytest.raises(NcclError, match="not device memory"):
        nc.allReduce(np.zeros(4).ctypes.data, p, 4, f64, standin.NCCL_SUM, s)
    pinned = runtime.alloc_pinned(64)
    with pytest.raises(NcclError, match="is host memory"):
        nc.allReduce(pinned.ctypes.data, p, 4, f64, standin.NCCL_SUM, s)
    with cp.cuda.Device(t.device + 1):
        elsewhere = cp.zeros(4)
    with pytest.raises(NcclError, match=f"is on GPU {t.device + 1}; this communicator's GPU is {t.device}"):
        nc.allReduce(elsewhere.data.ptr, p, 4, f64, standin.NCCL_SUM, s)
    with pytest.raises(NcclError, match="not a stream of this device"):
        nc.allReduce(p, p, 4, f64, standin.NCCL_SUM, 12345)
    with pytest.raises(OverflowError, match="can't convert negative value to size_t"):
        nc.allReduce(p, p, -1, f64, standin.NCCL_SUM, s)
    with pytest.raises(TypeError, match="an integer is required"):
        nc.allReduce(p, p, 4.0, f64, standin.NCCL_SUM, s)
    monkeypatch.setattr(standin, "INT_COUNT_CALLS", frozenset({"broadcast", "bcast"}))
    with pytest.raises(OverflowError, match="value too large to convert to int"):
        nc.broadcast(p, p, 2**31, f64, 0, s)
    monkeypatch.setattr(standin, "MAX_COUNT", 3)
    with pytest.raises(OverflowError, match="above the declared limit MAX_COUNT=3"):
        nc.allReduce(p, p, 4, f64, standin.NCCL_SUM, s)
    monkeypatch.setattr(standin, "MAX_COUNT", None)
    avg = cp.asarray(np.full(2, 2.0 * (r + 1)))
    nc.allReduce(avg.data.ptr, avg.data.ptr, 2, f64, standin.NCCL_AVG, s)
    monkeypatch.setattr(standin, "VERSION", 20903)
    with pytest.raises(NcclError, match="ncclAvg needs NCCL 2.10"):
        nc.allReduce(p, p, 4, f64, standin.NCCL_AVG, s)
    monkeypatch.setattr(standin, "VERSION", 22304)
    got, got_avg = host(buf), host(avg)
    assert nc.device_id() == t.device
    assert_close(got_avg, np.full(2, float(P + 1)))
    assert np.isfinite(got).all()


@pytest.mark.parametrize("standin_mode", ["deferred"])  # what it checks is deferral itself
def test_standin_tracks_lifetimes(gpu, runtime, standin_mode):
    """Freed memory: fine behind same-stream work, reported and poisoned when used after the free."""
    nc, s = nccl_of(gpu)._nc, runtime.stream()
    f64, total = standin.NCCL_FLOAT64, float(gpu.size)
    tmp, out = cp.ones(4), cp.empty(4)
    nc.allReduce(tmp.data.ptr, out.data.ptr, 4, f64, standin.NCCL_SUM, s)
    tmp.data.mem.free()  # back to the pool behind the queued call on the same stream: safe
    ok = host(out)
    early, late = cp.ones(4), cp.empty(4)
    nc.allReduce(early.data.ptr, late.data.ptr, 4, f64, standin.NCCL_SUM, s)
    late.data.mem.free()  # freed before the copy below was queued: the copy reads poison
    copied = late.copy()
    with pytest.raises(StandInRace, match="use after free"):
        copied.get()
    pinned = runtime.alloc_pinned(32).view(np.float64)
    pinned[...] = 7.0
    target = cp.empty(4)
    runtime.to_device(pinned, target)
    del pinned  # the pinned buffer goes while the queued copy still reads it
    with pytest.raises(StandInRace, match="pinned memory is not stream-ordered"):
        target.get()
    with pytest.raises(NcclError, match="is in the freed device buffer"):
        nc.allReduce(late.data.ptr, late.data.ptr, 4, f64, standin.NCCL_SUM, s)
    assert_close(ok, np.full(4, total))
    assert np.isnan(copied._v).all() and np.isnan(target._v).all()


# --------------------------------------------------------------------------- bootstrap


@pytest.mark.parametrize("form", ["bytes", "tuple"])
def test_unique_id_forms(gpu, monkeypatch, form):
    monkeypatch.setattr(standin, "ID_FORM", form)
    before = MPIStandInNcclCommunicator.created
    t = nccl_of(gpu)
    x = dev(make((3,), np.float32, seed=gpu.rank))
    t.allreduce(None, x, "sum")
    assert isinstance(t._nc, MPIStandInNcclCommunicator)
    assert MPIStandInNcclCommunicator.created == before + 1
    assert_close(host(x), sum(make((3,), np.float32, seed=r) for r in range(gpu.size)))


def test_id_forms_cover_both_bindings():
    raw = bytes(range(128, 256))
    forms = nccl_mod._id_forms(raw)
    assert forms[0] == raw and tuple(raw) in forms and tuple(b - 256 for b in raw) in forms
    signed = tuple(b - 256 for b in raw)
    assert nccl_mod._id_forms(signed)[:2] == [signed, raw]


def test_unique_id_failure_raises_on_every_rank(gpu, monkeypatch):
    monkeypatch.setattr(standin, "FAIL_UNIQUE_ID", True)  # only rank 0 calls get_unique_id
    for _ in range(2):  # and again: no rank is left waiting in a collective
        with pytest.raises(hpccoll.TransportUnavailable, match="rank 0 could not make the NCCL unique id"):
            gpu.transport_instance("nccl")
    monkeypatch.setattr(standin, "FAIL_UNIQUE_ID", False)
    x = cp.ones(4)
    nccl_of(gpu).allreduce(None, x, "sum")
    np.testing.assert_array_equal(host(x), np.full(4, gpu.size))


# --------------------------------------------------------------------------- selection and the probe


def test_auto_picks_nccl(fresh, runtime):
    c = fresh()
    choice = c.transport_for(np.zeros(2))
    assert choice.name == "mpi" and choice.reason.endswith("NumPy arrays use host MPI")
    assert c.transport_for(cp.zeros(2)).name == "nccl"
    choice = choose_transport(c, "cupy")
    assert choice.name == "nccl" and "usable" in choice.reason
    t = nccl_of(c)
    assert t.device == runtime.current and "node-local rank" in t.device_choice
    assert t._nc.device_id() == t.device


@pytest.mark.mpi(min_size=2)
def test_two_ranks_on_one_gpu_refused_and_auto_falls_back(fresh, runtime, monkeypatch):
    runtime.devices = 1  # every rank picks GPU 0: same node, same bus id
    monkeypatch.setattr(cuda_mpi, "_detected", lambda comm: cuda_mpi.CudaAwareness(None, "no source answered"))
    c = fresh()
    with pytest.warns(RuntimeWarning, match="HPCCOLL_CUDA_AWARE_MPI is not set"):
        choice = choose_transport(c, "cupy")
    assert choice.name == "staged" and "share one GPU" in choice.reason
    explicit = fresh(transport="nccl")
    for _ in range(2):  # the refusal is cached, and raised again
        with pytest.raises(hpccoll.TransportUnavailable, match=r"ranks 0 and 1 would share one GPU \(PCI bus"):
            choose_transport(explicit, "cupy")


@pytest.mark.mpi(min_size=2)
def test_binding_refuses_a_duplicate_gpu(comm, runtime):
    """Even past hpccoll's probe, the stand-in refuses two ranks on one GPU, as NCCL does."""
    uid = comm.mpi.bcast(standin.get_unique_id() if comm.rank == 0 else None, root=0)
    with pytest.raises(NcclError, match="Duplicate GPU detected: rank 0 and rank 1"):
        standin.NcclCommunicator(comm.size, uid, comm.rank)


@pytest.mark.mpi(min_size=2)
def test_auto_falls_back_to_declared_cuda_mpi(fresh, runtime, monkeypatch):
    runtime.devices = 1
    monkeypatch.setenv("HPCCOLL_CUDA_AWARE_MPI", "1")
    choice = choose_transport(fresh(), "cupy")
    assert choice.name == "cuda_mpi" and "HPCCOLL_CUDA_AWARE_MPI=1" in choice.reason


def test_one_rank_on_one_gpu_is_fine(comm, fresh, runtime):
    runtime.devices = 1
    solo = fresh().split(comm.rank)  # a one-rank communicator on every rank
    try:
        assert choose_transport(solo, "cupy").name == "nccl"
        assert nccl_of(solo).device == 0
    finally:
        solo.free()


@pytest.mark.parametrize(
    "setup,match",
    [("no-nccl", "NCCL is missing"), ("no-gpu", "no GPU"), ("broken-bus", "RuntimeError: bus")],
)
def test_unusable_reasons(fresh, runtime, monkeypatch, setup, match):
    monkeypatch.setattr(cuda_mpi, "_detected", lambda comm: cuda_mpi.CudaAwareness(None, "no source answered"))
    if setup == "no-nccl":
        runtime.nccl, runtime.nccl_missing = None, "stand-in: NCCL switched off"
    elif setup == "no-gpu":
        runtime.devices = 0
    else:

        def bus(d):
            raise RuntimeError("bus")

        runtime.bus_ids = bus
    with pytest.raises(hpccoll.TransportUnavailable, match=f"transport 'nccl' cannot run here: .*{match}"):
        choose_transport(fresh(transport="nccl"), "cupy")
    with pytest.warns(RuntimeWarning, match="HPCCOLL_CUDA_AWARE_MPI is not set"):
        choice = choose_transport(fresh(), "cupy")
    assert choice.name == "staged" and match in choice.reason


@pytest.mark.mpi(min_size=2)
def test_one_rank_without_nccl_stops_every_rank(fresh, runtime):
    c = fresh()
    if c.rank == 1:
        runtime.nccl, runtime.nccl_missing = None, "stand-in: NCCL switched off"
    with pytest.raises(hpccoll.TransportUnavailable, match="rank 1: NCCL is missing"):
        c.transport_instance("nccl")


def test_without_cupy(fresh, comm, monkeypatch):
    """The real runtime, in an environment without CuPy (CI): a clear reason, on every rank."""
    import importlib.util

    monkeypatch.delitem(sys.modules, "cupy")  # the stand-in, installed by the fixture
    have = importlib.util.find_spec("cupy") is not None
    have = comm.mpi.allreduce(have)
    if have:
        pytest.skip("CuPy is installed here")  # the same on every rank
    with _cuda.use_runtime(None):
        with pytest.raises(hpccoll.TransportUnavailable, match="no transport can move CuPy arrays here: CuPy is not"):
            choose_transport(fresh(), "cupy")
        with pytest.raises(hpccoll.TransportUnavailable, match="transport 'staged' cannot run here: CuPy"):
            choose_transport(fresh(transport="staged"), "cupy")
        assert fresh().transport_for(np.ones(1)).name == "mpi"


def test_requested_names(fresh, runtime, monkeypatch):
    assert choose_transport(fresh(transport="mpi"), "cupy").name == "staged"
    assert choose_transport(fresh(transport="staged"), "cupy") == ("staged", "transport='staged' requested")
    choice = fresh(transport="nccl").transport_for([1, 2])
    assert choice.name == "mpi" and "applies to CuPy arrays" in choice.reason
    monkeypatch.setenv("HPCCOLL_TRANSPORT", "cuda_mpi")
    c = fresh()
    assert c.transport == "cuda_mpi" and choose_transport(c, "cupy").name == "cuda_mpi"
    monkeypatch.setenv("HPCCOLL_TRANSPORT", "gpu")
    with pytest.raises(hpccoll.ArgumentError, match="HPCCOLL_TRANSPORT: expected one of"):
        fresh()


def test_uneven_setting_validated(fresh, runtime, monkeypatch):
    monkeypatch.setenv("HPCCOLL_NCCL_UNEVEN", "pad")
    assert nccl_of(fresh()).uneven == "pad"
    monkeypatch.setenv("HPCCOLL_NCCL_UNEVEN", "sometimes")
    with pytest.raises(hpccoll.ArgumentError, match="HPCCOLL_NCCL_UNEVEN: expected one of 'auto', 'grouped', 'pad'"):
        nccl_of(fresh())
    monkeypatch.delenv("HPCCOLL_NCCL_UNEVEN")
    t = nccl_of(fresh())
    with pytest.raises(hpccoll.ArgumentError, match="uneven: expected one of"):
        t.uneven = "padded"


def test_array_on_another_gpu_refused(gpu):
    t = nccl_of(gpu)
    with cp.cuda.Device(t.device + 1):
        x = cp.ones(2)
    with pytest.raises(hpccoll.ArgumentError, match=f"expected a CuPy array on GPU {t.device}"):
        t.allreduce(None, x, "sum")
    assert calls(gpu) == []


def test_selected_device_wins(comm, fresh, runtime):
    runtime.current = 3  # the user selected GPU 3 before hpccoll's first use
    runtime.bus_ids = lambda d: f"0000:{comm.rank + 1:02X}:00.{d}"  # as if each rank had its own node
    t = nccl_of(fresh())
    assert t.device == 3 and "current device" in t.device_choice and t._nc.device_id() == 3


# --------------------------------------------------------------------------- lifetime of communicators


def test_split_gets_its_own_nccl_communicator(gpu):
    parent = nccl_of(gpu)
    sub = gpu.split(gpu.rank % 2)
    try:
        stack, x = stack_for(sub, (5,), np.float64, seed=4)
        assert_close(host(hpccoll.all_reduce(dev(x), sub)), reference(stack, "sum"))
        child = nccl_of(sub)
        assert child is not parent and child._nc is not parent._nc and child.device == parent.device
    finally:
        before = MPIStandInNcclCommunicator.destroyed
        sub.free()
        assert MPIStandInNcclCommunicator.destroyed == before + 1


def test_free_and_exit_destroy_nccl(fresh):
    c = fresh()
    t = nccl_of(c)
    before = MPIStandInNcclCommunicator.destroyed
    c.free()
    after_free = MPIStandInNcclCommunicator.destroyed
    c.free()  # idempotent
    d = fresh()
    u = nccl_of(d)
    nccl_mod._close_all()  # what the atexit hook does before MPI finalizes
    assert t._nc is None and after_free == before + 1
    assert u._nc is None and MPIStandInNcclCommunicator.destroyed == before + 2
    with pytest.raises(hpccoll.TransportUnavailable, match="closed"):
        u.allreduce(None, cp.ones(1), "sum")


def test_destroy_finishes_queued_calls(fresh, runtime):
    """``ncclCommDestroy`` completes what was queued: a result computed before free() is still right."""
    c = fresh()
    cp.cuda.Device(c.rank % runtime.devices).use()
    stack, x = stack_for(c, (3,), np.float64, seed=5)
    y = hpccoll.all_reduce(dev(x), c)
    c.free()
    assert_close(host(y), reference(stack, "sum"))


# --------------------------------------------------------------------------- staged and cuda_mpi


def test_staged_reuses_pinned_buffers(fresh, runtime):
    c = fresh(transport="staged")
    stack, x = stack_for(c, (4 * c.size, 3), np.float32, seed=1)
    repeated = [hpccoll.all_reduce(dev(x), c) for _ in range(3)]
    y = dev(x)
    hpccoll.all_reduce(y, c, out=y)
    scattered = hpccoll.reduce_scatter(dev(x), c)
    allocations = len(runtime.pinned_allocations)
    big = cp.ones(1 << 19)  # 4 MiB: grows both buffers
    grown = hpccoll.all_reduce(big, c)
    want = reference(stack, "sum")
    for got in repeated + [y]:
        assert_close(host(got), want)
    assert_close(host(scattered), block(want, 0, hpccoll.split_sizes(x.shape[0], c.size), c.rank))
    assert_close(host(grown), np.full(big.shape, float(c.size)))
    if c.size > 1:  # (one rank: the API copies without a transport)
        assert allocations == 2  # one send and one receive buffer, reused by five calls
        assert len(runtime.pinned_allocations) == 4
        assert runtime.syncs == 6 and c.transport_instance("staged").pinned_bytes >= 2 * big.nbytes


@pytest.mark.parametrize("standin_mode", ["deferred", "random"])
def test_staged_plan_reads_what_was_written(fresh, runtime, standin_mode):
    """A staged plan's host call reads its pinned copy only once the copy in (queued behind the caller's
    write of the input) has run, and its result lands before the caller reads it, call after call."""
    c = fresh(transport="staged")
    x, y = cp.empty(3 * c.size), cp.empty(3 * c.size)
    stacks = [stack_for(c, (3 * c.size,), np.float64, seed=s) for s in range(3)]
    with hpccoll.plan(hpccoll.all_reduce, x, c, out=y) as planned:
        got = []
        for _, data in stacks:
            x[...] = dev(data)  # queued on the caller's stream
            got.append(host(planned()).copy())
    for g, (stack, _) in zip(got, stacks):
        assert_close(g, reference(stack, "sum"))


@pytest.mark.parametrize("standin_mode", ["deferred", "random"])
def test_staged_plan_dropped_unfreed_waits_for_its_copy_back(fresh, runtime, standin_mode):
    """A staged plan dropped without ``free()`` while its copy back is still queued releases its pinned
    buffers only after that copy (the stand-in poisons pinned memory freed under a queued copy, and
    reports it at the next synchronisation)."""
    c = fresh(transport="staged")
    stack, x = stack_for(c, (3 * c.size,), np.float64, seed=4)
    src, y = dev(x), cp.empty(3 * c.size)
    planned = hpccoll.plan(hpccoll.all_reduce, src, c, out=y)
    planned()  # its copy back into y is queued on the current stream
    del planned
    gc.collect()
    assert_close(host(y), reference(stack, "sum"))


@pytest.mark.parametrize("standin_mode", ["deferred", "random"])
def test_staged_back_to_back_on_two_streams(fresh, runtime, standin_mode):
    """Staged calls reuse one pinned buffer: each waits until the previous copy out of it is done."""
    c = fresh(transport="staged")
    stacks = [stack_for(c, (3,), np.float64, seed=s) for s in range(4)]
    other = cp.cuda.Stream(non_blocking=True)
    results = []
    for i, (_, x) in enumerate(stacks):
        with other if i % 2 else cp.cuda.get_current_stream():
            results.append(hpccoll.all_reduce(dev(x), c))
    got = [r.get(stream=other if i % 2 else None) for i, r in enumerate(results)]
    for g, (stack, _) in zip(got, stacks):
        assert_close(g, reference(stack, "sum"))


def test_cuda_mpi_syncs_the_current_stream(fresh, runtime, monkeypatch):
    monkeypatch.setenv("HPCCOLL_CUDA_AWARE_MPI", "1")
    c = fresh(transport="cuda_mpi")
    stack, x = stack_for(c, (3 * c.size,), np.int64, seed=2)
    reduced = hpccoll.all_reduce(dev(x), c, op="max")
    g, full = shards(c, (0,), 0, SIZE_PATTERNS["uneven"](c.size), np.int16)
    gathered = hpccoll.all_gather(dev(g), c)
    req = hpccoll.all_reduce(dev(x), c, async_op=True)
    summed = req.wait()
    assert_close(host(reduced), reference(stack, "max"))
    assert_same(host(gathered), full)
    assert_close(host(summed), reference(stack, "sum"))
    assert runtime.syncs == (3 if c.size > 1 else 0)


@pytest.mark.parametrize("standin_mode", ["deferred", "random"])
@pytest.mark.parametrize("method", ["persistent", "blocking", "auto"])
def test_cuda_mpi_plan_syncs_before_mpi_reads(fresh, runtime, monkeypatch, method, standin_mode):
    """A cuda_mpi plan (host MPI's call on the device buffers, persistent when asked for) synchronises the
    caller's stream before every run and every start, once: the input written just before each call is
    what MPI reads."""
    monkeypatch.setenv("HPCCOLL_CUDA_AWARE_MPI", "1")
    c = fresh(transport="cuda_mpi")
    x, y = cp.empty(2 * c.size), cp.empty(2 * c.size)
    stacks = [stack_for(c, (2 * c.size,), np.float64, seed=s) for s in range(4)]
    with hpccoll.plan(hpccoll.all_reduce, x, c, out=y, method=method) as planned:
        got = []
        syncs = runtime.syncs
        for i, (_, data) in enumerate(stacks):
            x[...] = dev(data)  # queued on the caller's stream
            if i % 2:
                got.append(host(planned()).copy())
            else:  # the non-blocking form
                planned.start()
                got.append(host(planned.wait()).copy())
        syncs = runtime.syncs - syncs
        methods = planned.methods
    for g, (stack, _) in zip(got, stacks):
        assert_close(g, reference(stack, "sum"))
    if c.size > 1:  # auto: blocking (nothing measures device buffers); persistent where MPI has them
        persistent = method == "persistent" and c.transport_instance("cuda_mpi").persistent
        assert methods == (("persistent",) if persistent else ("blocking",))
        assert syncs == len(stacks)


def test_cuda_aware_setting(fresh, runtime, monkeypatch):
    monkeypatch.setenv("HPCCOLL_CUDA_AWARE_MPI", "0")
    with pytest.raises(hpccoll.TransportUnavailable, match="HPCCOLL_CUDA_AWARE_MPI=0 declares"):
        choose_transport(fresh(transport="cuda_mpi"), "cupy")
    monkeypatch.setenv("HPCCOLL_CUDA_AWARE_MPI", "maybe")
    with pytest.raises(
        hpccoll.ArgumentError, match="HPCCOLL_CUDA_AWARE_MPI: expected 1/true/yes/on or 0/false/no/off; got .maybe."
    ):
        choose_transport(fresh(transport="cuda_mpi"), "cupy")


@pytest.mark.mpi(min_size=2)
def test_cuda_aware_setting_must_agree(fresh, runtime, monkeypatch):
    c = fresh()
    monkeypatch.setenv("HPCCOLL_CUDA_AWARE_MPI", "1" if c.rank == 0 else "0")
    with pytest.raises(hpccoll.MismatchError, match="HPCCOLL_CUDA_AWARE_MPI: rank 0 has '1' but rank 1 has '0'"):
        cuda_mpi.cuda_aware(c)


@pytest.mark.parametrize("transport", ["staged", "cuda_mpi"])
def test_host_mpi_transports_against_numpy(fresh, runtime, monkeypatch, transport):
    """The staged and CUDA-aware paths: lists, in place, uneven, async, on the caller's stream."""
    monkeypatch.setenv("HPCCOLL_CUDA_AWARE_MPI", "1")
    c = fresh(transport=transport)
    sizes = SIZE_PATTERNS["uneven"](c.size)
    x, full = shards(c, (2, 0), 1, sizes, np.float32, seed=7)
    stack, y = stack_for(c, (sum(sizes) + c.size, 2), np.float64, seed=8)
    rows = hpccoll.split_sizes(y.shape[0], c.size)
    whole = dev(y)
    mine = whole[sum(rows[: c.rank]) : sum(rows[: c.rank + 1])]
    gathered = hpccoll.all_gather(dev(x), c, axis=1)
    listed = hpccoll.all_reduce(dev([y, y[:1]]), c, op="min")
    in_place = hpccoll.reduce_scatter(whole, c, out=mine)
    req = hpccoll.all_gather(dev(x), c, axis=1, sizes=sizes, async_op=True)
    got = [host(gathered), host(listed), host(in_place), host(req.wait())]
    assert_same(got[0], full)
    assert_close(got[1][0], reference(stack, "min"))
    assert_close(got[1][1], reference(stack[:, :1], "min"))
    assert_close(got[2], block(reference(stack, "sum"), 0, rows, c.rank))
    assert_same(got[3], full)


@pytest.mark.parametrize("transport", ["staged", "cuda_mpi", "nccl"])
def test_in_place_reduce_scatter_whose_block_overlaps_the_start(fresh, runtime, monkeypatch, transport):
    """In place, a rank's block that starts before its own length: MPI leaves the result at the start,
    and moving it into place is an overlapping copy (undefined for CuPy copies unless staged through a copy)."""
    monkeypatch.setenv("HPCCOLL_CUDA_AWARE_MPI", "1")
    c = fresh(transport=transport)
    cp.cuda.Device(c.rank % runtime.devices).use()
    sizes = [1] + [3] * (c.size - 1)
    stack, y = stack_for(c, (sum(sizes), 2), np.float64, seed=9)
    whole = dev(y)
    lo = sum(sizes[: c.rank])
    mine = whole[lo : lo + sizes[c.rank]]
    got = hpccoll.reduce_scatter(whole, c, sizes=sizes, out=mine)
    assert got is mine
    assert_close(host(mine), block(reference(stack, "sum"), 0, sizes, c.rank))


def test_waiting_on_another_stream(gpu):
    """A request launched on one stream and waited for under another: the result must still be right."""
    sizes = [2] * gpu.size
    x, full = shards(gpu, (3, 0), 1, sizes, np.float64, seed=1)
    req = hpccoll.all_gather(dev(x), gpu, axis=1, sizes=sizes, async_op=True)
    with cp.cuda.Stream(non_blocking=True):
        got = host(req.wait())
    assert_same(got, full)


def test_list_waiting_on_another_stream(gpu):
    """The same for a list form: its finishers run on the launching stream too."""
    sizes = [2] * gpu.size
    x, full = shards(gpu, (3, 0), 1, sizes, np.float64, seed=1)
    req = hpccoll.all_gather([dev(x), dev(x + 1)], gpu, axis=1, sizes=sizes, async_op=True)
    with cp.cuda.Stream(non_blocking=True):
        got = [host(g) for g in req.wait()]
    assert_same(got[0], full)
    assert_same(got[1], full + 1)


# --------------------------------------------------------------------------- faults: async errors, timeouts


@pytest.mark.mpi(min_size=2)  # one rank never reaches NCCL
def test_async_error_surfaces_and_aborts(gpu):
    """An asynchronous NCCL error is raised as CollectiveError at the next call; the communicator is aborted."""
    x = cp.ones(4)
    hpccoll.all_reduce(x, gpu).get()  # creates the NCCL communicator
    nc = nccl_of(gpu)._nc
    nc.inject_async_error("unhandled cuda error")
    with pytest.raises(hpccoll.CollectiveError, match="asynchronous error.*unhandled cuda error"):
        hpccoll.all_reduce(x, gpu)
    with pytest.raises(hpccoll.TransportUnavailable, match="closed"):
        hpccoll.all_reduce(x, gpu)
    assert nc._aborted and nccl_of(gpu)._nc is None


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("async_op", [False, True])
def test_stuck_collective_times_out(gpu, monkeypatch, async_op):
    """Under HPCCOLL_TIMEOUT a collective that never completes aborts NCCL and raises, on every rank."""
    import time

    x = cp.ones(4)
    hpccoll.all_reduce(x, gpu).get()  # creates the NCCL communicator
    nc = nccl_of(gpu)._nc
    nc.stall()  # a peer is gone: queued calls never complete
    monkeypatch.setattr(gpu, "timeout", 0.2)
    t0 = time.monotonic()
    with pytest.raises(hpccoll.CollectiveError, match="did not complete within HPCCOLL_TIMEOUT=0.2 s"):
        req = hpccoll.all_reduce(x, gpu, async_op=async_op)
        if async_op:
            assert not req.test()
            req.wait()
    assert 0.2 <= time.monotonic() - t0 < 5 and nc._aborted


@pytest.mark.mpi(min_size=2)
def test_stalled_without_timeout_would_hang(gpu):
    """Without HPCCOLL_TIMEOUT a wait on a stalled NCCL call hangs on a GPU: the stand-in says so instead."""
    x = cp.ones(4)
    hpccoll.all_reduce(x, gpu).get()
    nc = nccl_of(gpu)._nc
    nc.stall()
    y = hpccoll.all_reduce(x, gpu)
    with pytest.raises(StandInHang, match="a real GPU would hang here"):
        y.get()
    nc.abort()  # what the user must do; the queued call then exits without moving data
    assert nc._aborted


# --------------------------------------------------------------------------- MPI's logical and bitwise ops


@pytest.mark.parametrize("op", ["land", "lor", "lxor", "band", "bor", "bxor"])
@pytest.mark.parametrize("dtype", ["bool", "int8", "int16", "int32", "uint16", "uint64"])
def test_logical_ops_over_nccl(gpu, fresh, dtype, op):
    """NCCL has no logical ops: land/lor/lxor travel as min/max/sum of 0/1 bytes (lxor: the sum's parity);
    bool's bitwise ops are its logical ones; integers' bitwise ops are refused, naming the op, and run
    on ``staged``."""
    from test_logical_ops import MPI_OPS, bounds, data, logical_reference

    dtype = np.dtype(dtype)
    stack = data(gpu.size, (2 * gpu.size + 1, 3), dtype, seed=17)
    x = stack[gpu.rank]
    want = logical_reference(stack, op)
    sizes = hpccoll.split_sizes(x.shape[0], gpu.size)
    if dtype != np.bool_ and op.startswith("b") and gpu.size > 1:
        match = rf"op='{op}' \(MPI\.{op.upper()}\): expected a transport that reduces it for {dtype}.*'staged'"
        raises_everywhere(gpu, hpccoll.UnsupportedOpError, match, lambda: hpccoll.all_reduce(dev(x), gpu, op=op))
        raises_everywhere(
            gpu, hpccoll.UnsupportedOpError, match, lambda: hpccoll.reduce_scatter(dev(x), gpu, op=MPI_OPS[op])
        )
        staged = fresh(transport="staged")
        assert_same(host(hpccoll.all_reduce(dev(x), staged, op=MPI_OPS[op])), want, gpu)
        assert_same(host(hpccoll.reduce_scatter(dev(x), staged, op=op)), want[bounds(sizes, gpu.rank)], gpu)
        return
    reduced = hpccoll.all_reduce(dev(x), gpu, op=MPI_OPS[op])
    y = dev(x)
    in_place = hpccoll.all_reduce(y, gpu, op=op, out=y)
    later = hpccoll.all_reduce(dev(x), gpu, op=op, async_op=True).wait()
    scattered = hpccoll.reduce_scatter(dev(x), gpu, op=op)
    listed = hpccoll.all_reduce([dev(x), dev(x[:1])], gpu, op=op)
    assert_same(host(reduced), want, gpu)
    agree(gpu, in_place is y, "out=y did not return y")
    assert_same(host(y), want, gpu)
    assert_same(host(later), want, gpu)
    assert_same(host(scattered), want[bounds(sizes, gpu.rank)], gpu)
    assert_same(host(listed[0]), want, gpu)
    assert_same(host(listed[1]), want[:1], gpu)
    if gpu.size > 1:
        expected = {"land": standin.NCCL_MIN, "lor": standin.NCCL_MAX, "band": standin.NCCL_MIN}
        expected.update(bor=standin.NCCL_MAX, lxor=standin.NCCL_SUM, bxor=standin.NCCL_SUM)
        assert wire_types(gpu) == {standin.NCCL_UINT8}
        assert {call[3] for call in calls(gpu)} == {expected[op]}


@pytest.mark.parametrize("op", ["land", "lor", "lxor"])
def test_logical_primitives_directly(gpu, op):
    """The transport's own primitives: 0/1 results in the buffer's dtype, in place, uneven blocks,
    and a clear refusal of a bitwise op that no plan would send."""
    from test_logical_ops import logical_reference

    t = nccl_of(gpu)
    stack = (make((gpu.size, 7), np.int32, seed=23) * 256).astype(np.int32)  # nonzeros with a zero low byte
    want = logical_reference(stack, op)
    counts = [7 - gpu.size + 1 if r == 0 else 1 for r in range(gpu.size)]
    recv = cp.empty(7, np.int32)
    t.allreduce(dev(stack[gpu.rank]), recv, op)
    inplace = dev(stack[gpu.rank])
    t.allreduce(None, inplace, op)
    mine = cp.empty(counts[gpu.rank], np.int32)
    t.reduce_scatter(dev(stack[gpu.rank]), mine, counts, op)
    lo = sum(counts[: gpu.rank])
    assert_same(host(recv), want, gpu)
    assert_same(host(inplace), want, gpu)
    assert_same(host(mine), want[lo : lo + counts[gpu.rank]], gpu)
    with pytest.raises(hpccoll.UnsupportedOpError, match=r"op='band' \(MPI\.BAND\).*NCCL has no bitwise ops"):
        t.allreduce(dev(stack[gpu.rank]), recv, "band")
    assert "band" not in t.reduce_ops and {"land", "lor", "lxor"} <= t.reduce_ops


# --------------------------------------------------------------------------- plans over NCCL


@pytest.mark.parametrize("fn", ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"])
def test_plans_on_cupy_arrays(gpu, fn):
    """A plan of a CuPy collective, called again on new contents, matches the unplanned call."""
    collective = getattr(hpccoll, fn)
    x = cp.empty((4 * gpu.size, 3))
    with hpccoll.plan(collective, x, gpu) as planned:
        for k in range(3):
            x[...] = dev(make(x.shape, np.float64, seed=10 * k + gpu.rank))
            want = host(collective(x.copy(), gpu))
            got = planned()
            planned.start()
            again = planned.wait()
            agree(gpu, lambda: assert_close(host(got), want) and assert_close(host(again), want))


@pytest.mark.parametrize(
    "fn, nccl_call",
    [
        ("all_reduce", "allReduce"),
        ("all_gather", "allGather"),
        ("reduce_scatter", "reduceScatter"),
        ("broadcast", "bcast"),
        ("reduce", "reduce"),
    ],
)
def test_planned_call_is_one_nccl_call_on_the_callers_stream(gpu, runtime, fn, nccl_call):
    """The prepared common calls: pointers fixed, one NCCL call per run, on the stream current at the run."""
    if gpu.size == 1:
        pytest.skip("one rank moves nothing")
    collective = getattr(hpccoll, fn)
    _, mine = stack_for(gpu, (2 * gpu.size,), np.float64, seed=3)
    x = dev(mine)
    planned = hpccoll.plan(collective, x, gpu)
    want = host(collective(x.copy(), gpu))
    before = len(calls(gpu, nccl_call))
    cp.cuda.get_current_stream().synchronize()  # x's copy to the device, before another stream reads it
    other = cp.cuda.Stream()
    with other:
        got = planned()
        log = calls(gpu, nccl_call)[before:]
        agree(gpu, len(log) == 1 and log[0][-1] == other.ptr, f"one {nccl_call} on the current stream, got {log}")
        agree(gpu, lambda: assert_close(host(got), want))
    planned.free()
    with pytest.raises(hpccoll.HpccollError, match="freed"):
        planned()


def test_prepare_fixes_each_common_call(gpu):
    """Each common call (one NCCL call) is prepared with its arguments fixed; an uneven one is not."""
    t, p = nccl_of(gpu), gpu.size
    x, y, z = cp.empty(2), cp.empty(2 * p), cp.empty(3)
    common = {
        "allreduce": (None, y, "sum"),
        "reduce": (x, z[:2], "max", p - 1),
        "allgatherv": (x, y, [2] * p),
        "reduce_scatter": (y, x, [2] * p, "sum"),
        "bcast": (z, 0),
    }
    for primitive, args in common.items():
        fixed = t.prepare(primitive, args)
        assert "_fixed." in fixed.run.__qualname__ and fixed.steps == (fixed.run,), primitive
    if p > 1:  # (one rank: every count list is even)
        uneven = t.prepare("allgatherv", (x[: 1 + (gpu.rank == 0)], cp.empty(p + 1), [2] + [1] * (p - 1)))
        assert isinstance(uneven.run, functools.partial)  # the contract's default: the primitive each run


def test_prepared_allreduce_refuses_a_closed_transport(gpu):
    t = nccl_of(gpu)
    y = cp.empty(4)
    fixed = t.prepare("allreduce", (None, y, "sum"))
    t.close()
    with pytest.raises(hpccoll.TransportUnavailable, match="closed"):
        fixed.run()


# --------------------------------------------------------------------------- NCCL's multi-rank mode (issue 43)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize(
    "version,switch,allowed",
    [(23007, "1", True), (22809, "1", False), (23007, None, False), (23007, "0", False)],
)
def test_ranks_share_a_gpu_only_in_nccls_multi_rank_mode(fresh, runtime, monkeypatch, version, switch, allowed):
    runtime.devices = 1  # every rank picks GPU 0
    monkeypatch.setattr(standin, "VERSION", version)
    if switch is None:
        monkeypatch.delenv("NCCL_MULTI_RANK_GPU_ENABLE", raising=False)
    else:
        monkeypatch.setenv("NCCL_MULTI_RANK_GPU_ENABLE", switch)
    monkeypatch.setenv("HPCCOLL_CUDA_AWARE_MPI", "0")
    c = fresh()
    choice = choose_transport(c, "cupy")
    if not allowed:
        assert choice.name == "staged" and "NCCL_MULTI_RANK_GPU_ENABLE=1" in choice.reason, choice
        return
    assert choice.name == "nccl", choice
    x = np.arange(3.0 * (c.rank + 1)) + 10 * c.rank
    got = host(hpccoll.all_gather(dev(x), c))
    sizes = [3 * (r + 1) for r in range(c.size)]
    want = np.concatenate([np.arange(3.0 * (r + 1)) + 10 * r for r in range(c.size)])
    assert nccl_of(c).device == 0 and got.tolist() == want.tolist(), sizes
