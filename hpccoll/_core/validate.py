"""Argument checks shared by every collective, and check mode's cross-rank agreement.

Local checks raise before any communication; they depend only on the
arguments, so a call made identically on every rank fails identically on
every rank. In check mode :func:`settle` first shares any rank's error (and
compares the call's descriptor) so that every rank raises the same
exception.
"""

from __future__ import annotations

import operator
import zlib
from typing import TYPE_CHECKING, Any, Callable, Dict, List, NamedTuple, NoReturn, Optional, Sequence, Set, Tuple, Union

import numpy as np

from .._arrays import as_array, module_of, overlaps, split_sizes
from .._dtypes import check_dtype, normalize_op, op_label
from .._errors import ArgumentError, DTypeError, HpccollError, MismatchError, UnsupportedOpError
from ..transports._mpitypes import buffer_address

if TYPE_CHECKING:
    from types import EllipsisType

__all__ = [
    "SEQUENCES",
    "COTANGENTS",
    "axis_of",
    "axes_of",
    "sizes_of",
    "plain_total",
    "block_sizes",
    "check_out",
    "outs_of",
    "plain_out",
    "may_share",
    "same_block",
    "address",
    "own_block",
    "block",
    "settle",
    "refuse",
    "linear_op",
    "shape_without",
    "with_extent",
    "is_array_list",
    "list_types",
    "ListOf",
    "survey_list",
    "one_array",
    "dtype_code",
    "status_of",
    "raise_exchanged",
]

SEQUENCES = (list, tuple)
COTANGENTS = ("varying", "replicated")
_ndarray = np.ndarray
_NDARRAY_ONLY = frozenset((_ndarray,))
_dtype_of = operator.attrgetter("dtype")
_shape_of = operator.attrgetter("shape")
#: ``numpy.may_share_memory`` for exact ``numpy.ndarray`` arguments, without the ``__array_function__``
#: dispatch (half the cost; the common-case branches' overlap test).
may_share = getattr(np.may_share_memory, "_implementation", np.may_share_memory)


def axis_of(axis: Any, ndim: int, name: str = "axis", joins: bool = False) -> int:
    """``axis`` normalised to ``[0, ndim)``; :class:`ArgumentError` naming it (``name``) otherwise.

    ``joins``: the axis an all-gather concatenates along (its 0-D message says so).
    """
    if type(axis) is int and -ndim <= axis < ndim:  # the common case, fast
        return axis % ndim
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise ArgumentError(f"{name}: expected an int; got {type(axis).__name__} {axis!r}")
    if ndim == 0 and joins:
        raise ArgumentError(
            f"x: expected an array with at least 1 dimension to concatenate along {name}; got a 0-D array "
            "(all_gather joins the shards along an existing axis: pass numpy.atleast_1d(x), or x[None] to stack them)"
        )
    if ndim == 0:
        raise ArgumentError(f"x: expected an array with at least 1 dimension to split along {name}; got a 0-D array")
    if not -ndim <= axis < ndim:
        raise ArgumentError(f"{name}: expected an int in [{-ndim}, {ndim - 1}] for a {ndim}-D array; got {axis}")
    return int(axis) % ndim


def axes_of(lst: "ListOf", axis: Any, joins: bool = False) -> List[int]:
    """Each array's ``axis`` normalised (a list form's), once per number of dimensions; ``joins``: see :func:`axis_of`."""
    if lst.shape is not None:  # one shape: no per-array pass
        return [axis_of(axis, len(lst.shape), joins=joins)] * len(lst.arrays)
    ndims = list(map(len, lst.shapes))
    per = {d: axis_of(axis, d, joins=joins) for d in set(ndims)}
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
    """Whether ``part`` is exactly the view ``whole[where]`` (same address, shape and strides).

    This is how an in-place collective is recognised: ``all_gather(x,
    out=y)`` where ``x`` is this rank's block of ``y``, ``reduce_scatter(x,
    out=b)`` where ``b`` is this rank's block of ``x``.
    """
    if type(part) is not type(whole) or part.dtype != whole.dtype:
        return False
    view = whole[where]
    return part.shape == view.shape and part.strides == view.strides and address(part) == address(view)


def block(ax: int, start: int, stop: int) -> tuple:
    """The index of ``[start, stop)`` along axis ``ax``."""
    return (slice(None),) * ax + (slice(start, stop),)


def own_block(ax: int, sizes: Sequence[int], rank: int) -> tuple:
    """The index of rank ``rank``'s block along ``ax`` when blocks have extents ``sizes``."""
    start = sum(sizes[:rank])
    return block(ax, start, start + sizes[rank])


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


