"""MPI datatypes, ops and displacements for the MPI transports (mpi4py loaded on first use).

Elementary datatypes come from ``MPI.Datatype.fromcode(dtype.char)``, which is
what :func:`mpi4py.util.dtlib.from_numpy_dtype` uses for them, minus the
``Dup`` dtlib adds: MPI's predefined reduction ops are not defined on
duplicated types. Derived datatypes (inner-axis blocks) are built on these.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Any, Dict, List, Sequence

import numpy as np

__all__ = ["mpi_datatype", "mpi_op", "displacements", "committed", "buffer_address"]

_DATATYPES: Dict[np.dtype, Any] = {}
_OPS: Dict[str, Any] = {}


def mpi_datatype(dtype: np.dtype) -> Any:
    """The predefined MPI datatype for a wire ``dtype`` (cached)."""
    t = _DATATYPES.get(dtype)
    if t is None:
        from mpi4py import MPI

        t = _DATATYPES[dtype] = MPI.Datatype.fromcode(dtype.char)
    return t


def mpi_op(op: str) -> Any:
    """The MPI op for a wire op name (``"in_place"`` gives ``MPI.IN_PLACE``)."""
    if not _OPS:
        from mpi4py import MPI

        _OPS.update(sum=MPI.SUM, prod=MPI.PROD, max=MPI.MAX, min=MPI.MIN, in_place=MPI.IN_PLACE)
    return _OPS[op]


def displacements(counts: Sequence[int]) -> List[int]:
    """Prefix sums of ``counts``, starting at 0."""
    return [0, *accumulate(counts)][:-1]


def committed(vector: Any, extent: int) -> Any:
    """``vector`` resized to ``extent`` bytes and committed (``vector`` itself is freed)."""
    try:
        return vector.Create_resized(0, extent).Commit()
    finally:
        vector.Free()


def buffer_address(a: Any) -> int:
    """The address of a non-empty NumPy array's first element (``MPI.Get_address``: about 0.1 us,
    where ``__array_interface__`` takes about 1 us)."""
    global _get_address
    if _get_address is None:
        from mpi4py import MPI

        _get_address = MPI.Get_address
    return _get_address(a)


_get_address: Any = None
