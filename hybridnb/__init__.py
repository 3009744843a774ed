"""hybridnb: train EEG models on whatever hardware you have.

Public names are loaded lazily so that ``import hybridnb`` stays cheap and never touches a GPU.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

# torch.cuda.is_available() asks NVML instead of starting the CUDA driver (a process forked
# after the driver started cannot use CUDA; Lightning sets the same default)
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

__version__ = "0.1.0"

_LAZY = {
    "detect": "hybridnb.hardware.detect",
    "Hardware": "hybridnb.hardware.detect",
    "Trainer": "hybridnb.train.trainer",
    "compare": "hybridnb.comparison.compare",
    "first_step_diff": "hybridnb.comparison.compare",
    "launch": "hybridnb.strategies.launch",
    "quick": "hybridnb.env",
    "frontend": "hybridnb.env",
    "load": "hybridnb.saving",
    "static_figures": "hybridnb.live.static",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hybridnb' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__

