"""Loggers: the run's rows written as they happen, for tools outside the notebook.

``Trainer(logger=...)`` picks them: ``"csv"`` appends each epoch's history row to
``<log_dir>/history.csv`` the moment the epoch ends (flushed and fsynced per row, so a run killed
with SIGKILL leaves every finished epoch's row, parseable); ``"tensorboard"`` writes
``torch.utils.tensorboard`` event files into ``<log_dir>`` (per optimizer step ``train/loss`` and
``train/lr``; per epoch ``epoch/<column>`` for each numeric column of the history row, at the
epoch's last global step). A list gives both. They run in the user's process only (for an
isolated fit the kernel writes what the worker's view sends), rank 0 only.

A fresh fit moves an earlier run's logs into ``earlier-<time>/`` (as it does checkpoints); a
resumed fit keeps the rows before the epoch it resumes at and appends after them (TensorBoard
purges the steps after the resume point). A write that fails (full disk, read-only folder) is
said once and retried with the next row (``storage.StorageGuard``); rows are never lost from
``trainer.history``.
"""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import io
import math
import os
from pathlib import Path

from hybridnb.train import checkpoint
from hybridnb.train.state import HISTORY_COLUMNS
from hybridnb.train.storage import StorageGuard, is_write_failure

HISTORY = "history.csv"
TB_EVENTS = "events.out.tfevents.*"
LOGGERS = ("csv", "tensorboard")
TB_INSTALL = "pip install 'hybridnb[tensorboard]' (or pip install tensorboard)"


def logger_names(logger) -> tuple[str, ...]:
    """``"csv"`` | ``"tensorboard"`` | a list of them | None/False -> the names, checked."""
    if logger is None or logger is False:
        return ()
    names = (logger,) if isinstance(logger, str) else logger
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"logger={logger!r}: use 'csv', 'tensorboard', a list of them, or None")
    bad = [n for n in names if n not in LOGGERS]
    if bad:
        raise ValueError(f"logger={logger!r}: unknown logger {bad[0]!r}; use one of {LOGGERS}, "
                         "a list of them, or None")
    return tuple(dict.fromkeys(names))


def tensorboard_available() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


class CsvLogger:
    """``history.csv``: one row per epoch, appended and fsynced as each epoch ends."""

    name = "csv"
    patterns = (HISTORY,)

    def __init__(self, folder: Path, storage: StorageGuard) -> None:
        self.path, self.storage = Path(folder) / HISTORY, storage
        self.pending: list[dict] = []
        self.header = False

    def open(self, start_epoch: int, global_step: int) -> None:
        self.pending = []
        if start_epoch == 0:
            checkpoint.set_aside(self.path.parent, self.patterns, checkpoints=False)
        elif self.path.is_file():
            self._keep_rows_before(start_epoch)
        self.header = self.path.is_file() and self.path.stat().st_size > 0

    def _keep_rows_before(self, epoch: int) -> None:
        """A resumed fit: rows of epochs at or after ``epoch`` (written by the run it resumes,
        after its checkpoint) are dropped, so every epoch appears once."""
        with open(self.path, newline="") as f:
            rows = list(csv.reader(f))
        if not rows:
            return
        kept = [rows[0]] + [r for r in rows[1:] if r and _int(r[0]) is not None
                            and _int(r[0]) < epoch]
        if len(kept) == len(rows):
            return
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "w", newline="") as f:
                csv.writer(f).writerows(kept)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            self.storage.failed(self.path, exc, f"the file still holds the resumed run's rows "
                                f"from epoch {epoch} on (each new row follows them)")
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()

    def step(self, global_step: int, loss: float, lr: float) -> None:
        pass

    def epoch(self, row: dict) -> None:
        self.pending.append(row)
        self._write()

    def _write(self) -> None:
        if not self.pending:
            return
        buf = io.StringIO()
        out = csv.writer(buf)
        if not self.header:
            out.writerow(HISTORY_COLUMNS)
        for row in self.pending:
            out.writerow([_cell(row.get(c)) for c in HISTORY_COLUMNS])
        size = self.path.stat().st_size if self.path.exists() else 0
        try:
            with open(self.path, "a", newline="") as f:
                f.write(buf.getvalue())
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            try:  # a row written half-way is cut off, so the retry appends whole rows
                if self.path.exists() and self.path.stat().st_size > size:
                    os.truncate(self.path, size)
            except OSError:
                pass
            self.storage.failed(self.path, exc, f"the rows up to epoch "
                                f"{self.pending[0]['epoch'] - 1} are on disk, the others in "
                                "trainer.history and written with the next row")
            return
        self.header, self.pending = True, []
        self.storage.worked(self.path)

    def close(self) -> None:
        self._write()


