"""Loggers: the run's rows written as they happen, for tools outside the notebook (what each
writes, where, and what a failed write does: docs/runs-and-logs.md)."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import importlib.util
import io
import math
import os
import time
from pathlib import Path
from typing import Any, Protocol

from hybridnb.files import atomic_write, is_write_failure
from hybridnb.train import checkpoint
from hybridnb.train.state import HISTORY_COLUMNS
from hybridnb.train.storage import StorageGuard

HISTORY = "history.csv"
TB_EVENTS = "events.out.tfevents.*"
METHODS = ("log_hparams", "log_metrics", "close")


class Logger(Protocol):
    """What ``Trainer(logger=...)`` calls (when: docs/runs-and-logs.md, "Your own logger");
    ``log_metrics`` gets each epoch's row (NaN where nothing was measured) at its last global
    step. Optional: ``per_step = True`` (also every optimizer step's ``{"train/loss",
    "train/lr"}``) and ``open(start_epoch, global_step)`` (a fit starts)."""

    def log_hparams(self, params: dict[str, Any]) -> None: ...

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None: ...

    def close(self) -> None: ...


def logger_names(logger) -> tuple:
    """``logger=`` as a tuple of its names and objects, each checked (None/False: none)."""
    if logger is None or logger is False:
        return ()
    items = logger if isinstance(logger, (list, tuple)) else (logger,)
    kept: list = []
    for item in items:
        if isinstance(item, str):
            if item not in KINDS:
                raise ValueError(f"logger={logger!r}: unknown logger {item!r}; use one of "
                                 f"{tuple(KINDS)}, a logger object (hybridnb.train.loggers), "
                                 "a list of them, or None")
        elif isinstance(item, type):
            raise ValueError(f"logger={logger!r} passes the class {item.__name__}: pass an "
                             f"instance, {item.__name__}(...)")
        else:
            missing = [m for m in METHODS if not callable(getattr(item, m, None))]
            if missing:
                raise ValueError(f"logger={logger!r}: a {type(item).__name__} is not a logger, "
                                 f"it lacks {', '.join(missing)} (hybridnb.train.loggers.Logger)")
        if not any(item is k or (isinstance(item, str) and item == k) for k in kept):
            kept.append(item)
    return tuple(kept)


def hparams(settings, model) -> dict[str, Any]:
    """The run's settings as plain values for ``log_hparams`` (a callable or an object by its
    name), with the model's class and parameter count."""
    skip = {"logger", "log_dir", "loader_kwargs", "live", "verbose", "resolved_",
            "from_detect", "recommended_precision", "torch_threads"}
    params = {f.name: _plain(getattr(settings, f.name)) for f in dataclasses.fields(settings)
              if f.name not in skip}
    return {**params, "model": type(model).__name__,
            "n_params": sum(p.numel() for p in model.parameters())}


def _plain(value) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (tuple, list)):
        return ",".join(str(_plain(v)) for v in value)
    return getattr(value, "__name__", None) or type(value).__name__


def numbers(metrics: dict) -> dict[str, float]:
    """The finite numeric values of ``metrics`` (what MLflow and W&B accept)."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))
            and not isinstance(v, bool) and math.isfinite(v)}


class _FileLogger:
    """A logger writing into a folder: its own, or the Trainer's ``log_dir`` (``bind``). A fresh
    fit moves an earlier run's files into ``earlier-<time>/``, a resumed fit keeps the rows before
    its epoch (TensorBoard purges the later steps)."""

    patterns: tuple[str, ...] = ()
    per_step = False

    def __init__(self, folder: str | os.PathLike | None = None) -> None:
        self.folder = Path(folder) if folder is not None else None
        self.needs_folder = folder is None  # writes into the Trainer's log_dir
        self.storage = StorageGuard()

    def bind(self, folder: Path | None, storage: StorageGuard) -> None:
        """The Trainer's ``log_dir`` (used when no folder was given) and its storage events."""
        if self.needs_folder:  # settings refuse a logger with no folder when there is no log_dir
            self.folder = folder
        self.storage = storage

    def log_hparams(self, params: dict[str, Any]) -> None:
        """Files of rows only: the settings are in the checkpoint and the run's header."""


