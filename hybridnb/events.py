"""Recovery and run events: one record type shared by the Trainer, recovery and the live view."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Event:
    """Something that happened during a run that a person should know about.

    ``kind`` is a short machine-readable tag, e.g. ``"oom_split"``, ``"cpu_batch"``,
    ``"device_lost"``, ``"nonfinite_loss"``, ``"loss_spike"``, ``"restore"``, ``"compile_fallback"``,
    ``"precision_fallback"``, ``"early_stop"``, ``"interrupt"``, ``"checkpoint_fallback"``.
    """

    kind: str
    message: str
    step: int = 0
    epoch: int = 0
    time: float = field(default_factory=time.time)

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"[step {self.step}] {self.kind}: {self.message}"
