"""The public collectives and their adjoints: a thin layer over :mod:`hpccoll.collectives`.

Each public function names itself to the collective it runs (so errors say
which call failed) and states its adjoint rule; :data:`PAIRS` declares every
forward/adjoint pair once, and ``adjoint_of``, the operators and the
adapters' maps are derived from it.

The signatures here are plain (``async_op: bool`` gives ``Union[R, Request[R]]``).
Type checkers and IDEs read ``_api.pyi`` instead, whose overloads give the result
of each ``async_op`` and ``axis=None`` form. ``python tests/gen_api_stub.py``
writes it from these signatures; run it after changing one.
"""

from __future__ import annotations

import functools
from inspect import Parameter, getdoc, signature
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    FrozenSet,
    List,
    Literal,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from ._arrays import ArrayT, split_sizes
from ._comm import Communicator, as_communicator
from ._core.agree import refuse
from ._core.launch import then
from ._core.lists import is_array_list
from ._core.validate import LINEAR_OPS, cotangent_of, linear_op, one_array, outs_of
from ._dtypes import reduce_plan
from ._errors import HpccollError
from ._layout import finish_reduction
from ._request import Request
from ._spec import HOOKS, Bound, Hooks, Meta
from .collectives import all_gather as gathering
from .collectives import all_reduce as reducing
from .collectives import alltoall, rooted, shared
from .collectives import reduce_scatter as scattering
from .collectives.halo import halo_exchange as _halo
from .collectives.permute import permute as _permute
from .collectives.shift import shift as _shift

if TYPE_CHECKING:
    from .transports._mpitypes import MPIComm, MPIOp

__all__ = [
    "all_gather",
    "all_gather_adjoint",
    "reduce_scatter",
    "reduce_scatter_adjoint",
    "all_reduce",
    "all_reduce_adjoint",
    "all_to_all",
    "all_to_all_adjoint",
    "broadcast",
    "broadcast_adjoint",
    "reduce",
    "reduce_adjoint",
    "gather",
    "gather_adjoint",
    "scatter",
    "scatter_adjoint",
    "halo_exchange",
    "halo_exchange_adjoint",
    "shift",
    "shift_adjoint",
    "permute",
    "permute_adjoint",
    "split_sizes",
    "CommLike",
    "OpLike",
    "Sizes",
    "Pair",
    "PAIRS",
    "PAIR",
    "pair_of",
]

#: What ``comm`` accepts: a Communicator, an mpi4py intracommunicator, or ``None`` for the world.
CommLike = Union[Communicator, "MPIComm", None]
#: What ``op`` accepts: a name in :data:`hpccoll.OPS` or the ``mpi4py.MPI.Op`` of one.
OpLike = Union[str, "MPIOp"]
#: Per-rank extents along an axis, or ``None`` to discover (or split evenly).
Sizes = Optional[Sequence[int]]


def all_gather(
    x: ArrayT,
    comm: CommLike = None,
    *,
    axis: Optional[int] = 0,
    sizes: Sizes = None,
    out: Union[ArrayT, Literal["shared"], None] = None,
    async_op: bool = False,
) -> Union[ArrayT, Request[ArrayT]]:
    """Concatenate every rank's ``x`` along ``axis``; every rank gets the result.

    Parameters
    ----------
    x : array_like (NumPy or CuPy)
        This rank's shard. Shards may differ in extent along ``axis``; all
        other dimensions, and the dtype, must match across ranks. With
        ``axis=None``, one array of any shape (0-D and empty included), not a
        list.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    axis : int or None
        The axis to concatenate along (negative counts from the end).
        ``None``: no concatenation; the result is a list of ``comm.size``
        arrays, rank q's ``x`` at index q, whose shapes may differ in any
        dimension (mpi4py's lowercase ``allgather``, without pickling: the
        shapes and the dtype are exchanged in one small collective, then the
        bytes move in one). Every rank's dtype must be the same; a difference
        raises :class:`MismatchError` on every rank, check mode or not.
    sizes : sequence of int, optional
        Every rank's extent along ``axis``, one int per rank. ``None``
        discovers them with one small exchange. Must be ``None`` with
        ``axis=None``.
    out : array, list of arrays or "shared", optional
        Where to write the result (shape of the concatenation, dtype of ``x``).
        With ``axis=None``, a list of ``comm.size`` writeable arrays of the
        ranks' shapes and ``x``'s dtype (the result is copied into them).
        ``"shared"`` (NumPy arrays): one read-only result per node, in
        node-shared memory, that every rank of the node views; zero copy when
        ``x`` is this rank's array from :meth:`Communicator.shared_empty`
        (docs/shm.md).
    async_op : bool
        Return a :class:`~hpccoll.Request` at once instead of the result; its
        ``wait()`` returns the result. Any agreement exchange before the data
        moves (``sizes=None`` discovery, check mode) still blocks.

    Returns
    -------
    array or list of arrays
        The concatenation, a new array (or ``out``); it never aliases ``x``,
        except for ``out="shared"`` of a shard from ``shared_empty``, which
        the result takes over (the shard becomes read-only). With
        ``axis=None``, a list of ``comm.size`` new arrays (views of one
        received buffer), or ``out``.

    Raises
    ------
    ArgumentError
        Bad ``axis``, ``sizes`` or ``out``.
    DTypeError
        Unsupported dtype.
    MismatchError
        Ranks disagree on dtype or the other dimensions (always checked when
        ``sizes`` is None; in check mode, also ``axis`` and ``sizes``).

    Examples
    --------
    >>> y = hpccoll.all_gather(np.full(2, comm.rank))        # doctest: +SKIP
    >>> # on 3 ranks: array([0, 0, 1, 1, 2, 2])
    >>> ys = hpccoll.all_gather(np.ones((comm.rank, 2)), axis=None)  # doctest: +SKIP
    >>> # on 3 ranks: a list of arrays of shapes (0, 2), (1, 2) and (2, 2)
    """
    c = as_communicator(comm)
    if axis is None:
        return gathering.all_gather_arrays(x, c, sizes, out, "all_gather", async_op)
    if type(out) is str:
        return shared.shared_all_gather(x, c, axis, sizes, out, "all_gather", async_op)
    return gathering.all_gather(x, c, axis, sizes, out, "all_gather", async_op)


