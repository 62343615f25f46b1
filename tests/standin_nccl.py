"""A NumPy-over-MPI STAND-IN for ``cupy.cuda.nccl`` and the transports' CuPy runtime -- a test fixture.

CPU-only CI cannot run CUDA, yet the GPU transports' own logic (uneven shards,
complex-as-reals, dtype mapping, chunking, streams, temporaries, the id
bootstrap, the probe) must run there. This module implements the pointer-level
API :mod:`hpccoll.transports.nccl` calls -- ``NcclCommunicator`` with
``allGather``, ``reduceScatter``, ``allReduce``, ``broadcast``, ``bcast``,
``reduce``, ``send``, ``recv``; module-level ``groupStart``/``groupEnd``,
``get_unique_id``, ``get_version`` and the ``NCCL_*`` constants -- over MPI, on
the device memory of the CuPy stand-in (``tests/standin_cupy.py``).

Like NCCL (and CuPy's binding of it) it

* runs each call **on the stream it is given, when that stream gets there**:
  a call is queued on its stream and moves data only when the stand-in device
  runs the stream (at a synchronisation point), so reading a result, reusing a
  buffer or enqueuing on another stream before the call has run goes wrong as
  it would on a GPU (see ``standin_cupy`` for the race detector and poisoned
  lifetimes; the calls' reads and writes take part in both);
* checks its arguments when called, as CuPy's Cython signatures and NCCL's
  argument check do: C types (``intptr_t`` pointers and stream, ``size_t``
  counts, ``int`` datatype/op/root; a negative or too large count raises
  ``OverflowError``; :data:`MAX_COUNT` declares a smaller limit for tests, and
  :data:`INT_COUNT_CALLS` names calls whose count is a C ``int``, as in older
  CuPy), NCCL's ten datatypes and its ops (``ncclAvg`` from NCCL 2.10,
  ``ncclBfloat16`` too), buffers that must be device memory of the
  communicator's GPU and lie inside one allocation, and the in-place layouts:
  allGather ``send == recv + rank*count``, reduceScatter
  ``recv == send + rank*count``, allReduce/broadcast/reduce ``send == recv``;
  any other overlap raises ``NCCL_ERROR_INVALID_ARGUMENT`` (on a GPU it would
  be a silent data race);
* rendezvouses through the unique id alone (the id names its creator's
  ``COMM_WORLD`` rank, as NCCL's names the root's socket address), and refuses
  two ranks on one GPU (same PCI bus id) as NCCL does ("Duplicate GPU"),
  unless NCCL >= 2.30 runs with ``NCCL_MULTI_RANK_GPU_ENABLE=1``;
  ``device_id()`` is the GPU that was current when the communicator was made;
* checks that every rank called the same collective with the same count,
  datatype, op and root when the calls run (NCCL would hang or corrupt; this
  raises ``StandInMismatch`` on all ranks);
* queues calls between ``groupStart`` and ``groupEnd`` and launches them at
  the outermost ``groupEnd`` as one operation on their stream: point-to-point
  calls as ``Isend``/``Irecv`` posted first, collectives in issue order, then
  ``Waitall``;
* reports asynchronous errors through ``check_async_error`` once one is
  injected (:meth:`MPIStandInNcclCommunicator.inject_async_error`), and can
  *stall* (:meth:`~MPIStandInNcclCommunicator.stall`): queued calls never
  complete until the communicator is aborted, as with a peer that died.

A rank that waits more than :data:`HANG_SECONDS` for its peers' matching call
raises :class:`StandInHang` instead of hanging the test run.

:class:`StandInRuntime` is the stand-in for the transports' CuPy runtime
(:class:`hpccoll.transports._cuda.CupyRuntime`): the CuPy stand-in as the
array module, fake GPUs with configurable PCI bus ids, pinned host buffers
whose lifetime is tracked, and host <-> device copies queued on the current
stream. Install it with ``hpccoll.transports._cuda.use_runtime`` and the CuPy
stand-in with ``sys.modules["cupy"] = standin_cupy``.
"""

from __future__ import annotations

import ctypes
import itertools
import operator
import os
import random
import sys
import time
from typing import Any, Callable, List, Optional

import numpy as np
import standin_cupy
from mpi4py import MPI
from standin_cupy import BLOCKED, GPU, StandInHang, _stream

from hpccoll.transports._cuda import CupyRuntime

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - the test extra installs it
    ml_dtypes = None

NCCL_UNIQUE_ID_BYTES = 128

NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN, NCCL_AVG = 0, 1, 2, 3, 4
NCCL_INT8 = NCCL_CHAR = 0
NCCL_UINT8 = 1
NCCL_INT32 = NCCL_INT = 2
NCCL_UINT32 = 3
NCCL_INT64 = 4
NCCL_UINT64 = 5
NCCL_FLOAT16 = NCCL_HALF = 6
NCCL_FLOAT32 = NCCL_FLOAT = 7
NCCL_FLOAT64 = NCCL_DOUBLE = 8
NCCL_BFLOAT16 = 9
# ncclFloat8e4m3 and ncclFloat8e5m2, NCCL 2.24's (nccl.h: ncclFloat8e4m3 = 10, ncclFloat8e5m2 = 11). CuPy 14.2's
# binding names no constant for them (cupy_backends/cuda/libs/nccl.pyx), but its ``int datatype`` passes them
# through to NCCL, which takes them from 2.24: accepted here from that version, as NCCL does.
_FLOAT8_E4M3, _FLOAT8_E5M2 = 10, 11
FLOAT8_VERSION = 22400

