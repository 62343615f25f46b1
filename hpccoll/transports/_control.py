"""Control-plane exchanges over MPI: the watched call, pickled agreement and the size exchange.

Every transport's setup and every collective's agreement step (check mode,
``sizes=None`` discovery) talk over the communicator's private MPI duplicate,
whatever transport then moves the data. These are the only MPI collectives
outside the transports' own modules, and they live here, in the transport
package, beside them.
"""

from __future__ import annotations

import sys
from array import array
from logging import DEBUG
from typing import Any, Callable, List, NoReturn, Optional, Sequence, Tuple

from .._errors import MismatchError
from .._faults import watched
from .._log import brief, child

_log = child("exchange")

__all__ = [
    "guarded",
    "run",
    "wrong_size",
    "truncated",
    "reraise",
    "short",
    "receive_buffer",
    "allgather_object",
    "exchange_extents",
    "exchange_rows",
    "exchange_shapes",
    "MAX_DIMS",
]

#: The most dimensions an array may have (NumPy 2's limit): the width of :func:`exchange_shapes`'s rows.
MAX_DIMS = 64


def guarded(comm: Any, what: str, call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)``, watched as ``what`` when ``comm.timeout`` is set (``HPCCOLL_TIMEOUT``).

    ``comm`` is a :class:`~hpccoll.Communicator` (``mpi``, ``rank``, ``size``, ``timeout``).
    """
    if comm.timeout is None:
        return call(*args)
    return watched(comm, what, call, *args)


def run(comm: Any, name: str, *args: Any, what: str = "") -> None:
    """``comm.mpi.<name>(*args)`` (an mpi4py buffer collective), watched like :func:`guarded`; MPI's truncation
    error becomes :func:`truncated`'s :class:`MismatchError`."""
    try:
        guarded(comm, what or f"MPI_{name}", getattr(comm.mpi, name), *args)
    except Exception as e:  # noqa: BLE001 - MPI's truncation is translated, anything else raised as it is
        reraise(e, what or f"MPI_{name}", receive_buffer(name, args))


def wrong_size(what: str, expected: str, arrived: str) -> MismatchError:
    """The :class:`MismatchError` of a message whose size is not the one this rank expected.

    ``what`` names the MPI call; the public hpccoll function running it (found on this thread's stack: the
    error path only) is named first where there is one. No exchange: the rank that sees the wrong size
    raises, the others may return or fail in MPI (docs/reliability.md).
    """
    public = _public_caller()
    where = f"{public} ({what})" if public else what
    return MismatchError(
        f"{where}: expected {expected}; {arrived}. The ranks disagree on the shape or dtype of this call: "
        "set HPCCOLL_CHECK=1 to find the rank at fault"
    )


def truncated(e: BaseException, what: str, buffer: Any, source: Optional[int] = None) -> Optional[MismatchError]:
    """:func:`wrong_size`'s error for MPI's truncation error ``e`` (``MPI_ERR_TRUNCATE``, directly or in a
    status of ``MPI_ERR_IN_STATUS``: the caller reads those statuses, or MPICH's collectives' "message sizes
    do not match across processes"), else ``None``.

    ``buffer`` is the receive buffer (or ``None``), ``source`` the rank the message came from where one did.
    """
    from mpi4py import MPI

    if not isinstance(e, MPI.Exception):
        return None
    if e.Get_error_class() != MPI.ERR_TRUNCATE and _SIZES_DIFFER not in e.Get_error_string():
        return None
    room = "a message" if buffer is None else _bytes(buffer)
    sender = "" if source is None else f" from rank {source}"
    longer = "MPI_ERR_TRUNCATE" if e.Get_error_class() == MPI.ERR_TRUNCATE else _SIZES_DIFFER
    return wrong_size(what, f"{room}{sender}", f"a longer message arrived ({longer})")


def reraise(e: BaseException, what: str, buffer: Any, source: Optional[int] = None) -> NoReturn:
    """Raise ``e`` (from an MPI call ``what`` receiving into ``buffer``) as :func:`truncated`'s
    :class:`MismatchError` where it is MPI's truncation error, else as it is."""
    mismatch = truncated(e, what, buffer, source)
    if mismatch is None:
        raise e
    raise mismatch from e


