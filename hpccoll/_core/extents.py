"""Every rank's extents for a pair's ``bind`` (:mod:`hpccoll._spec`): learned, or assumed while tracing.

A gather's or a scatter's ``sizes=None`` (an all-to-all's ``recv_sizes=None``)
is learned with the collective's own small exchange when an adapter binds a
pair to an array. While a framework traces without values (JAX under
``jit``), nothing may communicate: ``bind`` then assumes this rank's extents
are every rank's and returns a check, run with the collective, that raises
:class:`~hpccoll.MismatchError` on every rank where they are not.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

from .._arrays import axis_of, sizes_of
from .._errors import MismatchError
from ..transports._control import exchange_extents, exchange_shapes

__all__ = ["TRACING", "extents", "every_extent", "every_rank", "gathered_sizes"]

#: How a message says why an extent was assumed.
TRACING = (
    "while JAX traces without values (jax.jit, jax.vmap, lax control flow), where the result's shape is "
    "taken from this rank's"
)

Verify = Optional[Callable[[], None]]


def extents(c: Any, meta: Any, ax: int, what: str) -> Tuple[int, ...]:
    """Every rank's extent of ``meta`` (``shape``, ``ndim``, ``dtype``) along ``ax`` (one small exchange).

    The exchange also checks that the dtypes and the other extents agree, as the collective ``what`` does.
    """
    return every_extent(c, (meta,), (ax,), what)[0]


def every_extent(c: Any, metas: Sequence[Any], axes: Sequence[int], what: str) -> List[Tuple[int, ...]]:
    """Every rank's extent of each of ``metas`` along its axis, ``result[i][rank]`` (one small exchange for all).

    The exchange also checks that the dtypes and the other extents agree, as the collective ``what`` does.
    """
    if c.size == 1:
        return [(int(m.shape[ax]),) for m, ax in zip(metas, axes)]
    return exchange_extents(c, metas, axes, what)


def every_rank(c: Any, row: Sequence[int], what: str) -> List[List[int]]:
    """Every rank's ``row`` of ints: ``table[q]`` is rank q's (collective: one small all-gather)."""
    return [values for _, values in exchange_shapes(c, None, row, what, dims=0)]


def gathered_sizes(
    meta: Any, c: Any, axis: Any, sizes: Any, tracing: bool, what: str
) -> Tuple[int, Tuple[int, ...], Verify]:
    """A gather's axis, every rank's extent along it, and the check of what ``tracing`` assumed (or None).

    ``sizes=None`` while ``tracing``: every rank's extent is taken to be this
    rank's, checked when the collective runs.
    """
    ax = axis_of(axis, meta.ndim, joins=True)
    if sizes is not None:
        return ax, sizes_of(sizes, c.size), None
    if not tracing:
        return ax, extents(c, meta, ax, what), None
    n = int(meta.shape[ax])

    def verify() -> None:
        found = [row[0] for row in every_rank(c, (n,), what)]
        if len(set(found)) > 1:  # every rank holds the same table: the same verdict and message everywhere
            raise MismatchError(
                f"{what}: expected every rank's extent along axis {ax} to be the same with sizes=None {TRACING}; "
                f"got extents {found}: pass sizes={found}"
            )

    return ax, (n,) * c.size, verify if c.size > 1 else None
