"""PyTorch ``autograd.Function``\\ s for hpccoll's collectives.

CPU tensors reach hpccoll as zero-copy NumPy views (``tensor.detach().numpy()``)
and the results come back with ``torch.from_numpy``, also without a copy.
``bfloat16``, ``float8_e4m3fn`` and ``float8_e5m2`` travel as their bits, viewed as
ml_dtypes' NumPy dtypes of the same names (needs ``ml_dtypes``); a dtype NumPy
cannot represent otherwise raises :class:`hpccoll.DTypeError` naming it. CUDA tensors are handed
to CuPy through DLPack and the collective runs on PyTorch's current CUDA stream;
that needs CuPy and one of hpccoll's GPU transports (NCCL, CUDA-aware MPI).
Communication goes through mpi4py (and NCCL where the GPU transports use
it); ``torch.distributed`` is not involved and need not be initialised.

Every rank must run the same sequence of forward and backward calls, as for
any collective. Gradients are those of the **sum over ranks** of what each
rank differentiates; for a value replicated on every rank and counted once
use ``all_reduce(..., cotangent="replicated")`` and :func:`replicate` (see
``docs/autodiff.md``). Backward passes are themselves differentiable
(double backward works: every map here is linear).

Requires ``pip install torch`` (``hpccoll[torch]``).

Examples
--------
>>> import torch                                                # doctest: +SKIP
>>> from hpccoll.adapters import torch as hct                   # doctest: +SKIP
>>> w = torch.randn(4, 8, requires_grad=True)                   # doctest: +SKIP
>>> y = hct.all_gather(w, axis=1)  # doctest: +SKIP
>>> y.square().sum().backward()  # doctest: +SKIP

The backward of the all-gather is a reduce-scatter: ``w.grad`` holds this rank's shard of the gradient.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .._api import PAIR, CommLike, OpLike, Pair
from .._arrays import Array
from .._comm import as_communicator
from .._dtypes import ml_dtype
from .._errors import ArgumentError, DTypeError
from .._spec import Meta
from ..transports._cuda import external_stream
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
    "to_array",
    "from_array",
]

Fn = Callable[[Any], Any]


# --------------------------------------------------------------------------- tensor <-> array


#: Torch dtypes NumPy has no type of its own for, by ml_dtypes' name: (the torch dtype, the integer dtypes of
#: its bits in torch and in NumPy). A torch without float8 (before 2.1) lists only bfloat16.
_BITS: Dict[str, Tuple[torch.dtype, torch.dtype, type]] = {
    name: (getattr(torch, name), bits, np_bits)
    for name, bits, np_bits in (
        ("bfloat16", torch.int16, np.int16),
        ("float8_e4m3fn", torch.uint8, np.uint8),
        ("float8_e5m2", torch.uint8, np.uint8),
    )
    if hasattr(torch, name)
}
_BY_TORCH = {tdtype: name for name, (tdtype, _, _) in _BITS.items()}


def to_array(t: torch.Tensor) -> Array:
    """A NumPy (CPU) or CuPy (CUDA) array sharing ``t``'s memory.

    Parameters
    ----------
    t : torch.Tensor
        A CPU or CUDA tensor; its autograd history is ignored. A CPU
        ``bfloat16``, ``float8_e4m3fn`` or ``float8_e5m2`` tensor becomes a
        view of its bits as ml_dtypes' NumPy dtype of the same name.

    Returns
    -------
    numpy.ndarray or cupy.ndarray
        A view of ``t``'s data (a copy only where ``t`` has a lazy conjugate
        or negative bit set).

    Raises
    ------
    ArgumentError
        ``t`` is not a tensor, or lives on a device other than CPU or CUDA.
    DTypeError
        ``t`` is ``bfloat16`` or a float8 and ``ml_dtypes`` is not installed,
        or a CPU tensor of a dtype NumPy cannot represent (``float8_e4m3fnuz``,
        ``complex32``, a quantized dtype...).
    """
    if not isinstance(t, torch.Tensor):
        raise ArgumentError(f"x: expected a torch.Tensor; got {type(t).__name__}")
    t = t.detach().resolve_conj().resolve_neg()
    name = _BY_TORCH.get(t.dtype)
    if t.device.type == "cuda":
        import cupy

        with cupy.cuda.Device(t.device.index):
            if name is None:
                return cupy.from_dlpack(t)
            # bfloat16 and float8 as their bits: CuPy's DLPack import has no float8 (cupy/_core/dlpack.pyx)
            return cupy.from_dlpack(t.view(_BITS[name][1])).view(ml_dtype(name))
    if t.device.type != "cpu":
        raise ArgumentError(f"x: expected a CPU or CUDA tensor; got one on device {t.device}")
    if name is not None:
        dtype = ml_dtype(name)  # first: DTypeError without ml_dtypes
        return t.view(_BITS[name][1]).numpy().view(dtype)
    try:
        return t.numpy()
    except TypeError:  # torch's "Got unsupported ScalarType ..."
        raise DTypeError(
            f"x: expected a tensor dtype NumPy can represent (bool, integers, float16, bfloat16, float8_e4m3fn, "
            f"float8_e5m2, float32, float64, complex64, complex128); got {t.dtype}"
        ) from None


def from_array(a: Array) -> torch.Tensor:
    """A tensor sharing the memory of a NumPy or CuPy array (inverse of :func:`to_array`).

    Parameters
    ----------
    a : numpy.ndarray or cupy.ndarray
        The array; a NumPy ``bfloat16``, ``float8_e4m3fn`` or ``float8_e5m2``
        array (ml_dtypes) becomes a tensor of torch's dtype of that name.

    Returns
    -------
    torch.Tensor
        A CPU tensor (NumPy) or a CUDA tensor (CuPy, through DLPack) over
        ``a``'s memory, without a copy.

    Raises
    ------
    DTypeError
        A NumPy array of a dtype torch has no type for.
    """
    if isinstance(a, np.ndarray):
        entry = _BITS.get(a.dtype.name)
        if entry is not None:
            tdtype, _, np_bits = entry
            return torch.from_numpy(a.view(np_bits)).view(tdtype)
        try:
            return torch.from_numpy(a)
        except TypeError:  # torch's "can't convert np.ndarray of type ..."
            raise DTypeError(f"a: expected a NumPy dtype torch can represent; got {a.dtype}") from None
    entry = _BITS.get(a.dtype.name)
    if entry is not None:  # CuPy exports no float8 through DLPack (cupy/_core/dlpack.pyx): the bits
        return torch.from_dlpack(a.view(entry[2])).view(entry[0])
    return torch.from_dlpack(a)


def _run(fn: Fn, t: torch.Tensor) -> torch.Tensor:
    """Apply an array function to ``t``; on CUDA, on PyTorch's current stream and device."""
    if t.device.type != "cuda":
        return _wrap(fn, t)
    import cupy

    stream = torch.cuda.current_stream(t.device)
    with cupy.cuda.Device(t.device.index), external_stream(cupy, stream.cuda_stream, t.device.index):
        return _wrap(fn, t)


