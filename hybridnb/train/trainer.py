"""Trainer: the public class and the loop, on one screen each.

The Trainer holds its parts, each owning its state and offering a few public methods:
``settings`` (the checked, frozen options), ``learner`` (model, optimizer, loss, schedule, EMA,
guard), ``placement`` (device, precision decided once, speedups, the step and its recovery),
``checkpoints`` (the last good state, files, earlier runs), ``progress`` (the live view, rows,
throughput), ``stopping`` (best weights, early stopping), ``heartbeat`` (in an isolated worker:
the link to the kernel) and ``state`` (the run as data). An isolated fit hands the worker a
``FitJob`` built from the same parts (worker_fit.py); the worker builds its own Trainer from it
(``from_settings(channel=...)``), which serves the job and streams its states back.

>>> tr = Trainer(model, loss="mse", lr=1e-3, epochs=10, checkpoint_dir="runs/c1")
>>> history = tr.fit(train, val)          # Datasets or DataLoaders; batches (x, y[, extras])
>>> tr.evaluate(test), tr.predict(test), tr.report("runs/c1/report")
"""

from __future__ import annotations

import contextlib
import enum
import functools
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import torch

from hybridnb.env import smoke
from hybridnb.events import Event
from hybridnb.measure.memory import reset_peak
from hybridnb.processes.worker import startup as worker_startup
from hybridnb.train import isolate, loggers, recovery, setup
from hybridnb.train.blocks import checkpointed_blocks
from hybridnb.train.callbacks import check_callbacks
from hybridnb.train.checkpoint import Checkpoints
from hybridnb.train.checkpoint import read as read_checkpoint
from hybridnb.train.data import BatchCheck, epoch_batches, make_loader, plan_epochs
from hybridnb.train.evaluation import predict_loader
from hybridnb.train.heap import frozen_heap
from hybridnb.train.heartbeat import Heartbeat
from hybridnb.train.interrupt import GracefulInterrupt
from hybridnb.train.learner import Learner
from hybridnb.train.metrics import regression_metrics
from hybridnb.train.placement import Placement
from hybridnb.train.progress import Progress
from hybridnb.train.recovery import Came
from hybridnb.train.schedules import tell_validation
from hybridnb.train.seeding import rng_state, seed_everything, set_rng_state
from hybridnb.train.settings import Settings
from hybridnb.train.sinks import Sinks, SinkView
from hybridnb.train.state import HISTORY_COLUMNS, STEP_COLUMNS, RunState, Stop
from hybridnb.train.storage import StorageGuard
from hybridnb.train.target_scale import TargetScale
from hybridnb.train.validation import EarlyStopping
from hybridnb.train.worker_fit import FitJob, Hooks, KernelView, reraise


class Epoch(enum.Enum):
    """How a pass over the epoch's batches ended."""

    COMPLETE = "complete"
    REWOUND = "rewound"    # back to the last good state (lost device, bad steps): go again
    STOPPED = "stopped"    # Stop, Ctrl-C or early stopping: ``state.stopped`` says which


class Plan(NamedTuple):
    """Epochs and batches of one fit (smoke mode caps both)."""

    epochs: int
    batches_per_epoch: int
    steps_per_epoch: int
    total_steps: int


def _setting(name: str, writable: bool = False) -> property:
    """A read-only view of a setting; ``writable``: an int setting the Trainer may change."""
    def set_int(self, value: int) -> None:
        self.settings = self.settings.replace(**{name: int(value)})

    return property(lambda self: getattr(self.settings, name), set_int if writable else None,
                    doc=f"``{name}=`` as given" + (" (settable)" if writable else ""))


