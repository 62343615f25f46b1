"""The GPU transports' per-call paths in CPU CI (issue 12), against the stand-in runtime.

What runs here: the NCCL transport's dtype tables and public accessors, the
staged transport's stream rule (no wait on the same stream, a wait on an
event when the stream changes), refusal of stream capture by ``staged`` and
``cuda_mpi``, NCCL under ``HPCCOLL_TIMEOUT`` during capture, and the CPU
proxy of ``make bench-overhead``. The stand-in runtime (``tests/standin_nccl.py``)
is extended here by subclassing, for streams and capture.
"""

import numpy as np
import pytest

import hpccoll
from hpccoll.transports import _cuda
from hpccoll.transports import nccl as nccl_mod
from standin_nccl import StandInRuntime

pytestmark = pytest.mark.mpi

CAPTURE_ERROR = "cudaErrorStreamCaptureUnsupported: operation not permitted when stream is capturing"


class Event:
    """An event that says which stream it was recorded on and counts its waits."""

    def __init__(self, runtime, stream):
        self.runtime, self.stream, self.done = runtime, stream, True

    def synchronize(self):
        self.runtime.waits.append(self.stream)


class StreamsRuntime(StandInRuntime):
    """The stand-in with a current stream that tests switch, and CUDA's refusals during capture."""

    def __init__(self):
        super().__init__()
        self.current_stream = StandInRuntime.STREAM
        self.waits = []
        self.capturing = False
        self.queries = 0

    def stream(self):
        return self.current_stream

    def record(self):
        return Event(self, self.current_stream)

    def is_capturing(self):
        self.queries += 1
        return self.capturing

    def sync_stream(self):
        if self.capturing:  # as CUDA: a capturing stream cannot be synchronised
            raise RuntimeError(CAPTURE_ERROR)
        super().sync_stream()


@pytest.fixture
def rt(monkeypatch):
    for name in ("HPCCOLL_CUDA_AWARE_MPI", "HPCCOLL_NCCL_UNEVEN", "HPCCOLL_TRANSPORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(nccl_mod, "_CHOSEN", None)
    runtime = StreamsRuntime()
    with _cuda.use_runtime(runtime):
        yield runtime


@pytest.fixture
def comm_of(comm, rt):
    made = []

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
    for name in ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64",
                 "complex64", "complex128", "bool", "int16", "uint16"):
        assert np.dtype(name) in t._reduce and np.dtype(name) in t._move
    assert t._move[np.dtype("complex128")].scale == 2 and t._move[np.dtype("int16")].scale == 2
    assert t._reduce[np.dtype("int16")] is None  # widened to int32 by the transport
    assert t.communicator is t._nc


def test_nccl_non_native_byte_order_moves_as_bytes(comm_of):
    """A dtype NCCL cannot reduce is refused, but its bytes can still be gathered (never mapped by name)."""
    c, t = comm_of("nccl")
    big = np.dtype(">f4")
    x = (np.arange(3) + c.rank).astype(big)
    recv = np.empty(3 * c.size, big)
    t.allgatherv(x, recv, [3] * c.size)
    with pytest.raises(hpccoll.DTypeError, match="expected a dtype NCCL reduces"):
        t.allreduce(None, np.ones(2, big), "sum")
    want = np.concatenate([np.arange(3) + r for r in range(c.size)]).astype(big)
    assert recv.tobytes() == want.tobytes() and t._move[big].scale == 4


def test_nccl_counts_any_sequence(comm_of):
    c, t = comm_of("nccl")
    x = np.full(8, c.rank, np.int32)
    got = []
    for counts in ([2] * c.size, (2,) * c.size, range(2, 2 + c.size), [2, 0, 1, 3][: c.size]):
        mine = counts[c.rank]
        recv = np.empty(sum(counts), np.int32)
        t.allgatherv(x[:mine].copy(), recv, counts)  # any Sequence (it has count())
        got.append((recv, np.repeat(np.arange(c.size, dtype=np.int32), counts)))
    for recv, want in got:
        np.testing.assert_array_equal(recv, want)


