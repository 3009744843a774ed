"""Validation's verdicts: the monitored metric checked at the first validation, the best weights
so far, and early stopping (``patience`` validations without improvement)."""

from __future__ import annotations

import math

from hybridnb.train.metrics import higher_is_better
from hybridnb.train.state import Best


class EarlyStopping:
    """Tracks ``monitor`` in a ``Best`` record; ``patience=None`` never stops."""

    def __init__(self, monitor: str, patience: int | None) -> None:
        self.monitor, self.patience = monitor, patience
        self.sign = 1 if higher_is_better(monitor) else -1

    def check(self, metrics: dict) -> str | None:
        """The first validation: ``monitor`` must exist (a ValueError listing what does); a
        sentence to say once when some targets were non-finite, else None."""
        if self.monitor not in metrics:
            raise ValueError(f"monitor={self.monitor!r} is not a validation metric; the "
                             f"validation gives {sorted(metrics)}")
        bad = metrics.get("val_nonfinite_targets")
        if bad:
            return (f"{int(bad)} validation samples have non-finite targets: they are left out "
                    "of val_loss and the metrics")
        return None

    def improved(self, best: Best, metrics: dict) -> bool | None:
        """Whether ``metrics`` beat ``best`` (None: the metric is missing or not finite, which
        neither improves nor counts against patience)."""
        value = metrics.get(self.monitor)
        if value is None or not math.isfinite(value):
            return None
        return best.value is None or self.sign * (value - best.value) > 0

    def record(self, best: Best, metrics: dict, improved: bool, step: int, epoch: int,
               weights) -> None:
        """Update ``best``: the new value and weights (``weights()`` gives a CPU copy) when
        improved, one more bad validation otherwise."""
        if improved:
            best.value, best.step, best.epoch, best.bad = float(metrics[self.monitor]), step, \
                epoch, 0
            best.model = weights()
        else:
            best.bad += 1

    def should_stop(self, best: Best) -> bool:
        return bool(self.patience and best.bad >= self.patience)

    def message(self, best: Best) -> str:
        return (f"{self.monitor} did not improve for {self.patience} validations (best "
                f"{best.value:.4g} at epoch {best.epoch}, step {best.step})")
