"""One timer for ``python -m hpccoll bench`` and the scripts in ``benchmarks/``.

Every benchmark of this project times the same way:

* Each callable is warmed up, then timed in ``rounds`` rounds. Within a round
  every callable runs once, as a batch of ``iters`` calls in a row; the
  callables take turns (interleaved), so all of them see the same machine
  load, and each round starts one callable further along, so none always runs
  first (the first after another's large allocations and frees can be faster
  or slower); every other round runs in the reverse order, so none always
  follows the same one either (one that follows a callable whose buffers
  evicted its own from the caches is slower than one that follows itself).
* Every batch starts behind a barrier, and its time per call is the
  **maximum over ranks**: a collective is as slow as its slowest rank.
* A callable's time is the **median over rounds**; a comparison of two is the
  median over rounds of their same-round ratio (:func:`paired_ratio`), which
  shared machines disturb much less than either time.

For GPU buffers pass ``sync`` (for CuPy, the current stream's
``synchronize``): it runs before each batch's barrier and again before the
clock is read, so a batch's time includes the device work it queued.

The communicator is used only through ``Barrier()`` and ``allgather(obj)``
(mpi4py's pickling all-gather), so this module imports no MPI itself.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Union

__all__ = ["Samples", "interleave", "medians", "paired_ratio", "paired_difference"]

#: Per-call seconds of each named callable, one value per round (each the maximum over ranks).
Samples = Dict[str, List[float]]

Counts = Union[int, Mapping[str, int]]


def _count(counts: Counts, name: str, what: str, least: int) -> int:
    n = counts[name] if isinstance(counts, Mapping) else counts
    if not isinstance(n, int) or isinstance(n, bool) or n < least:
        raise ValueError(f"{what}: expected an int >= {least} for {name!r}; got {n!r}")
    return n


def interleave(
    comm: Any,
    fns: Mapping[str, Callable[[], Any]],
    *,
    iters: Counts,
    rounds: int,
    warmup: Counts = 0,
    sync: Optional[Callable[[], Any]] = None,
) -> Samples:
    """Time several callables in interleaved rounds; per round, each one's per-call seconds on the slowest rank.

    Collective: every rank must call it with the same names, counts and rounds.

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm or hpccoll.Communicator
        The ranks to take the maximum over (a :class:`~hpccoll.Communicator`
        is used through its ``.mpi``). Only ``Barrier()`` and
        ``allgather(obj)`` are called.
    fns : mapping of str to callable
        The callables, by name; each call does one operation (blocking until
        it is done on the host, apart from device work ``sync`` waits for).
    iters : int or mapping of str to int
        Calls per timed batch (>= 1), one count for all or one per name.
    rounds : int
        Rounds (>= 1); the median over them is what :func:`medians` reports.
    warmup : int or mapping of str to int
        Untimed calls of each callable before the first round (default 0).
    sync : callable, optional
        Called before each batch's barrier and before its clock is read (a
        GPU stream's ``synchronize``); ``None`` for host work.

    Returns
    -------
    dict of str to list of float
        ``name -> [seconds per call in round 0, round 1, ...]``, each the
        maximum over ranks; the same on every rank.

    Raises
    ------
    ValueError
        ``rounds``, ``iters`` or ``warmup`` out of range, or ``fns`` empty.

    Examples
    --------
    >>> s = interleave(comm, {"raw": raw_call, "ours": our_call}, iters=100, rounds=15)  # doctest: +SKIP
    >>> medians(s)["ours"], paired_ratio(s, "ours", "raw")                                # doctest: +SKIP
    """
    mpi = getattr(comm, "mpi", comm)
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
        raise ValueError(f"rounds: expected an int >= 1; got {rounds!r}")
    if not fns:
        raise ValueError("fns: expected at least one callable; got none")
    names = list(fns)
    counts = {name: _count(iters, name, "iters", 1) for name in names}
    warm = {name: _count(warmup, name, "warmup", 0) for name in names}
    for name in names:
        for _ in range(warm[name]):
            fns[name]()
    samples: Samples = {name: [] for name in names}
    clock = time.perf_counter
    for r in range(rounds):
        start = r % len(names)
        mine: Dict[str, float] = {}
        order = names[start:] + names[:start]
        for name in order if r % 2 == 0 else order[::-1]:
            fn, n = fns[name], counts[name]
            if sync is not None:
                sync()
            mpi.Barrier()
            t0 = clock()
            for _ in range(n):
                fn()
            if sync is not None:
                sync()
            mine[name] = (clock() - t0) / n
        everyone = mpi.allgather([mine[name] for name in names])
        for i, name in enumerate(names):
            samples[name].append(max(per_rank[i] for per_rank in everyone))
    return samples


def medians(samples: Samples) -> Dict[str, float]:
    """Each callable's median over rounds of its per-call seconds.

    Parameters
    ----------
    samples : dict of str to list of float
        What :func:`interleave` returned.

    Returns
    -------
    dict of str to float
        ``name -> median seconds per call``.
    """
    return {name: statistics.median(values) for name, values in samples.items()}


def paired_ratio(samples: Samples, a: str, b: str) -> float:
    """Median over rounds of ``time(a) / time(b)`` within the same round.

    Parameters
    ----------
    samples : dict of str to list of float
        What :func:`interleave` returned.
    a, b : str
        Two of its names.

    Returns
    -------
    float
        The paired ratio: above 1 when ``a`` is slower.
    """
    return statistics.median(x / y for x, y in zip(samples[a], samples[b]))


def paired_difference(samples: Samples, a: str, b: str) -> float:
    """Median over rounds of ``time(a) - time(b)`` within the same round, in seconds.

    Parameters
    ----------
    samples : dict of str to list of float
        What :func:`interleave` returned.
    a, b : str
        Two of its names.

    Returns
    -------
    float
        The paired difference: positive when ``a`` is slower.
    """
    return statistics.median(x - y for x, y in zip(samples[a], samples[b]))