def all_gather_adjoint(
    y: ArrayT,
    comm: CommLike = None,
    *,
    axis: Optional[int] = 0,
    sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: bool = False,
) -> Union[ArrayT, Request[ArrayT]]:
    """Adjoint of :func:`all_gather`: reduce-scatter with sum over the same ``axis`` and ``sizes``.

    Parameters
    ----------
    y : array_like (NumPy or CuPy), or list of arrays
        A cotangent of the gathered array (its full shape), different on
        every rank in general. With ``axis=None``, a list of ``comm.size``
        arrays of one dtype, ``y[q]`` shaped like rank q's ``x``; every rank's
        list has the same shapes (checked: one small exchange, in detail in
        check mode).
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    axis : int or None
        The forward's concatenation axis; ``None`` for the forward's list of
        one array per rank: every rank r gets the sum over ranks of their
        ``y[r]`` (a reduce-scatter of the flat concatenation).
    sizes : sequence of int, optional
        The forward's shard extents. ``None`` means ``numpy.array_split``'s
        split of ``y.shape[axis]``; pass the forward's sizes when the shards
        were split otherwise. Must be ``None`` with ``axis=None``.
    out : array, optional
        Where to write this rank's block (``axis=None``: an array shaped like
        ``y[rank]``).
    async_op : bool
        Return a :class:`~hpccoll.Request` at once instead of the result; its
        ``wait()`` returns the result. Any agreement exchange before the data
        moves (``axis=None``'s shape exchange, check mode) still blocks.

    Returns
    -------
    array
        This rank's block of the sum over ranks of ``y``.

    Examples
    --------
    >>> g = hpccoll.all_gather_adjoint(np.ones(6))   # doctest: +SKIP
    >>> # on 3 ranks: array([3., 3.]) on every rank
    """
    c = as_communicator(comm)
    if axis is None:
        return scattering.reduce_scatter_arrays(y, c, sizes, out, "all_gather_adjoint", async_op)
    return scattering.reduce_scatter(y, c, "sum", axis, sizes, out, "all_gather_adjoint", async_op)


def reduce_scatter(
    x: ArrayT,
    comm: CommLike = None,
    *,
    op: OpLike = "sum",
    axis: int = 0,
    sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: bool = False,
) -> Union[ArrayT, Request[ArrayT]]:
    """Reduce ``x`` elementwise over ranks; return this rank's block along ``axis``.

    Parameters
    ----------
    x : array_like (NumPy or CuPy)
        The full array, the same shape and dtype on every rank.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    op : str or mpi4py.MPI.Op
        ``"sum"``, ``"prod"``, ``"max"``, ``"min"``, ``"avg"``, or the logical
        and bitwise ``"land"``, ``"lor"``, ``"lxor"``, ``"band"``, ``"bor"``,
        ``"bxor"`` (bool and integer dtypes); or the mpi4py ``MPI.Op`` of one.
    axis : int
        The axis to split the result along.
    sizes : sequence of int, optional
        Every rank's block extent; must sum to ``x.shape[axis]``. ``None``
        splits like ``numpy.array_split``.
    out : array, optional
        Where to write this rank's block.
    async_op : bool
        Return a :class:`~hpccoll.Request` at once instead of the result; its
        ``wait()`` returns the result. Any agreement exchange before the data
        moves (check mode) still blocks.

    Returns
    -------
    array
        This rank's block of the reduction, in ``x``'s dtype.

    Raises
    ------
    ArgumentError
        Bad ``op``, ``axis``, ``sizes`` or ``out``.
    DTypeError
        Unsupported dtype, or an op the dtype does not support (see README).

    Examples
    --------
    >>> b = hpccoll.reduce_scatter(np.arange(6.0))   # doctest: +SKIP
    >>> # on 3 ranks, rank 1 gets array([6., 9.])
    """
    return scattering.reduce_scatter(x, as_communicator(comm), op, axis, sizes, out, "reduce_scatter", async_op)


def reduce_scatter_adjoint(
    y: ArrayT,
    comm: CommLike = None,
    *,
    op: OpLike = "sum",
    axis: int = 0,
    sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: bool = False,
) -> Union[ArrayT, Request[ArrayT]]:
    """Adjoint of :func:`reduce_scatter`: all-gather (``sum``), or all-gather / P (``avg``).

    Parameters
    ----------
    y : array_like (NumPy or CuPy)
        A cotangent of this rank's block.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    op : str or mpi4py.MPI.Op
        The forward's op; only ``"sum"`` and ``"avg"`` are linear.
    axis : int
        The forward's split axis.
    sizes : sequence of int, optional
        The forward's block extents; ``None`` discovers them from ``y``.
    out : array, optional
        Where to write the result (the forward's input shape).
    async_op : bool
        Return a :class:`~hpccoll.Request` at once instead of the result; its
        ``wait()`` returns the result. Any agreement exchange before the data
        moves (``sizes=None`` discovery, check mode) still blocks.

    Returns
    -------
    array
        The concatenation of every rank's ``y`` along ``axis`` (divided by
        the number of ranks for ``avg``), a new array (or ``out``).

    Raises
    ------
    UnsupportedOpError
        For ``prod``, ``max`` and ``min``, which are not linear.
    """
    c = as_communicator(comm)
    if type(op) is str and op == "sum":
        return gathering.all_gather(y, c, axis, sizes, out, "reduce_scatter_adjoint", async_op)
    linear = _linear_or_refuse(op, y, c, "reduce_scatter_adjoint")
    return _averaged(gathering.all_gather(y, c, axis, sizes, out, "reduce_scatter_adjoint", async_op), linear, c)


def all_reduce(
    x: ArrayT,
    comm: CommLike = None,
    *,
    op: OpLike = "sum",
    out: Union[ArrayT, Literal["shared"], None] = None,
    async_op: bool = False,
) -> Union[ArrayT, Request[ArrayT]]:
    """Reduce ``x`` elementwise over ranks; every rank gets the full result.

    Parameters
    ----------
    x : array_like (NumPy or CuPy)
        The same shape and dtype on every rank (0-D allowed).
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    op : str or mpi4py.MPI.Op
        ``"sum"``, ``"prod"``, ``"max"``, ``"min"``, ``"avg"``, or the logical
        and bitwise ``"land"``, ``"lor"``, ``"lxor"``, ``"band"``, ``"bor"``,
        ``"bxor"`` (bool and integer dtypes); or the mpi4py ``MPI.Op`` of one.
    out : array or "shared", optional
        Where to write the result. ``out=x`` reduces in place (the only
        allowed overlap with ``x``). ``"shared"`` (NumPy arrays): one
        read-only result per node, in node-shared memory, that every rank of
        the node views (docs/shm.md).
    async_op : bool
        Return a :class:`~hpccoll.Request` at once instead of the result; its
        ``wait()`` returns the result. Any agreement exchange before the data
        moves (check mode) still blocks.

    Returns
    -------
    array
        The reduction, in ``x``'s dtype.

    Examples
    --------
    >>> hpccoll.all_reduce(np.ones(3), op="sum")   # doctest: +SKIP
    >>> # on 4 ranks: array([4., 4., 4.])
    """
    c = as_communicator(comm)
    if type(out) is str:
        return shared.shared_all_reduce(x, c, op, out, "all_reduce", async_op)
    return reducing.all_reduce(x, c, op, out, "all_reduce", async_op)


