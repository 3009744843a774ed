"""``Applied``: what ``apply_speedups`` applied and measured, its message, and its undo."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Applied:
    """What ``apply_speedups`` applied and measured; ``precision`` is the one to train with."""

    device: str
    precision: str
    mode: str
    applied: list[str] = field(default_factory=list)  # knobs in effect, in the order applied
    speedup: dict[str, float] = field(default_factory=dict)  # measured gains, kept or not
    skipped: dict[str, str] = field(default_factory=dict)  # knob -> why it is not in effect
    # knob -> the modules its rewrite runs (a chain as "a>bn>b")
    modules: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # must be shown: a rewrite that failed its check
    rules: dict[str, str] = field(default_factory=dict)  # knob -> the rule that applied it
    seconds: float = 0.0  # checks and measuring included
    # run by undo() (last first) and by restore_globals() (process-wide flags put back)
    undoers: list[Callable[[], None]] = field(default_factory=list, repr=False)
    global_restores: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def __bool__(self) -> bool:
        return bool(self.applied)

    @property
    def message(self) -> str:
        """One sentence: what was applied, with the measured gains, and what it cost."""
        if self.mode == "off":
            return "speedups off"
        parts = []
        for knob in self.applied:
            gain = self.speedup.get(knob)
            label = {"rewrite": "depthwise-as-matmul", "chain": "conv-BatchNorm-conv as one "
                     "convolution", "rows": "(1, K) convolutions as 1-D", "span":
                     "electrode-spanning convolutions as 1-D",
                     "precision": f"precision {self.precision}"}.get(knob, knob)
            if self.modules.get(knob):
                label += f" ({', '.join(self.modules[knob])})"
            if knob in self.rules:
                label += f" (rule: {self.rules[knob]})"
            parts.append(f"{label} {gain:.2f}x" if gain else label)
        losers = [f"{k} {v:.2f}x" for k, v in self.speedup.items() if k not in self.applied]
        unmeasured = sorted({v for k, v in self.skipped.items()
                             if k not in self.speedup and k != "precision"})
        text = f"speedups on {self.device}: " + (", ".join(parts) if parts else "none applied")
        if losers:
            text += f" (not kept: {', '.join(losers)})"
        if unmeasured:
            text += f" ({'; '.join(unmeasured)})"
        how = ("set" if self.mode == "all" else "measured" if self.speedup
               else "decided by rule" if self.rules else "checked")
        return text + f"; {how} in {self.seconds:.1f} s on the first batch"

    def portable(self) -> Applied:
        """A copy without the undo actions (they hold the model): what a worker sends back."""
        return dataclasses.replace(self, undoers=[], global_restores=[])

    def restore_globals(self) -> None:
        """Process-wide flags (the cuDNN autotuner) back as they were; the model keeps its knobs.
        Safe to call twice."""
        while self.global_restores:
            self.global_restores.pop()()
        if "cudnn_benchmark" in self.applied:
            self.applied.remove("cudnn_benchmark")

    def undo(self) -> None:
        """Take back every knob (the model's layout and modules) and the process-wide flags."""
        while self.undoers:
            self.undoers.pop()()
        self.restore_globals()
        self.applied.clear()
        self.modules.clear()
