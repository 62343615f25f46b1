"""The fast path: blocking collectives of C-contiguous NumPy arrays, straight to mpi4py.

Every public collective tries this first. It takes the common case -- a
C-contiguous NumPy array whose dtype MPI moves (and, for reductions, reduces)
natively, split or gathered along its first axis, with ``sizes`` absent or
given as plain ints, no check mode, no ``async_op``, and ``out`` either
absent or a separate C-contiguous array of the right shape and dtype -- and
makes the MPI call with as few Python operations as it can (about 1 us).
Anything else returns ``None``, and the general path in :mod:`hpccoll._api`
(which validates everything and raises the errors) takes over.

The MPI calls are the ones the general path makes for the same arguments, on
the same buffers, so results are bit-identical (``tests/test_fast.py``).
"""

from __future__ import annotations

from math import prod
from operator import attrgetter
from typing import Any, Dict, Optional, Tuple

import numpy as np

from ._arrays import split_sizes
from ._dtypes import check_dtype, movement_dtype, normalize_op, reduce_plan
from ._errors import HpccollError
from ._exchange import exchange_extents
from ._faults import run
from .transports.host_mpi import displacements, mpi_datatype, mpi_op

__all__ = ["all_gather", "reduce_scatter", "all_reduce"]

_ndarray = np.ndarray
_may_share_memory = np.may_share_memory
_SEQUENCES = (list, tuple)
_dtype_of = attrgetter("dtype")
_shape_of = attrgetter("shape")
_nbytes_of = attrgetter("nbytes")
_BYTES = np.dtype(np.uint8)

#: dtype -> the MPI datatype its bytes move as (every supported dtype).
_MOVE: Dict[np.dtype, Any] = {}
#: op name -> dtype -> (MPI datatype, MPI op, divide afterwards), for (dtype, op)
#: pairs MPI reduces natively (no widening): filled on first use.
_REDUCE: Dict[str, Dict[np.dtype, Optional[Tuple[Any, Any, bool]]]] = {}


def _move_type(dtype: np.dtype) -> Any:
    """The MPI datatype a supported ``dtype``'s bytes move as (cached), else ``None``."""
    t = _MOVE.get(dtype)
    if t is None:
        try:
            check_dtype(dtype)
        except HpccollError:
            return None  # the general path raises it
        t = _MOVE[dtype] = mpi_datatype(movement_dtype(dtype))
    return t


def _reduce_entry(dtype: np.dtype, op: str) -> Optional[Tuple[Any, Any, bool]]:
    """``(datatype, op, divide)`` for a natively reduced pair, else ``None`` (remembered)."""
    try:
        plan = reduce_plan(dtype, normalize_op(op))
    except HpccollError:
        return None  # not remembered: the general path raises it every time
    entry = None if plan.widen else (mpi_datatype(plan.wire), mpi_op(plan.op), plan.divide)
    _REDUCE.setdefault(op, {})[dtype] = entry
    return entry


def _separate(out: Any, x: Any, shape: Tuple[int, ...]) -> bool:
    """Whether ``out`` is a valid, writeable, C-contiguous output that does not touch ``x``."""
    if type(out) is not _ndarray or out.shape != shape or out.dtype != x.dtype:
        return False
    flags = out.flags
    return flags.c_contiguous and flags.writeable and not _may_share_memory(out, x)


def _scatter_sizes(sizes: Any, n: int, parts: int) -> Any:
    """A reduce-scatter's block extents for ``n`` rows: ``numpy.array_split``'s for ``None``, else
    ``sizes`` when they are plain ints summing to ``n``, else ``None`` (the general path checks them)."""
    if sizes is None:
        return split_sizes(n, parts)
    return sizes if _plain(sizes, parts) and sum(sizes) == n else None


def _output(out: Any, x: Any, extent: int) -> Tuple[Any, int]:
    """``(output, inner)``: ``extent`` rows shaped like ``x``'s (``inner`` elements each).

    The output is ``out`` when it is valid and separate from ``x``, a new
    array when ``out`` is None, and ``None`` when the fast path does not apply
    (an empty output, or an ``out`` the general path must check).
    """
    shape = x.shape
    inner = 1 if len(shape) == 1 else prod(shape[1:])
    if not extent * inner:
        return None, inner
    oshape = (extent,) + shape[1:]
    if out is None:
        return np.empty(oshape, x.dtype), inner
    return (out if _separate(out, x, oshape) else None), inner