def test_nccl_timeout_does_not_wait_during_capture(comm_of, rt, monkeypatch):
    """Under HPCCOLL_TIMEOUT a captured collective is not waited for (nothing runs during capture)."""

    class Never:
        done = False

        def synchronize(self):
            raise AssertionError("waited during capture")

    c, t = comm_of("nccl")
    monkeypatch.setattr(c, "timeout", 0.1)
    monkeypatch.setattr(rt, "record", lambda: Never())
    rt.capturing = True
    x = np.ones(4)
    t.allreduce(None, x, "sum")  # enqueued (the stand-in runs it at once), not waited for
    t.reduce_scatter(np.ones(2 * c.size), np.empty(2), [2] * c.size, "sum")
    t.allgatherv(np.ones(2), np.empty(2 * c.size), [2] * c.size)
    np.testing.assert_array_equal(x, np.full(4, float(c.size)))


# --------------------------------------------------------------------------- staged


def test_staged_waits_only_when_the_stream_changes(comm_of, rt):
    c, t = comm_of("staged")
    x = np.arange(4.0) + c.rank
    want = sum(np.arange(4.0) + r for r in range(c.size))
    results = []
    for _ in range(3):  # the same stream: stream order covers the last copy back, no waits
        y = np.empty(4)
        t.allreduce(x, y, "sum")
        results.append(y)
    same_stream_waits = list(rt.waits)
    rt.current_stream = 0x51DE  # another stream: the copy back recorded on the first must be waited for
    y = np.empty(4)
    t.allreduce(x, y, "sum")
    results.append(y)
    switch_waits = list(rt.waits)
    t.close()  # releasing the buffers waits for the last copy back
    for y in results:
        np.testing.assert_array_equal(y, want)
    assert same_stream_waits == []
    assert switch_waits == [StandInRuntime.STREAM]
    assert rt.waits == [StandInRuntime.STREAM, 0x51DE]
    assert rt.syncs == 4  # one stream synchronisation per call, as before


def test_staged_views_reused_and_regrown(comm_of, rt):
    c, t = comm_of("staged")
    small, large = np.ones(8, np.float32), np.ones(1 << 19)  # 32 B, then 4 MiB: the buffers grow
    for _ in range(2):
        t.allreduce(small, np.empty_like(small), "sum")
    view = t._views["recv"][2]
    y = np.empty_like(small)
    t.allreduce(small, y, "sum")
    reused = t._views["recv"][2] is view
    big = np.empty_like(large)
    t.allreduce(large, big, "sum")
    assert reused and len(rt.pinned_allocations) == 4  # send and recv, then both again, larger
    np.testing.assert_array_equal(y, np.full(8, c.size, np.float32))
    np.testing.assert_array_equal(big, np.full(1 << 19, float(c.size)))
    assert rt.waits == [StandInRuntime.STREAM]  # growing released the old recv buffer after its copy back


# --------------------------------------------------------------------------- stream capture


@pytest.mark.parametrize("name", ["staged", "cuda_mpi"])
def test_synchronising_transports_refuse_capture(comm_of, rt, name):
    c, t = comm_of(name)
    x = np.ones(3)
    ok = np.empty(3)
    t.allreduce(x, ok, "sum")  # outside capture: works, and never asks about capture
    asked_before = rt.queries
    rt.capturing = True
    calls = [
        lambda: t.allreduce(x, np.empty(3), "sum"),
        lambda: t.allgatherv(x, np.empty(3 * c.size), [3] * c.size),
        lambda: t.reduce_scatter(np.ones(3 * c.size), np.empty(3), [3] * c.size, "sum"),
    ]
    if name == "cuda_mpi":
        calls.append(lambda: t.iallreduce(x, np.empty(3), "sum"))
    for call in calls:  # every rank captures and raises before any MPI call: nobody waits
        with pytest.raises(hpccoll.TransportUnavailable, match=f"transport '{name}' cannot run during CUDA stream "
                           "capture: it waits on the host") as info:
            call()
        assert CAPTURE_ERROR in str(info.value.__cause__)
    rt.capturing = False
    t.allreduce(x, ok, "sum")  # and works again after the capture
    assert asked_before == 0
    np.testing.assert_array_equal(ok, np.full(3, float(c.size)))


def test_other_failures_are_not_called_capture(comm_of, rt, monkeypatch):
    _, t = comm_of("staged")

    def broken():
        raise RuntimeError("cudaErrorLaunchFailure: unspecified launch failure")

    monkeypatch.setattr(rt, "sync_stream", broken)
    with pytest.raises(RuntimeError, match="cudaErrorLaunchFailure"):
        t.allreduce(np.ones(2), np.empty(2), "sum")


