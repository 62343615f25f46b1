"""The library's exceptions: one type per kind of fault."""

from __future__ import annotations

__all__ = [
    "HpccollError",
    "ArgumentError",
    "DTypeError",
    "UnsupportedOpError",
    "MismatchError",
    "TransportUnavailable",
    "CollectiveError",
]


class HpccollError(Exception):
    """Base class of every exception hpccoll raises itself."""


class ArgumentError(HpccollError, ValueError):
    """A local argument is invalid: bad axis, unknown op, wrong ``out`` or ``sizes``."""


class DTypeError(HpccollError, TypeError):
    """A dtype is not supported, or not supported with the requested op."""


class UnsupportedOpError(HpccollError, ValueError):
    """The requested operation has no meaning here (e.g. the adjoint of ``max``)."""


class MismatchError(HpccollError):
    """The ranks disagree about a collective call (found by the cross-rank check)."""


class TransportUnavailable(HpccollError, RuntimeError):
    """The requested transport cannot run here; the message names the reason."""


class CollectiveError(HpccollError, RuntimeError):
    """A collective failed while running: an NCCL asynchronous error, or one stuck past ``HPCCOLL_TIMEOUT``.

    The transport's communicator is aborted; free the :class:`~hpccoll.Communicator` and make a new one.
    """


# Tracebacks and reprs name the public path (``hpccoll.MismatchError``), where users import them from; pickling
# (mpi4py pickles exceptions between ranks) finds them there too.
for _cls in (
    HpccollError,
    ArgumentError,
    DTypeError,
    UnsupportedOpError,
    MismatchError,
    TransportUnavailable,
    CollectiveError,
):
    _cls.__module__ = "hpccoll"
del _cls
