"""Array-module helpers: NumPy always, CuPy only when the caller passes CuPy arrays."""

from __future__ import annotations

import functools
import operator
import sys
from typing import TYPE_CHECKING, Any, Sequence, Tuple, TypeVar, Union

import numpy as np

from ._errors import ArgumentError

if TYPE_CHECKING:  # CuPy is optional: never imported at run time here
    import cupy

__all__ = [
    "Array",
    "ArrayOrList",
    "ArrayT",
    "as_array",
    "module_of",
    "flat",
    "overlaps",
    "prod",
    "shape_of",
    "split_sizes",
]

#: An array hpccoll moves: a ``numpy.ndarray`` or a ``cupy.ndarray``. The collectives also take
#: NumPy array-likes (lists of numbers, scalars), which they turn into NumPy arrays.
Array = Union[np.ndarray, "cupy.ndarray"]

#: The argument of a collective: one array, or a list (or tuple) of arrays for the coalesced form.
ArrayOrList = Union[Array, Sequence[Array]]

#: The result of a collective has the form of its argument: an array for an array, a list of arrays
#: for a list (or tuple). A collective typed ``(x: ArrayT) -> ArrayT`` says so. CuPy ships no type
#: information, so to a type checker ``cupy.ndarray`` is ``Any``: CuPy results are ``Any``, and a list
#: of numbers (an array-like, at run time) is taken for the list form.
ArrayT = TypeVar("ArrayT", Sequence[Array], Array)


def as_array(x: Any, name: str = "x") -> Tuple[Any, str]:
    """Return ``(array, kind)`` with kind ``"numpy"`` or ``"cupy"``.

    NumPy arrays and CuPy arrays pass through untouched; other array-likes
    (lists, scalars) become NumPy arrays.
    """
    if isinstance(x, np.ndarray):
        return x, "numpy"
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        return x, "cupy"
    try:
        arr = np.asarray(x)
    except Exception as exc:  # e.g. ragged nested lists
        raise ArgumentError(f"{name}: expected an array; got {type(x).__name__} ({exc})") from None
    if arr.dtype == object:
        raise ArgumentError(f"{name}: expected a numeric array; got {type(x).__name__} of Python objects")
    return arr, "numpy"


def module_of(kind: str) -> Any:
    """The array module for ``kind``."""
    if kind == "numpy":
        return np
    import cupy

    return cupy


def flat(x: Any, xp: Any) -> Any:
    """A 1-D C-contiguous view of ``x``, copying only when ``x`` is not C-contiguous."""
    if not x.flags.c_contiguous:
        x = xp.ascontiguousarray(x)
    return x if x.ndim == 1 else x.reshape(-1)


def overlaps(a: Any, b: Any, xp: Any) -> bool:
    """Whether ``a`` and ``b`` share memory.

    NumPy: exactly (within a work bound). CuPy: by bounds, which is exact when
    both are contiguous; interleaved views (e.g. ``z[::2]`` and ``z[1::2]``)
    get CuPy's exact test, which runs a kernel and waits for it.
    """
    if xp is np:
        if not np.may_share_memory(a, b):
            return False
        try:
            # numpy's stub allows max_work -1 or 0 only; the function takes any work bound
            return bool(np.shares_memory(a, b, max_work=10_000))  # type: ignore[arg-type]
        except Exception:  # numpy's TooHardError: assume the worst
            return True
    if not xp.may_share_memory(a, b):
        return False
    if _contiguous(a) and _contiguous(b):
        return True
    return bool(xp.shares_memory(a, b))


def _contiguous(a: Any) -> bool:
    return a.flags.c_contiguous or a.flags.f_contiguous


def prod(dims: Any) -> int:
    """Product of a tuple of ints (1 for an empty tuple)."""
    p = 1
    for d in dims:
        p *= d
    return p


def shape_of(name: str, shape: Any) -> Tuple[int, ...]:
    """``shape`` (a sequence of non-negative ints) as a tuple; :class:`ArgumentError` naming ``name`` otherwise."""
    try:
        dims = tuple(operator.index(n) for n in shape)
    except TypeError:
        raise ArgumentError(f"{name}: expected a sequence of non-negative ints; got {shape!r}") from None
    if any(n < 0 for n in dims):
        raise ArgumentError(f"{name}: expected non-negative extents; got {dims}")
    return dims


@functools.lru_cache(maxsize=1024)
def split_sizes(n: int, parts: int) -> Tuple[int, ...]:
    """Extents of ``numpy.array_split(range(n), parts)``: the first ``n % parts`` get one more.

    Parameters
    ----------
    n : int
        The extent to split (>= 0).
    parts : int
        The number of blocks (>= 1), usually the number of ranks.

    Returns
    -------
    tuple of int
        ``parts`` block extents, summing to ``n``.

    Examples
    --------
    >>> split_sizes(10, 4)
    (3, 3, 2, 2)
    """
    q, r = divmod(n, parts)
    return tuple(q + (i < r) for i in range(parts))
