"""Where a fit's rows go besides the live view: loggers and callbacks, in the user's process.

``SinkView`` wraps the renderer ``Progress.make_view`` made and is what the Trainer draws on: it
forwards every call (start, update, event, end, stop_requested) and feeds ``Sinks`` the step rows
it draws and the epoch rows the Trainer hands it (``epoch_rows``). In an isolated worker it wraps
the worker's ``ChannelView`` and sends the epoch rows to the kernel instead, whose ``SinkView``
receives them like every other view message: loggers and callbacks run once, in the kernel, and
keep running when the worker is lost and the kernel continues on the CPU.

Rows are logged by epoch number: each epoch once, in order. The worker sends an epoch's row only
after the state holding it; a worker lost before sending it leaves the row in the state the
kernel continues from, and the next ``epoch_rows`` (or the fit's end) catches it up.
"""

from __future__ import annotations

from hybridnb.events import row_kind
from hybridnb.train import callbacks as cbs
from hybridnb.train.bus import EpochEnded, StepEnded
from hybridnb.train.storage import StorageGuard


class Sinks:
    """The loggers and callbacks of one Trainer (the user's process; loggers on rank 0)."""

    def __init__(self, make_loggers, callbacks: tuple) -> None:
        """``make_loggers(storage)``: this fit's loggers, reporting failed writes to
        ``storage``."""
        self.storage = StorageGuard(self._say)
        self.loggers, self.callbacks = make_loggers(self.storage), callbacks
        self.wants_steps = any(getattr(lg, "per_step", False) for lg in self.loggers)
        self.next_epoch = 0
        self.open = False
        self.trainer = None
        self.said: list = []

    def _say(self, kind: str, message: str) -> None:
        """A logger's storage event, said on the Trainer now (and kept: an isolated fit's
        hand-over replaces the kernel's events with the worker's, ``end`` adds it back)."""
        if self.trainer is not None:
            self.said.append(self.trainer.event(kind, message))

    def begin(self, trainer) -> None:
        """A fit starts at ``trainer.state`` (fresh or resumed): open the loggers, call
        ``on_fit_start``."""
        self.trainer, self.said = trainer, []
        state = trainer.state
        self.next_epoch = len(state.history)
        for logger in self.loggers:
            logger.open(self.next_epoch, state.global_step)
        self.open = True
        cbs.call(self.callbacks, "on_fit_start", trainer)

    def step(self, row: dict) -> None:
        if self.open:
            loss = row.get("loss")
            for logger in self.loggers:
                logger.step(row["global_step"], float("nan") if loss is None else float(loss),
                            float(row["lr"]))

    def epoch_rows(self, rows: list[dict], trainer) -> None:
        """Log (and call ``on_epoch_end`` with) the rows of epochs not logged yet."""
        for row in rows:
            if not self.open or row["epoch"] < self.next_epoch:
                continue
            self.next_epoch = row["epoch"] + 1
            for logger in self.loggers:
                logger.epoch(row)
            cbs.call(self.callbacks, "on_epoch_end", trainer, dict(row))

    def end(self, trainer) -> None:
        """The fit returned: rows not logged yet, loggers closed, ``on_fit_end``."""
        try:
            self.epoch_rows(trainer.state.history, trainer)
        finally:
            self.close()
        trainer.state.events.extend(e for e in self.said if e not in trainer.state.events)
        cbs.call(self.callbacks, "on_fit_end", trainer)

    def hear(self, event) -> None:
        """A listener on the fit's bus (the user's process): step rows to the loggers that
        want them, each epoch's row to loggers and ``on_epoch_end``."""
        if isinstance(event, StepEnded) and self.wants_steps:
            self.step(event.row)
        elif isinstance(event, EpochEnded) and self.trainer is not None:
            self.epoch_rows(event.history, self.trainer)

    def close(self) -> None:
        if self.open:
            self.open = False
            for logger in self.loggers:
                logger.close()


def is_step_row(row: dict) -> bool:
    """A row drawn after an optimizer step (not a validation's or an epoch's end)."""
    return row_kind(row) == "step" and "loss" in row


class SinkView:
    """The view the Trainer draws on: the renderer, plus the sinks (or, in an isolated worker,
    the channel that carries the epoch rows to the kernel's sinks)."""

    def __init__(self, view, sinks: Sinks | None = None, trainer=None, channel=None) -> None:
        self.view, self.sinks, self.trainer, self.channel = view, sinks, trainer, channel

    def update(self, row: dict) -> None:
        self.view.update(row)
        if self.sinks is not None and self.sinks.wants_steps and is_step_row(row):
            self.sinks.step(row)

    def epoch_rows(self, rows: list[dict]) -> None:
        """The epoch rows so far (the Trainer's ``state.history``; from a worker, its last)."""
        if self.channel is not None:
            self.channel.send("view", ("epoch_rows", [dict(r) for r in rows[-1:]]))
        elif self.sinks is not None:
            self.sinks.epoch_rows(rows, self.trainer)

    def __getattr__(self, name: str):
        if name == "view":
            raise AttributeError(name)
        return getattr(self.view, name)  # start, event, end, stop_requested, ...: the renderer's