class Trainer:
    """Train a PyTorch model on whatever device works, surviving OOM and device failures.

    ``batch_size=None``, ``device="auto"``, ``grad_accum=None`` and ``precision="auto"`` take
    ``hybridnb.detect()``'s recommendations.

    - ``lr``: the peak learning rate; ``epochs``: passes over the training data; ``clip_grad``:
      the largest gradient norm (None: no clipping).
    - ``snapshot_every``: keep the last good state in memory every N optimizer steps (an
      isolated fit's worker sends it to the kernel then); None: at epoch ends and checkpoints
      only.
    - ``verbose``: print events to stderr when there is no live view.
    - ``loss``: "mse" | "l1" | "huber" (``huber_delta``; ``reweight_after=E`` down-weights large
      residuals from epoch E on) | a callable ``(pred, y) -> mean loss``.
    - ``optimizer``: None (AdamW with ``weight_decay``) | "adamw" | "adam" | "sgd" | a callable
      ``params -> Optimizer``.
    - ``compile``: False | True | "default" | "reduce-overhead" | "max-autotune"; any failure
      while compiling or in a compiled step falls back to eager, once, with a message.
    - ``schedule``: "warmup_cosine" (``warmup``: fraction or steps) | "plateau" | None | an object
      from hybridnb.train.schedules | a factory ``optimizer -> torch.optim.lr_scheduler`` object
      (e.g. ``lambda opt: OneCycleLR(opt, max_lr=1e-2, total_steps=N)``), stepped once per
      optimizer step (ReduceLROnPlateau: with the ``monitor`` value at each validation).
      Schedules count optimizer steps.
    - ``ema``: None or a decay (e.g. 0.999); validation, best weights and the final model use it.
    - ``early_stopping``: None or a patience in validations; the best weights are restored.
      ``monitor``: the validation metric it watches (checked at the first validation).
    - ``freeze``: parameter-name patterns (fnmatch, e.g. ``["features.*"]``) left untrained.
    - ``checkpoint_dir``: where last.pt / last.prev.pt / best.pt go (None: no files; the last
      good state is still kept in memory for recovery). ``checkpoint_every`` / ``val_every``:
      also every N optimizer steps, besides every epoch.
    - ``on_gpu_error``: "recover" (split batches, per-batch CPU fallback, move to CPU after a
      sticky device error) | "raise".
    - ``loss_guard``: True | False | a recovery.LossGuard (non-finite or spiking loss).
    - ``memory_fraction``: cap this process's share of GPU memory. ``grad_checkpointing``:
      recompute the activations of the top-level blocks in backward (less memory, more time).
    - ``steps_per_epoch``: cap the optimizer steps per epoch. ``seed``: python, numpy, torch
      and loader workers. ``live``: "auto" | "widgets" | "html" | "text" | False.
    - ``strategy``: "auto" (DDP when started by torchrun / ``hn.launch`` with 2+ processes) |
      "single" | "ddp" | "deepspeed" | a strategy object (hybridnb.strategies; under DDP
      ``batch_size`` is per process).
    - ``loader_kwargs``: DataLoader options for Datasets (default: detect()'s recommendation
      with device="auto", else no workers). In-memory tensors are batched by indexing, on the GPU
      when they fit.
    - ``isolate``: "auto" (GPU runs train in a supervised worker process, so a crash or hang of
      the GPU costs the steps since the last good state, not the kernel) | True | False.
      ``step_timeout``: seconds without a finished step before the worker counts as hung
      (None: max(120 s, 20x the median step)).
    - ``speedups``: "auto" (on CUDA: channels_last, the depthwise-convolution rewrite, cuDNN
      autotuning and precision, each kept only where it measures faster) | True (any device) |
      False.
    - ``logger``: "auto" (csv when there is a folder, else nothing) | "csv" (each epoch's
      history row appended to ``<log_dir>/history.csv`` as the epoch ends, flushed: a killed
      run keeps its finished epochs) | "tensorboard" (event files in ``log_dir``: train/loss and
      train/lr per step, epoch/<column> per epoch; ``pip install 'hybridnb[tensorboard]'``) | a
      list | None. ``log_dir``: where (default ``checkpoint_dir``). hybridnb.train.loggers.
    - ``callbacks``: objects with any of ``on_fit_start(trainer)``, ``on_epoch_end(trainer,
      row)`` (the epoch's history row as a dict), ``on_fit_end(trainer)``; they run in this
      process, also for an isolated fit (hybridnb.train.callbacks).

    ``save(path)`` writes ``model``'s weights with their class and input shape;
    ``hn.load(path, model)`` loads them (hybridnb.saving). A checkpoint or log write that fails
    (full disk, read-only folder) is said once; the run continues from memory.
    """


    def __init__(self, model: torch.nn.Module, *, loss="mse", lr: float = 1e-3,
                 epochs: int = 10, batch_size: int | None = None, device="auto",
                 precision: str = "auto", live="auto", seed: int | None = None,
                 checkpoint_dir: str | Path | None = None, optimizer=None,
                 weight_decay: float = 0.01, grad_accum: int | None = None,
                 clip_grad: float | None = 1.0, schedule="warmup_cosine", warmup: float = 0.05,
                 ema: float | None = None, early_stopping: int | None = None,
                 monitor: str = "val_loss", freeze: list[str] | None = None, compile=False,
                 on_gpu_error: str = "recover", val_every: int | None = None,
                 checkpoint_every: int | None = None, snapshot_every: int | None = 100,
                 steps_per_epoch: int | None = None, loss_guard=True, huber_delta: float = 1.0,
                 reweight_after: int | None = None, memory_fraction: float | None = None,
                 grad_checkpointing: bool = False, loader_kwargs: dict | None = None,
                 strategy="auto", isolate="auto", step_timeout: float | None = None,
                 speedups="auto", logger="auto", log_dir: str | Path | None = None,
                 callbacks: list | None = None, verbose: bool = True) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        kwargs = {k: v for k, v in locals().items()
                  if k not in ("self", "model", "__class__", "callbacks")}
        with frozen_heap():  # building the optimizer imports torch._dynamo (heap.py)
            self._assemble(model, Settings.build(**kwargs), check_callbacks(callbacks))

    @classmethod
    def from_settings(cls, model: torch.nn.Module, settings: Settings, *, channel=None,
                      hooks: Hooks | None = None) -> Trainer:
        """The Trainer for ``settings``. An isolated worker builds its copy this way, with
        ``channel`` (the pipe to the kernel: states, heartbeats, the view) and the job's
        ``hooks``."""
        trainer = cls.__new__(cls)
        with frozen_heap():
            trainer._assemble(model, settings, channel=channel, hooks=hooks)
        return trainer

    def _assemble(self, model: torch.nn.Module, settings: Settings, callbacks: tuple = (), *,
                  channel=None, hooks: Hooks | None = None) -> None:
        self._notes: list[tuple[str, str]] = []  # said when the next fit starts
        self._interrupt: GracefulInterrupt | None = None
        self.heartbeat = Heartbeat(channel, hooks)  # in an isolated worker: to the kernel
        self._pending: dict | None = None  # a checkpoint resume() read for the next fit
        self._loaders: list = []
        self._train_gen: torch.Generator | None = None
        self._plan = Plan(settings.epochs, 0, 0, 0)
        self._first_step = 0
        hw = setup.detect() if settings.needs_detect else None
        device = setup.resolve_device(settings.device, hw, self._notes)
        self.settings = settings = settings.resolved(hw, device)
        if settings.torch_threads:
            torch.set_num_threads(settings.torch_threads)
        self._loader_kwargs = dict(settings.loader_kwargs)
        self.state = RunState()
        self.learner = Learner(model, settings)
        self.placement = Placement(settings, self.learner, self._notes)
        self.checkpoints = Checkpoints(
            settings.checkpoint_dir, self.strategy.is_main, storage=StorageGuard(self._note),
            log_patterns=loggers.patterns(settings.loggers)
            if settings.log_folder == settings.checkpoint_dir else ())
        if channel is not None:  # each state kept goes to the kernel, which applies it
            self.checkpoints.on_keep = lambda state: channel.state(recovery.to_cpu(state))
        self.sinks = Sinks(lambda storage: loggers.make_loggers(
            settings.loggers, settings.log_folder if self.strategy.is_main else None, storage),
            callbacks)  # objects of the user's process: never in settings, never sent to a worker
        self.progress = Progress()
        self.stopping = EarlyStopping(settings.monitor, settings.early_stopping)
        self.target_scale = TargetScale(model, self._note, enabled=not settings.compile)
        self.batch_check = BatchCheck(self.learner.dtype, self._note, first=lambda x, y: (
            self.learner.see_input(x), self.target_scale.targets(y)))
        self.isolated, why = isolate.isolate_decision(
            settings.isolate, self.device, in_distributed=self.strategy.world_size > 1)
        self._fit_where = "worker" if self.isolated else "here"
        if self.isolated or settings.isolate is True or (
                settings.isolate == "auto" and self.device.type != "cpu"):
            self._notes.append(("isolate", why))  # where it trains, and why, said once
        if not self.isolated:  # isolated: the worker places the model (the kernel never does)
            self.placement.place([], self._note, self._notes)
        self._build_step(compiled=False)

    # ----------------------------------------------------------------------------- properties
    epochs, lr, seed, live, verbose = (_setting(n) for n in
                                       ("epochs", "lr", "seed", "live", "verbose"))
    monitor, early_stopping, checkpoint_dir = (_setting(n) for n in
                                               ("monitor", "early_stopping", "checkpoint_dir"))
    model = property(lambda self: self.learner.model)
    optimizer = property(lambda self: self.learner.optimizer)
    loss_fn = property(lambda self: self.learner.loss_fn)
    schedule = property(lambda self: self.learner.schedule)
    ema = property(lambda self: self.learner.ema)
    guard = property(lambda self: self.learner.guard)
    frozen = property(lambda self: self.learner.frozen)
    strategy = property(lambda self: self.placement.strategy)
    device = property(lambda self: self.placement.device)
    precision = property(lambda self: self.placement.precision)
    scaler = property(lambda self: self.placement.precision.scaler)
    step = property(lambda self: self.placement.step, doc="The training step: step(x, y).")
    applied_speedups = property(lambda self: self.placement.applied_speedups)
    events = property(lambda self: self.state.events)
    epoch = property(lambda self: self.state.epoch)
    global_step = property(lambda self: self.state.global_step)
    stopped = property(lambda self: self.state.stopped, doc="Why the last fit stopped early.")
    ema_model = property(lambda self: None if self.ema is None else self.ema.module)

    batch_size, grad_accum = (_setting(n, writable=True) for n in ("batch_size", "grad_accum"))

    @property
    def history(self) -> pd.DataFrame:
        """One row per epoch: losses, validation metrics, lr, speed, peak memory, events."""
        return pd.DataFrame(self.state.history, columns=HISTORY_COLUMNS)

    @property
    def steps(self) -> pd.DataFrame:
        """One row per optimizer step: global_step, epoch, loss, lr."""
        return pd.DataFrame(self.state.steps, columns=STEP_COLUMNS)

    # ----------------------------------------------------------------------------- fit
    def fit(self, train, val=None, resume: bool | str | Path = False) -> pd.DataFrame:
        """Train for ``epochs`` epochs; returns the history. ``resume=True`` continues from
        ``checkpoint_dir``'s last good checkpoint, ``resume=path`` from that file."""
        # an isolated fit's worker starts first: it imports torch while this process sets up
        early = isolate.prestart() if self.isolated else None
        try:
            train_loader, val_loader = self._open(train, val)
            self._begin(resume)
            self.sinks.begin(self)  # loggers and callbacks: here, also for an isolated fit
            if self.isolated:
                self._fit_isolated(train, val, train_loader, val_loader, early)
            else:
                self._fit_here(train_loader, val_loader)
        except BaseException:
            self.sinks.close()  # the rows logged so far stay in the files
            raise
        finally:
            if early is not None:
                early.close()  # it never got its job (after run_isolated: nothing to do)
        self.sinks.end(self)
        return self.history

    def _fit_here(self, train_loader, val_loader, view_started: bool = False) -> pd.DataFrame:
        """The fit in this process (the kernel, or the isolated worker)."""
        self._fit_where = "here"
        grace = self._grace("set-up and the first step")
        self.heartbeat.beat("setup", grace=grace)
        self.placement.place(self._loaders, self._note, self._notes)
        self.placement.speed_up(train_loader, self.batch_size, self._plan.total_steps,
                                self._note)
        failed = True
        with GracefulInterrupt() as self._interrupt, \
                checkpointed_blocks(self.model, self.settings.grad_checkpointing) as blocks, \
                setup.compile_settings(bool(self.placement.compile), self.device,
                                       self.precision):
            self._build_step(compiled=bool(self.placement.compile))
            self.checkpoints.keep(self.state_dict())
            self._first_step = self.state.global_step
            self._start_view(blocks, view_started)
            self.heartbeat.beat("first step", grace=grace)
            try:
                self._run(train_loader, val_loader)
                failed = False
            finally:
                self._finish(failed)
                self._interrupt = None  # a Ctrl-C that stopped fit does not also stop evaluate()
        return self.history

    def _run(self, train_loader, val_loader) -> None:
        """Epochs until done or stopped (``state.stopped`` says why it stopped early)."""
        while self.state.epoch < self._plan.epochs:
            try:
                end = self._train_epoch(train_loader, val_loader)
                if end is Epoch.REWOUND:
                    continue
                if end is Epoch.STOPPED:
                    return
                metrics, stop = self._validate_epoch(val_loader)
            except KeyboardInterrupt:  # outside a step: loading data or validating
                self._interrupted()
                return
            self._end_epoch(metrics)
            if stop:
                self.state.stopped = Stop.EARLY_STOPPING
                return

    def _train_epoch(self, loader, val_loader) -> Epoch:
        """One epoch from the current position."""
        state, learner, placement, plan = self.state, self.learner, self.placement, self._plan
        learner.start_epoch(state.epoch)
        if state.batches_done == 0:
            reset_peak(self.device)
        self.progress.new_epoch(self.device, state.global_step == self._first_step,
                                placement.flops_per_sample, self.precision.name)
        window = []
        batches = self.progress.batches(epoch_batches(loader, state, self.event))
        for i, batch in enumerate(batches, start=state.batches_done):
            if i >= plan.batches_per_epoch:
                break
            window.append(self.batch_check(batch))
            if len(window) < self.grad_accum and i + 1 < plan.batches_per_epoch:
                continue
            learner.set_lr(self.schedule.factor(state.global_step) * state.lr_scale)
            self.heartbeat.before_step(first=state.global_step == self._first_step)
            outcome = placement.recovery.run(window)
            if outcome.kind is Came.DEVICE_LOST:
                return self._move_to_cpu(outcome.detail)
            if outcome.kind is Came.RESTORE:
                return self._restore_after_bad_steps()
            n = sum(recovery.batch_len(b) for b in window)
            if outcome.kind is Came.OK:
                state.acc.add(outcome.loss, n)
            state.batches_done += len(window)
            state.global_step += 1
            window = []
            self.progress.step_done(n)
            self.progress.show_step(state, self.grad_accum, learner.lr(), outcome.loss)
            self.heartbeat.step_done()
            with self.progress.paused():
                if self._between_steps(val_loader):
                    return Epoch.STOPPED
        return Epoch.COMPLETE

    # ----------------------------------------------------------------------------- set-up
    def _open(self, train, val) -> tuple:
        """The loaders and the plan of this fit."""
        train_loader = self._loader(train, shuffle=True, what="train")
        val_loader = None if val is None else self._loader(val, shuffle=False, what="val")
        epochs, batches, note = plan_epochs(train_loader, self.epochs,
                                            self.settings.steps_per_epoch, self.grad_accum,
                                            smoke())
        if note:
            self._note("smoke", note)
        steps = math.ceil(batches / self.grad_accum)
        self._plan = Plan(epochs, batches, steps, epochs * steps)
        self._loaders = [loader for loader in (train_loader, val_loader) if loader is not None]
        self._train_gen = getattr(train_loader, "generator", None)
        return train_loader, val_loader

    def _begin(self, resume) -> None:
        """A fresh run state: resumed, or started (earlier files set aside, seeded)."""
        if resume is not False and resume is not None:
            self._load_resume(resume)
        elif kept := self.checkpoints.set_aside():
            self._note("earlier_run", f"{self.checkpoint_dir} held an earlier run's checkpoints: "
                       f"moved to {kept} (fit(..., resume=True) would have continued it)")
        pending, self._pending = self._pending, None
        self.state = RunState.fresh(self.state.events)
        if self.guard is not None:
            self.guard.reset()  # a resumed run loads the checkpoint's guard below
        if pending is not None:
            self.load_state_dict(pending)
        elif self.seed is not None:
            seed_everything(self.seed)
        self.schedule.bind(self._plan.total_steps)

    def _loader(self, data, shuffle: bool, what: str):
        return make_loader(data, batch_size=self.batch_size, shuffle=shuffle, what=what,
                           seed=self.seed, strategy=self.strategy,
                           loader_kwargs=self._loader_kwargs, note=self._note)

    def _build_step(self, compiled: bool) -> None:
        self.placement.build_step(compiled, self.event, updating=self._interrupt.updating
                                  if self._interrupt else contextlib.nullcontext,
                                  state=self.state)

    def _start_view(self, blocks: list[str], started: bool) -> None:
        """The view for this fit (in an isolated worker: the channel to the kernel's view);
        ``started``: the kernel's view already runs (continuing after the worker was lost)."""
        if not started:
            channel = self.heartbeat.channel
            view = SinkView(self.progress.make_view(self.live, channel=channel,
                                                    is_main=self.strategy.is_main),
                            self.sinks, self, channel=channel)
            self.progress.start(view, self._run_info())
        for kind, message in self._notes:
            self.event(kind, message)
        self._notes = []
        if self.settings.grad_checkpointing:
            self.event("grad_checkpointing", (
                f"recomputing activations of {len(blocks)} blocks ({', '.join(blocks[:6])}"
                f"{'...' if len(blocks) > 6 else ''}) in backward") if blocks else (
                "no top-level block with parameters and without batch norm to checkpoint; "
                "running without"))

    def _run_info(self) -> dict:
        return {"epochs": self._plan.epochs, "steps_per_epoch": self._plan.steps_per_epoch,
                "batch_size": self.batch_size, "device": str(self.device),
                "precision": self.precision.name, "model": type(self.model).__name__,
                "n_params": sum(p.numel() for p in self.model.parameters()),
                "monitor": self.monitor, "smoke": smoke(), "pid": os.getpid()}

    # ----------------------------------------------------------------------------- between steps
    def _between_steps(self, val_loader) -> bool:
        """Stop requests, validation every ``val_every`` steps, checkpoints and snapshots;
        True when the fit stops here."""
        state, s = self.state, self.settings
        # summed over ranks: a stop asked on any rank stops every rank after this same step
        asked = self._stop_asked()
        interrupt, button = self.strategy.sum([float(asked is Stop.INTERRUPT),
                                               float(asked is Stop.STOP_BUTTON)])
        if interrupt:
            return self._stop(Stop.INTERRUPT, "interrupted: stopping after the current step")
        if button:
            return self._stop(Stop.STOP_BUTTON, "Stop clicked: stopping after the current step")
        if s.val_every and state.global_step % s.val_every == 0 and val_loader is not None:
            metrics = self._validate(val_loader)
            self.model.train()
            state.last_val = (state.global_step, metrics)
            self.progress.show(state, self.grad_accum, self.learner.lr(),
                               loss=state.steps[-1][2], **metrics)
            if self._after_validation(metrics):
                return self._stop(Stop.EARLY_STOPPING, None)
        if s.checkpoint_every and state.global_step % s.checkpoint_every == 0:
            self._save_last()
        elif (s.snapshot_every and state.global_step % s.snapshot_every == 0
              and (self.guard is None or self.guard.streak == 0)):
            self.checkpoints.keep(self.state_dict())
        return False

    def _stop_asked(self) -> Stop | None:
        """Whether a stop was asked, and how: Ctrl-C (here, or the kernel's when in a worker)
        or the Stop button. A worker's channel carries one flag for both; its ``stop_reason()``
        (where the channel has one) tells them apart, else the flag reads as the button."""
        if self._interrupt is not None and self._interrupt.requested:
            return Stop.INTERRUPT
        if self.heartbeat.in_worker:
            return self.heartbeat.stop_asked()
        return Stop.STOP_BUTTON if self.progress.stop_requested else None

    def _stop(self, reason: Stop, message: str | None) -> bool:
        if message:
            self.event(reason.value, message + (f"; checkpoint saved in {self.checkpoint_dir}"
                                                if self.checkpoint_dir else
                                                "; no checkpoint_dir, state kept in memory"))
        self._save_last()
        self.state.stopped = reason
        return True

    def _validate(self, loader) -> dict:
        metrics = {"val_" + k: v for k, v in self._evaluate_here(loader, "validation").items()}
        self.heartbeat.beat("step")
        return metrics

    def _validate_epoch(self, val_loader) -> tuple[dict, bool]:
        """The epoch's validation (reused when ``val_every`` just ran); whether to stop."""
        if val_loader is None:
            return {}, False
        if self.state.last_val[0] == self.state.global_step:
            return self.state.last_val[1], False
        metrics = self._validate(val_loader)
        return metrics, self._after_validation(metrics)

    def _after_validation(self, metrics: dict) -> bool:
        """Track the best weights; True when early stopping says stop (on every rank)."""
        state, stopping = self.state, self.stopping
        said = stopping.check(metrics)
        if said and not any(e.kind == "nonfinite_targets" for e in state.events):
            self.event("nonfinite_targets", said)
        improved = stopping.improved(state.best, metrics)
        if improved is None:
            return False
        stopping.record(state.best, metrics, improved, state.global_step, state.epoch,
                        lambda: recovery.to_cpu(self.learner.eval_model(True).state_dict()))
        if improved:
            best = state.best
            self.checkpoints.save_best({"model": best.model, "monitor": self.monitor,
                                        "value": best.value, "epoch": best.epoch,
                                        "global_step": best.step, "ema": self.ema is not None})
        note = tell_validation(self.schedule, improved, metrics.get(self.monitor))
        if note:
            self.event("lr_plateau", note)
        if self.strategy.agree(stopping.should_stop(state.best)):
            self.event("early_stop", stopping.message(state.best))
            return True
        return False

    def _end_epoch(self, metrics: dict) -> None:
        self.progress.end_epoch(self.state, self.grad_accum, self.learner.lr(), metrics,
                                self.device)
        self.state.end_epoch()
        if self.checkpoint_dir is not None:
            self._save_last()
        else:
            self.checkpoints.keep(self.state_dict())
        rows = getattr(self.progress.view, "epoch_rows", None)  # loggers, callbacks (sinks.py)
        if rows is not None:
            rows(self.state.history)

    def _finish(self, failed: bool) -> None:
        """Restore best/EMA weights, close the view (the last checkpoint is already written)."""
        best = self.state.best
        self.placement.end_fit()
        if failed:
            self.checkpoints.save_crash(self.strategy.file_ready)
        elif self.early_stopping and best.model is not None:
            self.model.load_state_dict(best.model)
            self.event("best_restored", f"model holds the best weights ({self.monitor} "
                       f"{best.value:.4g} at epoch {best.epoch}, step {best.step})")
        elif self.ema is not None:
            self.model.load_state_dict(self.ema.module.state_dict())
            self.event("ema_weights", "model holds the EMA weights (raw weights are in "
                       "last.pt)" if self.checkpoint_dir else "model holds the EMA weights")
        self.progress.end(self.summary())

    def summary(self, stopped: Stop | None = None) -> dict:
        """What the view's end() and report() show (speeds are wall clock: progress.py)."""
        return self.progress.summary(self.state, self.monitor, self.device,
                                     self.precision.name, stopped)

    # ----------------------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """Everything needed to continue exactly: weights, optimizer, schedule, scaler, EMA,
        the run's state and RNG states (CPU copies; loads with weights_only=True)."""
        gen = self._train_gen
        rng = self.state.pending_rng if self.state.pending_rng is not None else {
            **rng_state(), "loader": gen.get_state() if gen is not None else None}
        return {"kind": "last", **self.learner.state_dict(self.strategy),
                "rng": recovery.to_cpu(rng), **recovery.to_cpu(self.state.state_dict()),
                "scaler": self.scaler.state_dict(),
                "config": {"lr": self.lr, "epochs": self.epochs, "batch_size": self.batch_size,
                           "grad_accum": self.grad_accum, "seed": self.seed,
                           "model": type(self.model).__name__},
                "device": str(self.device), "precision": self.precision.name}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (a ``state_dict()`` or a checkpoint file's content)."""
        self._restore(state, events=True)
        old = (state.get("config", {}).get("batch_size"), state.get("config", {}).get("grad_accum"))
        if None not in old and old != (self.batch_size, self.grad_accum) and \
                self.state.batches_done:
            samples = self.state.batches_done * old[0]
            self.state.batches_done = samples // self.batch_size // self.grad_accum * \
                self.grad_accum
            self._note("resume", f"the checkpoint used batch_size={old[0]} x grad_accum="
                       f"{old[1]}, this run {self.batch_size} x {self.grad_accum}: the epoch "
                       f"continues after about {samples} samples, not bit for bit")

    def _restore(self, state: dict, events: bool = False) -> None:
        """Weights, optimizer, schedule, scaler, EMA, guard and the run's state."""
        self.learner.load_state_dict(state, self.strategy)
        if self.scaler.is_enabled() and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        self.state.load_state_dict(state, events=events)
        self.placement.resume_micro(self.state.micro)

    def restore(self, state: dict) -> None:
        """Back to a ``state_dict()`` taken earlier in this process (weights, optimizer, run
        state, RNG); the events said since are kept."""
        self._restore(state)
        set_rng_state(self.state.pending_rng)
        self.state.pending_rng = None

    def resume(self, path: str | Path) -> Trainer:
        """Load a checkpoint file (or the newest good one in a folder) now; the next ``fit``
        continues from it."""
        state, used, problems = read_checkpoint(path, self.model)
        for p in problems:
            self._note("checkpoint_fallback", f"{p}; using {used} instead")
        self.model.load_state_dict(state["model"])
        self._pending = state
        self._note("resume", f"resuming from {used} (epoch {state['position']['epoch']}, "
                   f"step {state['position']['global_step']})")
        return self

    def _load_resume(self, resume) -> None:
        where = self.checkpoint_dir if resume is True else Path(resume)
        if where is None:
            raise ValueError("fit(resume=True) needs checkpoint_dir=; or pass resume=<path>")
        if resume is True and not self.checkpoints.has_last():
            self._note("resume", f"no checkpoint in {where} yet: starting from scratch")
            return
        self.resume(where)

    def _save_last(self) -> None:
        self.heartbeat.beat("checkpoint")
        self.checkpoints.save_last(self.strategy.for_file(self.state_dict()))
        self.heartbeat.beat("step")

    def _grace(self, what: str) -> float | None:
        return self.heartbeat.grace(what, compiling=bool(self.placement.compile),
                                    device_type=self.device.type, note=self._note)

    # ----------------------------------------------------------------------------- recovery
    def _move_to_cpu(self, detail: str) -> Epoch:
        """Sticky device error: continue the whole run on the CPU from the last good state
        (a CPU-side snapshot; nothing reads the lost device again)."""
        lost, snapshot = self.device, self.checkpoints.snapshot
        self.event("device_lost", f"{detail} — {lost} cannot be trusted again in this process. "
                   "Moving the run (model, optimizer state, scaler, EMA) to the CPU and "
                   f"continuing from the last good state (step "
                   f"{snapshot['position']['global_step']}) in fp32; steps will be slower")
        self._continue_on_cpu()
        self.learner.rebuild_on_cpu()
        self._restore(snapshot)
        self.state.micro = None  # the GPU's micro-batch size means nothing here
        self._build_step(compiled=False)
        return Epoch.REWOUND

    def _continue_on_cpu(self) -> None:
        """The device is lost: never used again in this process; the rest runs on the CPU in
        fp32 (no pinned memory, no compile, no isolation)."""
        self.placement.continue_on_cpu(self._loaders)
        self._loader_kwargs["pin_memory"] = False
        self.isolated = False

    def _restore_after_bad_steps(self) -> Epoch:
        """``patience`` bad steps in a row: back to the last good state with the lower LR;
        a bounded number of times at the same place, then a clear error."""
        state, snapshot = self.state, self.checkpoints.snapshot
        at = snapshot["position"]["global_step"]
        state.restores[at] = state.restores.get(at, 0) + 1
        if state.restores[at] > 3:
            raise FloatingPointError(
                f"the loss stays non-finite or spiking after 3 restores to step {at} (epoch "
                f"{snapshot['position']['epoch']}), with the learning rate cut to "
                f"{state.lr_scale:.3g} of the schedule. Likely causes: non-finite values in a "
                "custom loss or model output, or a learning rate far too high; check "
                "trainer.steps and trainer.events")
        lr_scale = state.lr_scale
        self.event("restore", f"{self.guard.patience} bad steps in a row: restoring the last "
                   f"good state (step {at}) and keeping the lower learning rate ({lr_scale:.3g} "
                   "of the schedule)")
        self._restore(snapshot)
        state.lr_scale = lr_scale
        self.guard.streak = 0
        return Epoch.REWOUND

    def _interrupted(self) -> None:
        """A KeyboardInterrupt inside a step or a validation (or a stop asked during one):
        drop the step or the validation, keep the last good weights."""
        self.optimizer.zero_grad(set_to_none=True)
        rec = self.placement.recovery
        if rec.phase == "update":  # the optimizer may have been half-way through
            self._restore(self.checkpoints.snapshot)
            self.event("restore", "interrupted during the optimizer update: restored the last "
                       f"good state (step {self.state.global_step})")
        rec.phase = "idle"
        if self._stop_asked() is Stop.STOP_BUTTON:
            self._stop(Stop.STOP_BUTTON, "Stop clicked: the current step or validation was "
                       "dropped")
        else:
            self._stop(Stop.INTERRUPT, "interrupted: the current step or validation was dropped")

    # ----------------------------------------------------------------------------- isolation
    def _fit_isolated(self, train, val, train_loader, val_loader, early=None) -> pd.DataFrame:
        """The fit in a supervised worker (worker_fit.py; ``early``: the worker ``fit`` started
        first); if it dies or hangs, on the CPU here from the last state it sent (the start
        state when none came)."""
        device, start = self.device, self.state_dict()
        job = FitJob(self.settings.for_worker(), self.model, train, val, start,
                     list(self._notes), random.getstate())
        kernel = KernelView(SinkView(self.progress.make_view(self.live), self.sinks, self))

        def on_message(message) -> None:
            if message.kind == "state":  # applied as it arrives: a lost worker loses nothing
                self._notes = []  # the worker said them; its state holds them
                self._restore(message.payload, events=True)
            kernel.on_message(message)

        job.sent_at = time.monotonic()
        try:
            out = self._run_job(job, prestarted=early, on_message=on_message,
                                should_stop=lambda: bool(kernel.view.stop_requested))
        except BaseException:  # the worker's own error: its last state is applied already
            kernel.finish()
            raise
        if out.status == "done":
            kernel.finish()
            self._notes = []
            self._adopt(out.result)
            self._restore(out.result, events=True)  # the model holds the weights fit chose
            self.state.stopped = out.result["stopped"]
            self._fit_where = "worker"
            return self.history
        if out.state is None:  # nothing arrived: the start state (each state that came is
            self._restore(start, events=True)  # applied already, as it arrived)
        if not kernel.started:  # lost before it drew anything: the kernel's view starts here
            self.progress.start(kernel.view, self._run_info())
        else:
            self.progress.view = kernel.view
        if out.status == "interrupted":
            self.event("interrupt", f"{out.reason}; the last good state (step "
                       f"{self.state.global_step}) is kept")
            self.progress.end(self.summary(Stop.INTERRUPT))
            return self.history
        self._continue_on_cpu()
        self.event("worker_lost", f"{out.reason}. {device} is not used again in this process: the "
                   f"run continues on the CPU from the last good state (step "
                   f"{self.state.global_step}) in fp32; steps will be slower")
        self.state.micro = None
        return self._fit_here(train_loader, val_loader, view_started=True)

    def _adopt(self, result: dict) -> None:
        """What the worker decided and measured (precision, speedups, FLOPs, batch size) is
        this Trainer's from now on (nothing here touches the device). A worker that lost its
        GPU and finished on the CPU (its event said so) leaves this Trainer on the CPU too."""
        if result.get("device") == "cpu" and self.device.type != "cpu":
            self._continue_on_cpu()
        if self.placement.adopt(result["placement"]):
            self._build_step(compiled=False)
        self.batch_size, self.grad_accum = result["config"]["batch_size"], \
            result["config"]["grad_accum"]

    def _in_worker(self) -> bool:
        """Whether evaluate/predict/find_batch_size run in a worker: where fit ran (or would)."""
        return self._fit_where == "worker" and self.isolated and self._interrupt is None

    def _job_in_worker(self, what: str, **job) -> tuple[bool, object]:
        """Where fit ran: ``job`` (a FitJob field) in a worker after an isolated fit; (True,
        its result). (False, None) when this process does it: no worker, or the worker was lost
        (then said once, and the rest runs on the CPU here)."""
        if not self._in_worker():
            return False, None
        out = self._run_job(FitJob(self.settings.for_worker(), self.model, **job))
        if out.status == "done":
            return True, out.result
        self._note("worker_lost", f"{out.reason}; {what} on the CPU in this process")
        self._continue_on_cpu()
        return False, None

    def _run_job(self, job: FitJob, **supervise):
        """``job`` in a fresh worker process (spawned: whatever this process did before, CUDA,
        threads, OpenMP, cannot break it); the worker's own error is re-raised here."""
        out = isolate.run_isolated(functools.partial(Trainer._work, job), start="spawn",
                                   step_timeout=self.settings.step_timeout, **supervise)
        if out.status == "error":
            raise reraise(out.error)
        return out

    @classmethod
    def _work(cls, job: FitJob, channel) -> object:
        """In the isolated worker (what the kernel sends it): a Trainer built from the job, which
        serves it."""
        hooks = Hooks(job.hooks)
        settings, hook_notes = hooks.settings(job.settings)
        trainer = cls.from_settings(job.model, settings, channel=channel, hooks=hooks)
        return trainer._serve(job, hook_notes, moved=settings.device != job.settings.device)

    def _serve(self, job: FitJob, hook_notes: list, moved: bool) -> object:
        """In the isolated worker: the job's fit (or evaluation, lr_find, batch-size search)
        here; returns the final state (or the result). ``moved``: a hook changed the device
        (the kernel's run stays on the one it believes in)."""
        channel = self.heartbeat.channel
        if job.predict is not None or job.find_batch is not None or job.lr_find is not None:
            channel.heartbeat(phase="evaluate", grace=self._grace("the first batch"))
            self._notes = []
            if job.predict is not None:
                return self._predict(*job.predict)
            if job.lr_find is not None:
                return self.lr_find(job.lr_find[0], **job.lr_find[1])
            dataset, kwargs = job.find_batch
            found = self.find_batch_size(dataset, **kwargs)
            return {"found": found, "batch_size": self.batch_size,
                    "grad_accum": self.grad_accum, "events": self.events}
        self._notes = list(job.notes or []) + hook_notes
        began = worker_startup()
        if job.sent_at is not None and {"spawned_at", "ready_at"} <= set(began):
            self._notes.append(("worker_start", isolate.startup_note(
                began["spawned_at"], began["ready_at"], job.sent_at)))
        channel.heartbeat(phase="setup")  # the job arrived: alive (its faults come later)
        if job.py_random is not None:
            random.setstate(job.py_random)
        train_loader, val_loader = self._open(job.train, job.val)
        self.state = RunState.fresh([])
        self.load_state_dict(job.start)
        self.schedule.bind(self._plan.total_steps)
        try:
            self._fit_here(train_loader, val_loader)
        except BaseException:
            # whatever ended the fit, the kernel gets the state the worker holds now (what an
            # in-process run would hold), then the error (best effort: the pipe may be gone)
            with contextlib.suppress(Exception):
                channel.state(recovery.to_cpu(self.state_dict()))
            raise
        self.heartbeat.beat("hand-over")
        state = recovery.to_cpu(self.state_dict())
        if moved:
            state["device"] = job.settings.device
        return {**state, "stopped": self.state.stopped, "placement": self.placement.facts()}

    # ----------------------------------------------------------------------------- evaluate
    @torch.no_grad()
    def evaluate(self, data) -> dict:
        """Loss and regression metrics (rmse, nrmse = rmse / std(y), mae, r2) on ``data``;
        samples with non-finite targets are left out and counted (``nonfinite_targets``)."""
        return self._metrics(*self._predict(data, with_targets=True))

    def _evaluate_here(self, loader, phase: str = "evaluate") -> dict:
        return self._metrics(*self._predict_here(loader, with_targets=True, phase=phase))

    @staticmethod
    def _metrics(pred, target, loss, bad) -> dict:
        out = {"loss": loss}
        if bad:
            out["nonfinite_targets"] = bad
        if target is not None and target.dtype.kind == "f" and pred.size == target.size:
            keep = np.isfinite(target)
            if keep.any():
                out.update(regression_metrics(target[keep], pred.reshape(target.shape)[keep]))
        return out

    @torch.no_grad()
    def predict(self, data) -> np.ndarray:
        """Predictions as a numpy array: shape (N,) for one output per sample, else (N, k)."""
        return self._predict(data, with_targets=False)[0]

    def _predict(self, data, with_targets: bool) -> tuple:
        """Where fit ran: in a worker after an isolated fit (if it dies, here on the CPU, said
        once), else in this process."""
        done, result = self._job_in_worker("predicting", predict=(data, with_targets))
        if done:
            return result
        return self._predict_here(self._loader(data, shuffle=False, what="data"), with_targets)

    def _predict_here(self, loader, with_targets: bool, phase: str = "evaluate") -> tuple:
        self.placement.place([loader], self._note, self._notes)
        in_fit = self._interrupt is not None
        # every batch: a stop asked (Ctrl-C, Stop) ends a long validation within one batch
        return predict_loader(self.learner.eval_model(in_fit), loader,
                              strategy=self.strategy, precision=self.precision,
                              loss_fn=self.loss_fn, with_targets=with_targets,
                              stop_requested=lambda: (in_fit or self.heartbeat.in_worker)
                              and self._stop_asked() is not None,
                              cast=self.batch_check.cast, on_batch=lambda: self.heartbeat.beat(phase))

    # ----------------------------------------------------------------------------- messages
    def _note(self, kind: str, message: str) -> None:
        """Said once: an event now during fit, else when the next fit starts."""
        if self._interrupt is not None:
            self.event(kind, message)
        else:
            self._notes.append((kind, message))

    def event(self, kind: str, message: str) -> Event:
        """Record an event (kept in ``events``, shown by the live view)."""
        ev = Event(kind, message, step=self.state.global_step, epoch=self.state.epoch)
        self.state.events.append(ev)
        self.progress.event(ev)
        if self.verbose and (self.live is False or self.live is None) and self.strategy.is_main:
            print(f"hybridnb: {ev}", file=sys.stderr)
        return ev

    def find_batch_size(self, dataset, headroom: float = 0.1, max_batch: int | None = None,
                        start: int = 1) -> int:
        """The largest batch that fits with ``headroom`` to spare (doubling + bisection over
        real steps); sets ``batch_size`` and raises ``grad_accum`` to keep the effective batch.
        The model and optimizer are restored afterwards. See hybridnb.train.batch_size."""
        kwargs = {"headroom": headroom, "max_batch": max_batch, "start": start}
        done, result = self._job_in_worker("finding the batch size", find_batch=(dataset, kwargs))
        if done:  # the device is the worker's: measured there
            self.batch_size, self.grad_accum = result["batch_size"], result["grad_accum"]
            self.state.events.extend(result["events"])
            return result["found"]
        from hybridnb.train.batch_size import find_batch_size
        return find_batch_size(self, dataset, **kwargs)

    def save(self, path: str | Path, extra: dict | None = None) -> Path:
        """Write ``model``'s weights (after fit: the ones fit chose, best or EMA) with the
        model's class, one sample's input shape, the versions and ``extra`` (plain data) to
        ``path``, atomically; ``hn.load(path, model)`` reads it back (hybridnb.saving)."""
        from hybridnb.saving import save_model

        best = self.early_stopping and self.state.best.model is not None and any(
            e.kind == "best_restored" for e in self.events)
        weights = "best" if best else "ema" if self.ema is not None else "final"
        return save_model(self.model, path, input_shape=self.learner.input_shape,
                          weights=weights, extra={
                              "epochs": len(self.state.history), "global_step": self.global_step,
                              "monitor": self.monitor, "best_value": self.state.best.value,
                              **(extra or {})})

    def report(self, folder: str | Path) -> Path:
        """Write history.csv, steps.csv, events.csv, figures (HTML; PNG when possible) and a
        text summary into ``folder``."""
        from hybridnb.train.report import write_report
        return write_report(self, folder)

    def lr_find(self, data, *, apply: bool = False, **kwargs):
        """The learning-rate range test: an exponential sweep of real steps on ``data`` (1e-7 to
        1 over at most 100 steps; stops when the loss diverges). Returns ``.lrs``, ``.losses``,
        ``.suggestion`` and ``.plot()``; the model, optimizer, schedule and RNG are restored.
        ``apply=True`` sets ``lr`` to the suggestion. See hybridnb.train.lr_find."""
        from hybridnb.train import lr_find as finder
        done, result = self._job_in_worker("running lr_find", lr_find=(data, kwargs))
        if not done:  # no worker, or it was lost: here
            result = finder.lr_find(self, data, **kwargs)
        if apply and result.suggestion is not None:
            old = self.lr
            finder.apply_lr(self, result.suggestion)
            result.applied = True
            self._note("lr_find", f"lr set to {result.suggestion:.3g} (was {old:.3g}), the "
                       f"{result.method} suggestion of lr_find")
        return result
