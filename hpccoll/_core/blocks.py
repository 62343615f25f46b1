"""Shapes, blocks and pointers: where a rank's block lies, and when a call is the in-place layout.

The in-place rule lives here, once for every collective: :func:`is_in_place`
recognises the layout (``same_block``-exact, ``out is x`` included),
:func:`in_place_test` hands it to :func:`~hpccoll._core.validate.check_out`,
and :func:`in_place_send` decides what to send once ``out`` was accepted
(nothing, in place; or a copy first when the transport cannot).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence, Tuple, Union

import numpy as np

from ..transports._mpitypes import buffer_address

if TYPE_CHECKING:
    from types import EllipsisType

__all__ = [
    "ALL",
    "may_share",
    "shape_without",
    "with_extent",
    "block",
    "own_block",
    "address",
    "same_block",
    "is_in_place",
    "in_place_test",
    "in_place_send",
]

_ndarray = np.ndarray
#: The whole array, any ndim (0-D included): all-reduce's in-place "block".
ALL = Ellipsis
#: ``numpy.may_share_memory`` for exact ``numpy.ndarray`` arguments, without the ``__array_function__``
#: dispatch (half the cost; the common-case branches' overlap test).
may_share = getattr(np.may_share_memory, "_implementation", np.may_share_memory)


def shape_without(shape: Tuple[int, ...], ax: int) -> Tuple[int, ...]:
    """``shape`` without axis ``ax``."""
    return shape[:ax] + shape[ax + 1 :]


def with_extent(shape: Tuple[int, ...], ax: int, n: int) -> Tuple[int, ...]:
    """``shape`` with extent ``n`` along axis ``ax``."""
    return shape[:ax] + (n,) + shape[ax + 1 :]


def block(ax: int, start: int, stop: int) -> tuple:
    """The index of ``[start, stop)`` along axis ``ax``."""
    return (slice(None),) * ax + (slice(start, stop),)


def own_block(ax: int, sizes: Sequence[int], rank: int) -> tuple:
    """The index of rank ``rank``'s block along ``ax`` when blocks have extents ``sizes``."""
    start = sum(sizes[:rank])
    return block(ax, start, start + sizes[rank])


def address(a: Any) -> int:
    """The address of ``a``'s first element (NumPy or CuPy)."""
    if type(a) is _ndarray:
        if a.size:
            try:
                return buffer_address(a)
            except (ValueError, BufferError):  # not contiguous
                pass
        return a.__array_interface__["data"][0]
    return a.data.ptr


def same_block(part: Any, whole: Any, where: Union[Tuple[Any, ...], EllipsisType]) -> bool:
    """Whether ``part`` is exactly the view ``whole[where]`` (same address, shape and strides)."""
    if type(part) is not type(whole) or part.dtype != whole.dtype:
        return False
    view = whole[where]
    return part.shape == view.shape and part.strides == view.strides and address(part) == address(view)


def is_in_place(out: Any, x: Any, where: Union[Tuple[Any, ...], EllipsisType], out_is_whole: bool = False) -> bool:
    """Whether ``out`` and ``x`` are exactly a collective's in-place layout.

    ``out_is_whole``: ``x`` is ``out[where]`` (all-gather, gather: this rank's
    block of the result); otherwise ``out`` is ``x[where]`` (reduce-scatter:
    this rank's block of the input; all-reduce, reduce: :data:`ALL`, ``out``
    is ``x``).
    """
    if out is x and where is ALL:
        return True
    return same_block(x, out, where) if out_is_whole else same_block(out, x, where)


def in_place_test(
    x: Any, where: Union[Tuple[Any, ...], EllipsisType], out_is_whole: bool = False
) -> Callable[[Any], bool]:
    """:func:`~hpccoll._core.validate.check_out`'s ``in_place``: :func:`is_in_place` for ``x`` and ``where``."""
    return lambda out: is_in_place(out, x, where, out_is_whole)


def in_place_send(
    x: Any, out: Any, xp: Any, where: Union[Tuple[Any, ...], EllipsisType], can: bool, out_is_whole: bool = False
) -> Tuple[Any, bool]:
    """What to send once ``check_out`` accepted ``out``: ``(x, in_place)``.

    ``(x, False)`` when ``out`` is separate from ``x``; ``(x, True)`` when it
    is exactly the in-place layout and ``can`` (the transport has the
    in-place form and the buffers' layout allows it); otherwise a copy of
    ``x`` is sent (MPI forbids aliased buffers).
    """
    if out is not x and not xp.may_share_memory(out, x):
        return x, False
    if can and is_in_place(out, x, where, out_is_whole):
        return x, True
    return x.copy(), False
