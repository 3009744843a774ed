"""Learning-rate schedules as a multiplier of the base learning rate.

Each schedule answers ``factor(step)`` for an optimizer step, is told the run's length by
``bind(total_steps)`` and hears every validation through ``on_validation(improved)``; its state is
plain numbers (saved in checkpoints). ``schedule=`` may also be a factory building a
``torch.optim.lr_scheduler`` (``TorchSchedule``), read as a factor like the others, so the loss
guard's LR cut, resume and an isolated worker treat it the same way.

>>> s = WarmupCosine(warmup=0.1); s.bind(1000)
>>> s.factor(0), s.factor(100), s.factor(1000)
(0.01, 1.0, 0.0)
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable

import torch


class Constant:
    """No schedule: factor 1 throughout."""

    def bind(self, total_steps: int) -> None:
        self.total_steps = int(total_steps)

    def factor(self, step: int) -> float:
        return 1.0

    def on_validation(self, improved: bool) -> str | None:
        return None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class WarmupCosine(Constant):
    """Linear warmup from ``1/warmup_steps`` to 1, then cosine decay to ``min_factor``.

    ``warmup`` below 1 is a fraction of the run's optimizer steps, else a number of steps.
    """

    def __init__(self, warmup: float = 0.05, min_factor: float = 0.0) -> None:
        if warmup < 0:
            raise ValueError(f"warmup={warmup!r} must be >= 0 (a fraction < 1 or a step count)")
        self.warmup, self.min_factor = warmup, float(min_factor)
        self.total_steps, self.warmup_steps = 1, 0

    def bind(self, total_steps: int) -> None:
        self.total_steps = max(int(total_steps), 1)
        w = self.warmup * self.total_steps if self.warmup < 1 else self.warmup
        self.warmup_steps = min(int(round(w)), self.total_steps - 1)

    def factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        span = max(self.total_steps - self.warmup_steps, 1)
        progress = min((step - self.warmup_steps) / span, 1.0)
        return self.min_factor + (1 - self.min_factor) * 0.5 * (1 + math.cos(math.pi * progress))


class Plateau(Constant):
    """Multiply the factor by ``factor`` after ``patience`` validations without improvement
    (never below ``min_factor``)."""

    def __init__(self, patience: int = 3, factor: float = 0.5, min_factor: float = 1e-3) -> None:
        if patience < 1 or not 0 < factor < 1:
            raise ValueError(f"Plateau(patience={patience!r}, factor={factor!r}): patience must "
                             "be >= 1 and factor in (0, 1)")
        self.patience, self.cut, self.min_factor = int(patience), float(factor), float(min_factor)
        self.current, self.bad = 1.0, 0

    def factor(self, step: int) -> float:
        return self.current

    def on_validation(self, improved: bool) -> str | None:
        self.bad = 0 if improved else self.bad + 1
        if self.bad >= self.patience and self.current > self.min_factor:
            self.current = max(self.current * self.cut, self.min_factor)
            self.bad = 0
            return f"validation did not improve for {self.patience} checks; LR factor now " \
                   f"{self.current:.3g}"
        return None

    def state_dict(self) -> dict:
        return {"current": float(self.current), "bad": int(self.bad)}

    def load_state_dict(self, state: dict) -> None:
        self.current, self.bad = float(state["current"]), int(state["bad"])


class TorchSchedule(Constant):
    """A ``torch.optim.lr_scheduler`` made by ``factory(optimizer[, total_steps])`` (the run's
    optimizer steps after gradient accumulation), read as a factor of the base LR.

    Built afresh at every ``bind``; a resume loads the saved state when the factory builds the
    same scheduler, else advances the new one to the run's step (``replaced`` says why).
    ``ReduceLROnPlateau`` steps at each validation with the monitored metric (``on_validation``'s
    second argument; a user's schedule object keeps its one-argument method). The loop multiplies
    in the loss guard's cut, so a chained scheduler never compounds it; the first group's factor
    applies to every group.
    """

    def __init__(self, factory: Callable, optimizer: torch.optim.Optimizer) -> None:
        self.factory, self.optimizer = factory, optimizer
        self.sched = None
        self._pending: dict | None = None

    def bind(self, total_steps: int) -> None:
        self.total_steps = max(int(total_steps), 1)
        # a resumed fit's optimizer already holds the hyper-parameters the scheduler had set
        # (OneCycleLR's momentum too); building a scheduler resets them to its start
        loaded = [{k: v for k, v in g.items() if k != "params"}
                  for g in self.optimizer.param_groups] if self._pending else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "step() before optimizer.step()"
            sched = self.factory(self.optimizer, self.total_steps) if takes_total_steps(
                self.factory) else self.factory(self.optimizer)
        if not isinstance(sched, torch.optim.lr_scheduler.LRScheduler):  # ReduceLROnPlateau too
            raise TypeError(f"schedule={_name(self.factory)} returned a {type(sched).__name__}; "
                            "a schedule factory must return a torch.optim.lr_scheduler object "
                            "built on the optimizer it is given")
        if getattr(sched, "optimizer", self.optimizer) is not self.optimizer:
            raise ValueError(f"schedule={_name(self.factory)} built its scheduler on another "
                             "optimizer: use the optimizer the factory is given")
        length = getattr(sched, "total_steps", None)  # OneCycleLR: torch fails part-way
        if isinstance(length, int) and length < self.total_steps:
            hint = ("use the total_steps it receives" if takes_total_steps(self.factory) else
                    "give the factory a second argument, total_steps (this run's count)")
            raise ValueError(f"schedule={_name(self.factory)} built a {type(sched).__name__} "
                             f"of total_steps={length}, but this run takes {self.total_steps} "
                             f"optimizer steps (trainer.total_steps: epochs x optimizer steps "
                             f"per epoch, after grad_accum); {hint}, e.g. lambda opt, total_steps: "
                             "OneCycleLR(opt, max_lr=..., total_steps=total_steps)")
        self.sched = sched
        self.plateau = isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau)
        self.base = [g.get("initial_lr", g["lr"]) for g in self.optimizer.param_groups]
        self.current = 1.0
        self.replaced: str | None = None  # why a resumed fit did not load the saved state
        if self._pending:
            saved = self._pending.get("torch", {})
            if self.plateau or _config(saved) == _config(sched.state_dict()):
                for group, values in zip(self.optimizer.param_groups, loaded, strict=True):
                    group.update(values)
                self.load_state_dict(self._pending)
            else:  # the scheduler given is the one used: factor() advances it to the run's step
                self.replaced = (f"the checkpoint's {type(sched).__name__} state was saved "
                                 f"with other settings ({_differences(saved, sched)}): using "
                                 "the scheduler given, advanced to the run's step")
                self._pending = None

    def factor(self, step: int) -> float:
        if self.plateau:
            return self.current
        while self.sched.last_epoch < step:
            # the scheduler's own LRs back first: the loop's have the guard's cut (docstring)
            for group, lr in zip(self.optimizer.param_groups, self.sched.get_last_lr(),
                                 strict=True):
                group["lr"] = lr
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                self.sched.step()
        return float(self.sched.get_last_lr()[0]) / self.base[0]

    def on_validation(self, improved: bool, value: float | None = None) -> str | None:
        if not self.plateau or value is None or not math.isfinite(value):
            return None
        before, groups = self.current, self.optimizer.param_groups
        used = [g["lr"] for g in groups]  # the LRs the loop set: back after the scheduler's say
        for group, base in zip(groups, self.base, strict=True):
            group["lr"] = base * self.current
        self.sched.step(value)
        self.current = groups[0]["lr"] / self.base[0]
        for group, lr in zip(groups, used, strict=True):
            group["lr"] = lr
        if self.current < before:
            return (f"ReduceLROnPlateau cut the learning rate (monitored value {value:.4g}); "
                    f"LR factor now {self.current:.3g}")
        return None

    def state_dict(self) -> dict:
        if self.sched is None:
            return dict(self._pending or {})
        return {"torch": self.sched.state_dict(), "current": float(self.current)}

    def load_state_dict(self, state: dict) -> None:
        if self.sched is None or not state:
            self._pending = dict(state) if state else None
            return
        self.sched.load_state_dict(state["torch"])
        self.current = float(state.get("current", 1.0))
        self._pending = None


_DYNAMIC = {"last_epoch", "_step_count", "_last_lr", "_get_lr_called_within_step",
            "_is_initial", "verbose"}


def _config(state):
    """A scheduler's ``state_dict`` without what stepping changes (also inside chained
    schedulers' states): what it was built with."""
    if isinstance(state, dict):
        return {k: _config(v) for k, v in state.items() if k not in _DYNAMIC}
    if isinstance(state, (list, tuple)):
        return [_config(v) for v in state]
    return state


def _differences(saved: dict, sched) -> str:
    new, old = _config(sched.state_dict()), _config(saved)
    keys = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]

    def shown(k):  # a value, unless it is a nested scheduler's whole state
        a, b = old.get(k), new.get(k)
        nested = isinstance(a, (dict, list)) or isinstance(b, (dict, list))
        return k if nested else f"{k}={a!r} saved, {b!r} given"
    return ", ".join(shown(k) for k in keys[:3]) + (", ..." if len(keys) > 3 else "")