def settle(
    c: Any, what: str, desc: Any, local: Any, err: Optional[HpccollError], async_op: bool = False
) -> Optional[list]:
    """Raise a local error, or (check mode) agree with the other ranks first; every rank's ``local``.

    Check mode compares ``async_op`` with the descriptor: MPI never matches a
    blocking collective with a non-blocking one, so one rank's
    ``async_op=True`` among blocking calls would hang instead.
    """
    if c.check and c.size > 1:
        if desc is not None:
            desc = {**desc, "async_op": bool(async_op)}
        return c.agree(what, desc, local, err)
    if err is not None:
        raise err
    return None


def refuse(c: Any, what: str, err: HpccollError) -> NoReturn:
    """Raise ``err``, found before the collective's own check: in check mode on every rank.

    The other ranks are then in that check (their first collective call), so
    they learn of ``err`` there instead of waiting for this rank forever.
    """
    settle(c, what, None, None, err)
    raise err  # settle raised already; this line only reassures type checkers


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


def shape_without(shape: Tuple[int, ...], ax: int) -> Tuple[int, ...]:
    """``shape`` without axis ``ax``."""
    return shape[:ax] + shape[ax + 1 :]


def with_extent(shape: Tuple[int, ...], ax: int, n: int) -> Tuple[int, ...]:
    """``shape`` with extent ``n`` along axis ``ax``."""
    return shape[:ax] + (n,) + shape[ax + 1 :]


def is_array_list(x: Any) -> bool:
    """Whether ``x`` is a list or tuple of arrays (not an array-like of numbers)."""
    return list_types(x) is not None


def list_types(x: Any) -> Optional[Set[type]]:
    """The types of ``x``'s items when ``x`` is a list or tuple of arrays (not an array-like of numbers), else ``None``.

    Decided once per type, not once per array; :func:`survey_list` takes the result.
    """
    if type(x) not in SEQUENCES:
        return None
    types = set(map(type, x))
    if types <= _NDARRAY_ONLY or all(issubclass(t, _ndarray) or t.__module__.startswith("cupy") for t in types):
        return types
    return None


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

    ``keep``: the call outlives this one (non-blocking), so the arrays are
    held in a copy of the user's list, not in the list itself.
    """
    arrays, kind, dtypes = _checked(xs, types, keep)
    shapes = list(map(_shape_of, arrays))
    shape = shapes[0] if shapes and shapes.count(shapes[0]) == len(shapes) else None
    return ListOf(arrays, kind, dtypes, shapes, shape, shape is not None and len(dtypes) == 1)


def _checked(xs: Sequence[Any], types: Set[type], keep: bool) -> Tuple[List[Any], str, Set[np.dtype]]:
    if types <= _NDARRAY_ONLY:  # the common case, without per-array calls
        arrays, kind = xs if type(xs) is list and not keep else list(xs), "numpy"
    else:
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
    return arrays, kind, dtypes


def one_array(x: Any, name: str = "x") -> Tuple[Any, str, Any]:
    """``(array, kind, xp)`` for a single-array call, its dtype checked."""
    x, kind = as_array(x, name)
    check_dtype(x.dtype, name)
    return x, kind, (np if kind == "numpy" else module_of(kind))


#: The errors an exchanged status names: ``status_of(err) - 1`` indexes this tuple (0: no error).
_EXCHANGED = (ArgumentError, DTypeError, UnsupportedOpError, MismatchError, HpccollError)


_CODES: Dict[np.dtype, int] = {}


def dtype_code(dtype: np.dtype) -> int:
    """An int naming ``dtype``, the same in every process (not Python's salted string hash); cached."""
    code = _CODES.get(dtype)
    if code is None:
        code = _CODES[dtype] = zlib.crc32(f"{dtype.str}|{dtype.name}".encode())
    return code


def status_of(err: Optional[HpccollError]) -> int:
    """``err`` as an int for a control-plane exchange: 0 for none, else its kind (:func:`raise_exchanged`)."""
    if err is None:
        return 0
    return next(i for i, cls in enumerate(_EXCHANGED) if isinstance(err, cls)) + 1


def raise_exchanged(statuses: Sequence[int], err: Optional[HpccollError], what: str) -> None:
    """Raise on every rank when any rank's exchanged status (:func:`status_of`) is an error.

    This rank's own ``err`` is raised as it is; a rank without one raises the
    same kind of error naming the lowest failing rank (its message stays there:
    check mode, ``HPCCOLL_CHECK=1``, shows it on every rank).
    """
    if err is not None:
        raise err
    for rank, status in enumerate(statuses):
        if status:
            raise _EXCHANGED[status - 1](
                f"{what}: rank {rank} refused its arguments ({_EXCHANGED[status - 1].__name__}); "
                "set HPCCOLL_CHECK=1 to see its message on every rank"
            )