def all_reduce_adjoint(
    y: ArrayT,
    comm: CommLike = None,
    *,
    op: OpLike = "sum",
    cotangent: str = "varying",
    out: Optional[ArrayT] = None,
    async_op: bool = False,
) -> Union[ArrayT, Request[ArrayT]]:
    """Adjoint of :func:`all_reduce` under the inner product summed over ranks.

    Parameters
    ----------
    y : array_like (NumPy or CuPy)
        The cotangent of the all-reduced result.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    op : str or mpi4py.MPI.Op
        The forward's op; only ``"sum"`` and ``"avg"`` are linear.
    cotangent : {"varying", "replicated"}
        ``"varying"``: every rank holds its own cotangent (the true adjoint,
        itself an all-reduce). ``"replicated"``: every rank holds the same
        cotangent, as in tensor-parallel codes where the reduced result is
        used identically everywhere: the identity for ``sum``, ``y / P`` for
        ``avg``, with no communication. Using ``"varying"`` on replicated
        cotangents overcounts by a factor of P. In check mode, a
        ``"replicated"`` cotangent that differs across ranks raises
        :class:`MismatchError`.
    out : array, optional
        Where to write the result (the shape and dtype of ``y``).
    async_op : bool
        Return a :class:`~hpccoll.Request` at once instead of the result; its
        ``wait()`` returns the result. Any agreement exchange before the data
        moves (check mode) still blocks.

    Returns
    -------
    array
        The cotangent of this rank's input, a new array (or ``out``).

    Raises
    ------
    ArgumentError
        Bad ``cotangent`` or ``out``.
    UnsupportedOpError
        For ``prod``, ``max`` and ``min``, which are not linear.
    """
    c = as_communicator(comm)
    if cotangent == "varying" and type(op) is str and op in LINEAR_OPS:
        return reducing.all_reduce(y, c, op, out, "all_reduce_adjoint", async_op)
    early = None
    many = is_array_list(y)
    try:
        linear = linear_op(op, "all_reduce_adjoint")
        cotangent_of(cotangent)
        outs = outs_of(out, len(y)) if many and cotangent == "replicated" else None
    except HpccollError as e:
        early = e
    if early is not None:  # outside the except block: no "during handling" chain
        refuse(c, "all_reduce_adjoint", early)
    if cotangent == "varying":
        return reducing.all_reduce(y, c, linear, out, "all_reduce_adjoint", async_op)
    return reducing.replicated_adjoint(y if not many else list(y), c, linear, outs if many else out, async_op)


def all_to_all(
    x: ArrayT,
    comm: CommLike = None,
    *,
    split_axis: int = 0,
    concat_axis: int = 0,
    sizes: Sizes = None,
    recv_sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: bool = False,
) -> Union[ArrayT, Request[ArrayT]]:
    """Split ``x`` along ``split_axis``, send block j to rank j, concatenate what arrives along ``concat_axis``.

    Rank j's result is the concatenation, along ``concat_axis`` and in rank
    order, of block j of every rank's ``x``. With different axes this is the
    transpose of a distributed array (a pencil FFT's); with the same axis, a
    personalised exchange of blocks (mixture-of-experts dispatch).

    Parameters
    ----------
    x : array_like (NumPy or CuPy)
        This rank's array. Dtype, number of dimensions and every extent but
        the one along ``concat_axis`` must match across ranks (with equal
        axes, every extent but that axis's).
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    split_axis, concat_axis : int
        The axis ``x`` is split along and the axis the received blocks are
        concatenated along (negative counts from the end; they may be equal).
    sizes : sequence of int, optional
        The extents of ``x``'s blocks along ``split_axis``, one per
        destination rank, summing to ``x.shape[split_axis]``. ``None``:
        ``numpy.array_split``'s. When the axes differ, every rank must split
        alike (the split is one decomposition of that axis); with equal axes
        each rank has its own.
    recv_sizes : sequence of int, optional
        The extents along ``concat_axis`` of the blocks this rank receives,
        one per source rank: rank r's ``sizes[this rank]`` with equal axes,
        else rank r's ``x.shape[concat_axis]``. ``None`` learns them with one
        small exchange before the data moves (which also checks that the
        ranks agree on dtype, axes and the extents that must match); give
        them to skip it, e.g. for a fully non-blocking call.
    out : array, optional
        Where to write the result: ``x``'s shape with extent
        ``sizes[this rank]`` along ``split_axis`` (axes differing) and
        ``sum(recv_sizes)`` along ``concat_axis``; dtype of ``x``; no
        overlap with ``x``.
    async_op : bool
        Return a :class:`~hpccoll.Request` at once instead of the result; its
        ``wait()`` returns the result. Any agreement exchange before the data
        moves (``recv_sizes=None`` discovery, check mode) still blocks.

    Returns
    -------
    array
        The concatenation of the received blocks, a new array (or ``out``).

    Raises
    ------
    ArgumentError
        Bad ``split_axis``, ``concat_axis``, ``sizes``, ``recv_sizes`` or ``out``.
    DTypeError
        Unsupported dtype.
    MismatchError
        Ranks disagree on dtype, axes, the split (axes differing) or the
        extents that must match (always checked when ``recv_sizes`` is None;
        in check mode, also ``recv_sizes`` against what the ranks send).

    Examples
    --------
    >>> x = np.arange(4) + 10 * comm.rank                         # doctest: +SKIP
    >>> hpccoll.all_to_all(x, comm)                               # doctest: +SKIP
    >>> # on 2 ranks: rank 0 gets array([0, 1, 10, 11]), rank 1 array([2, 3, 12, 13])
    >>> rows = np.ones((2, 6))                      # 2 of the rows of a (2P, 6) array
    >>> cols = hpccoll.all_to_all(rows, comm, split_axis=1, concat_axis=0)   # doctest: +SKIP
    >>> # on 3 ranks: every rank gets its (6, 2) block of columns
    """
    c = as_communicator(comm)
    return alltoall.all_to_all(x, c, split_axis, concat_axis, sizes, recv_sizes, out, "all_to_all", async_op)


