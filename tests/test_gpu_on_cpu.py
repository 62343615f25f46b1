"""The GPU transports' per-call paths in CPU CI (issue 12), against the stand-in runtime.

What runs here: the NCCL transport's dtype tables and public accessors, the
staged transport's stream rule (no wait on the same stream, a wait on an
event when the stream changes), refusal of stream capture by ``staged`` and
``cuda_mpi``, NCCL under ``HPCCOLL_TIMEOUT`` during capture, and the CPU
proxy of ``make bench-overhead``. The transports run on arrays of the CuPy
stand-in (``tests/standin_cupy.py``, installed as ``cupy`` for each test) and
its real streams, through ``tests/standin_nccl.py``'s ``StandInRuntime``,
extended here by subclassing: events that log which stream each wait was
for, and stream capture (which the stand-in does not model) with CUDA's
refusal to synchronise a capturing stream.
"""

import ctypes
import sys
import warnings

import numpy as np
import pytest
import standin_cupy as cp
from conftest import make
from standin_nccl import StandInRuntime
from test_nccl_standin import dev, host

import hpccoll
from hpccoll.transports import _cuda, cuda_mpi
from hpccoll.transports import nccl as nccl_mod

pytestmark = pytest.mark.mpi

CAPTURE_ERROR = "cudaErrorStreamCaptureUnsupported: operation not permitted when stream is capturing"


class LoggedEvent(cp.Event):
    """A stand-in event that logs, in its runtime's ``waits``, the handle of the stream each wait is for."""

    def __init__(self, runtime):
        super().__init__(disable_timing=True)
        self.runtime = runtime

    def synchronize(self):
        self.runtime.waits.append(self.stream.ptr)
        super().synchronize()


class StreamsRuntime(StandInRuntime):
    """The stand-in with logged event waits, and CUDA's refusals during (simulated) stream capture."""

    def __init__(self):
        super().__init__()
        self.waits = []
        self.capturing = False
        self.queries = 0

    def record(self):
        return cp.get_current_stream().record(LoggedEvent(self))

    def is_capturing(self):
        self.queries += 1
        return self.capturing

    def sync_stream(self):
        if self.capturing:  # as CUDA: a capturing stream cannot be synchronised
            raise RuntimeError(CAPTURE_ERROR)
        super().sync_stream()


class ReusingRuntime(StreamsRuntime):
    """The stand-in with ``record_again``, as ``CupyRuntime`` has it: one event, recorded again."""

    made = 0

    def record(self):
        ReusingRuntime.made += 1
        return super().record()

    def record_again(self, event):
        if event is None:
            return self.record()
        cp.get_current_stream().record(event)
        return event


