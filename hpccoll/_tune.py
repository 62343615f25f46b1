"""Measured choices: how a plan runs host MPI's calls, and ``python -m hpccoll tune``'s profile.

Nothing here trusts a constant measured on another machine. A plan's
``method="auto"`` (:meth:`hpccoll.transports.Selector.form`, the
communicator's selector, which kept halo exchanges use too) takes the
verdict of the profile in force for its call and size; without one it
times the blocking and the persistent form side by side on scratch buffers of
the same size, once per call and size on a communicator, and keeps the
faster. ``tune`` (:func:`tune`, the command line's ``tune``) measures every
call at a ladder of sizes the same way, and also each primitive on ``mpi``
against ``shm``, and writes the profile that ``auto`` and plans use from then on.

Every verdict is the same on every rank: the timings are each the slowest
rank's (:func:`hpccoll._timing.interleave`), and the sizes come from rank 0.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
from typing import Any, Callable, Dict, List, Optional, Sequence

from ._comm import Communicator, as_communicator
from .transports._tuned import FORMAT, PERSISTENT_MARGIN, as_collective, buffers, key_of, path_of, race

__all__ = ["tune", "add_arguments", "run_command", "PRIMITIVES", "SIZES"]

#: The primitives ``tune`` measures (all-to-all: host MPI only).
PRIMITIVES = ("allreduce", "allgatherv", "reduce_scatter", "bcast", "reduce", "alltoallv")
#: The message sizes (bytes) ``tune`` measures by default: 8 B to 16 MiB.
SIZES = (8, 64, 1 << 10, 8 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)


# --------------------------------------------------------------------------- python -m hpccoll tune


#: Primitives whose shm-or-mpi verdict is not measured: all-to-all (shm has none), and broadcast, whose shm
#: form's speed against host MPI's differs from process to process (a mode that holds for a process's life),
#: so a verdict taken in ``tune``'s process does not carry over to the job's: host MPI's broadcast is steady
#: (docs/benchmarks.md, "Figures kept out of the code").
_NOT_RACED = ("alltoallv", "bcast")


def tune(
    comm: Any = None,
    sizes: Sequence[int] = SIZES,
    primitives: Sequence[str] = PRIMITIVES,
    rounds: int = 7,
    progress: Optional[Callable[[str], None]] = None,
) -> Dict[str, Any]:
    """Measure host MPI's blocking against persistent calls, and ``mpi`` against ``shm``; the profile (collective).

    Parameters
    ----------
    comm : Communicator or mpi4py communicator, optional
        The ranks, laid out as the job that will use the profile.
    sizes : sequence of int, optional
        Message sizes in bytes (default :data:`SIZES`, 8 B - 16 MiB).
    primitives : sequence of str, optional
        Which primitives (default :data:`PRIMITIVES`).
    rounds : int, optional
        Interleaved rounds per comparison (default 7).
    progress : callable, optional
        Called with a line per measurement (rank 0 prints them).

    Returns
    -------
    dict
        The profile (``FORMAT``): ``key``, ``methods`` and ``transports``,
        each ``{primitive: {size: {"best": name, "<name>_us": time, ...}}}``.
    """
    from .transports import registered

    c = as_communicator(comm)
    mpi = c.transport_instance("mpi")
    # a duplicate whose shm moves every message itself; none where shm cannot run (collective)
    shm_comm = Communicator(c.mpi, transport="shm") if registered("shm").auto_reason(c) is None else None
    shm = shm_comm.transport_instance("shm") if shm_comm is not None else None
    methods: Dict[str, Dict[str, Any]] = {}
    transports: Dict[str, Dict[str, Any]] = {}
    for primitive in primitives:
        for nbytes in sizes:
            args = buffers(primitive, nbytes, c)
            fixed = {form: mpi.prepare(primitive, args, form) for form in ("blocking", "persistent")}
            try:
                if fixed["persistent"].method == "persistent":
                    forms = {"persistent": fixed["persistent"].run, "blocking": fixed["blocking"].run}
                    times = race(c, forms, nbytes, rounds, scale=4)
                    best = "persistent" if times["ratio"] < PERSISTENT_MARGIN else "blocking"
                    methods.setdefault(primitive, {})[str(nbytes)] = _entry(best, times)
                    _say(
                        progress, c, f"{primitive:>15} {nbytes:>9} B  persistent/blocking {times['ratio']:.2f}  {best}"
                    )
                if shm is not None and primitive not in _NOT_RACED:
                    on_shm = as_collective(functools.partial(getattr(shm, primitive), *args), primitive, args, c.rank)
                    on_mpi = as_collective(fixed["blocking"].run, primitive, args, c.rank)
                    times = race(c, {"shm": on_shm, "mpi": on_mpi}, nbytes, rounds, scale=4)
                    best = "shm" if times["ratio"] < 1.0 else "mpi"
                    transports.setdefault(primitive, {})[str(nbytes)] = _entry(best, times)
                    _say(progress, c, f"{primitive:>15} {nbytes:>9} B  shm/mpi {times['ratio']:.2f}  {best}")
            finally:
                for f in fixed.values():
                    f.free()
    if shm_comm is not None:
        shm_comm.free()
    return {
        "format": FORMAT,
        "key": key_of(c),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "rounds": rounds,
        "methods": methods,
        "transports": transports,
    }


def _entry(best: str, times: Dict[str, float]) -> Dict[str, Any]:
    entry: Dict[str, Any] = {"best": best, "ratio": round(times["ratio"], 4)}
    entry.update({f"{k}_us": round(v * 1e6, 3) for k, v in times.items() if k != "ratio"})
    return entry


def _say(progress: Optional[Callable[[str], None]], c: Communicator, line: str) -> None:
    if progress is not None and c.rank == 0:
        progress(line)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``tune`` subcommand's options."""
    p.add_argument("-o", "--output", help="where to write the profile (default: HPCCOLL_TUNE_FILE, else the cache)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds per comparison (default 7)")
    p.add_argument("--max-bytes", type=int, default=SIZES[-1], help=f"largest message measured (default {SIZES[-1]})")
    p.add_argument("--primitives", default=",".join(PRIMITIVES), help="comma-separated (default: all)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only where the profile went")


def run_command(args: argparse.Namespace, parser: argparse.ArgumentParser, shown: List[str]) -> int:
    """``python -m hpccoll tune``: measure, write the profile (rank 0), print where it went."""
    primitives = [p for p in args.primitives.split(",") if p]
    if any(p not in PRIMITIVES for p in primitives):
        parser.error(f"--primitives: expected some of {','.join(PRIMITIVES)}; got {args.primitives!r}")
    if args.rounds < 1:
        parser.error(f"--rounds: expected >= 1; got {args.rounds}")
    c = as_communicator(None)
    sizes = [s for s in SIZES if s <= args.max_bytes]
    say = None if args.quiet else (lambda line: print(line, flush=True))
    profile = tune(c, sizes, primitives, args.rounds, say)
    path = args.output or path_of(profile["key"])
    if c.rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(profile, f, indent=1, sort_keys=True)
        os.replace(path + ".tmp", path)
        print(f"hpccoll tune: wrote {path} ({c.size} ranks, {profile['key']['mpi']})", flush=True)
    c.mpi.Barrier()
    return 0