def all_to_all_adjoint(
    y: ArrayT,
    comm: CommLike = None,
    *,
    split_axis: int = 0,
    concat_axis: int = 0,
    sizes: Sizes = None,
    recv_sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: bool = False,
) -> Union[ArrayT, Request[ArrayT]]:
    """Adjoint of :func:`all_to_all`: the all-to-all back, with the axes swapped and the sizes transposed.

    It is ``all_to_all(y, comm, split_axis=concat_axis, concat_axis=split_axis,
    sizes=recv_sizes, recv_sizes=sizes)``: each block goes back where it came
    from (an all-to-all is a permutation, so its adjoint is its inverse).

    Parameters
    ----------
    y : array_like (NumPy or CuPy)
        A cotangent of this rank's result of the forward.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    split_axis, concat_axis : int
        The forward's axes (as for :func:`all_to_all`).
    sizes : sequence of int, optional
        The forward's ``sizes``; ``None`` learns them with one small exchange
        (they are the extents of the blocks coming back).
    recv_sizes : sequence of int, optional
        The forward's ``recv_sizes``: how ``y`` splits along
        ``concat_axis``. ``None`` means ``numpy.array_split``'s split of
        ``y.shape[concat_axis]``; give the forward's when its inputs were
        split otherwise.
    out : array, optional
        Where to write the result (the shape of the forward's ``x``).
    async_op : bool
        As for :func:`all_to_all`.

    Returns
    -------
    array
        The cotangent of this rank's ``x``.

    Examples
    --------
    >>> op = functools.partial(hpccoll.all_to_all, split_axis=1, concat_axis=0)    # doctest: +SKIP
    >>> x_again = hpccoll.adjoint_of(op)(op(x))                                     # doctest: +SKIP
    """
    c = as_communicator(comm)
    return alltoall.all_to_all(y, c, concat_axis, split_axis, recv_sizes, sizes, out, "all_to_all_adjoint", async_op)


# --------------------------------------------------------------------------- the rooted collectives


def broadcast(
    x: ArrayT, comm: CommLike = None, *, root: int = 0, out: Optional[ArrayT] = None, async_op: bool = False
) -> Union[ArrayT, Request[ArrayT]]:
    """Copy root's ``x`` to every rank.

    Parameters
    ----------
    x : array_like (NumPy or CuPy), or a list of arrays
        Root's is sent; every other rank's gives the shape and dtype of its
        result (its values are ignored). Shape and dtype must match across
        ranks. A list moves every array in one message.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    root : int
        The rank whose ``x`` is sent (``0 <= root < comm.size``).
    out : array or list of arrays, optional
        Where to write the result (``x``'s shape and dtype). ``out=x``
        broadcasts in place: the only allowed overlap with ``x``.
    async_op : bool
        Return a :class:`~hpccoll.Request` at once instead of the result; its
        ``wait()`` returns the result. Check mode's agreement still blocks.

    Returns
    -------
    array or list of arrays
        Root's ``x``, a new array (or ``out``) on every rank, root included.

    Raises
    ------
    ArgumentError
        Bad ``root`` or ``out``.
    DTypeError
        Unsupported dtype.
    MismatchError
        In check mode: ranks disagree on the shape, dtype or ``root``.

    Examples
    --------
    >>> hpccoll.broadcast(np.full(2, comm.rank), root=1)   # doctest: +SKIP
    >>> # on every rank: array([1, 1])
    """
    return rooted.broadcast(x, as_communicator(comm), root, out, "broadcast", async_op)


def broadcast_adjoint(
    y: ArrayT, comm: CommLike = None, *, root: int = 0, out: Optional[ArrayT] = None, async_op: bool = False
) -> Union[ArrayT, Request[ArrayT]]:
    """Adjoint of :func:`broadcast`: root gets the sum over ranks of ``y``; the others get zeros.

    Every rank's result of the broadcast came from root's ``x``, so the
    cotangent of root's ``x`` is the sum of every rank's cotangent, and the
    other ranks' ``x`` (ignored by the broadcast) have zero cotangents. It is
    ``reduce(y, comm, op="sum", root=root)``.

    Parameters
    ----------
    y : array_like (NumPy or CuPy), or a list of arrays
        This rank's cotangent of the broadcast's result.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    root : int
        The forward's root.
    out : array or list of arrays, optional
        Where to write the result (``y``'s shape and dtype); ``out=y`` in place.
    async_op : bool
        As for :func:`broadcast`.

    Returns
    -------
    array or list of arrays
        The cotangent of this rank's ``x``.
    """
    return rooted.reduce(y, as_communicator(comm), "sum", root, out, "broadcast_adjoint", async_op)


def reduce(
    x: ArrayT,
    comm: CommLike = None,
    *,
    op: OpLike = "sum",
    root: int = 0,
    out: Optional[ArrayT] = None,
    async_op: bool = False,
) -> Union[ArrayT, Request[ArrayT]]:
    """Reduce ``x`` elementwise over ranks onto root; the other ranks get zeros.

    Parameters
    ----------
    x : array_like (NumPy or CuPy), or a list of arrays
        The same shape and dtype on every rank (0-D allowed). A list reduces
        the arrays of each dtype in one message.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    op : str or mpi4py.MPI.Op
        Any op of :func:`all_reduce` (``"avg"`` is root's sum divided by the
        number of ranks, once).
    root : int
        The rank that gets the result (``0 <= root < comm.size``).
    out : array or list of arrays, optional
        Where to write the result (``x``'s shape and dtype). ``out=x``
        reduces in place.
    async_op : bool
        Return a :class:`~hpccoll.Request` at once instead of the result; its
        ``wait()`` returns the result. Check mode's agreement still blocks.

    Returns
    -------
    array or list of arrays
        At root the reduction; elsewhere zeros (what the other ranks hold of
        a linear map onto root), in ``x``'s shape and dtype.

    Raises
    ------
    ArgumentError
        Bad ``op``, ``root`` or ``out``.
    DTypeError
        Unsupported dtype, or a (dtype, op) no transport reduces.
    MismatchError
        In check mode: ranks disagree on the shape, dtype, ``op`` or ``root``.

    Examples
    --------
    >>> hpccoll.reduce(np.ones(3), root=0)   # doctest: +SKIP
    >>> # on 4 ranks: rank 0 gets array([4., 4., 4.]), the others array([0., 0., 0.])
    """
    return rooted.reduce(x, as_communicator(comm), op, root, out, "reduce", async_op)


