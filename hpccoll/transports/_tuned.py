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

:func:`measure_method` times a prepared call's two forms side by side on
scratch buffers (:func:`race`) where the profile has no verdict for it (the
communicator's :class:`~hpccoll.transports.Selector` decides).
"""

from __future__ import annotations

import json
import math
import os
import socket
from collections import Counter
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

from .. import _settings
from .._timing import interleave, medians, paired_ratio
from ._control import guarded
from ._mpitypes import library

__all__ = [
    "FORMAT",
    "key_of",
    "default_path",
    "path_of",
    "load",
    "verdict",
    "race",
    "buffers",
    "as_collective",
    "measure_method",
    "message_bytes",
]

#: The profile's format name (its ``"format"`` field).
FORMAT = "hpccoll-tune/1"


def key_of(comm: Any) -> Dict[str, Any]:
    """What a profile is keyed by, the same on every rank (collective: one pickled all-gather of host names)."""
    hosts = guarded(comm, "the tuning key's host names", comm.mpi.allgather, socket.gethostname())
    per_node = Counter(hosts)
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
    cache = _settings.get("XDG_CACHE_HOME")
    mpi = _slug(" ".join(str(key["mpi"]).replace("Version:", "").split()[:3]))
    name = f"tune-{_slug(str(key['host']))}-{mpi}-{key['ranks']}r{key['nodes']}n.json"
    return os.path.join(cache, "hpccoll", name)


def path_of(key: Mapping[str, Any]) -> str:
    """The profile in force for ``key``: ``HPCCOLL_TUNE_FILE`` when set, else :func:`default_path`."""
    return _settings.get("HPCCOLL_TUNE_FILE") or default_path(key)


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


# --------------------------------------------------------------------------- a plan's method, measured


def message_bytes(args: Sequence[Any]) -> int:
    """The bytes a call's buffers hold (this rank's; the choice uses rank 0's)."""
    total = 0
    for a in args:
        if isinstance(a, np.ndarray):
            total += a.nbytes
        elif _messages(a):
            total += sum(b.nbytes for b, _ in a)
    return total


def _messages(a: Any) -> bool:
    """Whether ``a`` is ``sendrecv``'s list of ``(buffer, rank)`` messages (of NumPy buffers)."""
    return (
        isinstance(a, list)
        and all(isinstance(m, tuple) and len(m) == 2 and isinstance(m[0], np.ndarray) for m in a)
        and bool(a)
    )


def _scratch(args: Sequence[Any]) -> Optional[tuple]:
    """``args`` with every buffer replaced by a copy (``None``: not NumPy buffers): written pages, not
    zeros (see ``hpccoll._tune._buffers``)."""
    out: List[Any] = []
    for a in args:
        if isinstance(a, np.ndarray):
            out.append(np.copy(a))
        elif _messages(a):
            out.append([(np.copy(b), q) for b, q in a])
        elif hasattr(a, "__cuda_array_interface__") or isinstance(a, list) and a and isinstance(a[0], tuple):
            return None  # device buffers (no persistent form), or messages of them
        else:
            out.append(a)
    return tuple(out)


def _iters(nbytes: int) -> int:
    """Calls per timed batch: about 8 MiB moved per batch, 4-200 calls (one-call batches rank the forms
    less reliably than batches of a few calls)."""
    return max(4, min(200, (8 << 20) // max(nbytes, 1)))


#: Persistent requests are kept unless the blocking call measured this much faster: they do less per call
#: (no argument parsing, no request allocation), so a closer verdict is mostly noise; where persistent
#: requests really are slower they lose by far more (docs/benchmarks.md, "Figures kept out of the code").
PERSISTENT_MARGIN = 1.05


def race(c: Any, fns: Dict[str, Callable[[], Any]], nbytes: int, rounds: int = 7, scale: int = 1) -> Dict[str, float]:
    """Each callable's median seconds per call, timed interleaved (collective); and ``"ratio"`` of the first two.

    ``scale`` multiplies the calls per batch (``tune``, which has time, measures longer than a plan being
    made). The timings are the slowest rank's, so the result is the same on every rank.
    """
    samples = interleave(c.mpi, fns, iters=_iters(nbytes) * scale, rounds=rounds, warmup=1)
    result = medians(samples)
    first, second = list(fns)[:2]
    result["ratio"] = paired_ratio(samples, first, second)
    return result


def buffers(primitive: str, nbytes: int, c: Any) -> tuple:
    """Arguments of transport primitive ``primitive`` moving about ``nbytes`` (float64, or bytes below 8),
    alike on every rank of ``c``: what ``tune`` and shm's first-use race time.

    Ones, not zeros: pages of ``numpy.zeros`` that are never written all map the kernel's one zero page,
    so a send from them (a broadcast's root) would read one cached page instead of the memory a real
    buffer is in.
    """
    dtype = np.dtype(np.float64) if nbytes >= 8 else np.dtype(np.uint8)
    p = c.size
    n = max(nbytes // dtype.itemsize, 1)
    if primitive == "allreduce":
        return (np.ones(n, dtype), np.ones(n, dtype), "sum")
    if primitive in ("allgatherv", "reduce_scatter", "alltoallv"):
        block = max(n // p, 1)
        counts = [block] * p
        if primitive == "allgatherv":
            return (np.ones(block, dtype), np.ones(block * p, dtype), counts)
        if primitive == "reduce_scatter":
            return (np.ones(block * p, dtype), np.ones(block, dtype), counts, "sum")
        return (np.ones(block * p, dtype), np.ones(block * p, dtype), counts, counts, True)
    if primitive == "bcast":
        return (np.ones(n, dtype), 0)
    if primitive == "reduce":
        return (np.ones(n, dtype), np.ones(n, dtype), "sum", 0)
    raise ValueError(f"primitive: expected a transport primitive tune measures; got {primitive!r}")


def as_collective(call: Callable[[], Any], primitive: str, args: tuple, rank: int) -> Callable[[], Any]:
    """``call`` (``primitive`` on :func:`buffers`' ``args``) and then what the public collective does after
    it on rank ``rank``: a reduce's ranks other than root fill their result with zeros.

    A transport race is of the collective, not the bare primitive: that fill can turn a race's verdict
    (docs/benchmarks.md, "Figures kept out of the code").
    """
    if primitive != "reduce" or rank == args[3]:
        return call
    recv = args[1]

    def with_zeros() -> None:
        call()
        recv.fill(0)

    return with_zeros


def measure_method(c: Any, t: Any, primitive: str, args: tuple, nbytes: int) -> str:
    """Time the blocking and persistent forms of the call on scratch buffers; the faster (collective)."""
    scratch = _scratch(args)
    if scratch is None:
        return "blocking"
    blocking = t.prepare(primitive, scratch, "blocking")
    persistent = t.prepare(primitive, scratch, "persistent")
    try:
        if persistent.method != "persistent":
            return "blocking"
        times = race(c, {"persistent": persistent.run, "blocking": blocking.run}, nbytes)
        return "persistent" if times["ratio"] < PERSISTENT_MARGIN else "blocking"
    finally:
        persistent.free()
        blocking.free()
