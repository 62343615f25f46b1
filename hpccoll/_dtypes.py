"""Dtypes and reduction ops: what is supported, and how each (dtype, op) pair travels.

The transports see only *wire* dtypes and *wire* ops: ``sum``, ``prod``,
``max`` and ``min`` on every transport, and MPI's logical and bitwise ops
(``land``, ``lor``, ``lxor``, ``band``, ``bor``, ``bxor``) on integers where the
transport declares them (``Transport.reduce_ops``). Everything else (bool as
0/1 bytes, whose logical and bitwise ops are ``min``, ``max`` and ``lxor``;
16-bit floats widened to float32, 8- and 16-bit integer sums widened to 32 bits
where a transport's MPI saturates them, ``avg`` as a sum followed by a
division; which (dtype, op) pairs MPI's rules allow, and which a transport
cannot reduce) is decided here, once, for every transport.
"""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional, Tuple, Union

import numpy as np

from ._errors import ArgumentError, DTypeError, UnsupportedOpError

__all__ = [
    "OPS",
    "SUPPORTED_DTYPES",
    "WIRE_OPS",
    "BASIC_OPS",
    "op_label",
    "truth_valued",
    "ReducePlan",
    "check_dtype",
    "normalize_op",
    "reduce_plan",
    "movement_dtype",
    "direct_plan",
    "wire_of",
]

#: MPI's logical reductions (integers: nonzero is true, the result 0 or 1 in the input's dtype).
_LOGICAL = ("land", "lor", "lxor")
#: MPI's bitwise reductions (integers; on bool they are the logical ones).
_BITWISE = ("band", "bor", "bxor")

#: Reduction ops accepted by the public functions.
OPS = ("sum", "prod", "max", "min", "avg") + _LOGICAL + _BITWISE
_OP_SET = frozenset(OPS)

#: The wire ops every transport reduces.
BASIC_OPS = frozenset(("sum", "prod", "max", "min"))
#: Every wire op a plan may name (the default of :func:`reduce_plan`'s ``ops``: host MPI's).
WIRE_OPS = BASIC_OPS | frozenset(_LOGICAL + _BITWISE)

#: The name of each mpi4py predefined op (``MPI.SUM``) -> hpccoll's name for it, or ``None`` where
#: hpccoll refuses it (the ``*LOC`` ops need value-index pairs; ``REPLACE``/``NO_OP`` do not reduce).
_MPI_OPS: Dict[str, Optional[str]] = {
    **{name.upper(): name for name in OPS if name != "avg"},
    "MAXLOC": None,
    "MINLOC": None,
    "REPLACE": None,
    "NO_OP": None,
    "OP_NULL": None,
}
_ACCEPTED = (
    f"{', '.join(map(repr, OPS[:5]))} (or MPI's logical and bitwise {', '.join(map(repr, OPS[5:]))}), or "
    + "MPI."
    + "/".join(k for k, v in _MPI_OPS.items() if v is not None)
)

#: bool travels as 0/1 bytes: its op on those bytes (numpy's bool arithmetic: sum and max are OR,
#: prod and min are AND; the bitwise ops on 0/1 are the logical ones).
_BOOL_OPS = {
    "sum": "max",
    "max": "max",
    "lor": "max",
    "bor": "max",
    "prod": "min",
    "min": "min",
    "land": "min",
    "band": "min",
    "lxor": "lxor",
    "bxor": "lxor",
}


def op_label(op: str) -> str:
    """``op`` as errors name it: ``'land' (MPI.LAND)``, or ``'avg'`` (no MPI op of that name)."""
    return f"{op!r} (MPI.{op.upper()})" if op.upper() in _MPI_OPS else repr(op)


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


def truth_valued(dtype: np.dtype, op: str) -> bool:
    """Whether reducing ``dtype`` with ``op`` gives truth values (MPI's logical ops on integers).

    The result is then 0 or 1 in ``dtype`` even over one rank, where nothing travels: the
    collectives store ``x != 0``, not ``x``.
    """
    return op in _LOGICAL and dtype.kind in "iu"


def normalize_op(op: Any) -> str:
    """Map ``op`` (a name or an mpi4py ``MPI.Op``) to one of :data:`OPS`.

    An ``MPI.Op`` hpccoll refuses is named in the error (``MPI.MAXLOC``), as is one it does not
    know (a user-defined op).
    """
    if isinstance(op, str):
        if op in _OP_SET:
            return op
        key = op.lower()
        if key in OPS:
            return key
        got = repr(op)
    else:
        mpi_name = _mpi_op_name(op)
        if mpi_name is None:
            got = repr(op)
        else:
            name = _MPI_OPS.get(mpi_name)
            if name is not None:
                return name
            got = f"MPI.{mpi_name}" if mpi_name in _MPI_OPS else mpi_name
    raise ArgumentError(f"op: expected one of {_ACCEPTED}; got {got}")