def reduce_adjoint(
    y: ArrayT,
    comm: CommLike = None,
    *,
    op: OpLike = "sum",
    root: int = 0,
    out: Optional[ArrayT] = None,
    async_op: bool = False,
) -> Union[ArrayT, Request[ArrayT]]:
    """Adjoint of :func:`reduce`: every rank gets root's ``y`` (``y / P`` for ``avg``).

    The other ranks' results of the forward are constant zeros: their
    cotangents count for nothing. It is ``broadcast(y, comm, root=root)``
    (divided by the number of ranks for ``avg``).

    Parameters
    ----------
    y : array_like (NumPy or CuPy), or a list of arrays
        The cotangent of the forward's result (only root's values count).
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    op : str or mpi4py.MPI.Op
        The forward's op; only ``"sum"`` and ``"avg"`` are linear.
    root : int
        The forward's root.
    out : array or list of arrays, optional
        Where to write the result (``y``'s shape and dtype); ``out=y`` in place.
    async_op : bool
        As for :func:`reduce`.

    Returns
    -------
    array or list of arrays
        The cotangent of this rank's ``x``.

    Raises
    ------
    UnsupportedOpError
        For the ops that are not linear (``prod``, ``max``, ``min``, the
        logical and bitwise ones).
    """
    c = as_communicator(comm)
    if type(op) is str and op == "sum":
        return rooted.broadcast(y, c, root, out, "reduce_adjoint", async_op)
    linear = _linear_or_refuse(op, y, c, "reduce_adjoint")
    return _averaged(rooted.broadcast(y, c, root, out, "reduce_adjoint", async_op), linear, c)


def _linear_or_refuse(op: Any, y: Any, c: Communicator, what: str) -> str:
    """``op`` normalised and known linear (``avg`` also checked against ``y``'s dtypes), or raise on every rank."""
    try:
        linear = linear_op(op, what)
        if linear == "avg":  # avg on bool or integers raises, as in the forward
            many = is_array_list(y)
            for i, yi in enumerate(y if many else (y,)):
                yi, _, _ = one_array(yi, f"y[{i}]" if many else "y")
                reduce_plan(yi.dtype, linear)
        return linear
    except HpccollError as e:
        early = e
    refuse(c, what, early)  # outside the except block: no "during handling" chain


def _averaged(result: Any, op: str, c: Communicator) -> Any:
    """An adjoint's ``result`` (or a Request of it), divided by the number of ranks for ``avg``."""
    if op != "avg":
        return result
    return then(result, lambda r: finish_reduction(r, c.size, True))


def gather(
    x: ArrayT,
    comm: CommLike = None,
    *,
    root: int = 0,
    axis: int = 0,
    sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: bool = False,
) -> Union[ArrayT, Request[ArrayT]]:
    """Concatenate every rank's ``x`` along ``axis`` onto root; the others get an empty array.

    Parameters
    ----------
    x : array_like (NumPy or CuPy), or a list of arrays
        This rank's shard (at least 1-D). Extents along ``axis`` may differ
        (0 included); the dtype and the other extents must match across
        ranks. A list gathers each array (one transport call each, started
        together).
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    root : int
        The rank that gets the concatenation (``0 <= root < comm.size``).
    axis : int
        The axis to concatenate along (negative counts from the end).
    sizes : sequence of int, optional
        Every rank's extent along ``axis``. ``None`` discovers them with one
        small exchange, which also checks that the ranks agree on the dtype
        and the other extents. For a list: ``None`` or one entry per array.
    out : array or list of arrays, optional
        Where to write the result: at root the concatenation's shape,
        elsewhere ``x``'s shape with extent 0 along ``axis``; ``x``'s dtype;
        no overlap with ``x``.
    async_op : bool
        Return a :class:`~hpccoll.Request` at once instead of the result; its
        ``wait()`` returns the result. Any agreement exchange before the data
        moves (``sizes=None`` discovery, check mode) still blocks.

    Returns
    -------
    array or list of arrays
        At root the concatenation; elsewhere an array of extent 0 along
        ``axis`` (``x``'s other extents, ``x``'s dtype).

    Raises
    ------
    ArgumentError
        Bad ``root``, ``axis``, ``sizes`` or ``out``.
    DTypeError
        Unsupported dtype.
    MismatchError
        Ranks disagree on the dtype or the other extents (always checked
        when ``sizes`` is None; in check mode also ``root``, ``axis`` and
        ``sizes``).

    Examples
    --------
    >>> hpccoll.gather(np.full(comm.rank + 1, comm.rank), root=0)   # doctest: +SKIP
    >>> # on 3 ranks: rank 0 gets array([0, 1, 1, 2, 2, 2]), the others array([])
    """
    return rooted.gather(x, as_communicator(comm), root, axis, sizes, out, "gather", async_op)


def gather_adjoint(
    y: ArrayT,
    comm: CommLike = None,
    *,
    root: int = 0,
    axis: int = 0,
    sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: bool = False,
) -> Union[ArrayT, Request[ArrayT]]:
    """Adjoint of :func:`gather`: root's ``y`` split along ``axis``, block r to rank r.

    It is ``scatter(y, comm, root=root, axis=axis, sizes=sizes)``.

    Parameters
    ----------
    y : array_like (NumPy or CuPy), or a list of arrays
        At root the cotangent of the concatenation; elsewhere any array of
        ``y``'s dtype and other extents (the forward's result there, of
        extent 0 along ``axis``).
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    root : int
        The forward's root.
    axis : int
        The forward's axis.
    sizes : sequence of int, optional
        The forward's extents; ``None`` means ``numpy.array_split`` of root's
        ``y`` (give the forward's when the shards were uneven otherwise).
    out : array or list of arrays, optional
        Where to write the result (this rank's block).
    async_op : bool
        As for :func:`gather`.

    Returns
    -------
    array or list of arrays
        The cotangent of this rank's ``x``.
    """
    return rooted.scatter(y, as_communicator(comm), root, axis, sizes, out, "gather_adjoint", async_op)