def _is_block(part: Any, part_shape: Tuple[int, ...], whole: Any, whole_shape: Tuple[int, ...], offset: int) -> bool:
    """Whether ``part`` is exactly ``whole``'s C-ordered elements from ``offset`` on (an in-place form).

    Both must be writeable, C-contiguous NumPy arrays of the given shapes, one
    dtype and the same strides, and ``part`` non-empty. Addresses come from
    ``MPI.Get_address`` (about 0.1 us; ``__array_interface__`` takes 1 us).
    """
    if type(part) is not _ndarray or type(whole) is not _ndarray or part.dtype != whole.dtype or not part.size:
        return False
    if part.shape != part_shape or whole.shape != whole_shape or part.strides != whole.strides:
        return False  # the general path's in-place test compares strides too
    flags, part_flags = whole.flags, part.flags
    if not (flags.c_contiguous and flags.writeable and part_flags.c_contiguous and part_flags.writeable):
        return False
    from mpi4py import MPI  # loaded by then (this is a communicator's call)

    return MPI.Get_address(part) == MPI.Get_address(whole) + offset * part.itemsize


def _plain(sizes: Any, parts: int) -> bool:
    """Whether ``sizes`` is a list or tuple of ``parts`` non-negative Python ints."""
    if type(sizes) not in _SEQUENCES or len(sizes) != parts:
        return False
    for s in sizes:
        if type(s) is not int or s < 0:
            return False
    return True


def _entry(dtype: np.dtype, op: Any) -> Optional[Tuple[Any, Any, bool]]:
    """``(datatype, op, divide)`` when MPI reduces ``dtype`` with ``op`` natively, else ``None``."""
    if type(op) is not str:
        return None
    plans = _REDUCE.get(op)
    entry = plans.get(dtype, False) if plans is not None else False
    return _reduce_entry(dtype, op) if entry is False else entry


def all_reduce(x: Any, c: Any, op: Any, out: Any) -> Any:
    """``hpccoll.all_reduce`` for the common case (also a list of arrays), or ``None``."""
    if type(x) is not _ndarray:
        return _all_reduce_many(x, c, op, out) if type(x) in _SEQUENCES else None
    if c.check or c.size == 1 or not x.size or not x.flags.c_contiguous:
        return None
    entry = _entry(x.dtype, op)
    if entry is None:
        return None
    t, mop, divide = entry
    if out is None:
        out = np.empty(x.shape, x.dtype)
    elif out is x and x.flags.writeable:  # in place
        run(c, "Allreduce", mpi_op("in_place"), [x, t], mop)
        if divide:
            x /= x.dtype.type(c.size)
        return x
    elif not _separate(out, x, x.shape):
        return None
    run(c, "Allreduce", [x, t], [out, t], mop)
    if divide:
        out /= out.dtype.type(c.size)
    return out


def all_gather(x: Any, c: Any, axis: Any, sizes: Any, out: Any, what: str) -> Any:
    """``hpccoll.all_gather`` along the first axis (also a list of arrays), or ``None``.

    ``sizes=None`` exchanges the extents (as the general path does) once
    everything local has qualified; should ``out`` then not qualify, the
    general path finishes the call with the exchanged sizes.
    """
    if type(x) is not _ndarray:
        return _all_gather_many(x, c, axis, sizes, out, what) if type(x) in _SEQUENCES else None
    if c.check or c.size == 1 or not x.flags.c_contiguous:
        return None
    shape = x.shape
    if type(axis) is not int or not shape or (axis != 0 and axis != -len(shape)):
        return None
    if (t := _move_type(x.dtype)) is None:
        return None
    rank = c.rank
    given, discovered = out, sizes is None
    if discovered:
        sizes = exchange_extents(c, (x,), (0,), what)[0]
    elif not _plain(sizes, c.size) or sizes[rank] != shape[0]:
        return None
    out, inner = _output(out, x, sum(sizes))
    send: Any = [x, shape[0] * inner, t]
    if out is None:
        start = sum(sizes[:rank])
        if given is not None and _is_block(x, shape, given, (sum(sizes),) + shape[1:], start * inner):
            out, send = given, mpi_op("in_place")  # x is this rank's block of out
        elif discovered:  # the general path goes on with the exchanged sizes (no second exchange)
            from ._api import _all_gather  # imported here: _api imports this module

            return _all_gather(x, c, axis, sizes, given, what, False)
        else:
            return None
    first = sizes[0]
    if sizes.count(first) == len(sizes):
        run(c, "Allgather", send, [out, first * inner, t])
    else:
        counts = [s * inner for s in sizes]
        run(c, "Allgatherv", send, [out, (counts, displacements(counts)), t])
    return out


