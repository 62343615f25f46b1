"""Helpers for testing code built on hpccoll: the collective dot-product test."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ._comm import as_communicator
from ._errors import ArgumentError

__all__ = ["dottest", "default_rtol"]

_RTOL = {2: 2e-2, 4: 1e-5, 8: 1e-12, 16: 1e-12}


def default_rtol(dtype: Any) -> float:
    """A relative tolerance for the dot test in ``dtype``: by precision, exact for integers."""
    dt = np.dtype(dtype)
    if dt.kind in "biu":
        return 0.0
    return _RTOL[dt.itemsize // 2 if dt.kind == "c" else dt.itemsize]


def _host(a: Any) -> np.ndarray:
    a = a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)
    return a.astype(np.complex128 if a.dtype.kind == "c" else np.float64).ravel()


def dottest(op: Any, x: Any, y: Any, comm: Any = None, rtol: Optional[float] = None, raise_error: bool = True) -> bool:
    """Collective dot-product test of ``op.forward`` against ``op.adjoint`` (collective).

    Checks ``sum_ranks <op.forward(x), y> == sum_ranks <x, op.adjoint(y)>``
    with ``<a, b> = vdot(a, b)`` computed in float64 (complex128 for
    complex). Give every rank different ``x`` and ``y``.

    Parameters
    ----------
    op : Operator
        Anything with ``forward`` and ``adjoint`` (and ``comm``).
    x, y : array
        This rank's vector in the domain and in the range.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks the sums run over; default ``op.comm``.
    rtol : float, optional
        Relative tolerance; default from ``x``'s dtype (:func:`default_rtol`).
    raise_error : bool
        Raise :class:`AssertionError` on failure (else return ``False``).

    Returns
    -------
    bool
        ``True`` when the test passes; the same verdict on every rank.

    Examples
    --------
    >>> dottest(hpccoll.AllGather(), x, y)   # doctest: +SKIP
    True
    """
    c = as_communicator(comm if comm is not None else getattr(op, "comm", None))
    if rtol is None:
        rtol = default_rtol(getattr(x, "dtype", np.float64))
    elif not rtol >= 0:
        raise ArgumentError(f"rtol: expected a non-negative float; got {rtol!r}")
    fx = op.forward(x)
    aty = op.adjoint(y)
    if np.shape(fx) != np.shape(y) or np.shape(aty) != np.shape(x):
        raise ArgumentError(
            f"x, y: expected shapes matching op (forward(x) has shape {np.shape(fx)}, adjoint(y) has "
            f"{np.shape(aty)}); got x {np.shape(x)} and y {np.shape(y)}"
        )
    local = np.array([np.vdot(_host(fx), _host(y)), np.vdot(_host(x), _host(aty))], dtype=np.complex128)
    total = np.empty_like(local)
    c.mpi.Allreduce(local, total)
    lhs, rhs = total
    ok = bool(abs(lhs - rhs) <= rtol * max(abs(lhs), abs(rhs)))
    ok = c.mpi.bcast(ok, root=0)
    if not ok and raise_error:
        raise AssertionError(f"dot test failed: sum <F x, y> = {lhs} but sum <x, F^H y> = {rhs} (rtol={rtol})")
    return ok
