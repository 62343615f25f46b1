"""hpccoll's CuPy and NCCL calls against the real bindings, on the CPU (``make test-conformance``).

The real ``cupy-cuda12x`` and ``nvidia-nccl-cu12`` install and import without
a GPU: NCCL's host-side calls work, and every device call fails with
``cudaErrorInsufficientDriver``. A call whose arguments the binding's Cython
layer converts reaches the library, which answers for itself: NCCL on a
communicator whose handle is NULL answers ``NCCL_ERROR_INVALID_ARGUMENT``; a
wrong argument count or type raises ``TypeError`` (or ``OverflowError``)
before that. So each test makes hpccoll's own calls, with hpccoll's own
argument shapes, and passes when the library was reached or failed for the
documented reason:

* ``nccl.py``: every NCCL transport call path (each collective, even and
  uneven, chunked, complex, widened, truth-valued, rooted, point-to-point,
  prepared) runs on the stand-in device (``tests/standin_cupy.py``) with a
  tee communicator that first replays each call, as made, on a real
  ``NcclCommunicator`` with a NULL handle;
* ``_ncclboot.py``: the bootstrap (real unique id, real constructor), the
  version gates, destroy/abort on a NULL communicator;
* ``_cuda.py``: ``CupyRuntime`` on the real CuPy: each runtime call reaches
  CUDA (``cudaErrorInsufficientDriver``), the probe says why there is no GPU;
* ``staged.py`` and ``cuda_mpi.py``: every CuPy call they make goes through
  ``CupyRuntime`` (above); both transports are made without a GPU (they need
  CuPy only), so nothing of theirs runs on the device here;
* the adapters' GPU views: ``external_stream``, ``device_view`` and
  ``dlpack_address`` on the real CuPy, with no ``DeprecationWarning``;
* ``_relayout.py``: every kernel source hpccoll builds, as the real
  ``RawKernel``, compiled by the real NVRTC (``nvidia-cuda-nvrtc-cu12``) for
  sm_90; the capture query;
* ``_info.py`` and ``_bench.py``: ``info``'s GPU report, ``bench --device
  cupy``'s preflight, runtime and array calls;
* ``_base._bytes_of`` (the default sendrecv's packed bytes): ``cupy.empty``.

Not covered here, because each needs a device array or a GPU tensor, which the
real CuPy cannot make without a driver: the relayout kernel's launch (its
source compiles above), ``on_this_stream``'s ``with``/``wait_event`` after its
first stream query, ``_bench``'s ``copyto``/``asnumpy``, and the adapters'
DLPack imports and exports of CUDA arrays (``jax.py``'s eager path and
``_on_gpu_buffers``, ``torch.py``'s tensor views; JAX and torch are not in this
venv either). These run against the stand-ins (``tests/test_gpu_on_cpu.py``)
and on a GPU (``make gpu-check``).

Skipped (the whole module) where the real bindings are not installed: the
conformance venv (``.venv-conformance``) has them.
"""

import sys
import warnings

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="needs the real cupy-cuda12x (make test-conformance)")
if "standin" in getattr(cupy, "__file__", "standin"):  # pragma: no cover - a stand-in installed as cupy
    pytest.skip("needs the real CuPy, not a stand-in", allow_module_level=True)
import standin_cupy  # noqa: E402
import standin_nccl  # noqa: E402
from cupy.cuda import nccl  # noqa: E402
from standin_nccl import StandInRuntime  # noqa: E402

import hpccoll  # noqa: E402
from hpccoll.transports import _cuda, _ncclboot  # noqa: E402
from hpccoll.transports import nccl as nccl_mod  # noqa: E402

INVALID_ARGUMENT, UNHANDLED_CUDA_ERROR, INVALID_USAGE = 4, 1, 5
NO_DRIVER = "cudaErrorInsufficientDriver"


def reaches_nccl(call, *args):
    """Make ``call(*args)`` on the real binding; it must get past Cython and be refused by NCCL itself."""
    with pytest.raises(nccl.NcclError) as info:
        call(*args)
    assert info.value.status == INVALID_ARGUMENT, str(info.value)


