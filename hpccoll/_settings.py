"""Settings: every environment variable hpccoll reads, read and validated here and nowhere else.

===============================  ===============================================================
variable                         meaning
===============================  ===============================================================
``HPCCOLL_CHECK``                1/0: check mode, the default of ``Communicator(check=None)``
``HPCCOLL_DEBUG``                1/0: rank-prefixed debug records on stderr (:mod:`hpccoll._log`)
``HPCCOLL_TIMEOUT``              seconds an MPI call may take before the job aborts (0 or unset: no limit)
``HPCCOLL_TRANSPORT``            the transport of ``Communicator(transport="auto")``
``HPCCOLL_CUDA_AWARE_MPI``       1/0: overrides what MPI says about CUDA-awareness (unset: asked of MPI)
``HPCCOLL_NCCL_UNEVEN``          ``auto``/``grouped``/``pad``: NCCL's design for uneven shards
``HPCCOLL_BUCKET_BYTES``         the largest message the list forms pack arrays into (default 64 MiB)
``HPCCOLL_NODE_SIZE``            ``k`` or ``k,cyclic``: simulated nodes of ``k`` ranks for ``shm``
``HPCCOLL_TUNE_FILE``            the tuning profile ``auto`` reads and ``tune`` writes
``NCCL_MULTI_RANK_GPU_ENABLE``   NCCL's own switch (1): with NCCL >= 2.30, ranks may share a GPU
``XDG_CACHE_HOME``               where tuning profiles live by default (``~/.cache``)
===============================  ===============================================================

Each is read when it is used (so a test or a program may change it between
communicators) and a bad value raises :class:`~hpccoll.ArgumentError`
naming the variable, what was expected and what it got. ``python -m hpccoll
info`` prints them all (:func:`report`). The launcher's variables that give a
rank's node-local rank are facts, not settings: :mod:`hpccoll._local` reads
them.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from ._errors import ArgumentError, HpccollError

__all__ = ["SETTINGS", "Setting", "get", "raw", "flag", "report", "UNEVEN_DESIGNS", "DEFAULT_BUCKET_BYTES"]

#: The values of ``HPCCOLL_NCCL_UNEVEN`` (and of the NCCL transport's ``uneven``).
UNEVEN_DESIGNS = ("auto", "grouped", "pad")
#: ``HPCCOLL_BUCKET_BYTES`` when unset.
DEFAULT_BUCKET_BYTES = 64 << 20

_FLAG = "1/true/yes/on or 0/false/no/off"


def flag(name: str, text: str, default: Optional[bool] = False) -> Optional[bool]:
    """``text`` as a boolean: 1/true/yes/on or 0/false/no/off (any case), ``default`` when empty."""
    value = text.lower()
    if value == "":
        return default
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ArgumentError(f"{name}: expected {_FLAG}; got {value!r}")


def _number(kind: Callable[[str], Any], text: str, bad: Any) -> Any:
    """``kind(text)``, or ``bad`` when ``text`` is not such a number."""
    try:
        return kind(text)
    except ValueError:
        return bad


def _seconds(name: str, text: str) -> Optional[float]:
    if text == "":
        return None
    value = _number(float, text, math.nan)
    if not (value >= 0 and math.isfinite(value)):
        raise ArgumentError(f"{name}: expected a number of seconds >= 0 (0 or unset: no limit); got {text!r}")
    return value or None


def _bytes(name: str, text: str) -> int:
    if text == "":
        return DEFAULT_BUCKET_BYTES
    value = _number(int, text, -1)
    if value < 1:
        raise ArgumentError(f"{name}: expected a positive int (bytes); got {text!r}")
    return value


def _node_size(name: str, text: str) -> Optional[Tuple[int, bool]]:
    if text == "":
        return None
    head, _, tail = text.partition(",")
    value = _number(int, head, 0)
    if value < 1 or tail.strip() not in ("", "cyclic"):
        raise ArgumentError(
            f"{name}: expected a positive int (ranks per simulated node), optionally followed by ',cyclic'; "
            f"got {text!r}"
        )
    return value, bool(tail.strip())


def _uneven(name: str, text: str) -> str:
    value = text or "auto"
    if value not in UNEVEN_DESIGNS:
        raise ArgumentError(f"{name}: expected one of {', '.join(map(repr, UNEVEN_DESIGNS))}; got {value!r}")
    return value


def _cache(name: str, text: str) -> str:
    return text or os.path.join(os.path.expanduser("~"), ".cache")


class Setting(NamedTuple):
    """One variable: its name, how its text becomes a value (raising :class:`ArgumentError`), what it means."""

    name: str
    parse: Callable[[str, str], Any]
    doc: str


def _text(name: str, text: str) -> str:
    return text


SETTINGS: Dict[str, Setting] = {
    s.name: s
    for s in (
        Setting("HPCCOLL_CHECK", lambda n, t: flag(n, t, False), "check mode (1/0)"),
        Setting("HPCCOLL_DEBUG", lambda n, t: flag(n, t, False), "debug records on stderr (1/0)"),
        Setting("HPCCOLL_TIMEOUT", _seconds, "seconds before a stuck MPI call aborts the job"),
        Setting("HPCCOLL_TRANSPORT", _text, "the transport of transport='auto' (checked by the registry)"),
        Setting("HPCCOLL_CUDA_AWARE_MPI", lambda n, t: flag(n, t, None), "CUDA-aware MPI override (1/0)"),
        Setting("HPCCOLL_NCCL_UNEVEN", _uneven, "NCCL's uneven-shard design"),
        Setting("HPCCOLL_BUCKET_BYTES", _bytes, "largest packed message of the list forms"),
        Setting("HPCCOLL_NODE_SIZE", _node_size, "simulated node size for shm ('k' or 'k,cyclic')"),
        Setting("HPCCOLL_TUNE_FILE", _text, "the tuning profile (default: one per machine under the cache)"),
        Setting("NCCL_MULTI_RANK_GPU_ENABLE", _text, "NCCL >= 2.30: ranks may share a GPU when 1"),
        Setting("XDG_CACHE_HOME", _cache, "where tuning profiles live by default"),
    )
}


def raw(name: str) -> str:
    """The variable's text as set, stripped (``""`` when unset): what ranks compare to agree on it."""
    return os.environ.get(SETTINGS[name].name, "").strip()


def get(name: str) -> Any:
    """The variable's value, read now and validated.

    Parameters
    ----------
    name : str
        One of :data:`SETTINGS`.

    Returns
    -------
    object
        The parsed value: see the table in this module's docstring.

    Raises
    ------
    ArgumentError
        The variable's text is not a valid value (naming it, expected and got).
    """
    return SETTINGS[name].parse(name, raw(name))


def report() -> List[Tuple[str, str, str]]:
    """``(variable, text as set or '(unset)', what it means now)`` for every setting, for ``hpccoll info``."""
    rows = []
    for name, setting in SETTINGS.items():
        try:
            meaning = repr(get(name))
        except HpccollError as exc:
            meaning = f"invalid: {exc}"
        rows.append((name, raw(name) if name in os.environ else "(unset)", f"{meaning}; {setting.doc}"))
    return rows
