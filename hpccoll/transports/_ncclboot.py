"""NCCL's probe and bootstrap: everything the NCCL transport does before its first collective.

One NCCL communicator per :class:`~hpccoll.Communicator` (a ``split()``
gets its own), made on first GPU use, in two collective steps:

1. *Probe* (:func:`probe`, collective, once per Communicator): each rank picks
   its GPU (a device already selected wins; else the GPU hpccoll selected
   earlier; else the node-local rank modulo the visible device count) and
   reads its PCI bus id; the ranks exchange what they found over MPI and agree
   on one verdict, so every rank raises, or falls back, together. Two ranks of
   the communicator on one GPU are refused, unless every rank runs NCCL >= 2.30
   with ``NCCL_MULTI_RANK_GPU_ENABLE=1`` (NCCL's experimental mode of several
   ranks per GPU, for testing multi-rank code on one GPU; docs/gpu.md).
   ``HPCCOLL_NCCL_UNEVEN`` is read and agreed here too.
2. *Bootstrap* (:func:`bootstrap`, collective): rank 0 makes the NCCL unique
   id and broadcasts it over MPI; if that fails, the error is broadcast
   instead and every rank raises :class:`~hpccoll.TransportUnavailable`.

Live NCCL communicators are destroyed at exit, before mpi4py finalizes MPI
(:func:`_close_all`). The transport itself is :mod:`hpccoll.transports.nccl`.
"""

from __future__ import annotations

import atexit
import contextlib
import weakref
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from .. import _settings
from .._errors import ArgumentError, HpccollError, MismatchError, TransportUnavailable
from .._settings import UNEVEN_DESIGNS
from ._cuda import get_runtime
from ._state import remembered

__all__ = ["NcclProbe", "probe", "bootstrap", "destroy", "nccl_version", "check_uneven", "UNEVEN_DESIGNS", "LIVE"]


_PROBE_KEY = "nccl:probe"

#: The first NCCL version (2.30.0) with several ranks per GPU, and the variable that turns that mode on.
MULTI_RANK_VERSION, MULTI_RANK_VARIABLE = 23000, "NCCL_MULTI_RANK_GPU_ENABLE"

#: The live NCCL transports (anything with ``close()``), closed at exit by :func:`_close_all`.
LIVE: "weakref.WeakSet[Any]" = weakref.WeakSet()


class NcclProbe(NamedTuple):
    """What the collective probe found; ``reason`` and ``error`` are the same on every rank."""

    #: Why NCCL cannot run for this communicator, or ``None``.
    reason: Optional[str]
    #: The GPU this rank would use (-1 when unknown).
    device: int
    #: How that GPU was chosen.
    how: str
    #: The uneven-shard design from ``HPCCOLL_NCCL_UNEVEN`` (default ``"auto"``).
    uneven: str
    #: A bad or disagreeing ``HPCCOLL_NCCL_UNEVEN``, raised by the transport on every rank.
    error: Optional[HpccollError]


def probe(comm: Any, chosen: Optional[int] = None) -> NcclProbe:
    """Probe NCCL for ``comm`` (collective the first time; cached on ``comm``).

    Parameters
    ----------
    comm : Communicator
        The communicator to probe for.
    chosen : int, optional
        The GPU hpccoll selected for this process earlier, if it has (kept by
        the transport module); used when no other device is current.

    Returns
    -------
    NcclProbe
        The verdict, the same on every rank.
    """
    return remembered(comm, _PROBE_KEY, lambda: _probe(comm, chosen))