# ncclResult_t (nccl.h), what the binding's NcclError carries as ``status``.
UNHANDLED_CUDA_ERROR, SYSTEM_ERROR, INTERNAL_ERROR, INVALID_ARGUMENT, INVALID_USAGE, REMOTE_ERROR = 1, 2, 3, 4, 5, 6
_ERROR_NAMES = {
    1: ("NCCL_ERROR_UNHANDLED_CUDA_ERROR", "unhandled cuda error"),
    2: ("NCCL_ERROR_SYSTEM_ERROR", "unhandled system error"),
    3: ("NCCL_ERROR_INTERNAL_ERROR", "internal error"),
    4: ("NCCL_ERROR_INVALID_ARGUMENT", "invalid argument"),
    5: ("NCCL_ERROR_INVALID_USAGE", "invalid usage"),
    6: ("NCCL_ERROR_REMOTE_ERROR", "remote process exited or there was a network error"),
}

DTYPES = {
    NCCL_INT8: np.dtype(np.int8),
    NCCL_UINT8: np.dtype(np.uint8),
    NCCL_INT32: np.dtype(np.int32),
    NCCL_UINT32: np.dtype(np.uint32),
    NCCL_INT64: np.dtype(np.int64),
    NCCL_UINT64: np.dtype(np.uint64),
    NCCL_FLOAT16: np.dtype(np.float16),
    NCCL_FLOAT32: np.dtype(np.float32),
    NCCL_FLOAT64: np.dtype(np.float64),
}
if ml_dtypes is not None:
    DTYPES[NCCL_BFLOAT16] = np.dtype(ml_dtypes.bfloat16)
    DTYPES[_FLOAT8_E4M3] = np.dtype(ml_dtypes.float8_e4m3fn)
    DTYPES[_FLOAT8_E5M2] = np.dtype(ml_dtypes.float8_e5m2)
UFUNCS = {NCCL_SUM: np.add, NCCL_PROD: np.multiply, NCCL_MAX: np.maximum, NCCL_MIN: np.minimum, NCCL_AVG: np.add}

# ---- knobs the tests turn (with monkeypatch, on every rank) ----
#: Reported by get_version(), the library's runtime version: below 21000 (NCCL 2.10) there is no bfloat16 and
#: no ncclAvg, below 22400 no float8. 2.28.3 by default: users run 2.28 to 2.32 (nvidia-nccl-cu12 is 2.32.3).
VERSION = 22803
#: Reported by get_build_version(): the NCCL CuPy was built against, apart from the one it loads (CuPy 14.2's
#: cupy-cuda12x wheel says 22501 while it loads 2.32.3: the conformance suite, tests/test_conformance.py).
BUILD_VERSION = 22501
#: What get_unique_id() returns and NcclCommunicator accepts: "bytes" (CuPy 14) or "tuple" (older).
ID_FORM = "bytes"
#: When true, get_unique_id() raises, as it does when NCCL cannot open its bootstrap socket.
FAIL_UNIQUE_ID = False
#: A count limit declared for tests: larger counts raise OverflowError, as C int does at 2**31 - 1.
MAX_COUNT: Optional[int] = None
#: Calls whose count the binding declares as C ``int`` (older CuPy: broadcast and bcast); the rest are size_t.
INT_COUNT_CALLS: frozenset = frozenset()
#: Seconds a rank waits for its peers' matching call before raising StandInHang.
HANG_SECONDS = float(os.environ.get("HPCCOLL_STANDIN_HANG_SECONDS", "60"))

INT_MAX = 2**31 - 1
SIZE_MAX = 2**64 - 1
_TAG = 0x5A5A  # rendezvous messages on COMM_WORLD: tag base (tests never use point-to-point there)
_CALL_CODES = {
    name: i for i, name in enumerate(["allGather", "allReduce", "reduceScatter", "broadcast", "reduce", "send", "recv"])
}
_serial = itertools.count()
_depth = 0
_group: List["_Call"] = []


class NcclError(RuntimeError):
    """What the stand-in raises where NCCL returns an error code: the binding's ``NcclError(int status)``.

    As CuPy's (cupy_backends/cuda/libs/nccl.pyx, ``NcclError.__init__``), it takes the ``ncclResult_t`` and
    carries it as ``status``; its message starts ``NCCL_ERROR_<NAME>: ``. The stand-in adds what it found
    (``detail``) where NCCL's own message would be, since there is no ``NCCL_DEBUG=WARN`` log to read.
    """

    def __init__(self, status: int, detail: str = "") -> None:
        self.status = status
        name, text = _ERROR_NAMES[status]
        super().__init__(f"{name}: {detail or text}")

    def __reduce__(self) -> Any:
        return (type(self), (self.status, str(self).partition(": ")[2]))


