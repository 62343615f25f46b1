"""What every adapter shares: the shard sizes of an all-gather and of an all-to-all, argument checks."""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Sequence, Tuple

import numpy as np

from .._api import PAIR, all_reduce
from .._arrays import split_sizes
from .._comm import Communicator
from .._core.validate import COTANGENTS, axis_of, block_sizes, sizes_of
from .._errors import ArgumentError
from ..collectives.alltoall import own_recv_sizes, recv_extents
from ..transports._control import exchange_extents

__all__ = [
    "gather_sizes",
    "scatter_sizes",
    "check_cotangent",
    "all_gather_maps",
    "reduce_scatter_maps",
    "all_reduce_maps",
    "all_to_all_sizes",
    "all_to_all_maps",
    "replicate_maps",
]

#: A collective as the adapters see it: (forward, adjoint), each a function of one array.
Maps = Tuple[Callable[[Any], Any], Callable[[Any], Any]]


def gather_sizes(x: Any, comm: Communicator, axis: int, sizes: Optional[Sequence[int]]) -> Tuple[int, ...]:
    """Every rank's extent of ``x`` along ``axis`` (collective when ``sizes`` is None).

    The backward pass of an all-gather needs the forward's shard sizes; when
    the caller gave none they are discovered here with the same small
    exchange (and signature check) that :func:`hpccoll.all_gather` does, so
    the forward then moves the data without a second exchange.
    """
    if sizes is not None:
        return sizes_of(sizes, comm.size)
    ax = axis_of(axis, np.ndim(x))
    if comm.size == 1:
        return (int(np.shape(x)[ax]),)
    return exchange_extents(comm, (x,), (ax,), "all_gather")[0]


def scatter_sizes(
    shape: Tuple[int, ...], comm: Communicator, axis: int, sizes: Optional[Sequence[int]]
) -> Tuple[int, ...]:
    """The block extents of a reduce-scatter of an array of ``shape`` (local, no communication)."""
    if sizes is not None:
        return sizes_of(sizes, comm.size)
    return split_sizes(shape[axis_of(axis, len(shape))], comm.size)


def check_cotangent(cotangent: Any) -> str:
    """Validate an all-reduce ``cotangent`` convention."""
    if cotangent not in COTANGENTS:
        raise ArgumentError(f"cotangent: expected 'varying' or 'replicated'; got {cotangent!r}")
    return cotangent


def all_gather_maps(comm: Communicator, axis: int, sizes: Tuple[int, ...]) -> Maps:
    """All-gather and its adjoint with the same (resolved) ``sizes``."""
    return PAIR["all_gather"].bind(comm=comm, axis=axis, sizes=sizes)


def reduce_scatter_maps(comm: Communicator, op: Any, axis: int, sizes: Tuple[int, ...]) -> Maps:
    """Reduce-scatter and its adjoint (which raises for the non-linear ops)."""
    return PAIR["reduce_scatter"].bind(comm=comm, op=op, axis=axis, sizes=sizes)


def all_reduce_maps(comm: Communicator, op: Any, cotangent: str) -> Maps:
    """All-reduce and its adjoint under the ``cotangent`` convention (validated here)."""
    check_cotangent(cotangent)
    return PAIR["all_reduce"].bind(comm=comm, op=op, cotangent=cotangent)


def all_to_all_sizes(
    x: Any,
    comm: Communicator,
    split_axis: int,
    concat_axis: int,
    sizes: Optional[Sequence[int]],
    recv_sizes: Optional[Sequence[int]],
) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """An all-to-all's split and received extents, resolved (collective when ``recv_sizes`` is None).

    The backward pass splits the cotangent by the forward's received
    extents; when the caller gave none they are learned here with the same
    small exchange :func:`hpccoll.all_to_all` makes, so the forward then
    moves the data without a second one. ``x`` needs only ``shape`` and
    ``dtype``.
    """
    shape = tuple(np.shape(x))
    sa, ca = axis_of(split_axis, len(shape), "split_axis"), axis_of(concat_axis, len(shape), "concat_axis")
    sizes = block_sizes(sizes, shape[sa], comm.size, f"x.shape[{sa}]")
    if recv_sizes is not None:  # checked here, before any tracing or communication, like the core call
        return sizes, own_recv_sizes(recv_sizes, comm, x, sa, ca, sizes, "x")
    return sizes, recv_extents(comm, x, sa, ca, sizes, "all_to_all")


def all_to_all_maps(
    comm: Communicator, split_axis: int, concat_axis: int, sizes: Tuple[int, ...], recv_sizes: Tuple[int, ...]
) -> Maps:
    """All-to-all and its adjoint (the all-to-all back) with the same (resolved) extents."""
    return PAIR["all_to_all"].bind(
        comm=comm, split_axis=split_axis, concat_axis=concat_axis, sizes=sizes, recv_sizes=recv_sizes
    )


def replicate_maps(comm: Communicator) -> Maps:
    """Identity, whose adjoint (replicated value counted once) is the all-reduce with sum."""
    return _identity, functools.partial(all_reduce, comm=comm, op="sum")


def _identity(a: Any) -> Any:
    return a