def reduce_scatter(x: Any, c: Any, op: Any, axis: Any, sizes: Any, out: Any) -> Any:
    """``hpccoll.reduce_scatter`` along the first axis (also a list of arrays), or ``None``."""
    if type(x) is not _ndarray:
        return _reduce_scatter_many(x, c, op, axis, sizes, out) if type(x) in _SEQUENCES else None
    if c.check or c.size == 1 or not x.flags.c_contiguous:
        return None
    shape = x.shape
    if type(axis) is not int or not shape or (axis != 0 and axis != -len(shape)):
        return None
    if (entry := _entry(x.dtype, op)) is None or (sizes := _scatter_sizes(sizes, shape[0], c.size)) is None:
        return None
    mine = sizes[c.rank]
    given = out
    out, inner = _output(out, x, mine)
    t, mop, divide = entry
    even = sizes.count(mine) == len(sizes)
    if out is None:
        start = sum(sizes[: c.rank]) * inner
        if given is None or not _is_block(given, (mine,) + shape[1:], x, shape, start):
            return None
        # In place: out is this rank's block of x. MPI leaves the result at the start of x.
        if even:
            run(c, "Reduce_scatter_block", mpi_op("in_place"), [x, t], mop)
        else:
            run(c, "Reduce_scatter", mpi_op("in_place"), [x, t], [s * inner for s in sizes], mop)
        if start:
            whole = x.reshape(-1)
            whole[start : start + mine * inner] = whole[: mine * inner]
        out = given
    elif even:
        run(c, "Reduce_scatter_block", [x, t], [out, mine * inner, t], mop)
    else:
        run(c, "Reduce_scatter", [x, t], [out, mine * inner, t], [s * inner for s in sizes], mop)
    if divide:
        out /= out.dtype.type(c.size)
    return out


#: Largest scratch buffer (bytes) a communicator keeps between calls of the list form.
SCRATCH_BYTES = 4 << 20


def _scratch(c: Any, nbytes: int) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """Two byte buffers of at least ``nbytes`` kept on ``c`` (send, receive), or ``None`` above :data:`SCRATCH_BYTES`.

    MPI is much slower on freshly allocated buffers than on reused ones (with
    MPICH 5 here, 256 KiB all-reduced into a new ``numpy.empty`` takes about
    3x as long as into a reused one, even when its pages were touched first):
    the list form packs and reduces in these and copies the result out.
    """
    pair = c._state.get("list scratch")
    if pair is None or pair[0].nbytes < nbytes:
        if nbytes > SCRATCH_BYTES:
            return None
        size = min(max(1 << (nbytes - 1).bit_length(), 1 << 16), SCRATCH_BYTES)
        pair = c._state["list scratch"] = (np.empty(size, np.uint8), np.empty(size, np.uint8))
    return pair


