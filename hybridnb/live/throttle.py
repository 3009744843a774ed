"""Time-based throttling, adaptive to the cost of a render (the fastprogress idea).

A renderer asks ``due()`` on every training step (one clock read) and renders only when it
answers True. After rendering it reports how long that took; the interval then grows so that
rendering stays under ``budget`` (a fraction of wall time), whatever the step rate.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Throttle:
    """Answer "is it time to render?" at most every ``interval`` seconds.

    ``interval`` is the base period (0.2 s for bars, 1 s for plots). When renders cost ``c``
    seconds the period becomes ``max(interval, c / budget)``, capped at ``max_interval``, so a
    20 ms plot update with ``budget=0.005`` renders every 4 s instead of every second. ``c`` is
    the smallest of the last three render costs: one slow render (a garbage collection, a first
    render paying for imports) does not freeze the display; a render that stays slow does
    stretch the period.
    """

    def __init__(self, interval: float, budget: float = 0.005, max_interval: float = 30.0,
                 clock: Callable[[], float] = time.perf_counter):
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        if not 0 < budget < 1:
            raise ValueError(f"budget must be a fraction in (0, 1), got {budget!r}")
        self.base = float(interval)
        self.interval = float(interval)
        self.budget = float(budget)
        self.max_interval = float(max_interval)
        self.clock = clock
        self.last = -float("inf")
        self.renders = 0
        self.cost_s = 0.0
        self._recent: list[float] = []

    def due(self, now: float | None = None) -> bool:
        """True when at least the current interval has passed since the last render."""
        now = self.clock() if now is None else now
        return now - self.last >= self.interval

    def done(self, started: float, now: float | None = None) -> None:
        """Record a render that began at ``started`` (a reading of ``clock``) and ended now."""
        now = self.clock() if now is None else now
        cost = max(0.0, now - started)
        self.renders += 1
        self.cost_s += cost
        self.last = now
        self._recent = [*self._recent[-2:], cost]
        self.interval = min(self.max_interval, max(self.base, min(self._recent) / self.budget))

    def mark(self, now: float | None = None) -> None:
        """Note a render made outside the schedule (an epoch end) without adapting the period."""
        self.last = self.clock() if now is None else now

    def force(self) -> None:
        """Make the next ``due()`` answer True (an event or an epoch end must show at once)."""
        self.last = -float("inf")
