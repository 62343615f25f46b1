"""A deferred-execution STAND-IN for CuPy: arrays, streams, events, device memory -- a test fixture.

CPU-only CI cannot run CUDA, so the GPU transports (``hpccoll/transports/nccl.py``,
``staged.py``, ``cuda_mpi.py``) and the array work ``hpccoll.collectives`` does on CuPy
arrays run against this module, installed as ``sys.modules["cupy"]`` for the
duration of a test (``tests/test_nccl_standin.py``). It behaves like a GPU where
that matters for ordering and lifetime bugs:

* **Deferred execution.** Every device operation (copies, casts, elementwise
  kernels, reductions, and the NCCL calls of ``standin_nccl``) is queued on a
  stream and runs only at a synchronisation point: ``Stream.synchronize``,
  ``Event.synchronize``, a query (``Event.done``, ``Stream.done``: the first
  query of unfinished work reports ``False`` and runs nothing, later ones run
  it), ``Device.synchronize``, or a host read that CuPy synchronises for
  (``get()``, ``item()``). Work another stream waits on (``wait_event``, and
  the legacy default stream's implicit ordering with blocking streams) runs
  first, in stream order. A host read that forgot to synchronise sees memory
  as it was: fresh allocations hold ``0xCD`` bytes.
* **A race detector.** Each operation gets a vector clock when it is queued
  (stream order, event waits, the legacy stream's ordering, and what the host
  has seen complete). Two operations on different streams touching
  overlapping bytes, one of them writing, with nothing ordering them, are a
  race; so is a host access (``get()``, MPI reading a device buffer through
  ``__cuda_array_interface__``) to memory that unsynchronised work still uses.
  The verdict does not depend on the order the stand-in happens to run work in.
* **Poisoned lifetimes.** Device memory goes back to a stream-ordered pool, as
  CuPy's does: when an allocation is freed (its last array dropped, or
  ``data.mem.free()``), ``0xFF`` poison is queued on the stream it was
  allocated on. Work queued before that on the same stream still sees the
  data; work queued after the free, or queued on another stream and not
  ordered before the free, is reported and reads poison. Pinned host memory
  (the staged transport's buffers) is not stream-ordered: freeing it while
  queued copies use it poisons it at once.
* **Modes** (``HPCCOLL_STANDIN_MODE``): ``deferred`` (the default); ``eager``
  (each operation runs when it is queued, as the old stand-in did); ``random``
  (queued work also runs at random earlier points, in stream order, drawn from
  ``HPCCOLL_STANDIN_SEED``).

Violations (races, use after free, overlapping copies) are collected and
raised as :class:`StandInRace` at the next synchronisation point, after the
queued work has run, so that every rank stops at the same point.

Only what hpccoll and its tests use is implemented; anything else raises.
"""

from __future__ import annotations

import bisect
import builtins
import operator
import os
import random
import sys
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

POISON = 0xFF  # freed memory: NaN in every float type, -1 in signed integers
UNINITIALISED = 0xCD  # fresh allocations: never zeros by luck
ALIGN = 512  # CuPy's pool rounds allocations to 512 bytes
BLOCKED = object()  # what an operation that cannot complete returns (a stalled NCCL call)
MODES = ("deferred", "eager", "random")


class StandInRace(AssertionError):
    """The code under test raced, used freed memory or read unsynchronised data: a real GPU bug."""


class StandInHang(AssertionError):
    """A real GPU would hang here (the host waits on work that can never complete)."""


def _caller() -> str:
    """Where the code under test called the stand-in from (for messages)."""
    frame = sys._getframe(1)
    while frame is not None and "standin_" in frame.f_code.co_filename:
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} ({frame.f_code.co_name})"


# --------------------------------------------------------------------------- memory


class _Alloc:
    """The bytes of one allocation; queued work keeps them alive even after the allocation is freed."""

    __slots__ = (
        "raw",
        "ptr",
        "nbytes",
        "device",
        "stream",
        "pinned",
        "live",
        "accesses",
        "freed_at",
        "label",
        "generation",
    )

    def __init__(self, raw: np.ndarray, device: int, stream: Optional["Stream"], pinned: bool, label: str) -> None:
        self.raw = raw
        self.ptr = raw.ctypes.data
        self.nbytes = raw.nbytes
        self.device = device
        self.stream = stream
        self.pinned = pinned
        self.live = True
        self.accesses: List[Tuple["_Op", int, int, bool]] = []
        self.freed_at: Optional[str] = None
        self.label = label
        self.generation = GPU.generation

    def describe(self) -> str:
        kind = "pinned host buffer" if self.pinned else f"device buffer on GPU {self.device}"
        return f"{kind} of {self.nbytes} bytes allocated at {self.label}"


class _Memory:
    """Owner of one device allocation, like CuPy's ``PooledMemory``: its death frees the allocation."""

    __slots__ = ("alloc", "ptr", "size", "device_id", "__weakref__")

    def __init__(self, alloc: Optional[_Alloc], device_id: int) -> None:
        self.alloc = alloc
        self.ptr = 0 if alloc is None else alloc.ptr
        self.size = 0 if alloc is None else alloc.nbytes
        self.device_id = device_id

    def free(self) -> None:
        """Return the memory to the pool now (``PooledMemory.free``), whatever still uses it."""
        if self.alloc is not None:
            GPU.free(self.alloc, f"data.mem.free() at {_caller()}")

    def __del__(self) -> None:
        if self.alloc is not None:
            try:
                GPU.free(self.alloc, f"its last array was dropped at {_caller()}")
            except Exception:  # pragma: no cover - interpreter shutdown
                pass


class _PinnedBlock:
    """The ``base`` of a stand-in pinned NumPy array: dropping its last view frees the pinned allocation."""

    def __init__(self, alloc: _Alloc) -> None:
        self.alloc = alloc
        self.__array_interface__ = {
            "shape": (alloc.nbytes,),
            "typestr": "|u1",
            "data": (alloc.ptr, False),
            "version": 3,
        }

    def __del__(self) -> None:
        try:
            GPU.free(self.alloc, f"its last view was dropped at {_caller()}")
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


# --------------------------------------------------------------------------- streams and events


class _Op:
    __slots__ = ("fn", "what", "deps", "clock", "stream", "index", "nccl", "where")

    def __init__(
        self,
        fn: Optional[Callable[[], Any]],
        what: str,
        deps: list,
        stream: "Stream",
        index: int,
        nccl: Any,
        where: str,
    ) -> None:
        self.fn = fn
        self.what = what
        self.deps = deps
        self.clock: Dict[int, int] = {}
        self.stream = stream
        self.index = index
        self.nccl = nccl
        self.where = where