def _probe(comm: Any, chosen: Optional[int]) -> NcclProbe:
    from mpi4py import MPI

    from .._local import local_rank_from_environment

    # Collective steps first and unconditionally, so no rank can skip them.
    node = comm.mpi.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        node_rank, leader = node.Get_rank(), node.bcast(comm.rank, root=0)
    finally:
        node.Free()
    uneven = _settings.raw("HPCCOLL_NCCL_UNEVEN") or "auto"
    why, device, how, bus, shared = None, -1, "", None, ""
    try:
        rt = get_runtime()
        if rt.nccl is None:
            raise TransportUnavailable(f"NCCL is missing: {rt.nccl_missing}")
        try:
            count = rt.device_count()
        except Exception as exc:
            raise TransportUnavailable(f"no GPU ({type(exc).__name__}: {exc})") from None
        if count < 1:
            raise TransportUnavailable("no GPU visible to this process")
        local = local_rank_from_environment() or (node_rank, "MPI.COMM_TYPE_SHARED split")
        device, how = _choose_device(rt, count, local, chosen)
        bus = rt.bus_id(device)
        shared = _multi_rank_mode(rt.nccl)
    except TransportUnavailable as exc:
        why = str(exc)
    except Exception as exc:  # a broken driver or binding: unusable, said plainly
        why = f"{type(exc).__name__}: {exc}"
    facts = comm.mpi.allgather((why, leader, bus, uneven, shared))
    return NcclProbe(_verdict(facts), device, how, uneven, _uneven_error(facts))


def _multi_rank_mode(nccl: Any) -> str:
    """Why several ranks may share a GPU here (``""``: they may not); see :data:`MULTI_RANK_VERSION`."""
    version = nccl_version(nccl)
    if _settings.raw(MULTI_RANK_VARIABLE) != "1" or version < MULTI_RANK_VERSION:
        return ""
    return f"NCCL {version // 10000}.{version // 100 % 100}.{version % 100} with {MULTI_RANK_VARIABLE}=1"


def _choose_device(rt: Any, count: int, local: Tuple[int, str], chosen: Optional[int]) -> Tuple[int, str]:
    """The GPU this rank uses: the user's choice, hpccoll's earlier one (``chosen``), or local rank mod count."""
    current = rt.current_device()
    if current != 0 and current != chosen:
        return current, f"GPU {current}, the current device (selected before hpccoll's first use)"
    if chosen is not None:
        return chosen, f"GPU {chosen}, selected earlier by hpccoll"
    rank, source = local
    device = rank % count
    return device, f"GPU {device}: node-local rank {rank} ({source}) modulo {count} visible GPUs"


def _verdict(facts: List[tuple]) -> Optional[str]:
    many = len(facts) > 1
    for rank, (why, *_) in enumerate(facts):
        if why is not None:
            return f"rank {rank}: {why}" if many else why
    if all(f[4] for f in facts):  # NCCL's multi-rank mode on every rank: sharing a GPU is allowed
        return None
    owner: Dict[tuple, int] = {}
    for rank, (_, node, bus, *_) in enumerate(facts):
        other = owner.setdefault((node, bus), rank)
        if other != rank:
            return (
                f"ranks {other} and {rank} would share one GPU (PCI bus {bus}), which NCCL does not support: "
                "run one rank per GPU (e.g. srun --gpus-per-task=1, or mpiexec with as many ranks per node "
                "as GPUs), or select a different GPU per rank before the first collective "
                f"(for testing only: NCCL >= 2.30 with {MULTI_RANK_VARIABLE}=1 on every rank lets ranks share a GPU)"
            )
    return None


def _uneven_error(facts: List[tuple]) -> Optional[HpccollError]:
    values = [f[3] for f in facts]
    for rank, value in enumerate(values):
        if value != values[0]:
            return MismatchError(f"HPCCOLL_NCCL_UNEVEN: rank 0 has {values[0]!r} but rank {rank} has {value!r}")
    try:
        check_uneven(values[0], "HPCCOLL_NCCL_UNEVEN")
    except ArgumentError as exc:
        return exc
    return None


def check_uneven(value: Any, name: str = "uneven") -> str:
    """``value`` if it is one of :data:`UNEVEN_DESIGNS`.

    Parameters
    ----------
    value : object
        The design asked for.
    name : str
        What to call it in the error.

    Returns
    -------
    str
        ``value``.

    Raises
    ------
    ArgumentError
        ``value`` is not a design.
    """
    if value not in UNEVEN_DESIGNS:
        raise ArgumentError(f"{name}: expected one of {', '.join(map(repr, UNEVEN_DESIGNS))}; got {value!r}")
    return value


