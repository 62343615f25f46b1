"""Transport registry: selecting a transport is a lookup, not an if-chain."""

from __future__ import annotations

import os
from typing import Any, Dict, Type

from .._errors import ArgumentError, TransportUnavailable
from ._base import Transport
from .host_mpi import HostMPI

__all__ = [
    "Transport",
    "TRANSPORTS",
    "register",
    "make_transport",
    "resolve_transport_name",
    "select_transport",
]

_REGISTRY: Dict[str, Type[Transport]] = {}


def register(cls: Type[Transport]) -> Type[Transport]:
    """Add a transport class to the registry under ``cls.name``."""
    _REGISTRY[cls.name] = cls
    return cls


register(HostMPI)

#: Names accepted by ``Communicator(transport=...)``.
TRANSPORTS = ("auto",) + tuple(_REGISTRY)


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


def select_transport(comm: Any, kind: str) -> Transport:
    """The transport bound to ``comm`` that moves arrays of ``kind`` (``"numpy"`` or ``"cupy"``)."""
    if kind != "numpy":
        raise TransportUnavailable(
            "CuPy arrays: no GPU transport (nccl, cuda_mpi, staged) is available in this version of "
            "hpccoll; move the data to the host with .get() and pass NumPy arrays"
        )
    inst = comm._transports.get("mpi")
    return inst if inst is not None else comm.transport_instance("mpi")
