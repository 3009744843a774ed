"""What a notebook calls under the demo: :func:`record` its numbers and find :func:`run_dir`.

Both read the environment the demo runner sets (``env.RESULTS_ENV``, ``env.RUN_DIR_ENV``) and do
nothing special without it, so the same notebook runs unchanged in JupyterLab or on Colab.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from hybridnb.env import RESULTS_ENV, RUN_DIR_ENV

__all__ = ["RESULTS_ENV", "RUN_DIR_ENV", "record", "run_dir", "read_results"]


def record(**values: Any) -> None:
    """Add ``values`` to this notebook's results file (``env.RESULTS_ENV``), if one was asked
    for (the demo does; elsewhere this does nothing). Numbers are stored as plain floats/ints."""
    clean = {k: _plain(v) for k, v in values.items()}
    path = os.environ.get(RESULTS_ENV)
    if not path:
        return
    path = Path(path)
    current = read_results(path)
    current.update(clean)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(current, indent=1, sort_keys=True))
    os.replace(tmp, path)


def read_results(path: str | os.PathLike) -> dict:
    """The values recorded in ``path`` so far (empty when nothing was recorded)."""
    path = Path(path)
    return json.loads(path.read_text()) if path.exists() else {}


def run_dir(default: str | os.PathLike = "runs") -> Path:
    """Where a notebook should leave checkpoints and files: ``env.RUN_DIR_ENV`` under the demo
    (so they sit next to the executed notebooks), else ``default``."""
    return Path(os.environ.get(RUN_DIR_ENV) or default)


def _plain(v: Any) -> Any:
    """``v`` as JSON-able plain values: numpy scalars unwrapped, NaN/inf as None."""
    if hasattr(v, "item") and callable(v.item) and getattr(v, "ndim", 0) == 0:
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return str(v)