#: What MPICH's collectives say (class ``MPI_ERR_OTHER``) where they see that the ranks' message sizes differ.
_SIZES_DIFFER = "message sizes do not match across processes"


def short(what: str, buffer: Any, count: int, source: int) -> MismatchError:
    """:func:`wrong_size`'s error for a receive into ``buffer`` that completed with ``count`` bytes only."""
    return wrong_size(what, f"{_bytes(buffer)} from rank {source}", f"{count} bytes arrived")


def _bytes(buffer: Any) -> str:
    """``"32 bytes (4 x float64)"``: a NumPy or CuPy array's size."""
    return f"{buffer.nbytes} bytes ({buffer.size} x {buffer.dtype})"


def receive_buffer(name: str, args: tuple) -> Any:
    """The array an mpi4py call ``name(*args)`` receives into (``None`` where none is known): the spec's first
    item, or the block of it that a ``[buffer, (count, displacement), datatype]`` spec names."""
    spec = args[_RECEIVE_ARG.get(name, 1)] if len(args) > _RECEIVE_ARG.get(name, 1) else None
    got: Any = spec[0] if isinstance(spec, (list, tuple)) and spec else spec
    if not (hasattr(got, "nbytes") and hasattr(got, "dtype")):
        return None
    block = spec[1] if isinstance(spec, (list, tuple)) and len(spec) == 3 else None
    if isinstance(block, tuple) and len(block) == 2 and all(isinstance(v, int) for v in block):
        count, start = block
        return got.reshape(-1)[start : start + count]
    return got


#: Where an mpi4py call takes its receive buffer, where that is not its second argument.
_RECEIVE_ARG = {"Bcast": 0, "Recv": 0, "Sendrecv": 3}


def _public_caller() -> str:
    """The public hpccoll function on this thread's stack (``hpccoll._api``'s), or ``""`` (a plan, a ``wait()``)."""
    frame: Any = sys._getframe(2)
    while frame is not None:
        if frame.f_globals.get("__name__") == "hpccoll._api":
            return str(frame.f_code.co_name)
        frame = frame.f_back
    return ""


def allgather_object(comm: Any, obj: Any, what: str = "") -> List[Any]:
    """``comm.mpi.allgather(obj)`` (pickled objects), watched like :func:`guarded`."""
    return guarded(comm, what or "MPI_Allgather (pickled)", comm.mpi.allgather, obj)


def exchange_extents(c: Any, arrays: Sequence[Any], axes: Sequence[int], what: str) -> List[Tuple[int, ...]]:
    """Every rank's extent of each array along its axis: ``result[i][rank]``.

    One ``Allgather`` of ``len(arrays) + 1`` int64 per rank: the extents and a
    signature (a hash of ints, the same in every process) of what must match
    across ranks -- the dtypes, the numbers of dimensions, the axes and the
    other extents. A signature that differs raises :class:`MismatchError` on
    every rank (each sees the whole table). Check mode reports the difference
    in detail instead.
    """
    k = len(arrays)
    signature = hash(
        tuple(
            [
                (ord(a.dtype.char), a.dtype.itemsize, a.ndim, ax) + a.shape[:ax] + a.shape[ax + 1 :]
                for a, ax in zip(arrays, axes)
            ]
        )
    )
    rows, odd = _signed_rows(c, "Allgather", [*(a.shape[ax] for a, ax in zip(arrays, axes)), signature], k, what)
    if odd:
        a = arrays[0]
        have = f"dtype {a.dtype}, shape {a.shape}, axis {axes[0]}" if k == 1 else f"{k} arrays"
        raise MismatchError(
            f"{what}: ranks 0 and {odd} disagree on the dtype, the number of dimensions or the extents "
            f"other than along the gather axis (this rank has {have}); set HPCCOLL_CHECK=1 for a detailed "
            "report"
        )
    table = list(zip(*rows))
    if _log.isEnabledFor(DEBUG):  # one test per exchange, beside an MPI call
        _log.debug(
            "%s: exchanged the extents of %d array(s) along axes %s over %d ranks (one Allgather of %d int64 "
            "per rank): %s",
            what,
            k,
            brief(axes),
            c.size,
            k + 1,
            brief(table),
        )
    return table


