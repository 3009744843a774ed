"""The live-view interface and the throttled loop every renderer shares.

``View`` is the interface (and the no-op view for ``live=False``). ``LiveView`` keeps the
RunRecord and the memory sampler, decides *when* to draw (two time throttles: bars and plots)
and leaves *how* to the renderer's ``_draw_*`` methods. A drawing error never stops training:
the view warns once (``LiveViewWarning``) and goes quiet.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from hybridnb.events import Event
from hybridnb.live.record import RunRecord
from hybridnb.live.summary import paragraph

MAX_INTERVAL = 30.0  # seconds: a slow renderer still shows progress twice a minute


class Throttle:
    """Answer "is it time to render?" at most every ``interval`` seconds, at one clock read per
    step. When renders cost ``c`` seconds the period becomes ``max(interval, c / budget)`` (the
    fastprogress idea): a 20 ms plot update with ``budget=0.005`` renders every 4 s instead of
    every second. ``c`` is the smallest of the last three costs, so one slow render (a garbage
    collection, a first render paying for imports) does not freeze the display, while one that
    stays slow stretches it.
    """

    def __init__(self, interval: float, budget: float = 0.005,
                 clock: Callable[[], float] = time.perf_counter):
        self.base = self.interval = float(interval)
        self.budget = float(budget)
        self.clock = clock
        self.last = -float("inf")
        self._recent: list[float] = []

    def due(self, now: float) -> bool:
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


class LiveViewWarning(UserWarning):
    """The live view failed to draw; training went on without it."""


class View:
    """What the Trainer calls. This base class draws nothing (``live=False``)."""

    name = "none"
    note = ""
    stop_requested = False  # set (on the instance) when the person asks to stop

    def start(self, run: dict) -> None:
        """A run begins; ``run`` holds epochs, steps_per_epoch, batch_size, device, precision,
        model, n_params, monitor, quick."""

    def update(self, state: dict) -> None:
        """After every optimizer step; ``epoch_end=True`` once at the end of each epoch."""

    def event(self, ev: Event) -> None:
        """A recovery or run event, shown at once."""

    def end(self, summary: dict) -> None:
        """The run is over: replace live output with a static summary."""


def _default_sampler(device: str, pid: int | None = None):
    from hybridnb.measure.memory import MemorySampler

    return MemorySampler(device, pid=pid)


class LiveView(View):
    """Record every step in O(1); draw bars every ~0.2 s and plots every ~1 s (adaptive)."""

    def __init__(self, note: str = "",
                 sampler_factory: Callable[[str, int | None], Any] | None = _default_sampler,
                 clock: Callable[[], float] = time.perf_counter):
        self.note = note
        self.clock = clock
        self._sampler_factory = sampler_factory
        self.record: RunRecord | None = None
        self.bars = Throttle(0.2, budget=0.0015, clock=clock)
        self.plots = Throttle(1.0, budget=0.002, clock=clock)
        self.failed: str | None = None
        self._thread = None

    def start(self, run: dict) -> None:
        sampler, notes = None, []
        if self._sampler_factory is not None:
            try:
                # the training process: this one, or an isolated worker (its pid in the run)
                sampler = self._sampler_factory(str(run.get("device", "cpu")), run.get("pid"))
                sampler.start()
                notes = list(sampler.notes)
            except Exception as exc:  # broad: memory plots are optional; said in the header
                sampler, notes = None, [f"memory sampling off ({type(exc).__name__}: {exc})"]
        self.record = RunRecord(run, sampler)
        self.note = "; ".join([n for n in [self.note, *notes] if n])
        self._thread = threading.get_ident()
        self._safe(self._open, run)
        self.bars.force()  # the first step shows progress at once; plots follow after ~1 s
        self.plots.mark()

    def update(self, state: dict) -> None:
        self.record.add(state)
        if self.failed is not None or threading.get_ident() != self._thread:
            return
        now = self.clock()
        if state.get("epoch_end"):
            self._safe(self._draw_epoch_end)
            self.bars.mark()
            self.plots.mark()
            return
        if self.bars.due(now):
            self._safe(self._draw_progress)
            self.bars.done(now)
        if self.plots.due(now):
            started = self.clock()
            self._safe(self._draw_plots)
            self.plots.done(started)
        self._poll(now)

    def event(self, ev: Event) -> None:
        self.record.events.append(ev)
        if ev.kind == "device_lost" and self.record.sampler is not None:
            self.record.sampler.drop_device(ev.message)  # host memory only from now on
        self.plots.force()
        if self.failed is None:
            self._safe(self._draw_event, ev)

    def end(self, summary: dict) -> None:
        rec = self.record
        try:
            if rec.sampler is not None:
                rec.sampler.close()
            if self.failed is None:
                self._safe(self._close, dict(summary))
            if self.failed is not None:  # also when the end snapshot itself failed
                print(paragraph(summary, rec))
        finally:
            self._release()

    # the renderer's hooks: how to draw (the methods above decide when)
    def _open(self, run: dict) -> None: ...

    def _draw_progress(self) -> None: ...

    def _draw_plots(self) -> None: ...

    def _draw_epoch_end(self) -> None:
        self._draw_progress()
        self._draw_plots()

    def _draw_event(self, ev: Event) -> None:
        self._draw_progress()

    def _close(self, summary: Mapping[str, Any]) -> None: ...

    def _poll(self, now: float) -> None:
        """Process frontend events (the widget view's Stop button)."""

    def _release(self) -> None:
        """Free what the renderer holds (widgets, threads); always called by ``end``."""

    def _safe(self, fn: Callable, *args) -> None:
        try:
            fn(*args)
        except Exception as exc:  # broad: drawing must never kill a training run
            if self.failed is None:
                self.failed = f"{type(exc).__name__}: {exc}"
                warnings.warn(f"hybridnb: the {self.name} live view failed ({self.failed}); "
                              "training continues without live updates and a text summary at "
                              "the end.", LiveViewWarning, stacklevel=2)