def _mpi_op_name(op: Any) -> Optional[str]:
    """The name of mpi4py's predefined op ``op`` (``"LAND"``), a phrase for another ``MPI.Op``, or
    ``None`` for something that is no ``MPI.Op``."""
    if type(op).__name__ != "Op":
        return None
    from mpi4py import MPI

    for name in _MPI_OPS:
        if op == getattr(MPI, name, None):
            return name
    return "a user-defined MPI.Op"


class ReducePlan(NamedTuple):
    """How a reduction of one (dtype, op) pair travels.

    Attributes
    ----------
    wire : numpy.dtype
        The dtype the transport reduces in.
    op : str
        The wire op: one of :data:`WIRE_OPS` (``"sum"``, ``"prod"``, ``"max"``, ``"min"``
        everywhere; a logical or bitwise op only for integers, or ``"lxor"`` for bool, on a
        transport whose ``reduce_ops`` has it).
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


_PLANS: Dict[Tuple[np.dtype, str, frozenset, frozenset, frozenset], Union[ReducePlan, Exception]] = {}

#: The 32-bit integer each small integer's sum is widened to (wrapped back to it like NumPy afterwards).
_WIDE_INT = {
    np.dtype(n): np.dtype(w)
    for n, w in (("int8", "int32"), ("int16", "int32"), ("uint8", "uint32"), ("uint16", "uint32"))
}


def reduce_plan(
    dtype: np.dtype,
    op: str,
    native: frozenset = frozenset(),
    saturates: frozenset = frozenset(),
    ops: frozenset = WIRE_OPS,
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
    ops : frozenset of str
        The wire ops the transport reduces (``Transport.reduce_ops``); the
        default, :data:`WIRE_OPS`, is host MPI's (all of them).

    Raises
    ------
    DTypeError
        For ``avg`` on bool or integers, ``max``/``min`` on complex, and the
        logical and bitwise ops on floating and complex dtypes (MPI's rules:
        logical ops take integer and logical types, bitwise ops integer and
        byte types).
    UnsupportedOpError
        For an op on integers that the transport does not reduce (``ops``).
    """
    key = (dtype, op, native, saturates, ops)
    plan = _PLANS.get(key)
    if plan is None:
        made: Union[ReducePlan, Exception]
        try:
            made = _make_plan(dtype, op, native, saturates, ops)
        except (DTypeError, UnsupportedOpError) as exc:
            made = exc
        plan = _PLANS[key] = made
    if isinstance(plan, Exception):
        raise type(plan)(*plan.args)
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
    direct = None if plan.widen or plan.op not in BASIC_OPS else plan
    _DIRECT.setdefault(op, {})[dtype] = direct
    return direct


def _make_plan(dtype: np.dtype, op: str, native: frozenset, saturates: frozenset, ops: frozenset) -> ReducePlan:
    key = check_dtype(dtype)
    divide = op == "avg"
    wire_op = "sum" if divide else op
    if key == "bool":
        if divide:
            raise DTypeError(f"op='avg': expected a floating or complex dtype; got {key}")
        plan = ReducePlan(np.dtype(np.uint8), _BOOL_OPS[op], False, False)
        if plan.op not in ops:
            raise _no_wire_op(op, key)
        return plan
    if key in _INTS:
        if divide:
            raise DTypeError(
                f"op='avg': expected a floating or complex dtype; got {key} "
                "(integer averages would need a rounding rule: sum, then divide yourself)"
            )
        if op not in ops:
            raise _no_wire_op(op, key)
        if op == "sum" and dtype in saturates:
            return ReducePlan(_WIDE_INT[dtype], op, True, False)
        return ReducePlan(dtype, op, False, False)
    if op in _LOGICAL or op in _BITWISE:
        kinds = "integer and logical" if op in _LOGICAL else "integer and byte"
        raise DTypeError(
            f"op={op_label(op)}: expected a bool or integer dtype (MPI's {'logical' if op in _LOGICAL else 'bitwise'} "
            f"ops take {kinds} types); got {key}"
        )
    if key in _COMPLEX and op in ("max", "min"):
        raise DTypeError(f"op={op!r}: expected a real dtype (complex numbers are not ordered); got {key}")
    if key in _HALFS and key not in native:
        return ReducePlan(np.dtype(np.float32), wire_op, True, divide)
    return ReducePlan(dtype, wire_op, False, divide)


def _no_wire_op(op: str, key: str) -> UnsupportedOpError:
    """The refusal of ``op`` on ``key`` by a transport whose ``reduce_ops`` lacks it."""
    return UnsupportedOpError(
        f"op={op_label(op)}: expected a transport that reduces it for {key}; got one that does not "
        "(NCCL has no bitwise reductions): use transport='mpi' or 'staged' (host MPI has them all)"
    )