def test_cupy_runtime_capture_query(monkeypatch):
    """``CupyRuntime.is_capturing`` over a fake CuPy: True, False, and CuPy's refusals counted as capturing."""
    from types import SimpleNamespace

    answers = []

    class Stream:
        ptr = 7

        def is_capturing(self):
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

    rt = _cuda.CupyRuntime.__new__(_cuda.CupyRuntime)
    api = SimpleNamespace(memcpyAsync=None, memcpyDeviceToHost=2, memcpyHostToDevice=1)
    rt._bind(SimpleNamespace(cuda=SimpleNamespace(get_current_stream=lambda: Stream(), runtime=api, Event=None)))
    answers[:] = [True, False, RuntimeError("the stream was capturing, but an error has invalidated the capture "
                  "sequence"), RuntimeError("cudaErrorStreamCaptureImplicit: operation not permitted"),
                  RuntimeError("streamIsCapturing is not supported in ROCm")]
    assert [rt.is_capturing() for _ in range(5)] == [True, False, True, True, False]
    assert _cuda.capture_query(object())() is False


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


class ReusingRuntime(StreamsRuntime):
    """The stand-in with ``record_again``, as ``CupyRuntime`` has it: one event, recorded again."""

    made = 0

    def record(self):
        ReusingRuntime.made += 1
        return super().record()

    def record_again(self, event):
        if event is None:
            return self.record()
        event.stream = self.current_stream
        return event


def test_staged_records_one_event_again(comm, monkeypatch):
    monkeypatch.setattr(nccl_mod, "_CHOSEN", None)
    rt = ReusingRuntime()
    ReusingRuntime.made = 0
    with _cuda.use_runtime(rt):
        c = hpccoll.Communicator(comm.mpi, transport="staged")
        try:
            t = c.transport_instance("staged")
            x, y = np.ones(4), np.empty(4)
            for _ in range(3):
                t.allreduce(x, y, "sum")
            first = t._event
            rt.current_stream = 0x51DE
            t.allreduce(x, y, "sum")
            same = t._event is first
        finally:
            c.free()
    assert ReusingRuntime.made == 1 and same
    assert rt.waits == [StandInRuntime.STREAM, 0x51DE]  # the switch, then close()
    np.testing.assert_array_equal(y, np.full(4, float(comm.size)))


def test_cupy_runtime_calls():
    """``CupyRuntime``'s stream, copy and event calls, as CuPy's API names them, over a recording fake."""
    from types import SimpleNamespace

    log = []

    class Event:
        def __init__(self, block=False, disable_timing=False, interprocess=False):
            log.append(("Event", disable_timing))

    class Stream:
        ptr = 0xABC

        def synchronize(self):
            log.append(("synchronize",))

        def record(self, event=None):
            log.append(("record", event))
            return event

    api = SimpleNamespace(memcpyDeviceToHost=2, memcpyHostToDevice=1,
                          memcpyAsync=lambda *args: log.append(("memcpyAsync",) + args))
    rt = _cuda.CupyRuntime.__new__(_cuda.CupyRuntime)
    rt._bind(SimpleNamespace(cuda=SimpleNamespace(get_current_stream=lambda: Stream(), runtime=api, Event=Event)))
    device = SimpleNamespace(nbytes=16, data=SimpleNamespace(ptr=0xD000))
    host = np.empty(4, np.float32)
    rt.to_host(device, host)
    rt.to_device(host, device)
    rt.to_host(SimpleNamespace(nbytes=0, data=None), host[:0])  # nothing to copy: no call
    rt.sync_stream()
    ev = rt.record()
    again = rt.record_again(ev)
    fresh = rt.record_again(None)
    assert rt.stream() == 0xABC and again is ev and fresh is not ev
    address = host.ctypes.data
    assert log[:3] == [("memcpyAsync", address, 0xD000, 16, 2, 0xABC), ("memcpyAsync", 0xD000, address, 16, 1, 0xABC),
                       ("synchronize",)]
    assert log[3][0] == "Event" and log[3][1] is True and log[4] == ("record", ev) and log[5] == ("record", ev)
    assert log[6][0] == "Event" and log[7][0] == "record" and len(log) == 8
    readonly = np.ones(4, np.float32)
    readonly.flags.writeable = False
    assert _cuda._host_address(readonly) == readonly.ctypes.data