def null_communicator():
    """A real ``NcclCommunicator`` whose ``ncclComm_t`` is NULL (never initialised)."""
    return nccl.NcclCommunicator.__new__(nccl.NcclCommunicator)


# --------------------------------------------------------------------------- the bindings themselves


def test_bindings_load_without_a_gpu():
    assert nccl.available
    assert nccl.get_version() >= 22800 and nccl.get_build_version() > 0
    assert isinstance(nccl.get_unique_id(), bytes) and len(nccl.get_unique_id()) == 128
    with pytest.raises(cupy.cuda.runtime.CUDARuntimeError, match=NO_DRIVER):
        cupy.cuda.runtime.getDeviceCount()


def test_intptr_rules():
    """What standin_nccl._intptr copies: intptr_t takes Python ints (bool too), not NumPy's integers or floats;
    size_t and int take anything with __index__ (NumPy's integers)."""
    nc, t, s = null_communicator(), nccl.NCCL_FLOAT32, nccl.NCCL_SUM
    for bad in (np.int64(4096), 4096.0):
        with pytest.raises(TypeError, match="an integer is required"):
            nc.allReduce(bad, 4096, 4, t, s, 0)
        with pytest.raises(TypeError, match="an integer is required"):
            nc.allReduce(4096, 4096, 4, t, s, bad if isinstance(bad, float) else np.int64(0))
    reaches_nccl(nc.allReduce, True, 4096, 4, t, s, 0)
    reaches_nccl(nc.allReduce, 4096, 4096, np.int64(4), np.int32(t), np.int32(s), 0)
    with pytest.raises(OverflowError):
        nc.allReduce(4096, 4096, -1, t, s, 0)
    with pytest.raises(TypeError):
        nccl.NcclCommunicator(1, tuple(nccl.get_unique_id()), 0)  # CuPy 14 takes bytes only
    with pytest.raises(TypeError, match="config"):
        nccl.NcclCommunicator(1, nccl.get_unique_id(), 0, config=object())


def test_error_carries_the_int_status():
    """What standin_nccl.NcclError copies: NcclError(int status), its message led by NCCL's name for it."""
    err = nccl.NcclError(INVALID_ARGUMENT)
    assert err.status == INVALID_ARGUMENT and str(err).startswith("NCCL_ERROR_INVALID_ARGUMENT: ")
    assert nccl.get_build_version() != nccl.get_version()  # the stand-in keeps them apart too


def test_group_calls():
    nccl.groupStart()
    nccl.groupEnd()
    with pytest.raises(nccl.NcclError) as info:
        nccl.groupEnd()
    assert info.value.status == INVALID_USAGE


# --------------------------------------------------------------------------- nccl.py: every call, as made


class Tee:
    """A stand-in communicator whose every call is first made, with the same arguments, on a real one with a
    NULL handle (which must reach NCCL), then run on the stand-in (which moves the data)."""

    def __init__(self, inner):
        self._inner, self._real, self.seen = inner, null_communicator(), []

    def __getattr__(self, name):
        inner = getattr(self._inner, name)
        real = getattr(self._real, name, None)
        if name not in CALLS:
            return inner

        def call(*args):
            self.seen.append(name)
            reaches_nccl(real, *args)
            return inner(*args)

        return call


CALLS = {"allGather", "allReduce", "reduceScatter", "broadcast", "bcast", "reduce", "send", "recv"}


