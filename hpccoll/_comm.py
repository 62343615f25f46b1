"""The Communicator: a private duplicate of an mpi4py communicator plus settings."""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

from ._env import env_flag
from ._errors import ArgumentError, HpccollError, MismatchError
from ._faults import timeout_from_env
from .transports import choose_transport, make_transport, registered, resolve_transport_name, transport_chain
from .transports._control import allgather_object
from .transports.shm import shared_empty

__all__ = ["Communicator", "as_communicator", "DEFAULT_BUCKET_BYTES"]

#: Largest message the list forms pack arrays into (``HPCCOLL_BUCKET_BYTES`` overrides).
DEFAULT_BUCKET_BYTES = 64 << 20


class Communicator:
    """A group of MPI ranks that hpccoll's collectives run over.

    The wrapped mpi4py communicator is duplicated, so hpccoll's traffic never
    mixes with the caller's own messages on that communicator.

    Parameters
    ----------
    mpi_comm : mpi4py.MPI.Intracomm or Communicator, optional
        The ranks to use; default ``MPI.COMM_WORLD``. It is duplicated
        (``Dup``, a collective call over ``mpi_comm``).
    transport : str, optional
        ``"auto"`` (default) or a transport name from
        :data:`hpccoll.TRANSPORTS`. With ``"auto"`` the environment variable
        ``HPCCOLL_TRANSPORT`` is honoured when set.
    check : bool, optional
        Check every collective across ranks (dtype, shapes, axis, op, sizes)
        before moving data, and raise the same :class:`MismatchError` on every
        rank on disagreement. Default: the ``HPCCOLL_CHECK`` environment
        variable, else off.

    The ``HPCCOLL_TIMEOUT`` environment variable (seconds; unset or 0: off),
    read here, turns on the watchdog: a collective still incomplete after that
    long aborts the job (see :mod:`hpccoll._faults`).

    Attributes
    ----------
    mpi : mpi4py.MPI.Intracomm
        The private duplicate.
    rank, size : int
        This rank and the number of ranks.
    check : bool
        Whether the cross-rank check is on.
    bucket_bytes : int
        The largest message the list forms of the collectives pack arrays
        into (default 64 MiB, or ``HPCCOLL_BUCKET_BYTES``); settable.
    timeout : float or None
        The watchdog's limit in seconds (``HPCCOLL_TIMEOUT``), or ``None``.
    transport : str
        The requested transport name (``"auto"`` unless chosen).
    state : dict
        What the transports remember per Communicator (probe results,
        choices, scratch buffers); cleared by :meth:`free`.

    Examples
    --------
    >>> import hpccoll
    >>> comm = hpccoll.Communicator()            # doctest: +SKIP
    >>> rows = comm.split(comm.rank // 2)        # doctest: +SKIP
    """

    __slots__ = (
        "_mpi",
        "rank",
        "size",
        "check",
        "transport",
        "timeout",
        "bucket_bytes",
        "state",
        "_transports",
        "_by_kind",
        "_owned",
    )

    def __init__(self, mpi_comm: Any = None, *, transport: str = "auto", check: Optional[bool] = None):
        base = _intracomm(mpi_comm)
        transport, check, timeout = _settings(transport, check)  # validated before the collective Dup
        self._setup(base.Dup(), transport, check, timeout)

    @classmethod
    def _adopt(cls, mpi_comm: Any, transport: str, check: bool, timeout: Optional[float]) -> "Communicator":
        """Wrap a communicator hpccoll made itself (no further ``Dup``)."""
        self = cls.__new__(cls)
        self._setup(mpi_comm, transport, check, timeout)
        return self

    def _setup(self, mpi_comm: Any, transport: str, check: bool, timeout: Optional[float]) -> None:
        self._mpi = mpi_comm
        self._owned = True
        self.rank: int = mpi_comm.Get_rank()
        self.size: int = mpi_comm.Get_size()
        self.transport: str = transport
        self.check: bool = check
        self.bucket_bytes: int = _bucket_bytes()
        self.timeout: Optional[float] = timeout
        self._transports: Dict[str, Any] = {}  # name -> instance
        # array kind -> (floor, ((min_bytes, instance or name), ...)): tried in order, see transport_of
        self._by_kind: Dict[str, Any] = {}
        self.state: Dict[str, Any] = {}

    @property
    def mpi(self) -> Any:
        """The private duplicate of the MPI communicator."""
        return self._mpi

    def split(self, color: int, key: int = 0) -> Optional["Communicator"]:
        """Split into sub-groups, like ``MPI_Comm_split`` (collective).

        Parameters
        ----------
        color : int
            Ranks with the same color form one group; ``MPI.UNDEFINED`` joins none.
        key : int
            Orders the ranks within a group (ties broken by the current rank).

        Returns
        -------
        Communicator or None
            This rank's group, with the same ``transport`` and ``check``
            settings; ``None`` where ``color`` is ``MPI.UNDEFINED``.
        """
        for name, value in (("color", color), ("key", key)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise ArgumentError(f"{name}: expected an int; got {type(value).__name__} {value!r}")
        sub = self._mpi.Split(color, key)
        from mpi4py import MPI

        if sub == MPI.COMM_NULL:
            return None
        child = Communicator._adopt(sub, self.transport, self.check, self.timeout)
        child.bucket_bytes = self.bucket_bytes
        return child

    def transport_instance(self, name: str) -> Any:
        """The transport ``name`` bound to this communicator (made on first use)."""
        inst = self._transports.get(name)
        if inst is None:
            inst = self._transports[name] = make_transport(name, self)
        return inst

    def transport_of(self, kind: str, nbytes: int = 0) -> Any:
        """The transport instance a message of ``kind`` arrays (``"numpy"``, ``"cupy"``) uses here.

        ``nbytes`` is the message size as every rank measures it alike (the
        whole array of a reduction, the gathered result of an all-gather):
        ``auto`` may pick a transport by size (:attr:`Transport.min_bytes`).
        Collective the first time for a kind whose choice needs the other
        ranks (see :meth:`transport_for`), and the first time a message
        reaches a size-limited transport's ``min_bytes`` (its probe: every
        rank gets there at the same call, since they measure ``nbytes``
        alike); a dictionary lookup afterwards.
        """
        known = self._by_kind.get(kind)
        if known is None:
            known = self._chain(
                kind,
                tuple(
                    (least, name if least else self.transport_instance(name))
                    for least, name in transport_chain(self, kind)
                ),
            )
        floor, chain = known
        if nbytes < floor:  # below every threshold (or no threshold at all): the last transport
            return chain[-1][1]
        for least, inst in chain:
            if nbytes >= least:
                return inst if type(inst) is not str else self._admit(kind, inst, nbytes)
        return chain[-1][1]

    def _chain(self, kind: str, chain: tuple) -> tuple:
        """Remember ``chain`` for ``kind`` with its floor: the smallest threshold before its last entry."""
        known = self._by_kind[kind] = (min((least for least, _ in chain[:-1]), default=1 << 62), chain)
        return known

    def _admit(self, kind: str, name: str, nbytes: int) -> Any:
        """Probe the size-limited transport ``name`` (collective), keep it in the chain or drop it; then choose."""
        usable = registered(name).auto_reason(self) is None
        self._chain(
            kind,
            tuple(
                (least, self.transport_instance(name) if inst == name else inst)
                for least, inst in self._by_kind[kind][1]
                if inst != name or usable
            ),
        )
        return self.transport_of(kind, nbytes)

    def transport_for(self, array: Any) -> Any:
        """Which transport ``array`` would use on this communicator, and why.

        Collective the first time it is asked about a CuPy array (the GPU
        transports are probed on every rank); cached afterwards.

        Parameters
        ----------
        array : array_like
            A NumPy or CuPy array (other array-likes count as NumPy).

        Returns
        -------
        TransportChoice
            A named tuple ``(name, reason)``, e.g. ``("nccl", "auto: NCCL is
            usable (one GPU per rank)")``.

        Raises
        ------
        TransportUnavailable
            The requested transport cannot run here; the message names why.
        """
        from ._arrays import as_array

        return choose_transport(self, as_array(array)[1])

    def shared_empty(self, shape: Any, dtype: Any = float) -> Any:
        """A new writeable NumPy array for this rank in node-shared memory (collective).

        Compute your shard (or your full input) into it: collectives read it
        in place, without the copy in, and ``all_gather(x, out="shared")`` of
        it returns the shards' own memory (docs/shm.md). ``shape`` may differ
        from rank to rank; the memory is reused once no rank holds a view of
        it, and freed by :meth:`free`.

        Raises
        ------
        ArgumentError
            Bad ``shape`` or ``dtype`` on any rank (on every rank alike).
        TransportUnavailable
            MPI cannot make node-shared windows here.
        """
        return shared_empty(self, shape, dtype)

    def agree(self, what: str, descriptor: Any, local: Any = None, error: Optional[HpccollError] = None) -> list:
        """Compare ``descriptor`` across ranks and share any local ``error`` (collective).

        Raises the lowest failing rank's error on every rank (same type, the
        message naming the rank), or :class:`MismatchError` on every rank when
        the descriptors differ. Returns every rank's ``local`` value.
        """
        gathered = allgather_object(self, (descriptor, local, _portable(error), what), f"{what}'s cross-rank check")
        for rank, (_, _, err, _) in enumerate(gathered):
            if err is not None:
                cls, msg = err
                raise cls(f"{msg} (raised on rank {rank})" if self.size > 1 else msg)
        first, _, _, first_what = gathered[0]
        for rank, (desc, _, _, other_what) in enumerate(gathered):
            if desc != first:
                raise MismatchError(
                    f"ranks disagree on a collective call ({first_what} on rank 0, {other_what} on rank {rank}): "
                    + _difference(first, desc, rank)
                )
        return [loc for _, loc, _, _ in gathered]

    def free(self) -> None:
        """Release the duplicate communicator and transport resources (collective)."""
        for inst in self._transports.values():
            inst.close()
        self._transports.clear()
        self._by_kind.clear()
        self.state.clear()
        if self._owned and not _finalized():
            self._mpi.Free()
        self._owned = False

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.free()

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, size={self.size}, transport={self.transport!r}, check={self.check})"


