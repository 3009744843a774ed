"""The one place data_prep reads the process environment (it does not import hybridnb, whose
``hybridnb/env.py`` holds the rest; the variable names agree with it)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "HYBRIDNB_CACHE_DIR"   # hybridnb's cache folder (hybridnb.env.CACHE_DIR_ENV)


def current() -> dict[str, str]:
    """This process's environment (functions taking ``environ=`` fall back to it)."""
    return os.environ  # type: ignore[return-value]


def cache_folder(environ: dict[str, str] | None = None) -> Path:
    """``$HYBRIDNB_CACHE_DIR``, else ``$XDG_CACHE_HOME/hybridnb``, else ``~/.cache/hybridnb``
    (the same folder as ``hybridnb.env.cache_dir``). Not created here."""
    env = current() if environ is None else environ
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV]).expanduser()
    base = env.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base) / "hybridnb"


def for_child(drop_prefix: str = "PYTHON") -> dict[str, str]:
    """A copy of the environment for a fresh child, without variables starting with
    ``drop_prefix`` (so a ``python -I`` check sees no project path)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(drop_prefix)}


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask: a pinned container or ``taskset``
    sees its share, where ``os.cpu_count()`` counts the whole host)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)
