"""A NumPy-over-MPI STAND-IN for ``cupy.cuda.nccl`` -- a test fixture, never a transport.

CPU-only CI cannot run CUDA, yet the NCCL transport's own logic (uneven
shards, complex-as-reals, dtype mapping, chunking, the id bootstrap, the
probe) must run there. This module implements the pointer-level API that
:mod:`hpccoll.transports.nccl` calls -- ``NcclCommunicator`` with
``allGather``, ``reduceScatter``, ``allReduce``, ``broadcast``, ``bcast``,
``reduce``, ``send``, ``recv``; module-level ``groupStart``/``groupEnd``,
``get_unique_id``, ``get_version`` and the ``NCCL_*`` constants -- over MPI,
with "device pointers" that are addresses of NumPy buffers.

Like NCCL it

* rendezvouses through the unique id alone (the id names its creator's
  ``COMM_WORLD`` rank, as NCCL's names the root's socket address);
* knows only NCCL's ten datatypes and four reduction ops, and rejects others;
* checks that every rank called the same collective with the same count,
  datatype, op and root (NCCL would hang or corrupt; this raises on all ranks);
* queues calls between ``groupStart`` and ``groupEnd`` and runs them at the
  outermost ``groupEnd``: point-to-point calls as ``Isend``/``Irecv`` posted
  first, collectives in issue order, then ``Waitall`` (deadlock-free).

:class:`StandInRuntime` is the matching stand-in for the transports' CuPy
runtime (:class:`hpccoll.transports._cuda.CupyRuntime`): NumPy as the array
module, fake devices with configurable PCI bus ids, counting stream syncs.
Install it with ``hpccoll.transports._cuda.use_runtime``.
"""

from __future__ import annotations

import ctypes
import itertools
from typing import Any, Callable, List, Optional, Tuple

import numpy as np
from mpi4py import MPI

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
UFUNCS = {NCCL_SUM: np.add, NCCL_PROD: np.multiply, NCCL_MAX: np.maximum, NCCL_MIN: np.minimum}

# ---- knobs the tests turn (with monkeypatch, on every rank) ----
#: Reported by get_version(); below 21000 (NCCL 2.10) there is no bfloat16.
VERSION = 22304
#: What get_unique_id() returns and NcclCommunicator accepts: "bytes" (CuPy 14) or "tuple" (older).
ID_FORM = "bytes"
#: When true, get_unique_id() raises, as it does when NCCL cannot open its bootstrap socket.
FAIL_UNIQUE_ID = False

_TAG = 0x5A5A  # rendezvous messages on COMM_WORLD: tag base (tests never use point-to-point there)
_serial = itertools.count()
_depth = 0
_queue: List[Tuple["MPIStandInNcclCommunicator", str, Callable[[], Any]]] = []


class NcclError(RuntimeError):
    """What the stand-in raises where NCCL would return an error code."""


class StandInMismatch(AssertionError):
    """Ranks issued different NCCL calls: a bug in the code under test."""


def get_version() -> int:
    return VERSION


def get_build_version() -> int:
    return VERSION


def get_unique_id() -> Any:
    if FAIL_UNIQUE_ID:
        raise NcclError("NCCL_ERROR_SYSTEM_ERROR: stand-in asked to fail ncclGetUniqueId")
    head = b"STANDIN" + MPI.COMM_WORLD.Get_rank().to_bytes(4, "little") + next(_serial).to_bytes(4, "little")
    raw = head + bytes(NCCL_UNIQUE_ID_BYTES - len(head))
    if ID_FORM == "bytes":
        return raw
    return tuple(b - 256 if b > 127 else b for b in raw)  # signed chars, as on x86


def groupStart() -> None:
    global _depth
    _depth += 1


def groupEnd() -> None:
    global _depth
    if _depth == 0:
        raise NcclError("NCCL_ERROR_INVALID_USAGE: groupEnd without groupStart")
    _depth -= 1
    if _depth == 0:
        calls, _queue[:] = list(_queue), []
        _run(calls)


def _run(calls: List[Tuple["MPIStandInNcclCommunicator", str, Callable[[], Any]]]) -> None:
    requests = [fn() for _, kind, fn in calls if kind == "p2p"]
    for _, kind, fn in calls:
        if kind == "coll":
            fn()
    MPI.Request.Waitall(requests)


def _buffer(ptr: int, count: int, datatype: int) -> np.ndarray:
    """The NumPy view of ``count`` elements of NCCL ``datatype`` at address ``ptr``."""
    dtype = _dtype(datatype)
    if count < 0:
        raise NcclError(f"NCCL_ERROR_INVALID_ARGUMENT: negative count {count}")
    if count == 0:
        return np.empty(0, dtype)
    if not ptr:
        raise NcclError("NCCL_ERROR_INVALID_ARGUMENT: NULL buffer with a non-zero count")
    raw = (ctypes.c_uint8 * (count * dtype.itemsize)).from_address(ptr)
    return np.frombuffer(raw, np.uint8).view(dtype)