class TensorBoardLogger:
    """TensorBoard event files in the log folder (``tensorboard --logdir <its parent>``)."""

    name = "tensorboard"
    patterns = (TB_EVENTS,)
    per_step = True  # fed every step's row

    def __init__(self, folder: Path, storage: StorageGuard) -> None:
        self.folder, self.storage, self.writer = Path(folder), storage, None
        self._purge: int | None = None

    def open(self, start_epoch: int, global_step: int) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ImportError(f"logger='tensorboard' needs the tensorboard package: "
                              f"{TB_INSTALL}") from exc
        if start_epoch == 0:
            checkpoint.set_aside(self.folder, self.patterns, checkpoints=False)
        self._purge = global_step + 1 if start_epoch else None  # a resumed run's later steps
        self._make = lambda: SummaryWriter(str(self.folder), purge_step=self._purge)
        self._guarded(lambda: None)

    def _guarded(self, write) -> None:
        """Run ``write`` on the writer (made first when there is none); a write failure is said
        once and drops the writer, whose thread keeps the error: the next write makes a new
        one (TensorBoard reads every event file in the folder)."""
        try:
            if self.writer is None:
                self.writer, self._purge = self._make(), None  # purged once, not again
            write()
        except Exception as exc:
            if not is_write_failure(exc):
                raise
            if self.writer is not None:
                with contextlib.suppress(Exception):
                    self.writer.close()
            self.writer = None
            self.storage.failed(self.folder / "events.out.tfevents", exc,
                                "the scalars are kept in trainer.history and trainer.steps")
            return
        self.storage.worked(self.folder / "events.out.tfevents")

    def step(self, global_step: int, loss: float, lr: float) -> None:
        def write():
            if math.isfinite(loss):
                self.writer.add_scalar("train/loss", loss, global_step)
            self.writer.add_scalar("train/lr", lr, global_step)
        self._guarded(write)

    def epoch(self, row: dict) -> None:
        def write():
            for column in HISTORY_COLUMNS:
                value = row.get(column)
                if column in ("step", "events") or not isinstance(value, (int, float)):
                    continue
                if math.isfinite(value):
                    self.writer.add_scalar(f"epoch/{column}", value, row["step"])
            self.writer.flush()
        self._guarded(write)

    def close(self) -> None:
        if self.writer is not None:
            self._guarded(lambda: self.writer.close())
            self.writer = None


def make_loggers(names: tuple[str, ...], folder: Path | None,
                 storage: StorageGuard) -> list:
    """The loggers for ``names`` writing into ``folder`` (None: none)."""
    if folder is None:
        return []
    kinds = {"csv": CsvLogger, "tensorboard": TensorBoardLogger}
    return [kinds[n](folder, storage) for n in names]


def _cell(value) -> object:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and math.isnan(value):
        return ""
    return "" if value is None else value


def _int(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None


def patterns(names: tuple[str, ...]) -> tuple[str, ...]:
    """The files the loggers ``names`` write (set aside with a fresh run's checkpoints)."""
    kinds = {"csv": CsvLogger, "tensorboard": TensorBoardLogger}
    return tuple(p for n in names for p in kinds[n].patterns)