class Stream:
    """``cupy.cuda.Stream``: a queue of operations. ``Stream.null`` is the legacy default stream (handle 0)."""

    null: "Stream"  # set by _Device.reset

    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False) -> None:
        if ptds:
            raise NotImplementedError("stand-in: per-thread default streams are not modelled")
        self.non_blocking = bool(non_blocking)
        self.ops: List[_Op] = []
        self.done_ops = 0
        self.sid = len(GPU.streams)
        self.ptr = 0 if null else 0x5EED0000 + 0x100 * self.sid
        self.queries: Dict[int, int] = {}
        self._saved: List[Stream] = []
        GPU.streams.append(self)
        GPU.by_ptr[self.ptr] = self

    def __repr__(self) -> str:
        kind = "null" if self.ptr == 0 else ("non-blocking" if self.non_blocking else "blocking")
        return f"<stand-in Stream {self.ptr:#x} ({kind}), {len(self.ops) - self.done_ops} queued>"

    def use(self) -> "Stream":
        GPU.current = self
        return self

    def __enter__(self) -> "Stream":
        self._saved.append(GPU.current)
        GPU.current = self
        return self

    def __exit__(self, *exc: Any) -> None:
        GPU.current = self._saved.pop()

    def synchronize(self) -> None:
        GPU.sync(self, len(self.ops))

    @property
    def done(self) -> bool:
        return GPU.query(self, len(self.ops))

    def record(self, event: Optional["Event"] = None) -> "Event":
        event = event or Event()
        event.record(self)
        return event

    def wait_event(self, event: "Event") -> None:
        if event.stream is not None and event.upto:
            GPU.enqueue(f"wait for {event!r}", None, deps=[(event.stream, event.upto)], stream=self)

    #: What :meth:`is_capturing` answers (a test knob): a bool, or an exception to raise, as CuPy's does when
    #: CUDA refuses the query (cupy/cuda/stream.pyx, ``Stream.is_capturing``: streamIsCapturing's error).
    capturing: Any = False

    def is_capturing(self) -> bool:
        if isinstance(self.capturing, BaseException):
            raise self.capturing
        return bool(self.capturing)

    @classmethod
    def from_external(cls, obj: Any) -> "Stream":
        """The stream whose handle ``obj.__cuda_stream__()`` gives, as CuPy 14's ``Stream.from_external``
        (cupy/cuda/stream.pyx): the CUDA stream protocol's ``(0, handle)`` with Python ints, else TypeError."""
        try:
            version, handle = obj.__cuda_stream__()
        except AttributeError as exc:
            raise TypeError(
                f"Object of type {type(obj).__name__} does not implement the CUDA stream protocol "
                "(__cuda_stream__ method)"
            ) from exc
        if not isinstance(version, int) or not isinstance(handle, int):
            raise TypeError(
                f"__cuda_stream__() must return (int, int), got ({type(version).__name__}, {type(handle).__name__})"
            )
        if version != 0:
            raise TypeError(f"__cuda_stream__() returned unsupported version {version}, only version 0 is supported")
        return _stream(handle)


def ExternalStream(ptr: int, device_id: int = -1) -> Stream:  # noqa: N802 - CuPy's name
    """CuPy 14's deprecated ``ExternalStream``: warns on every construction (cupy/cuda/stream.pyx,
    ``ExternalStream.__init__``), then the stream whose handle is ``ptr``."""
    import warnings

    warnings.warn(
        "ExternalStream is deprecated. Use Stream.from_external() instead to interoperate with external "
        "streams that implement the CUDA stream protocol.",
        DeprecationWarning,
        stacklevel=2,
    )
    return _stream(ptr)


class Event:
    """``cupy.cuda.Event``: a point in a stream's order."""

    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False) -> None:
        self.stream: Optional[Stream] = None
        self.upto = 0

    def record(self, stream: Optional[Stream] = None) -> None:
        stream = stream or GPU.current
        self.stream, self.upto = stream, len(stream.ops)

    @property
    def done(self) -> bool:
        return True if self.stream is None else GPU.query(self.stream, self.upto)

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        if self.stream is not None:
            GPU.sync(self.stream, self.upto)

    def __repr__(self) -> str:
        where = "never recorded" if self.stream is None else f"stream {self.stream.ptr:#x} after op {self.upto}"
        return f"<stand-in Event, {where}>"


def get_current_stream(device_id: Optional[int] = None) -> Stream:
    return GPU.current


# --------------------------------------------------------------------------- the device


