"""Argument checks shared by every collective.

Local checks raise before any communication; they depend only on the
arguments, so a call made identically on every rank fails identically on
every rank. Check mode (sharing any rank's error with every rank) is
:mod:`hpccoll._core.agree`'s; shapes, blocks and the in-place layout are
:mod:`hpccoll._core.blocks`'s; the list forms' survey is
:mod:`hpccoll._core.lists`'s.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from .._arrays import SEQUENCES, as_array, module_of, overlaps, split_sizes
from .._dtypes import check_dtype, normalize_op, op_label
from .._errors import ArgumentError, UnsupportedOpError
from .lists import ListOf

__all__ = [
    "COTANGENTS",
    "axis_of",
    "axes_of",
    "sizes_of",
    "plain_total",
    "block_sizes",
    "check_out",
    "outs_of",
    "plain_out",
    "linear_op",
    "one_array",
]

COTANGENTS = ("varying", "replicated")
_ndarray = np.ndarray


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


def axes_of(lst: "ListOf", axis: Any, joins: bool = False) -> List[int]:
    """Each array's ``axis`` normalised (a list form's), once per number of dimensions; ``joins``: see :func:`axis_of`."""
    if lst.shape is not None:  # one shape: no per-array pass
        return [axis_of(axis, len(lst.shape), joins=joins, array="x[0]")] * len(lst.arrays)
    ndims = list(map(len, lst.shapes))
    per = {d: axis_of(axis, d, joins=joins, array=f"x[{ndims.index(d)}]") for d in sorted(set(ndims))}
    return [per[d] for d in ndims]


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


def block_sizes(sizes: Any, n: int, parts: int, name: str) -> Tuple[int, ...]:
    """The blocks' extents: ``numpy.array_split``'s for ``None``, else ``sizes`` checked to sum to ``n`` (``name``)."""
    if sizes is None:
        return split_sizes(n, parts)
    sizes = sizes_of(sizes, parts)
    if sum(sizes) != n:
        raise ArgumentError(f"sizes: expected ints summing to {name} == {n}; got {list(sizes)}")
    return sizes


def check_out(
    out: Any,
    shape: Tuple[int, ...],
    dtype: np.dtype,
    x: Any,
    xp: Any,
    in_place: Optional[Callable[[Any], bool]] = None,
) -> Any:
    """Validate a user's ``out``; ``None`` allocates a fresh array.

    ``out`` may overlap ``x`` only where ``in_place(out)`` says the overlap is
    the collective's in-place form.
    """
    if out is None:
        return xp.empty(shape, dtype)
    if not isinstance(out, xp.ndarray):
        raise ArgumentError(f"out: expected a {xp.__name__}.ndarray like x; got {type(out).__name__}")
    if out.shape != shape:
        raise ArgumentError(f"out: expected shape {shape}; got {out.shape}")
    if out.dtype != dtype:
        raise ArgumentError(f"out: expected dtype {dtype}; got {out.dtype}")
    if xp is np and not out.flags.writeable:
        raise ArgumentError("out: expected a writeable array; got a read-only one")
    if xp is not np and out.device.id != x.device.id:
        raise ArgumentError(f"out: expected an array on x's GPU {x.device.id}; got one on GPU {out.device.id}")
    # ``out is x`` counts as overlap too (even for zero-size arrays): MPI forbids aliased buffers.
    if (out is x or overlaps(out, x, xp)) and not (in_place is not None and in_place(out)):
        raise ArgumentError(
            "out: expected memory separate from the input (or exactly the in-place layout); "
            "got an array that overlaps it"
        )
    return out


def plain_out(out: Any, shape: Tuple[int, ...], dtype: np.dtype) -> bool:
    """Whether ``out`` is a NumPy array of exactly ``shape`` and ``dtype``, C-contiguous and writeable.

    The common-case branches' test (overlap with the input is theirs to check).
    """
    if type(out) is not _ndarray or out.shape != shape:
        return False
    own = out.dtype
    if own is not dtype and own != dtype:
        return False
    flags = out.flags
    return flags.c_contiguous and flags.writeable


def outs_of(out: Any, n: int) -> list:
    """A list form's ``out``: ``None`` for each array, or the user's list of ``n``."""
    if out is None:
        return [None] * n
    if type(out) not in SEQUENCES or len(out) != n:
        got = f"{type(out).__name__} of length {len(out)}" if type(out) in SEQUENCES else type(out).__name__
        raise ArgumentError(f"out: expected None or a list of {n} arrays (one per input); got {got}")
    return list(out)


def linear_op(op: Any, what: str) -> str:
    """``op`` normalised, if linear (``sum``, ``avg``); :class:`UnsupportedOpError` otherwise."""
    op = normalize_op(op)
    if op not in ("sum", "avg"):
        why = (
            "a logical or bitwise reduction, not differentiable"
            if op in ("land", "lor", "lxor", "band", "bor", "bxor")
            else "whose adjoint depends on which rank held the extreme or on the other factors: differentiate it "
            "yourself"
        )
        raise UnsupportedOpError(
            f"{what}: expected op 'sum' or 'avg' (the linear reductions); got {op_label(op)}, {why}"
        )
    return op


def one_array(x: Any, name: str = "x") -> Tuple[Any, str, Any]:
    """``(array, kind, xp)`` for a single-array call, its dtype checked."""
    x, kind = as_array(x, name)
    check_dtype(x.dtype, name)
    return x, kind, (np if kind == "numpy" else module_of(kind))
