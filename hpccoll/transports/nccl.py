"""NCCL transport: CuPy arrays through ``cupy.cuda.nccl.NcclCommunicator``, bootstrapped over MPI.

One NCCL communicator per :class:`~hpccoll.Communicator` (a ``split()``
gets its own), made on first GPU use by a collective probe (each rank's GPU,
one verdict on every rank, two ranks on one GPU refused) and a bootstrap
(rank 0's unique id broadcast over MPI): both live in
:mod:`hpccoll.transports._ncclboot`; this module is the transport.

Everything runs on the caller's current CuPy stream, with no host
synchronisation.

Uneven shards: NCCL has no all-gather-v or reduce-scatter-v. Two designs are
implemented, chosen by :attr:`NcclTransport.uneven` (default from
``HPCCOLL_NCCL_UNEVEN``):

``"grouped"``
    one broadcast (all-gather) or reduce (reduce-scatter) per rank's block,
    rooted at the block's owner, all inside one ``groupStart``/``groupEnd``;
``"pad"``
    every block padded to the largest, one ``allGather``/``reduceScatter``,
    then the padding dropped (extra memory and traffic, plus copies);
``"auto"`` (default)
    ``"pad"`` when padding adds at most 1/8 to the bytes moved (nearly even
    shards), else ``"grouped"``. Neither design has been measured on GPUs
    yet; ``benchmarks/bench_gpu.py`` compares them.

Per call, the transport does only what the call needs: the NCCL datatype
comes from a table keyed by the dtype object (never ``dtype.name``, which
costs about a microsecond under NumPy 2), the checks (closed communicator,
NCCL's asynchronous error, the arrays' GPU) cost nanoseconds each, the
stream is asked for once, and messages are split only past
:attr:`NcclTransport.max_count`. Complex numbers travel as twice as many reals
(all-gather, and ``sum``); a complex ``prod`` (not elementwise on the real
parts) is computed by an all-to-all of the blocks (grouped send/recv) and a
local product, so it matches MPI; ``max``/``min`` on complex raise
:class:`~hpccoll.DTypeError`. ``int16``/``uint16`` are widened to 32 bits for
reductions. These choices are :mod:`hpccoll._dtypes`' (``library_reduction``,
``library_move_wire``), made from the transport's ``reduce_dtypes`` (the names
of the NCCL datatypes the binding has); types NCCL lacks (bool, int16, uint16, bfloat16's bits) move as
bytes in an all-gather. ``float16`` reduces natively, ``bfloat16`` too when
the NCCL library is 2.10 or newer.

Rooted primitives: ``bcast`` is ``ncclBroadcast`` (in place) of the moving
view, ``reduce`` is ``ncclReduce`` with every (dtype, op) handled as the
all-reduce handles it (a complex ``prod`` by the same send/recv of whole
inputs to the root and a local product); ``gatherv``/``scatterv`` are grouped
send/recv with the root's own block copied on the device.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, NamedTuple, NoReturn, Optional, Sequence, Tuple

import numpy as np

from .._arrays import split_sizes
from .._dtypes import BASIC_OPS, LibraryReduction, library_move_wire, library_reduce_wire, library_reduction, op_label
from .._errors import (
    ArgumentError,
    CollectiveError,
    DTypeError,
    TransportUnavailable,
    UnsupportedOpError,
)
from .._faults import dump_stacks
from .._request import Pending
from . import _ncclboot
from ._base import Prepared, Transport
from ._cuda import capture_query, get_runtime
from ._mpitypes import displacements
from ._ncclboot import LIVE, UNEVEN_DESIGNS, NcclProbe, bootstrap, check_uneven, destroy, nccl_version

# Kept importable from here for the tests and tools that use them (the bootstrap now lives in _ncclboot).
from ._ncclboot import _close_all as _close_all
from ._ncclboot import _id_forms as _id_forms

__all__ = ["NcclTransport", "NcclProbe", "probe", "UNEVEN_DESIGNS", "INT_MAX"]

#: The largest element count one NCCL call gets by default: C ``int``'s
#: maximum. Older CuPy releases declare ``broadcast``/``bcast`` with C ``int``
#: counts (the other calls take ``size_t``); splitting every call there is
#: conservative, and costs nothing measurable at 2**31 elements a call.
INT_MAX = 2**31 - 1

#: ``"auto"`` pads when padding adds at most this fraction to the bytes moved.
PAD_SLACK = 0.125

#: NCCL 2.10.0 (the first with ``ncclBfloat16``) as ``ncclGetVersion`` reports it.
BF16_VERSION = 21000

# Array dtype name -> the cupy.cuda.nccl constant naming it (looked up by name once per dtype). The names
# the binding has are the transport's ``reduce_dtypes``: how other dtypes are reduced and moved (int16
# widened, complex as reals, bytes) is hpccoll._dtypes' decision (library_reduction, library_move_wire).
_NCCL_TYPES = {
    "int8": "NCCL_INT8",
    "uint8": "NCCL_UINT8",
    "int32": "NCCL_INT32",
    "uint32": "NCCL_UINT32",
    "int64": "NCCL_INT64",
    "uint64": "NCCL_UINT64",
    "float16": "NCCL_FLOAT16",
    "float32": "NCCL_FLOAT32",
    "float64": "NCCL_FLOAT64",
    "bfloat16": "NCCL_BFLOAT16",
}
_NCCL_OPS = {"sum": "NCCL_SUM", "prod": "NCCL_PROD", "max": "NCCL_MAX", "min": "NCCL_MIN"}
# MPI's logical ops, which NCCL lacks, on the truth values (0/1 bytes): AND is the minimum, OR the
# maximum, XOR the parity of the sum (a uint8 sum wraps modulo 256, an even number: parity survives).
_TRUTH_OPS = {"land": "min", "lor": "max", "lxor": "sum"}

#: The GPU hpccoll selected for this process, once it has (the probe prefers it to the node-local choice).
_CHOSEN: Optional[int] = None


def probe(comm: Any) -> NcclProbe:
    """Probe NCCL for ``comm`` (collective the first time; cached on ``comm``).

    Parameters
    ----------
    comm : Communicator
        The communicator to probe for.

    Returns
    -------
    NcclProbe
        The verdict, the same on every rank (see :mod:`hpccoll.transports._ncclboot`).
    """
    return _ncclboot.probe(comm, _CHOSEN)


def _chunks(count: int, limit: int) -> Iterator[Tuple[int, int]]:
    """``(offset, length)`` pieces of ``count`` elements, each at most ``limit`` long."""
    for offset in range(0, count, limit):
        yield offset, min(limit, count - offset)


# --------------------------------------------------------------------------- transport


class _Wire(NamedTuple):
    """How arrays of one dtype go to NCCL: its datatype, NCCL elements per array element, the view."""

    type: Any  # the cupy.cuda.nccl datatype constant
    scale: int  # NCCL elements per array element (2 for complex as reals; itemsize for bytes)
    view: np.dtype  # the dtype the array is seen as for NCCL (itself, its real part, or uint8)


class NcclTransport(Transport):
    """CuPy arrays over NCCL, one ``NcclCommunicator`` per hpccoll Communicator.

    Attributes
    ----------
    device : int
        The GPU this rank's NCCL communicator runs on.
    device_choice : str
        How :attr:`device` was chosen.
    uneven : str
        The uneven-shard design: ``"auto"``, ``"grouped"`` or ``"pad"``
        (see the module docstring). Settable; every rank must agree.
    max_count : int
        The largest element count passed to one NCCL call (default
        :data:`INT_MAX`); larger messages are split. Every rank must agree.
    native_reduce : frozenset of str
        ``{"float16"}``, plus ``"bfloat16"`` with NCCL >= 2.10.
    reduce_dtypes : frozenset of str
        The dtype names NCCL reduces natively: those of :data:`_NCCL_TYPES` the binding has
        (``bfloat16`` only with NCCL >= 2.10).
    """

    name = "nccl"
    array_kind = "cupy"
    priority = 10
    #: NCCL's own four, and MPI's logical ops done exactly on 0/1 bytes (``_TRUTH_OPS``); NCCL has no
    #: bitwise ops, which the collectives therefore refuse on integers (bool's are logical ones).
    reduce_ops = BASIC_OPS | frozenset(_TRUTH_OPS)
    chosen_because = "NCCL is usable (one GPU per rank)"
    max_count: int = INT_MAX
    #: Replaced per instance by the names the loaded binding has.
    reduce_dtypes: Optional[FrozenSet[str]] = frozenset(_NCCL_TYPES)

    def __init__(self, comm: Any) -> None:
        super().__init__(comm)
        found = probe(comm)
        if found.reason is not None:
            raise TransportUnavailable(f"transport 'nccl' cannot run here: {found.reason}")
        if found.error is not None:
            raise type(found.error)(str(found.error))
        global _CHOSEN
        rt = self._rt = get_runtime()
        rt.use_device(found.device)
        _CHOSEN = found.device
        self.device, self.device_choice = found.device, found.how
        self._uneven = found.uneven
        self._nccl = rt.nccl
        self._xp = rt.xp
        self._capturing = capture_query(rt)
        self._types = {name: getattr(rt.nccl, const) for name, const in _NCCL_TYPES.items() if hasattr(rt.nccl, const)}
        if nccl_version(rt.nccl) < BF16_VERSION:
            self._types.pop("bfloat16", None)
        self._ops = {op: getattr(rt.nccl, const) for op, const in _NCCL_OPS.items()}
        self.reduce_dtypes = frozenset(self._types)
        self.native_reduce: FrozenSet[str] = frozenset(n for n in ("float16", "bfloat16") if n in self._types)
        # The per-call lookups, keyed by the dtype object (hashing one is a few ns; dtype.name
        # costs about a microsecond): filled here for NumPy's own dtypes, and on first sight
        # for any other (bfloat16), by name, once.
        self._reduce: Dict[np.dtype, Optional[_Wire]] = {}
        self._move: Dict[np.dtype, _Wire] = {}
        for name in _NCCL_TYPES:
            if name != "bfloat16":
                self._wire_for_reduce(np.dtype(name))
                self._wire_for_move(np.dtype(name))
        for name in ("complex64", "complex128", "bool", "int16", "uint16"):
            self._wire_for_reduce(np.dtype(name))
            self._wire_for_move(np.dtype(name))
        self._nc: Any = bootstrap(comm, rt)
        LIVE.add(self)

    @classmethod
    def unavailable_reason(cls, comm: Any) -> Optional[str]:
        return probe(comm).reason

    @property
    def uneven(self) -> str:
        return self._uneven

    @uneven.setter
    def uneven(self, value: str) -> None:
        self._uneven = check_uneven(value)

    @property
    def communicator(self) -> Any:
        """The ``NcclCommunicator`` this transport calls (``None`` once closed or aborted).

        For benchmarks and tools that compare against NCCL itself; calls on it
        bypass hpccoll's checks.
        """
        return self._nc

    def nccl_datatype(self, dtype: Any) -> Any:
        """NCCL's datatype constant for arrays of ``dtype`` reduced natively.

        Raises
        ------
        DTypeError
            ``dtype`` has no NCCL reduction type (complex, bool, int16 ... go through other types).
        """
        wire = self._wire_for_reduce(np.dtype(dtype))
        if wire is None or wire.scale != 1:
            raise DTypeError(f"dtype: expected a dtype NCCL reduces ({', '.join(self._types)}); got {np.dtype(dtype)}")
        return wire.type

    def nccl_op(self, op: str) -> Any:
        """NCCL's reduction op constant for ``"sum"``, ``"prod"``, ``"max"`` or ``"min"``."""
        try:
            return self._ops[op]
        except (KeyError, TypeError):
            raise ArgumentError(f"op: expected one of {', '.join(map(repr, self._ops))}; got {op!r}") from None

    def bind_finish(self, finish: Callable[[], Any]) -> Callable[[], Any]:
        return self._rt.on_this_stream(finish)

    def close(self) -> None:
        nc, self._nc = getattr(self, "_nc", None), None
        if nc is not None:
            destroy(nc)
        LIVE.discard(self)

    # ------------------------------------------------------------------ faults
    def _async_error(self) -> None:
        """Raise :class:`CollectiveError` if NCCL reported an asynchronous error (aborting the communicator)."""
        try:
            self._nc.check_async_error()
        except Exception as exc:  # the binding's NcclError
            self._abort(f"NCCL reported an asynchronous error ({type(exc).__name__}: {exc})")

    def _abort(self, why: str) -> None:
        nc, self._nc = self._nc, None
        LIVE.discard(self)
        if nc is not None:
            with contextlib.suppress(Exception):
                nc.abort()
        raise CollectiveError(
            f"transport 'nccl' on rank {self.comm.rank}: {why}; its NCCL communicator was aborted "
            "(free this Communicator and make a new one)"
        )

    def _pending(self) -> "EventPending":
        """An event after the work just enqueued; under ``HPCCOLL_TIMEOUT`` the wait is watched."""
        return EventPending(self._rt.record(), self)

    # ------------------------------------------------------------------ helpers
    def _ready(self, send: Optional[Any], recv: Any) -> Any:
        """The live NCCL communicator, after the checks every call makes (each costs nanoseconds).

        Closed -> :class:`TransportUnavailable`; an asynchronous NCCL error ->
        :class:`CollectiveError`; an array on another GPU -> :class:`ArgumentError`.
        """
        nc = self._nc
        if nc is None:
            raise TransportUnavailable("transport 'nccl': expected a live NCCL communicator; got a closed one")
        try:
            nc.check_async_error()
        except Exception as exc:  # the binding's NcclError
            self._abort(f"NCCL reported an asynchronous error ({type(exc).__name__}: {exc})")
        device_of, device = self._rt.device_of, self.device
        if device_of(recv) != device:
            self._wrong_device(device_of(recv))
        if send is not None and device_of(send) != device:
            self._wrong_device(device_of(send))
        return nc

    def _wrong_device(self, dev: int) -> NoReturn:
        raise ArgumentError(
            f"x: expected a CuPy array on GPU {self.device}, this rank's NCCL device "
            f"({self.device_choice}); got one on GPU {dev}. Select the GPU before allocating "
            "(cupy.cuda.Device(n).use()); hpccoll then keeps it"
        )

    def _wire_for_reduce(self, dtype: np.dtype) -> Optional[_Wire]:
        """How NCCL reduces ``dtype`` elementwise (:func:`~hpccoll._dtypes.library_reduce_wire`), or ``None``."""
        try:
            return self._reduce[dtype]
        except KeyError:
            pass
        found = library_reduce_wire(dtype, self.reduce_dtypes)
        wire = None if found is None else _Wire(self._types[found.view.name], found.scale, found.view)
        self._reduce[dtype] = wire
        return wire

    def _wire_for_move(self, dtype: np.dtype) -> _Wire:
        """How NCCL moves ``dtype`` (:func:`~hpccoll._dtypes.library_move_wire`): itself, reals, or bytes."""
        try:
            return self._move[dtype]
        except KeyError:
            pass
        found = library_move_wire(dtype, self.reduce_dtypes)
        wire = self._move[dtype] = _Wire(self._types[found.view.name], found.scale, found.view)
        return wire

    def _route(self, dtype: np.dtype, op: str) -> LibraryReduction:
        """:func:`~hpccoll._dtypes.library_reduction` for NCCL: native, reals, widened or complex prod (or refused)."""
        return library_reduction(dtype, op, self.reduce_dtypes, "NCCL")

    def _view(self, a: Any, wire: _Wire) -> Any:
        return a if wire.scale == 1 else a.view(wire.view)

    @contextlib.contextmanager
    def _group(self) -> Iterator[None]:
        self._nccl.groupStart()
        try:
            yield
        except BaseException:
            with contextlib.suppress(Exception):
                self._nccl.groupEnd()
            raise
        self._nccl.groupEnd()

    def _design(self, counts: Sequence[int]) -> str:
        design = self._uneven
        largest = max(counts)
        if design == "auto":
            design = "pad" if len(counts) * largest <= (1 + PAD_SLACK) * sum(counts) else "grouped"
        if design == "pad" and largest > self.max_count:
            design = "grouped"
        return design

    # ------------------------------------------------------------------ all-gather
    def _enqueue_allgatherv(self, send: Any, recv: Any, counts: Sequence[int]) -> None:
        nc = self._ready(send, recv)
        dtype = recv.dtype
        wire = self._move.get(dtype) or self._wire_for_move(dtype)
        first = counts[0]
        even = counts.count(first) == len(counts)
        n = first * wire.scale
        if even and 0 < n <= self.max_count:  # the common call: one allGather, nothing else
            rt = self._rt
            nc.allGather(rt.ptr(send), rt.ptr(recv), n, wire.type, rt.stream())
            return
        if not any(counts):
            return
        send, recv = self._view(send, wire), self._view(recv, wire)
        counts, stream = [c * wire.scale for c in counts], self._rt.stream()
        if even:
            self._allgather_grouped(send, recv, counts, wire.type, stream)  # only past max_count
        elif self._design(counts) == "pad":
            self._allgather_padded(send, recv, counts, wire.type, stream)
        else:
            self._allgather_grouped(send, recv, counts, wire.type, stream)

    def _allgather_grouped(self, send: Any, recv: Any, counts: List[int], t: Any, stream: int) -> None:
        size, me = recv.itemsize, self.comm.rank
        sp, rp = self._rt.ptr(send), self._rt.ptr(recv)
        with self._group():
            for root, (count, disp) in enumerate(zip(counts, displacements(counts))):
                for off, n in _chunks(count, self.max_count):
                    dst = rp + (disp + off) * size
                    src = sp + off * size if root == me else dst
                    self._nc.broadcast(src, dst, n, t, root, stream)

    def _allgather_padded(self, send: Any, recv: Any, counts: List[int], t: Any, stream: int) -> None:
        xp, me, widest = self._xp, self.comm.rank, max(counts)
        if counts[me] == widest:
            padded_send = send
        else:
            padded_send = xp.empty(widest, send.dtype)
            padded_send[: counts[me]] = send
        padded = xp.empty((len(counts), widest), recv.dtype)
        self._nc.allGather(self._rt.ptr(padded_send), self._rt.ptr(padded), widest, t, stream)
        for root, (count, disp) in enumerate(zip(counts, displacements(counts))):
            if count:
                recv[disp : disp + count] = padded[root, :count]

    # ------------------------------------------------------------------ reduce-scatter
    def _enqueue_reduce_scatter(self, send: Any, recv: Any, counts: Sequence[int], op: str) -> None:
        nc = self._ready(send, recv)
        if op not in self._ops:
            mine = self._xp.empty(recv.size, np.uint8)
            self._enqueue_reduce_scatter(self._truth(send, op), mine, counts, _TRUTH_OPS[op])
            self._store_truth(mine, recv, op)
            return
        dtype = recv.dtype
        try:
            wire = self._reduce[dtype]
        except KeyError:
            wire = self._wire_for_reduce(dtype)
        first = counts[0]
        even = counts.count(first) == len(counts)
        if wire is not None and (wire.scale == 1 or op == "sum"):
            n = first * wire.scale
            if even and 0 < n <= self.max_count:  # the common call: one reduceScatter, nothing else
                rt = self._rt
                nc.reduceScatter(rt.ptr(send), rt.ptr(recv), n, wire.type, self._ops[op], rt.stream())
                return
        if not any(counts):
            return
        route = self._route(dtype, op)
        if route.how == "widen":
            wide = self._xp.empty(recv.size, route.wire.view)
            self._enqueue_reduce_scatter(send.astype(route.wire.view), wide, counts, op)
            self._xp.copyto(recv, wide, casting="unsafe")
            return
        assert wire is not None, "native and complex routes have a wire"
        if route.how == "complex_prod":
            self._complex_prod(send, recv, list(counts))
            return
        send, recv = self._view(send, wire), self._view(recv, wire)
        counts = [c * wire.scale for c in counts]
        t, o, stream = wire.type, self._ops[op], self._rt.stream()
        if even:
            self._reduce_scatter_grouped(send, recv, counts, t, o, stream)  # only past max_count
        elif self._design(counts) == "pad":
            self._reduce_scatter_padded(send, recv, counts, t, o, stream)
        else:
            self._reduce_scatter_grouped(send, recv, counts, t, o, stream)

    def _reduce_scatter_grouped(self, send: Any, recv: Any, counts: List[int], t: Any, o: Any, stream: int) -> None:
        size, me = recv.itemsize, self.comm.rank
        sp, rp = self._rt.ptr(send), self._rt.ptr(recv)
        with self._group():
            for root, (count, disp) in enumerate(zip(counts, displacements(counts))):
                for off, n in _chunks(count, self.max_count):
                    dst = rp + off * size if root == me else 0  # only the root's receive buffer is used
                    self._nc.reduce(sp + (disp + off) * size, dst, n, t, o, root, stream)

    def _reduce_scatter_padded(self, send: Any, recv: Any, counts: List[int], t: Any, o: Any, stream: int) -> None:
        xp, me, widest = self._xp, self.comm.rank, max(counts)
        padded = xp.zeros((len(counts), widest), send.dtype)
        for root, (count, disp) in enumerate(zip(counts, displacements(counts))):
            if count:
                padded[root, :count] = send[disp : disp + count]
        mine = recv if counts[me] == widest else xp.empty(widest, recv.dtype)
        self._nc.reduceScatter(self._rt.ptr(padded), self._rt.ptr(mine), widest, t, o, stream)
        if mine is not recv:
            recv[...] = mine[: counts[me]]

    def _complex_prod(self, send: Any, recv: Any, counts: List[int]) -> None:
        """Complex product over ranks of block ``rank``: all-to-all of the blocks, then a local product."""
        xp, me, ranks = self._xp, self.comm.rank, len(counts)
        wire = self._wire_for_reduce(recv.dtype)
        assert wire is not None, "complex dtypes reduce as pairs of reals"
        t, stream, size, real = wire.type, self._rt.stream(), recv.itemsize, wire.view.itemsize
        disps = displacements(counts)
        blocks = xp.empty((ranks, counts[me]), recv.dtype)
        sp, bp = self._rt.ptr(send), self._rt.ptr(blocks)
        with self._group():
            for peer in range(ranks):
                if peer == me:
                    continue
                for off, n in _chunks(2 * counts[peer], self.max_count):
                    self._nc.send(sp + disps[peer] * size + off * real, n, t, peer, stream)
                for off, n in _chunks(2 * counts[me], self.max_count):
                    self._nc.recv(bp + peer * counts[me] * size + off * real, n, t, peer, stream)
        blocks[me] = send[disps[me] : disps[me] + counts[me]]
        xp.prod(blocks, axis=0, out=recv)

    # ------------------------------------------------------------------ MPI's logical ops
    def _truth(self, a: Any, op: str) -> Any:
        """``a``'s truth values as 0/1 bytes, for ``op`` (one of :data:`_TRUTH_OPS`; else refused)."""
        if op not in _TRUTH_OPS:  # the collectives' plans never ask: an out-of-tree caller may
            raise UnsupportedOpError(
                f"op={op_label(op)}: expected one of NCCL's ops {', '.join(map(repr, self._ops))} or MPI's "
                f"logical ones; got {op!r} (NCCL has no bitwise ops): use transport='mpi' or 'staged'"
            )
        return a.astype(np.bool_).view(np.uint8)

    def _store_truth(self, truth: Any, recv: Any, op: str) -> None:
        """``recv`` = the reduced truth values (parity for ``lxor``), as 0/1 of ``recv``'s dtype."""
        if op == "lxor":
            truth *= 128  # the sum's low bit to the top one (a uint8 product wraps): nonzero iff the sum is odd
        self._xp.copyto(recv, truth.astype(np.bool_), casting="unsafe")

    # ------------------------------------------------------------------ non-blocking forms
    # NCCL calls are already asynchronous on the caller's stream: enqueue, then hand back
    # an event recorded after them (test() queries it, wait() synchronises on it).
    def iallgatherv(self, send: Any, recv: Any, counts: Sequence[int]) -> Pending:
        self._enqueue_allgatherv(send, recv, counts)
        return self._pending()

    def ireduce_scatter(self, send: Any, recv: Any, counts: Sequence[int], op: str) -> Pending:
        self._enqueue_reduce_scatter(send, recv, counts, op)
        return self._pending()

    def iallreduce(self, send: Optional[Any], recv: Any, op: str) -> Pending:
        self._enqueue_allreduce(send, recv, op)
        return self._pending()

    # The blocking forms only enqueue (stream order is the caller's synchronisation), except under
    # HPCCOLL_TIMEOUT, where each one is waited for, watched, so that a stuck collective is reported.
    # During CUDA stream capture nothing runs, so there is nothing to wait for (replays are not watched).
    def allgatherv(self, send: Any, recv: Any, counts: Sequence[int]) -> None:
        self._enqueue_allgatherv(send, recv, counts)
        if self.comm.timeout is not None and not self._capturing():
            self._pending().wait()

    def reduce_scatter(self, send: Any, recv: Any, counts: Sequence[int], op: str) -> None:
        self._enqueue_reduce_scatter(send, recv, counts, op)
        if self.comm.timeout is not None and not self._capturing():
            self._pending().wait()

    def allreduce(self, send: Optional[Any], recv: Any, op: str) -> None:
        self._enqueue_allreduce(send, recv, op)
        if self.comm.timeout is not None and not self._capturing():
            self._pending().wait()

    def prepare(self, primitive: str, args: tuple, method: str = "blocking") -> Prepared:
        """The common call of an all-reduce, all-gather, reduce-scatter, broadcast or reduce (one NCCL call:
        even counts, a dtype NCCL has, a count within :attr:`max_count`) with its pointers, count, dtype,
        op and root fixed: each run checks that the communicator is live and error-free, then enqueues on
        the caller's current stream (so a run under CUDA stream capture is captured). Everything else
        (and every call under ``HPCCOLL_TIMEOUT``): the contract's default."""
        build = _FIXED.get(primitive) if self.comm.timeout is None else None
        fixed = build(self, *args) if build is not None else None
        return fixed if fixed is not None else Prepared(self, primitive, args)

    def _fixed(self, primitive: str, args: tuple, nc: Any, call: Any, *fixed_args: Any) -> Prepared:
        """A prepared call whose every run is ``call(*fixed_args, current stream)`` on the live ``nc``."""
        check, stream = nc.check_async_error, self._rt.stream

        def run() -> None:
            if self._nc is not nc:
                raise TransportUnavailable("transport 'nccl': expected a live NCCL communicator; got a closed one")
            try:
                check()
            except Exception as exc:  # the binding's NcclError
                self._abort(f"NCCL reported an asynchronous error ({type(exc).__name__}: {exc})")
            call(*fixed_args, stream())

        fixed = Prepared(self, primitive, args)
        fixed.run = run
        fixed.steps = (run,)

        def start() -> Pending:
            run()
            return self._pending()

        fixed._start = start
        return fixed

    def _native(self, dtype: np.dtype, op: str) -> Any:
        """The wire NCCL reduces ``dtype`` on with ``op`` in one call (native, or complex sums as reals), or None."""
        wire = self._reduce.get(dtype) or self._wire_for_reduce(dtype)
        if op not in self._ops or wire is None or not (wire.scale == 1 or op == "sum"):
            return None
        return wire

    def _fixed_allreduce(self, send: Optional[Any], recv: Any, op: str) -> Optional[Prepared]:
        return self._fixed_reduction("allreduce", (send, recv, op), None)

    def _fixed_reduce(self, send: Optional[Any], recv: Any, op: str, root: int) -> Optional[Prepared]:
        return self._fixed_reduction("reduce", (send, recv, op, root), root)

    def _fixed_reduction(self, primitive: str, args: tuple, root: Optional[int]) -> Optional[Prepared]:
        """One ``allReduce`` (``root`` None) or ``reduce``, where that is the common call."""
        send, recv, op = args[:3]
        wire = self._native(recv.dtype, op)
        n = 0 if wire is None else recv.size * wire.scale
        if not 0 < n <= self.max_count:
            return None
        nc = self._ready(send, recv)
        rp = self._rt.ptr(recv)
        sp = rp if send is None else self._rt.ptr(send)
        if root is None:
            return self._fixed(primitive, args, nc, nc.allReduce, sp, rp, n, wire.type, self._ops[op])
        return self._fixed(primitive, args, nc, nc.reduce, sp, rp, n, wire.type, self._ops[op], root)

    def _fixed_allgatherv(self, send: Optional[Any], recv: Any, counts: Sequence[int]) -> Optional[Prepared]:
        """One ``allGather`` of even blocks."""
        wire = self._move.get(recv.dtype) or self._wire_for_move(recv.dtype)
        n = counts[0] * wire.scale
        if send is None or counts.count(counts[0]) != len(counts) or not 0 < n <= self.max_count:
            return None
        nc, rt = self._ready(send, recv), self._rt
        return self._fixed(
            "allgatherv", (send, recv, counts), nc, nc.allGather, rt.ptr(send), rt.ptr(recv), n, wire.type
        )

    def _fixed_reduce_scatter(self, send: Any, recv: Any, counts: Sequence[int], op: str) -> Optional[Prepared]:
        """One ``reduceScatter`` of even blocks."""
        wire = self._native(recv.dtype, op)
        n = 0 if wire is None else counts[0] * wire.scale
        if send is None or counts.count(counts[0]) != len(counts) or not 0 < n <= self.max_count:
            return None
        nc, rt = self._ready(send, recv), self._rt
        args = (send, recv, counts, op)
        return self._fixed(
            "reduce_scatter", args, nc, nc.reduceScatter, rt.ptr(send), rt.ptr(recv), n, wire.type, self._ops[op]
        )

    def _fixed_bcast(self, buf: Any, root: int) -> Optional[Prepared]:
        """One ``bcast`` (in place) of the moving view."""
        wire = self._move.get(buf.dtype) or self._wire_for_move(buf.dtype)
        n = buf.size * wire.scale
        if not 0 < n <= self.max_count:
            return None
        nc = self._ready(None, buf)
        return self._fixed("bcast", (buf, root), nc, nc.bcast, self._rt.ptr(buf), n, wire.type, root)

    # ------------------------------------------------------------------ all-reduce
    def _enqueue_allreduce(self, send: Optional[Any], recv: Any, op: str) -> None:
        self._enqueue_reduction(send, recv, op, None)

    def _enqueue_reduction(self, send: Optional[Any], recv: Any, op: str, root: Optional[int]) -> None:
        """``ncclAllReduce`` (``root`` None) or ``ncclReduce`` to ``root``, every (dtype, op) alike: MPI's logical
        ops on truth values, and :meth:`_route`'s choice where NCCL lacks the dtype (widened, reals, blocks)."""
        nc = self._ready(send, recv)
        keep = root is None or self.comm.rank == root  # whether this rank's recv holds the result
        if op not in self._ops:
            truth = self._truth(recv if send is None else send, op)
            self._enqueue_reduction(None, truth, _TRUTH_OPS[op], root)
            if keep:
                self._store_truth(truth, recv, op)
            return
        dtype = recv.dtype
        try:
            wire = self._reduce[dtype]
        except KeyError:
            wire = self._wire_for_reduce(dtype)
        if wire is not None and (wire.scale == 1 or op == "sum"):
            n = recv.size * wire.scale
            if 0 < n <= self.max_count:  # the common call: one allReduce or reduce, nothing else
                rt = self._rt
                rp = rt.ptr(recv)
                sp = rp if send is None else rt.ptr(send)
                if root is None:
                    nc.allReduce(sp, rp, n, wire.type, self._ops[op], rt.stream())
                else:
                    nc.reduce(sp, rp, n, wire.type, self._ops[op], root, rt.stream())
                return
        if recv.size == 0:
            return
        route = self._route(dtype, op)
        if route.how == "widen":
            wide = (recv if send is None else send).astype(route.wire.view)
            self._enqueue_reduction(None, wide, op, root)
            if keep:
                self._xp.copyto(recv, wide, casting="unsafe")
            return
        assert wire is not None, "native and complex routes have a wire"
        if route.how == "complex_prod":
            if root is None:
                counts = list(split_sizes(recv.size, self.comm.size))
                block = self._xp.empty(counts[self.comm.rank], dtype)
                self._complex_prod(recv if send is None else send, block, counts)
                self._enqueue_allgatherv(block, recv, counts)
            else:  # the root's block is everything: every other rank sends it its input, the root multiplies
                counts = [0] * self.comm.size
                counts[root] = recv.size
                self._complex_prod(recv if send is None else send, recv if keep else recv[:0], counts)
            return
        # Past max_count: in pieces.
        t, o, stream, size = wire.type, self._ops[op], self._rt.stream(), wire.view.itemsize
        rp = self._rt.ptr(recv)
        sp = rp if send is None else self._rt.ptr(send)
        for off, n in _chunks(recv.size * wire.scale, self.max_count):
            if root is None:
                nc.allReduce(sp + off * size, rp + off * size, n, t, o, stream)
            else:
                nc.reduce(sp + off * size, rp + off * size, n, t, o, root, stream)

    # ------------------------------------------------------------------ rooted primitives
    # ncclBroadcast and ncclReduce; gatherv/scatterv as grouped send/recv with the root's own block
    # copied on the device. Blocking and non-blocking forms as the others: enqueue, then (blocking,
    # under HPCCOLL_TIMEOUT and not capturing) wait, watched, or hand back an event.
    def bcast(self, buf: Any, root: int) -> None:
        self._enqueue_bcast(buf, root)
        self._watch()

    def reduce(self, send: Optional[Any], recv: Any, op: str, root: int) -> None:
        self._enqueue_reduce(send, recv, op, root)
        self._watch()

    def gatherv(self, send: Any, recv: Optional[Any], counts: Sequence[int], root: int) -> None:
        self._enqueue_gatherv(send, recv, counts, root)
        self._watch()

    def scatterv(self, send: Optional[Any], recv: Any, counts: Sequence[int], root: int) -> None:
        self._enqueue_scatterv(send, recv, counts, root)
        self._watch()

    def ibcast(self, buf: Any, root: int) -> Pending:
        self._enqueue_bcast(buf, root)
        return self._pending()

    def ireduce(self, send: Optional[Any], recv: Any, op: str, root: int) -> Pending:
        self._enqueue_reduce(send, recv, op, root)
        return self._pending()

    def igatherv(self, send: Any, recv: Optional[Any], counts: Sequence[int], root: int) -> Pending:
        self._enqueue_gatherv(send, recv, counts, root)
        return self._pending()

    def iscatterv(self, send: Optional[Any], recv: Any, counts: Sequence[int], root: int) -> Pending:
        self._enqueue_scatterv(send, recv, counts, root)
        return self._pending()

    def _watch(self) -> None:
        """Under ``HPCCOLL_TIMEOUT`` (and not during stream capture), wait for the work just enqueued, watched."""
        if self.comm.timeout is not None and not self._capturing():
            self._pending().wait()

    def _enqueue_bcast(self, buf: Any, root: int) -> None:
        """Root's ``buf`` to every rank's, in place: ``ncclBroadcast`` of the moving view (complex as reals, bytes)."""
        nc = self._ready(None, buf)
        wire = self._move.get(buf.dtype) or self._wire_for_move(buf.dtype)
        rt = self._rt
        bp, t, stream, size = rt.ptr(buf), wire.type, rt.stream(), wire.view.itemsize
        for off, n in _chunks(buf.size * wire.scale, self.max_count):
            nc.bcast(bp + off * size, n, t, root, stream)

    def _enqueue_reduce(self, send: Optional[Any], recv: Any, op: str, root: int) -> None:
        """``ncclReduce``, each (dtype, op) handled as :meth:`_enqueue_allreduce` handles it."""
        self._enqueue_reduction(send, recv, op, root)

    def _enqueue_gatherv(self, send: Any, recv: Optional[Any], counts: Sequence[int], root: int) -> None:
        self._enqueue_blocks(send, recv, counts, root, gather=True)

    def _enqueue_scatterv(self, send: Optional[Any], recv: Any, counts: Sequence[int], root: int) -> None:
        self._enqueue_blocks(recv, send, counts, root, gather=False)

    def _enqueue_blocks(self, mine: Any, full: Optional[Any], counts: Sequence[int], root: int, gather: bool) -> None:
        """Gatherv (``gather``: each rank's ``mine`` into the root's ``full``) or scatterv (the root's ``full``
        into each ``mine``): one grouped recv (send) per peer at the root, one send (recv) elsewhere; the
        root's own block is a device copy."""
        nc = self._ready(full, mine)
        wire = self._move.get(mine.dtype) or self._wire_for_move(mine.dtype)
        view, t, me = wire.view, wire.type, self.comm.rank
        scaled = [c * wire.scale for c in counts]
        mine = mine.view(view)
        stream, size, limit = self._rt.stream(), view.itemsize, self.max_count
        to_root, at_root = (nc.send, nc.recv) if gather else (nc.recv, nc.send)
        if me != root:
            if scaled[me]:
                mp = self._rt.ptr(mine)
                with self._group():
                    for off, n in _chunks(scaled[me], limit):
                        to_root(mp + off * size, n, t, root, stream)
            return
        assert full is not None, "the root holds every block"
        full = full.view(view)
        disps, fp = displacements(scaled), self._rt.ptr(full)
        if any(scaled[peer] for peer in range(len(scaled)) if peer != me):
            with self._group():
                for peer, (count, disp) in enumerate(zip(scaled, disps)):
                    if peer != me:
                        for off, n in _chunks(count, limit):
                            at_root(fp + (disp + off) * size, n, t, peer, stream)
        if scaled[me]:
            block = full[disps[me] : disps[me] + scaled[me]]
            if gather:
                block[...] = mine
            else:
                mine[...] = block

    # ------------------------------------------------------------------ point-to-point
    def sendrecv(self, sends: Sequence[Tuple[Any, int]], recvs: Sequence[Tuple[Any, int]], sized: bool = False) -> None:
        self._enqueue_messages(sends, recvs)
        self._watch()

    def isendrecv(
        self, sends: Sequence[Tuple[Any, int]], recvs: Sequence[Tuple[Any, int]], sized: bool = False
    ) -> Pending:
        self._enqueue_messages(sends, recvs)
        return self._pending()

    def _enqueue_messages(self, sends: Sequence[Tuple[Any, int]], recvs: Sequence[Tuple[Any, int]]) -> None:
        """The buffers themselves, as bytes: one grouped ``ncclSend``/``ncclRecv`` per message (NCCL matches
        the messages between a pair in order, as the contract does); a message to this rank is a device copy."""
        messages = [(b, q, True) for b, q in sends] + [(b, q, False) for b, q in recvs]
        if not messages:
            return
        nc = self._ready(None, messages[0][0])
        rt, me, t = self._rt, self.comm.rank, self._types["uint8"]
        stream = rt.stream()
        with self._group():
            for buf, q, sending in messages:
                if rt.device_of(buf) != self.device:
                    self._wrong_device(rt.device_of(buf))
                if q != me:
                    call, p = (nc.send if sending else nc.recv), rt.ptr(buf)
                    for off, n in _chunks(buf.nbytes, self.max_count):
                        call(p + off, n, t, q, stream)
        for buf, src in zip([b for b, q in recvs if q == me], [b for b, q in sends if q == me]):
            buf.view(np.uint8)[...] = src.view(np.uint8)

    # ------------------------------------------------------------------ all-to-all
    # ``even`` changes nothing here: grouped send/recv is NCCL's only all-to-all.
    def alltoallv(
        self, send: Any, recv: Any, send_counts: Sequence[int], recv_counts: Sequence[int], even: bool = False
    ) -> None:
        self._enqueue_alltoallv(send, recv, send_counts, recv_counts)
        if self.comm.timeout is not None:
            self._pending().wait()

    def ialltoallv(
        self, send: Any, recv: Any, send_counts: Sequence[int], recv_counts: Sequence[int], even: bool = False
    ) -> Pending:
        self._enqueue_alltoallv(send, recv, send_counts, recv_counts)
        return self._pending()

    def _enqueue_alltoallv(self, send: Any, recv: Any, send_counts: Sequence[int], recv_counts: Sequence[int]) -> None:
        """NCCL has no all-to-all: one grouped send and recv per peer; this rank's own block is a device copy."""
        nc = self._ready(send, recv)
        wire = self._move.get(recv.dtype) or self._wire_for_move(recv.dtype)
        view, scale, t = wire.view, wire.scale, wire.type
        send, recv = send.view(view), recv.view(view)
        sc, rc = [n * scale for n in send_counts], [n * scale for n in recv_counts]
        sd, rd, me = displacements(sc), displacements(rc), self.comm.rank
        stream, size = self._rt.stream(), view.itemsize
        sp, rp = self._rt.ptr(send), self._rt.ptr(recv)
        with self._group():
            for peer in range(len(sc)):
                if peer == me:
                    continue
                for off, n in _chunks(sc[peer], self.max_count):
                    nc.send(sp + (sd[peer] + off) * size, n, t, peer, stream)
                for off, n in _chunks(rc[peer], self.max_count):
                    nc.recv(rp + (rd[peer] + off) * size, n, t, peer, stream)
        if rc[me]:
            recv[rd[me] : rd[me] + rc[me]] = send[sd[me] : sd[me] + sc[me]]


