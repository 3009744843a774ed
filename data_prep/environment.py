"""The one place data_prep reads the process environment (it does not import hybridnb, whose
``hybridnb/env.py`` holds the rest; the variable names agree with it)."""

from __future__ import annotations

import os


def current() -> dict[str, str]:
    """This process's environment (functions taking ``environ=`` fall back to it)."""
    return os.environ  # type: ignore[return-value]


def for_child(drop_prefix: str = "PYTHON") -> dict[str, str]:
    """A copy of the environment for a fresh child, without variables starting with
    ``drop_prefix`` (so a ``python -I`` check sees no project path)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(drop_prefix)}
