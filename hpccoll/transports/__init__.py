"""Transport registry: selecting a transport is a lookup over capabilities, not an if-chain.

============ ====== ====================================================
name         arrays how
============ ====== ====================================================
``mpi``      NumPy  host MPI (mpi4py buffers)
``nccl``     CuPy   ``cupy.cuda.nccl.NcclCommunicator``, one GPU per rank
``cuda_mpi`` CuPy   CUDA-aware MPI: device buffers handed to mpi4py
``staged``   CuPy   device -> pinned host buffer -> host MPI -> device
``shm``      NumPy  node-shared memory (MPI-3 shared windows), hierarchical across nodes
============ ====== ====================================================

Each transport class declares the array kind it serves (:attr:`Transport.array_kind`),
its place in ``auto``'s order (:attr:`Transport.priority`, lower first) and a
collective probe (:meth:`Transport.auto_reason` for ``auto``,
:meth:`Transport.unavailable_reason` when named). ``auto`` takes the first
registered transport for the array's kind whose probe finds nothing against
it: for CuPy arrays ``nccl``, else ``cuda_mpi`` when MPI is CUDA-aware
(MPI says so, or ``HPCCOLL_CUDA_AWARE_MPI=1``), else ``staged``; for NumPy
arrays ``shm`` for the messages it wins (from :attr:`~Transport.min_bytes`,
when every rank shares one node), else ``mpi``. A
named transport applies to the arrays it serves; for the other kind ``auto``
decides, except that naming a host transport sends CuPy arrays through host
memory (``staged``). A new transport is one module plus one :func:`register`
call, which works at any time (choices already cached on a Communicator stay).
"""

from __future__ import annotations

from logging import DEBUG
from typing import Any, List, NamedTuple, Optional, Tuple, Type

from .. import _settings
from .._errors import ArgumentError, HpccollError, TransportUnavailable
from .._log import child
from ._base import Transport
from ._state import remembered
from .cuda_mpi import CudaMPI
from .host_mpi import HostMPI
from .nccl import NcclTransport
from .shm import SharedMemory
from .staged import Staged

__all__ = [
    "Transport",
    "TransportChoice",
    "TRANSPORTS",
    "register",
    "unregister",
    "registered",
    "transport_classes",
    "make_transport",
    "resolve_transport_name",
    "choose_transport",
    "transport_chain",
    "host_transport_name",
    "shared_transport_name",
]

_REGISTRY: List[Type[Transport]] = []
#: Names accepted by ``Communicator(transport=...)`` (kept current by :func:`register`).
TRANSPORTS: Tuple[str, ...] = ("auto",)

_LABEL = {"numpy": "NumPy", "cupy": "CuPy"}
#: The transport CuPy arrays take when a host (NumPy) transport is named.
_THROUGH_HOST = "staged"

_log = child("transport")


def register(cls: Type[Transport]) -> Type[Transport]:
    """Add a transport class (replacing one of the same name); usable as a class decorator.

    Communicators made afterwards can select it (by name, or ``auto`` by its
    ``array_kind``, ``priority`` and probe); choices already cached on a
    Communicator stay.

    The class's ``name`` is the name users select it by.

    Returns
    -------
    type of Transport
        ``cls`` itself, so that ``@register`` leaves the class in place.
    """
    _REGISTRY[:] = [c for c in _REGISTRY if c.name != cls.name]
    _REGISTRY.append(cls)
    _renamed()
    return cls


def unregister(name: str) -> None:
    """Remove the transport registered as ``name`` (nothing if there is none).

    Parameters
    ----------
    name : str
        The transport's name.
    """
    _REGISTRY[:] = [c for c in _REGISTRY if c.name != name]
    _renamed()


def _renamed() -> None:
    global TRANSPORTS
    _REGISTRY.sort(key=lambda c: c.priority)  # stable: equal priorities keep registration order
    TRANSPORTS = ("auto",) + tuple(c.name for c in _REGISTRY)


for _cls in (HostMPI, NcclTransport, CudaMPI, Staged, SharedMemory):
    register(_cls)


def transport_classes() -> Tuple[Type[Transport], ...]:
    """Every registered transport class, in ``auto``'s order."""
    return tuple(_REGISTRY)


def registered(name: str) -> Type[Transport]:
    """The transport class registered as ``name``."""
    for cls in _REGISTRY:
        if cls.name == name:
            return cls
    raise KeyError(name)


def host_transport_name(comm: Any) -> str:
    """The name of the transport others compose for host MPI on ``comm``: the first usable
    registered NumPy one that declares :attr:`Transport.hosts`, in ``auto``'s order.

    Raises
    ------
    TransportUnavailable
        No registered transport declares it, or none of those can run here.
    """
    return _first_usable(comm, lambda cls: cls.hosts and cls.array_kind == "numpy", "host transport")


def shared_transport_name(comm: Any) -> str:
    """The name of the transport that makes node-shared results on ``comm``: the first usable
    registered one that declares :attr:`Transport.shared_results`, in ``auto``'s order.

    Raises
    ------
    TransportUnavailable
        No registered transport declares it, or none of those can run here.
    """
    return _first_usable(comm, lambda cls: cls.shared_results and cls.array_kind == "numpy", "shared-memory transport")


def _first_usable(comm: Any, capable: Any, what: str) -> str:
    reasons = []
    for cls in _REGISTRY:
        if capable(cls):
            reason = cls.unavailable_reason(comm)
            if reason is None:
                return cls.name
            reasons.append(f"{cls.name}: {reason}")
    raise TransportUnavailable(f"no {what} can run here" + (f" ({'; '.join(reasons)})" if reasons else ""))


