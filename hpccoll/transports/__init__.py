"""Transport registry: selecting a transport is a lookup, not an if-chain.

============ ====== ====================================================
name         arrays how
============ ====== ====================================================
``mpi``      NumPy  host MPI (mpi4py buffers)
``nccl``     CuPy   ``cupy.cuda.nccl.NcclCommunicator``, one GPU per rank
``cuda_mpi`` CuPy   CUDA-aware MPI: device buffers handed to mpi4py
``staged``   CuPy   device -> pinned host buffer -> host MPI -> device
============ ====== ====================================================

``auto`` (the default): NumPy arrays use ``mpi``; CuPy arrays use ``nccl``
when it is usable for the communicator, else ``cuda_mpi`` when
``HPCCOLL_CUDA_AWARE_MPI=1``, else ``staged``. A named transport applies to
CuPy arrays (``mpi`` then means ``staged``); NumPy arrays always use ``mpi``.
"""

from __future__ import annotations

import os
from typing import Any, Dict, NamedTuple, Type

from .._errors import ArgumentError, TransportUnavailable
from ._base import Transport
from ._state import remembered
from .cuda_mpi import CudaMPI, cuda_aware, warn_undeclared
from .host_mpi import HostMPI
from .nccl import NcclTransport
from .staged import Staged

__all__ = [
    "Transport",
    "TransportChoice",
    "TRANSPORTS",
    "register",
    "make_transport",
    "resolve_transport_name",
    "choose_transport",
    "select_transport",
]

_REGISTRY: Dict[str, Type[Transport]] = {}


def register(cls: Type[Transport]) -> Type[Transport]:
    """Add a transport class to the registry under ``cls.name``."""
    _REGISTRY[cls.name] = cls
    return cls


for _cls in (HostMPI, NcclTransport, CudaMPI, Staged):
    register(_cls)

#: Names accepted by ``Communicator(transport=...)``.
TRANSPORTS = ("auto",) + tuple(_REGISTRY)


class TransportChoice(NamedTuple):
    """Which transport an array would use, and why (see ``Communicator.transport_for``)."""

    name: str
    reason: str


def resolve_transport_name(name: Any) -> str:
    """Validate a requested transport name; ``"auto"`` defers to ``HPCCOLL_TRANSPORT``."""
    source = "transport"
    if name == "auto":
        env = os.environ.get("HPCCOLL_TRANSPORT", "").strip()
        if env:
            name, source = env, "HPCCOLL_TRANSPORT"
    if name != "auto" and name not in _REGISTRY:
        raise ArgumentError(f"{source}: expected one of {', '.join(map(repr, TRANSPORTS))}; got {name!r}")
    return name


def make_transport(name: str, comm: Any) -> Transport:
    """Instantiate transport ``name`` for ``comm``, or raise :class:`TransportUnavailable`."""
    cls = _REGISTRY[name]
    reason = cls.unavailable_reason(comm)
    if reason is not None:
        raise TransportUnavailable(f"transport {name!r} cannot run here: {reason}")
    return cls(comm)


def choose_transport(comm: Any, kind: str) -> TransportChoice:
    """The transport for arrays of ``kind`` (``"numpy"`` or ``"cupy"``) on ``comm``, and why.

    Collective the first time for CuPy arrays on ``comm`` (the NCCL probe and
    ``HPCCOLL_CUDA_AWARE_MPI`` are agreed across ranks); the answer, or the
    error, is cached on ``comm``.

    Raises
    ------
    TransportUnavailable
        The requested transport cannot run (on every rank, same message).
    """
    return remembered(comm, "choice:" + kind, lambda: _choose(comm, kind))


def _choose(comm: Any, kind: str) -> TransportChoice:
    wanted = comm.transport
    if kind == "numpy":
        note = "" if wanted in ("auto", "mpi") else f" (transport={wanted!r} applies to CuPy arrays)"
        return TransportChoice("mpi", "NumPy arrays always use host MPI" + note)
    if wanted == "mpi":
        return TransportChoice("staged", "transport='mpi' requested: CuPy arrays go through host memory")
    if wanted != "auto":
        reason = _REGISTRY[wanted].unavailable_reason(comm)
        if reason is not None:
            raise TransportUnavailable(f"transport {wanted!r} cannot run here: {reason}")
        return TransportChoice(wanted, f"transport={wanted!r} requested")
    nccl_reason = NcclTransport.unavailable_reason(comm)
    if nccl_reason is None:
        return TransportChoice("nccl", "auto: NCCL is usable (one GPU per rank)")
    declared = cuda_aware(comm)
    if declared:
        return TransportChoice("cuda_mpi", f"auto: NCCL unusable ({nccl_reason}); HPCCOLL_CUDA_AWARE_MPI=1")
    reason = Staged.unavailable_reason(comm)
    if reason is not None:
        raise TransportUnavailable(f"no transport can move CuPy arrays here: {reason}")
    if declared is None:
        warn_undeclared()
    said = "unset" if declared is None else "=0"
    return TransportChoice("staged", f"auto: NCCL unusable ({nccl_reason}); HPCCOLL_CUDA_AWARE_MPI {said}")


def select_transport(comm: Any, kind: str) -> Transport:
    """The transport bound to ``comm`` that moves arrays of ``kind`` (``"numpy"`` or ``"cupy"``)."""
    if kind == "numpy":  # the hot path: NumPy arrays always use host MPI
        inst = comm._transports.get("mpi")
        if inst is not None:
            return inst
    name = choose_transport(comm, kind).name
    inst = comm._transports.get(name)
    return inst if inst is not None else comm.transport_instance(name)
