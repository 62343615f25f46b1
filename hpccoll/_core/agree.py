"""Check mode: the calls' descriptors, and the ranks' agreement on them and on every rank's errors.

Every collective builds its descriptor here (what must be equal on every
rank, in words: the messages name its keys) and settles through
:func:`settle`: a local error is raised, or, in check mode
(``HPCCOLL_CHECK=1``), first shared with every rank and the descriptors
compared. Outside check mode the control-plane exchanges carry a status code
(:func:`status_of`, :func:`raise_exchanged`) and dtype codes
(:func:`dtype_code`) instead.
"""

from __future__ import annotations

import hashlib
import zlib
from typing import Any, Callable, Dict, NoReturn, Optional, Sequence

import numpy as np

from .._errors import ArgumentError, DTypeError, HpccollError, MismatchError, UnsupportedOpError
from .blocks import shape_without

__all__ = [
    "checking",
    "settle",
    "refuse",
    "late",
    "descriptor",
    "all_gather_desc",
    "all_gather_list_desc",
    "all_reduce_desc",
    "all_reduce_list_desc",
    "replicated_desc",
    "reduce_scatter_desc",
    "reduce_scatter_list_desc",
    "gather_adjoint_arrays_desc",
    "all_to_all_desc",
    "dtype_code",
    "dtype_names",
    "odd_one",
    "status_of",
    "raise_exchanged",
]


def checking(c: Any) -> bool:
    """Whether ``c``'s calls are compared across ranks (check mode, more than one rank)."""
    return bool(c.check and c.size > 1)


def settle(
    c: Any, what: str, desc: Any, local: Any, err: Optional[HpccollError], async_op: bool = False
) -> Optional[list]:
    """Raise a local error, or (check mode) agree with the other ranks first; every rank's ``local``.

    Check mode compares ``async_op`` with the descriptor: MPI never matches a
    blocking collective with a non-blocking one, so one rank's
    ``async_op=True`` among blocking calls would hang instead.
    """
    if checking(c):
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


def late(c: Any, what: str, check: Callable[[], Any]) -> Any:
    """Run a check that needed an exchange (``out`` once the extents are known); its result.

    In check mode its error (or none) is shared with every rank, so every rank raises.
    """
    err = result = None
    try:
        result = check()
    except HpccollError as e:
        err = e
    settle(c, what, None, None, err)
    return result


# --------------------------------------------------------------------------- descriptors


def descriptor(collective: str, out: Any = None, **fields: Any) -> Dict[str, Any]:
    """A call's descriptor: ``collective``, then ``out`` (when not ``None``: ``"shared"``), then ``fields``."""
    desc: Dict[str, Any] = {"collective": collective}
    if out is not None:
        desc["out"] = out
    desc.update(fields)
    return desc


def all_gather_desc(x: Any, ax: Optional[int], sizes: Any, out: Any = None) -> Dict[str, Any]:
    """An all-gather of one array along ``ax`` (``None``: ``axis=None``, one array per rank)."""
    if ax is None:
        return descriptor("all_gather", axis=None, dtype=x.dtype.name)
    return descriptor(
        "all_gather",
        out,
        dtype=x.dtype.name,
        ndim=x.ndim,
        axis=ax,
        **{"shape except axis": shape_without(x.shape, ax)},
        sizes=sizes,
    )


def all_gather_list_desc(arrays: Sequence[Any], axes: Sequence[int], sizes: Any) -> Dict[str, Any]:
    """An all-gather of a list, each array along its axis."""
    return descriptor(
        "all_gather",
        sizes=sizes,
        arrays=[(a.dtype.name, ax, shape_without(a.shape, ax)) for a, ax in zip(arrays, axes)],
    )


def all_reduce_desc(x: Any, op: str, out: Any = None) -> Dict[str, Any]:
    """An all-reduce of one array."""
    return descriptor("all_reduce", out, dtype=x.dtype.name, shape=x.shape, op=op)


