"""What the Trainer builds before training: device, strategy, precision, optimizer, frozen
parameters; each error names the argument, the value and the fix."""

from __future__ import annotations

import contextlib
import fnmatch

import torch

from hybridnb.failures import is_lost
from hybridnb.strategies.base import SingleDevice, Strategy
from hybridnb.strategies.ddp import DDPStrategy, wants_ddp
from hybridnb.strategies.deepspeed import DeepSpeedStrategy
from hybridnb.train.precision import Precision


def resolve_device(device, hw, bus=None) -> torch.device:
    """The device asked for, checked (an error naming ``device=`` and the fix when torch or this
    machine lacks it); a device lost earlier in this process gives the CPU, said on ``bus``."""
    if device == "auto":
        dev = hw.device
    else:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"device={device!r} is not a device: use 'auto', 'cpu', 'cuda', "
                             "'cuda:N' or 'mps'") from exc
        missing = _missing(dev)
        if missing:
            raise ValueError(f"device={device!r}: {missing}; use device='auto' (what "
                             "hn.detect() recommends) or device='cpu'")
    if dev.type != "cpu" and is_lost(dev):
        if bus is not None:
            bus.note("device_lost", f"{dev} failed earlier in this process; using the CPU")
        return torch.device("cpu")
    return dev


def _missing(dev: torch.device) -> str | None:
    """Why ``dev`` cannot be used here, or None. Asks torch without initialising CUDA."""
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            return "this machine has no usable CUDA GPU (hn.detect() found none)"
        if dev.index is not None and dev.index >= count:
            return f"this machine has {count} CUDA GPU(s) (cuda:0..cuda:{count - 1})"
    if dev.type == "mps" and not torch.backends.mps.is_available():
        return "MPS (Apple GPU) is not available here"
    return None


def make_strategy(strategy, device: torch.device) -> Strategy:
    """``strategy=`` as a strategy object (what each name means: ``Trainer``'s docstring)."""
    if strategy is not None and not isinstance(strategy, str):
        return strategy
    if strategy == "deepspeed":
        return DeepSpeedStrategy(device)
    if wants_ddp(strategy):
        return DDPStrategy(device)
    if strategy in ("auto", "single", None):
        return SingleDevice(device)
    raise ValueError(f"strategy={strategy!r} is not one of ('auto', 'single', 'ddp', 'deepspeed') "
                     "or a strategy object")


def choose_precision(asked: str, strategy: Strategy, recommended: str | None,
                     bus) -> Precision:
    """The precision for the strategy's device within what it supports: an automatic choice it
    cannot run falls back to fp32 (said on ``bus``), an explicit one is an error."""
    precision = Precision.choose(asked, strategy.device, recommended=recommended)
    if precision.name not in strategy.supported_precisions:
        if asked == precision.name:
            raise ValueError(f"precision={asked!r} with strategy={strategy.name!r}: it supports "
                             f"{strategy.supported_precisions}; use precision='bf16' or 'fp32'")
        bus.note("precision_fallback", f"strategy={strategy.name!r} cannot run "
                 f"{precision.name} here; training in fp32")
        return Precision.choose("fp32", strategy.device)
    if precision.note:
        bus.note("precision_fallback", precision.note)
    return precision


def cpu_precision() -> Precision:
    """fp32 after leaving the GPU, whatever was asked: bf16 autocast on a CPU sends convolutions
    through oneDNN, which asked an Intel Xeon for ~880 GB on EEGNeX (the process was killed)."""
    return Precision.choose("fp32", "cpu")


def freeze(model: torch.nn.Module, patterns: list[str]) -> list[str]:
    """Set requires_grad=False on parameters whose name matches a pattern; returns their names."""
    params = dict(model.named_parameters())
    frozen = set()
    for pattern in patterns:
        hits = [n for n in params if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            raise ValueError(f"freeze pattern {pattern!r} matches no parameter of "
                             f"{type(model).__name__} (names look like {list(params)[:4]})")
        frozen.update(hits)
    for name in frozen:
        params[name].requires_grad_(False)
    return sorted(frozen)


def make_optimizer(optimizer, params, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    if optimizer is None or optimizer == "adamw":
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    elif optimizer == "adam":
        opt = torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    elif optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay)
    elif isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("pass optimizer as a callable params -> Optimizer (e.g. "
                        "lambda p: torch.optim.SGD(p, lr=0.1)) so frozen parameters are left out")
    elif callable(optimizer):
        opt = optimizer(params)
    else:
        raise ValueError(f"optimizer={optimizer!r}: use None, 'adamw', 'adam', 'sgd' or a "
                         "callable")
    for group in opt.param_groups:
        group.setdefault("initial_lr", group["lr"])
    return opt


def compile_settings(compiled: bool, device: torch.device, precision: Precision):
    """Inductor settings scoped to this fit: on the CPU under bf16, no layout optimisation
    (oneDNN's channels-last bf16 grouped convolution asks for ~110 GB there)."""
    if not (compiled and device.type == "cpu" and precision.name == "bf16"):
        return contextlib.nullcontext()
    import torch._inductor.config as inductor_config

    return inductor_config.patch(layout_optimization=False)
