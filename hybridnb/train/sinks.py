"""Where a fit's rows go besides the live view: loggers and callbacks, in the user's process.

``Sinks.hear``: step rows to the loggers that want them (``per_step``) and ``on_step_end``, each
epoch's history row to the loggers and ``on_epoch_end`` (an isolated worker's too, heard on the
kernel's bus). Each epoch is logged once and in order, from the kernel's own history: a row the
worker sent only in its state is caught up by the next epoch or the fit's end.
"""

from __future__ import annotations

from pathlib import Path

from hybridnb.train import callbacks as cbs
from hybridnb.train.bus import EpochEnded, StepEnded
from hybridnb.train.loggers import hparams
from hybridnb.train.run_lock import RunLock
from hybridnb.train.storage import StorageGuard


class Sinks:
    """The loggers and callbacks of one Trainer (the user's process; loggers on rank 0)."""

    def __init__(self, make_loggers, callbacks: tuple) -> None:
        """``make_loggers(storage)``: this fit's loggers, reporting failed writes to ``storage``."""
        self.storage = StorageGuard()  # on the Trainer's bus once a fit begins
        self.loggers, self.callbacks = make_loggers(self.storage), callbacks
        self.step_loggers = [lg for lg in self.loggers if getattr(lg, "per_step", False)]
        self.next_epoch = 0
        self.open = False
        self.trainer = None
        self.locks: list[RunLock] = []  # the log folders this fit holds (besides its own)

    def begin(self, trainer) -> None:
        """A fit starts at ``trainer.state`` (fresh or resumed): the loggers' folders claimed
        (another live run writing there is refused), the loggers opened with the run's
        hyperparameters, ``on_fit_start``."""
        self.trainer = trainer
        self.storage.bus = trainer.bus
        state = trainer.state
        self.next_epoch = len(state.history)
        params = hparams(trainer.settings, trainer.model) if self.loggers else {}
        self.open = True  # close() from here on: loggers opened before a failure are closed
        held = trainer.checkpoints.folder  # claimed by the fit already
        held = Path(held).resolve() if held is not None else None
        folders = {lg.folder.resolve(): "log_dir" if getattr(lg, "needs_folder", False)
                   else f"{type(lg).__name__}'s folder" for lg in self.loggers
                   if isinstance(getattr(lg, "folder", None), Path)}
        for folder, what in sorted(folders.items()):
            if folder != held:
                lock = RunLock(folder, what=what)
                self.locks.append(lock)  # released by close() even if what follows raises
                lock.acquire(trainer.bus)
        for logger in self.loggers:
            if callable(getattr(logger, "open", None)):
                logger.open(self.next_epoch, state.global_step)
            logger.log_hparams(dict(params))
        cbs.call(self.callbacks, "on_fit_start", trainer)

    def epoch_rows(self, rows: list[dict]) -> None:
        """Log (and call ``on_epoch_end`` with) the rows of epochs not logged yet."""
        for row in rows if self.open else ():
            if row["epoch"] >= self.next_epoch:
                self.next_epoch = row["epoch"] + 1
                for logger in self.loggers:
                    logger.log_metrics(dict(row), row["step"])
                cbs.call(self.callbacks, "on_epoch_end", self.trainer, dict(row))

    def end(self, trainer) -> None:
        """The fit returned: rows not logged yet, loggers closed, ``on_fit_end``."""
        try:
            self.epoch_rows(trainer.state.history)
        finally:
            self.close()
        cbs.call(self.callbacks, "on_fit_end", trainer)

    def hear(self, event) -> None:
        if isinstance(event, StepEnded) and self.open:
            for logger in self.step_loggers:  # the Loop's loss is NaN where none was measured
                logger.log_metrics({"train/loss": float(event.loss), "train/lr": float(event.lr)},
                                   event.step)
            cbs.call(self.callbacks, "on_step_end", self.trainer, dict(event.row))
        elif isinstance(event, EpochEnded):
            self.epoch_rows(event.history)

    def close(self) -> None:
        """Every logger closed (one that raises does not keep the others open), folders released."""
        locks, self.locks = self.locks, []
        first = None
        if self.open:
            self.open = False
            for logger in self.loggers:
                try:
                    logger.close()
                except Exception as exc:  # noqa: BLE001 - raised after the others close
                    first = first or exc
        for lock in locks:
            lock.release()
        if first is not None:
            raise first