class NcclConfig:
    """``cupy.cuda.nccl.NcclConfig(split_share=0)``, accepted by the constructor (nccl.pyx, ``NcclConfig``)."""

    def __init__(self, split_share: int = 0) -> None:
        self.split_share = _cint(split_share)


class StandInMismatch(AssertionError):
    """Ranks issued different NCCL calls: a bug in the code under test."""


def get_version() -> int:
    return VERSION


def get_build_version() -> int:
    return BUILD_VERSION


def get_unique_id() -> Any:
    if FAIL_UNIQUE_ID:
        raise NcclError(SYSTEM_ERROR, "stand-in asked to fail ncclGetUniqueId")
    head = b"STANDIN" + MPI.COMM_WORLD.Get_rank().to_bytes(4, "little") + next(_serial).to_bytes(4, "little")
    raw = head + bytes(NCCL_UNIQUE_ID_BYTES - len(head))
    if ID_FORM == "bytes":
        return raw
    return tuple(b - 256 if b > 127 else b for b in raw)  # signed chars, as on x86


def groupStart() -> None:  # noqa: N802 - the binding's name
    global _depth
    _depth += 1


def groupEnd() -> None:  # noqa: N802
    global _depth
    if _depth == 0:
        raise NcclError(INVALID_USAGE, "groupEnd without groupStart")
    _depth -= 1
    if _depth == 0 and _group:
        calls, _group[:] = list(_group), []
        _launch(calls)


# --------------------------------------------------------------------------- argument conversion (Cython's)


def _index(value: Any) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"an integer is required (got type {type(value).__name__})") from None


def _intptr(value: Any) -> int:
    # Cython's ``intptr_t`` takes a Python int (bool included) and nothing else: not NumPy's integers, which
    # other C integer types take through __index__ (nccl.pyx's ``intptr_t sendbuf``; the conformance suite's
    # test_intptr_rules shows TypeError "an integer is required" for numpy.int64).
    if not isinstance(value, int):
        raise TypeError("an integer is required")
    v = value
    if not -(2**63) <= v < 2**63:
        raise OverflowError("Python int too large to convert to C ssize_t")
    return v


def _cint(value: Any) -> int:
    v = _index(value)
    if not -(2**31) <= v <= INT_MAX:
        raise OverflowError("value too large to convert to int")
    return v


def _count(value: Any, call: str) -> int:
    ctype = "int" if call in INT_COUNT_CALLS else "size_t"
    v = _index(value)
    if v < 0:
        raise OverflowError(f"can't convert negative value to {ctype}")
    limit = INT_MAX if ctype == "int" else SIZE_MAX
    if v > limit:
        raise OverflowError(f"value too large to convert to {ctype}")
    if MAX_COUNT is not None and v > MAX_COUNT:
        raise OverflowError(
            f"value too large to convert to {ctype} (stand-in: {call} count {v} is above the "
            f"declared limit MAX_COUNT={MAX_COUNT}; the caller must split it)"
        )
    return v


def _dtype(datatype: int) -> np.dtype:
    if datatype == NCCL_BFLOAT16 and VERSION < 21000:
        raise NcclError(INVALID_ARGUMENT, "ncclBfloat16 needs NCCL 2.10")
    if datatype in (_FLOAT8_E4M3, _FLOAT8_E5M2) and VERSION < FLOAT8_VERSION:
        raise NcclError(INVALID_ARGUMENT, "ncclFloat8e4m3 and ncclFloat8e5m2 need NCCL 2.24")
    try:
        return DTYPES[datatype]
    except KeyError:
        raise NcclError(INVALID_ARGUMENT, f"unknown datatype {datatype}") from None


def _check_op(op: int) -> None:
    if op not in UFUNCS:
        raise NcclError(INVALID_ARGUMENT, f"unknown op {op}")
    if op == NCCL_AVG and VERSION < 21000:
        raise NcclError(INVALID_ARGUMENT, "ncclAvg needs NCCL 2.10")


def _reduce(stack: np.ndarray, op: int) -> np.ndarray:
    out = UFUNCS[op].reduce(stack, axis=0)
    if op == NCCL_AVG:
        n = out.dtype.type(len(stack))
        out = out // n if out.dtype.kind in "iu" else out / n
    return out


def _as_id(commId: Any) -> bytes:  # noqa: N803 - the binding's name
    if ID_FORM == "bytes" and not isinstance(commId, bytes):
        raise TypeError(f"Argument 'commId' has incorrect type (expected bytes, got {type(commId).__name__})")
    if ID_FORM == "tuple":
        if not isinstance(commId, tuple):
            raise TypeError(f"Argument 'commId' has incorrect type (expected tuple, got {type(commId).__name__})")
        if any(not -128 <= v <= 127 for v in commId):
            raise OverflowError("value too large to convert to char")
        commId = bytes(v & 0xFF for v in commId)
    if len(commId) != NCCL_UNIQUE_ID_BYTES or not commId.startswith(b"STANDIN"):
        raise NcclError(INVALID_ARGUMENT, "not a unique id from get_unique_id()")
    return commId


