"""What every adapter shares: the shard sizes of the gathers, scatters and all-to-all, argument checks, and
each collective's pair of maps (forward, adjoint) bound from :data:`hpccoll._api.PAIR` (the halo exchange's too)."""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Sequence, Tuple

import numpy as np

from .._api import PAIR, all_reduce
from .._arrays import split_sizes
from .._comm import Communicator
from .._core.blocks import with_extent
from .._core.validate import axis_of, block_sizes, cotangent_of, sizes_of
from .._operators import _extents
from ..collectives.alltoall import own_recv_sizes, recv_extents
from ..collectives.halo import corners_of, halo_of
from ..collectives.rooted import root_of
from ..collectives.shift import offset_of

__all__ = [
    "gather_sizes",
    "scatter_sizes",
    "all_gather_maps",
    "reduce_scatter_maps",
    "all_reduce_maps",
    "all_to_all_sizes",
    "all_to_all_maps",
    "replicate_maps",
    "root_of",
    "root_scatter_sizes",
    "broadcast_maps",
    "reduce_maps",
    "gather_maps",
    "scatter_maps",
    "halo_exchange_maps",
    "shift_maps",
]

#: A collective as the adapters see it: (forward, adjoint), each a function of one array.
Maps = Tuple[Callable[[Any], Any], Callable[[Any], Any]]


def gather_sizes(
    x: Any, comm: Communicator, axis: int, sizes: Optional[Sequence[int]], what: str = "all_gather"
) -> Tuple[int, ...]:
    """Every rank's extent of ``x`` along ``axis`` (collective when ``sizes`` is None).

    The backward pass of an all-gather (or a gather, ``what``) needs the
    forward's shard sizes; when the caller gave none they are discovered here
    with the same small exchange (and signature check) that
    :func:`hpccoll.all_gather` does, so the forward then moves the data
    without a second exchange. ``x`` needs only ``shape``, ``ndim`` and ``dtype``.
    """
    if sizes is not None:
        return sizes_of(sizes, comm.size)
    return _extents(comm, (x,), (axis_of(axis, np.ndim(x)),), what)[0]


def root_scatter_sizes(
    x: Any, comm: Communicator, root: int, axis: int, sizes: Optional[Sequence[int]]
) -> Tuple[int, ...]:
    """The block extents of a scatter from ``root`` (collective when ``sizes`` is None).

    ``sizes=None`` splits root's extent along ``axis`` like
    ``numpy.array_split``; the other ranks learn it here with one small
    exchange (which also checks that the dtypes and the other extents agree),
    so that the backward pass gathers with the same sizes. ``x`` needs only
    ``shape``, ``ndim`` and ``dtype``.
    """
    if sizes is not None:
        return sizes_of(sizes, comm.size)
    return split_sizes(gather_sizes(x, comm, axis, None, "scatter")[root], comm.size)


def scatter_sizes(
    shape: Tuple[int, ...], comm: Communicator, axis: int, sizes: Optional[Sequence[int]]
) -> Tuple[int, ...]:
    """The block extents of a reduce-scatter of an array of ``shape`` (local, no communication)."""
    if sizes is not None:
        return sizes_of(sizes, comm.size)
    return split_sizes(shape[axis_of(axis, len(shape))], comm.size)


def all_gather_maps(comm: Communicator, axis: int, sizes: Tuple[int, ...]) -> Maps:
    """All-gather and its adjoint with the same (resolved) ``sizes``."""
    return PAIR["all_gather"].bind(comm=comm, axis=axis, sizes=sizes)


def reduce_scatter_maps(comm: Communicator, op: Any, axis: int, sizes: Tuple[int, ...]) -> Maps:
    """Reduce-scatter and its adjoint (which raises for the non-linear ops)."""
    return PAIR["reduce_scatter"].bind(comm=comm, op=op, axis=axis, sizes=sizes)


def all_reduce_maps(comm: Communicator, op: Any, cotangent: str) -> Maps:
    """All-reduce and its adjoint under the ``cotangent`` convention (validated here)."""
    return PAIR["all_reduce"].bind(comm=comm, op=op, cotangent=cotangent_of(cotangent))


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


