"""Operator objects: a collective's configuration with ``forward``, ``adjoint`` and ``H``."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from ._api import PAIR, CommLike, OpLike, Pair, Sizes
from ._arrays import ArrayT
from ._comm import Communicator, as_communicator
from ._core.validate import COTANGENTS, sizes_of
from ._dtypes import normalize_op
from ._errors import ArgumentError

__all__ = ["Operator", "AllGather", "ReduceScatter", "AllReduce", "AllToAll"]


class Operator:
    """A linear (or, for ``max``/``min``/``prod``, forward-only) collective map.

    ``op(x)`` is ``op.forward(x)``; ``op.H`` is the adjoint as an operator,
    with ``op.H.H is op``. Both take one array, or a list of arrays (the
    coalesced form), and return the same form.
    """

    comm: Communicator

    def forward(self, x: ArrayT, out: Optional[ArrayT] = None) -> ArrayT:  # pragma: no cover - abstract
        """Apply the collective.

        Parameters
        ----------
        x : array_like (NumPy or CuPy), or list of arrays
            This rank's input.
        out : array or list of arrays, optional
            Where to write the result.

        Returns
        -------
        array or list of arrays
            This rank's result, a new array (or ``out``).
        """
        raise NotImplementedError

    def adjoint(self, y: ArrayT, out: Optional[ArrayT] = None) -> ArrayT:  # pragma: no cover - abstract
        """Apply the adjoint of the collective (the adjoint under the inner product summed over ranks).

        Parameters
        ----------
        y : array_like (NumPy or CuPy), or list of arrays
            A cotangent of this rank's result of :meth:`forward`.
        out : array or list of arrays, optional
            Where to write the result.

        Returns
        -------
        array or list of arrays
            The cotangent of this rank's input, a new array (or ``out``).
        """
        raise NotImplementedError

    def __call__(self, x: ArrayT, out: Optional[ArrayT] = None) -> ArrayT:
        return self.forward(x, out=out)

    @property
    def H(self) -> "Operator":
        """The adjoint operator (its ``forward`` is this ``adjoint``)."""
        return _Adjoint(self)


class _Adjoint(Operator):
    def __init__(self, base: Operator) -> None:
        self.base = base
        self.comm = base.comm

    def forward(self, x: ArrayT, out: Optional[ArrayT] = None) -> ArrayT:
        return self.base.adjoint(x, out=out)

    def adjoint(self, y: ArrayT, out: Optional[ArrayT] = None) -> ArrayT:
        return self.base.forward(y, out=out)

    @property
    def H(self) -> Operator:
        return self.base

    def __repr__(self) -> str:
        return f"{self.base!r}.H"


def _check_sizes(sizes: Sizes, comm: Communicator) -> Optional[Tuple[int, ...]]:
    return None if sizes is None else sizes_of(sizes, comm.size)


class _PairOperator(Operator):
    """An operator over one :class:`~hpccoll._api.Pair`: its keywords bound to both sides."""

    pair: Pair
    keywords: Dict[str, Any]

    def forward(self, x: ArrayT, out: Optional[ArrayT] = None) -> ArrayT:
        """Apply the collective with this operator's settings.

        Parameters
        ----------
        x : array_like (NumPy or CuPy), or list of arrays
            This rank's input, as for the collective's function.
        out : array or list of arrays, optional
            Where to write the result.

        Returns
        -------
        array or list of arrays
            This rank's result, a new array (or ``out``).
        """
        fwd = {k: v for k, v in self.keywords.items() if k not in self.pair.adjoint_only}
        result: ArrayT = self.pair.forward(x, self.comm, out=out, **fwd)
        return result

    def adjoint(self, y: ArrayT, out: Optional[ArrayT] = None) -> ArrayT:
        """Apply the adjoint with this operator's settings.

        Parameters
        ----------
        y : array_like (NumPy or CuPy), or list of arrays
            A cotangent of this rank's result of :meth:`forward`.
        out : array or list of arrays, optional
            Where to write the result.

        Returns
        -------
        array or list of arrays
            The cotangent of this rank's input, a new array (or ``out``).
        """
        result: ArrayT = self.pair.adjoint(y, self.comm, out=out, **self.keywords)
        return result


class AllGather(_PairOperator):
    """All-gather along ``axis``; adjoint: reduce-scatter with sum.

    Parameters
    ----------
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    axis : int
        The concatenation axis.
    sizes : sequence of int, optional
        Every rank's shard extent. ``None``: the forward discovers them and
        the adjoint splits like ``numpy.array_split``; give ``sizes`` when
        shards are split otherwise.

    Examples
    --------
    >>> op = hpccoll.AllGather(axis=1)                  # doctest: +SKIP
    >>> y = op(x); gx = op.H(gy)                        # doctest: +SKIP
    """

    def __init__(self, comm: CommLike = None, *, axis: int = 0, sizes: Sizes = None) -> None:
        self.comm = as_communicator(comm)
        self.axis = axis
        self.sizes = _check_sizes(sizes, self.comm)
        self.keywords = dict(axis=axis, sizes=self.sizes)

    pair = PAIR["all_gather"]

    def __repr__(self) -> str:
        return f"AllGather(axis={self.axis}, sizes={self.sizes}, size={self.comm.size})"


class ReduceScatter(_PairOperator):
    """Reduce-scatter along ``axis``; adjoint: all-gather (``sum``) or all-gather / P (``avg``).

    Parameters
    ----------
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    op : str or mpi4py.MPI.Op
        The reduction; ``adjoint`` exists for ``"sum"`` and ``"avg"`` only.
    axis : int
        The axis the result is split along.
    sizes : sequence of int, optional
        Every rank's block extent; ``None`` splits like ``numpy.array_split``.
    """

    def __init__(self, comm: CommLike = None, *, op: OpLike = "sum", axis: int = 0, sizes: Sizes = None) -> None:
        self.comm = as_communicator(comm)
        self.op = normalize_op(op)
        self.axis = axis
        self.sizes = _check_sizes(sizes, self.comm)
        self.keywords = dict(op=self.op, axis=axis, sizes=self.sizes)

    pair = PAIR["reduce_scatter"]

    def __repr__(self) -> str:
        return f"ReduceScatter(op={self.op!r}, axis={self.axis}, sizes={self.sizes}, size={self.comm.size})"


class AllReduce(_PairOperator):
    """All-reduce; adjoint per the ``cotangent`` convention.

    Parameters
    ----------
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    op : str or mpi4py.MPI.Op
        The reduction; ``adjoint`` exists for ``"sum"`` and ``"avg"`` only.
    cotangent : {"varying", "replicated"}
        How the adjoint treats its input (see :func:`all_reduce_adjoint`).
        ``"varying"`` (default) is the true adjoint under the inner product
        summed over ranks.
    """

    def __init__(self, comm: CommLike = None, *, op: OpLike = "sum", cotangent: str = "varying") -> None:
        self.comm = as_communicator(comm)
        self.op = normalize_op(op)
        if cotangent not in COTANGENTS:
            raise ArgumentError(f"cotangent: expected 'varying' or 'replicated'; got {cotangent!r}")
        self.cotangent = cotangent
        self.keywords = dict(op=self.op, cotangent=cotangent)

    pair = PAIR["all_reduce"]

    def __repr__(self) -> str:
        return f"AllReduce(op={self.op!r}, cotangent={self.cotangent!r}, size={self.comm.size})"


class AllToAll(_PairOperator):
    """All-to-all from ``split_axis`` to ``concat_axis``; adjoint: the all-to-all back (axes swapped).

    Parameters
    ----------
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    split_axis, concat_axis : int
        As for :func:`~hpccoll.all_to_all`.
    sizes : sequence of int, optional
        The split of ``x`` along ``split_axis``, one extent per destination;
        ``None``: ``numpy.array_split``'s.
    recv_sizes : sequence of int, optional
        The extents along ``concat_axis`` of the blocks received, one per
        source. ``None``: the forward learns them with one small exchange and
        the adjoint splits like ``numpy.array_split``; give them when the
        domain is split otherwise.

    Examples
    --------
    >>> op = hpccoll.AllToAll(comm, split_axis=1, concat_axis=0)   # doctest: +SKIP
    >>> cols = op(rows); rows_again = op.H(cols)                   # doctest: +SKIP
    """

    def __init__(
        self,
        comm: CommLike = None,
        *,
        split_axis: int = 0,
        concat_axis: int = 0,
        sizes: Sizes = None,
        recv_sizes: Sizes = None,
    ) -> None:
        self.comm = as_communicator(comm)
        self.split_axis, self.concat_axis = split_axis, concat_axis
        self.sizes = _check_sizes(sizes, self.comm)
        self.recv_sizes = None if recv_sizes is None else sizes_of(recv_sizes, self.comm.size, "recv_sizes")
        self.keywords = dict(
            split_axis=split_axis, concat_axis=concat_axis, sizes=self.sizes, recv_sizes=self.recv_sizes
        )

    pair = PAIR["all_to_all"]

    def __repr__(self) -> str:
        return (
            f"AllToAll(split_axis={self.split_axis}, concat_axis={self.concat_axis}, sizes={self.sizes}, "
            f"recv_sizes={self.recv_sizes}, size={self.comm.size})"
        )
