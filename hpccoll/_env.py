"""Environment variables read as settings."""

from __future__ import annotations

import os
from typing import Optional

from ._errors import ArgumentError

__all__ = ["env_flag"]


def env_flag(name: str, default: Optional[bool] = False) -> Optional[bool]:
    """Read a boolean environment variable: 1/true/yes/on or 0/false/no/off."""
    raw = os.environ.get(name, "").strip().lower()
    if raw == "":
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ArgumentError(f"{name}: expected 1/true/yes/on or 0/false/no/off; got {raw!r}")