def _bucket_bytes() -> int:
    raw = os.environ.get("HPCCOLL_BUCKET_BYTES", "").strip()
    if not raw:
        return DEFAULT_BUCKET_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 1:
        raise ArgumentError(f"HPCCOLL_BUCKET_BYTES: expected a positive int (bytes); got {raw!r}")
    return value


def _settings(transport: Any, check: Any) -> tuple:
    name = resolve_transport_name(transport)
    if check is None:
        check = env_flag("HPCCOLL_CHECK", False)
    elif not isinstance(check, bool):
        raise ArgumentError(f"check: expected True, False or None; got {check!r}")
    return name, check, timeout_from_env()


def _portable(error: Optional[HpccollError]) -> Optional[tuple]:
    if error is None:
        return None
    return (type(error), str(error))


def _difference(first: dict, other: dict, rank: int) -> str:
    for key in first:
        if first[key] != other.get(key):
            return f"rank 0 has {key}={first[key]!r} but rank {rank} has {key}={other.get(key)!r}"
    return f"rank 0 and rank {rank} disagree: {first!r} vs {other!r}"


def _finalized() -> bool:
    from mpi4py import MPI

    return MPI.Is_finalized()


def _intracomm(mpi_comm: Any) -> Any:
    from mpi4py import MPI

    if mpi_comm is None:
        return MPI.COMM_WORLD
    if isinstance(mpi_comm, Communicator):
        return mpi_comm.mpi
    if not isinstance(mpi_comm, MPI.Intracomm) or mpi_comm == MPI.COMM_NULL:
        raise ArgumentError(
            "comm: expected an hpccoll.Communicator, an mpi4py Intracomm or None; "
            f"got {type(mpi_comm).__name__}"
            + (" (COMM_NULL)" if isinstance(mpi_comm, MPI.Comm) and mpi_comm == MPI.COMM_NULL else "")
        )
    return mpi_comm