class EventPending(Pending):
    """Work enqueued on a CUDA stream, tracked by an event recorded after it.

    With ``HPCCOLL_TIMEOUT`` set on the communicator, ``wait()`` polls the
    event and NCCL's asynchronous error state, and aborts the NCCL
    communicator with :class:`CollectiveError` once the limit has passed.
    """

    __slots__ = ("event", "transport")

    def __init__(self, event: Any, transport: Any) -> None:
        self.event = event
        self.transport = transport

    def wait(self) -> None:
        timeout = self.transport.comm.timeout
        if timeout is None:
            self.event.synchronize()
            return
        deadline = time.monotonic() + timeout
        while not self.event.done:
            self.transport._async_error()
            if time.monotonic() > deadline:
                comm = self.transport.comm
                dump_stacks(
                    f"hpccoll: an NCCL collective did not complete within HPCCOLL_TIMEOUT={timeout:g} s "
                    f"on rank {comm.rank} of {comm.size}"
                )
                self.transport._abort(f"a collective did not complete within HPCCOLL_TIMEOUT={timeout:g} s")
            time.sleep(0.0005)
        self.transport._async_error()

    def test(self) -> bool:
        if self.transport._nc is not None:
            self.transport._async_error()
        return bool(self.event.done)


#: :meth:`NcclTransport.prepare`'s builders: each returns the prepared common call, or None (the contract's default).
_FIXED: Dict[str, Callable[..., Optional[Prepared]]] = {
    "allreduce": NcclTransport._fixed_allreduce,
    "reduce": NcclTransport._fixed_reduce,
    "allgatherv": NcclTransport._fixed_allgatherv,
    "reduce_scatter": NcclTransport._fixed_reduce_scatter,
    "bcast": NcclTransport._fixed_bcast,
}
