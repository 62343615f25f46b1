"""SciPy ``LinearOperator`` views of hpccoll operators, for LSQR, CG and friends.

Requires ``pip install scipy`` (``hpccoll[scipy]``).

.. warning::

   A SciPy solver runs independently on every rank and computes its norms and
   dot products **locally**. The solve is a distributed one only when the
   vectors the solver sees are the same on every rank (replicated domain and
   range), so that local norms are the global norms and every rank takes the
   same steps and stops at the same iteration. Collectives inside ``matvec``
   then keep the ranks in step. With rank-local (sharded) vectors, the ranks
   would compute different step lengths, diverge, and may stop at different
   iterations, leaving the others waiting forever in a collective. See
   ``examples/distributed_lstsq.py`` for an operator with replicated domain
   and range built from :class:`hpccoll.AllGather` and its adjoint.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence, Tuple

import numpy as np
import numpy.typing as npt
from scipy.sparse.linalg import LinearOperator

from .._api import PAIR, CommLike
from .._arrays import shape_of
from .._comm import as_communicator
from .._errors import ArgumentError
from .._spec import Meta

__all__ = ["aslinearoperator", "pair_operator", "CollectiveLinearOperator"]


class LinearMap(Protocol):
    """What :func:`aslinearoperator` wraps: a map with ``forward`` and ``adjoint`` (e.g. an :class:`hpccoll.Operator`).

    A type for annotations (``typing.Protocol``): any object with these two
    methods is one; nothing needs to inherit from it.
    """

    def forward(self, x: Any) -> Any:
        """Apply the map to this rank's part of the domain.

        Parameters
        ----------
        x : array
            This rank's part of the domain.

        Returns
        -------
        array
            This rank's part of the range.
        """

    def adjoint(self, y: Any) -> Any:
        """Apply the adjoint to this rank's part of the range.

        Parameters
        ----------
        y : array
            This rank's part of the range.

        Returns
        -------
        array
            This rank's part of the domain.
        """


class CollectiveLinearOperator(LinearOperator):
    """A :class:`scipy.sparse.linalg.LinearOperator` whose ``matvec`` is ``op.forward``.

    Made by :func:`aslinearoperator`; ``matvec``/``rmatvec`` are collective
    calls (every rank must make them in the same order).

    Parameters
    ----------
    op : LinearMap
        The operator (``forward`` and ``adjoint``).
    x_shape, y_shape : tuple of int
        This rank's domain and range shapes.
    dtype : numpy.dtype
        The dtype the solver works in.

    Attributes
    ----------
    op : object
        The wrapped operator (``forward`` and ``adjoint``).
    x_shape, y_shape : tuple of int
        This rank's domain and range shapes.
    """

    def __init__(self, op: LinearMap, x_shape: Tuple[int, ...], y_shape: Tuple[int, ...], dtype: np.dtype) -> None:
        self.op = op
        self.x_shape = x_shape
        self.y_shape = y_shape
        super().__init__(dtype=dtype, shape=(_size(y_shape), _size(x_shape)))

    def _matvec(self, v: np.ndarray) -> np.ndarray:
        y = self.op.forward(np.reshape(v, self.x_shape))
        return _flat(y, self.y_shape, "forward")

    def _rmatvec(self, v: np.ndarray) -> np.ndarray:
        x = self.op.adjoint(np.reshape(v, self.y_shape))
        return _flat(x, self.x_shape, "adjoint")

    def __repr__(self) -> str:
        return f"<{self.shape[0]}x{self.shape[1]} CollectiveLinearOperator of {self.op!r} with dtype={self.dtype}>"


def aslinearoperator(
    op: LinearMap, x_shape: Sequence[int], y_shape: Sequence[int], dtype: npt.DTypeLike = np.float64
) -> CollectiveLinearOperator:
    """View an operator as a :class:`scipy.sparse.linalg.LinearOperator` on this rank's shapes.

    Parameters
    ----------
    op : object
        Anything with ``forward(x)`` and ``adjoint(y)``: an
        :class:`hpccoll.Operator` (``AllGather``, its ``.H``, ...) or your own
        composition of collectives and local maps.
    x_shape : sequence of int
        This rank's shape of the domain (``op.forward``'s input).
    y_shape : sequence of int
        This rank's shape of the range (``op.forward``'s output).
    dtype : dtype
        The dtype the solver works in.

    Returns
    -------
    CollectiveLinearOperator
        Of shape ``(prod(y_shape), prod(x_shape))``; ``matvec`` reshapes to
        ``x_shape``, applies ``op.forward`` and flattens, ``rmatvec`` does the
        same with ``op.adjoint``.

    Raises
    ------
    ArgumentError
        ``op`` lacks ``forward``/``adjoint``, or a shape or the dtype is invalid.

    Notes
    -----
    SciPy's solvers compute norms and dot products on each rank's vectors
    alone: use this with operators whose domain and range are replicated
    (see the module docstring) unless you run on one rank.

    Examples
    --------
    >>> from scipy.sparse.linalg import lsqr                        # doctest: +SKIP
    >>> A = aslinearoperator(my_op, x_shape=(n,), y_shape=(m,))     # doctest: +SKIP
    >>> x = lsqr(A, b, atol=1e-12, btol=1e-12)[0]                   # doctest: +SKIP
    """
    for name in ("forward", "adjoint"):
        if not callable(getattr(op, name, None)):
            raise ArgumentError(
                f"op: expected an operator with forward() and adjoint() (e.g. hpccoll.AllGather); "
                f"got {type(op).__name__} without {name}()"
            )
    x_shape = shape_of("x_shape", x_shape)
    y_shape = shape_of("y_shape", y_shape)
    return CollectiveLinearOperator(op, x_shape, y_shape, _solver_dtype(dtype))


def pair_operator(
    name: str, x_shape: Sequence[int], comm: CommLike = None, *, dtype: Any = np.float64, **keywords: Any
) -> CollectiveLinearOperator:
    """A LinearOperator of any public pair (:data:`hpccoll._api.PAIRS`), bound as every adapter binds it.

    ``matvec`` is the pair's forward and ``rmatvec`` its adjoint, on this rank's domain shape.

    Parameters
    ----------
    name : str
        The pair's forward (``"all_gather"``, ``"shift"``...).
    x_shape : sequence of int
        This rank's shape of the domain (the forward's input).
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    dtype : numpy dtype
        The dtype the solver works in.
    **keywords : object
        The forward's keywords (and the adjoint's own, such as ``cotangent``);
        ``sizes=None`` is resolved here, with the collective's own small
        exchange where it needs one, so both sides share it.

    Returns
    -------
    CollectiveLinearOperator
        Of shape ``(prod(y_shape), prod(x_shape))``, ``y_shape`` this rank's
        shape of the forward's result.

    Raises
    ------
    ArgumentError
        An unknown ``name``, a bad shape, dtype or keyword.
    """
    pair = PAIR.get(name)
    if pair is None:
        raise ArgumentError(f"name: expected one of {sorted(PAIR)}; got {name!r}")
    shape, dt = shape_of("x_shape", x_shape), _solver_dtype(dtype)
    forward, adjoint, bound = pair.bound(Meta(shape, len(shape), dt), as_communicator(comm), **keywords)
    return CollectiveLinearOperator(_Bound(name, forward, adjoint), shape, tuple(bound.shape), dt)


class _Bound:
    """A pair bound to one layout, as a :class:`LinearMap`."""

    def __init__(self, name: str, forward: Callable[[Any], Any], adjoint: Callable[[Any], Any]) -> None:
        self.name, self.forward, self.adjoint = name, forward, adjoint

    def __repr__(self) -> str:
        return f"<{self.name} and its adjoint>"


def _solver_dtype(dtype: Any) -> np.dtype:
    """``dtype`` checked: a floating or complex NumPy dtype, for a solver."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise ArgumentError(f"dtype: expected a NumPy dtype; got {dtype!r}") from None
    if dt.kind not in "fc":
        raise ArgumentError(f"dtype: expected a floating or complex dtype for a solver; got {dt}")
    return dt


def _size(shape: Tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _flat(a: Any, shape: Tuple[int, ...], which: str) -> np.ndarray:
    a = np.asarray(a)
    if a.shape != shape:
        raise ArgumentError(f"op: expected {which}() to return shape {shape}; got {a.shape}")
    return a.reshape(-1)
