"""Validation during a fit and its verdicts: the monitored metric checked at the first validation,
the best weights so far, and early stopping (``patience`` validations without improvement)."""

from __future__ import annotations

import math

from hybridnb.events import ValidationRow
from hybridnb.train.bus import Validated
from hybridnb.train.evaluation import higher_is_better, predict_here
from hybridnb.train.evaluation import metrics as metrics_of
from hybridnb.train.recovery import to_cpu
from hybridnb.train.schedules import TorchSchedule


class Validation:
    """A fit's validations (``run``) and what they decide (``verdict``); ``last``, the latest,
    is reused at the epoch's end when ``val_every`` just ran."""

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
        """Track the best weights (kept, and written as best.pt) and tell the schedule; True
        when early stopping (``early_stopping`` validations without improvement) says stop, on
        every rank. ``monitor`` must be a metric."""
        loop = self.loop
        state, learner, best = loop.state, loop.learner, loop.state.best
        monitor, patience = loop.settings.monitor, loop.settings.early_stopping
        if monitor not in metrics:
            raise ValueError(f"monitor={monitor!r} is not a validation metric; the validation "
                             f"gives {sorted(metrics)}")
        bad = metrics.get("val_nonfinite_targets")
        if bad and not any(e.kind == "nonfinite_targets" for e in state.events):
            loop.bus.say("nonfinite_targets", f"{int(bad)} validation samples have non-finite "
                         "targets: they are left out of val_loss and the metrics")
        value = metrics[monitor]
        if not math.isfinite(value):  # neither improves nor counts
            return False
        sign = 1 if higher_is_better(monitor) else -1
        better = best.value is None or sign * (value - best.value) > 0
        if better:
            best.value, best.step, best.epoch, best.bad = float(value), state.global_step, \
                state.epoch, 0
            best.model = to_cpu(learner.eval_model(True).state_dict())
            loop.checkpoints.save_best({"model": best.model, "monitor": monitor,
                                        "value": best.value, "epoch": best.epoch,
                                        "global_step": best.step, "ema": learner.ema is not None})
        else:
            best.bad += 1
        schedule = learner.schedule
        note = schedule.on_validation(better, value) if isinstance(schedule, TorchSchedule) \
            else schedule.on_validation(better)
        if note:
            loop.bus.say("lr_plateau", note)
        if loop.placement.strategy.agree(bool(patience and best.bad >= patience)):
            loop.bus.say("early_stop", f"{monitor} did not improve for {patience} "
                         f"validations (best {best.value:.4g} at epoch {best.epoch}, step "
                         f"{best.step})")
            return True
        return False