def _wrap(fn: Fn, t: torch.Tensor) -> torch.Tensor:
    a = to_array(t)
    out = fn(a)
    # An identity returns its input: hand back a torch view, so that PyTorch knows the
    # two share memory (version counter, in-place checks) instead of a second alias.
    return t.view_as(t) if out is a else from_array(out)


# --------------------------------------------------------------------------- the Function


class _Linear(torch.autograd.Function):
    """``forward(x)`` whose backward is ``adjoint(grad)``, itself a ``_Linear``."""

    # torch declares forward(ctx, *args, **kwargs) and backward(ctx, *grad_outputs): these narrower
    # signatures are what torch calls them with. The ignores are unused where torch is not installed.
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, forward: Fn, adjoint: Fn) -> torch.Tensor:  # type: ignore[override, unused-ignore]
        ctx.maps = (forward, adjoint)
        return _run(forward, x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], None, None]:  # type: ignore[override, unused-ignore]
        forward, adjoint = ctx.maps
        return _Linear.apply(grad, adjoint, forward), None, None


def _meta(t: torch.Tensor) -> Meta:
    """A tensor's shape and NumPy dtype, for binding a pair (no data access, any device)."""
    shape = _shape_of(t)
    return Meta(shape, len(shape), to_array(torch.empty(0, dtype=t.dtype)).dtype)


def _shape_of(x: torch.Tensor) -> Tuple[int, ...]:
    if not isinstance(x, torch.Tensor):
        raise ArgumentError(f"x: expected a torch.Tensor; got {type(x).__name__}")
    return tuple(x.shape)


def _apply(pair: Pair, x: torch.Tensor, comm: CommLike, **keywords: Any) -> torch.Tensor:
    """``pair``'s forward of ``x`` with ``keywords``, differentiable: its backward is the adjoint, bound to the
    same resolved keywords (the one road of every function here)."""
    forward, adjoint, _ = pair.bound(_meta(x), as_communicator(comm), **keywords)
    return _Linear.apply(x, forward, adjoint)


# --------------------------------------------------------------------------- public functions