def _all_reduce_many(xs: Any, c: Any, op: Any, out: Any) -> Any:
    """A list of NumPy arrays of one dtype all-reduced in one message (one bucket), or ``None``.

    A few passes over the list at C speed (types, dtypes, shapes), packing with
    ``bytes.join`` (``numpy.concatenate`` for non-contiguous arrays) into
    scratch buffers kept on the communicator (up to :data:`SCRATCH_BYTES`
    each), one ``Allreduce``, and one copy of the result, whose views are
    returned. Lists with ``out``, mixed dtypes, or more than
    ``comm.bucket_bytes`` in all go to :mod:`hpccoll._coalesced`.
    """
    if out is not None or c.check or c.size == 1 or (dtype := _one_dtype(xs)) is None:
        return None
    entry = _entry(dtype, op)
    if entry is None:
        return None
    shapes = list(map(_shape_of, xs))
    first = shapes[0]
    same = shapes.count(first) == len(shapes)
    nbytes = len(xs) * xs[0].nbytes if same else sum(map(_nbytes_of, xs))
    if not 0 < nbytes <= c.bucket_bytes:
        return None
    t, mop, divide = entry
    scratch = _scratch(c, nbytes)
    if scratch is None:
        send = np.concatenate(xs, axis=None)  # any layout: each array flattened in C order
        recv = np.empty(send.size, dtype)
    else:
        send = _pack(xs, scratch[0][:nbytes], dtype)
        recv = scratch[1][:nbytes].view(dtype)
    run(c, "Allreduce", [send, t], [recv, t], mop)
    if divide:
        recv /= dtype.type(c.size)
    if scratch is not None:
        recv = recv.copy()  # the results' own memory (a copy is cheaper than MPI writing to fresh pages)
    if first and same:  # one shape: the rows of a stack, made at C speed
        return list(recv.reshape((len(shapes),) + first))
    results = []
    stop = 0
    for a, shape in zip(xs, shapes):
        start, stop = stop, stop + a.size
        results.append(recv[start:stop].reshape(shape))
    return results


