"""hybridnb: train EEG models on whatever hardware you have.

Public names are loaded lazily so that ``import hybridnb`` stays cheap and never touches a GPU.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "detect": "hybridnb.detect",
    "Hardware": "hybridnb.detect",
    "Trainer": "hybridnb.trainer",
    "compare": "hybridnb.compare",
    "launch": "hybridnb.distributed",
    "smoke": "hybridnb.runtime",
    "frontend": "hybridnb.runtime",
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


class _Package(types.ModuleType):
    """``hn.detect`` and ``hn.compare`` are functions living in modules of the same name.

    Importing a submodule makes Python set the package attribute to the module, which would turn
    ``hn.detect()`` into "module is not callable" once anything imported ``hybridnb.detect``. The
    public function wins; the module stays reachable through ``sys.modules`` and ``from ... import``.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _LAZY.get(name) == value.__name__:
            self.__dict__.pop(name, None)  # the next access resolves the function lazily
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