def takes_total_steps(factory) -> bool:
    """Whether a schedule factory takes a second argument, the run's total optimizer steps."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)


def _name(factory) -> str:
    return getattr(factory, "__qualname__", None) or type(factory).__name__


def make_schedule(schedule, warmup: float, optimizer: torch.optim.Optimizer) -> Constant:
    """``"warmup_cosine"`` | ``"plateau"`` | ``"constant"`` | None | a schedule object | a
    factory ``(optimizer[, total_steps]) -> LRScheduler`` (built on ``optimizer``)."""
    if schedule is None or schedule == "constant":
        return Constant()
    if schedule == "warmup_cosine":
        return WarmupCosine(warmup=warmup)
    if schedule == "plateau":
        return Plateau()
    if all(hasattr(schedule, m) for m in ("bind", "factor", "on_validation", "state_dict")):
        return schedule
    if isinstance(schedule, type) and issubclass(schedule, torch.optim.lr_scheduler.LRScheduler):
        raise ValueError(f"schedule={schedule.__name__} is a scheduler class: pass a factory "
                         f"that builds it on the optimizer, e.g. schedule=lambda opt: "
                         f"torch.optim.lr_scheduler.{schedule.__name__}(opt, ...)")
    if callable(schedule) and not isinstance(schedule, type) and not hasattr(schedule, "factor"):
        return TorchSchedule(schedule, optimizer)
    raise ValueError(f"schedule={schedule!r}: use 'warmup_cosine', 'plateau', 'constant', None, "
                     "an object with bind/factor/on_validation/state_dict, or a factory "
                     "optimizer -> torch.optim.lr_scheduler.LRScheduler")