def scatter(
    x: ArrayT,
    comm: CommLike = None,
    *,
    root: int = 0,
    axis: int = 0,
    sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: bool = False,
) -> Union[ArrayT, Request[ArrayT]]:
    """Split root's ``x`` along ``axis``; rank r gets block r.

    Parameters
    ----------
    x : array_like (NumPy or CuPy), or a list of arrays
        At root the array to split (at least 1-D). Elsewhere only its dtype
        and its extents other than along ``axis`` count (its extent along
        ``axis`` may be anything, 0 included); they must match root's. A list
        scatters each array (one transport call each, started together).
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    root : int
        The rank whose ``x`` is split (``0 <= root < comm.size``).
    axis : int
        The axis to split along (negative counts from the end).
    sizes : sequence of int, optional
        The blocks' extents, one per rank, summing to root's
        ``x.shape[axis]``. ``None``: ``numpy.array_split`` of root's extent,
        which the other ranks learn with one small exchange (that also
        checks the dtype and the other extents). For a list: ``None`` or one
        entry per array.
    out : array or list of arrays, optional
        Where to write this rank's block; no overlap with ``x``.
    async_op : bool
        Return a :class:`~hpccoll.Request` at once instead of the result; its
        ``wait()`` returns the result. Any agreement exchange before the data
        moves (``sizes=None`` discovery, check mode) still blocks.

    Returns
    -------
    array or list of arrays
        This rank's block of root's ``x``, a new array (or ``out``).

    Raises
    ------
    ArgumentError
        Bad ``root``, ``axis``, ``sizes`` or ``out``.
    DTypeError
        Unsupported dtype.
    MismatchError
        Ranks disagree on the dtype or the other extents (always checked
        when ``sizes`` is None; in check mode also ``root``, ``axis`` and
        ``sizes``).

    Examples
    --------
    >>> hpccoll.scatter(np.arange(5), root=0)   # doctest: +SKIP
    >>> # on 2 ranks: rank 0 gets array([0, 1, 2]), rank 1 array([3, 4])
    """
    return rooted.scatter(x, as_communicator(comm), root, axis, sizes, out, "scatter", async_op)


def scatter_adjoint(
    y: ArrayT,
    comm: CommLike = None,
    *,
    root: int = 0,
    axis: int = 0,
    sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: bool = False,
) -> Union[ArrayT, Request[ArrayT]]:
    """Adjoint of :func:`scatter`: every rank's ``y`` concatenated along ``axis`` onto root.

    It is ``gather(y, comm, root=root, axis=axis, sizes=sizes)``: root gets
    the cotangent of its whole ``x``; the other ranks' ``x`` (whose values the
    scatter ignored) get an array of extent 0 along ``axis``.

    Parameters
    ----------
    y : array_like (NumPy or CuPy), or a list of arrays
        The cotangent of this rank's block.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    root : int
        The forward's root.
    axis : int
        The forward's axis.
    sizes : sequence of int, optional
        The forward's block extents; ``None`` discovers them.
    out : array or list of arrays, optional
        Where to write the result (as for :func:`gather`).
    async_op : bool
        As for :func:`scatter`.

    Returns
    -------
    array or list of arrays
        At root the cotangent of its ``x``; elsewhere an array of extent 0
        along ``axis``.
    """
    return rooted.gather(y, as_communicator(comm), root, axis, sizes, out, "scatter_adjoint", async_op)


# --------------------------------------------------------------------------- halo exchange


def halo_exchange(
    x: ArrayT,
    comm: CommLike,
    *,
    halo: Union[int, Sequence[int]],
    corners: bool = False,
    out: Optional[ArrayT] = None,
    async_op: bool = False,
) -> Union[ArrayT, Request[ArrayT]]:
    """Fill this rank's ghost cells from the neighbours that own them, on a Cartesian process grid.

    Parameters
    ----------
    x : array_like (NumPy or CuPy), or a list of arrays
        This rank's block *including* its ghost layers: ``halo[i]`` layers on
        each side of the first ``len(comm.dims)`` axes (one per grid axis);
        later axes (fields, components) are carried along. Blocks may be
        uneven; neighbours across one grid axis must own the same extents
        along the others (as a block decomposition of a global array does).
        A list exchanges every array in one message per neighbour.
    comm : Communicator
        A Cartesian Communicator (:meth:`Communicator.cartesian`); there is no
        default (``None``, the world, has no process grid and raises
        :class:`ArgumentError`).
    halo : int or sequence of int
        The ghost layers on each side, one width for every grid axis or one
        per axis (0: that axis exchanges nothing).
    corners : bool
        Also fill the ghosts outside the owned extent along two or more axes
        (from the diagonal neighbours), for 9- and 27-point stencils.
    out : array or list of arrays, optional
        Where to write the result (``x``'s shape and dtype); ``out=x``
        exchanges in place.
    async_op : bool
        Return a :class:`~hpccoll.Request` at once instead of the result; its
        ``wait()`` returns the result (compute the interior meanwhile). The
        small agreement exchange before the data moves still blocks.

    Returns
    -------
    array or list of arrays
        A copy of ``x`` (or ``out``) in which every ghost that stands for a
        global cell inside the domain (after the periodic wrap) holds that
        cell's value; ghosts beyond a non-periodic edge, and with
        ``corners=False`` the corner ghosts, keep ``x``'s values.

    Raises
    ------
    ArgumentError
        ``comm`` without a process grid; bad ``halo`` (negative, wider than
        ``x`` allows, or wider than a neighbour's owned cells, on every rank),
        ``corners`` or ``out``; ``x`` with fewer dimensions than the grid.
    MismatchError
        Ranks disagree on the dtype, the number of dimensions, ``halo`` or
        ``corners``, or neighbours' faces do not match (on every rank).

    Notes
    -----
    The same call repeated (one NumPy array exchanged in place, or into
    one ``out``, no check mode; faces that are not contiguous in the array
    are packed into buffers kept with it) is kept prepared from its second call on, on every rank together: its
    messages as MPI persistent requests where they measured faster, the
    arrays kept alive by the communicator (up to 8 exchanges, the oldest
    dropped first). Each call of a communicator that keeps exchanges then
    starts with one small ``Allreduce`` that proves every rank makes the
    same kept call; if one does not, every rank takes the full road. A
    field from :meth:`Communicator.shared_empty`, exchanged in place on
    one node, is read straight from the neighbours' node-shared memory (no
    message; the non-blocking form is then done when it returns).

    Examples
    --------
    >>> grid = hpccoll.Communicator().cartesian([0, 0], periodic=True)   # doctest: +SKIP
    >>> u = hpccoll.halo_exchange(u, grid, halo=1, out=u)                   # doctest: +SKIP
    """
    return _halo(x, as_communicator(comm), halo, corners, out, "halo_exchange", async_op, False)


