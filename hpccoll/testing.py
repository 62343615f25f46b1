"""Helpers for testing code built on hpccoll: the collective dot-product test."""

from __future__ import annotations

import warnings
from typing import Any, Optional

import numpy as np

from ._api import all_reduce
from ._comm import as_communicator
from ._errors import ArgumentError

__all__ = ["dottest", "default_rtol", "InnerProductWarning"]

_RTOL = {1: 0.25, 2: 2e-2, 4: 1e-5, 8: 1e-12, 16: 1e-12}


class InnerProductWarning(UserWarning):
    """:func:`dottest` was given an operator whose adjoint is not taken under the inner product it tests.

    The dot test checks the adjoint under the inner product summed over ranks,
    ``<u, v> = sum_r vdot(u_r, v_r)``. An operator whose adjoint is defined
    under another one, such as ``AllReduce(cotangent="replicated")`` (its
    range is replicated and counted once), is not meant to pass it at more
    than one rank.
    """


def default_rtol(dtype: Any) -> float:
    """The relative tolerance :func:`dottest` uses for data of ``dtype``.

    Parameters
    ----------
    dtype : numpy.dtype or str or type
        The data's dtype (anything :class:`numpy.dtype` accepts, including
        ``ml_dtypes.bfloat16`` and the float8 types).

    Returns
    -------
    float
        ``0.0`` for booleans and integers (exact), else by precision:
        ``0.25`` for the 8-bit floats (float8_e5m2's epsilon), ``2e-2`` for 16-bit floats, ``1e-5`` for float32 and complex64,
        ``1e-12`` for float64 and complex128 (and wider).

    Raises
    ------
    ArgumentError
        When ``dtype`` is not a numeric dtype.

    Examples
    --------
    >>> from hpccoll.testing import default_rtol
    >>> default_rtol("float32"), default_rtol("complex128"), default_rtol("int64")
    (1e-05, 1e-12, 0.0)
    """
    dt = np.dtype(dtype)
    if dt.kind in "biu":
        return 0.0
    if dt.kind not in "fcV" or (dt.kind == "V" and dt.itemsize > 2):  # "V": ml_dtypes' bfloat16 and float8 types
        raise ArgumentError(f"dtype: expected a boolean, integer, floating or complex dtype; got {dt}")
    return _RTOL[min(dt.itemsize // 2 if dt.kind == "c" else dt.itemsize, 16)]


def _host(a: Any, dtype: type) -> np.ndarray:
    """``a`` as a flat NumPy array of ``dtype`` (float64 or complex128), copied off the GPU if there."""
    a = a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)
    return a.astype(dtype).ravel()


def _is_complex(a: Any) -> bool:
    return np.dtype(a.dtype if hasattr(a, "dtype") else np.asarray(a).dtype).kind == "c"


def _other_inner_product(op: Any) -> Optional[str]:
    """Why ``op``'s adjoint is not the adjoint under the inner product summed over ranks, or ``None``.

    ``AllReduce`` declares its convention in ``cotangent``: ``"replicated"``
    is the adjoint when the range is replicated and counted once. ``op.H``
    (an adjoint operator, holding its ``base``) inherits it.
    """
    base = op
    while getattr(base, "base", None) is not None:
        base = base.base
    if getattr(base, "cotangent", None) == "replicated":
        return (
            f"{base!r}: its adjoint is taken under the inner product that counts the replicated result once, not "
            "under the sum over ranks this test checks, so at P > 1 ranks the two sides differ (by a factor of P "
            "for replicated y); use cotangent='varying' to test the collective's adjoint"
        )
    return None


def dottest(
    op: Any,
    x: Any,
    y: Any,
    comm: Any = None,
    rtol: Optional[float] = None,
    raise_error: bool = True,
) -> bool:
    """Collective dot-product test of ``op.forward`` against ``op.adjoint`` (collective).

    Checks ``sum_r <op.forward(x_r), y_r> == sum_r <x_r, op.adjoint(y_r)>``
    over the ranks ``r``, with ``<a, b> = vdot(a, b)`` computed on the host
    in float64 (complex128 when any of the four arrays is complex) and
    summed with :func:`hpccoll.all_reduce`. Give every rank
    different ``x`` and ``y``: equal vectors everywhere cannot catch a factor
    of P. Every rank returns (or raises) the same verdict.

    Parameters
    ----------
    op : Operator
        Anything with ``forward(x)`` and ``adjoint(y)`` (and, unless ``comm``
        is given, ``comm``): an :class:`hpccoll.Operator`, its ``.H``, or your
        own operator built on hpccoll.
    x : array_like (NumPy or CuPy)
        This rank's vector in the domain of ``op``.
    y : array_like (NumPy or CuPy)
        This rank's vector in the range of ``op``.
    comm : Communicator, mpi4py.MPI.Intracomm or None, optional
        The ranks the sums run over; default ``op.comm`` (the world if ``op``
        has none).
    rtol : float, optional
        Relative tolerance on ``|lhs - rhs| <= rtol * max(|lhs|, |rhs|)``;
        default :func:`default_rtol` of ``x``'s dtype.
    raise_error : bool, optional
        Raise :class:`AssertionError` when the test fails (default), else
        return ``False``.

    Returns
    -------
    bool
        ``True`` when the test passes, ``False`` when it fails and
        ``raise_error`` is false; the same on every rank.

    Raises
    ------
    ArgumentError
        When ``rtol`` is negative (or NaN), or ``x`` and ``y`` do not have the
        shapes of ``op``'s domain and range (before any communication but
        that of ``op`` itself).
    AssertionError
        When the test fails and ``raise_error`` is true, on every rank; the
        message gives both sums (real numbers for real data) and their
        relative difference.

    Warns
    -----
    InnerProductWarning
        When ``op`` declares its adjoint under another inner product (such as
        ``AllReduce(cotangent="replicated")``, whose adjoint is the identity):
        the test still runs, but is not expected to pass at more than one
        rank. The warning says why, and any failure message repeats it.

    Examples
    --------
    >>> import numpy as np, hpccoll                                           # doctest: +SKIP
    >>> comm = hpccoll.Communicator()                                         # doctest: +SKIP
    >>> rng = np.random.default_rng(comm.rank)    # different vectors on every rank   # doctest: +SKIP
    >>> op = hpccoll.AllGather(comm, axis=0)                                  # doctest: +SKIP
    >>> hpccoll.testing.dottest(op, rng.random(3), rng.random(3 * comm.size))  # doctest: +SKIP
    True
    """
    c = as_communicator(comm if comm is not None else getattr(op, "comm", None))
    if rtol is None:
        rtol = default_rtol(getattr(x, "dtype", np.float64))
    elif not rtol >= 0:
        raise ArgumentError(f"rtol: expected a non-negative float; got {rtol!r}")
    caveat = _other_inner_product(op)
    if caveat is not None:
        warnings.warn(f"dottest: {caveat}", InnerProductWarning, stacklevel=2)
    fx = op.forward(x)
    aty = op.adjoint(y)
    if np.shape(fx) != np.shape(y) or np.shape(aty) != np.shape(x):
        raise ArgumentError(
            f"x, y: expected shapes matching op (forward(x) has shape {np.shape(fx)}, adjoint(y) has "
            f"{np.shape(aty)}); got x {np.shape(x)} and y {np.shape(y)}"
        )
    dtype = np.complex128 if any(_is_complex(a) for a in (x, y, fx, aty)) else np.float64
    local = np.array(
        [np.vdot(_host(fx, dtype), _host(y, dtype)), np.vdot(_host(x, dtype), _host(aty, dtype))], dtype=dtype
    )
    total = all_reduce(local, c)  # through hpccoll's transports: NumPy on the host, whatever x and y were
    lhs, rhs = total.tolist()  # Python complex numbers, or floats for real data
    scale = max(abs(lhs), abs(rhs))
    # One verdict: every rank's sums are the same reduction, but the ranks need not round it alike.
    ok = bool(all_reduce(np.array([abs(lhs - rhs) <= rtol * scale], dtype=np.int8), c, op="min")[0])
    if not ok and raise_error:
        relative = abs(lhs - rhs) / scale if scale else float("inf")
        raise AssertionError(
            f"dot test failed: sum <F x, y> = {lhs!r} but sum <x, F^H y> = {rhs!r} "
            f"(relative difference {relative:.3g} > rtol={rtol:g})" + (f"; {caveat}" if caveat else "")
        )
    return ok
