"""What the view has seen of one run: the numbers every renderer draws from.

``add`` runs on every training step and only appends (O(1)); renderers read the record when
their throttle says so. It computes no loss of its own: every renderer shows the Trainer's
``train_loss``, the history's number.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from hybridnb.events import Event, row_kind


class RunRecord:
    """Steps, epoch ends, events and the memory sampler of one ``fit``."""

    def __init__(self, run: Mapping[str, Any], sampler=None):
        self.run = dict(run)
        self.epochs = max(1, int(run.get("epochs") or 1))
        spe = run.get("steps_per_epoch")
        self.steps_per_epoch: int | None = int(spe) if spe else None
        self.start_time = time.time()
        self.steps: list[int] = []
        self.losses: list[float] = []
        self.lrs: list[float] = []
        self.epoch_ends: list[dict[str, Any]] = []
        self.val_rows: list[dict[str, Any]] = []  # every update carrying val_* metrics
        self.events: list[Event] = []
        self.state: dict[str, Any] = {}
        self.sampler = sampler
        self.at_epoch_end = False  # between an epoch-end update and the next step
        self._pace_from: tuple[float, float] | None = None  # (fraction, elapsed) after step 1

    def add(self, state: Mapping[str, Any]) -> None:
        """One row: a step's, a validation's between steps (``val_every``) or an epoch's end."""
        kind = row_kind(state)
        if kind == "validation":
            self.val_rows.append(dict(state))
        elif kind == "epoch":
            row = {**self.state, **state}  # an EpochRow carries its epoch and global_step
            self.epoch_ends.append(row)
            if any(k.startswith("val_") for k in state):
                self.val_rows.append(row)
            if self.steps_per_epoch is None and row.get("step"):
                self.steps_per_epoch = int(row["step"])  # learnt from the first epoch
            self.state, self.at_epoch_end = row, True
        else:
            self.state = state  # the Trainer passes a fresh dict per step: no copy needed
            self.at_epoch_end = False
            self.steps.append(state.get("global_step") or len(self.steps) + 1)
            for values, key in ((self.losses, "loss"), (self.lrs, "lr")):
                values.append(float("nan") if state.get(key) is None else float(state[key]))
            if self._pace_from is None and self.steps_per_epoch:  # this fit's first step done
                self._pace_from = (self.fraction(), self.elapsed())

    @property
    def epochs_done(self) -> int:
        """Completed epochs (counts epochs of a resumed run done before this fit too)."""
        return self.epoch + 1 if self.at_epoch_end else self.epoch

    @property
    def epoch(self) -> int:
        """0-based epoch of the latest step."""
        return int(self.state.get("epoch") or 0)

    @property
    def step(self) -> int:
        return int(self.state.get("step") or 0)

    @property
    def global_step(self) -> int:
        return self.steps[-1] if self.steps else 0

    def elapsed(self) -> float:
        e = self.state.get("elapsed_s")
        return float(e) if e is not None else time.time() - self.start_time

    def fraction(self) -> float | None:
        """Share of the planned run done (None while the epoch length is unknown)."""
        if self.at_epoch_end:
            return min(1.0, self.epochs_done / self.epochs)
        spe = self.steps_per_epoch
        if not spe:
            return None
        return min(1.0, (self.epoch * spe + self.step) / (self.epochs * spe))

    def remaining_s(self) -> float | None:
        """Time left at this fit's pace after its first step (a resumed run's earlier epochs do
        not count, nor does the first step, which compiles or warms up)."""
        frac = self.fraction()
        if frac is None or self._pace_from is None or frac <= self._pace_from[0]:
            return None
        start_frac, start_s = self._pace_from
        return max(self.elapsed() - start_s, 0.0) * (1 - frac) / (frac - start_frac)

    def memory(self):
        """The memory series collected so far (empty without a sampler)."""
        from hybridnb.measure.memory import MemorySeries

        return self.sampler.series() if self.sampler is not None else MemorySeries()
