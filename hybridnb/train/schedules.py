"""Learning-rate schedules as a multiplier of the base learning rate.

Each schedule answers ``factor(step)`` for an optimizer step, is told the run's length by
``bind(total_steps)`` and hears every validation through ``on_validation(improved)``. Their state
is plain numbers (saved in checkpoints).

>>> s = WarmupCosine(warmup=0.1); s.bind(1000)
>>> s.factor(0), s.factor(100), s.factor(1000)
(0.01, 1.0, 0.0)
"""

from __future__ import annotations

import math


class Constant:
    """No schedule: factor 1 throughout."""

    name = "constant"

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

    name = "warmup_cosine"

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

    name = "plateau"

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


def make_schedule(schedule, warmup: float = 0.05) -> Constant:
    """``"warmup_cosine"`` | ``"plateau"`` | ``"constant"`` | None | a schedule object."""
    if schedule is None or schedule == "constant":
        return Constant()
    if schedule == "warmup_cosine":
        return WarmupCosine(warmup=warmup)
    if schedule == "plateau":
        return Plateau()
    if all(hasattr(schedule, m) for m in ("bind", "factor", "on_validation", "state_dict")):
        return schedule
    raise ValueError(f"schedule={schedule!r}: use 'warmup_cosine', 'plateau', 'constant', None "
                     "or an object with bind/factor/on_validation/state_dict")