def halo_exchange_adjoint(
    g: ArrayT,
    comm: CommLike,
    *,
    halo: Union[int, Sequence[int]],
    corners: bool = False,
    out: Optional[ArrayT] = None,
    async_op: bool = False,
) -> Union[ArrayT, Request[ArrayT]]:
    """Adjoint of :func:`halo_exchange`: each filled ghost's cotangent added into the owned cell it came from.

    The ghosts the forward filled become 0; every other cell keeps ``g``'s
    value. Under the inner product summed over ranks this is the exact
    transpose, for every grid, periodicity and ``corners``.

    Parameters
    ----------
    g : array_like (NumPy or CuPy), or a list of arrays
        The cotangent of the forward's result (ghost layers included).
    comm : Communicator
        The forward's Cartesian Communicator (no default, as for :func:`halo_exchange`).
    halo : int or sequence of int
        The forward's ``halo``.
    corners : bool
        The forward's ``corners``.
    out : array or list of arrays, optional
        Where to write the result (``g``'s shape and dtype); ``out=g`` in place.
    async_op : bool
        As for :func:`halo_exchange`.

    Returns
    -------
    array or list of arrays
        The cotangent of this rank's ``x``.
    """
    return _halo(g, as_communicator(comm), halo, corners, out, "halo_exchange_adjoint", async_op, True)


# --------------------------------------------------------------------------- shift along the ring


def shift(
    x: ArrayT, comm: CommLike = None, *, offset: int = 1, out: Optional[ArrayT] = None, async_op: bool = False
) -> Union[ArrayT, Request[ArrayT]]:
    """Pass every rank's block ``offset`` ranks along the ring: rank ``r`` gets the ``x`` of rank ``(r - offset) mod P``.

    The ring step of sequence-parallel (ring) attention, pipelines and
    systolic algorithms: one message to rank ``(r + offset) mod P`` and one
    from rank ``(r - offset) mod P``.

    Parameters
    ----------
    x : array_like (NumPy or CuPy), or a list of arrays
        This rank's block. Every rank's has the same shape and dtype (check
        mode compares them). A list shifts every array in one call.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks, in ring order; ``None`` is the world.
    offset : int
        How many ranks along the ring each block moves (any sign; taken
        modulo the number of ranks, so a multiple of it moves nothing).
    out : array or list of arrays, optional
        Where to write the result (``x``'s shape and dtype); ``out=x`` shifts
        in place.
    async_op : bool
        Return a :class:`~hpccoll.Request` at once instead of the result; its
        ``wait()`` returns the result (compute on the block in hand meanwhile).

    Returns
    -------
    array or list of arrays
        The block of rank ``(r - offset) mod P``, in a new array (or ``out``).

    Raises
    ------
    ArgumentError
        A bad ``offset`` or ``out``, or an unsupported dtype.
    MismatchError
        In check mode, ranks whose shapes, dtypes or ``offset`` differ (on
        every rank).

    Notes
    -----
    The adjoint of a permutation is its inverse: :func:`shift_adjoint` is the
    shift by ``-offset``. A :func:`~hpccoll.plan` of it (``out`` not ``x``,
    ``x`` C-contiguous) is one pair of MPI persistent requests on host MPI.

    Examples
    --------
    >>> kv = hpccoll.shift(kv, comm)             # doctest: +SKIP
    >>> req = hpccoll.shift(kv, comm, async_op=True)   # doctest: +SKIP
    """
    return _shift(x, as_communicator(comm), offset, out, "shift", async_op, False)


def shift_adjoint(
    y: ArrayT, comm: CommLike = None, *, offset: int = 1, out: Optional[ArrayT] = None, async_op: bool = False
) -> Union[ArrayT, Request[ArrayT]]:
    """Adjoint of :func:`shift`: the shift by ``-offset`` (a permutation's transpose is its inverse).

    Parameters
    ----------
    y : array_like (NumPy or CuPy), or a list of arrays
        The cotangent of the forward's result.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The forward's ranks.
    offset : int
        The forward's ``offset``.
    out : array or list of arrays, optional
        Where to write the result; ``out=y`` in place.
    async_op : bool
        As for :func:`shift`.

    Returns
    -------
    array or list of arrays
        The cotangent of this rank's ``x``: the ``y`` of rank ``(r + offset) mod P``.
    """
    return _shift(y, as_communicator(comm), offset, out, "shift_adjoint", async_op, True)


# --------------------------------------------------------------------------- permute: any permutation of the ranks


def permute(
    x: ArrayT,
    comm: CommLike = None,
    *,
    perm: Sequence[Tuple[int, int]],
    out: Optional[ArrayT] = None,
    async_op: bool = False,
) -> Union[ArrayT, Request[ArrayT]]:
    """Send every rank's block to the rank ``perm`` names: rank ``d`` gets the ``x`` of the rank ``s`` with ``(s, d)``.

    JAX's ``ppermute`` for arrays. A rank that no pair sends to gets zeros.
    A pipeline's step is ``perm=[(i, i + 1) for i in range(P - 1)]`` (the
    first stage receives zeros); :func:`shift` is the permutation of the
    whole ring.

    Parameters
    ----------
    x : array_like (NumPy or CuPy), or a list of arrays
        This rank's block. Every rank's has the same shape and dtype (check
        mode compares them). A list permutes every array in one call.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    perm : sequence of (int, int)
        ``(source, dest)`` pairs of ranks, no rank twice as a source or twice
        as a destination; the same on every rank (check mode compares it).
    out : array or list of arrays, optional
        Where to write the result (``x``'s shape and dtype); ``out=x`` in place.
    async_op : bool
        Return a :class:`~hpccoll.Request` at once instead of the result; its
        ``wait()`` returns the result.

    Returns
    -------
    array or list of arrays
        The block of the rank that sends to this one, or zeros, in a new array (or ``out``).

    Raises
    ------
    ArgumentError
        A bad ``perm`` (not pairs of ranks in range, a rank twice on one side) or ``out``, or an unsupported dtype.
    MismatchError
        In check mode, ranks whose shapes, dtypes or ``perm`` differ (on every rank).

    Notes
    -----
    The adjoint of a permutation is its inverse: :func:`permute_adjoint`
    sends along every pair reversed. Each rank sends at most one message and
    receives at most one per array, by the transport's ``sendrecv``, as
    :func:`shift` does.

    Examples
    --------
    >>> y = hpccoll.permute(x, comm, perm=[(0, 1), (1, 2)])   # doctest: +SKIP
    >>> # on 3 ranks: rank 1 gets rank 0's x, rank 2 rank 1's, rank 0 zeros
    """
    return _permute(x, as_communicator(comm), perm, out, "permute", async_op, False)


