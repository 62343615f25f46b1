"""Logging: the ``hpccoll`` logger, and rank-prefixed records on stderr under ``HPCCOLL_DEBUG=1``.

hpccoll logs through the standard :mod:`logging` module, under the logger
``"hpccoll"`` and its children (``hpccoll.transport``, ``hpccoll.exchange``,
``hpccoll.buckets``), at ``DEBUG`` level only. Nothing is printed unless
``HPCCOLL_DEBUG`` is set (or the user configures the logger): :func:`configure`,
called when the first :class:`~hpccoll.Communicator` is made, then gives the
``"hpccoll"`` logger a stderr handler whose records read::

    hpccoll[rank 1/4] DEBUG transport: NumPy arrays: mpi (auto: NumPy arrays use host MPI)

-- unless the user has configured that logger already (a handler or a level
of their own), in which case it is left as they set it. Every logging site
tests ``logger.isEnabledFor(logging.DEBUG)`` before formatting anything, and
none sits on a per-call path that does not already communicate.

The rank in the prefix is the process's rank in ``MPI.COMM_WORLD`` (unique
in the job, whatever communicator the record is about); :func:`world_tag`
gives it to the watchdog's stack dumps too.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, List, Optional, Sequence

from . import _settings

__all__ = ["logger", "child", "configure", "world_tag", "brief", "RankFormatter", "DEBUG_VARIABLE"]

#: The environment variable that turns the rank-prefixed stderr records on.
DEBUG_VARIABLE = "HPCCOLL_DEBUG"

#: hpccoll's logger; records come from its children, one per topic.
logger = logging.getLogger("hpccoll")

_CONFIGURED: List[bool] = []
_TAG: List[str] = []


def child(topic: str) -> logging.Logger:
    """The logger for ``topic`` (``"transport"``, ``"exchange"``, ``"buckets"``): ``hpccoll.<topic>``.

    Parameters
    ----------
    topic : str
        What the records are about; the formatter prints it before the message.

    Returns
    -------
    logging.Logger
        ``logging.getLogger("hpccoll." + topic)``.
    """
    return logging.getLogger(f"{logger.name}.{topic}")


def world_tag() -> str:
    """``"R/N"``: this process's rank and the size of ``MPI.COMM_WORLD`` (``"?/?"`` before ``MPI_Init``).

    Returns
    -------
    str
        The tag, computed once MPI is initialised and cached (the process's
        world rank never changes).
    """
    if _TAG:
        return _TAG[0]
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return "?/?"
    world = mpi.COMM_WORLD
    _TAG.append(f"{world.Get_rank()}/{world.Get_size()}")
    return _TAG[0]


def brief(items: Sequence[Any], limit: int = 8) -> str:
    """``items`` as a list, the first ``limit`` of them only, with how many more (a record stays one line).

    Parameters
    ----------
    items : sequence
        What to show.
    limit : int
        How many to show at most.

    Returns
    -------
    str
        ``"[a, b, c]"``, or ``"[a, b, ... and 12 more]"``.
    """
    shown = ", ".join(repr(list(i)) if isinstance(i, (tuple, range)) else repr(i) for i in items[:limit])
    more = len(items) - limit
    return f"[{shown}{f', ... and {more} more' if more > 0 else ''}]"


class RankFormatter(logging.Formatter):
    """``hpccoll[rank R/N] LEVEL topic: message``, the topic being the logger name after ``hpccoll.``."""

    def format(self, record: logging.LogRecord) -> str:
        """Format ``record`` with the rank prefix.

        Parameters
        ----------
        record : logging.LogRecord
            A record of the ``hpccoll`` logger or one of its children.

        Returns
        -------
        str
            The line (a traceback, if the record carries one, follows on the next lines).
        """
        topic = record.name[len(logger.name) + 1 :] if record.name.startswith(logger.name + ".") else "hpccoll"
        line = f"hpccoll[rank {world_tag()}] {record.levelname} {topic}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure(force: Optional[bool] = None) -> Optional[logging.Handler]:
    """Give the ``hpccoll`` logger a rank-prefixed stderr handler at DEBUG when ``HPCCOLL_DEBUG`` asks (once).

    Does nothing when the variable is unset or false, when it was done
    already, or when the user configured the ``hpccoll`` logger themselves
    (it has a handler, or a level other than ``NOTSET``). The handler's
    logger does not propagate, so a root handler the user set up does not
    print each record a second time.

    Parameters
    ----------
    force : bool, optional
        Decide instead of ``HPCCOLL_DEBUG`` (``None``: read the variable).

    Returns
    -------
    logging.Handler or None
        The handler added by this call, or ``None``.

    Raises
    ------
    ArgumentError
        ``HPCCOLL_DEBUG`` is not a boolean (1/true/yes/on or 0/false/no/off).
    """
    if _CONFIGURED and force is None:
        return None
    wanted = _settings.get(DEBUG_VARIABLE) if force is None else force
    _CONFIGURED.append(True)
    if not wanted or logger.handlers or logger.level != logging.NOTSET:
        return None
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(RankFormatter())
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    return handler
