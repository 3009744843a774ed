"""Validation during a fit and its verdicts: the monitored metric checked at the first validation,
the best weights so far, and early stopping (``patience`` validations without improvement)."""

from __future__ import annotations

import math

from hybridnb.events import ValidationRow
from hybridnb.train.bus import Validated
from hybridnb.train.evaluation import metrics as metrics_of
from hybridnb.train.evaluation import predict_here
from hybridnb.train.metrics import higher_is_better
from hybridnb.train.recovery import to_cpu
from hybridnb.train.schedules import tell_validation
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


class Validation:
    """A fit's validations: the scores (``run``), then what they decide (``verdict``): the best
    weights kept and written, the schedule told, early stopping. ``last`` is the latest one,
    reused at the epoch's end when ``val_every`` just ran."""

    def __init__(self, loop) -> None:
        self.loop = loop
        self.last: tuple = (None, {})

    def run(self, loader) -> dict:
        loop = self.loop
        scores = metrics_of(*predict_here(loop, loader, with_targets=True, phase="validation"),
                            task=loop.settings.task)
        loop.heartbeat.beat("step")
        self.last = (loop.state.global_step, {"val_" + k: v for k, v in scores.items()})
        return self.last[1]

    def between_steps(self, loader) -> bool:
        """A validation every ``val_every`` steps, drawn; True when early stopping says stop."""
        loop = self.loop
        metrics = self.run(loader)
        loop.learner.model.train()
        row = loop.progress.row(loop.state, loop.settings.grad_accum, loop.learner.lr(),
                                loss=loop.state.steps[-1][2], **metrics)
        loop.bus.emit(Validated(loop.state.global_step, metrics, ValidationRow(row)))
        return self.verdict(metrics)

    def at_epoch_end(self, loader) -> tuple[dict, bool]:
        """The epoch's metrics (reused when ``val_every`` just ran) and whether to stop."""
        if loader is None:
            return {}, False
        if self.last[0] == self.loop.state.global_step:
            return self.last[1], False
        metrics = self.run(loader)
        return metrics, self.verdict(metrics)

    def verdict(self, metrics: dict) -> bool:
        """Track the best weights; True when early stopping says stop (on every rank)."""
        loop = self.loop
        state, stopping, learner, settings = loop.state, loop.stopping, loop.learner, loop.settings
        said = stopping.check(metrics)
        if said and not any(e.kind == "nonfinite_targets" for e in state.events):
            loop.bus.say("nonfinite_targets", said)
        improved = stopping.improved(state.best, metrics)
        if improved is None:
            return False
        stopping.record(state.best, metrics, improved, state.global_step, state.epoch,
                        lambda: to_cpu(learner.eval_model(True).state_dict()))
        if improved:
            best = state.best
            loop.checkpoints.save_best({"model": best.model, "monitor": settings.monitor,
                                        "value": best.value, "epoch": best.epoch,
                                        "global_step": best.step, "ema": learner.ema is not None})
        note = tell_validation(learner.schedule, improved, metrics.get(settings.monitor))
        if note:
            loop.bus.say("lr_plateau", note)
        if loop.placement.strategy.agree(stopping.should_stop(state.best)):
            loop.bus.say("early_stop", stopping.message(state.best))
            return True
        return False