def _release(mpi_comm: Any, keyval: int, cached: "Communicator") -> None:
    """Free the cached duplicate when its communicator is freed (MPI attribute delete callback).

    Without it every ``Comm.Free`` of a communicator hpccoll was given leaked
    one duplicate, and MPICH runs out of communicators after about 2000.
    The predefined communicators are left alone: they are only "freed" by
    ``MPI_Finalize``, when hpccoll no longer calls MPI.
    """
    from mpi4py import MPI

    if mpi_comm != MPI.COMM_WORLD and mpi_comm != MPI.COMM_SELF:
        cached.free()


_KEYVAL: Optional[int] = None
_WORLD: Optional[Communicator] = None


def as_communicator(comm: Any) -> Communicator:
    """Return the :class:`Communicator` for ``comm``.

    ``None`` means the world; an mpi4py communicator gets one duplicate,
    cached on it as an MPI attribute, so repeated calls do not ``Dup`` again.
    """
    global _WORLD, _KEYVAL
    if type(comm) is Communicator:
        return comm
    if comm is None:
        if _WORLD is None:
            _WORLD = as_communicator(_intracomm(None))
        return _WORLD
    if isinstance(comm, Communicator):
        return comm
    mpi_comm = _intracomm(comm)
    from mpi4py import MPI

    if _KEYVAL is None:
        _KEYVAL = MPI.Comm.Create_keyval(delete_fn=_release)
    cached = mpi_comm.Get_attr(_KEYVAL)
    if cached is None:
        cached = Communicator(mpi_comm)
        mpi_comm.Set_attr(_KEYVAL, cached)
    return cached
