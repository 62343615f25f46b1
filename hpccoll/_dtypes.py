"""Dtypes and reduction ops: what is supported, and how each (dtype, op) pair travels.

The transports see only *wire* dtypes and *wire* ops: ``sum``, ``prod``,
``max`` and ``min`` on every transport, and MPI's logical and bitwise ops
(``land``, ``lor``, ``lxor``, ``band``, ``bor``, ``bxor``) on integers where the
transport declares them (``Transport.reduce_ops``). Everything else (bool as
0/1 bytes, whose logical and bitwise ops are ``min``, ``max`` and ``lxor``;
16-bit floats widened to float32, ml_dtypes' 8-bit floats moved as uint8 bytes and
reduced in float32, 8- and 16-bit integer sums widened to 32 bits where a
transport's MPI saturates them, ``avg`` as a sum followed by a division; which
(dtype, op) pairs MPI's rules allow, and which a transport cannot reduce) is
decided here, once, for every transport. So is what a transport's library
lacks (``Transport.reduce_dtypes``, the dtype names it reduces natively:
NCCL's): :func:`library_reduction` widens int16/uint16 to 32 bits, reduces a
complex sum as twice as many reals, sends a complex product by whole blocks
and refuses complex max/min; :func:`library_move_wire` moves a dtype as itself,
as reals, or as bytes.

ml_dtypes' dtypes (``bfloat16``, ``float8_e4m3fn``, ``float8_e5m2``) are
recognised by name: this module never imports ml_dtypes, and hpccoll works
without it (the float8 names are listed in :data:`SUPPORTED_DTYPES` only when
it is installed).
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any, Dict, FrozenSet, NamedTuple, Optional, Tuple, Union

import numpy as np

from ._errors import ArgumentError, DTypeError, UnsupportedOpError

__all__ = [
    "OPS",
    "SUPPORTED_DTYPES",
    "FLOAT8_DTYPES",
    "ml_dtype",
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
    "LibraryWire",
    "LibraryReduction",
    "library_reduce_wire",
    "library_move_wire",
    "library_reduction",
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
    f"{', '.join(repr(op) for op in OPS if op not in _LOGICAL + _BITWISE)} "
    f"(or MPI's logical and bitwise {', '.join(map(repr, _LOGICAL + _BITWISE))}), or MPI."
    + "/".join(k for k, v in _MPI_OPS.items() if v is not None)
)

#: bool travels as 0/1 bytes: its op on those bytes (numpy's bool arithmetic: sum and max are OR,
#: prod and min are AND; the bitwise ops on 0/1 are the logical ones).
_BOOL_OPS = {
    **dict.fromkeys(("sum", "max", "lor", "bor"), "max"),
    **dict.fromkeys(("prod", "min", "land", "band"), "min"),
    **dict.fromkeys(("lxor", "bxor"), "lxor"),
}


def op_label(op: str) -> str:
    """``op`` as errors name it: ``'land' (MPI.LAND)``, or ``'avg'`` (no MPI op of that name)."""
    return f"{op!r} (MPI.{op.upper()})" if op.upper() in _MPI_OPS else repr(op)


_INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_FLOATS = ("float32", "float64")
_HALFS = ("float16", "bfloat16")
_COMPLEX = ("complex64", "complex128")
#: ml_dtypes' 8-bit floats (OCP FP8: E4M3 without infinities, E5M2 with them).
_FLOAT8 = ("float8_e4m3fn", "float8_e5m2")


def _have_ml_dtypes() -> bool:
    """Whether ml_dtypes can be imported (looked up, not imported: hpccoll never imports it)."""
    if "ml_dtypes" in sys.modules:
        return sys.modules["ml_dtypes"] is not None
    try:
        return importlib.util.find_spec("ml_dtypes") is not None
    except (ImportError, ValueError):  # pragma: no cover - a broken installation counts as none
        return False


#: The names of ml_dtypes' 8-bit floats hpccoll accepts: ``("float8_e4m3fn", "float8_e5m2")`` when
#: ml_dtypes is installed, else empty. Data movement moves them as ``uint8`` bytes (exact); reductions
#: widen them to float32 on every transport and round the result once back (see :func:`reduce_plan`).
FLOAT8_DTYPES: Tuple[str, ...] = _FLOAT8 if _have_ml_dtypes() else ()

#: Dtype names every collective accepts (``bfloat16`` and the float8 dtypes are ml_dtypes'; the
#: float8 names are listed only when ml_dtypes is installed).
SUPPORTED_DTYPES = ("bool",) + _INTS + _HALFS + FLOAT8_DTYPES + _FLOATS + _COMPLEX

_SUPPORTED = frozenset(SUPPORTED_DTYPES)

#: The dtypes :func:`ml_dtype` names (ml_dtypes' types hpccoll supports).
_ML_DTYPES = ("bfloat16",) + _FLOAT8


def ml_dtype(name: str) -> np.dtype:
    """The NumPy dtype of ml_dtypes' ``name`` (``"bfloat16"``, ``"float8_e4m3fn"``, ``"float8_e5m2"``).

    ml_dtypes is imported here, on first use (for adapters mapping a framework's dtype, such as
    ``torch.float8_e4m3fn``, to NumPy's).

    Parameters
    ----------
    name : str
        One of ``"bfloat16"``, ``"float8_e4m3fn"``, ``"float8_e5m2"``.

    Returns
    -------
    numpy.dtype
        ``numpy.dtype(ml_dtypes.<name>)``.

    Raises
    ------
    ArgumentError
        When ``name`` is none of them.
    DTypeError
        When ml_dtypes is not installed.
    """
    if name not in _ML_DTYPES:
        raise ArgumentError(f"name: expected one of {', '.join(map(repr, _ML_DTYPES))}; got {name!r}")
    try:
        import ml_dtypes
    except ImportError:
        raise DTypeError(
            f"x: expected a dtype NumPy can represent; got {name} without ml_dtypes installed (pip install ml_dtypes)"
        ) from None
    return np.dtype(getattr(ml_dtypes, name))


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
    bits move exactly as 16-bit integers everywhere. ml_dtypes' 8-bit floats (``float8_e4m3fn``,
    ``float8_e5m2``) move as ``uint8`` for the same reason: no MPI type, and bytes move exactly.
    """
    key = _CHECKED.get(dtype) or dtype.name  # also a dtype no collective has checked yet (the bench's raw MPI)
    if key in _HALFS:
        return np.dtype(np.uint16)
    if key in _FLOAT8:
        return np.dtype(np.uint8)
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

#: The 32-bit integer each small integer is widened to where its sum saturates (MPI) or its library lacks it
#: (NCCL's 16-bit integers); the cast back wraps like NumPy (a two's-complement sum or product modulo 2**32 is
#: the same modulo 2**16 and 2**8).
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
        The 8-bit floats are always widened, whatever ``native`` says.
    saturates : frozenset of numpy.dtype
        Integer dtypes whose sums the transport saturates
        (``Transport.saturates``): their sums are widened to 32 bits, whose
        two's-complement sum wraps, and cast back, which wraps like NumPy.
    ops : frozenset of str
        The wire ops the transport reduces (``Transport.reduce_ops``); the
        default, :data:`WIRE_OPS`, is host MPI's (all of them).

    Returns
    -------
    ReducePlan
        The wire dtype and op, whether the input is widened, and whether ``avg`` divides.

    Notes
    -----
    The 16-bit floats the transport does not reduce natively, and the 8-bit
    floats (``float8_e4m3fn``, ``float8_e5m2``) on every transport, are
    converted to float32 (exactly), reduced in float32 and the result is
    rounded once back to the input's dtype (``avg``: divided by the number of
    ranks in float32 first). The result is therefore
    ``ufunc.reduce(stack.astype(float32), axis=0).astype(dtype)`` up to the
    order of the float32 operations, not a reduction rounded to 8 or 16 bits
    at every step. Casting back follows ml_dtypes: a float32 result beyond
    ``float8_e4m3fn``'s range (448) becomes NaN (it has no infinities), beyond
    ``float8_e5m2``'s (57344) infinity.

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
        try:
            plan = _make_plan(dtype, op, native, saturates, ops)
        except (DTypeError, UnsupportedOpError) as exc:
            plan = exc
        _PLANS[key] = plan
    if isinstance(plan, Exception):
        raise type(plan)(*plan.args)
    return plan