class CsvLogger(_FileLogger):
    """``history.csv``: one row per epoch, appended and fsynced as each epoch ends (a run
    killed with SIGKILL leaves every finished epoch's row, parseable)."""

    patterns = (HISTORY,)

    def __init__(self, folder: str | os.PathLike | None = None) -> None:
        super().__init__(folder)
        self.rows: list[list] = []  # the file's rows: those kept on resume, then this fit's
        self.written = 0  # how many of them are on disk

    def open(self, start_epoch: int, global_step: int) -> None:
        self.rows, self.written = [], 0
        self.path = self.folder / HISTORY
        self.folder.mkdir(parents=True, exist_ok=True)
        if start_epoch == 0:
            checkpoint.set_aside(self.folder, self.patterns, checkpoints=False)
        elif self.path.is_file():
            self._keep_rows_before(start_epoch)

    def _keep_rows_before(self, epoch: int) -> None:
        """A resumed fit: rows of epochs at or after ``epoch`` (written by the run it resumes,
        after its checkpoint) are dropped, so every epoch appears once."""
        with open(self.path, newline="") as f:
            rows = list(csv.reader(f))
        kept = rows[:1] + [r for r in rows[1:] if r and _epoch(r[0]) < epoch]  # the header too
        self.rows = kept[1:]
        self.written = len(self.rows)
        if len(kept) == len(rows):
            return
        try:
            atomic_write(self.path, lambda f: csv.writer(f).writerows(kept), text=True)
        except OSError as exc:
            self.storage.failed(self.path, exc, f"the file still holds the resumed run's rows "
                                f"from epoch {epoch} on (each new row follows them)")

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        if "epoch" in metrics:  # an epoch's row (per-step rows are not this file's)
            self.rows.append([_cell(metrics.get(c)) for c in HISTORY_COLUMNS])
            self._write()

    def _write(self) -> None:
        """The rows not on disk yet appended and fsynced (after the header in a new file); a
        file that disappeared mid-run (its folder removed) is written again whole."""
        if self.written == len(self.rows):
            return
        size = self.path.stat().st_size if self.path.exists() else 0
        buf = io.StringIO()
        csv.writer(buf).writerows([HISTORY_COLUMNS, *self.rows] if size == 0
                                  else self.rows[self.written:])
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", newline="") as f:
                f.write(buf.getvalue())
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            with contextlib.suppress(OSError):  # cut a half-written row: retries append whole
                os.truncate(self.path, size)
            self.storage.failed(self.path, exc, f"the rows from epoch {self.rows[self.written][0]}"
                                " on are in trainer.history and written with the next row")
            return
        if size == 0 and self.written:
            self.storage.say(f"{self.path} disappeared mid-run (was its folder removed?): "
                             f"written again whole, the header and the {len(self.rows)} rows "
                             f"of epochs {self.rows[0][0]} to {self.rows[-1][0]}")
        self.written = len(self.rows)
        self.storage.worked(self.path)

    def close(self) -> None:
        self._write()


