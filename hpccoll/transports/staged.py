"""Host-staged transport: device -> pinned host buffer -> host MPI -> device.

Works with any MPI. Each call copies the device buffers into page-locked
(pinned) host buffers on the caller's current stream, waits for that stream,
runs the host MPI collective, and enqueues the copy back on the same stream
without waiting for it. The pinned buffers belong to the transport instance
(one per Communicator) and are reused across calls; they only grow.

The copy back still reads the receive buffer after the call returns, so the
next call must not overwrite that buffer before the copy is done. On the
same stream nothing needs waiting for: the next call's device-to-host copy
is queued behind it, and its stream synchronisation covers both. Only when
the next call comes on another stream (or the buffers are released) does
the transport wait, for an event recorded after the copy back: waiting for
it at the start of every call cost a second host round trip per call
(docs/benchmarks.md, "Figures kept out of the code"); the rule itself has
not yet run on a GPU.

The rooted primitives stage in only what the host call reads (root's buffer
for ``bcast`` and ``scatterv``, every rank's input for ``reduce`` and
``gatherv``) and copy back only where results land (root for ``reduce`` and
``gatherv``, every rank but root for ``bcast``, every rank for ``scatterv``);
every rank still synchronises its stream, so that during capture every rank
refuses alike, and so that the host call never writes a pinned buffer a
queued copy back still reads. The host calls are those of the host
transport (``Communicator.host_transport``), composed, not owned.

A plan (:func:`hpccoll.plan`) fixes its call's pinned buffers once: each
prepared call (:meth:`Staged.prepare`) owns host buffers of its own, never
regrown or shared with other calls, and host MPI's call is prepared on them
once (an MPI-4 persistent request where host MPI measured that faster for the
call and size, :meth:`~hpccoll.transports.Selector.form`), so a run is
the copies in, one stream synchronisation, the prepared host call and the
copies back, with the same stream rule as the unplanned calls, kept per plan.

Not capturable in a CUDA graph (it synchronises the host with the stream):
called during stream capture it raises :class:`~hpccoll.TransportUnavailable`
before any MPI call. Capture is asked about only when a CUDA call of the
transport fails (CUDA refuses to synchronise a capturing stream), so the
check costs nothing on the normal path.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .._errors import TransportUnavailable
from .._request import DONE, Pending
from ._base import PRIMITIVES, WIRE_OPS, Prepared, Transport, moved
from ._cuda import capture_query, event_recorder, get_runtime, raise_if_capturing

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
    #: Every wire op: MPI's logical and bitwise ones too.
    reduce_ops = WIRE_OPS

    def __init__(self, comm: Any) -> None:
        super().__init__(comm)
        rt = self._rt = get_runtime()
        self._capturing = capture_query(rt)
        # The host transport by capability (HostMPI unless another is registered before it), shared with
        # the Communicator's NumPy traffic: it keeps no per-call state, and the pinned buffers stay ours.
        self._host = comm.host_transport()
        self.saturates = self._host.saturates  # the staged copies are reduced by host MPI
        self._pinned: Dict[str, Any] = {}
        self._views: Dict[str, Tuple[int, Any, Any]] = {}  # slot -> (nbytes, dtype, typed view), reused
        self._back = _CopyBack(event_recorder(rt))  # the last copy out of the "recv" buffer

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

    @property
    def persistent(self) -> bool:  # type: ignore[override]
        """Whether a plan's host call can be an MPI-4 persistent request (its host transport's)."""
        return bool(self._host.persistent)

    def measured_on(self, primitive: str, args: tuple) -> Optional[Tuple[Transport, tuple]]:
        """Where a plan's persistent-or-blocking choice for ``primitive(*args)`` is measured: host MPI, on
        NumPy buffers of the device buffers' dtypes and sizes (the host call a prepared staged call makes);
        ``None`` for a primitive staged does not prepare itself (``sendrecv``: the contract's default, one
        form)."""
        import numpy as np

        if primitive == "sendrecv":
            return None
        return self._host, tuple(
            np.empty(a.size, a.dtype) if i in _buffers(primitive, args) else a for i, a in enumerate(args)
        )

    def prepare(self, primitive: str, args: tuple, method: str = "blocking") -> Prepared:
        """A call fixed on pinned host buffers of its own and host MPI's call prepared on them (``method``:
        host MPI's ``"blocking"`` or ``"persistent"``); the contract's default for any other primitive."""
        if primitive == "sendrecv":
            return super().prepare(primitive, args, method)
        ins, outs = moved(primitive, args, self.comm.rank)
        return _StagedCall(self, primitive, args, method, ins, outs)

    def _wait(self) -> None:
        """Wait until the last copy out of the pinned buffers is done (whatever its stream)."""
        self._back.wait()

    def _begin(self) -> int:
        """Wait for the last copy back only if it is on another stream; return the current stream's handle."""
        stream = self._rt.stream()
        self._back.wait_unless(stream)
        return stream

    def _stage(self, slot: str, like: Any) -> Any:
        """A host array of ``like``'s dtype and size in pinned buffer ``slot`` (grown if needed)."""
        need, dtype = like.nbytes, like.dtype
        seen = self._views.get(slot)
        if seen is not None and seen[0] == need and seen[1] == dtype:
            return seen[2]
        buf = self._pinned.get(slot)
        if buf is None or buf.nbytes < need:
            self._wait()  # the copy back may still read the old buffer
            self._pinned.pop(slot, None)  # release before allocating the larger one
            buf = self._pinned[slot] = self._rt.alloc_pinned(-(-need // GRANULE) * GRANULE)
        view = buf[:need].view(dtype)
        self._views[slot] = (need, dtype, view)
        return view

    def _stage_in(self, send: Optional[Any], recv: Any) -> Tuple[int, Optional[Any], Any]:
        """Everything before MPI: ``send`` (``recv`` when in place) copied into its pinned stage on the
        current stream, and that stream waited for. Returns the stream and the two stages.

        During stream capture CUDA refuses the wait (or an earlier step): that becomes
        :func:`refuse_capture`'s error, before any MPI call.
        """
        rt = self._rt
        try:
            stream = self._begin()
            hr = self._stage("recv", recv)
            hs = None if send is None else self._stage("send", send)
            rt.to_host(recv if send is None else send, hr if send is None else hs)
            rt.sync_stream()
        except Exception as exc:
            raise_if_capturing(self.name, self._capturing, exc)
            raise
        return stream, hs, hr

    def _up(self, host: Any, device: Any, stream: int) -> None:
        """Enqueue the copy back on ``stream`` (the current one); record the transport's event after it.

        The event is recorded again rather than made anew where the runtime can
        (its earlier copy is done by now: this call's stream synchronisation, or
        ``_begin``'s wait, saw to it).
        """
        self._rt.to_device(host, device)
        self._back.recorded(stream)

    def allgatherv(self, send: Any, recv: Any, counts: Sequence[int]) -> None:
        stream, hs, hr = self._stage_in(send, recv)
        self._host.allgatherv(hs, hr, counts)
        self._up(hr, recv, stream)

    def reduce_scatter(self, send: Any, recv: Any, counts: Sequence[int], op: str) -> None:
        stream, hs, hr = self._stage_in(send, recv)
        self._host.reduce_scatter(hs, hr, counts, op)
        self._up(hr, recv, stream)

    def allreduce(self, send: Optional[Any], recv: Any, op: str) -> None:
        stream, hs, hr = self._stage_in(send, recv)  # hs is None in place
        self._host.allreduce(hs, hr, op)
        self._up(hr, recv, stream)

    def alltoallv(
        self, send: Any, recv: Any, send_counts: Sequence[int], recv_counts: Sequence[int], even: bool = False
    ) -> None:
        stream, hs, hr = self._stage_in(send, recv)
        self._host.alltoallv(hs, hr, send_counts, recv_counts, even)
        self._up(hr, recv, stream)

    def _stage_rooted(self, stages: Sequence[Tuple[str, Optional[Any], bool]]) -> Tuple[int, List[Optional[Any]]]:
        """:meth:`_stage_in` for the rooted primitives: for each ``(slot, device array or None, copy in)``
        a pinned stage (None for None), the ones marked copied in on the current stream; then that
        stream is waited for on every rank, whatever it staged (capture refused alike everywhere).
        Returns the stream and the stages."""
        rt = self._rt
        try:
            stream = self._begin()
            hosts = [None if a is None else self._stage(slot, a) for slot, a, _ in stages]
            for (_, a, copy), h in zip(stages, hosts):
                if copy and a is not None:
                    rt.to_host(a, h)
            rt.sync_stream()
        except Exception as exc:
            raise_if_capturing(self.name, self._capturing, exc)
            raise
        return stream, hosts

    def bcast(self, buf: Any, root: int) -> None:
        me = self.comm.rank
        stream, (hb,) = self._stage_rooted([("recv", buf, me == root)])
        self._host.bcast(hb, root)
        if me != root:  # the root's buffer is unchanged
            self._up(hb, buf, stream)

    def reduce(self, send: Optional[Any], recv: Any, op: str, root: int) -> None:
        stream, (hs, hr) = self._stage_rooted([("send", send, True), ("recv", recv, send is None)])
        self._host.reduce(hs, hr, op, root)
        if self.comm.rank == root:  # the others' recv is left undefined
            self._up(hr, recv, stream)

    def gatherv(self, send: Any, recv: Optional[Any], counts: Sequence[int], root: int) -> None:
        stream, (hs, hr) = self._stage_rooted([("send", send, True), ("recv", recv, False)])
        self._host.gatherv(hs, hr, counts, root)
        if hr is not None:  # the root
            self._up(hr, recv, stream)

    def scatterv(self, send: Optional[Any], recv: Any, counts: Sequence[int], root: int) -> None:
        stream, (hs, hr) = self._stage_rooted([("send", send, True), ("recv", recv, False)])
        self._host.scatterv(hs, hr, counts, root)
        self._up(hr, recv, stream)

    def bind_finish(self, finish: Callable[[], Any]) -> Callable[[], Any]:
        return self._rt.on_this_stream(finish)

    def close(self) -> None:
        self._wait()
        self._back.event = None
        self._views.clear()
        self._pinned.clear()


def _buffers(primitive: str, args: tuple) -> List[int]:
    """The positions of a staged primitive's device buffers (:data:`~hpccoll.transports._base.PRIMITIVES`)."""
    buffers = ("send", "recv", "send@root", "recv@root", "buf")
    return [i for i, role in enumerate(PRIMITIVES[primitive]) if role in buffers and args[i] is not None]


class _StagedCall(Prepared):
    """A plan's staged call: pinned host buffers of its own, allocated once, and host MPI's call prepared
    on them. A run copies in on the current stream, synchronises it, runs the host call, and enqueues the
    copies back, recording an event after them that a run on another stream (or :meth:`free`) waits for.
    ``start()`` runs it and returns a completed operation, as the unplanned non-blocking forms do."""

    __slots__ = ("_t", "_into", "_out", "_host_call", "_back", "_pinned")

    def __init__(
        self, t: Staged, primitive: str, args: tuple, method: str, ins: Sequence[int], outs: Sequence[int]
    ) -> None:
        super().__init__(t, primitive, args, method)
        rt = t._rt
        pinned = {i: rt.alloc_pinned(args[i].nbytes) for i in _buffers(primitive, args)}
        host = tuple(
            pinned[i].view(a.dtype) if i in pinned else a for i, a in enumerate(args)
        )  # flat, as MPI takes them
        self._t, self._pinned = t, pinned
        self._into = [(args[i], host[i]) for i in ins]
        self._out = [(host[i], args[i]) for i in outs]
        self._host_call = t._host.prepare(primitive, host, method)
        self.method = self._host_call.method
        self._back = _CopyBack(t._back.record)  # this call's last copies back
        self.run = self._run
        self.steps = (self._run,)
        self._start = self._started

    def _run(self) -> None:
        t = self._t
        rt = t._rt
        try:
            stream = rt.stream()
            self._back.wait_unless(stream)
            for device, host in self._into:
                rt.to_host(device, host)
            rt.sync_stream()  # on every rank, whatever it copied: capture refused alike everywhere
        except Exception as exc:
            raise_if_capturing(t.name, t._capturing, exc)
            raise
        self._host_call.run()
        if self._out:
            for host, device in self._out:
                rt.to_device(host, device)
            self._back.recorded(stream)

    def _started(self) -> Pending:
        self._run()
        return DONE

    def free(self) -> None:
        """Wait for the last copies back, then release the host call and the pinned buffers."""
        self._back.wait()
        self._host_call.free()
        self._pinned.clear()
        self._into, self._out = [], []

    def __del__(self) -> None:
        """A plan dropped without :meth:`free`: its pinned buffers are released only after its last copies
        back out of them are done (a queued copy must not read freed memory)."""
        try:
            self.free()
        except Exception:  # noqa: BLE001, S110 (interpreter shutdown: the runtime may be gone)
            pass


class _CopyBack:
    """The last copies back out of some pinned buffers: the event recorded after them, and their stream
    while they may still be running (``None`` once waited for)."""

    __slots__ = ("record", "event", "stream")

    def __init__(self, record: Callable[[Optional[Any]], Any]) -> None:
        self.record = record  # records an event on the current stream (again, where the runtime can)
        self.event: Optional[Any] = None
        self.stream: Optional[int] = None

    def wait(self) -> None:
        """Wait until those copies are done (whatever their stream)."""
        if self.stream is not None:
            assert self.event is not None, "recorded with the stream"
            self.event.synchronize()
            self.stream = None

    def wait_unless(self, stream: int) -> None:
        """Wait for them only if they are on another stream than ``stream`` (stream order covers the same)."""
        if self.stream is not None and self.stream != stream:
            self.wait()

    def recorded(self, stream: int) -> None:
        """Copies back were just enqueued on ``stream`` (the current one): record the event after them."""
        self.event, self.stream = self.record(self.event), stream
