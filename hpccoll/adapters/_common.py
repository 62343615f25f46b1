"""What every adapter shares: the shard sizes of an all-gather, argument checks."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import numpy as np

from .._api import COTANGENTS, _axis, _discover, _sizes, split_sizes
from .._comm import Communicator
from .._errors import ArgumentError

__all__ = ["gather_sizes", "scatter_sizes", "check_cotangent"]


def gather_sizes(x: Any, comm: Communicator, axis: int, sizes: Optional[Sequence[int]]) -> Tuple[int, ...]:
    """Every rank's extent of ``x`` along ``axis`` (collective when ``sizes`` is None).

    The backward pass of an all-gather needs the forward's shard sizes; when
    the caller gave none they are discovered here with the same small
    exchange (and signature check) that :func:`hpccoll.all_gather` does, so
    the forward then moves the data without a second exchange.
    """
    if sizes is not None:
        return _sizes(sizes, comm.size)
    ax = _axis(axis, np.ndim(x))
    if comm.size == 1:
        return (int(np.shape(x)[ax]),)
    return _discover(comm, x, ax, "all_gather")


def scatter_sizes(shape: Tuple[int, ...], comm: Communicator, axis: int, sizes: Optional[Sequence[int]]) -> Tuple[int, ...]:
    """The block extents of a reduce-scatter of an array of ``shape`` (local, no communication)."""
    if sizes is not None:
        return _sizes(sizes, comm.size)
    return split_sizes(shape[_axis(axis, len(shape))], comm.size)


def check_cotangent(cotangent: Any) -> str:
    """Validate an all-reduce ``cotangent`` convention."""
    if cotangent not in COTANGENTS:
        raise ArgumentError(f"cotangent: expected 'varying' or 'replicated'; got {cotangent!r}")
    return cotangent