def _buffer(ptr: int, count: int, dtype: np.dtype) -> np.ndarray:
    """The NumPy view of ``count`` elements of ``dtype`` at address ``ptr`` (kept valid by the queued call)."""
    if count == 0:
        return np.empty(0, dtype)
    raw = (ctypes.c_uint8 * (count * dtype.itemsize)).from_address(ptr)
    return np.frombuffer(raw, np.uint8).view(dtype)


# --------------------------------------------------------------------------- calls


class _Call:
    """One checked NCCL call, waiting to run on its stream."""

    __slots__ = ("comm", "name", "signature", "stream", "run", "reads", "writes", "p2p")

    def __init__(
        self,
        comm: "MPIStandInNcclCommunicator",
        name: str,
        signature: tuple,
        stream: Any,
        run: Callable[[], Any],
        reads: list,
        writes: list,
        p2p: bool = False,
    ) -> None:
        self.comm, self.name, self.signature, self.stream = comm, name, signature, stream
        self.run, self.reads, self.writes, self.p2p = run, reads, writes, p2p


def _launch(calls: List[_Call]) -> None:
    """Queue ``calls`` (one call, or a group) as one operation on their stream."""
    streams = {c.stream for c in calls}
    if len(streams) > 1:
        raise NotImplementedError("stand-in: a group of NCCL calls on several streams is not modelled")
    stream = calls[0].stream
    comms = {c.comm for c in calls}
    what = f"NCCL {calls[0].name}" if len(calls) == 1 else f"NCCL group of {len(calls)} calls"
    op = GPU.enqueue(
        what,
        lambda: _execute(calls),
        reads=[r for c in calls for r in c.reads],
        writes=[w for c in calls for w in c.writes],
        stream=stream,
        nccl=comms,
    )
    for comm in comms:
        comm._queued = [o for o in comm._queued if o.stream.done_ops <= o.index] + [op]
    if GPU.running:
        return
    if GPU.mode == "eager":
        GPU.run(stream, len(stream.ops))
    elif GPU.mode == "random" and len(comms) == 1:
        # Run this launch early on every rank or on none: the decision comes from the communicator's own
        # generator (the same on every member), and only when the NCCL work it would run belongs to this
        # communicator alone (queued in the same order on every member).
        if next(iter(comms))._rng.random() < 0.5 and all(
            o.nccl == comms for o in GPU.nccl_pending(stream, len(stream.ops))
        ):
            GPU.run(stream, len(stream.ops))


def _execute(calls: List[_Call]) -> Any:
    comms = {c.comm for c in calls}
    if any(c._stalled and not c._aborted for c in comms):
        return BLOCKED
    if any(c._aborted or c._mpi is None for c in comms):
        return None  # an aborted communicator's kernels exit without moving data
    for c in calls:
        if not c.p2p:
            c.comm._same(c.signature)
    requests = [c.run() for c in calls if c.p2p]
    for c in calls:
        if not c.p2p:
            c.run()
    _wait(requests, "the peers' matching send/recv")
    return None


def _wait(requests: list, what: str) -> None:
    deadline = time.monotonic() + HANG_SECONDS
    while not MPI.Request.Testall(requests):
        if time.monotonic() > deadline:
            raise StandInHang(
                f"rank {MPI.COMM_WORLD.Get_rank()} waited {HANG_SECONDS:g} s for {what}: the other "
                "ranks never ran their matching NCCL call (a real GPU would hang here)"
            )
        time.sleep(0.0001)


