"""Host-staged transport: device -> pinned host buffer -> host MPI -> device.

Works with any MPI. Each call copies the device buffers into page-locked
(pinned) host buffers on the caller's current stream, waits for that stream,
runs the host MPI collective, and enqueues the copy back on the same stream
without waiting for it. The pinned buffers belong to the transport instance
(one per Communicator) and are reused across calls; they only grow.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

from .._errors import TransportUnavailable
from ._base import Transport
from ._cuda import get_runtime
from .host_mpi import HostMPI

__all__ = ["Staged"]

#: Pinned buffers are allocated in multiples of this many bytes.
GRANULE = 1 << 20


class Staged(Transport):
    """CuPy arrays through host MPI, staged in reused pinned host buffers.

    Attributes
    ----------
    pinned_bytes : int
        Bytes of pinned host memory this transport holds.
    """

    name = "staged"
    array_kind = "cupy"
    priority = 30
    chosen_because = "CuPy arrays go through host memory"

    def __init__(self, comm: Any) -> None:
        super().__init__(comm)
        self._rt = get_runtime()
        self._host = HostMPI(comm)
        self._pinned: Dict[str, Any] = {}
        self._pending: Optional[Any] = None  # event: the last copy out of the "recv" buffer is done

    @classmethod
    def unavailable_reason(cls, comm: Any) -> Optional[str]:
        try:
            get_runtime()
        except TransportUnavailable as exc:
            return str(exc)
        return None

    @property
    def pinned_bytes(self) -> int:
        return sum(buf.nbytes for buf in self._pinned.values())

    def _wait(self) -> None:
        """Wait until the previous call's copy out of the pinned buffers is done (maybe another stream)."""
        if self._pending is not None:
            self._pending.synchronize()
            self._pending = None

    def _stage(self, slot: str, like: Any) -> Any:
        """A host array of ``like``'s dtype and size in pinned buffer ``slot`` (grown if needed)."""
        need = like.nbytes
        buf = self._pinned.get(slot)
        if buf is None or buf.nbytes < need:
            self._pinned.pop(slot, None)  # release before allocating the larger one
            buf = self._pinned[slot] = self._rt.alloc_pinned(-(-need // GRANULE) * GRANULE)
        return buf[:need].view(like.dtype)

    def _down(self, device: Any, host: Any) -> None:
        """Copy ``device`` into its pinned stage on the current stream and wait for that stream."""
        self._rt.to_host(device, host)
        self._rt.sync_stream()

    def _up(self, host: Any, device: Any) -> None:
        self._rt.to_device(host, device)
        self._pending = self._rt.record()

    def allgatherv(self, send: Any, recv: Any, counts: Sequence[int]) -> None:
        self._wait()
        hs, hr = self._stage("send", send), self._stage("recv", recv)
        self._down(send, hs)
        self._host.allgatherv(hs, hr, counts)
        self._up(hr, recv)

    def reduce_scatter(self, send: Any, recv: Any, counts: Sequence[int], op: str) -> None:
        self._wait()
        hs, hr = self._stage("send", send), self._stage("recv", recv)
        self._down(send, hs)
        self._host.reduce_scatter(hs, hr, counts, op)
        self._up(hr, recv)

    def allreduce(self, send: Optional[Any], recv: Any, op: str) -> None:
        self._wait()
        hr = self._stage("recv", recv)
        if send is None:
            self._down(recv, hr)
            self._host.allreduce(None, hr, op)
        else:
            hs = self._stage("send", send)
            self._down(send, hs)
            self._host.allreduce(hs, hr, op)
        self._up(hr, recv)

    def alltoallv(self, send: Any, recv: Any, send_counts: Sequence[int], recv_counts: Sequence[int],
                  even: bool = False) -> None:
        self._wait()
        hs, hr = self._stage("send", send), self._stage("recv", recv)
        self._down(send, hs)
        self._host.alltoallv(hs, hr, send_counts, recv_counts, even)
        self._up(hr, recv)

    def close(self) -> None:
        self._wait()
        self._pinned.clear()