class TensorBoardLogger(_FileLogger):
    """TensorBoard event files in the log folder (``tensorboard --logdir <its parent>``):
    ``train/loss`` and ``train/lr`` per step, ``epoch/<column>`` at each epoch's last step."""

    patterns = (TB_EVENTS,)
    per_step = True  # fed every step's row

    def __init__(self, folder: str | os.PathLike | None = None) -> None:
        super().__init__(folder)
        self.writer = None
        self._purge: int | None = None
        self._file: Path | None = None  # the writer's event file (watched: a folder removed)

    def open(self, start_epoch: int, global_step: int) -> None:
        try:  # Settings checked the package is there; torch may still refuse its version
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ImportError("logger='tensorboard' could not load torch.utils.tensorboard: pip "
                              "install -U 'hybridnb[tensorboard]' (or pip install -U tensorboard)"
                              ) from exc

        if start_epoch == 0:
            checkpoint.set_aside(self.folder, self.patterns, checkpoints=False)
        self._purge = global_step + 1 if start_epoch else None  # a resumed run's later steps
        self._make = lambda: SummaryWriter(str(self.folder), purge_step=self._purge)
        self._guarded(lambda: None)

    def _guarded(self, write, step: int | None = None) -> None:
        """Run ``write`` on the writer; a failed write is said once and drops the writer, whose
        thread keeps the error: the next write makes a new one (TensorBoard reads every event
        file in the folder)."""
        try:
            if self.writer is not None and self._file is not None and not self._file.exists():
                self._drop()
                self.storage.say(f"the TensorBoard event file in {self.folder} disappeared "
                                 f"mid-run (was its folder removed?): its scalars before step "
                                 f"{step} are lost to TensorBoard (they are in trainer.history "
                                 f"and trainer.steps); a new event file holds those from step "
                                 f"{step} on")
            if self.writer is None:
                self.writer, self._purge = self._make(), None  # purged once, not again
                files = list(self.folder.glob(TB_EVENTS))
                self._file = max(files, key=lambda p: p.stat().st_mtime_ns) if files else None
            write()
        except Exception as exc:  # narrowed by is_write_failure
            if not is_write_failure(exc):
                raise
            self._drop()
            self.storage.failed(self.folder / "events.out.tfevents", exc,
                                "the scalars are kept in trainer.history and trainer.steps")
            return
        self.storage.worked(self.folder / "events.out.tfevents")

    def _drop(self) -> None:
        with contextlib.suppress(Exception):  # dropping it anyway (None: nothing to close)
            self.writer.close()
        self.writer = None

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        prefix = "epoch/" if "epoch" in metrics else ""  # else a step's train/loss, train/lr

        def write():
            for key, value in numbers(metrics).items():
                if key != "step":
                    self.writer.add_scalar(prefix + key, value, step)
            if prefix:
                self.writer.flush()
        self._guarded(write, step)

    def close(self) -> None:
        if self.writer is not None:
            self._guarded(lambda: self.writer.close())
            self.writer = None


KINDS = {"csv": CsvLogger, "tensorboard": TensorBoardLogger}  # the names logger= takes


def _require(package: str, what: str):
    try:
        return importlib.import_module(package)
    except ImportError as exc:
        raise ImportError(f"{what} needs the {package} package: pip install "
                          f"'hybridnb[loggers]' (or pip install {package})") from exc


class MLflowLogger:
    """One MLflow run per fit (``pip install 'hybridnb[loggers]'``): params, each epoch's
    numbers as metrics (``per_step``: also every optimizer step's loss and lr); ``run_id`` names
    it after the fit. Which ``tracking_uri`` needs what: docs/runs-and-logs.md."""

    def __init__(self, tracking_uri: str | None = None, experiment: str = "hybridnb",
                 run_name: str | None = None, tags: dict | None = None,
                 per_step: bool = True) -> None:
        _require("mlflow", "MLflowLogger")
        from mlflow.tracking import MlflowClient

        try:
            self.client = MlflowClient(tracking_uri)
        except Exception as exc:  # noqa: BLE001 — mlflow's store errors share no base class
            store = tracking_uri or "sqlite:///mlflow.db (its default)"
            raise ValueError(
                f"MLflowLogger: MLflow cannot open the tracking store {store} "
                f"({type(exc).__name__}: {str(exc)[:160]}). A sqlite store needs pip install "
                "mlflow; with mlflow-skinny pass tracking_uri='file:./mlruns' (and set "
                "MLFLOW_ALLOW_FILE_STORE=true) or a server ('http://host:5000')") from exc
        self.experiment, self.run_name, self.tags = experiment, run_name, dict(tags or {})
        self.per_step = per_step
        self.run_id: str | None = None
        self._open = False

    def log_hparams(self, params: dict[str, Any]) -> None:
        """A fit starts (``Logger``: before anything else is logged): its run, params first."""
        from mlflow.entities import Param

        found = self.client.get_experiment_by_name(self.experiment)
        experiment_id = found.experiment_id if found is not None else \
            self.client.create_experiment(self.experiment)
        run = self.client.create_run(experiment_id, run_name=self.run_name, tags=self.tags)
        self.run_id, self._open = run.info.run_id, True
        self.client.log_batch(self.run_id, params=[Param(k, str(v)[:6000])
                                                   for k, v in params.items()])

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        values = [Metric(k, v, now, int(step)) for k, v in numbers(metrics).items()]
        if values:
            self.client.log_batch(self.run_id, metrics=values)

    def close(self) -> None:
        if self._open:
            self._open = False
            self.client.set_terminated(self.run_id)


