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
from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Type

from .. import _settings
from .._errors import ArgumentError, HpccollError, TransportUnavailable
from .._log import child
from ._base import Transport
from ._control import allgather_object
from ._state import remembered
from ._tuned import as_collective, buffers, load, measure_method, message_bytes, race, verdict
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
    "Selector",
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


class Selector:
    """Which transport moves each message of one communicator, and in which form: the one place that decides.

    Two steps, remembered here (``Communicator.selector``) and read alike by
    the collectives, plans, :meth:`~hpccoll.Communicator.explain` and
    ``HPCCOLL_DEBUG``:

    1. the array kind's transports by size (:func:`transport_chain`): a message
       takes the first whose ``min_bytes`` it reaches; a size-limited transport
       is probed (collectively) at its first such message and dropped from the
       chain where it cannot run;
    2. a transport that composes a host transport for the messages it does not
       win (one that declares :attr:`Transport.wins`) hands it every call it
       declares it never moves (:meth:`Transport.leaves`) and, unless it was
       named, every message outside its wins. Inside them the tuning profile's
       verdict decides, else a race against the host transport at the first
       message of each power-of-two size class (:attr:`Transport.first_use`).

    The form: a prepared call's (:meth:`form`: persistent or blocking) and a
    large blocking broadcast's (:meth:`overlaps`). Every rank asks about the
    same call with the same size, so every rank gets the same answer, and
    every probe and race is collective.
    """

    __slots__ = ("comm", "_chains", "_movers", "_raced", "_forms", "_profile")

    #: From this many bytes on, a blocking broadcast that a host transport moves is its non-blocking one
    #: waited on, on every rank alike (every rank's message has the same size), so that root copies its
    #: input into its result while the message travels. Below, the non-blocking call costs more than it
    #: hides (docs/benchmarks.md, the rooted collectives).
    OVERLAP_BYTES = 256 << 10

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self._chains: Dict[str, Any] = {}  # kind -> ((min_bytes, instance or name), ...), tried in order
        self._movers: Dict[tuple, Transport] = {}  # (kind, primitive, nbytes, blocking) -> the transport
        self._raced: Dict[tuple, bool] = {}  # (transport, primitive, size class) -> whether it won its race
        self._forms: Dict[tuple, str] = {}  # (transport, primitive, size class) -> a prepared call's measured form
        self._profile: Optional[dict] = None  # the tuning profile's transport verdicts, read once

    def clear(self) -> None:
        """Forget every choice (the communicator is being freed)."""
        self._chains.clear()
        self._movers.clear()
        self._raced.clear()
        self._forms.clear()

    def choice(self, kind: str) -> TransportChoice:
        """The transport for the smallest messages of ``kind`` arrays and why (``Communicator.transport_for``,
        ``info``, ``explain``); collective the first time, as :func:`choose_transport`."""
        return choose_transport(self.comm, kind)

    def of(self, kind: str, nbytes: int = 0) -> Transport:
        """The transport ``auto``'s chain gives a message of ``kind`` arrays and ``nbytes`` (step 1)."""
        chain = self._chains.get(kind)
        if chain is None:
            comm = self.comm
            chain = self._chains[kind] = tuple(
                (least, name if least else comm.transport_instance(name)) for least, name in transport_chain(comm, kind)
            )
        for least, inst in chain:
            if nbytes >= least:
                return inst if type(inst) is not str else self._admit(kind, inst, nbytes)
        return chain[-1][1]

    def mover(self, kind: str, primitive: str, nbytes: int = 0, blocking: bool = True) -> Transport:
        """The transport that moves ``primitive`` (blocking or not) of ``nbytes`` for ``kind`` arrays (both steps).

        ``nbytes`` is the size every rank measures alike: the gathered
        result of an all-gather, the whole array of a reduction.
        """
        key = (kind, primitive, nbytes, blocking)
        t = self._movers.get(key)
        if t is None:
            if len(self._movers) >= 4096:  # sizes a program keeps changing: forget, rather than grow
                self._movers.clear()
            t = self._movers[key] = self._handed(self.of(kind, nbytes), primitive, nbytes, blocking)
        return t

    def _handed(self, t: Any, primitive: str, nbytes: int, blocking: bool) -> Any:
        """Step 2: ``t``, or the host transport it composes for this call."""
        if t.wins is None:
            return t
        if t.leaves(primitive, blocking):
            return t.host
        if t.name == self.comm.transport or self._won(t, primitive, nbytes):
            return t
        return t.host

    def overlaps(self, t: Any, nbytes: int, copy: bool) -> bool:
        """Whether a blocking broadcast of ``nbytes`` on ``t`` (the selector's) is its non-blocking one waited on.

        From :attr:`OVERLAP_BYTES` on, where a host transport moves the
        message (``t.hosts``): alike on every rank. MPI matches a blocking
        broadcast only with blocking ones. Where the two forms match
        (``t.bcast_forms_match``: host MPI's two-rank broadcast, one message),
        only a root with a ``copy`` to make while it travels takes the
        non-blocking one: waiting on a request straight after starting it
        costs more than the blocking call.
        """
        return nbytes >= self.OVERLAP_BYTES and (copy or not t.bcast_forms_match) and t.hosts

    def form(self, t: Any, primitive: str, args: tuple) -> str:
        """``"persistent"`` or ``"blocking"`` for a prepared call of ``primitive(*args)`` on ``t`` (collective).

        A plan's call (``method="auto"``), a kept halo exchange's. The
        profile's verdict for this call and size when it has one; else
        measured now on scratch buffers (the call's own are never touched) and
        remembered for later calls of the same primitive and size class. A
        transport without persistent requests gets ``"blocking"``, and so
        does one on device buffers (the profile and the race time host
        buffers), unless it runs the call through a host transport
        (``measured_on``: ``staged``), which is then measured instead.
        """
        measured_on = getattr(t, "measured_on", None)
        if measured_on is not None:  # a transport that runs the call through another's (staged: host MPI)
            through = measured_on(primitive, args)
            if through is None:  # it moves the call itself, in one form
                return "blocking"
            t, args = through
        elif getattr(t, "array_kind", "numpy") != "numpy":
            return "blocking"  # device buffers: the profile and the race measure host buffers only
        if not getattr(t, "persistent", False):
            return "blocking"
        comm = self.comm
        primitive, nbytes = allgather_object(comm, (primitive, message_bytes(args)), "a plan's size")[0]
        measured = verdict((load(comm)["profile"] or {}).get("methods", {}).get(primitive), nbytes)
        if measured in ("persistent", "blocking"):
            return str(measured)
        key = (t.name, primitive, int(nbytes).bit_length())
        known = self._forms.get(key)
        if known is None:
            known = self._forms[key] = measure_method(comm, t, primitive, args, nbytes)
        return known

    def _won(self, t: Any, primitive: str, nbytes: int) -> bool:
        """Whether ``t`` moves a blocking ``primitive`` of ``nbytes`` faster than its host transport."""
        if self._profile is None:
            self._profile = (load(self.comm)["profile"] or {}).get("transports", {})
        measured = verdict(self._profile.get(primitive), nbytes) if self._profile else None
        if measured is not None:
            return bool(measured == t.name)
        low, high = t.wins.get(primitive, (0, 0))  # not in the table: the host transport's at every size
        if not low <= nbytes < high or not t.first_use:
            return low <= nbytes < high
        size = min(nbytes, t.race_max_bytes)
        klass = (t.name, primitive, size.bit_length())
        won = self._raced.get(klass)
        if won is None:
            won = self._raced[klass] = self._race(t, primitive, size)
        return won

    def _race(self, t: Any, primitive: str, nbytes: int) -> bool:
        """Whether ``t``'s ``primitive`` ran faster than its host transport's on scratch buffers (collective)."""
        comm = self.comm
        args, rank = buffers(primitive, nbytes, comm), comm.rank
        own, theirs = getattr(t, primitive), getattr(t.host, primitive)
        fns = {
            t.name: as_collective(lambda: own(*args), primitive, args, rank),
            t.host.name: as_collective(lambda: theirs(*args), primitive, args, rank),
        }
        times = race(comm, fns, nbytes, t.race_rounds)
        won = times["ratio"] <= t.race_margin
        _log.debug(
            "%s %s at %d B: first-use race against %s %.3f, %s",
            t.name,
            primitive,
            nbytes,
            t.host.name,
            times["ratio"],
            "won" if won else "lost",
        )
        return bool(won)

    def _admit(self, kind: str, name: str, nbytes: int) -> Transport:
        """Probe the size-limited transport ``name`` (collective), keep it in the chain or drop it; then choose."""
        comm = self.comm
        reason = registered(name).auto_reason(comm)
        usable = reason is None
        if _log.isEnabledFor(DEBUG):  # once per Communicator and size-limited transport
            least = next(least for least, inst in self._chains[kind] if inst == name)
            _log.debug(
                "%s messages of >= %d bytes on a %d-rank communicator: %s",
                _LABEL.get(kind, kind),
                least,
                comm.size,
                f"{name} probed usable, it takes them"
                if usable
                else f"{name} unusable ({reason}): the next transport takes them",
            )
        self._chains[kind] = tuple(
            (least, comm.transport_instance(name) if inst == name else inst)
            for least, inst in self._chains[kind]
            if inst != name or usable
        )
        return self.of(kind, nbytes)