def _dtype(datatype: int) -> np.dtype:
    if datatype == NCCL_BFLOAT16 and VERSION < 21000:
        raise NcclError("NCCL_ERROR_INVALID_ARGUMENT: ncclBfloat16 needs NCCL 2.10")
    try:
        return DTYPES[datatype]
    except KeyError:
        raise NcclError(f"NCCL_ERROR_INVALID_ARGUMENT: unknown datatype {datatype}") from None


def _reduce(stack: np.ndarray, op: int) -> np.ndarray:
    try:
        ufunc = UFUNCS[op]
    except KeyError:
        raise NcclError(f"NCCL_ERROR_INVALID_ARGUMENT: unknown op {op}") from None
    return ufunc.reduce(stack, axis=0)


def _as_id(commId: Any) -> bytes:
    if ID_FORM == "bytes" and not isinstance(commId, bytes):
        raise TypeError(f"Argument 'commId' has incorrect type (expected bytes, got {type(commId).__name__})")
    if ID_FORM == "tuple":
        if not isinstance(commId, tuple):
            raise TypeError(f"Argument 'commId' has incorrect type (expected tuple, got {type(commId).__name__})")
        if any(not -128 <= v <= 127 for v in commId):
            raise OverflowError("value too large to convert to char")
        commId = bytes(v & 0xFF for v in commId)
    if len(commId) != NCCL_UNIQUE_ID_BYTES or not commId.startswith(b"STANDIN"):
        raise NcclError("NCCL_ERROR_INVALID_ARGUMENT: not a unique id from get_unique_id()")
    return commId


