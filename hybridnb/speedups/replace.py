"""Replacement modules: a faster module put in a stock module's place, sharing its state.

A ``Replacement`` holds the module it stands in for (``original``, outside ``_modules``) and
shares the original's parameter, buffer and submodule dicts and its hooks (the same dicts). So
``state_dict()`` has the same keys and tensors (parametrizations included), an optimizer steps
the same Parameters, ``model.to(...)`` moves both, and ``restore`` keeps everything learnt.
Pickling writes the original module (a saved model loads without hybridnb); a ``deepcopy``
copies the replacement (the copy stays fast). Attributes the replacement lacks (``kernel_size``)
are read from the original, and ``train()``/``eval()`` set both.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable, Iterator

import torch
from torch import nn


class Replacement(nn.Module):
    """Stands in for ``original`` (see the module docstring); subclasses write ``forward``."""

    original: nn.Module

    def __init__(self, original: nn.Module) -> None:
        super().__init__()
        for key in list(self.__dict__):  # every dict nn.Module keeps: parameters, hooks, ...
            if key != "training":
                self.__dict__[key] = original.__dict__[key]
        self.__dict__["_version"] = original._version  # the state_dict metadata of the original
        self.__dict__["original"] = original  # not a submodule: no state_dict key of its own
        self.training = original.training

    def stock(self, *args, **kwargs):
        """The original module's own forward (its hooks are shared, so they ran already)."""
        self.original.training = self.training
        return self.original.forward(*args, **kwargs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:  # no "original" yet (mid-deepcopy): None's AttributeError
            return getattr(self.__dict__.get("original"), name)

    def train(self, mode: bool = True) -> Replacement:
        self.original.training = mode
        return super().train(mode)

    def extra_repr(self) -> str:
        return self.original.extra_repr()

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        self.original._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        self.original._load_from_state_dict(*args, **kwargs)  # BatchNorm's version rules included

    def __reduce_ex__(self, protocol):
        # pickled as the original object itself (by its own pickling): unpickling calls
        # itemgetter(0)((original,)), which is the original; nothing of hybridnb is needed
        self.original.training = self.training
        return operator.itemgetter(0), ((self.original,),)

    def __deepcopy__(self, memo: dict) -> Replacement:
        replica = type(self).__new__(type(self))
        memo[id(self)] = replica
        for key, value in self.__dict__.items():  # the shared dicts stay shared in the copy
            replica.__dict__[key] = copy.deepcopy(value, memo)
        return replica


def put(model: nn.Module, name: str, module: nn.Module) -> None:
    """``module`` in the place of ``model``'s submodule ``name`` (never the model: no parent)."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    parent.register_module(child, module)  # takes the place of the module of that name


def replaced(model: nn.Module, kind: type[Replacement]) -> dict[str, Replacement]:
    """The modules of ``model`` that are ``kind`` replacements, by name."""
    return {n: m for n, m in model.named_modules() if isinstance(m, kind)}


def restore(model: nn.Module, kind: type[Replacement]) -> int:
    """Every ``kind`` replacement of ``model`` back to its original; returns how many."""
    found = replaced(model, kind)
    for name, module in found.items():
        module.original.training = module.training
        put(model, name, module.original)
    return len(found)


def originals(model: nn.Module) -> Iterator[nn.Module]:
    """``model.modules()`` with each replacement read as the module it stands in for (rules
    about layers, such as "a grouped Conv2d", see the stock layers)."""
    for module in model.modules():
        yield module.original if isinstance(module, Replacement) else module


def is_stock_conv2d(module: nn.Module) -> bool:
    """A ``Conv2d`` running Conv2d's own forward: a subclass that changes ``forward`` or
    ``_conv_forward`` may do more than the convolution, and is left alone."""
    cls = type(module)
    return (isinstance(module, nn.Conv2d) and cls.forward is nn.Conv2d.forward
            and cls._conv_forward is nn.Conv2d._conv_forward)


class FormReplacement(Replacement):
    """Computes the inputs its form ``fits`` with ``compute`` (static methods taking
    ``(original, x)``, which the layer rewrite checks too), any other with the stock forward."""

    fits: Callable[[nn.Module, torch.Tensor], bool]
    compute: Callable[[nn.Module, torch.Tensor], torch.Tensor]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fits(self.original, x):
            return self.compute(self.original, x)
        return self.stock(x)