class WandbLogger:
    """One Weights & Biases run per fit, offline by default (docs/runs-and-logs.md): params as
    its config, each epoch's numbers (``per_step``: every optimizer step's loss and lr too) as
    its history. Other keyword arguments go to ``wandb.init``; ``run_dir`` after a fit."""

    def __init__(self, project: str = "hybridnb", dir: str | os.PathLike | None = None,
                 mode: str = "offline", name: str | None = None, per_step: bool = True,
                 **init_kwargs: Any) -> None:
        self.wandb = _require("wandb", "WandbLogger")
        self.project, self.dir, self.mode, self.name = project, dir, mode, name
        self.per_step, self.init_kwargs = per_step, init_kwargs
        self.run = None
        self.run_dir: Path | None = None

    def log_hparams(self, params: dict[str, Any]) -> None:
        """A fit starts (``Logger``: before anything else is logged): its run, params as config."""
        if self.dir is not None:
            Path(self.dir).mkdir(parents=True, exist_ok=True)
        self.run = self.wandb.init(project=self.project, mode=self.mode, name=self.name,
                                   dir=None if self.dir is None else str(self.dir),
                                   config=dict(params), **self.init_kwargs)
        self.run_dir = Path(self.run.dir).parent if getattr(self.run, "dir", None) else None

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        values = numbers(metrics)
        if values:
            self.run.log(values, step=int(step))

    def close(self) -> None:
        if self.run is not None:
            run, self.run = self.run, None
            run.finish()


def make_loggers(loggers: tuple, folder: Path | None, storage: StorageGuard) -> list:
    """This fit's logger objects: names made into file loggers; file loggers bound to
    ``folder`` (``log_dir``, used when they have none of their own) and ``storage``."""
    made = []
    for lg in loggers:
        if isinstance(lg, str):
            lg = KINDS[lg]()  # writes into log_dir (bound below)
        if callable(getattr(lg, "bind", None)):
            lg.bind(folder, storage)
            twin = next((o for o in made if type(o) is type(lg)
                         and getattr(o, "folder", None) == lg.folder), None)
            if twin is not None:
                raise ValueError(f"logger=: two {type(lg).__name__}s would write into one "
                                 f"folder, {lg.folder} (a name writes into log_dir, as an object "
                                 "given no folder does): keep one, or give one its own folder")
        made.append(lg)
    return made


def _cell(value) -> object:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and math.isnan(value):
        return ""
    return "" if value is None else value


def _epoch(text: str) -> float:
    """A row's epoch cell as a number (a cell that is not one sorts after every epoch)."""
    try:
        return int(float(text))
    except ValueError:
        return math.inf


def patterns(loggers: tuple) -> tuple[str, ...]:
    """The files the loggers write into ``log_dir`` (names, and objects given no folder of their
    own; set aside with a fresh run's checkpoints when ``log_dir`` is ``checkpoint_dir``)."""
    return tuple(p for lg in loggers
                 for p in (KINDS[lg].patterns if isinstance(lg, str) else
                           getattr(lg, "patterns", ()) if getattr(lg, "needs_folder", False)
                           else ()))