class MPIStandInNcclCommunicator:
    """``NcclCommunicator(ndev, commId, rank)`` over MPI with NumPy buffers (see the module doc).

    Attributes
    ----------
    calls : list of tuple
        ``(name, count, datatype, op, root_or_peer, stream)`` for every call.
    """

    created = 0
    destroyed = 0

    def __init__(self, ndev: int, commId: Any, rank: int) -> None:
        raw = _as_id(commId)
        if not 0 <= rank < ndev:
            raise NcclError(f"NCCL_ERROR_INVALID_RANK: rank {rank} of {ndev}")
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
        self.calls: List[tuple] = []
        MPIStandInNcclCommunicator.created += 1

    # ---- bookkeeping
    def rank_id(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def device_id(self) -> int:
        return 0

    def check_async_error(self) -> None:
        return None

    def destroy(self) -> None:
        if self._mpi is not None:
            if not MPI.Is_finalized():
                self._mpi.Free()
            self._mpi = None
            MPIStandInNcclCommunicator.destroyed += 1

    abort = destroy

    # ---- plumbing
    def _issue(self, kind: str, fn: Callable[[], Any]) -> None:
        if self._mpi is None:
            raise NcclError("NCCL_ERROR_INVALID_ARGUMENT: destroyed communicator")
        if _depth:
            _queue.append((self, kind, fn))
        else:
            _run([(self, kind, fn)])

    def _log(self, name: str, count: int, datatype: int, op: Any, root: Any, stream: Any) -> None:
        if not isinstance(stream, int):
            raise NcclError(f"stream: expected a stream handle (int); got {type(stream).__name__}")
        self.calls.append((name, count, datatype, op, root, stream))

    def _same(self, signature: tuple) -> None:
        """Every rank issued this collective with the same arguments (else raise on all)."""
        seen = self._mpi.allgather(signature)
        for rank, other in enumerate(seen):
            if other != seen[0]:
                raise StandInMismatch(f"NCCL call mismatch: rank 0 issued {seen[0]} but rank {rank} issued {other}")

    # ---- collectives
    def allGather(self, sendbuf: int, recvbuf: int, count: int, datatype: int, stream: int) -> None:
        self._log("allGather", count, datatype, None, None, stream)

        def run() -> None:
            self._same(("allGather", count, datatype))
            mine = _buffer(sendbuf, count, datatype).copy()  # NCCL allows in-place; MPI does not
            out = _buffer(recvbuf, count * self._size, datatype)
            self._mpi.Allgather(mine.view(np.uint8), out.view(np.uint8))

        self._issue("coll", run)

    def allReduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int, stream: int) -> None:
        self._log("allReduce", count, datatype, op, None, stream)

        def run() -> None:
            self._same(("allReduce", count, datatype, op))
            stack = self._gather_all(_buffer(sendbuf, count, datatype))
            _buffer(recvbuf, count, datatype)[...] = _reduce(stack, op)

        self._issue("coll", run)

    def reduceScatter(self, sendbuf: int, recvbuf: int, recvcount: int, datatype: int, op: int, stream: int) -> None:
        self._log("reduceScatter", recvcount, datatype, op, None, stream)

        def run() -> None:
            self._same(("reduceScatter", recvcount, datatype, op))
            stack = self._gather_all(_buffer(sendbuf, recvcount * self._size, datatype))
            block = stack[:, self._rank * recvcount : (self._rank + 1) * recvcount]
            _buffer(recvbuf, recvcount, datatype)[...] = _reduce(block, op)

        self._issue("coll", run)

    def broadcast(self, sendbuff: int, recvbuff: int, count: int, datatype: int, root: int, stream: int) -> None:
        self._log("broadcast", count, datatype, None, root, stream)

        def run() -> None:
            self._same(("broadcast", count, datatype, root))
            buf = _buffer(recvbuff, count, datatype)
            if self._rank == root and sendbuff != recvbuff:
                buf[...] = _buffer(sendbuff, count, datatype).copy()
            self._mpi.Bcast(buf.view(np.uint8), root=root)

        self._issue("coll", run)

    def bcast(self, buff: int, count: int, datatype: int, root: int, stream: int) -> None:
        self.broadcast(buff, buff, count, datatype, root, stream)

    def reduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int, root: int, stream: int) -> None:
        self._log("reduce", count, datatype, op, root, stream)

        def run() -> None:
            self._same(("reduce", count, datatype, op, root))
            mine = _buffer(sendbuf, count, datatype).copy()
            stack = np.empty((self._size, count), mine.dtype) if self._rank == root else None
            self._mpi.Gather(mine.view(np.uint8), None if stack is None else stack.view(np.uint8), root=root)
            if stack is not None:
                _buffer(recvbuf, count, datatype)[...] = _reduce(stack, op)

        self._issue("coll", run)

    def _gather_all(self, mine: np.ndarray) -> np.ndarray:
        stack = np.empty((self._size, mine.size), mine.dtype)
        self._mpi.Allgather(mine.copy().view(np.uint8), stack.view(np.uint8))
        return stack

    # ---- point-to-point
    def send(self, sendbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        self._log("send", count, datatype, None, peer, stream)
        buf = _buffer(sendbuf, count, datatype)
        self._issue("p2p", lambda: self._mpi.Isend(buf.view(np.uint8), dest=peer, tag=1))

    def recv(self, recvbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        self._log("recv", count, datatype, None, peer, stream)
        buf = _buffer(recvbuf, count, datatype)
        self._issue("p2p", lambda: self._mpi.Irecv(buf.view(np.uint8), source=peer, tag=1))


#: The binding's class name, so this module can stand in for ``cupy.cuda.nccl``.
NcclCommunicator = MPIStandInNcclCommunicator


class _Event:
    """A CuPy event stand-in: the stand-in's work is done when it is enqueued."""

    done = True

    def synchronize(self) -> None:
        return None


class StandInRuntime:
    """Stand-in for the GPU transports' CuPy runtime: NumPy arrays, fake GPUs.

    Parameters
    ----------
    devices : int
        GPUs "visible" to every rank; 0 makes ``device_count`` raise, as
        CUDA does without a GPU.
    bus_ids : callable, optional
        ``device -> PCI bus id``; default one bus per device index.
    nccl : module or None
        The NCCL binding (this module by default); ``None`` means "missing".
    """

    #: The "current stream" handle the transports must pass to every NCCL call.
    STREAM = 0x5EED

    def __init__(self, devices: int = 8, bus_ids: Optional[Callable[[int], str]] = None, nccl: Any = "standin"):
        import sys

        self.xp = np
        self.nccl = sys.modules[__name__] if nccl == "standin" else nccl
        self.nccl_missing = None if self.nccl is not None else "stand-in: NCCL switched off"
        self.devices = devices
        self.bus_ids = bus_ids or (lambda d: f"0000:{d + 1:02X}:00.0")
        self.current = 0
        self.syncs = 0
        self.pinned_allocations: List[int] = []
        self.array_device: Optional[int] = None  # where arrays "live"; None: the current device

    @staticmethod
    def ptr(a: np.ndarray) -> int:
        return a.ctypes.data

    def stream(self) -> int:
        return self.STREAM

    def sync_stream(self) -> None:
        self.syncs += 1

    def device_count(self) -> int:
        if self.devices < 1:
            raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected (stand-in)")
        return self.devices

    def current_device(self) -> int:
        return self.current

    def use_device(self, device: int) -> None:
        self.current = device

    def bus_id(self, device: int) -> str:
        return self.bus_ids(device)

    def device_of(self, a: Any) -> int:
        return self.current if self.array_device is None else self.array_device

    def alloc_pinned(self, nbytes: int) -> np.ndarray:
        self.pinned_allocations.append(nbytes)
        return np.empty(nbytes, np.uint8)

    @staticmethod
    def to_host(src: np.ndarray, dst: np.ndarray) -> None:
        np.copyto(dst, src)

    @staticmethod
    def to_device(src: np.ndarray, dst: np.ndarray) -> None:
        np.copyto(dst, src)

    @staticmethod
    def record() -> _Event:
        return _Event()