#: op name -> dtype -> the plan, for plans that reduce natively (no widening) on a transport with no
#: native 16-bit floats; ``None`` marks a pair that widens or raises.
_DIRECT: Dict[str, Dict[np.dtype, Optional[ReducePlan]]] = {}


def direct_plan(dtype: np.dtype, op: str, transport: Any = None) -> Optional[ReducePlan]:
    """The plan for ``(dtype, op)`` when it reduces without widening on a host transport, else ``None``.

    With ``transport``, also ``None`` where that transport reduces natively
    (``native_reduce``: the general branch plans for it) or saturates this
    sum (``saturates``: the sum widens): the one rule the collectives'
    common-case branches share.

    ``op`` is a name as the caller wrote it (``"sum"``, ``"SUM"``, ...). Two
    dictionary lookups once known: the common-case branches use it, and
    leave every other pair (and every error) to :func:`reduce_plan`.
    """
    if transport is not None and transport.native_reduce:
        return None
    plans = _DIRECT.get(op)
    direct = None if plans is None else plans.get(dtype, _UNKNOWN)
    if plans is None or direct is _UNKNOWN:
        try:
            plan = reduce_plan(dtype, normalize_op(op))
        except (ArgumentError, DTypeError):
            return None  # not remembered: the general path raises it every time
        direct = None if plan.widen or plan.op not in BASIC_OPS else plan
        _DIRECT.setdefault(op, {})[dtype] = direct
    if direct is not None and transport is not None and transport.saturates and direct.op == "sum":
        return None if dtype in transport.saturates else direct
    return direct


