"""Control-plane exchanges over MPI: the watched call, pickled agreement and the size exchange.

Every transport's setup and every collective's agreement step (check mode,
``sizes=None`` discovery) talk over the communicator's private MPI duplicate,
whatever transport then moves the data. These are the only MPI collectives
outside the transports' own modules, and they live here, in the transport
package, beside them.
"""

from __future__ import annotations

from typing import Any, Callable, List, Sequence, Tuple

import numpy as np

from .._errors import MismatchError
from .._faults import watched

__all__ = ["guarded", "run", "allgather_object", "exchange_extents", "exchange_rows"]


def guarded(comm: Any, what: str, call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)``, watched as ``what`` when ``comm.timeout`` is set (``HPCCOLL_TIMEOUT``).

    ``comm`` is a :class:`~hpccoll.Communicator` (``mpi``, ``rank``, ``size``, ``timeout``).
    """
    if comm.timeout is None:
        return call(*args)
    return watched(comm, what, call, *args)


def run(comm: Any, name: str, *args: Any, what: str = "") -> None:
    """``comm.mpi.<name>(*args)`` (an mpi4py buffer collective), watched like :func:`guarded`."""
    guarded(comm, what or f"MPI_{name}", getattr(comm.mpi, name), *args)


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
    signature = hash(tuple(
        (ord(a.dtype.char), a.dtype.itemsize, a.ndim, ax) + a.shape[:ax] + a.shape[ax + 1 :]
        for a, ax in zip(arrays, axes)
    ))
    mine = np.array([*(a.shape[ax] for a, ax in zip(arrays, axes)), signature], dtype=np.int64)
    table = np.empty((c.size, k + 1), dtype=np.int64)
    run(c, "Allgather", mine, table, what=f"{what}'s size exchange")
    rows = table.tolist()
    for rank, row in enumerate(rows):
        if row[k] != rows[0][k]:
            a = arrays[0]
            have = f"dtype {a.dtype}, shape {a.shape}, axis {axes[0]}" if k == 1 else f"{k} arrays"
            raise MismatchError(
                f"{what}: ranks 0 and {rank} disagree on the dtype, the number of dimensions or the extents "
                f"other than along the gather axis (this rank has {have}); set HPCCOLL_CHECK=1 for a detailed "
                "report"
            )
    return list(zip(*rows))[:k]


def exchange_rows(c: Any, rows: Sequence[Sequence[int]], signature: int, what: str) -> List[Tuple[int, ...]]:
    """What every rank addressed to this one: ``result[r]`` is rank r's ``rows[this rank]``.

    One ``Alltoall`` of ``k + 1`` int64 per pair of ranks: ``rows[j]`` (``k``
    ints for rank j) and ``signature`` (a hash of ints, the same in every
    process) of what must match across ranks. Every rank receives every
    rank's signature, so a difference raises :class:`MismatchError` with the
    same message on every rank. Check mode reports the difference in detail.
    """
    k = len(rows[0])
    send = np.empty((c.size, k + 1), dtype=np.int64)
    send[:, :k] = rows
    send[:, k] = signature
    table = np.empty_like(send)
    run(c, "Alltoall", send, table, what=f"{what}'s size exchange")
    signatures = table[:, k].tolist()
    for rank, other in enumerate(signatures):
        if other != signatures[0]:
            raise MismatchError(
                f"{what}: ranks 0 and {rank} disagree on the dtype, the number of dimensions, the axes, the split "
                "sizes or the extents that must match; set HPCCOLL_CHECK=1 for a detailed report"
            )
    return [tuple(row) for row in table[:, :k].tolist()]