class RealModule:
    """The real ``cupy.cuda.nccl`` for constants, versions and group calls; ``NcclCommunicator`` is the stand-in's
    behind a :class:`Tee`, since a real communicator cannot be made without a GPU."""

    def __init__(self):
        self.tees = []

    def __getattr__(self, name):
        return getattr(nccl, name)

    def NcclCommunicator(self, ndev, commId, rank):  # noqa: N802, N803 - the binding's names
        # (the real constructor's signature is checked by test_bootstrap_on_the_real_binding)
        tee = Tee(standin_nccl.NcclCommunicator(ndev, commId, rank))
        self.tees.append(tee)
        return tee

    @staticmethod
    def get_unique_id():
        return standin_nccl.get_unique_id()  # the stand-in's rendezvous needs its own id

    @staticmethod
    def groupStart():  # noqa: N802
        nccl.groupStart()
        standin_nccl.groupStart()

    @staticmethod
    def groupEnd():  # noqa: N802
        try:
            nccl.groupEnd()
        except nccl.NcclError as exc:  # NCCL reports the group's NULL-communicator calls again here
            assert exc.status == INVALID_ARGUMENT, str(exc)
        standin_nccl.groupEnd()


@pytest.fixture
def teed(monkeypatch):
    """A NCCL transport on the stand-in device whose NCCL module is the real binding (constants, versions,
    groups) and whose communicator calls are replayed on a real NULL communicator first."""
    from mpi4py import MPI

    monkeypatch.setitem(sys.modules, "cupy", standin_cupy)
    monkeypatch.setattr(nccl_mod, "_CHOSEN", None)
    module = RealModule()
    rt = StandInRuntime(nccl=module)
    comm = hpccoll.Communicator(MPI.COMM_WORLD, transport="nccl")
    with _cuda.use_runtime(rt):
        t = comm.transport_instance("nccl")
        yield comm, t, module
        standin_cupy.GPU.synchronize()
    comm.free()


def dev(a):
    out = standin_cupy.empty(a.shape, a.dtype)
    out[...] = standin_cupy.asarray(a)
    return out


def test_every_nccl_transport_call_reaches_nccl(teed):
    """Each call path of the NCCL transport, its calls replayed on the real binding (Tee) and its results checked."""
    import ml_dtypes

    comm, t, module = teed
    p, me = comm.size, comm.rank
    results = []
    for dtype in ("float32", "complex128", "int16", "bool", ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn):
        x = np.arange(6 * p).astype(dtype)
        results.append((hpccoll.all_gather(dev(x[:3]), comm), np.tile(x[:3], p)))
        if np.dtype(dtype).kind != "c":
            results.append((hpccoll.all_reduce(dev(x[:4]), comm, op="max"), x[:4]))
    x = np.arange(4.0) + me
    results.append((hpccoll.all_reduce(dev(x), comm), sum(np.arange(4.0) + r for r in range(p))))
    results.append((hpccoll.all_reduce(dev(x.astype(np.complex64)), comm, op="prod"), None))
    results.append((hpccoll.all_reduce(dev(x.astype(np.int16)), comm), None))
    results.append((hpccoll.all_reduce(dev(x > 1), comm, op="lxor"), None))
    results.append((hpccoll.reduce_scatter(dev(np.ones(2 * p)), comm), np.full(2, float(p))))
    sizes = [1 + r for r in range(p)]
    results.append((hpccoll.all_gather(dev(np.ones(sizes[me])), comm, sizes=sizes), np.ones(sum(sizes))))
    results.append((hpccoll.all_to_all(dev(np.arange(2.0 * p)), comm), None))
    results.append((hpccoll.broadcast(dev(x), comm, root=p - 1), np.arange(4.0) + p - 1))
    results.append((hpccoll.reduce(dev(x), comm, root=0), None))
    results.append((hpccoll.gather(dev(x), comm, root=0), None))
    results.append((hpccoll.scatter(dev(np.arange(2.0 * p)), comm, root=0), np.arange(2.0 * me, 2.0 * me + 2)))
    results.append((hpccoll.shift(dev(x), comm), None))
    # the transport's primitives themselves (a one-rank collective above may move nothing)
    y = dev(np.arange(4.0))
    t.allreduce(None, y, "sum")
    t.allgatherv(dev(np.ones(2)), standin_cupy.empty(2 * p), [2] * p)
    t.allgatherv(dev(np.ones(sizes[me])), standin_cupy.empty(sum(sizes)), sizes)
    t.reduce_scatter(dev(np.ones(2 * p)), standin_cupy.empty(2), [2] * p, "sum")
    t.reduce_scatter(dev(np.ones(sum(sizes))), standin_cupy.empty(sizes[me]), sizes, "sum")
    t.bcast(dev(np.ones(3)), 0)
    t.reduce(None, dev(np.ones(3)), "sum", 0)
    t.gatherv(dev(np.ones(2)), standin_cupy.empty(2 * p) if me == 0 else None, [2] * p, 0)
    t.alltoallv(dev(np.ones(2 * p)), standin_cupy.empty(2 * p), [2] * p, [2] * p)
    results.append((y, np.arange(4.0) * p))
    t.max_count = 3  # every call split into pieces of at most 3 elements
    results.append((hpccoll.all_reduce(dev(np.ones(8)), comm), np.full(8, float(p))))
    results.append((hpccoll.all_gather(dev(np.ones(5)), comm), np.ones(5 * p)))
    t.max_count = nccl_mod.INT_MAX
    planned = hpccoll.plan(hpccoll.all_reduce, dev(x), comm)
    results.append((planned(), sum(np.arange(4.0) + r for r in range(p))))
    planned.free()
    for got, want in results:
        host = got.get()
        if want is not None:
            wide = np.complex128 if host.dtype.kind == "c" else np.float64
            np.testing.assert_array_equal(host.astype(wide), np.asarray(want).astype(wide))
    seen = set().union(*(tee.seen for tee in module.tees))
    want_calls = {"allGather", "allReduce", "reduceScatter", "bcast", "reduce"}
    if p > 1:
        want_calls |= {"broadcast", "send", "recv"}
    assert want_calls <= seen, sorted(seen)


