"""One bus for a fit's typed events: the Loop emits them, listeners subscribe.

The Loop never calls the view, the loggers or the callbacks: whoever subscribed hears each event
in order (the run's record of events, ``Progress.hear`` for the view, ``Heartbeat.hear`` in a
worker, ``Sinks.hear`` for loggers and callbacks). A worker's events are emitted again on the
kernel's bus (``run_worker.Relay``), so the kernel's listeners hear what they hear in process.
Notes and run headers are records of the ``"hybridnb"`` logger too, in the user's process
(levels and fields: docs/runs-and-logs.md, "Messages through logging").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from hybridnb.events import Event

log = logging.getLogger("hybridnb")
log.addHandler(logging.NullHandler())
# notes about something that went wrong and was worked around (WARNING); the others are INFO
WARNING_KINDS = frozenset({
    "storage", "checkpoint_fallback", "worker_lost", "device_lost", "restore", "oom_split",
    "cpu_batch", "nonfinite_loss", "nonfinite_batch", "nonfinite_targets", "loss_spike",
    "compile_fallback", "precision_fallback", "run_lock", "interrupt", "failed",
    "worker_notice"})

@dataclass(frozen=True)
class Started:
    """A fit's view starts: the run's description (epochs, steps, device, model, ...)."""

    run: dict


@dataclass(frozen=True)
class StepEnded:
    """An optimizer step ended: ``step`` is the global step after it; ``row`` the view's."""

    step: int
    epoch: int
    loss: float
    lr: float
    row: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Validated:
    """A validation between steps (``val_every``) ended: its metrics and the view's row."""

    step: int
    metrics: dict
    row: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class EpochEnded:
    """An epoch ended: ``history`` holds every epoch's row so far, ``row`` the view's."""

    epoch: int
    step: int
    history: list = field(default_factory=list, compare=False)
    row: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class StateKept:
    """The last good state was kept (a snapshot, an epoch's end or a checkpoint)."""

    step: int
    state: dict = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class Ended:
    """The fit ended (whole, stopped or failed): the summary the view and report show."""

    summary: dict = field(compare=False, repr=False)


class Bus:
    """Listeners, called in order for each event emitted; notes queued until a fit opens."""

    def __init__(self, where: Callable[[], tuple[int, int]]) -> None:
        """``where()``: the (global step, epoch) a note is stamped with."""
        self.where = where
        self.listeners: list[Callable[[object], None]] = []
        self.pending: list[tuple[str, str]] = []  # notes said when the next fit opens
        self.open = False

    def subscribe(self, listener: Callable[[object], None]) -> None:
        self.listeners.append(listener)

    def emit(self, event):
        """To every listener; a note or a run's header also to the ``"hybridnb"`` logger."""
        if isinstance(event, Event):
            level = logging.WARNING if event.kind in WARNING_KINDS else logging.INFO
            log.log(level, "%s", event, extra={"kind": event.kind, "step": event.step,
                                                "epoch": event.epoch})
        elif isinstance(event, Started) and log.isEnabledFor(logging.INFO):
            from hybridnb.live.summary import header

            log.info("%s", header(event.run), extra={"kind": "start", "step": 0, "epoch": 0})
        for listener in list(self.listeners):
            listener(event)
        return event

    def say(self, kind: str, message: str) -> Event:
        """A note now, stamped with where the run is."""
        step, epoch = self.where()
        return self.emit(Event(kind, message, step=step, epoch=epoch))

    def note(self, kind: str, message: str) -> Event | None:
        """Said once: now during a fit (the event returned), else when the next fit opens."""
        if self.open:
            return self.say(kind, message)
        self.pending.append((kind, message))
        return None

    def flush(self) -> None:
        """Open: the queued notes are said now, in order; later notes are said as they come."""
        pending, self.pending = self.pending, []
        for kind, message in pending:
            self.say(kind, message)
        self.open = True

