"""This process's rank among the processes on its node (the node-local rank).

Self-contained on purpose: only the standard library, plus mpi4py imported
lazily for the fallback, so job scripts and launch wrappers can use it too::

    python -c "from hpccoll._local import local_rank; print(*local_rank())"
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional, Tuple

__all__ = ["LOCAL_RANK_VARIABLES", "local_rank", "local_rank_from_environment"]

#: Launcher and scheduler variables holding the node-local rank, in the order
#: they are trusted. MPI launchers come before ``SLURM_LOCALID`` because
#: ``mpirun`` started inside a Slurm allocation leaves the batch step's
#: ``SLURM_LOCALID`` in every rank's environment, while the launcher's own
#: variable is set per rank.
LOCAL_RANK_VARIABLES: Tuple[str, ...] = (
    "OMPI_COMM_WORLD_LOCAL_RANK",  # Open MPI (mpirun, or srun with PMIx)
    "MPI_LOCALRANKID",  # MPICH / Intel MPI (Hydra)
    "PMI_LOCAL_RANK",  # some PMI-2 launchers
    "PALS_LOCAL_RANKID",  # HPE Cray PALS (aprun / mpiexec on PBS)
    "MV2_COMM_WORLD_LOCAL_RANK",  # MVAPICH2
    "SLURM_LOCALID",  # srun
    "FLUX_TASK_LOCAL_ID",  # Flux
    "JSM_NAMESPACE_LOCAL_RANK",  # IBM jsrun
)


def local_rank(comm: Any = None, environ: Optional[Mapping[str, str]] = None) -> Tuple[int, str]:
    """This process's node-local rank, and where it came from.

    The first of :data:`LOCAL_RANK_VARIABLES` that holds a non-negative
    integer wins. Without one, ``comm`` is split by shared memory
    (``comm.Split_type(MPI.COMM_TYPE_SHARED)``, a collective call over
    ``comm``) and the rank in this rank's piece is used.

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm, optional
        The communicator for the fallback; default ``MPI.COMM_WORLD``. Only
        used (and then collectively) when no variable is set.
    environ : mapping, optional
        The environment to read; default :data:`os.environ`.

    Returns
    -------
    (int, str)
        The node-local rank, and its source: ``"NAME=value"`` for a variable,
        or ``"MPI.COMM_TYPE_SHARED split"``.

    Examples
    --------
    >>> local_rank(environ={"SLURM_LOCALID": "3"})
    (3, 'SLURM_LOCALID=3')
    """
    found = local_rank_from_environment(environ)
    if found is not None:
        return found
    from mpi4py import MPI

    base = MPI.COMM_WORLD if comm is None else comm
    node = base.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_rank(), "MPI.COMM_TYPE_SHARED split"
    finally:
        node.Free()


def local_rank_from_environment(environ: Optional[Mapping[str, str]] = None) -> Optional[Tuple[int, str]]:
    """The node-local rank from the first of :data:`LOCAL_RANK_VARIABLES` set, without MPI.

    Returns
    -------
    (int, str) or None
        As for :func:`local_rank`; ``None`` when no variable holds a
        non-negative integer.
    """
    env = os.environ if environ is None else environ
    for name in LOCAL_RANK_VARIABLES:
        raw = env.get(name, "").strip()
        if raw.isdigit():
            return int(raw), f"{name}={raw}"
    return None