def test_async_error_check_and_abort_reach_nccl():
    nc = null_communicator()
    with pytest.raises(nccl.NcclError) as info:
        nc.check_async_error()
    assert info.value.status == INVALID_ARGUMENT
    nc.abort()  # NULL: nothing to do, and no error
    _ncclboot.destroy(null_communicator())


# --------------------------------------------------------------------------- _ncclboot.py


def test_bootstrap_on_the_real_binding():
    """bootstrap() with the real binding: the real unique id (bytes) goes to the real constructor, which gets
    past Cython and fails in NCCL for want of CUDA: TransportUnavailable on every rank, naming that error."""
    from types import SimpleNamespace

    from mpi4py import MPI

    comm = hpccoll.Communicator(MPI.COMM_WORLD)
    try:
        with pytest.raises(hpccoll.TransportUnavailable, match="NCCL_ERROR_UNHANDLED_CUDA_ERROR") as info:
            _ncclboot.bootstrap(comm, SimpleNamespace(nccl=nccl))
        assert "unique id: expected a form" not in str(info.value)
    finally:
        comm.free()
    assert _ncclboot._id_forms(nccl.get_unique_id())[0].__class__ is bytes


def test_version_gates(monkeypatch):
    version = _ncclboot.nccl_version(nccl)
    assert version == nccl.get_version() >= nccl_mod.BF16_VERSION
    monkeypatch.setenv(_ncclboot.MULTI_RANK_VARIABLE, "1")
    assert _ncclboot._multi_rank_mode(nccl).startswith(f"NCCL {version // 10000}.")
    for name in nccl_mod._NCCL_TYPES.values():
        assert isinstance(getattr(nccl, name), int), name
    for name in nccl_mod._NCCL_OPS.values():
        assert isinstance(getattr(nccl, name), int), name


# --------------------------------------------------------------------------- _cuda.py, staged.py, cuda_mpi.py


