"""Argument checks shared by every collective.

Local checks raise before any communication; they depend only on the
arguments, so a call made identically on every rank fails identically on
every rank. Check mode (sharing any rank's error with every rank) is
:mod:`hpccoll._core.agree`'s; shapes, blocks and the in-place layout are
:mod:`hpccoll._core.blocks`'s; the list forms' survey is
:mod:`hpccoll._core.lists`'s.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from .._arrays import SEQUENCES, as_array, axis_of, module_of, overlaps, plain_total, sizes_of, split_sizes
from .._dtypes import check_dtype, normalize_op, op_label
from .._errors import ArgumentError, UnsupportedOpError
from .lists import ListOf

__all__ = [
    "COTANGENTS",
    "LINEAR_OPS",
    "cotangent_of",
    "axis_of",
    "axes_of",
    "sizes_of",
    "own_sizes",
    "plain_total",
    "block_sizes",
    "check_out",
    "outs_of",
    "plain_out",
    "linear_op",
    "one_array",
]

COTANGENTS = ("varying", "replicated")
#: The linear reductions: the ops whose collectives have an adjoint (normalised names).
LINEAR_OPS = ("sum", "avg")
_ndarray = np.ndarray


def axes_of(lst: "ListOf", axis: Any, joins: bool = False) -> List[int]:
    """Each array's ``axis`` normalised (a list form's), once per number of dimensions; ``joins``: see :func:`axis_of`."""
    if lst.shape is not None:  # one shape: no per-array pass
        return [axis_of(axis, len(lst.shape), joins=joins, array="x[0]")] * len(lst.arrays)
    ndims = list(map(len, lst.shapes))
    per = {d: axis_of(axis, d, joins=joins, array=f"x[{ndims.index(d)}]") for d in sorted(set(ndims))}
    return [per[d] for d in ndims]


def own_sizes(sizes: Any, c: Any, extent: int, name: str) -> Tuple[int, ...]:
    """``sizes`` checked: one non-negative int per rank, this rank's equal to its ``extent`` (``name``)."""
    sizes = sizes_of(sizes, c.size)
    if sizes[c.rank] != extent:
        raise ArgumentError(
            f"sizes: expected sizes[{c.rank}] == {name} == {extent} on rank {c.rank}; got {sizes[c.rank]}"
        )
    return sizes


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
    if op not in LINEAR_OPS:
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


def cotangent_of(cotangent: Any) -> str:
    """``cotangent`` checked: one of :data:`COTANGENTS` (``all_reduce``'s adjoint convention)."""
    if cotangent not in COTANGENTS:
        raise ArgumentError(f"cotangent: expected 'varying' or 'replicated'; got {cotangent!r}")
    return cotangent


def one_array(x: Any, name: str = "x") -> Tuple[Any, str, Any]:
    """``(array, kind, xp)`` for a single-array call, its dtype checked."""
    x, kind = as_array(x, name)
    check_dtype(x.dtype, name)
    return x, kind, (np if kind == "numpy" else module_of(kind))
