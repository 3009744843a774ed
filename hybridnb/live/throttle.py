"""Time-based throttling, adaptive to the cost of a render (the fastprogress idea).

A renderer asks ``due()`` on every training step (one clock read) and renders only when it
answers True, then reports how long that took: the interval grows so that rendering stays under
``budget`` (a fraction of wall time), whatever the step rate.
"""

from __future__ import annotations

import time
from collections.abc import Callable

MAX_INTERVAL = 30.0  # seconds: a slow renderer still shows progress twice a minute


class Throttle:
    """Answer "is it time to render?" at most every ``interval`` seconds.

    When renders cost ``c`` seconds the period becomes ``max(interval, c / budget)``: a 20 ms
    plot update with ``budget=0.005`` renders every 4 s instead of every second. ``c`` is the
    smallest of the last three costs, so one slow render (a garbage collection, a first render
    paying for imports) does not freeze the display, while one that stays slow stretches it.
    """

    def __init__(self, interval: float, budget: float = 0.005,
                 clock: Callable[[], float] = time.perf_counter):
        self.base = self.interval = float(interval)
        self.budget = float(budget)
        self.clock = clock
        self.last = -float("inf")
        self._recent: list[float] = []

    def due(self, now: float | None = None) -> bool:
        now = self.clock() if now is None else now
        return now - self.last >= self.interval

    def done(self, started: float) -> None:
        """Record a render that began at ``started`` (a reading of ``clock``) and ended now."""
        now = self.clock()
        self.last = now
        self._recent = [*self._recent[-2:], max(0.0, now - started)]
        self.interval = min(MAX_INTERVAL, max(self.base, min(self._recent) / self.budget))

    def mark(self) -> None:
        """Note a render made outside the schedule (an epoch end) without adapting the period."""
        self.last = self.clock()

    def force(self) -> None:
        """Make the next ``due()`` answer True (an event or an epoch end must show at once)."""
        self.last = -float("inf")