_UNKNOWN: Any = object()


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
    if key in _FLOAT8 or (key in _HALFS and key not in native):
        return ReducePlan(np.dtype(np.float32), wire_op, True, divide)
    return ReducePlan(dtype, wire_op, False, divide)


def _no_wire_op(op: str, key: str) -> UnsupportedOpError:
    """The refusal of ``op`` on ``key`` by a transport whose ``reduce_ops`` lacks it."""
    return UnsupportedOpError(
        f"op={op_label(op)}: expected a transport that reduces it for {key}; got one that does not "
        "(NCCL has no bitwise reductions): use transport='mpi' or 'staged' (host MPI has them all)"
    )


# --------------------------------------------------------------------------- what a transport's library lacks
# A transport may declare the dtypes its library reduces elementwise natively (``Transport.reduce_dtypes``;
# ``None``: every dtype the collectives hand it, as MPI does). Buffers of another dtype still reach it: the
# rules below say, once for every such transport, how they are reduced and moved.

#: How complex buffers are reduced by a library that has their real part: each wire op -> the route
#: (``sum``: elementwise on the real and imaginary parts; ``prod``: not elementwise on them, so the
#: transport multiplies whole complex blocks itself); any other op is refused (not ordered).
_COMPLEX_ROUTES = {"sum": "reals", "prod": "complex_prod"}


class LibraryWire(NamedTuple):
    """How a transport's library sees buffers of one dtype.

    Attributes
    ----------
    view : numpy.dtype
        The dtype the buffer is viewed as for the library: its own, its real part (complex), or ``uint8``.
    scale : int
        Library elements per buffer element (1; 2 for complex as reals; the itemsize for bytes).
    """

    view: np.dtype
    scale: int


class LibraryReduction(NamedTuple):
    """How a transport's library reduces buffers of one (dtype, wire op) pair.

    Attributes
    ----------
    how : str
        ``"native"`` (as itself), ``"reals"`` (complex sum as twice as many reals), ``"widen"``
        (converted to :attr:`wire`'s wider integer, reduced, cast back) or ``"complex_prod"``
        (complex product: the transport multiplies whole complex blocks, moved as :attr:`wire`).
    wire : LibraryWire
        The dtype the library reduces (or, for ``"complex_prod"``, moves) and its scale.
    """

    how: str
    wire: LibraryWire