class TransportChoice(NamedTuple):
    """Which transport an array would use, and why (see ``Communicator.transport_for``).

    ``name`` is the transport for the smallest messages; where ``auto`` picks
    by size (:attr:`Transport.min_bytes`), ``reason`` says which takes the
    larger ones.
    """

    name: str
    reason: str


#: ``((min_bytes, name), ...)`` in the order tried: a message takes the first entry whose
#: ``min_bytes`` it reaches (the last entry's is 0).
Chain = Tuple[Tuple[int, str], ...]


def resolve_transport_name(name: Any) -> str:
    """Validate a requested transport name; ``"auto"`` defers to ``HPCCOLL_TRANSPORT``."""
    source = "transport"
    if name == "auto":
        env = _settings.raw("HPCCOLL_TRANSPORT")
        if env:
            name, source = env, "HPCCOLL_TRANSPORT"
    if name != "auto" and name not in TRANSPORTS:
        raise ArgumentError(f"{source}: expected one of {', '.join(map(repr, TRANSPORTS))}; got {name!r}")
    return name


def make_transport(name: str, comm: Any) -> Transport:
    """Instantiate transport ``name`` for ``comm``, or raise :class:`TransportUnavailable`."""
    cls = registered(name)
    reason = cls.unavailable_reason(comm)
    if reason is not None:
        raise TransportUnavailable(f"transport {name!r} cannot run here: {reason}")
    return cls(comm)


def choose_transport(comm: Any, kind: str) -> TransportChoice:
    """The transport for arrays of ``kind`` (``"numpy"`` or ``"cupy"``) on ``comm``, and why.

    Collective the first time for a kind whose probes are (the NCCL probe and
    CUDA-aware MPI's are agreed across ranks); the answer, or the
    error, is cached on ``comm``.

    Raises
    ------
    TransportUnavailable
        The requested transport cannot run (on every rank, same message).
    """
    return remembered(comm, "choice:" + kind, lambda: _logged(comm, kind))[0]


def transport_chain(comm: Any, kind: str) -> Chain:
    """The transports a message of ``kind`` arrays may take on ``comm``, by size (see :data:`Chain`).

    Collective and cached like :func:`choose_transport`.
    """
    return remembered(comm, "choice:" + kind, lambda: _logged(comm, kind))[1]


def _logged(comm: Any, kind: str) -> Tuple[TransportChoice, Chain]:
    """:func:`_choose`, logged (``HPCCOLL_DEBUG``): once per Communicator and array kind, when it is made."""
    if not _log.isEnabledFor(DEBUG):
        return _choose(comm, kind)
    label = _LABEL.get(kind, kind)
    try:
        choice, chain = _choose(comm, kind)
    except HpccollError as exc:
        _log.debug("%s arrays on a %d-rank communicator: no transport (%s)", label, comm.size, exc)
        raise
    by_size = ", else ".join(f"{name} for messages of >= {least} bytes" if least else name for least, name in chain)
    _log.debug(
        "%s arrays on a %d-rank communicator (transport=%r): %s; why: %s",
        label,
        comm.size,
        comm.transport,
        by_size,
        choice.reason,
    )
    return choice, chain


def _choose(comm: Any, kind: str) -> Tuple[TransportChoice, Chain]:
    wanted = comm.transport
    if wanted == "auto":
        return _auto(comm, kind)
    cls = registered(wanted)
    if cls.array_kind == kind:
        reason = cls.unavailable_reason(comm)
        if reason is not None:
            raise TransportUnavailable(f"transport {wanted!r} cannot run here: {reason}")
        return _only(wanted, f"transport={wanted!r} requested")
    if kind == "cupy" and cls.array_kind == "numpy":
        return _only(_THROUGH_HOST, f"transport={wanted!r} requested: CuPy arrays go through host memory")
    choice, chain = _auto(comm, kind)
    why = f"{choice.reason} (transport={wanted!r} applies to {_LABEL[cls.array_kind]} arrays)"
    return TransportChoice(choice.name, why), chain


def _only(name: str, reason: str) -> Tuple[TransportChoice, Chain]:
    return TransportChoice(name, reason), ((0, name),)


def _auto(comm: Any, kind: str) -> Tuple[TransportChoice, Chain]:
    """The registered transports for ``kind`` that can run, tried in priority order, and why.

    A transport with a ``min_bytes`` threshold is offered the messages at
    least that large; its probe waits for the first of them
    (``Communicator.transport_of``), so communicators that never move one
    never pay for it. The walk goes on to the first usable transport
    without a threshold.
    """
    skipped: List[str] = []
    chain: List[Tuple[int, str]] = []
    said: List[str] = []
    last: Optional[str] = None
    for cls in _REGISTRY:
        if cls.array_kind != kind:
            continue
        if cls.min_bytes:
            chain.append((cls.min_bytes, cls.name))
            said.append(f"{cls.chosen_because}, for messages of >= {cls.min_bytes} bytes where it can run")
            continue
        last = cls.auto_reason(comm)
        if last is not None:
            skipped.append(f"{cls.name} unusable: {last}")
            continue
        chain.append((0, cls.name))
        chosen_for = getattr(cls, "chosen_for", None)  # a why that depends on comm (cuda_mpi: who said so)
        said.append(chosen_for(comm) if chosen_for else cls.chosen_because)
        why = "auto: " + "; else ".join(said) + (f" ({'; '.join(skipped)})" if skipped else "")
        return TransportChoice(cls.name, why), tuple(chain)
    raise TransportUnavailable(f"no transport can move {_LABEL.get(kind, kind)} arrays here: {last}")
