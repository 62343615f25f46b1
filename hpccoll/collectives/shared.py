"""Node-shared results: ``all_gather(x, out="shared")`` and ``all_reduce(x, out="shared")``.

Both validate like the private collectives (raising before any rank touches
shared memory; in check mode the same error on every rank), then hand over
to the communicator's :class:`~hpccoll.transports.shm.SharedMemory`, which
serves every communicator whose ranks can share memory within their nodes,
whatever transport ``auto`` picks for private arrays. The arrays handed out
are read-only and never change while any view of them is alive (see
docs/shm.md for the lifetime rule).
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Sequence

import numpy as np

from .._arrays import as_array, flat
from .._core.agree import all_gather_desc, all_reduce_desc, settle
from .._core.blocks import with_extent
from .._core.launch import done
from .._core.validate import axis_of, own_sizes
from .._dtypes import check_dtype, normalize_op, reduce_plan
from .._errors import ArgumentError, HpccollError
from .._layout import as_wire
from ..transports._control import exchange_extents
from ..transports.shm import SHARED, holder_of
from . import all_gather, all_reduce

__all__ = ["shared_all_gather", "shared_all_reduce"]


def _exclusive(x: Any) -> bool:
    """Whether ``x`` is a shard from ``shared_empty`` with no other view of it alive on this rank.

    Every view of a shard has the shard's private anchor array as its ``base``,
    so the anchor's reference count is the number of live views: 2 here means
    ``x`` alone (plus ``getrefcount``'s own argument).
    """
    return holder_of(x) is not None and sys.getrefcount(x.base) <= 2


def _shared_input(x: Any, out: Any) -> np.ndarray:
    """``x`` as a NumPy array for a shared-result collective, after checking ``out``."""
    if out != SHARED:
        raise ArgumentError(f"out: expected an array, None or {SHARED!r}; got {out!r}")
    x, kind = as_array(x)
    if kind != "numpy":
        raise ArgumentError(
            f"out={SHARED!r}: expected a NumPy array x (node-shared memory is host memory); got a CuPy array"
        )
    check_dtype(x.dtype)
    return x


def shared_all_gather(
    x: Any, c: Any, axis: Any, sizes: Optional[Sequence[int]], out: Any, what: str, async_op: bool
) -> Any:
    """``all_gather(x, c, axis=axis, sizes=sizes, out="shared")``: one read-only node-shared result.

    Zero copy when ``x`` is this rank's array from ``shared_empty`` (every rank
    alike, gathered along its first non-trivial axis, on one node, with no
    other view of it alive): the result is the shards' own memory, and the
    shards become read-only for good (a view never changes under a rank that
    holds it). Otherwise each rank copies its block into a new shared result.
    """
    exclusive = _exclusive(x)  # first: before anything here holds a view of x
    err = desc = None
    ax = 0
    try:
        x = _shared_input(x, out)
        ax = axis_of(axis, x.ndim, joins=True)
        if sizes is not None:
            sizes = own_sizes(sizes, c, x.shape[ax], f"x.shape[{ax}]")
        if c.check:
            desc = all_gather_desc(x, ax, sizes, SHARED)
    except HpccollError as exc:
        err = exc
    settle(c, what, desc, None, err)
    if sizes is None:
        sizes = exchange_extents(c, (x,), (ax,), what)[0]
    t = c.shared_transport()
    shape = with_extent(x.shape, ax, sum(sizes))
    if not t.gathers_shared(shape, ax):
        result = t.publish_shared(all_gather.all_gather(x, c, ax, sizes, None, what, False))
    else:
        result = t.gather_shared(x, shape, ax, sizes, exclusive)
    return done(result, async_op)


def shared_all_reduce(x: Any, c: Any, op: Any, out: Any, what: str, async_op: bool) -> Any:
    """``all_reduce(x, c, op=op, out="shared")``: one read-only node-shared result, the same on every rank.

    Each rank reduces its block straight into the result (reading the others'
    inputs in shared memory); 16-bit floats (widened to float32 on the wire)
    are reduced privately, then published.
    """
    err = desc = None
    try:
        x = _shared_input(x, out)
        op = normalize_op(op)
        reduce_plan(x.dtype, op)  # raises for an unsupported (dtype, op) before any communication
        if c.check:
            desc = all_reduce_desc(x, op, SHARED)
    except HpccollError as exc:
        err = exc
    settle(c, what, desc, None, err)
    t = c.shared_transport()
    plan = reduce_plan(x.dtype, op, frozenset(), t.saturates, t.reduce_ops)
    if plan.widen:
        result = t.publish_shared(all_reduce.all_reduce(x, c, op, None, what, False))
    else:
        send = as_wire(flat(x, np), plan.wire)
        result = t.reduce_shared(send, plan.op, c.size if plan.divide else 1, x.shape, x.dtype)
    return done(result, async_op)