def permute_adjoint(
    y: ArrayT,
    comm: CommLike = None,
    *,
    perm: Sequence[Tuple[int, int]],
    out: Optional[ArrayT] = None,
    async_op: bool = False,
) -> Union[ArrayT, Request[ArrayT]]:
    """Adjoint of :func:`permute`: the permutation with every pair reversed (a permutation's transpose is its inverse).

    Parameters
    ----------
    y : array_like (NumPy or CuPy), or a list of arrays
        The cotangent of the forward's result.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The forward's ranks.
    perm : sequence of (int, int)
        The forward's ``perm``.
    out : array or list of arrays, optional
        Where to write the result; ``out=y`` in place.
    async_op : bool
        As for :func:`permute`.

    Returns
    -------
    array or list of arrays
        The cotangent of this rank's ``x``: the ``y`` of the rank this one sent to in the forward, or zeros.
    """
    return _permute(y, as_communicator(comm), perm, out, "permute_adjoint", async_op, True)


# --------------------------------------------------------------------------- the pairs, declared once


class Pair(NamedTuple):
    """A public primitive, declared once: a collective and its adjoint under the inner product summed over ranks.

    Attributes
    ----------
    forward, adjoint : callable
        The two public functions; each is the other's adjoint.
    operator : str
        The name of its :class:`~hpccoll.Operator` class.
    adjoint_only : frozenset of str
        Keywords only ``adjoint`` takes (dropped when going to ``forward``).
    """

    forward: Callable[..., Any]
    adjoint: Callable[..., Any]
    operator: str
    adjoint_only: FrozenSet[str] = frozenset()

    @property
    def name(self) -> str:
        """The forward's name (``"all_gather"``)."""
        return self.forward.__name__

    @property
    def hooks(self) -> Hooks:
        """What the collective's module registered about it (:class:`hpccoll._spec.Hooks`: its configuration
        check, its binding to an array's layout, its transport primitive)."""
        return HOOKS[self.name]

    def bind(self, **keywords: Any) -> Tuple[Callable[[Any], Any], Callable[[Any], Any]]:
        """``(forward, adjoint)`` as functions of one array, with ``keywords`` bound to each.

        Parameters
        ----------
        **keywords : object
            Keyword arguments of the two functions (``comm``, ``axis``...);
            those in :attr:`adjoint_only` are not passed to ``forward``.

        Returns
        -------
        tuple of callable
            ``(forward, adjoint)``, each a :class:`functools.partial`.
        """
        forward = {k: v for k, v in keywords.items() if k not in self.adjoint_only}
        return functools.partial(self.forward, **forward), functools.partial(self.adjoint, **keywords)

    def configure(self, comm: Communicator, **keywords: Any) -> Dict[str, Any]:
        """The configuration ``keywords`` checked and normalised, locally (no array, no communication)."""
        return self.hooks.configure(comm, keywords)

    @property
    def configuration(self) -> List[Parameter]:
        """The forward's configuration keywords: its keyword-only parameters but ``out`` and ``async_op`` (what
        an operator's constructor and an adapter's function take; a call takes the other two)."""
        parameters = signature(self.forward).parameters.values()
        return [p for p in parameters if p.kind is p.KEYWORD_ONLY and p.name not in ("out", "async_op")]

    def documented(self) -> Dict[str, str]:
        """The numpydoc ``Parameters`` entries of the forward's and the adjoint's docstrings (the forward's where
        both describe a name), by each parameter name an entry describes: what derived docstrings reuse."""
        return {**_parameters(getdoc(self.adjoint)), **_parameters(getdoc(self.forward))}

    def bound(
        self, meta: Meta, comm: Communicator, tracing: bool = False, **keywords: Any
    ) -> Tuple[Callable[[Any], Any], Callable[[Any], Any], Bound]:
        """``(forward, adjoint, bound)`` for an array described by ``meta``: both sides as functions of one
        array with every keyword resolved (collective where the forward would communicate to resolve it, and
        not ``tracing``), and the :class:`~hpccoll._core.spec.Bound` (result shape, reductions, checks)."""
        b = self.hooks.bind(meta, comm, tracing, keywords)
        forward, adjoint = self.bind(comm=comm, **b.keywords)
        return forward, (adjoint if b.adjoint_as is None else b.adjoint_as(adjoint)), b


def _parameters(doc: Optional[str]) -> Dict[str, str]:
    """A numpydoc docstring's Parameters entries, by each parameter name an entry describes."""
    lines = (doc or "").splitlines()
    if "Parameters" not in lines:
        return {}
    entries: Dict[str, str] = {}
    current: List[str] = []
    names: List[str] = []

    def close() -> None:
        for name in names:
            entries[name] = "\n".join(current).rstrip()

    for i in range(lines.index("Parameters") + 2, len(lines)):
        line = lines[i]
        if line and not line[0].isspace():
            if i + 1 < len(lines) and lines[i + 1].startswith("---"):  # the next section
                break
            close()
            current, names = [line], [n.strip() for n in line.split(" : ")[0].split(",")]
        elif current:
            current.append(line)
    close()
    return entries


#: Every forward/adjoint pair: the one table ``adjoint_of``, the operators and the adapters derive from.
PAIRS: Tuple[Pair, ...] = (
    Pair(all_gather, all_gather_adjoint, "AllGather"),
    Pair(reduce_scatter, reduce_scatter_adjoint, "ReduceScatter"),
    Pair(all_reduce, all_reduce_adjoint, "AllReduce", frozenset({"cotangent"})),
    Pair(all_to_all, all_to_all_adjoint, "AllToAll"),
    Pair(broadcast, broadcast_adjoint, "Broadcast"),
    Pair(reduce, reduce_adjoint, "Reduce"),
    Pair(gather, gather_adjoint, "Gather"),
    Pair(scatter, scatter_adjoint, "Scatter"),
    Pair(halo_exchange, halo_exchange_adjoint, "HaloExchange"),
    Pair(shift, shift_adjoint, "Shift"),
    Pair(permute, permute_adjoint, "Permute"),
)


#: The pairs by their forward function's name.
PAIR: Dict[str, Pair] = {pair.forward.__name__: pair for pair in PAIRS}


def pair_of(fn: Any) -> Optional[Tuple[Pair, bool]]:
    """Look up the pair of a public collective or adjoint function.

    Parameters
    ----------
    fn : object
        A function (or anything else).

    Returns
    -------
    tuple of (Pair, bool) or None
        ``(pair, is_forward)`` when ``fn`` is one of the pairs' functions, else ``None``.
    """
    for pair in PAIRS:
        if fn is pair.forward:
            return pair, True
        if fn is pair.adjoint:
            return pair, False
    return None
