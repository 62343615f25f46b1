"""``python -m hpccoll info``: what this installation and this launch look like."""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections import Counter
from typing import Any, Callable, Dict, List, Optional, Sequence

from . import _settings

__all__ = ["add_arguments", "collect", "main", "report", "run_command"]

_ENV_PREFIXES = (
    "HPCCOLL_",
    "NCCL_",
    "UCX_",
    "FI_",
    "MPICH_",
    "MPIR_CVAR_",
    "OMPI_MCA_",
    "CUDA_VISIBLE_DEVICES",
    "SLURM_LOCALID",
    "PMI_LOCAL_RANK",
    "PALS_LOCAL_RANKID",
    "MPI_LOCALRANKID",
)


def _gpu() -> Dict[str, Any]:
    """CuPy, CUDA and NCCL versions and the device count, without importing CuPy when absent."""
    import importlib.util

    if importlib.util.find_spec("cupy") is None:
        return {"cupy": None, "reason": "CuPy is not installed (pip install 'hpccoll[cuda12]')"}
    try:
        import cupy

        info: Dict[str, Any] = {"cupy": cupy.__version__}
        info["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
        info["devices"] = cupy.cuda.runtime.getDeviceCount()
        try:
            from cupy.cuda import nccl

            info["nccl"] = nccl.get_version()
        except Exception as exc:  # NCCL missing from this CuPy build
            info["nccl"] = f"unavailable ({exc})"
        return info
    except Exception as exc:  # no driver, no device
        return {"cupy": getattr(sys.modules.get("cupy"), "__version__", "?"), "reason": f"{type(exc).__name__}: {exc}"}


def _probe(reason: Callable[[Any], Optional[str]], comm: Any) -> Optional[str]:
    """``reason(comm)``, or the exception it raised as text: a probe must never break info."""
    try:
        return reason(comm)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def collect(comm: Any) -> Dict[str, Any]:
    """Everything ``info`` prints, for this rank (collective: gathers host names)."""
    import numpy
    from mpi4py import MPI

    import hpccoll

    from .transports import transport_classes
    from .transports._mpitypes import quirks
    from .transports._tuned import load
    from .transports.cuda_mpi import cuda_aware

    levels = {
        MPI.THREAD_SINGLE: "single",
        MPI.THREAD_FUNNELED: "funneled",
        MPI.THREAD_SERIALIZED: "serialized",
        MPI.THREAD_MULTIPLE: "multiple",
    }
    hosts = comm.mpi.allgather(MPI.Get_processor_name())
    per_host = dict(Counter(hosts))
    transports = {}
    for cls in transport_classes():
        reason = _probe(cls.unavailable_reason, comm)
        auto = _probe(cls.auto_reason, comm) if reason is None else None
        transports[cls.name] = {"arrays": cls.array_kind, "usable": reason is None, "reason": reason, "auto": auto}
    try:
        aware = cuda_aware(comm)._asdict()
    except Exception as exc:  # the variable is malformed or differs across ranks
        aware = {"aware": None, "source": f"{type(exc).__name__}: {exc}"}
    profile = load(comm)
    return {
        "hpccoll": hpccoll.__version__,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "mpi4py": __import__("mpi4py").__version__,
        "mpi_library": MPI.Get_library_version().strip().splitlines()[0].strip(),
        "mpi_standard": "%d.%d" % MPI.Get_version(),
        "thread_level": levels.get(MPI.Query_thread(), str(MPI.Query_thread())),
        "mpi_quirks": quirks(),
        "cuda_aware": aware,
        "ranks": comm.size,
        "hosts": per_host,
        "gpu": _gpu(),
        "transports": transports,
        "numpy_arrays": comm.transport_for(numpy.zeros(0)).reason,
        "tune_profile": {
            "path": profile["path"],
            "in_force": profile["profile"] is not None,
            "why_not": profile["why"],
            "created": (profile["profile"] or {}).get("created"),
        },
        "environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith(_ENV_PREFIXES)},
        "settings": {"transport": comm.transport, "check": comm.check, "bucket_bytes": comm.bucket_bytes},
        "variables": [{"name": n, "set": s, "meaning": m} for n, s, m in _settings.report()],
    }


def report(info: Dict[str, Any]) -> str:
    """Format :func:`collect`'s result as the text ``info`` prints."""
    lines: List[str] = [f"hpccoll {info['hpccoll']}"]
    lines.append(f"  python {info['python']}, numpy {info['numpy']}, mpi4py {info['mpi4py']}")
    lines.append("MPI")
    lines.append(f"  library: {info['mpi_library']} (MPI {info['mpi_standard']}), thread level: {info['thread_level']}")
    hosts = ", ".join(f"{h}: {n}" for h, n in info["hosts"].items())
    lines.append(f"  ranks: {info['ranks']} on {len(info['hosts'])} host(s) ({hosts})")
    verdict = {True: "yes", False: "no", None: "unknown"}[info["cuda_aware"]["aware"]]
    lines.append(f"  CUDA-aware: {verdict} ({info['cuda_aware']['source']})")
    lines.append("  quirks worked around:" + ("" if info["mpi_quirks"] else " none known"))
    lines.extend(f"    - {q}" for q in info["mpi_quirks"])
    lines.append("GPU")
    gpu = info["gpu"]
    if gpu.get("reason"):
        lines.append(f"  none usable: {gpu['reason']}")
    else:
        lines.append(
            f"  cupy {gpu['cupy']}, CUDA runtime {gpu['cuda_runtime']}, NCCL {gpu['nccl']}, "
            f"{gpu['devices']} device(s) visible on rank 0's host"
        )
    lines.append("transports")
    for name, t in info["transports"].items():
        state = "usable" if t["usable"] else f"unavailable: {t['reason']}"
        if t["usable"] and t["auto"]:
            state += f", but not by auto: {t['auto']}"
        lines.append(f"  {name:<9} ({t['arrays']} arrays) {state}")
    lines.append(f"  NumPy arrays take: {info['numpy_arrays']}")
    tuned = info["tune_profile"]
    state = f"in force (made {tuned['created']})" if tuned["in_force"] else f"not in force: {tuned['why_not']}"
    lines.append(f"  tuning profile: {tuned['path']}, {state}")
    lines.append("settings")
    for key, value in info["settings"].items():
        lines.append(f"  {key} = {value}")
    lines.append("variables hpccoll reads (hpccoll/_settings.py)")
    for row in info["variables"]:
        lines.append(f"  {row['name']:<26} {row['set']:<10} {row['meaning']}")
    lines.append("environment")
    if not info["environment"]:
        lines.append("  (no HPCCOLL_, NCCL_, UCX_, FI_, MPICH or Open MPI variables set)")
    for key, value in info["environment"].items():
        lines.append(f"  {key}={value}")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``info`` options to the argparse parser ``p``.

    Parameters
    ----------
    p : argparse.ArgumentParser
        The parser (``python -m hpccoll info``'s, or a subcommand's).
    """
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def run_command(
    args: argparse.Namespace, p: Optional[argparse.ArgumentParser] = None, shown: Sequence[str] = ()
) -> int:
    """Print the report once, from rank 0, for parsed options.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed options (:func:`add_arguments`).
    p : argparse.ArgumentParser, optional
        The parser they came from (unused: ``info`` has no option that needs the ranks).
    shown : sequence of str
        The options as typed (unused).

    Returns
    -------
    int
        0.
    """
    import json

    from ._comm import as_communicator

    comm = as_communicator(None)
    info = collect(comm)
    if comm.rank == 0:
        print(json.dumps(info, indent=1) if args.json else report(info), flush=True)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m hpccoll info [--json]``: print the report once, from rank 0.

    Parameters
    ----------
    argv : sequence of str, optional
        The options (default ``sys.argv[1:]``).

    Returns
    -------
    int
        0.
    """
    parser = argparse.ArgumentParser(prog="python -m hpccoll info", description=__doc__)
    add_arguments(parser)
    return run_command(parser.parse_args(None if argv is None else list(argv)), parser)