class _Device:
    """The process's GPUs: streams, allocations, the executor and the race detector."""

    def __init__(self) -> None:
        self.streams: List[Stream] = []
        self.by_ptr: Dict[int, Stream] = {}
        self.generation = 0

    def reset(self, mode: Optional[str] = None, seed: Optional[int] = None, rank: int = 0) -> None:
        """A fresh device: only the null stream, nothing queued, no allocation tracked."""
        mode = mode or os.environ.get("HPCCOLL_STANDIN_MODE", "").strip() or "deferred"
        if mode not in MODES:
            raise ValueError(f"HPCCOLL_STANDIN_MODE: expected one of {', '.join(MODES)}; got {mode!r}")
        self.mode = mode
        self.seed = int(os.environ.get("HPCCOLL_STANDIN_SEED", "0") or 0) if seed is None else seed
        self.rng = random.Random(f"{self.seed}:local:{rank}")
        self.generation += 1
        self.streams, self.by_ptr = [], {}
        self.device = 0
        self.live_starts: List[int] = []
        self.live: Dict[int, _Alloc] = {}
        self.freed: Dict[int, _Alloc] = {}
        self.host: Dict[int, int] = {}  # stream sid -> how many of its ops the host knows are done
        self.violations: List[str] = []
        self.running = 0
        self.ops_queued = self.ops_run = 0
        Stream.null = self.current = Stream(null=True)

    # ------------------------------------------------------------------ allocations
    def allocate(self, nbytes: int, pinned: bool = False) -> _Alloc:
        buf = np.empty(nbytes + ALIGN, np.uint8)
        start = (-buf.ctypes.data) % ALIGN
        raw = buf[start : start + nbytes]
        raw.fill(UNINITIALISED)
        alloc = _Alloc(raw, self.device, None if pinned else self.current, pinned, _caller())
        for old in [a for a in self.freed.values() if a.ptr < alloc.ptr + nbytes and alloc.ptr < a.ptr + a.nbytes]:
            del self.freed[old.ptr]
        self.live[alloc.ptr] = alloc
        bisect.insort(self.live_starts, alloc.ptr)
        return alloc

    def memory(self, nbytes: int) -> _Memory:
        """Device memory from the current stream's pool (``nbytes == 0``: CuPy's null pointer)."""
        return _Memory(self.allocate(nbytes) if nbytes else None, self.device)

    def pinned(self, nbytes: int) -> np.ndarray:
        """A NumPy ``uint8`` array of ``nbytes`` in stand-in pinned host memory."""
        return np.asarray(_PinnedBlock(self.allocate(max(nbytes, 1), pinned=True)))[:nbytes]

    def find(self, ptr: int, nbytes: int, *, pinned: Optional[bool] = None) -> Optional[_Alloc]:
        """The live allocation holding ``[ptr, ptr + nbytes)``, or ``None``."""
        i = bisect.bisect_right(self.live_starts, ptr) - 1
        if i >= 0:
            alloc = self.live[self.live_starts[i]]
            if ptr + max(nbytes, 1) <= alloc.ptr + alloc.nbytes and (pinned is None or alloc.pinned == pinned):
                return alloc
        return None

    def find_freed(self, ptr: int) -> Optional[_Alloc]:
        for alloc in self.freed.values():
            if alloc.ptr <= ptr < alloc.ptr + alloc.nbytes:
                return alloc
        return None

    def free(self, alloc: _Alloc, why: str) -> None:
        if not alloc.live:
            return
        alloc.live = False
        alloc.freed_at = why
        if alloc.generation != self.generation:  # from before the last reset: nothing queued uses it
            return
        del self.live[alloc.ptr]
        self.live_starts.remove(alloc.ptr)
        self.freed[alloc.ptr] = alloc
        if len(self.freed) > 4096:
            self.freed.pop(next(iter(self.freed)))
        if alloc.pinned:
            pending = [op for op, *_ in alloc.accesses if not self.known_done(op)]
            if pending:
                self.violation(
                    f"use after free: the {alloc.describe()} was freed ({why}) while {pending[0].what} "
                    f"(queued at {pending[0].where}) still uses it; pinned memory is not stream-ordered"
                )
                alloc.raw.fill(POISON)
            return
        # Device memory goes back to the pool of the stream it came from, reusable in that stream's order.
        self.enqueue(
            f"poison of the freed {alloc.describe()}",
            lambda raw=alloc.raw: raw.fill(POISON),
            stream=alloc.stream,
            writes=[(alloc, alloc.ptr, alloc.ptr + alloc.nbytes)],
            poison=True,
        )

    # ------------------------------------------------------------------ queueing and the race detector
    def enqueue(
        self,
        what: str,
        fn: Optional[Callable[[], Any]],
        *,
        reads: Iterable[Any] = (),
        writes: Iterable[Any] = (),
        stream: Optional[Stream] = None,
        deps: Sequence[Tuple[Stream, int]] = (),
        nccl: Any = None,
        poison: bool = False,
    ) -> _Op:
        """Queue ``fn`` on ``stream`` (default: the current one); it runs at a synchronisation point."""
        stream = stream or self.current
        deps = list(deps)
        null = self.streams[0]
        if stream is null:  # the legacy default stream waits for every blocking stream, and they for it
            deps += [(s, len(s.ops)) for s in self.streams[1:] if not s.non_blocking and s.ops]
        elif not stream.non_blocking and null.ops:
            deps.append((null, len(null.ops)))
        where = _caller()
        op = _Op(fn, what, deps, stream, len(stream.ops), nccl, where)
        clock = dict(stream.ops[-1].clock) if stream.ops else {}
        for source in [self.host] + [s.ops[upto - 1].clock for s, upto in deps if upto]:
            for sid, n in source.items():
                if clock.get(sid, 0) < n:
                    clock[sid] = n
        clock[stream.sid] = op.index + 1
        op.clock = clock
        accesses = [(*_extent(a), False) for a in reads] + [(*_extent(a), True) for a in writes]
        for alloc, lo, hi, write in accesses:
            if alloc is None or hi <= lo:
                continue
            if not alloc.live and not poison:
                self.violation(
                    f"use after free: {what} (queued at {where}) uses the {alloc.describe()}, "
                    f"freed before ({alloc.freed_at})"
                )
            self.check_races(alloc, op, lo, hi, write)
        stream.ops.append(op)
        self.ops_queued += 1
        if self.running:  # queued while other work runs (a buffer freed meanwhile): it runs later, in order
            return op
        if self.mode == "eager":
            self.run(stream, len(stream.ops))
        elif self.mode == "random":
            self.wander()
        return op

    def known_done(self, op: _Op) -> bool:
        return self.host.get(op.stream.sid, 0) > op.index

    def check_races(self, alloc: _Alloc, op: _Op, lo: int, hi: int, write: bool) -> None:
        keep = []
        for other, olo, ohi, owrite in alloc.accesses:
            if self.known_done(other):
                continue
            keep.append((other, olo, ohi, owrite))
            if other.stream is op.stream or ohi <= lo or hi <= olo or not (write or owrite):
                continue
            if op.clock.get(other.stream.sid, 0) > other.index:
                continue
            self.violation(
                f"race on the {alloc.describe()}: {op.what} (stream {op.stream.ptr:#x}, queued at {op.where}) and "
                f"{other.what} (stream {other.stream.ptr:#x}, queued at {other.where}) touch the same bytes, "
                "one of them writing, and no event or synchronisation orders them"
            )
        keep.append((op, lo, hi, write))
        alloc.accesses = keep

    def host_access(self, arrays: Iterable[Any], write: bool, who: str) -> None:
        """The host (``get()``, MPI) touches ``arrays`` now: unsynchronised conflicting work is a race."""
        for a in arrays:
            alloc, lo, hi = _extent(a)
            if alloc is None or hi <= lo:
                continue
            if not alloc.live:
                self.violation(f"use after free: {who} touches the {alloc.describe()}, freed ({alloc.freed_at})")
            for other, olo, ohi, owrite in alloc.accesses:
                if self.known_done(other) or ohi <= lo or hi <= olo or not (write or owrite):
                    continue
                self.violation(
                    f"unsynchronised host access: {who} touches the {alloc.describe()} while {other.what} "
                    f"(stream {other.stream.ptr:#x}, queued at {other.where}) has not been waited for"
                )
                break

    def violation(self, message: str) -> None:
        self.violations.append(message)

    def raise_violations(self) -> None:
        if self.violations:
            found, self.violations = self.violations, []
            more = "".join(f"\n  and: {m}" for m in found[1:4]) + (
                f"\n  ... {len(found) - 4} more" if len(found) > 4 else ""
            )
            mode = f"stand-in mode {self.mode!r}" + (
                f", HPCCOLL_STANDIN_SEED={self.seed}" if self.mode == "random" else ""
            )
            raise StandInRace(f"{found[0]}{more}\n  ({mode})")

    # ------------------------------------------------------------------ execution
    def run(self, stream: Stream, upto: int, local_only: bool = False) -> bool:
        """Run ``stream``'s queued work up to op ``upto`` (and what that waits for); ``False``: blocked."""
        self.running += 1
        try:
            while stream.done_ops < upto:
                op = stream.ops[stream.done_ops]
                for dep, dep_upto in op.deps:
                    if not self.run(dep, dep_upto, local_only):
                        return False
                if local_only and op.nccl is not None:
                    return False
                fn = op.fn
                if fn is not None:
                    try:
                        result = fn()
                    except BaseException:
                        op.fn = None
                        stream.done_ops += 1
                        raise
                    if result is BLOCKED:
                        return False
                op.fn = None
                stream.done_ops += 1
                self.ops_run += 1
            return True
        finally:
            self.running -= 1

    def sync(self, stream: Stream, upto: int) -> None:
        """The host waits for ``stream`` up to op ``upto``."""
        if not self.run(stream, upto):
            raise StandInHang(
                f"the host waits on stream {stream.ptr:#x}, which is blocked on a stalled NCCL "
                "communicator that was never aborted: a real GPU would hang here"
            )
        self.observed(stream, upto)
        self.raise_violations()

    def observed(self, stream: Stream, upto: int) -> None:
        """The host now knows ``stream``'s ops before ``upto`` (and what they waited for) are done."""
        if upto:
            for sid, n in stream.ops[upto - 1].clock.items():
                if self.host.get(sid, 0) < n:
                    self.host[sid] = n

    def query(self, stream: Stream, upto: int) -> bool:
        """``cudaEventQuery``/``cudaStreamQuery``: the first query of unfinished work says no; later ones run it."""
        if stream.done_ops < upto:
            seen = stream.queries.get(upto, 0)
            stream.queries[upto] = seen + 1
            if self.mode == "random":
                self.wander()
            if seen == 0 and stream.done_ops < upto:
                return False
            if not self.run(stream, upto):
                return False
        self.observed(stream, upto)
        self.raise_violations()
        return True

    def synchronize(self) -> None:
        """``cudaDeviceSynchronize``: every stream, in creation order."""
        for s in list(self.streams):
            if not self.run(s, len(s.ops)):
                raise StandInHang(
                    f"a device synchronisation waits on stream {s.ptr:#x}, blocked on a stalled NCCL "
                    "communicator that was never aborted: a real GPU would hang here"
                )
            self.observed(s, len(s.ops))
        self.raise_violations()

    def pending(self) -> int:
        """Operations queued and not yet run."""
        return builtins.sum(len(s.ops) - s.done_ops for s in self.streams)

    def wander(self) -> None:
        """Random mode: run a random prefix of a random stream's queued work (stopping before NCCL calls)."""
        if self.running or self.rng.random() < 0.5:
            return
        busy = [s for s in self.streams if s.done_ops < len(s.ops)]
        if busy:
            s = self.rng.choice(busy)
            self.run(s, self.rng.randint(s.done_ops + 1, len(s.ops)), local_only=True)

    def nccl_pending(self, stream: Stream, upto: int, seen: Optional[set] = None) -> List[_Op]:
        """The queued NCCL operations that running ``stream`` up to ``upto`` would execute."""
        seen = set() if seen is None else seen
        found: List[_Op] = []
        for op in stream.ops[stream.done_ops : upto]:
            if (stream.sid, op.index) in seen:
                continue
            seen.add((stream.sid, op.index))
            for dep, dep_upto in op.deps:
                found += self.nccl_pending(dep, dep_upto, seen)
            if op.nccl is not None:
                found.append(op)
        return found