def all_gather(
    x: torch.Tensor, comm: CommLike = None, *, axis: int = 0, sizes: Optional[Sequence[int]] = None
) -> torch.Tensor:
    """Differentiable :func:`hpccoll.all_gather` of a tensor; backward: reduce-scatter (sum).

    Parameters
    ----------
    x : torch.Tensor
        This rank's shard (CPU or CUDA).
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    axis : int
        The axis to concatenate along.
    sizes : sequence of int, optional
        Every rank's extent along ``axis``; ``None`` discovers them (one small
        exchange) and the backward pass reuses them, so uneven shards work.

    Returns
    -------
    torch.Tensor
        The concatenation, on ``x``'s device, in ``x``'s dtype.
    """
    return _apply(PAIR["all_gather"], x, comm, axis=axis, sizes=sizes)


def reduce_scatter(
    x: torch.Tensor, comm: CommLike = None, *, op: OpLike = "sum", axis: int = 0, sizes: Optional[Sequence[int]] = None
) -> torch.Tensor:
    """Differentiable :func:`hpccoll.reduce_scatter` of a tensor; backward: all-gather (/P for ``avg``).

    Parameters
    ----------
    x : torch.Tensor
        The full tensor, the same shape on every rank.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    op : str or mpi4py.MPI.Op
        The reduction; only ``"sum"`` and ``"avg"`` can be differentiated
        (the others raise :class:`hpccoll.UnsupportedOpError` in backward).
    axis : int
        The axis the result is split along.
    sizes : sequence of int, optional
        Every rank's block extent; ``None`` splits like ``numpy.array_split``.

    Returns
    -------
    torch.Tensor
        This rank's block of the reduction.
    """
    return _apply(PAIR["reduce_scatter"], x, comm, op=op, axis=axis, sizes=sizes)


def all_reduce(
    x: torch.Tensor, comm: CommLike = None, *, op: OpLike = "sum", cotangent: str = "varying"
) -> torch.Tensor:
    """Differentiable :func:`hpccoll.all_reduce` of a tensor, with the backward convention selectable.

    Parameters
    ----------
    x : torch.Tensor
        The same shape on every rank.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    op : str or mpi4py.MPI.Op
        The reduction; only ``"sum"`` and ``"avg"`` can be differentiated.
    cotangent : {"varying", "replicated"}
        ``"varying"`` (default): backward is an all-reduce (as in
        ``torch.distributed.nn.functional.all_reduce``), the true adjoint when
        each rank differentiates its own loss. ``"replicated"``: backward is
        the identity (``/P`` for ``avg``), as in TransformerEngine and
        Megatron row-parallel layers, where the result and the loss are
        replicated and counted once. The wrong choice is off by a factor of P.

    Returns
    -------
    torch.Tensor
        The reduction.
    """
    return _apply(PAIR["all_reduce"], x, comm, op=op, cotangent=cotangent)


def all_to_all(
    x: torch.Tensor,
    comm: CommLike = None,
    *,
    split_axis: int = 0,
    concat_axis: int = 0,
    sizes: Optional[Sequence[int]] = None,
    recv_sizes: Optional[Sequence[int]] = None,
) -> torch.Tensor:
    """Differentiable :func:`hpccoll.all_to_all` of a tensor; backward: the all-to-all back (axes swapped).

    Parameters
    ----------
    x : torch.Tensor
        This rank's tensor (CPU or CUDA).
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    split_axis, concat_axis : int
        The axis ``x`` is split along and the axis the received blocks are
        concatenated along.
    sizes : sequence of int, optional
        The split of ``x`` along ``split_axis``; ``None``: ``numpy.array_split``'s.
    recv_sizes : sequence of int, optional
        The extents of the received blocks along ``concat_axis``; ``None``
        learns them (one small exchange) and the backward pass reuses them.

    Returns
    -------
    torch.Tensor
        The concatenation of the blocks this rank receives, on ``x``'s device.
    """
    return _apply(
        PAIR["all_to_all"], x, comm, split_axis=split_axis, concat_axis=concat_axis, sizes=sizes, recv_sizes=recv_sizes
    )


def replicate(x: torch.Tensor, comm: CommLike = None) -> torch.Tensor:
    """Identity forward; all-reduce (sum) of the gradient backward.

    Marks a replicated tensor (identical on every rank, counted once) entering
    rank-local computation, e.g. the input of a column-parallel linear layer:
    each rank's backward holds only its part of the gradient, and the
    all-reduce adds them. The partner of ``all_reduce(..., cotangent="replicated")``
    (Megatron's "copy to tensor-parallel region").

    Parameters
    ----------
    x : torch.Tensor
        The replicated tensor.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.

    Returns
    -------
    torch.Tensor
        A view of ``x``. PyTorch forbids modifying it in place, as for any view
        made inside a custom ``autograd.Function``.
    """
    _shape_of(x)
    return _Linear.apply(x, *replicate_maps(as_communicator(comm)))