def broadcast_maps(comm: Communicator, root: int) -> Maps:
    """Broadcast from ``root`` and its adjoint (the sum over ranks, to root; zeros elsewhere)."""
    return PAIR["broadcast"].bind(comm=comm, root=root)


def reduce_maps(comm: Communicator, op: Any, root: int) -> Maps:
    """Reduce to ``root`` and its adjoint (root's cotangent broadcast; it raises for the non-linear ops)."""
    return PAIR["reduce"].bind(comm=comm, op=op, root=root)


def gather_maps(comm: Communicator, root: int, axis: int, sizes: Tuple[int, ...]) -> Maps:
    """Gather to ``root`` and its adjoint (the scatter of root's cotangent) with the same (resolved) ``sizes``."""
    return PAIR["gather"].bind(comm=comm, root=root, axis=axis, sizes=sizes)


def scatter_maps(comm: Communicator, root: int, axis: int, sizes: Tuple[int, ...], extent: int) -> Maps:
    """Scatter from ``root`` and its adjoint (the gather to root) with the same (resolved) ``sizes``.

    ``extent`` is this rank's extent of the scatter's input along ``axis``. On
    a rank other than root it may be anything (the scatter reads only root's
    data), while the gather gives such a rank an empty array: the adjoint then
    gives zeros of ``extent`` instead, the cotangent's shape that the
    frameworks require (the scatter does not depend on those values).
    """
    forward, adjoint = PAIR["scatter"].bind(comm=comm, root=root, axis=axis, sizes=sizes)
    if comm.rank == root or extent == 0:
        return forward, adjoint
    return forward, functools.partial(_gather_as, comm=comm, root=root, axis=axis, sizes=sizes, extent=extent)


def _gather_as(
    y: Any, comm: Communicator, *, root: int, axis: int, sizes: Tuple[int, ...], extent: int, out: Any = None
) -> Any:
    """``scatter_adjoint(y)`` on a rank other than root, whose input had ``extent`` along ``axis``: zeros of it."""
    got = PAIR["scatter"].adjoint(y, comm, root=root, axis=axis, sizes=sizes)  # the gather, empty here
    shape = with_extent(tuple(got.shape), axis_of(axis, got.ndim), extent)
    if out is None:
        return np.zeros_like(got, shape=shape)  # NumPy or CuPy, as got (__array_function__)
    out[...] = 0
    return out


def halo_exchange_maps(comm: Communicator, halo: Any, corners: Any) -> Maps:
    """Halo exchange on ``comm``'s process grid and its adjoint, with the same ``halo`` and ``corners``.

    Both maps are linear and keep the array's shape; the adjoint adds each
    filled ghost's cotangent into the owned cell it came from (on the
    neighbour that owns it) and zeroes that ghost. The arguments are checked
    here, locally, before anything is traced or communicates: ``comm`` must
    have a Cartesian grid (:meth:`hpccoll.Communicator.cartesian`), ``halo``
    be one width >= 0 or one per grid axis, ``corners`` a bool. What depends
    on the arrays (their dimensions, a halo wider than a neighbour's owned
    cells, the ranks' agreement) is checked by the exchange itself, on every
    rank alike.
    """
    widths = halo_of(halo, len(comm.grid.dims))  # comm.grid: ArgumentError naming comm without a grid
    return PAIR["halo_exchange"].bind(comm=comm, halo=widths, corners=corners_of(corners))


def replicate_maps(comm: Communicator) -> Maps:
    """Identity, whose adjoint (replicated value counted once) is the all-reduce with sum."""
    return _identity, functools.partial(all_reduce, comm=comm, op="sum")


def _identity(a: Any) -> Any:
    return a


def shift_maps(comm: Communicator, offset: Any) -> Maps:
    """The shift by ``offset`` (checked here: an int) on ``comm`` and its adjoint, the shift back."""
    return PAIR["shift"].bind(comm=comm, offset=offset_of(offset))