def exchange_rows(c: Any, rows: Sequence[Sequence[int]], signature: int, what: str) -> List[List[int]]:
    """What every rank addressed to this one: ``result[r]`` is rank r's ``rows[this rank]``.

    One ``Alltoall`` of ``k + 1`` int64 per pair of ranks: ``rows[j]`` (``k``
    ints for rank j) and ``signature`` (a hash of ints, the same in every
    process) of what must match across ranks. Every rank receives every
    rank's signature, so a difference raises :class:`MismatchError` with the
    same message on every rank. Check mode reports the difference in detail.
    """
    k = len(rows[0])
    received, odd = _signed_rows(c, "Alltoall", [v for row in rows for v in (*row, signature)], k, what)
    if odd:
        raise MismatchError(
            f"{what}: ranks 0 and {odd} disagree on the dtype, the number of dimensions, the axes, the split "
            "sizes or the extents that must match; set HPCCOLL_CHECK=1 for a detailed report"
        )
    if _log.isEnabledFor(DEBUG):
        _log.debug(
            "%s: exchanged %d count(s) per pair of ranks over %d ranks (one Alltoall of %d int64 per pair); "
            "received from each rank: %s",
            what,
            k,
            c.size,
            k + 1,
            brief(received),
        )
    return received


def _signed_rows(c: Any, name: str, values: List[int], k: int, what: str) -> Tuple[List[List[int]], int]:
    """Run ``name`` (``Allgather`` or ``Alltoall``) on int64 ``values``: rows of ``k`` ints and a signature each.

    Returns the ``k`` ints received from each rank, and the first rank whose
    signature differs from rank 0's (0 when none does): the same on every
    rank, since every rank receives every rank's signature. ``array('q')``
    buffers: a few times cheaper to build and read than NumPy's at this size.
    """
    width = k + 1
    table = array("q", bytes(8 * width * c.size))
    run(c, name, array("q", values), table, what=f"{what}'s size exchange")
    flat = table.tolist()
    signatures = flat[k::width]
    odd = 0
    if signatures.count(signatures[0]) != len(signatures):
        odd = next(r for r, other in enumerate(signatures) if other != signatures[0])
    return [flat[i : i + k] for i in range(0, len(flat), width)], odd


def exchange_shapes(
    c: Any, shape: Any, values: Sequence[int], what: str, dims: int = MAX_DIMS
) -> List[Tuple[Any, List[int]]]:
    """Every rank's shape and ``k`` ints: ``result[rank] == (shape, values)``.

    One ``Allgather`` of ``1 + k + dims`` int64 per rank (``k`` and ``dims``
    the same on every rank; ``dims=0`` exchanges ``values`` alone): the number
    of dimensions (``-1`` for a rank that has no shape to give,
    ``shape=None``, whose entry is ``None``), ``values`` and the extents,
    padded. ``values`` carry what the caller agrees on (a status,
    a dtype code, a signature).
    """
    k = len(values)
    row = [-1 if shape is None else len(shape), *values, *(shape or ()), *([0] * (dims - len(shape or ())))]
    width = len(row)
    table = array("q", bytes(8 * width * c.size))
    run(c, "Allgather", array("q", row), table, what=f"{what}'s shape exchange")
    flat = table.tolist()
    rows = []
    for i in range(0, len(flat), width):
        ndim = flat[i]
        rows.append((None if ndim < 0 else tuple(flat[i + 1 + k : i + 1 + k + ndim]), flat[i + 1 : i + 1 + k]))
    if _log.isEnabledFor(DEBUG):
        _log.debug(
            "%s: exchanged every rank's shape and %d value(s) over %d ranks (one Allgather of %d int64 per rank): %s",
            what,
            k,
            c.size,
            width,
            brief([r[0] for r in rows]),
        )
    return rows
