"""Array-module helpers: NumPy always, CuPy only when the caller passes CuPy arrays."""

from __future__ import annotations

import functools
import math
import operator
import sys
from typing import TYPE_CHECKING, Any, Optional, Sequence, Set, Tuple, TypeVar, Union

import numpy as np

from ._errors import ArgumentError

if TYPE_CHECKING:  # CuPy is optional: never imported at run time here
    import cupy

__all__ = [
    "Array",
    "ArrayT",
    "SEQUENCES",
    "as_array",
    "is_array_type",
    "list_types",
    "check_list_items",
    "module_of",
    "flat",
    "overlaps",
    "prod",
    "shape_of",
    "split_sizes",
    "axis_of",
    "plain_total",
    "sizes_of",
]

#: An array hpccoll moves: a ``numpy.ndarray`` or a ``cupy.ndarray``. The collectives also take
#: NumPy array-likes (scalars, lists of numbers), which they turn into NumPy arrays.
Array = Union[np.ndarray, "cupy.ndarray"]

#: The result of a collective has the form of its argument: an array for an array, a list of arrays
#: for a list (or tuple). A collective typed ``(x: ArrayT) -> ArrayT`` says so. CuPy ships no type
#: information, so to a type checker ``cupy.ndarray`` is ``Any``: CuPy results are ``Any``, and a list
#: of numbers (one array-like, at run time) or of NumPy scalars (the list form) is taken for the list form.
ArrayT = TypeVar("ArrayT", Sequence[Array], Array)

#: The sequence types of the list form (exactly these: a subclass such as a named tuple is one array-like).
SEQUENCES = (list, tuple)
_NDARRAY_ONLY = frozenset((np.ndarray,))
_ARRAY_TYPES = (np.ndarray, np.generic)


def is_array_type(t: type) -> bool:
    """Whether an item of type ``t`` is an array to the list form: a NumPy array (0-D included), a NumPy
    scalar (``numpy.float32(1)``: a 0-D array of its dtype) or a CuPy array (known by its module, unimported)."""
    return issubclass(t, _ARRAY_TYPES) or t.__module__.startswith("cupy")


def list_types(x: Any) -> Optional[Set[type]]:
    """The types of ``x``'s items when ``x`` is the list form, else ``None`` (one array or array-like).

    The rule, the one place it is decided: a list or tuple is the list form (the coalesced form: one
    result per item) when any of its items is an array (:func:`is_array_type`), and every item must
    then be one (:func:`check_list_items`, where the list is surveyed, raises for a list that mixes
    arrays with Python numbers or nested lists). A list or tuple of Python numbers (nested lists of
    them included) holds no array: it is one array-like, as ``numpy.asarray`` reads it. An empty list
    is the list form (an empty list back). Decided once per type, not once per item.
    """
    if type(x) not in SEQUENCES:
        return None
    types = set(map(type, x))
    if types <= _NDARRAY_ONLY or any(map(is_array_type, types)):
        return types
    return None


def check_list_items(xs: Sequence[Any], types: Set[type], name: str = "x") -> None:
    """Raise :class:`ArgumentError` naming the first item of the list form ``xs`` that is not an array
    (``types``: :func:`list_types`'s). A list of array-likes alone (no array: a caller that takes each
    item as an array-like of its own) passes."""
    if types <= _NDARRAY_ONLY or all(map(is_array_type, types)) or not any(map(is_array_type, types)):
        return
    i, item = next((i, v) for i, v in enumerate(xs) if not is_array_type(type(v)))
    j = next(j for j, v in enumerate(xs) if is_array_type(type(v)))
    raise ArgumentError(
        f"{name}[{i}]: expected an array (NumPy or CuPy, 0-D arrays and NumPy scalars included), as {name}[{j}] "
        f"is: a list holding arrays is the list form, one result per item; got {type(item).__name__} (wrap it "
        f"in numpy.asarray for the list form; a list of Python numbers alone is one array)"
    )


def as_array(x: Any, name: str = "x") -> Tuple[Any, str]:
    """Return ``(array, kind)`` with kind ``"numpy"`` or ``"cupy"``.

    NumPy arrays and CuPy arrays pass through untouched; other array-likes
    (scalars, lists of numbers) become NumPy arrays.
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


#: Product of a tuple of ints (1 for an empty tuple).
prod = math.prod


def shape_of(name: str, shape: Any) -> Tuple[int, ...]:
    """``shape`` (a sequence of non-negative ints) as a tuple; :class:`ArgumentError` naming ``name`` otherwise."""
    try:
        dims = tuple(operator.index(n) for n in shape)
    except TypeError:
        raise ArgumentError(f"{name}: expected a sequence of non-negative ints; got {shape!r}") from None
    if any(n < 0 for n in dims):
        raise ArgumentError(f"{name}: expected non-negative extents; got {dims}")
    return dims


def axis_of(axis: Any, ndim: int, name: str = "axis", joins: bool = False, array: str = "x") -> int:
    """``axis`` normalised to ``[0, ndim)``; :class:`ArgumentError` naming it (``name``) otherwise.

    ``joins``: the axis an all-gather concatenates along (its 0-D message says so); ``array``: the
    array's name in the 0-D message (``x[i]`` for an item of a list form).
    """
    if type(axis) is int and -ndim <= axis < ndim:  # the common case, fast
        return axis % ndim
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise ArgumentError(f"{name}: expected an int; got {type(axis).__name__} {axis!r}")
    if ndim == 0 and joins:
        raise ArgumentError(
            f"{array}: expected an array with at least 1 dimension to concatenate along {name}; got a 0-D array "
            "(all_gather joins the shards along an existing axis: pass numpy.atleast_1d(x), or x[None] to stack them)"
        )
    if ndim == 0:
        raise ArgumentError(
            f"{array}: expected an array with at least 1 dimension to split along {name}; got a 0-D array"
        )
    if not -ndim <= axis < ndim:
        raise ArgumentError(f"{name}: expected an int in [{-ndim}, {ndim - 1}] for a {ndim}-D array; got {axis}")
    return int(axis) % ndim


def plain_total(sizes: Any, parts: int) -> int:
    """``sum(sizes)`` when ``sizes`` is a list or tuple of ``parts`` non-negative Python ints, else -1 (one pass)."""
    if type(sizes) not in SEQUENCES or len(sizes) != parts:
        return -1
    total = 0
    for s in sizes:
        if type(s) is not int or s < 0:
            return -1
        total += s
    return total


def sizes_of(sizes: Any, parts: int, name: str = "sizes") -> Tuple[int, ...]:
    """``sizes`` as a tuple of ``parts`` non-negative ints; :class:`ArgumentError` otherwise."""
    if plain_total(sizes, parts) >= 0:  # already plain: no checks owed
        return tuple(sizes)
    try:
        vals = tuple(map(operator.index, sizes))
    except TypeError:
        raise ArgumentError(f"{name}: expected a sequence of {parts} non-negative ints; got {sizes!r}") from None
    if len(vals) != parts or (vals and min(vals) < 0):
        raise ArgumentError(f"{name}: expected {parts} non-negative ints (one per rank); got {list(vals)}")
    return vals


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