def test_cupy_runtime_reaches_cuda():
    """Each CupyRuntime call, on the real CuPy, converts its arguments and reaches CUDA, which has no driver."""
    from hpccoll.transports._base import _bytes_of

    rt = _cuda.CupyRuntime()
    assert rt.nccl is nccl and rt.nccl_missing is None
    host = np.empty(16, np.uint8)
    device = standin_cupy.empty(16, np.uint8)  # anything with .nbytes and .data.ptr, as CuPy's arrays have
    calls = {
        "device_count": rt.device_count,
        "current_device": rt.current_device,
        "use_device": lambda: rt.use_device(0),
        "bus_id": lambda: rt.bus_id(0),
        "alloc_pinned": lambda: rt.alloc_pinned(64),
        "stream": rt.stream,
        "sync_stream": rt.sync_stream,
        "record": rt.record,
        "to_host": lambda: rt.to_host(device, host),
        "to_device": lambda: rt.to_device(host, device),
        "memcpyAsync": lambda: rt._memcpy(host.ctypes.data, device.data.ptr, 16, rt._d2h, 0),
        "record_again": lambda: rt.record_again(None),
        "on_this_stream": lambda: rt.on_this_stream(lambda: None),
        "_base._bytes_of": lambda: _bytes_of("cupy", 16),  # the default sendrecv's packed bytes on a CuPy transport
    }
    for name, call in calls.items():
        with pytest.raises(cupy.cuda.runtime.CUDARuntimeError, match=NO_DRIVER):
            call()
            pytest.fail(f"CupyRuntime.{name} did not reach CUDA")
    assert rt.is_capturing() is False  # the query failed without saying capture: not capturing
    with pytest.raises(TypeError):  # the runtime's intptr_t rule, as NCCL's
        rt._memcpy(np.int64(host.ctypes.data), device.data.ptr, 16, rt._d2h, 0)


def test_nccl_probe_says_why(monkeypatch):
    """Through the real CupyRuntime, the NCCL transport's probe gives the driver's error, the same on every rank."""
    from mpi4py import MPI

    monkeypatch.setattr(_cuda, "_RUNTIME", None)
    comm = hpccoll.Communicator(MPI.COMM_WORLD)
    try:
        reason = nccl_mod.NcclTransport.unavailable_reason(comm)
        with pytest.raises(hpccoll.TransportUnavailable, match=NO_DRIVER):
            comm.transport_instance("nccl")
    finally:
        comm.free()
    assert "no GPU" in reason and NO_DRIVER in reason, reason


# --------------------------------------------------------------------------- the adapters' GPU views