GPU = _Device()
GPU.reset()


def _extent(a: Any) -> Tuple[Optional[_Alloc], int, int]:
    """``(allocation, first byte, end byte)`` that ``a`` spans: a device array, a pinned NumPy array or a triple."""
    if isinstance(a, tuple):
        return a
    if isinstance(a, ndarray):
        alloc = a._mem.alloc
        if alloc is None or a.size == 0:
            return None, 0, 0
        lo, hi = np.lib.array_utils.byte_bounds(a._v)
        return alloc, lo, hi
    if isinstance(a, np.ndarray):
        if a.size == 0:
            return None, 0, 0
        lo, hi = np.lib.array_utils.byte_bounds(a)
        return GPU.find(lo, hi - lo, pinned=True), lo, hi
    raise TypeError(f"stand-in: cannot track the memory of a {type(a).__name__}")


# --------------------------------------------------------------------------- arrays


class _Flags:
    __slots__ = ("c_contiguous", "f_contiguous", "owndata")

    def __init__(self, v: np.ndarray) -> None:
        self.c_contiguous = bool(v.flags.c_contiguous)
        self.f_contiguous = bool(v.flags.f_contiguous)
        self.owndata = False

    def __getitem__(self, key: str) -> bool:
        return {"C_CONTIGUOUS": self.c_contiguous, "F_CONTIGUOUS": self.f_contiguous, "OWNDATA": self.owndata}[key]


class Device:
    """``cupy.cuda.Device``."""

    def __init__(self, device: Optional[int] = None) -> None:
        self.id = GPU.device if device is None else int(device)
        self._saved: List[int] = []

    def use(self) -> None:
        GPU.device = self.id

    def __enter__(self) -> "Device":
        self._saved.append(GPU.device)
        GPU.device = self.id
        return self

    def __exit__(self, *exc: Any) -> None:
        GPU.device = self._saved.pop()

    def synchronize(self) -> None:
        GPU.synchronize()

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"<CUDA Device {self.id} (stand-in)>"

    @property
    def pci_bus_id(self) -> str:
        """One PCI bus per device index (``StandInRuntime``'s default too)."""
        return f"0000:{self.id + 1:02X}:00.0"