def _pack(xs: Any, buf: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Every array of ``xs`` flattened in C order, one after another, into bytes ``buf``; ``buf`` as ``dtype``."""
    try:
        buf[:] = np.frombuffer(b"".join(xs), np.uint8)  # C-contiguous arrays: bytes.join packs fastest
    except (TypeError, ValueError, BufferError):  # not C-contiguous, or a dtype with no buffer format
        np.concatenate(xs, axis=None, out=buf.view(dtype))
    return buf.view(dtype)


def _one_dtype(xs: Any) -> Optional[np.dtype]:
    """The dtype when ``xs`` is a non-empty list of NumPy arrays (exactly) of one dtype, else ``None``."""
    if not xs:
        return None
    types = set(map(type, xs))
    if len(types) != 1 or _ndarray not in types or len(set(map(_dtype_of, xs))) != 1:
        return None
    return xs[0].dtype


def _uniform(xs: Any) -> Optional[Tuple[np.dtype, Tuple[int, ...]]]:
    """``(dtype, shape)`` when ``xs`` is a non-empty list of NumPy arrays of one dtype and one shape (>= 1-D)."""
    if (dtype := _one_dtype(xs)) is None:
        return None
    shapes = list(map(_shape_of, xs))
    first = shapes[0]
    if not first or shapes.count(first) != len(shapes):
        return None
    return dtype, first


def _rank_major(src: np.ndarray, dst: np.ndarray, k: int, sizes: Any, inner: int, to_ranks: bool) -> None:
    """Copy between ``src``/``dst`` laid out array-major ``(k, sum(sizes) * inner)`` and rank-major.

    Rank-major: for each rank r, the k arrays' rows of rank r's block, one
    after another (what the MPI collectives send and receive). ``to_ranks``
    copies array-major -> rank-major; otherwise rank-major -> array-major.
    """
    arrays = (src if to_ranks else dst).reshape(k, -1)
    flat = dst if to_ranks else src
    offset = row = 0
    for n in sizes:
        block = flat[offset : offset + k * n * inner].reshape(k, n * inner)
        if to_ranks:
            block[...] = arrays[:, row * inner : (row + n) * inner]
        else:
            arrays[:, row * inner : (row + n) * inner] = block
        offset += k * n * inner
        row += n


def _all_gather_many(xs: Any, c: Any, axis: Any, sizes: Any, out: Any, what: str) -> Any:
    """A list of same-shape, same-dtype NumPy arrays all-gathered along axis 0, or ``None``.

    One message of bytes, as :mod:`hpccoll._coalesced` sends (same counts,
    same datatype), packed and received in the communicator's scratch
    buffers; the results are rows of one new array. ``sizes=None`` exchanges
    the extents as the general path does, once everything local has
    qualified; if the fast path cannot go on, the general path does, with the
    exchanged extents.
    """
    if out is not None or c.check or c.size == 1 or type(axis) is not int or axis != 0:
        return None
    if (sizes is not None and not _plain(sizes, c.size)) or (u := _uniform(xs)) is None:
        return None
    dtype, shape = u
    rank = c.rank
    if _move_type(dtype) is None:
        return None  # an unsupported dtype: the general path raises DTypeError
    if sizes is None:
        table = exchange_extents(c, xs, (0,) * len(xs), what)
        sizes = table[0]
        if table.count(sizes) != len(table) or (result := _gather_list(xs, c, sizes, dtype, shape)) is None:
            from ._coalesced import all_gather_many  # imported here: _coalesced imports _api, which imports this module

            return all_gather_many(xs, c, axis, None, out, what, False, table=table)
        return result
    if shape[0] != sizes[rank]:
        return None
    return _gather_list(xs, c, sizes, dtype, shape)


def _gather_list(xs: Any, c: Any, sizes: Any, dtype: np.dtype, shape: Tuple[int, ...]) -> Any:
    """The list all-gather's message and unpacking (see :func:`_all_gather_many`), or ``None``."""
    rank = c.rank
    k, inner = len(xs), prod(shape[1:])
    unit = k * inner * dtype.itemsize  # bytes per row of all k arrays
    counts = [unit * n for n in sizes]
    nbytes = sum(counts)
    scratch = _scratch(c, nbytes) if 0 < nbytes <= c.bucket_bytes else None
    if scratch is None:
        return None
    send = _pack(xs, scratch[0][: counts[rank]], dtype).view(np.uint8)
    recv = scratch[1][:nbytes]
    t = _move_type(_BYTES)
    first = counts[0]
    if counts.count(first) == len(counts):
        run(c, "Allgather", [send, first, t], [recv, first, t])
    else:
        run(c, "Allgatherv", [send, counts[rank], t], [recv, (counts, displacements(counts)), t])
    result = np.empty((k, sum(sizes)) + shape[1:], dtype)
    _rank_major(recv, result.view(np.uint8).reshape(-1), k, sizes, inner * dtype.itemsize, to_ranks=False)
    return list(result)


def _reduce_scatter_many(xs: Any, c: Any, op: Any, axis: Any, sizes: Any, out: Any) -> Any:
    """A list of same-shape, same-dtype NumPy arrays reduce-scattered along axis 0 in one message, or ``None``.

    The same call as :mod:`hpccoll._coalesced` makes: the arrays' blocks
    rank-major in one send buffer, one ``Reduce_scatter(_block)``; the results
    are rows of one new array.
    """
    if out is not None or c.check or c.size == 1 or type(axis) is not int or axis != 0:
        return None
    if (u := _uniform(xs)) is None:
        return None
    dtype, shape = u
    if (entry := _entry(dtype, op)) is None or (sizes := _scatter_sizes(sizes, shape[0], c.size)) is None:
        return None
    k, inner, mine = len(xs), prod(shape[1:]), sizes[c.rank]
    nbytes = k * shape[0] * inner * dtype.itemsize
    scratch = _scratch(c, nbytes) if mine * inner and nbytes <= c.bucket_bytes else None
    if scratch is None:
        return None
    packed = _pack(xs, scratch[0][:nbytes], dtype)
    send = scratch[1][:nbytes].view(dtype)
    _rank_major(packed, send, k, sizes, inner, to_ranks=True)
    recv = scratch[0][: k * mine * inner * dtype.itemsize].view(dtype)  # packed is spent
    t, mop, divide = entry
    count = k * mine * inner
    if sizes.count(mine) == len(sizes):
        run(c, "Reduce_scatter_block", [send, t], [recv, count, t], mop)
    else:
        run(c, "Reduce_scatter", [send, t], [recv, count, t], [k * inner * s for s in sizes], mop)
    if divide:
        recv /= dtype.type(c.size)
    return list(recv.copy().reshape((k, mine) + shape[1:]))
