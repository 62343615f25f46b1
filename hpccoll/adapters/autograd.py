"""HIPS autograd primitives for hpccoll's collectives.

``autograd.grad`` (and ``make_vjp``, ``make_jvp``, higher orders) flows
through :func:`all_gather`, :func:`reduce_scatter`, :func:`all_reduce`,
:func:`all_to_all`, the rooted :func:`broadcast`, :func:`reduce`,
:func:`gather` and :func:`scatter`, and :func:`halo_exchange`;
every rank must run the same sequence of forward and backward calls, as for
any collective. Requires ``pip install autograd`` (``hpccoll[autograd]``).

The gradient computed on each rank is the gradient of the **sum over ranks**
of the rank-local values that each rank differentiates (see
``docs/autodiff.md``, "Adjoint conventions"). Where a value is replicated and
counted once instead — a loss computed identically on every rank from an
all-reduced result — use ``all_reduce(..., cotangent="replicated")``, and
:func:`replicate` where a replicated value enters rank-local computation.

Examples
--------
>>> import autograd, autograd.numpy as anp                     # doctest: +SKIP
>>> from hpccoll.adapters import autograd as hca               # doctest: +SKIP
>>> def loss(w_shard):                                         # doctest: +SKIP
...     w = hca.all_gather(w_shard)        # backward: reduce-scatter
...     return anp.sum(anp.tanh(w) ** 2)
>>> g = autograd.grad(loss)(w_shard)  # doctest: +SKIP

``g`` is this rank's shard of the gradient.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
from autograd.extend import defjvp, defvjp, primitive
from autograd.tracer import getval

from .._api import PAIR, CommLike, OpLike, Pair
from .._arrays import Array
from .._comm import as_communicator
from .._spec import Meta
from ._common import derive_missing, replicate_maps

__all__ = [
    "all_gather",
    "reduce_scatter",
    "all_reduce",
    "all_to_all",
    "replicate",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "halo_exchange",
    "shift",
]


@primitive
def _linear(x: Array, forward: Callable[[Array], Array], adjoint: Callable[[Array], Array]) -> Array:
    """``forward(x)``, differentiable: its VJP is ``adjoint`` and its JVP is ``forward``."""
    return forward(x)


# A linear map is its own derivative; its transpose is the adjoint, whose transpose is the
# map again, so higher-order derivatives work too.
defvjp(_linear, lambda ans, x, forward, adjoint: lambda g: _linear(g, adjoint, forward))
defjvp(_linear, lambda g, ans, x, forward, adjoint: _linear(g, forward, adjoint))


def _apply(pair: Pair, x: Array, comm: CommLike, **keywords: Any) -> Array:
    """``pair``'s forward of ``x`` with ``keywords``, differentiable: its VJP is the adjoint, bound to the same
    resolved keywords (the one road of every function here)."""
    v = getval(x)
    dtype = v.dtype if isinstance(v, np.ndarray) else np.asarray(v).dtype
    forward, adjoint, _ = pair.bound(Meta(np.shape(v), np.ndim(v), dtype), as_communicator(comm), **keywords)
    return _linear(x, forward, adjoint)


def all_gather(x: Array, comm: CommLike = None, *, axis: int = 0, sizes: Optional[Sequence[int]] = None) -> Array:
    """Differentiable :func:`hpccoll.all_gather`; its VJP is the reduce-scatter (sum) of the cotangent.

    Parameters
    ----------
    x : array or autograd box
        This rank's shard.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    axis : int
        The axis to concatenate along.
    sizes : sequence of int, optional
        Every rank's extent along ``axis``. ``None`` discovers them (one small
        exchange, as :func:`hpccoll.all_gather` does) and the backward pass
        reuses them, so uneven shards are handled.

    Returns
    -------
    array or autograd box
        The concatenation of every rank's ``x``.
    """
    return _apply(PAIR["all_gather"], x, comm, axis=axis, sizes=sizes)


def reduce_scatter(
    x: Array, comm: CommLike = None, *, op: OpLike = "sum", axis: int = 0, sizes: Optional[Sequence[int]] = None
) -> Array:
    """Differentiable :func:`hpccoll.reduce_scatter`; its VJP all-gathers the cotangent (/P for ``avg``).

    Parameters
    ----------
    x : array or autograd box
        The full array, the same shape on every rank.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    op : str or mpi4py.MPI.Op
        The reduction. Only ``"sum"`` and ``"avg"`` can be differentiated;
        the others raise :class:`hpccoll.UnsupportedOpError` in the backward pass.
    axis : int
        The axis the result is split along.
    sizes : sequence of int, optional
        Every rank's block extent; ``None`` splits like ``numpy.array_split``.

    Returns
    -------
    array or autograd box
        This rank's block of the reduction.
    """
    return _apply(PAIR["reduce_scatter"], x, comm, op=op, axis=axis, sizes=sizes)


def all_reduce(x: Array, comm: CommLike = None, *, op: OpLike = "sum", cotangent: str = "varying") -> Array:
    """Differentiable :func:`hpccoll.all_reduce`, with the all-reduce convention selectable.

    Parameters
    ----------
    x : array or autograd box
        The same shape on every rank.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    op : str or mpi4py.MPI.Op
        The reduction; only ``"sum"`` and ``"avg"`` can be differentiated.
    cotangent : {"varying", "replicated"}
        ``"varying"`` (default): the VJP is an all-reduce, the true adjoint
        when each rank differentiates its own value (the objective is the sum
        over ranks). ``"replicated"``: the VJP is the identity (``/P`` for
        ``avg``), right when the result is used identically on every rank and
        the objective counts it once, as in tensor-parallel layers (the
        TransformerEngine / Megatron convention). The wrong choice is off by
        exactly a factor of P.

    Returns
    -------
    array or autograd box
        The reduction.
    """
    return _apply(PAIR["all_reduce"], x, comm, op=op, cotangent=cotangent)


def all_to_all(
    x: Array,
    comm: CommLike = None,
    *,
    split_axis: int = 0,
    concat_axis: int = 0,
    sizes: Optional[Sequence[int]] = None,
    recv_sizes: Optional[Sequence[int]] = None,
) -> Array:
    """Differentiable :func:`hpccoll.all_to_all`; its VJP is the all-to-all back (axes swapped).

    Parameters
    ----------
    x : array or autograd box
        This rank's array.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    split_axis, concat_axis : int
        The axis ``x`` is split along and the axis the received blocks are
        concatenated along.
    sizes : sequence of int, optional
        The split of ``x`` along ``split_axis``; ``None``: ``numpy.array_split``'s.
    recv_sizes : sequence of int, optional
        The extents of the received blocks along ``concat_axis``; ``None``
        learns them (one small exchange) and the backward pass reuses them,
        so any split of the domain is handled.

    Returns
    -------
    array or autograd box
        The concatenation of the blocks this rank receives.
    """
    return _apply(
        PAIR["all_to_all"], x, comm, split_axis=split_axis, concat_axis=concat_axis, sizes=sizes, recv_sizes=recv_sizes
    )


def replicate(x: Array, comm: CommLike = None) -> Array:
    """Identity forward; all-reduce (sum) of the cotangent backward.

    Marks a value that is replicated (identical on every rank, counted once)
    as it enters rank-local computation, such as the input of a
    column-parallel linear layer. Each rank's backward pass then holds only
    its own part of the gradient of the replicated value; the all-reduce adds
    them. It is the partner of ``all_reduce(..., cotangent="replicated")``
    (Megatron's "copy to tensor-parallel region").

    Parameters
    ----------
    x : array or autograd box
        The replicated value.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.

    Returns
    -------
    array or autograd box
        ``x`` itself.
    """
    return _linear(x, *replicate_maps(as_communicator(comm)))


def broadcast(x: Array, comm: CommLike = None, *, root: int = 0) -> Array:
    """Differentiable :func:`hpccoll.broadcast`; its VJP sums the cotangents over ranks to ``root`` (zeros elsewhere).

    Parameters
    ----------
    x : array or autograd box
        Root's value; every rank passes an array of the same shape and dtype
        (the other ranks' values are ignored, and their gradient is zero).
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    root : int
        The rank whose ``x`` every rank gets.

    Returns
    -------
    array or autograd box
        Root's ``x``.
    """
    return _apply(PAIR["broadcast"], x, comm, root=root)


def reduce(x: Array, comm: CommLike = None, *, op: OpLike = "sum", root: int = 0) -> Array:
    """Differentiable :func:`hpccoll.reduce`; its VJP broadcasts root's cotangent (/P for ``avg``).

    Parameters
    ----------
    x : array or autograd box
        The same shape on every rank.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    op : str or mpi4py.MPI.Op
        The reduction. Only ``"sum"`` and ``"avg"`` can be differentiated;
        the others raise :class:`hpccoll.UnsupportedOpError` in the backward pass.
    root : int
        The rank that gets the reduction.

    Returns
    -------
    array or autograd box
        The reduction on ``root``, zeros of ``x``'s shape on the other ranks.
    """
    return _apply(PAIR["reduce"], x, comm, op=op, root=root)


def gather(
    x: Array, comm: CommLike = None, *, root: int = 0, axis: int = 0, sizes: Optional[Sequence[int]] = None
) -> Array:
    """Differentiable :func:`hpccoll.gather`; its VJP scatters root's cotangent with the forward's sizes.

    Parameters
    ----------
    x : array or autograd box
        This rank's shard.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    root : int
        The rank that gets the concatenation.
    axis : int
        The axis to concatenate along.
    sizes : sequence of int, optional
        Every rank's extent along ``axis``. ``None`` discovers them (one small
        exchange, as :func:`hpccoll.gather` does) and the backward pass
        reuses them, so uneven shards are handled.

    Returns
    -------
    array or autograd box
        On ``root`` the concatenation of every rank's ``x``; elsewhere ``x``'s
        shape with extent 0 along ``axis``.
    """
    return _apply(PAIR["gather"], x, comm, root=root, axis=axis, sizes=sizes)


def scatter(
    x: Array, comm: CommLike = None, *, root: int = 0, axis: int = 0, sizes: Optional[Sequence[int]] = None
) -> Array:
    """Differentiable :func:`hpccoll.scatter`; its VJP gathers the cotangents to ``root`` (zeros elsewhere).

    Parameters
    ----------
    x : array or autograd box
        On ``root`` the array to split; elsewhere only its dtype and extents
        other than along ``axis`` count (its gradient there is zero).
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    root : int
        The rank whose ``x`` is split.
    axis : int
        The axis to split along.
    sizes : sequence of int, optional
        Every rank's block extent. ``None`` splits root's extent like
        ``numpy.array_split`` (learned by the other ranks with one small
        exchange) and the backward pass gathers with the same sizes.

    Returns
    -------
    array or autograd box
        This rank's block of root's ``x``.
    """
    return _apply(PAIR["scatter"], x, comm, root=root, axis=axis, sizes=sizes)


def halo_exchange(x: Array, comm: CommLike, *, halo: Union[int, Sequence[int]], corners: bool = False) -> Array:
    """Differentiable :func:`hpccoll.halo_exchange`; its VJP is :func:`hpccoll.halo_exchange_adjoint`.

    Parameters
    ----------
    x : array or autograd box
        This rank's block *including* its ghost layers: ``halo[i]`` on each
        side of the first ``len(comm.dims)`` axes; later axes are carried along.
    comm : Communicator
        A Cartesian Communicator (:meth:`hpccoll.Communicator.cartesian`).
    halo : int or sequence of int
        The ghost layers on each side, one width for every grid axis or one per axis.
    corners : bool
        Also fill the ghosts outside the owned extent along two or more axes
        (from the diagonal neighbours).

    Returns
    -------
    array or autograd box
        ``x`` with every ghost that stands for a cell inside the domain filled
        from the neighbour that owns it. The VJP adds each filled ghost's
        cotangent into that owned cell (on its owner) and zeroes the ghost.
    """
    return _apply(PAIR["halo_exchange"], x, comm, halo=halo, corners=corners)


def shift(x: Array, comm: CommLike = None, *, offset: int = 1) -> Array:
    """Differentiable :func:`hpccoll.shift`; its VJP is :func:`hpccoll.shift_adjoint` (the shift back).

    Parameters
    ----------
    x : array_like
        This rank's block; every rank's has the same shape and dtype.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks, in ring order.
    offset : int
        How many ranks along the ring each block moves.

    Returns
    -------
    array
        The block of rank ``(r - offset) mod P``.
    """
    return _apply(PAIR["shift"], x, comm, offset=offset)


#: The pairs not written out above (:data:`hpccoll._api.PAIRS`), each derived from its pair.
DERIVED = derive_missing(globals(), _apply, Array, "an array")