def all_reduce_list_desc(arrays: Sequence[Any], op: str) -> Dict[str, Any]:
    """An all-reduce of a list."""
    return descriptor("all_reduce", op=op, arrays=[(a.dtype.name, a.shape) for a in arrays])


def replicated_desc(ys: Sequence[Any]) -> Dict[str, Any]:
    """A replicated cotangent: one digest of each array's bytes (they must be equal on every rank)."""
    return {"replicated cotangent": [_digest(y) for y in ys]}


def _digest(y: Any) -> str:
    data = y if isinstance(y, np.ndarray) else y.get()
    return hashlib.blake2b(np.ascontiguousarray(data).tobytes(), digest_size=16).hexdigest()


def reduce_scatter_desc(x: Any, ax: int, op: str, sizes: Any) -> Dict[str, Any]:
    """A reduce-scatter of one array along ``ax``."""
    return descriptor("reduce_scatter", dtype=x.dtype.name, shape=x.shape, axis=ax, op=op, sizes=sizes)


def gather_adjoint_arrays_desc(dtype: np.dtype, shapes: Sequence[Any]) -> Dict[str, Any]:
    """``all_gather_adjoint(ys, axis=None)``: one dtype, and every rank's shape."""
    return descriptor("all_gather_adjoint", axis=None, dtype=dtype.name, shapes=shapes)


def reduce_scatter_list_desc(arrays: Sequence[Any], axes: Sequence[int], op: str, sizes: Any) -> Dict[str, Any]:
    """A reduce-scatter of a list, each array along its axis."""
    return descriptor(
        "reduce_scatter", op=op, sizes=sizes, arrays=[(a.dtype.name, a.shape, ax) for a, ax in zip(arrays, axes)]
    )


def all_to_all_desc(
    arrays: Sequence[Any], sas: Sequence[int], cas: Sequence[int], table: Sequence[Sequence[int]]
) -> Dict[str, Any]:
    """An all-to-all of one array or a list: per array, what must match across ranks."""
    return descriptor(
        "all_to_all",
        arrays=[
            {
                "dtype": a.dtype.name,
                "ndim": a.ndim,
                "split_axis": sa,
                "concat_axis": ca,
                "shape except concat_axis": shape_without(a.shape, ca),
                "sizes": tuple(t) if sa != ca else "per rank",
            }
            for a, sa, ca, t in zip(arrays, sas, cas, table)
        ],
    )


# --------------------------------------------------------------------------- outside check mode: codes


#: The errors an exchanged status names: ``status_of(err) - 1`` indexes this tuple (0: no error).
_EXCHANGED = (ArgumentError, DTypeError, UnsupportedOpError, MismatchError, HpccollError)

_CODES: Dict[np.dtype, int] = {}


def dtype_code(dtype: np.dtype) -> int:
    """An int naming ``dtype``, the same in every process (not Python's salted string hash); cached."""
    code = _CODES.get(dtype)
    if code is None:
        code = _CODES[dtype] = zlib.crc32(f"{dtype.str}|{dtype.name}".encode())
    return code


def dtype_names() -> dict:
    """Names of the dtypes NumPy (and ml_dtypes, if installed) know, by :func:`dtype_code` (error messages)."""
    kinds = set(np.sctypeDict.values())
    try:
        import ml_dtypes

        kinds |= {getattr(ml_dtypes, n) for n in ("bfloat16", "float8_e4m3fn", "float8_e5m2") if hasattr(ml_dtypes, n)}
    except ImportError:  # pragma: no cover - ml_dtypes is a test dependency
        pass
    names = {}
    for k in kinds:
        try:
            d = np.dtype(k)
        except TypeError:  # pragma: no cover
            continue
        names[dtype_code(d)] = d.name
    return names


def odd_one(values: Sequence[Any]) -> Optional[int]:
    """The first rank whose exchanged value differs from rank 0's, or ``None`` when every rank's is the same."""
    if values.count(values[0]) == len(values):
        return None
    return next(q for q, v in enumerate(values) if v != values[0])


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