class MPIStandInNcclCommunicator:
    """``NcclCommunicator(ndev, commId, rank)`` over MPI on stand-in device memory (see the module doc).

    Attributes
    ----------
    calls : list of tuple
        ``(name, count, datatype, op, root_or_peer, stream)`` for every call, as made.
    """

    created = 0
    destroyed = 0

    def __init__(self, ndev: int, commId: Any, rank: int, config: Optional[NcclConfig] = None) -> None:  # noqa: N803
        # The binding's signature: NcclCommunicator(int ndev, bytes commId, int rank, NcclConfig config=None)
        # (nccl.pyx, NcclCommunicator.__init__); Cython refuses another type for ``config``.
        if config is not None and not isinstance(config, NcclConfig):
            raise TypeError(
                f"Argument 'config' has incorrect type (expected cupy_backends.cuda.libs.nccl.NcclConfig, "
                f"got {type(config).__name__})"
            )
        ndev, rank = _cint(ndev), _cint(rank)
        raw = _as_id(commId)
        if not 0 <= rank < ndev:
            raise NcclError(INVALID_ARGUMENT, f"rank {rank} of {ndev}")
        root = int.from_bytes(raw[7:11], "little")
        tag = _TAG + int.from_bytes(raw[11:15], "little") % 4096
        world = MPI.COMM_WORLD
        if world.Get_rank() == root:
            members: List[Optional[int]] = [None] * ndev
            members[rank] = root
            for _ in range(ndev - 1):
                status = MPI.Status()
                peer_rank = world.recv(source=MPI.ANY_SOURCE, tag=tag, status=status)
                members[peer_rank] = status.Get_source()
            for member in members:
                if member != root:
                    world.send(members, dest=member, tag=tag)
        else:
            world.send(rank, dest=root, tag=tag)
            members = world.recv(source=root, tag=tag)
        group = world.Get_group().Incl(members)
        self._mpi = world.Create_group(group, tag)
        group.Free()
        self._rank, self._size = rank, ndev
        self._device = GPU.device
        self._error: Optional[tuple] = None
        self._stalled = self._aborted = False
        self._queued: list = []
        self._rng = random.Random(f"{GPU.seed}:nccl:{raw.hex()}")
        self.calls: List[tuple] = []
        bus = RUNTIME.bus_id(self._device) if RUNTIME is not None else f"device {self._device}"
        where = self._mpi.allgather((MPI.Get_processor_name(), bus))
        shared = VERSION >= 23000 and os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE") == "1"  # NCCL 2.30's mode
        for other, seen in enumerate(where):
            first = where.index(seen)
            if first != other and not shared:
                self._mpi.Free()
                self._mpi = None
                raise NcclError(
                    INVALID_USAGE,
                    f"Duplicate GPU detected: rank {first} and rank {other} both on CUDA device with busId {seen[1]}",
                )
        MPIStandInNcclCommunicator.created += 1

    # ---- bookkeeping
    def rank_id(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def device_id(self) -> int:
        return self._device

    def check_async_error(self) -> None:
        if self._error is not None:
            raise NcclError(*self._error)

    def inject_async_error(self, detail: str = "a peer disconnected (stand-in)", status: int = REMOTE_ERROR) -> None:
        """Test knob: from now on ``check_async_error`` raises ``NcclError(status)``, and queued calls stall
        until ``abort``."""
        self._error = (status, detail)
        self._stalled = True

    def stall(self) -> None:
        """Test knob: queued and later calls never complete (a peer is gone), until ``abort``."""
        self._stalled = True

    def destroy(self) -> None:
        """Finish queued calls (as ``ncclCommDestroy`` does), then free the communicator."""
        self._close(finish=True)

    def abort(self) -> None:
        """Queued calls exit without moving data (``ncclCommAbort``); the communicator is gone."""
        self._close(finish=False)

    def _close(self, finish: bool) -> None:
        if self._mpi is None:
            return
        if finish and not self._stalled:
            for op in self._queued:
                GPU.run(op.stream, op.index + 1)
        self._aborted = True
        self._queued = []
        if not MPI.Is_finalized():
            self._mpi.Free()
        self._mpi = None
        MPIStandInNcclCommunicator.destroyed += 1

    # ---- checks made at the call
    def _usable(self) -> None:
        if self._mpi is None:
            raise NcclError(INVALID_ARGUMENT, "the communicator was destroyed or aborted")

    def _begin(self, name: str, count: Any, datatype: Any, stream: Any, op: Any = None, root: Any = None) -> tuple:
        """Convert the arguments as the binding's C signature does, log the call, check the communicator,
        datatype and op; ``(count, datatype, op, root, dtype, stream object)``."""
        count, datatype = _count(count, name), _cint(datatype)
        op = None if op is None else _cint(op)
        root = None if root is None else _cint(root)
        stream = _intptr(stream)
        self.calls.append((name, count, datatype, op, root, stream))
        s = self._stream_of(name, stream)
        self._usable()
        dtype = _dtype(datatype)
        if op is not None:
            _check_op(op)
        return count, datatype, op, root, dtype, s

    def _stream_of(self, name: str, stream: int) -> Any:
        try:
            return _stream(stream)
        except RuntimeError as exc:
            raise NcclError(UNHANDLED_CUDA_ERROR, f"{name}: {exc}") from None

    def _device_buffer(self, name: str, what: str, ptr: int, count: int, dtype: np.dtype) -> Any:
        """``(allocation, lo, hi)`` of a device buffer argument, checked as NCCL's argument check would."""
        nbytes = count * dtype.itemsize
        if not nbytes:
            return None
        if not ptr:
            raise NcclError(INVALID_ARGUMENT, f"{name}: {what} is NULL with count {count}")
        alloc = GPU.find(ptr, nbytes)
        if alloc is None:
            freed = GPU.find_freed(ptr)
            if freed is not None:
                raise NcclError(
                    INVALID_ARGUMENT, f"{name}: {what} {ptr:#x} is in the freed {freed.describe()} ({freed.freed_at})"
                )
            start = GPU.find(ptr, 1)
            detail = "runs past the end of its allocation" if start is not None else "is not device memory"
            raise NcclError(INVALID_ARGUMENT, f"{name}: {what} [{ptr:#x}, +{nbytes} bytes) {detail}")
        if alloc.pinned:
            raise NcclError(INVALID_ARGUMENT, f"{name}: {what} {ptr:#x} is host memory, not device memory")
        if alloc.device != self._device:
            raise NcclError(
                INVALID_ARGUMENT, f"{name}: {what} is on GPU {alloc.device}; this communicator's GPU is {self._device}"
            )
        return alloc, ptr, ptr + nbytes

    @staticmethod
    def _layout(name: str, send: Any, recv: Any, in_place_send: int, rule: str) -> None:
        """Overlapping buffers are allowed only in NCCL's in-place layout (``send`` starting at ``in_place_send``)."""
        if send is None or recv is None or send[0] is not recv[0]:
            return
        if send[1] < recv[2] and recv[1] < send[2] and send[1] != in_place_send:
            raise NcclError(
                INVALID_ARGUMENT,
                f"{name}: sendbuff and recvbuff overlap but are not in "
                f"place ({rule}); sendbuff is at recvbuff{send[1] - recv[1]:+d} bytes",
            )

    def _call(
        self,
        name: str,
        signature: tuple,
        stream: Any,
        run: Callable[[], Any],
        reads: list,
        writes: list,
        p2p: bool = False,
    ) -> None:
        call = _Call(self, name, signature, stream, run, [r for r in reads if r], [w for w in writes if w], p2p)
        if _depth:
            _group.append(call)
        else:
            _launch([call])

    def _same(self, signature: tuple) -> None:
        """Every rank runs this collective with the same arguments (else raise on all)."""
        mine = np.array(
            [_CALL_CODES[signature[0]], *[-1 if v is None else v for v in signature[1:]]] + [-2] * (5 - len(signature)),
            np.int64,
        )
        seen = np.empty((self._size, mine.size), np.int64)
        _wait([self._mpi.Iallgather(mine, seen)], f"the other ranks' {signature[0]}")
        for rank in range(self._size):
            if not np.array_equal(seen[rank], seen[0]):
                names = {v: k for k, v in _CALL_CODES.items()}
                show = [(names[int(s[0])], *[int(v) for v in s[1:]]) for s in (seen[0], seen[rank])]
                raise StandInMismatch(f"NCCL call mismatch: rank 0 issued {show[0]} but rank {rank} issued {show[1]}")

    # ---- collectives
    def allGather(self, sendbuf: int, recvbuf: int, count: int, datatype: int, stream: int) -> None:  # noqa: N802
        sendbuf, recvbuf = _intptr(sendbuf), _intptr(recvbuf)
        count, datatype, _, _, dtype, s = self._begin("allGather", count, datatype, stream)
        send = self._device_buffer("allGather", "sendbuff", sendbuf, count, dtype)
        recv = self._device_buffer("allGather", "recvbuff", recvbuf, count * self._size, dtype)
        self._layout(
            "allGather",
            send,
            recv,
            recvbuf + self._rank * count * dtype.itemsize,
            "allGather: sendbuff == recvbuff + rank*count",
        )

        def run() -> None:
            mine = _buffer(sendbuf, count, dtype).copy()
            self._mpi.Allgather(mine.view(np.uint8), _buffer(recvbuf, count * self._size, dtype).view(np.uint8))

        self._call("allGather", ("allGather", count, datatype), s, run, [send], [recv])

    def allReduce(
        self,
        sendbuf: int,
        recvbuf: int,
        count: int,
        datatype: int,
        op: int,  # noqa: N802
        stream: int,
    ) -> None:
        sendbuf, recvbuf = _intptr(sendbuf), _intptr(recvbuf)
        count, datatype, op, _, dtype, s = self._begin("allReduce", count, datatype, stream, op=op)
        send = self._device_buffer("allReduce", "sendbuff", sendbuf, count, dtype)
        recv = self._device_buffer("allReduce", "recvbuff", recvbuf, count, dtype)
        self._layout("allReduce", send, recv, recvbuf, "allReduce: sendbuff == recvbuff")

        def run() -> None:
            stack = self._gather_all(_buffer(sendbuf, count, dtype))
            _buffer(recvbuf, count, dtype)[...] = _reduce(stack, op)

        self._call("allReduce", ("allReduce", count, datatype, op), s, run, [send], [recv])

    def reduceScatter(
        self,
        sendbuf: int,
        recvbuf: int,
        recvcount: int,
        datatype: int,
        op: int,  # noqa: N802
        stream: int,
    ) -> None:
        sendbuf, recvbuf = _intptr(sendbuf), _intptr(recvbuf)
        recvcount, datatype, op, _, dtype, s = self._begin("reduceScatter", recvcount, datatype, stream, op=op)
        send = self._device_buffer("reduceScatter", "sendbuff", sendbuf, recvcount * self._size, dtype)
        recv = self._device_buffer("reduceScatter", "recvbuff", recvbuf, recvcount, dtype)
        # In place: recvbuff == sendbuff + rank*recvcount, i.e. sendbuff == recvbuff - rank*recvcount.
        self._layout(
            "reduceScatter",
            send,
            recv,
            recvbuf - self._rank * recvcount * dtype.itemsize,
            "reduceScatter: recvbuff == sendbuff + rank*recvcount",
        )

        def run() -> None:
            stack = self._gather_all(_buffer(sendbuf, recvcount * self._size, dtype))
            block = stack[:, self._rank * recvcount : (self._rank + 1) * recvcount]
            _buffer(recvbuf, recvcount, dtype)[...] = _reduce(block, op)

        self._call("reduceScatter", ("reduceScatter", recvcount, datatype, op), s, run, [send], [recv])

    def broadcast(self, sendbuff: int, recvbuff: int, count: int, datatype: int, root: int, stream: int) -> None:
        self._broadcast("broadcast", sendbuff, recvbuff, count, datatype, root, stream)

    def bcast(self, buff: int, count: int, datatype: int, root: int, stream: int) -> None:
        self._broadcast("bcast", buff, buff, count, datatype, root, stream)

    def _broadcast(
        self, name: str, sendbuff: Any, recvbuff: Any, count: Any, datatype: Any, root: Any, stream: Any
    ) -> None:
        sendbuff, recvbuff = _intptr(sendbuff), _intptr(recvbuff)
        count, datatype, _, root, dtype, s = self._begin(name, count, datatype, stream, root=root)
        if not 0 <= root < self._size:
            raise NcclError(INVALID_ARGUMENT, f"{name}: root {root} of {self._size} ranks")
        mine = self._rank == root
        send = self._device_buffer(name, "sendbuff", sendbuff, count, dtype) if mine else None
        recv = self._device_buffer(name, "recvbuff", recvbuff, count, dtype)
        self._layout(name, send, recv, recvbuff, f"{name}: sendbuff == recvbuff on the root")

        def run() -> None:
            buf = _buffer(recvbuff, count, dtype)
            if mine and sendbuff != recvbuff:
                buf[...] = _buffer(sendbuff, count, dtype).copy()
            self._mpi.Bcast(buf.view(np.uint8), root=root)

        self._call(name, ("broadcast", count, datatype, None, root), s, run, [send], [recv])

    def reduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int, root: int, stream: int) -> None:
        sendbuf, recvbuf = _intptr(sendbuf), _intptr(recvbuf)
        count, datatype, op, root, dtype, s = self._begin("reduce", count, datatype, stream, op=op, root=root)
        if not 0 <= root < self._size:
            raise NcclError(INVALID_ARGUMENT, f"reduce: root {root} of {self._size} ranks")
        mine = self._rank == root
        send = self._device_buffer("reduce", "sendbuff", sendbuf, count, dtype)
        recv = self._device_buffer("reduce", "recvbuff", recvbuf, count, dtype) if mine else None
        self._layout("reduce", send, recv, recvbuf, "reduce: sendbuff == recvbuff on the root")

        def run() -> None:
            data = _buffer(sendbuf, count, dtype).copy()
            stack = np.empty((self._size, count), dtype) if mine else None
            self._mpi.Gather(data.view(np.uint8), None if stack is None else stack.view(np.uint8), root=root)
            if stack is not None:
                _buffer(recvbuf, count, dtype)[...] = _reduce(stack, op)

        self._call("reduce", ("reduce", count, datatype, op, root), s, run, [send], [recv])

    def _gather_all(self, mine: np.ndarray) -> np.ndarray:
        stack = np.empty((self._size, mine.size), mine.dtype)
        self._mpi.Allgather(mine.copy().view(np.uint8), stack.view(np.uint8))
        return stack

    # ---- point-to-point
    def _check_peer(self, name: str, peer: int) -> None:
        """A peer outside the communicator: ``ncclInvalidArgument``, as NCCL's argument check (ArgsCheck in
        src/enqueue.cc) answers for a send/recv peer, which it checks as a root."""
        if not 0 <= peer < self._size:
            raise NcclError(INVALID_ARGUMENT, f"{name}: peer {peer} of {self._size} ranks")

    def send(self, sendbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        sendbuf = _intptr(sendbuf)
        count, datatype, _, peer, dtype, s = self._begin("send", count, datatype, stream, root=peer)
        self._check_peer("send", peer)
        buf = self._device_buffer("send", "sendbuff", sendbuf, count, dtype)
        self._call(
            "send",
            ("send", count, datatype, None, peer),
            s,
            lambda: self._mpi.Isend(_buffer(sendbuf, count, dtype).view(np.uint8), dest=peer, tag=1),
            [buf],
            [],
            p2p=True,
        )

    def recv(self, recvbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        recvbuf = _intptr(recvbuf)
        count, datatype, _, peer, dtype, s = self._begin("recv", count, datatype, stream, root=peer)
        self._check_peer("recv", peer)
        buf = self._device_buffer("recv", "recvbuff", recvbuf, count, dtype)
        self._call(
            "recv",
            ("recv", count, datatype, None, peer),
            s,
            lambda: self._mpi.Irecv(_buffer(recvbuf, count, dtype).view(np.uint8), source=peer, tag=1),
            [],
            [buf],
            p2p=True,
        )


#: The binding's class name, so this module can stand in for ``cupy.cuda.nccl``.
NcclCommunicator = MPIStandInNcclCommunicator
#: CuPy's flag for a binding that loaded its library.
available = True


# --------------------------------------------------------------------------- the runtime


RUNTIME: Optional["StandInRuntime"] = None


class StandInRuntime:
    """Stand-in for the GPU transports' CuPy runtime: the CuPy stand-in, fake GPUs, tracked pinned memory.

    Making one resets the stand-in device (``standin_cupy.GPU``): only the
    null stream, nothing queued, GPU 0 current.

    Parameters
    ----------
    devices : int
        GPUs "visible" to every rank; 0 makes ``device_count`` raise, as
        CUDA does without a GPU.
    bus_ids : callable, optional
        ``device -> PCI bus id``; default one bus per device index.
    nccl : module or None
        The NCCL binding (this module by default); ``None`` means "missing".
    mode, seed : optional
        The stand-in device's execution mode and seed (default: from
        ``HPCCOLL_STANDIN_MODE`` and ``HPCCOLL_STANDIN_SEED``).
    """

    def __init__(
        self,
        devices: int = 8,
        bus_ids: Optional[Callable[[int], str]] = None,
        nccl: Any = "standin",
        mode: Optional[str] = None,
        seed: Optional[int] = None,
    ) -> None:
        global RUNTIME
        GPU.reset(mode, seed, MPI.COMM_WORLD.Get_rank())
        self.xp = standin_cupy
        self.nccl = sys.modules[__name__] if nccl == "standin" else nccl
        self.nccl_missing = None if self.nccl is not None else "stand-in: NCCL switched off"
        self.devices = devices
        self.bus_ids = bus_ids or (lambda d: f"0000:{d + 1:02X}:00.0")
        self.syncs = 0
        self.pinned_allocations: List[int] = []
        RUNTIME = self

    @staticmethod
    def ptr(a: Any) -> int:
        return a.data.ptr

    @staticmethod
    def stream() -> int:
        return GPU.current.ptr

    def sync_stream(self) -> None:
        self.syncs += 1
        GPU.current.synchronize()

    def device_count(self) -> int:
        if self.devices < 1:
            raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected (stand-in)")
        return self.devices

    @property
    def current(self) -> int:
        return GPU.device

    @current.setter
    def current(self, device: int) -> None:
        GPU.device = device

    def current_device(self) -> int:
        return GPU.device

    def use_device(self, device: int) -> None:
        GPU.device = device

    def bus_id(self, device: int) -> str:
        return self.bus_ids(device)

    @staticmethod
    def device_of(a: Any) -> int:
        return a.data.device_id

    def alloc_pinned(self, nbytes: int) -> np.ndarray:
        self.pinned_allocations.append(nbytes)
        return GPU.pinned(nbytes)

    @staticmethod
    def to_host(src: Any, dst: np.ndarray) -> None:
        """Queue a copy of device ``src`` into host ``dst`` on the current stream (pageable ``dst``: at once)."""
        _host_copy(src, dst, to_host=True)

    @staticmethod
    def to_device(src: np.ndarray, dst: Any) -> None:
        """Queue a copy of host ``src`` into device ``dst`` on the current stream (pageable ``src``: staged now)."""
        _host_copy(dst, src, to_host=False)

    @staticmethod
    def record() -> Any:
        return GPU.current.record()

    @staticmethod
    def _current() -> Any:
        return GPU.current

    #: The real runtime's method, on the stand-in's streams.
    on_this_stream = CupyRuntime.on_this_stream


def _host_copy(device: Any, host: np.ndarray, to_host: bool) -> None:
    """``cudaMemcpyAsync`` between a contiguous device array and a host array, on the current stream."""
    if not isinstance(device, standin_cupy.ndarray):
        raise TypeError(f"stand-in: expected a device array; got {type(device).__name__}")
    if not device.flags.c_contiguous or device.nbytes != host.nbytes:
        raise ValueError("stand-in: a host copy needs a C-contiguous device array of the host array's size")
    if not device.nbytes:
        return
    dev = device.reshape(-1).view(np.uint8)._v
    alloc, lo, hi = standin_cupy._extent(host)
    stream = GPU.current
    if alloc is None:  # pageable host memory: CUDA stages it at the call
        if to_host:  # ... and a device-to-host copy into it waits for the stream first
            stream.synchronize()
            host.reshape(-1).view(np.uint8)[...] = dev
        else:
            data = host.reshape(-1).view(np.uint8).copy()
            GPU.enqueue("host-to-device copy", lambda: np.copyto(dev, data), writes=[device])
        return
    pinned = alloc.raw[lo - alloc.ptr : hi - alloc.ptr]
    if to_host:
        GPU.enqueue("device-to-host copy", lambda: np.copyto(pinned, dev), reads=[device], writes=[(alloc, lo, hi)])
    else:
        GPU.enqueue("host-to-device copy", lambda: np.copyto(dev, pinned), reads=[(alloc, lo, hi)], writes=[device])
