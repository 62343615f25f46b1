"""Dtypes and reduction ops: what is supported, and how each (dtype, op) pair travels.

The transports see only *wire* dtypes and the four wire ops ``sum``, ``prod``,
``max`` and ``min``. Everything else (bool as 0/1 bytes, 16-bit floats widened
to float32, 8- and 16-bit integer sums widened to 32 bits where a transport's
MPI saturates them, ``avg`` as a sum followed by a division) is decided here,
once, for every transport.
"""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional, Tuple, Union

import numpy as np

from ._errors import ArgumentError, DTypeError

__all__ = [
    "OPS",
    "SUPPORTED_DTYPES",
    "ReducePlan",
    "check_dtype",
    "normalize_op",
    "reduce_plan",
    "movement_dtype",
    "direct_plan",
    "wire_of",
]

#: Reduction ops accepted by the public functions.
OPS = ("sum", "prod", "max", "min", "avg")
_OP_SET = frozenset(OPS)

_INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_FLOATS = ("float32", "float64")
_HALFS = ("float16", "bfloat16")
_COMPLEX = ("complex64", "complex128")

#: Dtype names every collective accepts (``bfloat16`` is ml_dtypes').
SUPPORTED_DTYPES = ("bool",) + _INTS + _HALFS + _FLOATS + _COMPLEX

_SUPPORTED = frozenset(SUPPORTED_DTYPES)


_CHECKED: Dict[np.dtype, str] = {}


def check_dtype(dtype: np.dtype, name: str = "x") -> str:
    """Return the name of a supported ``dtype``; raise :class:`DTypeError` otherwise."""
    key = _CHECKED.get(dtype)
    if key is not None:
        return key
    key = dtype.name
    if key not in _SUPPORTED or not dtype.isnative:
        raise DTypeError(
            f"{name}: expected a native-byte-order dtype among "
            f"{', '.join(SUPPORTED_DTYPES)}; got {dtype.str!r} ({dtype})"
        )
    _CHECKED[dtype] = key
    return key


#: dtype -> the dtype its bytes move as, or None when unsupported (see :func:`wire_of`).
_WIRE: Dict[np.dtype, Optional[np.dtype]] = {}


def wire_of(dtype: np.dtype) -> Optional[np.dtype]:
    """:func:`movement_dtype` of a supported ``dtype``, ``None`` for an unsupported one (no exception).

    One dictionary lookup after the first call per dtype: the common-case
    branches' test, which leave the error to the general branch.
    """
    try:
        return _WIRE[dtype]
    except KeyError:
        pass
    wire: Optional[np.dtype]
    try:
        check_dtype(dtype)
        wire = movement_dtype(dtype)
    except DTypeError:
        wire = None
    _WIRE[dtype] = wire
    return wire


