"""Environment variables read as settings.

The boolean ones (``HPCCOLL_CHECK``, ``HPCCOLL_DEBUG``, ``HPCCOLL_CUDA_AWARE_MPI``) are read by
:func:`env_flag`, where they are used: ``Communicator`` (check mode), :mod:`hpccoll._log` (the debug
records), the ``cuda_mpi`` transport.
"""

from __future__ import annotations

import os
from typing import Optional

from ._errors import ArgumentError

__all__ = ["env_flag"]


def env_flag(name: str, default: Optional[bool] = False) -> Optional[bool]:
    """Read a boolean environment variable: 1/true/yes/on or 0/false/no/off (any case, spaces ignored).

    Parameters
    ----------
    name : str
        The variable, e.g. ``"HPCCOLL_DEBUG"``.
    default : bool or None
        What unset or empty means.

    Returns
    -------
    bool or None
        The value, or ``default``.

    Raises
    ------
    ArgumentError
        Any other value, naming the variable.
    """
    raw = os.environ.get(name, "").strip().lower()
    if raw == "":
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ArgumentError(f"{name}: expected 1/true/yes/on or 0/false/no/off; got {raw!r}")