@pytest.fixture
def rt(request, monkeypatch):
    """A fresh stand-in GPU (``StreamsRuntime``, or the class a test passes indirectly), the caller on a
    non-blocking stream of its own; afterwards everything queued runs, and any race fails the test."""
    for name in ("HPCCOLL_CUDA_AWARE_MPI", "HPCCOLL_NCCL_UNEVEN", "HPCCOLL_TRANSPORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(nccl_mod, "_CHOSEN", None)
    monkeypatch.setattr(cuda_mpi, "_warned", False)
    monkeypatch.setitem(sys.modules, "cupy", cp)
    runtime = getattr(request, "param", StreamsRuntime)()
    with _cuda.use_runtime(runtime), cp.cuda.Stream(non_blocking=True):
        yield runtime
        cp.GPU.synchronize()


@pytest.fixture
def comm_of(comm, rt):
    made = []
    cp.cuda.Device(comm.rank % rt.devices).use()  # one GPU per rank, chosen before the transport is made

    def new(name):
        made.append(hpccoll.Communicator(comm.mpi, transport=name))
        return made[-1], made[-1].transport_instance(name)

    yield new
    for c in reversed(made):
        c.free()


# --------------------------------------------------------------------------- nccl


def test_nccl_tables_keyed_by_dtype(comm_of):
    _, t = comm_of("nccl")
    assert t.nccl_datatype(np.float32) == t.nccl_datatype("float32") == t._types["float32"]
    assert t.nccl_datatype(np.dtype("q")) == t.nccl_datatype(np.dtype("l")) == t._types["int64"]
    assert t.nccl_op("max") == t._ops["max"]
    for bad in (np.complex64, np.bool_, np.int16):
        with pytest.raises(hpccoll.DTypeError, match="dtype: expected a dtype NCCL reduces"):
            t.nccl_datatype(bad)
    with pytest.raises(hpccoll.ArgumentError, match="op: expected one of 'sum', 'prod', 'max', 'min'; got 'avg'"):
        t.nccl_op("avg")
    # every dtype the API sends has its entries before the first call; bfloat16 is added on first sight
    for name in (
        "int8",
        "uint8",
        "int32",
        "uint32",
        "int64",
        "uint64",
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
        "bool",
        "int16",
        "uint16",
    ):
        assert np.dtype(name) in t._reduce and np.dtype(name) in t._move
    assert t._move[np.dtype("complex128")].scale == 2 and t._move[np.dtype("int16")].scale == 2
    assert t._reduce[np.dtype("int16")] is None  # widened to int32 by the transport
    assert t.communicator is t._nc


def test_nccl_non_native_byte_order_moves_as_bytes(comm_of):
    """A dtype NCCL cannot reduce is refused, but its bytes can still be gathered (never mapped by name)."""
    c, t = comm_of("nccl")
    big = np.dtype(">f4")
    x = dev((np.arange(3) + c.rank).astype(big))
    recv = cp.empty(3 * c.size, big)
    t.allgatherv(x, recv, [3] * c.size)
    with pytest.raises(hpccoll.DTypeError, match="expected a dtype NCCL reduces"):
        t.allreduce(None, dev(np.ones(2, big)), "sum")
    got = host(recv)
    want = np.concatenate([np.arange(3) + r for r in range(c.size)]).astype(big)
    assert got.dtype == big and got.tobytes() == want.tobytes() and t._move[big].scale == 4


def test_nccl_counts_any_sequence(comm_of):
    c, t = comm_of("nccl")
    x = np.full(8, c.rank, np.int32)
    got = []
    for counts in ([2] * c.size, (2,) * c.size, range(2, 2 + c.size), [2, 0, 1, 3][: c.size]):
        mine = counts[c.rank]
        recv = cp.empty(sum(counts), np.int32)
        t.allgatherv(dev(x[:mine]), recv, counts)  # any Sequence (it has count())
        got.append((recv, np.repeat(np.arange(c.size, dtype=np.int32), counts)))
    for recv, want in got:
        np.testing.assert_array_equal(host(recv), want)


def test_nccl_timeout_does_not_wait_during_capture(comm_of, rt, monkeypatch):
    """Under HPCCOLL_TIMEOUT a captured collective is not waited for (nothing runs during capture)."""

    class Never:
        done = False

        def synchronize(self):
            raise AssertionError("waited during capture")

    c, t = comm_of("nccl")
    monkeypatch.setattr(c, "timeout", 0.1)
    monkeypatch.setattr(rt, "record", lambda: Never())
    x, scattered, gathered = dev(np.ones(4)), cp.empty(2), cp.empty(2 * c.size)
    stream = cp.get_current_stream()
    rt.capturing = True
    t.allreduce(None, x, "sum")  # enqueued on the stream, not waited for
    t.reduce_scatter(dev(np.ones(2 * c.size)), scattered, [2] * c.size, "sum")
    t.allgatherv(dev(np.ones(2)), gathered, [2] * c.size)
    queued = len(stream.ops) - stream.done_ops  # nothing synchronised: the NCCL calls are still queued
    rt.capturing = False
    got = host([x, scattered, gathered])
    assert rt.queries == 3  # each call asked, and none waited
    assert cp.GPU.mode != "deferred" or queued >= 3
    np.testing.assert_array_equal(got[0], np.full(4, float(c.size)))
    np.testing.assert_array_equal(got[1], np.full(2, float(c.size)))
    np.testing.assert_array_equal(got[2], np.ones(2 * c.size))


# --------------------------------------------------------------------------- staged


def test_staged_waits_only_when_the_stream_changes(comm_of, rt):
    c, t = comm_of("staged")
    first, other = cp.get_current_stream(), cp.cuda.Stream(non_blocking=True)
    x = np.arange(4.0) + c.rank
    want = sum(np.arange(4.0) + r for r in range(c.size))
    results = []
    for _ in range(3):  # the same stream: stream order covers the last copy back, no waits
        y = cp.empty(4)
        t.allreduce(dev(x), y, "sum")
        results.append(y)
    same_stream_waits = list(rt.waits)
    with other:  # another stream: the copy back recorded on the first must be waited for
        y = cp.empty(4)
        t.allreduce(dev(x), y, "sum")
        switch_waits = list(rt.waits)
        t.close()  # releasing the buffers waits for the last copy back
    got = [host(y) for y in results[:3]] + [y.get(stream=other)]
    for g in got:
        np.testing.assert_array_equal(g, want)
    assert same_stream_waits == []
    assert switch_waits == [first.ptr]
    assert rt.waits == [first.ptr, other.ptr]
    assert rt.syncs == 4  # one stream synchronisation per call, as before


def test_staged_views_reused_and_regrown(comm_of, rt):
    c, t = comm_of("staged")
    first = cp.get_current_stream()
    small, large = np.ones(8, np.float32), np.ones(1 << 19)  # 32 B, then 4 MiB: the buffers grow
    for _ in range(2):
        t.allreduce(dev(small), cp.empty(small.shape, small.dtype), "sum")
    view = t._views["recv"][2]
    y = cp.empty(small.shape, small.dtype)
    t.allreduce(dev(small), y, "sum")
    reused = t._views["recv"][2] is view
    big = cp.empty(large.shape, large.dtype)
    t.allreduce(dev(large), big, "sum")
    got_y, got_big = host(y), host(big)
    assert reused and len(rt.pinned_allocations) == 4  # send and recv, then both again, larger
    np.testing.assert_array_equal(got_y, np.full(8, c.size, np.float32))
    np.testing.assert_array_equal(got_big, np.full(1 << 19, float(c.size)))
    # growing released the old recv buffer after its copy back (the stand-in poisons a pinned
    # buffer freed under a queued copy and fails the test at the next synchronisation)
    assert rt.waits == [first.ptr]


def _staged_cases(p):
    """name -> (collective, options, this rank's input shape): every primitive a staged plan fixes."""
    return {
        "all_reduce": (hpccoll.all_reduce, {}, (5,)),
        "all_reduce-in-place": (hpccoll.all_reduce, {"out": "x"}, (5,)),
        "all_gather": (hpccoll.all_gather, {}, (2, 3)),
        "reduce_scatter": (hpccoll.reduce_scatter, {}, (2 * p, 2)),
        "all_to_all": (hpccoll.all_to_all, {}, (2 * p,)),
        "broadcast": (hpccoll.broadcast, {"root": p - 1}, (4,)),
        "broadcast-in-place": (hpccoll.broadcast, {"out": "x"}, (4,)),
        "reduce": (hpccoll.reduce, {"root": p // 2}, (3, 2)),
        "gather": (hpccoll.gather, {"root": p - 1}, (2, 2)),
        "scatter": (hpccoll.scatter, {}, (2 * p,)),
    }


@pytest.mark.parametrize("case", sorted(_staged_cases(1)))
def test_staged_plan_keeps_its_pinned_buffers(comm_of, rt, case):
    """A staged plan allocates its pinned buffers once, when it is made: its runs allocate none and match
    the unplanned call on new data each time; its host call is host MPI's prepared one (a persistent
    request where host MPI has them, when asked for)."""
    c, _ = comm_of("staged")
    fn, options, shape = _staged_cases(c.size)[case]
    x = cp.empty(shape)
    opts = {k: (x if v == "x" else v) for k, v in options.items()}
    with hpccoll.plan(fn, x, c, method="persistent", **opts) as planned:
        made = list(rt.pinned_allocations)
        results = []
        for k in range(3):
            data = make(shape, np.float64, seed=10 * k + c.rank)
            x[...] = dev(data)  # queued on the caller's stream
            results.append((data, host(planned()).copy()))
        runs_made = rt.pinned_allocations[len(made) :]
        methods = planned.methods
    for data, got in results:
        want = host(fn(dev(data), c, **{k: v for k, v in opts.items() if k != "out"}))
        np.testing.assert_allclose(got, want, rtol=1e-12)
    assert runs_made == []
    if c.size > 1:  # on one rank a plan moves nothing
        assert methods == (("persistent",) if c.host_transport().persistent else ("blocking",))


def test_staged_plan_waits_only_when_the_stream_changes(comm_of, rt):
    c, t = comm_of("staged")
    first, other = cp.get_current_stream(), cp.cuda.Stream(non_blocking=True)
    x = dev(np.arange(4.0) + c.rank)
    want = sum(np.arange(4.0) + r for r in range(c.size))
    planned = hpccoll.plan(hpccoll.all_reduce, x, c)
    got = [host(planned()).copy() for _ in range(3)]  # the same stream: no waits
    same_stream_waits = list(rt.waits)
    with other:  # another stream: the plan's copy back recorded on the first is waited for
        y = planned()
        switch_waits = list(rt.waits)
        planned.free()  # releasing its buffers waits for its last copy back
        got.append(y.get(stream=other))
    for g in got:
        np.testing.assert_array_equal(g, want)
    if c.size > 1:  # on one rank a plan moves nothing (an all-reduce of one rank is the identity)
        assert same_stream_waits == [] and switch_waits == [first.ptr] and rt.waits == [first.ptr, other.ptr]
    assert t.pinned_bytes == 0  # the transport's own buffers were never used


# --------------------------------------------------------------------------- stream capture


@pytest.mark.parametrize("name", ["staged", "cuda_mpi"])
def test_synchronising_transports_refuse_capture(comm_of, rt, name):
    c, t = comm_of(name)
    x = dev(np.ones(3))
    ok = cp.empty(3)
    t.allreduce(x, ok, "sum")  # outside capture: works, and never asks about capture
    asked_before = rt.queries
    rt.capturing = True
    calls = [
        lambda: t.allreduce(x, cp.empty(3), "sum"),
        lambda: t.allgatherv(x, cp.empty(3 * c.size), [3] * c.size),
        lambda: t.reduce_scatter(dev(np.ones(3 * c.size)), cp.empty(3), [3] * c.size, "sum"),
    ]
    if name == "cuda_mpi":
        calls.append(lambda: t.iallreduce(x, cp.empty(3), "sum"))
    for call in calls:  # every rank captures and raises before any MPI call: nobody waits
        with pytest.raises(
            hpccoll.TransportUnavailable,
            match=f"transport '{name}' cannot run during CUDA stream capture: it waits on the host",
        ) as info:
            call()
        assert CAPTURE_ERROR in str(info.value.__cause__)
    asked_during = rt.queries
    rt.capturing = False
    again = cp.empty(3)
    t.allreduce(x, again, "sum")  # and works again after the capture
    got = host([ok, again])
    assert asked_before == 0 and asked_during == asked_before + len(calls) and rt.queries == asked_during
    np.testing.assert_array_equal(got[0], np.full(3, float(c.size)))
    np.testing.assert_array_equal(got[1], np.full(3, float(c.size)))


def test_other_failures_are_not_called_capture(comm_of, rt, monkeypatch):
    _, t = comm_of("staged")

    def broken():
        raise RuntimeError("cudaErrorLaunchFailure: unspecified launch failure")

    monkeypatch.setattr(rt, "sync_stream", broken)
    with pytest.raises(RuntimeError, match="cudaErrorLaunchFailure"):
        t.allreduce(dev(np.ones(2)), cp.empty(2), "sum")
    assert rt.queries == 1  # asked, and told it was not capturing
    # the failed call left its copy into the pinned buffer queued: let it finish before close() frees it
    cp.get_current_stream().synchronize()


def standin_cupy_runtime():
    """``CupyRuntime`` itself, bound to the CuPy stand-in (its calls as CuPy names them) with the NCCL stand-in."""
    import standin_nccl

    cp.GPU.reset(None, None, 0)
    rt = _cuda.CupyRuntime.__new__(_cuda.CupyRuntime)
    rt._bind(cp)
    rt.nccl, rt.nccl_missing = standin_nccl, None
    standin_nccl.RUNTIME = None
    return rt


def test_cupy_runtime_capture_query():
    """``CupyRuntime.is_capturing`` over the stand-in's ``Stream.is_capturing``: True, False, and CuPy's
    refusals (an invalidated capture, CUDA's refusal on the legacy stream) counted as capturing."""
    rt = standin_cupy_runtime()
    stream = cp.get_current_stream()
    answers = [
        True,
        False,
        RuntimeError("the stream was capturing, but an error has invalidated the capture sequence"),
        RuntimeError("cudaErrorStreamCaptureImplicit: operation not permitted"),
        RuntimeError("streamIsCapturing is not supported in ROCm"),
    ]
    seen = []
    for answer in answers:
        stream.capturing = answer
        seen.append(rt.is_capturing())
    assert seen == [True, False, True, True, False]
    assert _cuda.capture_query(object())() is False


def test_cupy_runtime_on_the_standin(comm, monkeypatch):
    """``CupyRuntime``'s device, bus id, pinned memory, copies and events, as CuPy's API names them, against the
    stand-in device: its copies are queued on the current stream and read only once that stream has run."""
    monkeypatch.setitem(sys.modules, "cupy", cp)
    rt = standin_cupy_runtime()
    assert rt.device_count() == 8 and rt.current_device() == 0 and rt.bus_id(2) == "0000:03:00.0"
    rt.use_device(1)
    assert rt.current_device() == 1
    rt.use_device(0)
    with cp.cuda.Stream(non_blocking=True) as stream:
        assert rt.stream() == stream.ptr
        pinned = rt.alloc_pinned(32)
        assert pinned.dtype == np.uint8 and pinned.nbytes == 32
        src = dev(np.arange(4.0))
        back = pinned[:32].view(np.float64)
        rt.to_host(src, back)  # queued: nothing copied yet in deferred mode
        event = rt.record()
        again = rt.record_again(event)
        event.synchronize()
        got = back.copy()
        doubled = cp.empty(4)
        back *= 2
        rt.to_device(back, doubled)
        rt.sync_stream()
        assert again is event and rt.record_again(None) is not event
    np.testing.assert_array_equal(got, np.arange(4.0))
    np.testing.assert_array_equal(host(doubled), 2 * np.arange(4.0))
    readonly = np.ones(4, np.float32)
    readonly.flags.writeable = False
    assert _cuda._host_address(readonly) == readonly.ctypes.data


def test_staged_and_nccl_on_cupy_runtime(comm, monkeypatch):
    """The staged and NCCL transports with ``CupyRuntime`` itself (on the stand-ins) as their runtime."""
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setattr(nccl_mod, "_CHOSEN", None)
    rt = standin_cupy_runtime()
    cp.cuda.Device(comm.rank % 8).use()
    results = []
    with _cuda.use_runtime(rt), cp.cuda.Stream(non_blocking=True):
        for name in ("staged", "nccl"):
            c = hpccoll.Communicator(comm.mpi, transport=name)
            t = c.transport_instance(name)
            y = cp.empty(4)
            t.allreduce(dev(np.arange(4.0) + c.rank), y, "sum")
            results.append(host(y))
            c.free()
        cp.GPU.synchronize()
    want = sum(np.arange(4.0) + r for r in range(comm.size))
    for got in results:
        np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------- the CPU proxy (make bench-overhead)


def test_overhead_gpu_section_runs(comm, monkeypatch):
    """The GPU rows of benchmarks/overhead.py run (few iterations) on the real transports and CupyRuntime."""
    import os
    import sys

    monkeypatch.setattr(nccl_mod, "_CHOSEN", None)
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks"))
    try:
        import overhead
    finally:
        sys.path.pop(0)
    rows = overhead.gpu_section(number=20, repeat=2)
    names = [r[0] for r in rows]
    assert names[:3] == ["nccl allgatherv", "nccl reduce_scatter", "nccl allreduce"] and "staged allreduce" in names
    assert all(raw > 0 and ours > 0 for _, raw, ours in rows)


@pytest.mark.parametrize("rt", [ReusingRuntime], indirect=True)
def test_staged_records_one_event_again(comm_of, rt):
    c, t = comm_of("staged")
    first, other = cp.get_current_stream(), cp.cuda.Stream(non_blocking=True)
    ReusingRuntime.made = 0
    x, y = dev(np.ones(4)), cp.empty(4)
    for _ in range(3):
        t.allreduce(x, y, "sum")
    first_event = t._back.event
    with other:
        x2, y2 = dev(np.ones(4)), cp.empty(4)
        t.allreduce(x2, y2, "sum")
        same = t._back.event is first_event
        t.close()
    got = [host(y), y2.get(stream=other)]
    assert ReusingRuntime.made == 1 and same
    assert rt.waits == [first.ptr, other.ptr]  # the switch, then close()
    for g in got:
        np.testing.assert_array_equal(g, np.full(4, float(c.size)))


# --------------------------------------------------------------------------- plans on every GPU transport


@pytest.mark.parametrize("name", ["nccl", "staged", "cuda_mpi"])
@pytest.mark.parametrize("fn", ["all_reduce", "all_gather", "broadcast"])
def test_plans_on_every_gpu_transport(comm_of, rt, name, fn):
    """A plan of a CuPy collective, with the caller's data written on its own stream just before each call:
    the stand-in fails the test on any call that reads a buffer before that write is ordered (a plan that
    skipped cuda_mpi's stream synchronisation, for one)."""
    c, _ = comm_of(name)
    collective = getattr(hpccoll, fn)
    x = cp.empty((2 * c.size, 3))
    with hpccoll.plan(collective, x, c) as planned:
        for k in range(3):
            data = make(x.shape, np.float64, seed=10 * k + c.rank)
            x[...] = dev(data)  # queued on the caller's stream
            got = host(planned())
            want = host(collective(dev(data), c))
            np.testing.assert_allclose(got, want, rtol=1e-12)


# --------------------------------------------------------------------------- the JAX adapter's GPU buffer lowering


class XlaBuffer:
    """What ``jax.experimental.buffer_callback`` hands a GPU callback (jaxlib's ``ffi.cc``, ``PyFfiAnyBuffer``),
    over a stand-in device array: ``shape``, ``dtype``, DLPack's device and capsule (``"dltensor"``, its ``data``
    the address), and the CUDA array interface with XLA's typestr: bfloat16 ``"<V2"`` (which CuPy's ``asarray``
    reads as ``|V2``), and for float8 none: XLA raises (``TypeDescriptorForPrimitiveType`` in xla/python/types.cc
    has no case for them, so the property is ``UNIMPLEMENTED``)."""

    def __init__(self, a):
        self.shape, self.dtype, self._a = a.shape, a.dtype, a

    @property
    def __cuda_array_interface__(self):
        if "float8" in self.dtype.name:
            raise RuntimeError(f"UNIMPLEMENTED: Unimplemented primitive type {self.dtype.name.upper()}")
        typestr = "<V2" if self.dtype.name == "bfloat16" else self.dtype.str
        return {"shape": self.shape, "typestr": typestr, "data": (self._a.data.ptr, False), "version": 2}

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        # a real DLPack capsule whose data pointer is the stand-in device address (NumPy describes it as bytes)
        raw = (ctypes.c_uint8 * max(self._a.nbytes, 1)).from_address(self._a.data.ptr)
        return np.ctypeslib.as_array(raw).__dlpack__()

    def __dlpack_device__(self):
        return (2, self._a.data.device_id)  # kDLCUDA


def test_dlpack_address_of_xla_buffers_of_every_dtype():
    """dlpack_address on XLA's own buffer_callback buffers (the CPU's, the same ``PyFfiAnyBuffer`` class a GPU
    callback gets): the address NumPy's view of the buffer has, for every dtype hpccoll moves, float8 included."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import ml_dtypes

    try:
        from jax.experimental.buffer_callback import buffer_callback
    except ImportError:
        pytest.skip("this JAX has no buffer_callback")
    dtypes = [np.float16, np.float32, np.float64, np.complex64, np.complex128, np.int8, np.int16, np.int32]
    dtypes += [np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.bool_]
    dtypes += [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2]
    seen = {}

    def callback(ctx, out, x):
        seen[np.dtype(x.dtype).name] = (_cuda.dlpack_address(x), np.asarray(x).ctypes.data)

    for dtype in dtypes:
        call = buffer_callback(callback, jax.ShapeDtypeStruct((3,), dtype), command_buffer_compatible=False)
        jax.block_until_ready(jax.jit(call)(jnp.zeros(3, dtype)))
    assert sorted(seen) == sorted({jnp.zeros(3, d).dtype.name for d in dtypes})  # 64-bit ones as JAX has them
    for name, (got, want) in seen.items():
        assert got == want != 0, name


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
def test_jitted_ml_dtypes_through_the_gpu_buffer_lowering(comm, monkeypatch, dtype):
    """A jitted all_reduce and all_gather of bfloat16 (and float8) through the ``"buffer"`` lowering's GPU
    callback, on stand-in device buffers described as XLA describes them, on XLA's own stream, with
    DeprecationWarning as an error: the callback's views keep the dtype, and no GPU call warns."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import ml_dtypes

    from hpccoll.adapters import jax as hcj

    if "buffer" not in hcj.LOWERINGS:
        pytest.skip("this JAX has no buffer_callback")  # the same on every rank
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setattr(nccl_mod, "_CHOSEN", None)
    monkeypatch.setattr(hcj, "LOWERING", "buffer")
    on_gpu, xla_streams = hcj._on_gpu_buffers, []

    def on_standin_gpu(fn):
        run = on_gpu(fn)

        def cpu(ctx, outs, a, token):  # XLA's CPU buffers copied to and from stand-in device buffers
            stream = cp.cuda.Stream(non_blocking=True)  # XLA's stream
            xla_streams.append(stream.ptr)
            with stream:  # XLA's input is ready on its stream
                x, y = dev(np.asarray(a)), cp.empty(outs[0].shape, outs[0].dtype)
            run(type("Ctx", (), {"stream": stream.ptr})(), [XlaBuffer(y)], XlaBuffer(x), token)
            np.asarray(outs[0])[...] = y.get(stream=stream)

        return cpu

    monkeypatch.setitem(hcj._BUFFER_CALLS, "cpu", on_standin_gpu)
    np_dtype = np.dtype(getattr(ml_dtypes, dtype))
    data = (np.arange(6) % 4 + comm.rank).astype(np_dtype)
    with _cuda.use_runtime(StandInRuntime()), warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        c = hpccoll.Communicator(comm.mpi, transport="nccl")
        cp.cuda.Device(comm.rank).use()
        x = jnp.asarray(data)
        summed = np.asarray(jax.jit(lambda v: hcj.all_reduce(v, c))(x))
        gathered = np.asarray(jax.jit(lambda v: hcj.all_gather(v, c))(x))
        cp.GPU.synchronize()
        c.free()
    want = sum((np.arange(6) % 4 + r).astype(np.float64) for r in range(comm.size))
    assert summed.dtype == np_dtype and gathered.dtype == np_dtype and len(xla_streams) == 2
    np.testing.assert_array_equal(summed.astype(np.float64), want.astype(np_dtype).astype(np.float64))
    every = np.concatenate([(np.arange(6) % 4 + r).astype(np_dtype) for r in range(comm.size)])
    np.testing.assert_array_equal(gathered.astype(np.float64), every.astype(np.float64))
