"""Recovery and run events: one record type shared by the Trainer, recovery and the live view."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Event:
    """Something that happened during a run that a person should know about; ``kind`` is a
    short tag (``"oom_split"``, ``"device_lost"``, ``"early_stop"``, ...)."""

    kind: str
    message: str
    step: int = 0
    epoch: int = 0
    time: float = field(default_factory=time.time)

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"[step {self.step}] {self.kind}: {self.message}"


class StepRow(dict):
    """A row the live view draws (a dict of numbers) whose class names its kind; this one after
    an optimizer step: ``loss``, ``lr``, the epoch's running ``train_loss``, speeds."""

    kind = "step"


class ValidationRow(StepRow):
    """After a validation between steps (``val_every``): the step's row plus ``val_*``."""

    kind = "validation"


class EpochRow(StepRow):
    """At an epoch's end (with ``epoch_end=True`` for views that read the flag)."""

    kind = "epoch"


def row_kind(row: dict) -> str:
    """"step", "validation" or "epoch": a typed row's own; a plain dict is an epoch's row when it
    says ``epoch_end``, else a step's (no kind is guessed from the other keys)."""
    return getattr(row, "kind", "epoch" if row.get("epoch_end") else "step")