class MemoryPointer:
    """``cupy.cuda.MemoryPointer``: an address inside one device allocation."""

    __slots__ = ("mem", "ptr")

    def __init__(self, mem: _Memory, offset: int) -> None:
        self.mem = mem
        self.ptr = mem.ptr + offset if mem.ptr else 0

    @property
    def device_id(self) -> int:
        return self.mem.device_id

    @property
    def device(self) -> Device:
        return Device(self.mem.device_id)

    def __add__(self, offset: int) -> "MemoryPointer":
        return MemoryPointer(self.mem, self.ptr - self.mem.ptr + offset)

    def __int__(self) -> int:
        return self.ptr

    def copy_from_device_async(self, src: "MemoryPointer", size: int, stream: Optional[Stream] = None) -> None:
        _memcpy(self.ptr, src.ptr, size, stream or GPU.current, "MemoryPointer.copy_from_device_async")

    def copy_from_device(self, src: "MemoryPointer", size: int) -> None:
        _memcpy(self.ptr, src.ptr, size, GPU.current, "MemoryPointer.copy_from_device")

    def memset_async(self, value: int, size: int, stream: Optional[Stream] = None) -> None:
        _memset(self.ptr, value, size, stream or GPU.current, "MemoryPointer.memset_async")


def _device_range(ptr: int, size: int, who: str) -> _Alloc:
    alloc = GPU.find(ptr, size, pinned=False)
    if alloc is None:
        freed = GPU.find_freed(ptr)
        if freed is not None:
            raise RuntimeError(f"{who}: address {ptr:#x} is in the freed {freed.describe()} ({freed.freed_at})")
        raise RuntimeError(
            f"{who}: [{ptr:#x}, +{size}) is not inside one device allocation "
            "(cudaErrorInvalidValue, or an illegal address on a GPU)"
        )
    return alloc


def _memcpy(dst: int, src: int, size: int, stream: Stream, who: str) -> None:
    if not size:
        return
    d, s = _device_range(dst, size, who), _device_range(src, size, who)
    dv = d.raw[dst - d.ptr : dst - d.ptr + size]
    sv = s.raw[src - s.ptr : src - s.ptr + size]
    if d is s and dst != src and dst < src + size and src < dst + size:
        GPU.violation(
            f"{who}: source and destination overlap (queued at {_caller()}); cudaMemcpyAsync is undefined there"
        )
    GPU.enqueue(
        who, lambda: np.copyto(dv, sv), reads=[(s, src, src + size)], writes=[(d, dst, dst + size)], stream=stream
    )


def _memset(ptr: int, value: int, size: int, stream: Stream, who: str) -> None:
    if size:
        alloc = _device_range(ptr, size, who)
        view = alloc.raw[ptr - alloc.ptr : ptr - alloc.ptr + size]
        GPU.enqueue(who, lambda: view.fill(value & 0xFF), writes=[(alloc, ptr, ptr + size)], stream=stream)


def _shape(shape: Any) -> Tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    return tuple(operator.index(n) for n in shape)


class ndarray:  # noqa: N801 - CuPy's name
    """``cupy.ndarray`` stand-in: metadata over device memory that only queued work touches."""

    __slots__ = ("_mem", "_v", "__weakref__")

    def __init__(
        self,
        shape: Any,
        dtype: Any = float,
        memptr: Optional[MemoryPointer] = None,
        strides: Any = None,
        order: str = "C",
    ) -> None:
        shape, dtype = _shape(shape), np.dtype(dtype)
        if memptr is None:
            nbytes = dtype.itemsize
            for n in shape:
                nbytes *= n
            mem, offset = GPU.memory(nbytes), 0
        else:
            mem = memptr.mem
            offset = memptr.ptr - (mem.ptr if mem.alloc is None else mem.alloc.ptr)
        self._mem = mem
        if mem.alloc is None:
            self._v = np.empty(shape, dtype, order=order)
        else:
            self._v = np.ndarray(shape, dtype, buffer=mem.alloc.raw, offset=offset, strides=strides, order=order)

    def _same_memory(self, v: np.ndarray) -> "ndarray":
        a = ndarray.__new__(ndarray)
        a._mem, a._v = self._mem, v
        return a

    # ---- metadata: no device work
    shape = property(lambda self: self._v.shape)
    dtype = property(lambda self: self._v.dtype)
    ndim = property(lambda self: self._v.ndim)
    size = property(lambda self: self._v.size)
    itemsize = property(lambda self: self._v.itemsize)
    nbytes = property(lambda self: self._v.nbytes)
    strides = property(lambda self: self._v.strides)
    flags = property(lambda self: _Flags(self._v))

    @property
    def data(self) -> MemoryPointer:
        if self._mem.alloc is None:
            return MemoryPointer(self._mem, 0)
        return MemoryPointer(self._mem, self._v.__array_interface__["data"][0] - self._mem.ptr)

    @property
    def device(self) -> Device:
        return Device(self._mem.device_id)

    def __len__(self) -> int:
        return len(self._v)

    def __repr__(self) -> str:  # never reads device memory: no hidden synchronisation inside assertion messages
        return f"<stand-in cupy.ndarray shape={self.shape} dtype={self.dtype} at {self.data.ptr:#x}>"

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError(
            "Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct "
            "a NumPy array explicitly. (stand-in, as CuPy)"
        )

    def __iter__(self) -> Any:
        raise NotImplementedError("stand-in: iterating over a device array is not modelled; use .get()")

    @property
    def __cuda_array_interface__(self) -> dict:
        # The consumer (mpi4py) reads and writes the memory from the host at once, without synchronising.
        GPU.host_access([self], True, "a host consumer of __cuda_array_interface__ (MPI)")
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "descr": [("", self.dtype.str)],
            "data": (self.data.ptr, False),
            "version": 3,
            "strides": None if self._v.flags.c_contiguous else self._v.strides,
            "stream": GPU.current.ptr or 1,
        }

    # ---- views
    def view(self, dtype: Any = None) -> "ndarray":
        return self._same_memory(self._v.view() if dtype is None else self._v.view(dtype))

    def reshape(self, *shape: Any, order: str = "C") -> "ndarray":
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        try:
            return self._same_memory(np.reshape(self._v, shape, order=order, copy=False))
        except ValueError:
            return self.copy(order=order).reshape(*shape, order=order)

    def ravel(self, order: str = "C") -> "ndarray":
        return self.reshape(-1, order=order)

    def transpose(self, *axes: Any) -> "ndarray":
        return self._same_memory(self._v.transpose(*axes))

    @property
    def T(self) -> "ndarray":  # noqa: N802 - NumPy's name
        return self.transpose()

    def __getitem__(self, key: Any) -> "ndarray":
        key = key if isinstance(key, tuple) else (key,)
        for k in key:
            if isinstance(k, bool) or not (k is None or k is Ellipsis or isinstance(k, (slice, int, np.integer))):
                raise NotImplementedError(f"stand-in: only basic indexing is modelled; got {type(k).__name__}")
        if Ellipsis not in key:
            key = key + (Ellipsis,)  # a 0-d view, never a NumPy scalar (which would read the memory now)
        return self._same_memory(self._v[key])

    # ---- device work
    def __setitem__(self, key: Any, value: Any) -> None:
        copyto(self[key], value, casting="unsafe", what="__setitem__")

    def copy(self, order: str = "C") -> "ndarray":
        out = empty(self.shape, self.dtype, order="F" if order == "F" else "C")
        copyto(out, self, what="copy")
        return out

    def astype(self, dtype: Any, order: str = "K", casting: Optional[str] = None, copy: bool = True) -> "ndarray":
        dtype = np.dtype(dtype)
        if dtype == self.dtype and not copy:
            return self
        fortran = order == "F" or (order in "KA" and self.flags.f_contiguous and not self.flags.c_contiguous)
        out = empty(self.shape, dtype, order="F" if fortran else "C")
        copyto(out, self, casting="unsafe" if casting is None else casting, what="astype")
        return out

    def fill(self, value: Any) -> None:
        copyto(self, value, casting="unsafe", what="fill")

    def get(
        self, stream: Optional[Stream] = None, order: str = "C", out: Optional[np.ndarray] = None, blocking: bool = True
    ) -> np.ndarray:
        """Copy to the host on ``stream`` (default: the current one) and wait for that stream only."""
        stream = stream or GPU.current
        GPU.sync(stream, len(stream.ops))
        GPU.host_access([self], False, f"get() waiting for stream {stream.ptr:#x} only")
        GPU.raise_violations()
        result = np.array(self._v, order=order, copy=True)
        if out is None:
            return result
        out[...] = result
        return out

    def set(self, arr: np.ndarray, stream: Optional[Stream] = None) -> None:
        copyto(self, np.asarray(arr), what="set", stream=stream)

    def item(self) -> Any:
        return self.get().item()

    def __bool__(self) -> bool:
        return bool(self.get())

    def __float__(self) -> float:
        return float(self.get())

    def __int__(self) -> int:
        return int(self.get())

    def sum(self, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: bool = False) -> "ndarray":
        return _reduce(np.add, self, axis, dtype, out, keepdims)

    def prod(self, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: bool = False) -> "ndarray":
        return _reduce(np.multiply, self, axis, dtype, out, keepdims)


