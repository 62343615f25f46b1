"""Per-Communicator memory for the transport layer (probe results, choices)."""

from __future__ import annotations

from typing import Any, Callable

from .._errors import HpccollError

__all__ = ["remembered"]

_UNKNOWN = object()


def remembered(comm: Any, key: str, compute: Callable[[], Any]) -> Any:
    """``compute()``'s result for ``comm``, computed once and cached on it, errors included.

    ``compute`` is typically collective and its outcome agreed by every rank,
    so a cached :class:`~hpccoll.HpccollError` is raised again (a fresh one of
    the same type and message) on every later call, on every rank.
    """
    hit = comm.state.get(key, _UNKNOWN)
    if hit is _UNKNOWN:
        try:
            hit = compute()
        except HpccollError as exc:
            hit = exc
        comm.state[key] = hit
    if isinstance(hit, HpccollError):
        raise type(hit)(str(hit))
    return hit
