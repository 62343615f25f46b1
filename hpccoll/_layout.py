"""Layout: arrays to and from the flat, rank-after-rank buffers the transports move.

Pure array work (NumPy or CuPy, whichever module ``xp`` is): no
communication, no validation.
"""

from __future__ import annotations

from logging import DEBUG
from typing import Any, List, Optional, Sequence

import numpy as np

from ._arrays import flat, prod
from ._log import brief, child
from ._relayout import copy_blocks as blocks

__all__ = [
    "as_wire",
    "wire_flat",
    "pack",
    "blocks",
    "finish_reduction",
    "buckets",
    "concat",
    "join",
    "joined",
]

_log = child("buckets")


def as_wire(buf: Any, dtype: np.dtype) -> Any:
    """``buf`` reinterpreted as ``dtype`` (same itemsize); no new object when it already is."""
    return buf if buf.dtype == dtype else buf.view(dtype)


def wire_flat(a: Any, wire: np.dtype) -> Any:
    """A C-contiguous ``a`` as the 1-D buffer of ``wire`` the transports move (a view; ``a`` itself if it is one)."""
    if a.ndim != 1:
        a = a.reshape(-1)
    dtype = a.dtype
    return a if dtype is wire or dtype == wire else a.view(wire)


def pack(x: Any, xp: Any, ax: int, sizes: Sequence[int], wire: np.dtype, widen: bool) -> Any:
    """``x``'s blocks along ``ax`` laid out rank after rank, as one flat buffer of ``wire``.

    Converts to ``wire`` when ``widen``, else reinterprets the bytes; a view of
    ``x`` is returned when no copy is needed.
    """
    if prod(x.shape[:ax]) == 1 and x.flags.c_contiguous:
        buf = flat(x, xp)
        return buf.astype(wire) if widen else as_wire(buf, wire)
    buf = xp.empty(x.size, wire if widen else x.dtype)
    blocks(buf, x, xp, ax, sizes, to_flat=True)
    return as_wire(buf, wire)


def finish_reduction(
    buf: Any, parts: int, divide: bool, *, widen: bool = False, out: Any = None, dtype: Any = None, xp: Any = np
) -> Any:
    """A reduction's finishing step, the one place that decides it: divide for ``avg``, then store or cast.

    Parameters
    ----------
    buf : array or list of arrays
        The reduced values, flat and C-ordered in the wire dtype (a list: each array is only divided).
    parts : int
        The number of ranks reduced over; ``divide`` divides by it (a no-op for 1), in ``buf``'s own dtype.
    divide : bool
        The reduction is ``avg`` (``ReducePlan.divide``).
    widen : bool
        The values travelled converted to a wider wire dtype (``ReducePlan.widen``): they are converted
        back; otherwise the wire bytes are reinterpreted as the result's dtype (same itemsize).
    out : array, optional
        Where the result goes (reshaped to ``out``'s shape, cast from the wire dtype). ``None`` when
        ``buf`` already is the result's memory (a wire view of it) or no ``out`` exists.
    dtype : numpy.dtype, optional
        Without ``out``: the result's dtype (``buf`` converted, or viewed, as it).
    xp : module
        NumPy or CuPy (``out``'s library).

    Returns
    -------
    array or list of arrays
        ``out``; else ``buf`` as ``dtype``; else ``buf``.
    """
    if divide and parts > 1:
        for a in buf if isinstance(buf, list) else (buf,):
            a /= a.dtype.type(parts)
    if out is not None:
        xp.copyto(out, (buf if widen else as_wire(buf, out.dtype)).reshape(out.shape), casting="unsafe")
        return out
    if dtype is not None:
        return buf.astype(dtype) if widen else as_wire(buf, dtype)
    return buf


def buckets(nbytes: Sequence[int], limit: int, total: Optional[int] = None) -> List[range]:
    """Consecutive index ranges whose byte totals stay within ``limit`` (a larger item goes alone).

    ``total``: ``sum(nbytes)``, when the caller knows it already.
    """
    if nbytes and (sum(nbytes) if total is None else total) <= limit:  # the common case: one bucket
        return [range(len(nbytes))]
    groups: List[range] = []
    first = total = 0
    for i, n in enumerate(nbytes):
        if i and total + n > limit:
            groups.append(range(first, i))
            first, total = i, 0
        total += n
    if nbytes:
        groups.append(range(first, len(nbytes)))
    if len(groups) > 1 and _log.isEnabledFor(DEBUG):  # only past the one-bucket return: lists over the limit
        _log.debug(
            "%d arrays (%d bytes) split into %d buckets of at most %d bytes (bucket_bytes); [start, stop) of each: %s",
            len(nbytes),
            sum(nbytes),
            len(groups),
            limit,
            brief([(g.start, g.stop) for g in groups]),
        )
    return groups


def concat(arrays: List[Any], wire: np.dtype, widen: bool, xp: Any, into: Any = None) -> Any:
    """One flat buffer of ``wire`` holding every array's elements, C order, one after another.

    ``into`` (NumPy, bytes of the right size): pack there instead of into a
    new buffer; C-contiguous arrays are joined as bytes, the fastest way.
    """
    if into is not None and not widen:
        join(arrays, into)
        return into.view(wire)
    buf = xp.concatenate(arrays, axis=None) if len(arrays) > 1 else arrays[0].reshape(-1).copy()
    return buf.astype(wire) if widen else as_wire(buf, wire)


def join(arrays: Sequence[Any], into: np.ndarray) -> None:
    """Every NumPy array's elements, C order, one after another, into the bytes ``into``.

    (``arrays`` is typed ``Sequence[Any]``: NumPy's stubs do not declare ``ndarray`` a buffer, which
    ``bytes.join`` takes.)
    """
    try:
        into[:] = np.frombuffer(b"".join(arrays), np.uint8)  # C-contiguous arrays: bytes.join packs fastest
    except (TypeError, ValueError, BufferError):  # not C-contiguous, or a dtype with no buffer format
        np.concatenate(arrays, axis=None, out=into.view(arrays[0].dtype))


def joined(arrays: Sequence[Any]) -> np.ndarray:
    """Every NumPy array (one dtype) flattened in C order, one after another: a new flat array of that dtype.

    Read-only when the arrays are C-contiguous (a view of their bytes, joined
    by ``bytes.join``, the fastest way); for a source that is read once. (Typed
    ``Sequence[Any]`` as :func:`join` is.)
    """
    try:
        return np.frombuffer(b"".join(arrays), arrays[0].dtype)
    except (TypeError, ValueError, BufferError):  # not C-contiguous, or a dtype with no buffer format
        return np.concatenate(arrays, axis=None)
