"""Parametrized modules (``torch.nn.utils.parametrize``: weight norm, spectral norm,
braindecode's max-norm layers) travel to a worker as they are. ``register_parametrization``
swaps the module's class for one that refuses pickling, and registering again would run
``right_inverse`` (other weights): ``reduce`` sends the module as its class before
parametrization with its whole state, and ``rebuild`` makes the class and its properties again:
every tensor arrives bit for bit, with the kernel's ``state_dict`` keys.
"""

from __future__ import annotations

import sys
from typing import Any


def is_parametrized(obj: Any) -> bool:
    """Whether ``obj`` is a module whose class ``register_parametrization`` swapped (cheap for
    every other object: pickling asks for each one)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(obj, torch.nn.Module):
        return False
    held = obj.__dict__.get("_modules", {}).get("parametrizations")
    if not isinstance(held, torch.nn.ModuleDict):
        return False
    from torch.nn.utils import parametrize

    return parametrize.is_parametrized(obj)


def reduce(obj: Any) -> tuple:
    """A pickle reduce value: its state is pickled after the module itself is memoised, so a
    reference back to it inside its state (a parent held by a child) is the same object there."""
    from torch.nn.utils import parametrize

    base = parametrize.type_before_parametrizations(obj)
    state = base.__getstate__(obj)  # the class's own (nn.Module has one), not the one that refuses
    if state is obj.__dict__:
        state = state.copy()
    return _new, (base,), state, None, None, rebuild


def _new(base: type) -> Any:
    return base.__new__(base)


def rebuild(module: Any, state: dict) -> None:
    """The worker's side: ``module`` (an instance of the class before parametrization) gets
    its state, then the parametrized class and one property per parametrized tensor again."""
    from torch.nn.utils import parametrize

    module.__setstate__(state)  # nn.Module's, or the class's own
    parametrize._inject_new_class(module)  # (both in every torch this package supports)
    for name in module.parametrizations:
        parametrize._inject_property(module, name)
