"""MPI datatypes, ops and displacements for the MPI transports (mpi4py loaded on first use).

Elementary datatypes come from ``MPI.Datatype.fromcode(dtype.char)``, which is
what :func:`mpi4py.util.dtlib.from_numpy_dtype` uses for them, minus the
``Dup`` dtlib adds: MPI's predefined reduction ops are not defined on
duplicated types. Derived datatypes (inner-axis blocks) are built on these.
"""

from __future__ import annotations

import functools
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Dict, FrozenSet, List, Sequence

import numpy as np

if TYPE_CHECKING:  # for annotations only: mpi4py is loaded on first use
    from mpi4py import MPI

    #: The mpi4py communicators hpccoll's collectives accept (beside a Communicator).
    MPIComm = MPI.Intracomm
    #: The mpi4py reduction ops hpccoll accepts (beside their names).
    MPIOp = MPI.Op

__all__ = [
    "mpi_datatype",
    "mpi_op",
    "displacements",
    "committed",
    "buffer_address",
    "strided",
    "contiguous_run",
    "region",
    "saturating_sums",
    "library",
    "unowned_nonblocking",
    "quirks",
    "signed_unsigned_extrema",
]

_DATATYPES: Dict[np.dtype, Any] = {}
_OPS: Dict[str, Any] = {}


def mpi_datatype(dtype: np.dtype) -> Any:
    """The predefined MPI datatype for a wire ``dtype`` (cached)."""
    t = _DATATYPES.get(dtype)
    if t is None:
        from mpi4py import MPI

        t = _DATATYPES[dtype] = MPI.Datatype.fromcode(dtype.char)
    return t


def mpi_op(op: str) -> Any:
    """The MPI op for a wire op name (``"in_place"`` gives ``MPI.IN_PLACE``)."""
    if not _OPS:
        from mpi4py import MPI

        _OPS.update(sum=MPI.SUM, prod=MPI.PROD, max=MPI.MAX, min=MPI.MIN, in_place=MPI.IN_PLACE)
        _OPS.update(land=MPI.LAND, lor=MPI.LOR, lxor=MPI.LXOR, band=MPI.BAND, bor=MPI.BOR, bxor=MPI.BXOR)
    return _OPS[op]


def displacements(counts: Sequence[int]) -> List[int]:
    """Prefix sums of ``counts``, starting at 0."""
    return [0, *accumulate(counts)][:-1]


def committed(vector: Any, extent: int) -> Any:
    """``vector`` resized to ``extent`` bytes and committed (``vector`` itself is freed)."""
    try:
        return vector.Create_resized(0, extent).Commit()
    finally:
        vector.Free()


def buffer_address(a: Any) -> int:
    """The address of a non-empty NumPy array's first element (``MPI.Get_address``, the cheapest way
    mpi4py has to read it)."""
    global _get_address
    if _get_address is None:
        from mpi4py import MPI

        _get_address = MPI.Get_address
    return _get_address(a)


_get_address: Any = None


def strided(a: Any) -> bool:
    """Whether :func:`region` describes NumPy view ``a``: every stride of an axis longer than 1 positive and a
    multiple of the itemsize (what slicing with positive steps gives; a reversed or reinterpreted view is
    not)."""
    size = a.itemsize
    return all(s > 0 and s % size == 0 for n, s in zip(a.shape, a.strides) if n > 1)


def region(a: Any) -> list:
    """An mpi4py message spec of NumPy view ``a`` (C-contiguous or :func:`strided`): its elements in C order,
    read or written where they lie (no copy), as :func:`element`s, so that both ends of a message have one
    type signature whatever their layouts.

    A C-contiguous view is ``size`` elements; any other, one element of a derived datatype (nested
    ``MPI_Type_create_hvector``, cached by shape and strides) on a byte view that spans ``a`` from its first
    element to its last (a view of ``a``'s memory: a request holding it keeps that memory alive).
    """
    t, per_item = element(a.dtype)
    if a.flags.c_contiguous:
        return [a.reshape(-1).view(_BYTE), a.size * per_item, t]
    span = 1 + sum((n - 1) * s for n, s in zip(a.shape, a.strides)) // a.itemsize
    whole = np.lib.stride_tricks.as_strided(a, (span,), (a.itemsize,))
    return [whole.view(_BYTE), 1, region_type(a.shape, a.strides, a.dtype)]


