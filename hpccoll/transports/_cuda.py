"""The one place the GPU transports touch CuPy: a small runtime object.

``nccl``, ``cuda_mpi`` and ``staged`` get everything device-related (the
array module, the NCCL binding, pointers, the current stream, devices, host
<-> device copies, pinned memory) from :func:`get_runtime`. CuPy is imported
there, on first use, never by ``import hpccoll``. The test suite swaps in a
NumPy-backed stand-in with :func:`use_runtime` so the transports' own logic
runs in CPU-only CI; that stand-in is a test fixture, not a transport.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any, Iterator, Optional

from .._errors import TransportUnavailable

__all__ = ["CupyRuntime", "get_runtime", "use_runtime"]


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
                f'CuPy is not installed or does not import ({type(exc).__name__}: {exc}); '
                'install it with pip install "hpccoll[cuda12]" (or cuda13)'
            ) from None
        self.xp = cupy
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

    # ------------------------------------------------------------------ arrays and streams
    @staticmethod
    def ptr(a: Any) -> int:
        """Device address of ``a``'s first element."""
        return a.data.ptr

    def stream(self) -> int:
        """Handle of the caller's current CuPy stream (what NCCL runs on)."""
        return self.xp.cuda.get_current_stream().ptr

    def sync_stream(self) -> None:
        """Block the host until the current stream's work is done (not the whole device)."""
        self.xp.cuda.get_current_stream().synchronize()

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

    def to_host(self, src: Any, dst: Any) -> None:
        """Enqueue a copy of device ``src`` into host ``dst`` (pinned) on the current stream."""
        if src.nbytes:
            stream = self.xp.cuda.get_current_stream()
            src.data.copy_to_host_async(ctypes.c_void_p(dst.ctypes.data), src.nbytes, stream)

    def to_device(self, src: Any, dst: Any) -> None:
        """Enqueue a copy of host ``src`` (pinned) into device ``dst`` on the current stream."""
        if dst.nbytes:
            stream = self.xp.cuda.get_current_stream()
            dst.data.copy_from_host_async(ctypes.c_void_p(src.ctypes.data), dst.nbytes, stream)

    def record(self) -> Any:
        """An event recorded on the current stream (``.synchronize()`` waits for it)."""
        return self.xp.cuda.get_current_stream().record()


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


@contextlib.contextmanager
def use_runtime(runtime: Any) -> Iterator[Any]:
    """Use ``runtime`` instead of CuPy inside the block (for tests with a stand-in)."""
    global _RUNTIME
    saved, _RUNTIME = _RUNTIME, runtime
    try:
        yield runtime
    finally:
        _RUNTIME = saved