def test_external_stream_has_no_warning():
    """CuPy 14 warns on every ExternalStream; hpccoll's external_stream uses Stream.from_external, silently."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stream = _cuda.external_stream(cupy, 0x1234, 0)
    assert stream.ptr == 0x1234 and isinstance(stream, cupy.cuda.Stream)
    with pytest.warns(DeprecationWarning, match="ExternalStream is deprecated"):
        cupy.cuda.ExternalStream(0x1234, 0)


def test_device_view_keeps_the_buffer_dtype():
    """XLA's buffers describe bfloat16 as "<V2" and raise for float8 in their CUDA array interface
    (xla/python/types.cc): device_view takes the address from DLPack and the dtype from the buffer, and hands
    both to the real CuPy (UnownedMemory then asks CUDA about the pointer, which has no driver here)."""
    import ml_dtypes

    host = np.zeros(64, np.uint8)

    class Buffer:  # what jax.experimental.buffer_callback hands a GPU callback (jaxlib/ffi.cc, PyFfiAnyBuffer)
        def __init__(self, dtype):
            self.shape, self.dtype = (4,), np.dtype(dtype)

        @property
        def __cuda_array_interface__(self):
            if "float8" in self.dtype.name:
                raise RuntimeError(f"UNIMPLEMENTED: Unimplemented primitive type {self.dtype.name.upper()}")
            typestr = "<V2" if self.dtype.name == "bfloat16" else self.dtype.str
            return {"shape": (4,), "typestr": typestr, "data": (host.ctypes.data, False), "version": 2}

        def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
            return host.__dlpack__()

    for dtype in (np.float32, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
        buffer = Buffer(dtype)
        assert _cuda.dlpack_address(buffer) == host.ctypes.data
        with pytest.raises(Exception, match="cudaErrorInvalidValue|cudaErrorInsufficientDriver"):
            _cuda.device_view(cupy, buffer)  # UnownedMemory asks CUDA about the pointer's device
        mem = cupy.cuda.UnownedMemory(host.ctypes.data, 16, buffer, device_id=0)  # as it would be on a GPU
        view = cupy.ndarray(buffer.shape, buffer.dtype, memptr=cupy.cuda.MemoryPointer(mem, 0))
        assert view.dtype == np.dtype(dtype) and view.data.ptr == host.ctypes.data
        assert view.view(np.uint8).shape == (4 * np.dtype(dtype).itemsize,)


# --------------------------------------------------------------------------- _relayout.py


def test_relayout_kernel_compiles_with_nvrtc(monkeypatch):
    """Every relayout kernel hpccoll builds (each element width, int and long long indices), as the real
    ``cupy.RawKernel`` it makes, compiled by the real NVRTC (nvidia-cuda-nvrtc-cu12) for sm_90 through CuPy's
    own compile path with CuPy's options; only the device query that picks the architecture is replaced, as
    there is no device. A compile error in the kernel's source fails here, on the CPU."""
    from cupy.cuda import compiler

    from hpccoll import _relayout

    monkeypatch.setattr(compiler, "_get_arch_for_options_for_nvrtc", lambda arch=None: (f"-arch=sm_{arch}", "cubin"))
    monkeypatch.setattr(_relayout, "_KERNELS", {})
    for width in sorted(_relayout._C_UNIT):
        for wide_index in (False, True):
            kernel = _relayout._kernel(cupy, width, wide_index)
            assert isinstance(kernel, cupy.RawKernel)
            cubin, _ = compiler.compile_using_nvrtc(kernel.code, options=("-ftz=true",), arch=90)
            assert kernel.name.encode() in cubin, (width, wide_index)
    with pytest.raises(compiler.CompileException, match="undefined"):  # the check can fail
        compiler.compile_using_nvrtc(_relayout.kernel_source(4, False).replace("blockDim", "undefined_dim"), arch=90)


def test_relayout_capture_query_reaches_cuda():
    """_relayout._capturing's query is a real CuPy call that reaches CUDA; with no driver it fails, which the
    relayout counts as capturing (it then refuses to copy its table, rather than risk a capture)."""
    with pytest.raises(cupy.cuda.runtime.CUDARuntimeError, match=NO_DRIVER):
        cupy.cuda.get_current_stream().is_capturing()
    from hpccoll import _relayout

    assert _relayout._capturing(cupy) is True


# --------------------------------------------------------------------------- _info.py and _bench.py


def test_info_reports_the_real_bindings():
    """``python -m hpccoll info``'s GPU part on the real CuPy: its version, and the driver's error as the reason."""
    from hpccoll import _info

    gpu = _info._gpu()
    assert gpu["cupy"] == cupy.__version__ and NO_DRIVER in gpu["reason"], gpu
    assert cupy.cuda.runtime.runtimeGetVersion() >= 12000  # _info's other calls: no driver needed, or
    assert nccl.get_version() >= 22800  # (getDeviceCount) reached CUDA above


def test_bench_on_the_real_cupy():
    """``python -m hpccoll bench --device cupy``'s calls on the real CuPy: the preflight's runtime reaches CUDA
    and names its error on every rank; the device arrays the benchmark makes reach CUDA too."""
    from mpi4py import MPI

    from hpccoll import _bench

    args = _bench.parser().parse_args(["--device", "cupy"])
    problem = _bench._preflight(args, MPI.COMM_WORLD)
    assert problem is not None and "expected CuPy and a GPU" in problem and NO_DRIVER in problem, problem
    xp, sync = _bench._device("cupy")
    assert xp is cupy and sync.__self__.__class__ is _cuda.CupyRuntime
    for call in (lambda: xp.empty((4,), np.float32), lambda: xp.asarray(np.zeros(4)), sync):
        with pytest.raises(cupy.cuda.runtime.CUDARuntimeError, match=NO_DRIVER):
            call()