def element(dtype: np.dtype) -> Any:
    """``(datatype, count per item)``: how :func:`region` counts ``dtype``'s items, the dtype's predefined MPI
    datatype where it has one of its size, else its bytes (cached): MPI packs typed elements faster than runs of
    bytes (docs/benchmarks.md, halo exchange on every face layout). Both ends of a message count it alike."""
    got = _ELEMENTS.get(dtype)
    if got is None:
        from mpi4py import MPI

        try:
            t = mpi_datatype(dtype)
            ok = t.Get_size() == dtype.itemsize
        except (KeyError, ValueError, MPI.Exception):  # no predefined MPI datatype
            ok = False
        got = _ELEMENTS[dtype] = (t, 1) if ok else (MPI.BYTE, dtype.itemsize)
    return got


def region_type(shape: Sequence[int], strides: Sequence[int], dtype: np.dtype) -> Any:
    """The committed datatype of :func:`region`: axes of extent 1 dropped, axes that are contiguous with the
    next merged, then one ``hvector`` per remaining axis, the innermost's blocks the contiguous run (cached)."""
    axes = _merged_axes(shape, strides)
    key = (tuple(map(tuple, axes)), dtype)
    t = _REGIONS.get(key)
    if t is not None:
        return t
    item, run = element(dtype)
    if axes and axes[-1][1] == dtype.itemsize:  # the innermost axis is contiguous: one run
        run *= axes.pop()[0]
    if axes:  # the run as the blocks of the next axis out (one vector, as MPI's own subarray types are)
        n, s = axes.pop()
        t = item.Create_hvector(n, run, s)
    else:
        t = item.Create_contiguous(run)
    for n, s in reversed(axes):
        inner = t
        t = inner.Create_hvector(n, 1, s)
        inner.Free()
    t.Commit()
    if len(_REGIONS) >= 256:  # a program of many layouts: start again (MPI keeps a type alive while in use)
        for old in _REGIONS.values():
            old.Free()
        _REGIONS.clear()
    _REGIONS[key] = t
    return t


def _merged_axes(shape: Sequence[int], strides: Sequence[int]) -> List[List[int]]:
    """``[extent, stride]`` per axis, axes of extent 1 dropped and each axis merged into the one before it
    where that one steps over exactly it (the axes of one contiguous run become one)."""
    axes: List[List[int]] = []
    for n, s in zip(shape, strides):
        if n == 1:
            continue
        if axes and axes[-1][1] == n * s:
            axes[-1] = [axes[-1][0] * n, s]
        else:
            axes.append([n, s])
    return axes


def contiguous_run(a: Any) -> int:
    """The bytes of NumPy view ``a``'s innermost contiguous run (its itemsize where the innermost axis is strided)."""
    axes = _merged_axes(a.shape, a.strides)
    return a.itemsize * (axes[-1][0] if axes and axes[-1][1] == a.itemsize else 1)


_BYTE = np.dtype(np.uint8)
_REGIONS: Dict[tuple, Any] = {}
_ELEMENTS: Dict[np.dtype, Any] = {}


#: The integer dtypes whose MPI_SUM could saturate instead of wrapping (8 and 16 bits).
SMALL_INTS = ("int8", "uint8", "int16", "uint16")


def library() -> str:
    """The first line of ``MPI_Get_library_version`` (``"Open MPI v5.0.11, ..."``, ``"MPICH Version: ..."``)."""
    from mpi4py import MPI

    return MPI.Get_library_version().strip().splitlines()[0].strip()


@functools.cache
def saturating_sums() -> FrozenSet[np.dtype]:
    """The 8- and 16-bit integer dtypes whose ``MPI_SUM`` saturates in this MPI library (decided once).

    Open MPI's vectorised reduction kernels (``op/avx``) saturate sums of
    8- and 16-bit integers where NumPy wraps (upstream open-mpi/ompi#8045,
    closed as won't fix): 4 x int16 of 16385 sum to 32767 there, to -16 in
    NumPy. The collectives widen those dtypes' sums to 32 bits (as 16-bit
    floats are widened to float32) and wrap the result back like NumPy.

    Every rank must decide alike (ranks reducing in different wire dtypes
    would exchange different byte counts), so the answer comes from the
    library's name where it is known to saturate -- all of Open MPI, whatever
    kernels each node's CPU selects -- and otherwise from a local,
    communication-free probe (``MPI.SUM.Reduce_local`` on 4096 elements, the
    same kernels the collectives run), which depends only on the library.
    """
    from mpi4py import MPI

    if library().startswith("Open MPI"):
        found = set(SMALL_INTS)
    else:
        found = set()
        for name in SMALL_INTS:
            top = np.iinfo(name).max
            a, b = np.full(4096, top, name), np.full(4096, top, name)
            MPI.SUM.Reduce_local(a, b)
            if (b != np.add(a, a, dtype=name)).any():
                found.add(name)
    return frozenset(np.dtype(n) for n in found)