# --------------------------------------------------------------------------- bootstrap


def bootstrap(comm: Any, rt: Any) -> Any:
    """Make this rank's ``NcclCommunicator`` (collective); every rank raises together on failure.

    Parameters
    ----------
    comm : Communicator
        The communicator the NCCL one mirrors (same ranks, same order).
    rt : runtime
        The GPU runtime (:func:`~hpccoll.transports._cuda.get_runtime`), with its NCCL binding.

    Returns
    -------
    NcclCommunicator
        This rank's communicator.

    Raises
    ------
    TransportUnavailable
        Rank 0 could not make the unique id, or some rank could not make its communicator (on every rank).
    """
    uid = err = None
    if comm.rank == 0:
        try:
            uid = rt.nccl.get_unique_id()
        except Exception as exc:
            err = f"{type(exc).__name__}: {exc}"
    uid, err = comm.mpi.bcast((uid, err), root=0)
    if err is not None:
        raise TransportUnavailable(
            f"transport 'nccl' cannot run here: rank 0 could not make the NCCL unique id ({err})"
        )
    nc = err = None
    try:
        nc = _init_rank(rt.nccl, comm.size, uid, comm.rank)
    except Exception as exc:
        err = f"{type(exc).__name__}: {exc}"
    errors = comm.mpi.allgather(err)
    failed = [(rank, e) for rank, e in enumerate(errors) if e is not None]
    if failed:
        if nc is not None:
            destroy(nc)
        rank, e = failed[0]
        raise TransportUnavailable(f"transport 'nccl' cannot run here: NcclCommunicator failed on rank {rank} ({e})")
    return nc


def _id_forms(uid: Any) -> List[Any]:
    """``uid`` as rank 0's binding made it, then the other forms a binding may accept.

    CuPy 14 takes and returns 128 ``bytes``; older CuPy a tuple of 128 C
    ``char`` values (signed on x86, unsigned on ARM).
    """
    raw = bytes(uid) if isinstance(uid, (bytes, bytearray)) else bytes(int(v) & 0xFF for v in uid)
    native = raw if isinstance(uid, (bytes, bytearray)) else tuple(int(v) for v in uid)
    forms: List[Any] = [native]
    for form in (raw, tuple(b - 256 if b > 127 else b for b in raw), tuple(raw)):
        if form not in forms:
            forms.append(form)
    return forms


def _init_rank(nccl: Any, size: int, uid: Any, rank: int) -> Any:
    last: Optional[Exception] = None
    for form in _id_forms(uid):
        try:
            return nccl.NcclCommunicator(size, form, rank)
        except (TypeError, OverflowError) as exc:  # rejected by the binding, before NCCL was called
            last = exc
    raise TransportUnavailable(
        f"unique id: expected a form NcclCommunicator accepts (bytes or a tuple of 128 chars); "
        f"got {type(uid).__name__} ({last})"
    )


def destroy(nc: Any) -> None:
    """Destroy ``nc`` (finishing its queued work), or abort it if that fails.

    Parameters
    ----------
    nc : NcclCommunicator
        The communicator to free.
    """
    try:
        nc.destroy()
    except Exception:
        with contextlib.suppress(Exception):
            nc.abort()


@atexit.register
def _close_all() -> None:
    """Destroy live NCCL communicators at exit, before mpi4py finalizes MPI."""
    for transport in list(LIVE):
        with contextlib.suppress(Exception):
            transport.close()


def nccl_version(nccl: Any) -> int:
    """The NCCL library's version code (0 when unknown).

    Parameters
    ----------
    nccl : module
        The binding (``cupy.cuda.nccl`` or a stand-in).

    Returns
    -------
    int
        ``ncclGetVersion``'s code, e.g. 22304 for 2.23.4.
    """
    for getter in ("get_version", "get_build_version"):
        fn = getattr(nccl, getter, None)
        if fn is not None:
            with contextlib.suppress(Exception):
                return int(fn())
    return 0