def broadcast(x: torch.Tensor, comm: CommLike = None, *, root: int = 0) -> torch.Tensor:
    """Differentiable :func:`hpccoll.broadcast` of a tensor; backward: the sum over ranks to ``root``.

    Parameters
    ----------
    x : torch.Tensor
        Root's tensor; every rank passes one of the same shape and dtype (the
        other ranks' values are ignored, and their gradient is zero).
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    root : int
        The rank whose ``x`` every rank gets.

    Returns
    -------
    torch.Tensor
        Root's ``x``, on this rank's device.
    """
    return _apply(PAIR["broadcast"], x, comm, root=root)


def reduce(x: torch.Tensor, comm: CommLike = None, *, op: OpLike = "sum", root: int = 0) -> torch.Tensor:
    """Differentiable :func:`hpccoll.reduce` of a tensor; backward: root's gradient broadcast (/P for ``avg``).

    Parameters
    ----------
    x : torch.Tensor
        The same shape on every rank.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    op : str or mpi4py.MPI.Op
        The reduction; only ``"sum"`` and ``"avg"`` can be differentiated
        (the others raise :class:`hpccoll.UnsupportedOpError` in backward).
    root : int
        The rank that gets the reduction.

    Returns
    -------
    torch.Tensor
        The reduction on ``root``, zeros of ``x``'s shape on the other ranks.
    """
    return _apply(PAIR["reduce"], x, comm, op=op, root=root)


def gather(
    x: torch.Tensor, comm: CommLike = None, *, root: int = 0, axis: int = 0, sizes: Optional[Sequence[int]] = None
) -> torch.Tensor:
    """Differentiable :func:`hpccoll.gather` of a tensor; backward: root's gradient scattered with the same sizes.

    Parameters
    ----------
    x : torch.Tensor
        This rank's shard (CPU or CUDA).
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    root : int
        The rank that gets the concatenation.
    axis : int
        The axis to concatenate along.
    sizes : sequence of int, optional
        Every rank's extent along ``axis``; ``None`` discovers them (one small
        exchange) and the backward pass reuses them, so uneven shards work.

    Returns
    -------
    torch.Tensor
        On ``root`` the concatenation; elsewhere an empty tensor (``x``'s
        shape with extent 0 along ``axis``).
    """
    return _apply(PAIR["gather"], x, comm, root=root, axis=axis, sizes=sizes)


def scatter(
    x: torch.Tensor, comm: CommLike = None, *, root: int = 0, axis: int = 0, sizes: Optional[Sequence[int]] = None
) -> torch.Tensor:
    """Differentiable :func:`hpccoll.scatter` of a tensor; backward: the gradients gathered to ``root``.

    Parameters
    ----------
    x : torch.Tensor
        On ``root`` the tensor to split; elsewhere only its dtype and extents
        other than along ``axis`` count (its gradient there is zero).
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    root : int
        The rank whose ``x`` is split.
    axis : int
        The axis to split along.
    sizes : sequence of int, optional
        Every rank's block extent; ``None`` splits root's extent like
        ``numpy.array_split`` (the other ranks learn it with one small
        exchange) and the backward pass gathers with the same sizes.

    Returns
    -------
    torch.Tensor
        This rank's block of root's ``x``.
    """
    return _apply(PAIR["scatter"], x, comm, root=root, axis=axis, sizes=sizes)


def halo_exchange(
    x: torch.Tensor, comm: CommLike, *, halo: Union[int, Sequence[int]], corners: bool = False
) -> torch.Tensor:
    """Differentiable :func:`hpccoll.halo_exchange` of a tensor; backward: :func:`hpccoll.halo_exchange_adjoint`.

    Parameters
    ----------
    x : torch.Tensor
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
    torch.Tensor
        A new tensor: ``x`` with every ghost that stands for a cell inside the
        domain filled from the neighbour that owns it. Backward adds each
        filled ghost's gradient into that owned cell (on its owner) and zeroes
        the ghost.
    """
    return _apply(PAIR["halo_exchange"], x, comm, halo=halo, corners=corners)


def shift(x: torch.Tensor, comm: CommLike = None, *, offset: int = 1) -> torch.Tensor:
    """Differentiable :func:`hpccoll.shift` of a tensor; backward: :func:`hpccoll.shift_adjoint` (the shift back).

    Parameters
    ----------
    x : torch.Tensor
        This rank's block; every rank's has the same shape and dtype.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks, in ring order.
    offset : int
        How many ranks along the ring each block moves.

    Returns
    -------
    torch.Tensor
        A new tensor: the block of rank ``(r - offset) mod P``. Backward
        passes each gradient back ``offset`` ranks.
    """
    return _apply(PAIR["shift"], x, comm, offset=offset)


#: The pairs not written out above (:data:`hpccoll._api.PAIRS`), each derived from its pair.
DERIVED = derive_missing(globals(), _apply, torch.Tensor, "a tensor")