def library_reduce_wire(dtype: np.dtype, reduce_dtypes: Optional[FrozenSet[str]]) -> Optional[LibraryWire]:
    """How a library reducing ``reduce_dtypes`` reduces ``dtype`` elementwise, or ``None`` if it cannot.

    Parameters
    ----------
    dtype : numpy.dtype
        The buffer's dtype.
    reduce_dtypes : frozenset of str or None
        The dtype names the library reduces natively (``Transport.reduce_dtypes``); ``None``: every dtype.

    Returns
    -------
    LibraryWire or None
        ``(dtype, 1)`` for a native dtype; ``(real part, 2)`` for a complex dtype whose real part is
        native (elementwise for ``sum`` only: see :func:`library_reduction`); ``None`` otherwise (a
        non-native byte order included), for :func:`library_reduction` to widen or refuse.
    """
    if reduce_dtypes is None:
        return LibraryWire(dtype, 1)
    if not dtype.isnative:
        return None
    if dtype.name in reduce_dtypes:
        return LibraryWire(dtype, 1)
    if dtype.kind == "c":
        real = np.dtype(f"f{dtype.itemsize // 2}")
        if real.name in reduce_dtypes:
            return LibraryWire(real, 2)
    return None


def library_move_wire(dtype: np.dtype, reduce_dtypes: Optional[FrozenSet[str]]) -> LibraryWire:
    """How a library reducing ``reduce_dtypes`` moves ``dtype``: as itself, as twice as many reals, or as bytes.

    Parameters
    ----------
    dtype : numpy.dtype
        The buffer's dtype.
    reduce_dtypes : frozenset of str or None
        As for :func:`library_reduce_wire`.

    Returns
    -------
    LibraryWire
        :func:`library_reduce_wire`'s answer, or ``(uint8, itemsize)`` where that is ``None``.
    """
    wire = library_reduce_wire(dtype, reduce_dtypes)
    return wire if wire is not None else LibraryWire(np.dtype(np.uint8), dtype.itemsize)


_LIBRARY_REDUCTIONS: Dict[Tuple[np.dtype, str, Optional[FrozenSet[str]], str], Union[LibraryReduction, Exception]] = {}


def library_reduction(
    dtype: np.dtype, op: str, reduce_dtypes: Optional[FrozenSet[str]], library: str = "the transport"
) -> LibraryReduction:
    """How a library reducing ``reduce_dtypes`` reduces ``dtype`` with the wire op ``op`` (cached).

    Parameters
    ----------
    dtype : numpy.dtype
        The buffer's dtype.
    op : str
        A wire op: ``"sum"``, ``"prod"``, ``"max"`` or ``"min"``.
    reduce_dtypes : frozenset of str or None
        As for :func:`library_reduce_wire`; ``None`` makes every pair ``"native"``.
    library : str
        The library as errors name it (``"NCCL"``).

    Returns
    -------
    LibraryReduction
        ``"native"``; ``"widen"`` for ``int16``/``uint16`` where the library lacks them and has
        ``int32``/``uint32``; for complex with a native real part, ``"reals"`` (``sum``) or
        ``"complex_prod"`` (``prod``).

    Raises
    ------
    DTypeError
        For a dtype the library cannot reduce, and ``max``/``min`` on complex.
    """
    key = (dtype, op, reduce_dtypes, library)
    found = _LIBRARY_REDUCTIONS.get(key)
    if found is None:
        try:
            found = _library_reduction(dtype, op, reduce_dtypes, library)
        except DTypeError as exc:
            found = exc
        _LIBRARY_REDUCTIONS[key] = found
    if isinstance(found, Exception):
        raise type(found)(*found.args)
    return found


def _library_reduction(
    dtype: np.dtype, op: str, reduce_dtypes: Optional[FrozenSet[str]], library: str
) -> LibraryReduction:
    wire = library_reduce_wire(dtype, reduce_dtypes)
    if wire is None:
        assert reduce_dtypes is not None, "a library reducing every dtype has a wire for each"
        wider = _WIDE_INT.get(dtype)
        if wider is not None and wider.name in reduce_dtypes:
            return LibraryReduction("widen", LibraryWire(wider, 1))
        names = sorted(reduce_dtypes, key=lambda n: (_ORDER.get(n, len(_ORDER)), n))
        raise DTypeError(f"x: expected a dtype {library} reduces ({', '.join(names)}); got {dtype}")
    if wire.scale == 1:
        return LibraryReduction("native", wire)
    how = _COMPLEX_ROUTES.get(op)
    if how is None:
        raise DTypeError(f"op={op!r}: expected 'sum' or 'prod' for complex {dtype}; got {op!r}")
    return LibraryReduction(how, wire)


#: Dtype names in the order errors list them.
_ORDER = {name: i for i, name in enumerate(("bool",) + _INTS + _HALFS + _FLOAT8 + _FLOATS + _COMPLEX)}
