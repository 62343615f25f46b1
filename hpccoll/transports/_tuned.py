"""The tuning profile: what ``python -m hpccoll tune`` measured here, keyed by host, MPI library and rank layout.

A profile is a JSON file (``FORMAT``) holding, per MPI call and message size,
which form ran faster (``"methods"``: blocking or persistent), and per
transport primitive and size which transport did (``"transports"``: ``mpi``
or ``shm``), with the timings behind each verdict. It lives at
:func:`default_path` (``$XDG_CACHE_HOME/hpccoll/``, else ``~/.cache/hpccoll/``,
one file per key), or wherever ``HPCCOLL_TUNE_FILE`` names.

Rank 0 reads it and every rank receives the same copy (:func:`load`,
collective, once per communicator): a file visible on some nodes only can
never make ranks choose differently. A profile whose key (MPI library, ranks,
nodes, ranks per node) differs from the running job's is not used.
"""

from __future__ import annotations

import json
import math
import os
import socket
from typing import Any, Dict, Mapping, Optional

from ._control import guarded
from ._mpitypes import library

__all__ = ["FORMAT", "key_of", "default_path", "path_of", "load", "verdict"]

#: The profile's format name (its ``"format"`` field).
FORMAT = "hpccoll-tune/1"


def key_of(comm: Any) -> Dict[str, Any]:
    """What a profile is keyed by, the same on every rank (collective: one pickled all-gather of host names)."""
    hosts = guarded(comm, "the tuning key's host names", comm.mpi.allgather, socket.gethostname())
    per_node: Dict[str, int] = {}
    for h in hosts:
        per_node[h] = per_node.get(h, 0) + 1
    return {
        "host": hosts[0],
        "mpi": library(),
        "ranks": comm.size,
        "nodes": len(per_node),
        "ranks_per_node": sorted(set(per_node.values())),
    }


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in text).strip("-")[:40]


def default_path(key: Mapping[str, Any]) -> str:
    """Where ``tune`` writes, and ``auto`` looks for, the profile of ``key`` (without ``HPCCOLL_TUNE_FILE``)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    mpi = _slug(" ".join(str(key["mpi"]).replace("Version:", "").split()[:3]))
    name = f"tune-{_slug(str(key['host']))}-{mpi}-{key['ranks']}r{key['nodes']}n.json"
    return os.path.join(cache, "hpccoll", name)


def path_of(key: Mapping[str, Any]) -> str:
    """The profile in force for ``key``: ``HPCCOLL_TUNE_FILE`` when set, else :func:`default_path`."""
    return os.environ.get("HPCCOLL_TUNE_FILE") or default_path(key)


def _matches(profile: Any, key: Mapping[str, Any]) -> Optional[str]:
    """Why ``profile`` does not serve ``key`` (``None``: it does)."""
    if not isinstance(profile, dict) or profile.get("format") != FORMAT:
        return f"not a {FORMAT} profile"
    theirs = profile.get("key", {})
    for field in ("mpi", "ranks", "nodes", "ranks_per_node"):
        if theirs.get(field) != key[field]:
            return f"measured for {field} {theirs.get(field)!r}, this job has {key[field]!r}"
    return None


def load(comm: Any) -> Dict[str, Any]:
    """The profile in force on ``comm`` (collective the first time; cached on ``comm.state``).

    Returns ``{"path": ..., "profile": dict or None, "why": reason when none}``:
    the same on every rank (rank 0 reads the file and broadcasts it).
    """
    known: Optional[Dict[str, Any]] = comm.state.get("tune profile")
    if known is not None:
        return known
    key = key_of(comm)
    path = path_of(key)
    found: Dict[str, Any] = {"path": path, "profile": None, "why": None}
    if comm.rank == 0:
        try:
            with open(path) as f:
                profile = json.load(f)
        except FileNotFoundError:
            found["why"] = "no profile (run `python -m hpccoll tune` under mpiexec)"
        except (OSError, ValueError) as e:
            found["why"] = f"unreadable: {e}"
        else:
            found["why"] = _matches(profile, key)
            if found["why"] is None:
                found["profile"] = profile
    found = guarded(comm, "the tuning profile", comm.mpi.bcast, found, 0)
    comm.state["tune profile"] = found
    return found


def verdict(table: Optional[Mapping[str, Any]], nbytes: int) -> Optional[str]:
    """The winner measured at the size nearest ``nbytes`` (in powers of two) in ``{size: {"best": ...}}``.

    ``None`` when the table is empty, or ``nbytes`` lies more than a factor 4
    outside its measured sizes (no guess beyond what was measured).
    """
    if not table:
        return None
    sizes = sorted(int(s) for s in table)
    at = math.log2(max(nbytes, 1))
    nearest = min(sizes, key=lambda s: abs(math.log2(s) - at))
    if abs(math.log2(nearest) - at) > 2:
        return None
    best = table[str(nearest)].get("best")
    return best if isinstance(best, str) else None