def _arithmetic(ufunc: Any) -> Tuple[Callable, Callable, Callable]:
    """``a op b``, ``b op a`` and ``a op= b`` for ``ufunc``: one queued elementwise kernel each."""

    def forward(self: ndarray, other: Any) -> ndarray:
        return _elementwise(ufunc, [self, other])

    def reflected(self: ndarray, other: Any) -> ndarray:
        return _elementwise(ufunc, [other, self])

    def in_place(self: ndarray, other: Any) -> ndarray:
        _elementwise(ufunc, [self, other], out=self)
        return self

    return forward, reflected, in_place


for _op, _ufunc in (("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("truediv", np.true_divide)):
    for _prefix, _method in zip(("", "r", "i"), _arithmetic(_ufunc)):
        setattr(ndarray, f"__{_prefix}{_op}__", _method)

ndarray.__module__ = "cupy"  # hpccoll recognises CuPy arrays in lists by their type's module


def _operand(x: Any, what: str) -> Tuple[Any, List[Any]]:
    """What a queued operation reads for ``x`` (device memory, or host data copied now) and what it accesses."""
    if isinstance(x, ndarray):
        return x._v, [x]
    if isinstance(x, np.ndarray):  # host data: staged now, as CUDA does with pageable memory
        return np.array(x, copy=True), []
    if isinstance(x, (bool, int, float, complex, np.generic)):
        return x, []
    raise TypeError(f"stand-in {what}: unsupported operand {type(x).__name__}")


def _overlap_check(target: np.ndarray, sources: List[np.ndarray], what: str) -> None:
    """CuPy copies with cudaMemcpyAsync or a parallel kernel: a source partly overlapping its target is undefined."""
    for src in sources:
        if not (src.size and target.size and np.may_share_memory(src, target)):
            continue
        same = (
            src.__array_interface__["data"][0] == target.__array_interface__["data"][0]
            and src.strides == target.strides
            and src.shape == target.shape
        )
        if not same and np.shares_memory(src, target):
            GPU.violation(
                f"{what}: source and destination partly overlap (queued at {_caller()}); CuPy copies "
                "with cudaMemcpyAsync or a parallel kernel, undefined there"
            )


def _elementwise(ufunc: Any, inputs: List[Any], out: Optional[ndarray] = None) -> ndarray:
    views, reads = [], []
    for x in inputs:
        v, r = _operand(x, ufunc.__name__)
        views.append(v)
        reads += r
    dtype = ufunc(*[np.empty(1, v.dtype) if isinstance(v, np.ndarray) else v for v in views]).dtype
    shape = np.broadcast_shapes(*[v.shape for v in views if isinstance(v, np.ndarray)])
    if out is None:
        out = empty(shape, dtype)
    elif not np.can_cast(dtype, out.dtype, "same_kind"):
        raise TypeError(f"Cannot cast ufunc '{ufunc.__name__}' output from {dtype} to {out.dtype} (stand-in)")
    target = out._v
    _overlap_check(target, [x._v for x in inputs if isinstance(x, ndarray)], ufunc.__name__)
    GPU.enqueue(
        f"kernel {ufunc.__name__}", lambda: ufunc(*views, out=target, casting="unsafe"), reads=reads, writes=[out]
    )
    return out


def _reduce(ufunc: Any, a: ndarray, axis: Any, dtype: Any, out: Any, keepdims: bool) -> ndarray:
    probe = ufunc.reduce(np.zeros((1,) * a.ndim, a.dtype), axis=axis, dtype=dtype, keepdims=keepdims)
    if a.ndim == 0:
        axes: Sequence[int] = ()
    elif axis is None:
        axes = range(a.ndim)
    else:
        axes = [ax % a.ndim for ax in (axis if isinstance(axis, tuple) else (axis,))]
    shape = tuple(1 if i in axes else n for i, n in enumerate(a.shape) if keepdims or i not in axes)
    if out is None:
        out = empty(shape, probe.dtype)
    src, target = a._v, out._v
    GPU.enqueue(
        f"reduction {ufunc.__name__}",
        lambda: ufunc.reduce(src, axis=axis, dtype=dtype, out=target, keepdims=keepdims),
        reads=[a],
        writes=[out],
    )
    return out


# --------------------------------------------------------------------------- cupy.*


def empty(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    return ndarray(shape, dtype, order=order)


def zeros(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    a = empty(shape, dtype, order)
    a.fill(0)
    return a


def ones(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    a = empty(shape, dtype, order)
    a.fill(1)
    return a


def full(shape: Any, fill_value: Any, dtype: Any = None, order: str = "C") -> ndarray:
    a = empty(shape, np.asarray(fill_value).dtype if dtype is None else dtype, order)
    a.fill(fill_value)
    return a


def empty_like(a: ndarray, dtype: Any = None, order: str = "K", shape: Any = None) -> ndarray:
    fortran = order == "F" or (order in "KA" and a.flags.f_contiguous and not a.flags.c_contiguous)
    return empty(
        a.shape if shape is None else shape, a.dtype if dtype is None else dtype, order="F" if fortran else "C"
    )


def zeros_like(a: ndarray, dtype: Any = None, order: str = "K", shape: Any = None) -> ndarray:
    out = empty_like(a, dtype, order, shape)
    out.fill(0)
    return out


def array(obj: Any, dtype: Any = None, copy: bool = True, order: str = "K", ndmin: int = 0) -> ndarray:
    if isinstance(obj, ndarray):
        return obj.astype(obj.dtype if dtype is None else dtype, copy=copy)
    host = np.array(obj, dtype=dtype, order="K" if order == "A" else order, ndmin=ndmin, copy=True)
    fortran = host.flags.f_contiguous and not host.flags.c_contiguous
    out = empty(host.shape, host.dtype, order="F" if fortran else "C")
    copyto(out, host, what="host-to-device copy")
    return out


class _Borrowed(_Memory):
    """Device memory another library owns (CuPy's ``UnownedMemory``): dropping the view frees nothing."""

    __slots__ = ()

    def free(self) -> None:
        pass

    def __del__(self) -> None:
        pass


def UnownedMemory(ptr: int, size: int, owner: Any, device_id: int = -1) -> _Memory:  # noqa: N802 - CuPy's name
    """``cupy.cuda.UnownedMemory``: ``size`` bytes at ``ptr`` that ``owner`` keeps alive (inside one stand-in
    device allocation, else the error CUDA's pointer query would give)."""
    alloc = _device_range(operator.index(ptr), operator.index(size), "cupy.cuda.UnownedMemory")
    mem = _Borrowed(alloc, alloc.device if device_id < 0 else device_id)
    mem.ptr, mem.size = ptr, size
    return mem


def _from_interface(obj: Any) -> ndarray:
    """A view of another library's device memory through ``__cuda_array_interface__``, as CuPy makes it: the
    dtype is ``numpy.dtype(typestr)`` alone, so a type the producer describes as raw bytes (XLA's ``"<V2"``
    for bfloat16) arrives as ``|V2`` (cupy/_core/core.pyx, ``_convert_object_with_cuda_array_interface``)."""
    desc = obj.__cuda_array_interface__
    shape, dtype = tuple(desc["shape"]), np.dtype(desc["typestr"])
    ptr = desc["data"][0]
    nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
    if not nbytes:
        return ndarray(shape, dtype)
    alloc = _device_range(ptr, nbytes, "cupy.asarray(__cuda_array_interface__)")
    mem = _Borrowed(alloc, alloc.device)
    return ndarray(shape, dtype, memptr=MemoryPointer(mem, ptr - alloc.ptr), strides=desc.get("strides"))


def asarray(obj: Any, dtype: Any = None, order: Optional[str] = None) -> ndarray:
    if isinstance(obj, ndarray) and (dtype is None or np.dtype(dtype) == obj.dtype):
        return obj
    if not isinstance(obj, ndarray) and hasattr(obj, "__cuda_array_interface__"):
        view = _from_interface(obj)
        return view if dtype is None else view.astype(dtype)
    return array(obj, dtype=dtype, copy=True, order=order or "K")


def ascontiguousarray(a: ndarray, dtype: Any = None) -> ndarray:
    if a.flags.c_contiguous and (dtype is None or np.dtype(dtype) == a.dtype):
        return a
    out = empty(a.shape, a.dtype if dtype is None else dtype)
    copyto(out, a, casting="unsafe", what="ascontiguousarray")
    return out


def asfortranarray(a: ndarray, dtype: Any = None) -> ndarray:
    if a.flags.f_contiguous and (dtype is None or np.dtype(dtype) == a.dtype):
        return a
    out = empty(a.shape, a.dtype if dtype is None else dtype, order="F")
    copyto(out, a, casting="unsafe", what="asfortranarray")
    return out


def copyto(
    dst: ndarray,
    src: Any,
    casting: str = "same_kind",
    where: Any = None,
    *,
    what: str = "copyto",
    stream: Optional[Stream] = None,
) -> None:
    """``cupy.copyto``: one queued copy, its shapes, casting and overlap checked now."""
    if not isinstance(dst, ndarray):
        raise TypeError(f"stand-in {what}: the destination must be a device array; got {type(dst).__name__}")
    if where is not None:
        raise NotImplementedError("stand-in: copyto(where=...) is not modelled")
    value, reads = _operand(src, what)
    if isinstance(value, np.ndarray):
        if not np.can_cast(value.dtype, dst.dtype, casting):
            raise TypeError(
                f"Cannot cast array data from {value.dtype} to {dst.dtype} according to the rule {casting!r} (stand-in)"
            )
        if np.broadcast_shapes(value.shape, dst.shape) != dst.shape:
            raise ValueError(f"could not broadcast input array from shape {value.shape} into shape {dst.shape}")
    if dst.size == 0:
        return
    target = dst._v
    _overlap_check(target, [value] if reads else [], what)
    GPU.enqueue(what, lambda: np.copyto(target, value, casting="unsafe"), reads=reads, writes=[dst], stream=stream)


def concatenate(
    arrays: Sequence[ndarray], axis: Optional[int] = 0, out: Optional[ndarray] = None, dtype: Any = None
) -> ndarray:
    arrays = list(arrays)
    views = [a._v for a in arrays]
    if axis is None:
        shape: Tuple[int, ...] = (builtins.sum(v.size for v in views),)
    else:
        ax = axis % views[0].ndim
        shape = views[0].shape[:ax] + (builtins.sum(v.shape[ax] for v in views),) + views[0].shape[ax + 1 :]
    if out is None:
        out = empty(shape, np.result_type(*views) if dtype is None else dtype)
    target = out._v

    def run() -> None:
        if axis is None:
            np.concatenate([v.reshape(-1) for v in views], out=target, casting="unsafe")
        else:
            np.concatenate(views, axis=axis, out=target, casting="unsafe")

    GPU.enqueue("concatenate", run, reads=arrays, writes=[out])
    return out


def prod(a: ndarray, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: bool = False) -> ndarray:
    return _reduce(np.multiply, a, axis, dtype, out, keepdims)


def sum(a: ndarray, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: bool = False) -> ndarray:  # noqa: A001
    return _reduce(np.add, a, axis, dtype, out, keepdims)


def may_share_memory(a: ndarray, b: ndarray, max_work: Any = None) -> bool:
    """By bounds, as CuPy does."""
    (x, xlo, xhi), (y, ylo, yhi) = _extent(a), _extent(b)
    return x is not None and x is y and xlo < yhi and ylo < xhi


def shares_memory(a: ndarray, b: ndarray, max_work: Any = None) -> bool:
    return may_share_memory(a, b) and bool(np.shares_memory(a._v, b._v))


def asnumpy(a: Any, stream: Optional[Stream] = None, order: str = "C", out: Any = None) -> np.ndarray:
    if isinstance(a, ndarray):
        return a.get(stream=stream, order=order, out=out)
    return np.asarray(a, order=order)


def get_array_module(*args: Any) -> Any:
    return sys.modules[__name__] if any(isinstance(a, ndarray) for a in args) else np


for _name in (
    "bool_",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "dtype",
    "newaxis",
):
    globals()[_name] = getattr(np, _name)


# --------------------------------------------------------------------------- cupy.cuda


def _stream(handle: Any) -> Stream:
    """The stream whose handle is ``handle`` (what NCCL and the runtime get), or raise as CUDA would."""
    if isinstance(handle, Stream):
        return handle
    s = GPU.by_ptr.get(handle) if isinstance(handle, int) and not isinstance(handle, bool) else None
    if s is None:
        raise RuntimeError(f"cudaErrorInvalidResourceHandle: {handle!r} is not a stream of this device (stand-in)")
    return s


class _Runtime:
    """``cupy.cuda.runtime``: the calls on devices and raw pointers."""

    memcpyHostToHost, memcpyHostToDevice, memcpyDeviceToHost, memcpyDeviceToDevice, memcpyDefault = 0, 1, 2, 3, 4

    @staticmethod
    def getDevice() -> int:  # noqa: N802 - CUDA's names
        return GPU.device

    @staticmethod
    def setDevice(device: int) -> None:  # noqa: N802
        GPU.device = device

    @staticmethod
    def deviceSynchronize() -> None:  # noqa: N802
        GPU.synchronize()

    #: What getDeviceCount() says (a test knob); 0 raises, as CUDA does without a GPU.
    devices = 8

    @staticmethod
    def getDeviceCount() -> int:  # noqa: N802
        if _Runtime.devices < 1:
            raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected (stand-in)")
        return _Runtime.devices

    @staticmethod
    def memcpyAsync(dst: int, src: int, size: int, kind: int, stream: int) -> None:  # noqa: N802
        # runtime.pyx: memcpyAsync(intptr_t dst, intptr_t src, size_t size, int kind, intptr_t stream)
        for name, v in (("dst", dst), ("src", src), ("stream", stream)):
            if not isinstance(v, int):  # Cython's intptr_t: a Python int only (see standin_nccl._intptr)
                raise TypeError(f"an integer is required (memcpyAsync {name}: got {type(v).__name__})")
        size, kind = operator.index(size), operator.index(kind)
        if kind in (3, 4):
            _memcpy(dst, src, size, _stream(stream), "runtime.memcpyAsync")
        elif kind in (1, 2):
            _host_memcpy(dst, src, size, kind == 2, _stream(stream))
        else:
            raise NotImplementedError(f"stand-in: runtime.memcpyAsync of kind {kind} is not modelled")

    @staticmethod
    def memsetAsync(ptr: int, value: int, size: int, stream: int) -> None:  # noqa: N802
        _memset(ptr, value, size, _stream(stream), "runtime.memsetAsync")


def _host_memcpy(dst: int, src: int, size: int, to_host: bool, stream: Stream) -> None:
    """cudaMemcpyAsync between device memory and host memory at an address: queued on ``stream`` for pinned
    host memory; for pageable memory a device-to-host copy waits for the stream first and a host-to-device one
    reads the host bytes at the call, as CUDA does."""
    if not size:
        return
    import ctypes

    dev_ptr, host_ptr = (src, dst) if to_host else (dst, src)
    d = _device_range(dev_ptr, size, "runtime.memcpyAsync")
    dev = d.raw[dev_ptr - d.ptr : dev_ptr - d.ptr + size]
    pinned = GPU.find(host_ptr, size, pinned=True)
    if pinned is not None:
        host = pinned.raw[host_ptr - pinned.ptr : host_ptr - pinned.ptr + size]
        span = (pinned, host_ptr, host_ptr + size)
        if to_host:
            GPU.enqueue(
                "device-to-host copy",
                lambda: np.copyto(host, dev),
                reads=[(d, src, src + size)],
                writes=[span],
                stream=stream,
            )
        else:
            GPU.enqueue(
                "host-to-device copy",
                lambda: np.copyto(dev, host),
                reads=[span],
                writes=[(d, dst, dst + size)],
                stream=stream,
            )
        return
    host = np.frombuffer((ctypes.c_uint8 * size).from_address(host_ptr), np.uint8)
    if to_host:
        stream.synchronize()
        host[...] = dev
    else:
        data = host.copy()
        GPU.enqueue("host-to-device copy", lambda: np.copyto(dev, data), writes=[(d, dst, dst + size)], stream=stream)


def alloc_pinned_memory(size: int) -> np.ndarray:
    """``cupy.cuda.alloc_pinned_memory``: page-locked host memory exposing the buffer protocol (here a tracked
    stand-in pinned buffer; its last view dropped frees it)."""
    return GPU.pinned(operator.index(size))


def alloc(size: int) -> MemoryPointer:
    """``cupy.cuda.alloc``: raw device memory from the current stream's pool."""
    return MemoryPointer(GPU.memory(size), 0)


class _Cuda:
    """``cupy.cuda``."""

    Stream = Stream
    Event = Event
    Device = Device
    MemoryPointer = MemoryPointer
    runtime = _Runtime
    get_current_stream = staticmethod(get_current_stream)
    alloc = staticmethod(alloc)
    alloc_pinned_memory = staticmethod(alloc_pinned_memory)
    UnownedMemory = staticmethod(UnownedMemory)
    ExternalStream = staticmethod(ExternalStream)


cuda = _Cuda()
