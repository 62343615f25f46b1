"""The size exchange: every rank's extents along the gather axis, in one small ``Allgather``."""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import numpy as np

from ._errors import MismatchError
from ._faults import run

__all__ = ["exchange_extents"]


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
