"""The run's state as data: position, accumulators, history, best weights, events, RNG.

Everything the loop changes between steps lives in one ``RunState`` of plain data, which a
checkpoint, the report and an isolated worker's hand-over read and write through
``state_dict()`` / ``load_state_dict()`` (``SAVED``; ``saved.py`` adds the rest).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import NamedTuple

from hybridnb.events import Event

HISTORY_COLUMNS = ["epoch", "step", "train_loss", "val_loss", "val_rmse", "val_nrmse", "val_mae",
                   "val_r2", "val_accuracy", "val_balanced_accuracy", "lr", "samples_per_s",
                   "data_wait_pct", "compute_samples_per_s", "mfu", "peak_memory_mb", "time_s",
                   "events"]
STEP_COLUMNS = ["global_step", "epoch", "loss", "lr"]


class Stop(str, enum.Enum):
    """Why a fit stopped before its last epoch (``trainer.stopped``; compares equal to its
    value, e.g. ``"interrupt"``)."""

    INTERRUPT = "interrupt"
    STOP_BUTTON = "stop_button"
    EARLY_STOPPING = "early_stopping"
    CALLBACK = "callback"  # a callback set ``trainer.should_stop = True``

    __str__ = str.__str__


class Plan(NamedTuple):
    """Epochs and batches of one fit (quick mode caps both)."""

    epochs: int
    batches_per_epoch: int
    steps_per_epoch: int
    total_steps: int


@dataclass
class EpochTotals:
    """The epoch's training loss x samples, and those samples."""

    loss_sum: float = 0.0
    loss_samples: int = 0

    def add(self, loss: float, samples: int) -> None:
        self.loss_sum += loss * samples
        self.loss_samples += samples

    def mean(self) -> float:
        return self.loss_sum / self.loss_samples if self.loss_samples else math.nan


@dataclass
class Best:
    """The best validation so far: ``value`` of the monitored metric, where it was reached,
    validations since without improvement (``bad``) and the weights then (a CPU copy)."""

    value: float | None = None
    step: int | None = None
    epoch: int | None = None
    bad: int = 0
    model: dict | None = None


# What a checkpoint holds of the run (Composer's ``serialized_attributes``); the other fields
# are this process's: the RNG state a resume applies at its epoch's start, the plan, and why the
# fit stopped.
SAVED = ("epoch", "batches_done", "global_step", "acc", "lr_scale", "micro", "history", "steps",
         "events", "epoch_first_event", "best", "epoch_start")


@dataclass
class RunState:
    """Where the run is and what it has seen, as data (no handles: loaders and generators are
    ``opening.Loaders``'; the last good full state is the checkpoints part's)."""

    epoch: int = 0
    batches_done: int = 0
    global_step: int = 0
    acc: EpochTotals = field(default_factory=EpochTotals)
    lr_scale: float = 1.0
    micro: int | None = None  # the micro-batch size after an out-of-memory split
    history: list[dict] = field(default_factory=list)
    steps: list[tuple] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    epoch_first_event: int = 0
    best: Best = field(default_factory=Best)
    epoch_start: dict | None = None
    pending_rng: dict | None = None
    plan: Plan = Plan(0, 0, 0, 0)
    stopped: Stop | None = None

    @classmethod
    def fresh(cls, events: list[Event], plan: Plan = Plan(0, 0, 0, 0)) -> RunState:
        """A new run that keeps the events said so far (notes from set-up, earlier fits) and
        ``plan`` (the fit opened its data before it began)."""
        return cls(events=events, epoch_first_event=len(events), plan=plan)

    def end_epoch(self) -> None:
        self.epoch += 1
        self.batches_done = 0
        self.acc = EpochTotals()
        self.epoch_first_event = len(self.events)

    def state_dict(self) -> dict:
        """The ``SAVED`` fields as plain CPU data (the checkpoint's layout)."""
        return {"lr_scale": float(self.lr_scale), "micro": self.micro,
                "position": {"epoch": self.epoch, "batches_done": self.batches_done,
                             "global_step": self.global_step},
                "acc": {"loss_sum": self.acc.loss_sum, "loss_samples": self.acc.loss_samples},
                "history": [dict(r) for r in self.history], "steps": [list(s) for s in self.steps],
                "events": [e.to_dict() for e in self.events],
                "epoch_first_event": self.epoch_first_event,
                "best": dict(vars(self.best)),  # best.model is already a CPU copy
                "epoch_start": self.epoch_start}

    def load_state_dict(self, state: dict, events: bool = True) -> None:
        """Continue from a saved run state (its RNG applied when the epoch starts);
        ``events=False`` keeps this run's events (a restore must not forget why it restored)."""
        pos = state["position"]
        self.epoch, self.batches_done = int(pos["epoch"]), int(pos["batches_done"])
        self.global_step = int(pos["global_step"])
        self.acc = EpochTotals(float(state["acc"]["loss_sum"]), int(state["acc"]["loss_samples"]))
        self.lr_scale = float(state["lr_scale"])
        self.micro = int(state["micro"]) if state.get("micro") else None
        self.history = [{c: r.get(c, math.nan) for c in HISTORY_COLUMNS} for r in state["history"]]
        self.steps = [tuple(s) for s in state["steps"]]
        self.best = Best(**state["best"])
        self.epoch_start = state["epoch_start"]
        self.pending_rng = state["rng"]
        if events:
            self.events = [Event(**e) for e in state["events"]]
            self.epoch_first_event = int(state.get("epoch_first_event", 0))