@functools.cache
def unowned_nonblocking() -> List[str]:
    """The non-blocking MPI calls hpccoll uses whose mpi4py request keeps no reference to its buffers.

    Probed once on ``MPI.COMM_SELF`` (local, no other rank involved): a
    buffer referenced only by the call is freed while the request is still
    pending. hpccoll's :class:`~hpccoll.Request` holds every buffer it hands
    MPI until completion, so this is worked around whatever the answer.
    """
    import gc
    import weakref

    from mpi4py import MPI

    me = MPI.COMM_SELF
    calls = {
        "Iallreduce": lambda x, r: me.Iallreduce(x, r),
        "Iallgatherv": lambda x, r: me.Iallgatherv(x, [r, [4]]),
        "Ireduce_scatter": lambda x, r: me.Ireduce_scatter(x, r, [4]),
        "Ireduce_scatter_block": lambda x, r: me.Ireduce_scatter_block(x, r),
        "Ialltoallv": lambda x, r: me.Ialltoallv([x, [4]], [r, [4]]),
    }
    found = []
    for name, call in calls.items():
        x, r = np.ones(4), np.empty(4)
        ref = weakref.ref(x)
        request = call(x, r)
        del x
        gc.collect()
        if ref() is None:
            found.append(name)
        request.Wait()
    return found


def quirks() -> List[str]:
    """What this MPI library and mpi4py do differently from other MPIs, and what hpccoll does about it."""
    out = []
    sat = sorted(d.name for d in saturating_sums())
    if sat:
        out.append(
            f"MPI_SUM saturates {', '.join(sat)} (Open MPI's vector kernels, open-mpi/ompi#8045): "
            "hpccoll sums them as 32-bit integers and wraps the result back, like NumPy"
        )
    if signed_unsigned_extrema():
        out.append(
            "MPI_MAX and MPI_MIN compare uint64 as signed: hpccoll reduces uint64 extrema with the top "
            "bit flipped, as int64, and flips it back"
        )
    unowned = unowned_nonblocking()
    if unowned:
        import mpi4py

        out.append(
            f"mpi4py {mpi4py.__version__} keeps no reference to the buffers of {', '.join(unowned)}: "
            "hpccoll's requests hold every buffer (and packed copy) until they complete"
        )
    if library().startswith("Open MPI"):
        out.append(
            "MPI_Reduce_scatter and MPI_Ireduce_scatter (uneven blocks) reduce in different orders "
            "(coll/tuned against libnbc): float and complex results of the blocking and non-blocking "
            "reduce_scatter may differ in the last bits (docs/mpi.md, reduction order)"
        )
        out.append(
            "mpiexec refuses root and more ranks than cores unless told: OMPI_ALLOW_RUN_AS_ROOT=1 "
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1, and PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe "
            "(Open MPI 5) or OMPI_MCA_rmaps_base_oversubscribe=1 (4.x); the Makefile and the tests' "
            "launcher set them"
        )
    return out


@functools.cache
def signed_unsigned_extrema() -> bool:
    """Whether this MPI's ``MPI_MAX``/``MPI_MIN`` compare ``uint64`` as signed (decided once, locally).

    Debian's Open MPI 4.1.4 does: the max of 2**63 + 5 and 7 comes out 7. The host transport then
    reduces ``uint64`` extrema with the top bit flipped, as ``int64`` (an order-preserving map), and
    flips it back. A local ``Reduce_local`` probe: the same kernels on every rank of one library.
    """
    from mpi4py import MPI

    a, b = np.array([(1 << 63) + 5], np.uint64), np.array([7], np.uint64)
    MPI.MAX.Reduce_local(a, b)
    return int(b[0]) != (1 << 63) + 5