def movement_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype an array of ``dtype`` is viewed as for pure data movement.

    The 16-bit floats move as ``uint16``: ``bfloat16`` has no MPI or NCCL type, and ``float16`` none
    in MPIs older than MPI 4 (mpi4py built against Debian's Open MPI 4.1 cannot map it), while their
    bits move exactly as 16-bit integers everywhere.
    """
    if _CHECKED.get(dtype) in _HALFS:
        return np.dtype(np.uint16)
    return dtype


def normalize_op(op: Any) -> str:
    """Map ``op`` (a name or an mpi4py ``MPI.Op``) to one of :data:`OPS`."""
    if isinstance(op, str):
        if op in _OP_SET:
            return op
        key = op.lower()
        if key in OPS:
            return key
    else:
        mpi_op = _mpi_op_name(op)
        if mpi_op is not None:
            return mpi_op
    raise ArgumentError(f"op: expected one of {', '.join(map(repr, OPS))} or MPI.SUM/PROD/MAX/MIN; got {op!r}")


def _mpi_op_name(op: Any) -> Optional[str]:
    if type(op).__name__ != "Op":
        return None
    from mpi4py import MPI

    for name, mpi_op in (("sum", MPI.SUM), ("prod", MPI.PROD), ("max", MPI.MAX), ("min", MPI.MIN)):
        if op == mpi_op:
            return name
    return None


class ReducePlan(NamedTuple):
    """How a reduction of one (dtype, op) pair travels.

    Attributes
    ----------
    wire : numpy.dtype
        The dtype the transport reduces in.
    op : str
        The wire op: ``"sum"``, ``"prod"``, ``"max"`` or ``"min"``.
    widen : bool
        The input is converted to ``wire`` (and the result back); otherwise
        the input is only *viewed* as ``wire`` (same bytes).
    divide : bool
        Divide by the communicator size afterwards (``avg``).
    """

    wire: np.dtype
    op: str
    widen: bool
    divide: bool


_BOOL_OPS = {"sum": "max", "max": "max", "prod": "min", "min": "min"}


_PLANS: Dict[Tuple[np.dtype, str, frozenset, frozenset], Union[ReducePlan, DTypeError]] = {}

#: The 32-bit integer each small integer's sum is widened to (wrapped back to it like NumPy afterwards).
_WIDE_INT = {
    np.dtype(n): np.dtype(w)
    for n, w in (("int8", "int32"), ("int16", "int32"), ("uint8", "uint32"), ("uint16", "uint32"))
}


def reduce_plan(
    dtype: np.dtype, op: str, native: frozenset = frozenset(), saturates: frozenset = frozenset()
) -> ReducePlan:
    """Choose the wire dtype and op for reducing ``dtype`` with ``op`` (cached).

    Parameters
    ----------
    dtype : numpy.dtype
        A supported dtype (see :func:`check_dtype`).
    op : str
        One of :data:`OPS`.
    native : frozenset of str
        16-bit float dtype names the transport reduces natively; others are
        widened to float32 (never reduced in a type the transport lacks).
    saturates : frozenset of numpy.dtype
        Integer dtypes whose sums the transport saturates
        (``Transport.saturates``): their sums are widened to 32 bits, whose
        two's-complement sum wraps, and cast back, which wraps like NumPy.

    Raises
    ------
    DTypeError
        For ``avg`` on bool or integers, and ``max``/``min`` on complex.
    """
    key = (dtype, op, native, saturates)
    plan = _PLANS.get(key)
    if plan is None:
        try:
            plan = _make_plan(dtype, op, native, saturates)
        except DTypeError as exc:
            plan = exc
        _PLANS[key] = plan
    if isinstance(plan, DTypeError):
        raise DTypeError(*plan.args)
    return plan


#: op name -> dtype -> the plan, for plans that reduce natively (no widening) on a transport with no
#: native 16-bit floats; ``None`` marks a pair that widens or raises.
_DIRECT: Dict[str, Dict[np.dtype, Optional[ReducePlan]]] = {}


def direct_plan(dtype: np.dtype, op: str) -> Optional[ReducePlan]:
    """The plan for ``(dtype, op)`` when it reduces without widening on a host transport, else ``None``.

    The caller checks the transport's ``saturates`` itself (a saturated sum widens).

    ``op`` is a name as the caller wrote it (``"sum"``, ``"SUM"``, ...). Two
    dictionary lookups once known: the collectives' common-case branches use
    it, and leave every other pair (and every error) to :func:`reduce_plan`.
    """
    plans = _DIRECT.get(op)
    if plans is not None:
        try:
            return plans[dtype]
        except KeyError:
            pass
    try:
        plan = reduce_plan(dtype, normalize_op(op))
    except (ArgumentError, DTypeError):
        return None  # not remembered: the general path raises it every time
    direct = None if plan.widen else plan
    _DIRECT.setdefault(op, {})[dtype] = direct
    return direct


def _make_plan(dtype: np.dtype, op: str, native: frozenset, saturates: frozenset) -> ReducePlan:
    key = check_dtype(dtype)
    divide = op == "avg"
    wire_op = "sum" if divide else op
    if key == "bool":
        if divide:
            raise DTypeError(f"op='avg': expected a floating or complex dtype; got {key}")
        # numpy's bool arithmetic: sum and max are OR, prod and min are AND.
        return ReducePlan(np.dtype(np.uint8), _BOOL_OPS[op], False, False)
    if key in _INTS:
        if divide:
            raise DTypeError(
                f"op='avg': expected a floating or complex dtype; got {key} "
                "(integer averages would need a rounding rule: sum, then divide yourself)"
            )
        if op == "sum" and dtype in saturates:
            return ReducePlan(_WIDE_INT[dtype], op, True, False)
        return ReducePlan(dtype, op, False, False)
    if key in _COMPLEX and op in ("max", "min"):
        raise DTypeError(f"op={op!r}: expected a real dtype (complex numbers are not ordered); got {key}")
    if key in _HALFS and key not in native:
        return ReducePlan(np.dtype(np.float32), wire_op, True, divide)
    return ReducePlan(dtype, wire_op, False, divide)
