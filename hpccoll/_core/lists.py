"""The list forms' survey: whether ``x`` is a list of arrays, and its arrays, library, dtypes and shapes."""

from __future__ import annotations

import operator
from typing import Any, List, NamedTuple, Optional, Sequence, Set, Tuple

import numpy as np

from .._arrays import as_array, check_list_items, list_types
from .._dtypes import check_dtype
from .._errors import ArgumentError, HpccollError

__all__ = ["is_array_list", "list_types", "ListOf", "survey_list", "total_bytes"]

_NDARRAY_ONLY = frozenset((np.ndarray,))
_dtype_of = operator.attrgetter("dtype")
_shape_of = operator.attrgetter("shape")
_nbytes_of = operator.attrgetter("nbytes")


def is_array_list(x: Any) -> bool:
    """Whether ``x`` is the list form (:func:`hpccoll._arrays.list_types`: a list or tuple holding arrays)."""
    return list_types(x) is not None


class ListOf(NamedTuple):
    """A list form's arrays, surveyed once at C speed (no per-array Python loop in the common case)."""

    arrays: List[Any]
    kind: str
    dtypes: Set[np.dtype]
    shapes: List[Tuple[int, ...]]
    #: The shape every array has, or ``None`` (arrays of several shapes, or none).
    shape: Optional[Tuple[int, ...]]
    #: Every array has one shape and one dtype: per-array quantities are one value, repeated.
    alike: bool


def survey_list(xs: Sequence[Any], types: Set[type], keep: bool = False) -> ListOf:
    """A list form's arrays, their library, dtypes (each checked once) and shapes; ``types``: :func:`list_types`'s.

    NumPy scalars become 0-D arrays; an item that is not an array in a list that holds arrays raises
    :class:`ArgumentError` naming it (:func:`hpccoll._arrays.check_list_items`).

    ``keep``: the call outlives this one (non-blocking), so the arrays are
    held in a copy of the user's list, not in the list itself.
    """
    if types <= _NDARRAY_ONLY:  # the common case, without per-array calls
        arrays, kind = xs if type(xs) is list and not keep else list(xs), "numpy"
    else:
        check_list_items(xs, types)
        pairs = [as_array(x, f"x[{i}]") for i, x in enumerate(xs)]
        kinds = {k for _, k in pairs}
        if len(kinds) > 1:
            raise ArgumentError(f"x: expected arrays of one library (all NumPy or all CuPy); got {sorted(kinds)}")
        arrays, kind = [a for a, _ in pairs], (kinds.pop() if kinds else "numpy")
    dtypes = set(map(_dtype_of, arrays))
    for dtype in dtypes:
        try:
            check_dtype(dtype)
        except HpccollError:
            first = next(i for i, a in enumerate(arrays) if a.dtype == dtype)
            check_dtype(dtype, f"x[{first}]")
    shapes = list(map(_shape_of, arrays))
    shape = shapes[0] if shapes and shapes.count(shapes[0]) == len(shapes) else None
    return ListOf(arrays, kind, dtypes, shapes, shape, shape is not None and len(dtypes) == 1)


def total_bytes(lst: ListOf) -> int:
    """The bytes of a list's arrays together (the message size of a list's reduction, alike on every rank)."""
    arrays = lst.arrays
    return arrays[0].nbytes * len(arrays) if lst.alike else sum(map(_nbytes_of, arrays))
