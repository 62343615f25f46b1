"""The one place the GPU transports touch CuPy: a small runtime object.

``nccl``, ``cuda_mpi`` and ``staged`` get everything device-related (the
array module, the NCCL binding, pointers, the current stream, devices, host
<-> device copies, pinned memory) from :func:`get_runtime`. Two methods are
optional for other runtimes (the test stand-in): ``is_capturing()`` (without
it a runtime never captures, :func:`capture_query`) and ``record_again(event)``
(without it every record makes a new event, :func:`event_recorder`). CuPy is imported
there, on first use, never by ``import hpccoll``. The test suite swaps in a
NumPy-backed stand-in with :func:`use_runtime` so the transports' own logic
runs in CPU-only CI; that stand-in is a test fixture, not a transport.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any, Callable, Iterator, Optional, Tuple

from .._errors import TransportUnavailable

__all__ = [
    "CupyRuntime",
    "get_runtime",
    "use_runtime",
    "capture_query",
    "event_recorder",
    "refuse_capture",
    "raise_if_capturing",
    "external_stream",
    "device_view",
    "dlpack_address",
]


class CupyRuntime:
    """CuPy behind the interface the GPU transports use.

    Attributes
    ----------
    xp : module
        ``cupy``.
    nccl : module or None
        ``cupy.cuda.nccl`` when CuPy was built with NCCL and the library
        loads; ``None`` otherwise (see :attr:`nccl_missing`).
    nccl_missing : str or None
        Why :attr:`nccl` is ``None``.
    """

    def __init__(self) -> None:
        try:
            import cupy
        except Exception as exc:  # ImportError, or a broken CUDA install
            raise TransportUnavailable(
                f"CuPy is not installed or does not import ({type(exc).__name__}: {exc}); "
                'install it with pip install "hpccoll[cuda12]" (or cuda13)'
            ) from None
        self._bind(cupy)
        self.nccl: Optional[Any] = None
        self.nccl_missing: Optional[str] = None
        try:
            from cupy.cuda import nccl
        except Exception as exc:
            self.nccl_missing = f"cupy.cuda.nccl does not import ({type(exc).__name__}: {exc})"
        else:
            if getattr(nccl, "available", True):
                self.nccl = nccl
            else:
                self.nccl_missing = (
                    "CuPy cannot load the NCCL library (cupy.cuda.nccl.available is False); "
                    "install it, e.g. pip install nvidia-nccl-cu12"
                )

    def _bind(self, cupy: Any) -> None:
        """Use ``cupy`` (the module, or anything with the same ``cuda`` calls); the per-call ones kept at hand."""
        self.xp = cupy
        cuda = cupy.cuda
        self._current = cuda.get_current_stream
        self._memcpy = cuda.runtime.memcpyAsync
        self._d2h, self._h2d = cuda.runtime.memcpyDeviceToHost, cuda.runtime.memcpyHostToDevice
        self._event = cuda.Event

    # ------------------------------------------------------------------ arrays and streams
    @staticmethod
    def ptr(a: Any) -> int:
        """Device address of ``a``'s first element."""
        return a.data.ptr

    def stream(self) -> int:
        """Handle of the caller's current CuPy stream (what NCCL runs on)."""
        return self._current().ptr

    def sync_stream(self) -> None:
        """Block the host until the current stream's work is done (not the whole device)."""
        self._current().synchronize()

    def is_capturing(self) -> bool:
        """Whether the current stream is being captured into a CUDA graph (or was, until an error).

        CuPy raises for a capture an error has invalidated, and CUDA refuses
        the query on the legacy stream while another stream captures in global
        mode (``cudaErrorStreamCaptureImplicit``): both count as capturing.
        """
        try:
            return bool(self._current().is_capturing())
        except Exception as exc:
            text = str(exc)
            return "StreamCapture" in text or "invalidated" in text

    # ------------------------------------------------------------------ devices
    def device_count(self) -> int:
        """Number of GPUs visible to this process (raises without a driver or GPU)."""
        return self.xp.cuda.runtime.getDeviceCount()

    def current_device(self) -> int:
        return self.xp.cuda.runtime.getDevice()

    def use_device(self, device: int) -> None:
        self.xp.cuda.Device(device).use()

    def bus_id(self, device: int) -> str:
        """PCI bus id of ``device``, e.g. ``'0000:3B:00.0'``."""
        return str(self.xp.cuda.Device(device).pci_bus_id)

    @staticmethod
    def device_of(a: Any) -> int:
        """The GPU holding array ``a``."""
        return a.data.device_id

    # ------------------------------------------------------------------ host staging
    def alloc_pinned(self, nbytes: int) -> Any:
        """A NumPy ``uint8`` array of ``nbytes`` in page-locked host memory."""
        import numpy as np

        mem = self.xp.cuda.alloc_pinned_memory(max(nbytes, 1))
        return np.frombuffer(mem, np.uint8, nbytes)

    # The copies go straight to cudaMemcpyAsync with integer addresses: no ctypes pointer objects,
    # no MemoryPointer method dispatch, and the host address without numpy's slow .ctypes.
    def to_host(self, src: Any, dst: Any) -> None:
        """Enqueue a copy of device ``src`` into host ``dst`` (pinned, C-contiguous) on the current stream."""
        nbytes = src.nbytes
        if nbytes:
            self._memcpy(_host_address(dst), src.data.ptr, nbytes, self._d2h, self._current().ptr)

    def to_device(self, src: Any, dst: Any) -> None:
        """Enqueue a copy of host ``src`` (pinned, C-contiguous) into device ``dst`` on the current stream."""
        nbytes = dst.nbytes
        if nbytes:
            self._memcpy(dst.data.ptr, _host_address(src), nbytes, self._h2d, self._current().ptr)

    def record(self) -> Any:
        """An event recorded on the current stream (``.synchronize()`` waits for it, ``.done`` polls).

        Timing is disabled: cheaper to create, record and query, and no caller
        measures time with it.
        """
        return self._current().record(self._event(disable_timing=True))

    def on_this_stream(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """``fn``, to be called later, made to run on the stream current now.

        Called under another stream, it runs ``fn`` on this one (where the
        buffers ``fn`` reads were allocated and go back to the pool when it
        drops them) and makes the caller's stream wait for it.
        """
        launching = self._current()

        def run() -> Any:
            current = self._current()
            if current.ptr == launching.ptr:
                return fn()
            with launching:
                result = fn()
                done = self.record()
            current.wait_event(done)
            return result

        return run

    def record_again(self, event: Optional[Any]) -> Any:
        """Record ``event`` (one :meth:`record` made, whose earlier work is done) on the current stream.

        Saves creating and destroying an event per call for a transport that
        keeps one (``staged``); ``None`` makes a new one.
        """
        if event is None:
            return self.record()
        self._current().record(event)
        return event


def _host_address(a: Any) -> int:
    """Address of a C-contiguous NumPy array's first byte (cheaper than ``a.ctypes.data``)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError, BufferError):  # read-only or not C-contiguous
        return a.ctypes.data


_RUNTIME: Optional[Any] = None


def get_runtime() -> Any:
    """The process's GPU runtime (CuPy), loaded on first use.

    Raises
    ------
    TransportUnavailable
        CuPy is missing or does not import.
    """
    global _RUNTIME
    if _RUNTIME is None:
        _RUNTIME = CupyRuntime()
    return _RUNTIME


def event_recorder(runtime: Any) -> Callable[[Optional[Any]], Any]:
    """``runtime.record_again``, or for a runtime without it a function making a new event each time."""
    again = getattr(runtime, "record_again", None)
    if again is not None:
        return again
    return lambda event: runtime.record()


def capture_query(runtime: Any) -> Callable[[], bool]:
    """``runtime.is_capturing``, or a function saying ``False`` for a runtime without stream capture."""
    return getattr(runtime, "is_capturing", _never)


def _never() -> bool:
    return False


@contextlib.contextmanager
def use_runtime(runtime: Any) -> Iterator[Any]:
    """Use ``runtime`` instead of CuPy inside the block (for tests with a stand-in)."""
    global _RUNTIME
    saved, _RUNTIME = _RUNTIME, runtime
    try:
        yield runtime
    finally:
        _RUNTIME = saved


def refuse_capture(name: str) -> TransportUnavailable:
    """The error a host-synchronising transport raises when called during CUDA stream capture."""
    return TransportUnavailable(
        f"transport {name!r} cannot run during CUDA stream capture: it waits on the host for the current "
        "stream, which capture forbids (expected a call outside the capture, or transport='nccl', "
        "which is capturable; got a capturing stream)"
    )


def raise_if_capturing(name: str, capturing: Callable[[], bool], exc: BaseException) -> None:
    """Raise :func:`refuse_capture`'s error (from ``exc``) when the current stream is capturing.

    Called from the failure path only: CUDA itself refuses what cannot be
    captured (a stream synchronisation), so the normal path never asks.
    """
    if capturing():
        raise refuse_capture(name) from exc


# --------------------------------------------------------------------------- other libraries' streams and memory


class _StreamHandle:
    """A raw ``cudaStream_t`` behind the CUDA stream protocol (what ``Stream.from_external`` reads)."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __cuda_stream__(self) -> Tuple[int, int]:
        return (0, self.ptr)


def external_stream(cupy: Any, ptr: int, device: int) -> Any:
    """A CuPy stream over the stream ``ptr`` another library made (XLA's, PyTorch's), to use in a ``with``.

    ``cupy.cuda.Stream.from_external`` (CuPy 14; the CUDA stream protocol) where CuPy has it, else
    ``cupy.cuda.ExternalStream``, which CuPy 14 deprecates with a warning at every construction.

    Parameters
    ----------
    cupy : module
        ``cupy``.
    ptr : int
        The ``cudaStream_t`` handle.
    device : int
        The GPU it belongs to (only ``ExternalStream`` takes it; ``from_external`` uses the current one).

    Returns
    -------
    cupy.cuda.Stream
        A stream object that does not own ``ptr``.
    """
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        return from_external(_StreamHandle(int(ptr)))
    return cupy.cuda.ExternalStream(int(ptr), device)


class _DLTensorHead(ctypes.Structure):
    """The head of DLPack's ``DLTensor`` (``dlpack.h``), the first member of ``DLManagedTensor``: enough for the
    address (``data`` plus ``byte_offset``)."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("dtype", ctypes.c_uint32),  # code, bits, lanes
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("byte_offset", ctypes.c_uint64),
    ]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def dlpack_address(buffer: Any) -> int:
    """The address of ``buffer``'s first element, read from the ``"dltensor"`` capsule of ``buffer.__dlpack__()``.

    XLA's ``buffer_callback`` buffers (``jaxlib/ffi.cc``, ``PyFfiAnyBuffer``)
    expose their address only through ``__cuda_array_interface__`` and
    ``__dlpack__``. The interface raises for the float8 types (XLA's
    ``TypeDescriptorForPrimitiveType`` has no typestr for them); DLPack
    describes every type XLA has, and the capsule, left unconsumed, frees
    only its own descriptor when dropped, never the memory.
    """
    capsule = buffer.__dlpack__()
    head = _DLTensorHead.from_address(_capsule_pointer(capsule, b"dltensor"))
    return int(head.data or 0) + int(head.byte_offset)


def device_view(cupy: Any, buffer: Any) -> Any:
    """A CuPy array over another library's device buffer, with the buffer's own dtype (no copy).

    The address comes from DLPack (:func:`dlpack_address`), the shape and
    dtype from ``buffer.shape`` and ``buffer.dtype``: CuPy's readers lose
    ml_dtypes' types (XLA's CUDA array interface describes bfloat16 as
    ``"<V2"``, which ``cupy.asarray`` turns into a ``|V2`` array, and raises
    for float8; CuPy's DLPack import has no float8). The buffer must be
    C-contiguous (XLA's are).

    Parameters
    ----------
    cupy : module
        ``cupy``.
    buffer : object
        ``shape``, ``dtype`` (NumPy's) and ``__dlpack__``; it is kept alive by the view.

    Returns
    -------
    cupy.ndarray
        The view (a new empty array for an empty buffer, which may have no address).
    """
    import numpy as np

    shape, dtype = tuple(buffer.shape), np.dtype(buffer.dtype)
    if 0 in shape:
        return cupy.empty(shape, dtype)
    ptr = dlpack_address(buffer)
    nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
    memory = cupy.cuda.UnownedMemory(ptr, nbytes, buffer)
    return cupy.ndarray(shape, dtype, memptr=cupy.cuda.MemoryPointer(memory, 0))
