"""Trainer: the public class (its use: README), a facade over the parts ``build_loop`` makes (an
isolated worker builds the same), its ``sinks`` (loggers, callbacks) and the Loop, run here or in
a supervised worker (``run_worker.py``: its events heard here, its states applied)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from hybridnb.events import Event
from hybridnb.live.summary import header
from hybridnb.processes.child import prestart_spawn
from hybridnb.train import loggers, opening, run_worker, saved, worker_fit
from hybridnb.train.batch_size import find_batch_size
from hybridnb.train.bus import Bus, Started
from hybridnb.train.callbacks import check_callbacks
from hybridnb.train.checkpoint import read as read_checkpoint
from hybridnb.train.data import made_dataset
from hybridnb.train.evaluation import as_output, metrics
from hybridnb.train.habits import refuse_lightning_hooks
from hybridnb.train.heap import frozen_heap
from hybridnb.train.isolate import PRELOAD, isolate_decision
from hybridnb.train.parts import build_loop
from hybridnb.train.preflight import check_fit_data, check_outputs
from hybridnb.train.settings import Settings
from hybridnb.train.sinks import Sinks
from hybridnb.train.state import HISTORY_COLUMNS, STEP_COLUMNS, Plan, Stop


def _setting(name: str, writable: bool = False) -> property:
    """A read-only view of a setting; ``writable``: an int setting the Trainer may change."""
    def set_int(self, value: int) -> None:  # set by the user now: no longer detect()'s choice
        self.settings = self.settings.replace(**{name: int(value)}, from_detect=tuple(
            n for n in self.settings.from_detect if n != name))

    return property(lambda self: getattr(self.settings, name), set_int if writable else None,
                    doc=f"``{name}=`` as given" + (" (settable)" if writable else ""))


def _of(part: str, *names: str) -> tuple[property, ...]:
    """Read-only views of ``self.<part>.<name>``: the Trainer's attributes over its parts."""
    return tuple(property(lambda self, n=n: getattr(getattr(self, part), n)) for n in names)


class Trainer:
    """Train a PyTorch model on whatever device works, surviving OOM and device failures.

    ``batch_size=None``, ``device="auto"``, ``grad_accum=None`` and ``precision="auto"`` take
    ``hybridnb.detect()``'s recommendations.

    - ``lr``: the peak learning rate; ``epochs``: passes over the training data; ``clip_grad``:
      the largest gradient norm (None: no clipping).
    - ``snapshot_every``: keep the last good state in memory every N optimizer steps (an
      isolated worker sends it to the kernel); None: at epoch ends and checkpoints only.
    - ``verbose``: print events to stderr when there is no live view.
    - ``loss``: "mse" | "l1" | "huber" (``huber_delta``; ``reweight_after=E`` down-weights large
      residuals from epoch E on) | "cross_entropy" (classification: logits (batch, classes),
      targets int64 class indices (batch,) or (batch, 1); ``class_weights``: one weight per
      class; validation, ``evaluate()`` and the history add accuracy and balanced_accuracy,
      ``predict()`` gives labels) | a callable ``(pred, y) -> mean loss``.
    - ``optimizer``: None (AdamW with ``weight_decay``) | "adamw" | "adam" | "sgd" | a callable
      ``params -> Optimizer``.
    - ``compile``: False | True | "default" | "reduce-overhead" | "max-autotune"; any failure
      while compiling or in a compiled step falls back to eager, once, with a message.
    - ``schedule``: "warmup_cosine" (``warmup``: fraction or steps) | "plateau" | None | an object
      from hybridnb.train.schedules | a factory ``(optimizer, total_steps) -> scheduler`` (e.g.
      ``lambda opt, total_steps: OneCycleLR(opt, max_lr=1e-2, total_steps=total_steps)``;
      ``optimizer -> ...`` also works), stepped once per optimizer step (ReduceLROnPlateau: with
      the ``monitor`` value at each validation); on resume, with the checkpoint's state when the
      same one is given.
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
    - ``precision``: "auto" | "bf16" | "fp16" | "fp32": the forward's autocast dtype (weights
      stay fp32); Lightning's "bf16-mixed", "16-mixed", "32-true" mean the same.
    - ``steps_per_epoch``: cap the optimizer steps per epoch (an IterableDataset without
      ``__len__`` needs it; fewer if the stream ends). ``seed``: python, numpy, torch and loader
      workers. ``live``: "auto" | "widgets" | "html" | "text" | False.
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
      autotuning and precision, each kept only where it measures faster; on the CPU: the exact
      span and chain rewrites by rule, channels_last with rows beside it where a paired trial
      wins; docs/speed.md) | True (any device) | False.
    - ``logger``: "auto" (csv when there is a folder, else nothing) | "csv" (each epoch's row
      appended to ``<log_dir>/history.csv`` as it ends) | "tensorboard" | a logger object | a
      list | None. ``log_dir``: where (default ``checkpoint_dir``). hybridnb.train.loggers.
    - ``callbacks``: objects with any of ``on_fit_start``, ``on_step_end``, ``on_epoch_end``,
      ``on_fit_end``, run in this process (also for an isolated fit); a hook stops the fit after
      the current step with ``trainer.should_stop = True`` (hybridnb.train.callbacks).

    Data: a Dataset (items ``(x, y[, extras])``: braindecode's windows as they come), a
    DataLoader, ``(X, y)`` arrays or tensors as one tuple, or an object with ``to_dataset()``
    (data_prep's Windows). A keyword of Lightning, fastai or skorch names the option that does
    the same; ``test(data)`` is ``evaluate(data)``.

    A checkpoint or log write that fails (full disk, read-only folder) is said once; the run
    continues from memory.
    """

    def __init__(self, model: torch.nn.Module, *, loss="mse",
                 class_weights: list[float] | None = None, lr: float = 1e-3,
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
                 callbacks: list | None = None, verbose: bool = True, **unknown) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        kwargs = {k: v for k, v in locals().items()
                  if k not in ("self", "model", "__class__", "callbacks", "unknown")}
        kwargs.update(unknown)  # Settings.build names each unknown one's equivalent
        settings = Settings.build(**kwargs)
        refuse_lightning_hooks(model)
        with frozen_heap():  # building the optimizer imports torch._dynamo (heap.py)
            loop, callbacks = build_loop(model, settings), check_callbacks(callbacks)
        self.loop, bus = loop, loop.bus
        strategy = self.placement.strategy
        self.sinks = Sinks(lambda storage: loggers.make_loggers(  # loggers on rank 0 only
            settings.loggers if strategy.is_main else (), settings.log_folder, storage),
            callbacks)  # objects of the user's process: never in settings, never sent to a worker
        self.should_stop = False  # a callback sets it: the fit stops after the current step
        self._resume_from: dict | None = None  # a checkpoint resume() read
        loop.stop_flag = lambda: self.should_stop
        for listener in (self.sinks.hear, self._print):
            bus.subscribe(listener)
        self.isolated, why = isolate_decision(
            settings.isolate, self.device, in_distributed=strategy.world_size > 1)
        if self.isolated or settings.isolate is True or (
                settings.isolate == "auto" and self.device.type != "cpu"):
            bus.note("isolate", why)  # where it trains, and why, said once
        if not self.isolated:  # isolated: the worker places the model (the kernel never does)
            self.placement.place([])
        loop.placement.build_step(loop)

    def _print(self, event) -> None:
        """Notes on stderr without a live view (an isolated worker's too), the run's header
        line first (what the Trainer chose on the user's behalf)."""
        if not (self.verbose and self.live in (False, None) and self.strategy.is_main):
            return
        if isinstance(event, Event):
            print(f"hybridnb: {event}", file=sys.stderr)
        elif isinstance(event, Started):
            print(f"hybridnb: {header(event.run)}", file=sys.stderr)

    epochs, lr, seed, live, verbose = (_setting(n) for n in
                                       ("epochs", "lr", "seed", "live", "verbose"))
    monitor, early_stopping, checkpoint_dir = (_setting(n) for n in
                                               ("monitor", "early_stopping", "checkpoint_dir"))
    settings = property(lambda self: self.loop.settings,
                        lambda self, value: setattr(self.loop, "settings", value),
                        doc="The checked options in force (hybridnb.train.settings.Settings).")
    state = property(lambda self: self.loop.state,
                     lambda self, value: setattr(self.loop, "state", value),
                     doc="The run as data (hybridnb.train.state.RunState).")
    bus, learner, placement, checkpoints, progress = _of(
        "loop", "bus", "learner", "placement", "checkpoints", "progress")
    model, optimizer, loss_fn, schedule, ema, guard, frozen = _of(
        "learner", "model", "optimizer", "loss_fn", "schedule", "ema", "guard", "frozen")
    strategy, device, precision, applied_speedups = _of(
        "placement", "strategy", "device", "precision", "applied_speedups")
    events, epoch, global_step = _of("state", "events", "epoch", "global_step")
    scaler = property(lambda self: self.placement.precision.scaler)
    step = property(lambda self: self.placement.recovery.step,
                    doc="The training step: step(x, y) (eager again after a compile fallback).")
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

    def plan(self, train) -> Plan:
        """The coming fit's epochs, batches and optimizer steps on ``train`` (a Dataset or
        DataLoader, as ``fit`` takes it), without training; ``total_steps`` reads it after.

        >>> trainer.plan(train).total_steps == trainer.total_steps   # epochs x steps per epoch
        """
        # fit says the loader's notes (and quick mode's cap) when it opens the same data
        loader = opening.loader(self.loop, train, shuffle=True, what="train",
                                bus=Bus(self.bus.where))
        self.state.plan = opening.plan(loader, self.settings)  # fit opens its own
        return self.state.plan

    @property
    def total_steps(self) -> int:
        """Optimizer steps of the whole run (after ``grad_accum``, ``steps_per_epoch`` and
        quick mode's caps): what a schedule should span, and what a schedule factory's second
        argument receives. Known after ``plan(train)``; a resumed fit continues the count."""
        if not self.state.plan.total_steps:
            raise RuntimeError("trainer.total_steps depends on the training data: call "
                               "trainer.plan(train) first (or give schedule= a factory "
                               "lambda opt, total_steps: ..., which receives it at fit)")
        return self.state.plan.total_steps

    def fit(self, train, val=None, resume: bool | str | Path = False) -> pd.DataFrame:
        """Train for ``epochs`` epochs; returns the history. ``resume=True`` continues from
        ``checkpoint_dir``'s last good checkpoint, ``resume=path`` from that file."""
        train, val = made_dataset(train, self.bus, "train"), made_dataset(
            val, self.bus, "val")  # a data library's windows: the Dataset they make
        item = check_fit_data(train, val)  # before anything is said or started
        if item is not None:
            check_outputs(self.model, self.loss_fn, item, self.learner.dtype, self.batch_size)
        with self.checkpoints.claimed():  # one live run per checkpoint_dir
            # an isolated fit's worker starts first: it imports torch while this process sets up
            early = prestart_spawn(preload=PRELOAD) if self.isolated else None
            try:
                train_loader, val_loader = opening.open_loaders(self.loop, train, val)
                self.should_stop = False
                self._begin(resume)
                self.sinks.begin(self)  # loggers and callbacks: here, also for an isolated fit
                if self.isolated:  # fit (and evaluate, predict, ... after it) in a worker
                    run_worker.fit(self, train, val, train_loader, val_loader, early)
                else:
                    self.loop.fit(train_loader, val_loader)
            except BaseException:  # any end, Ctrl-C included: the files closed, then re-raised
                self.sinks.close()  # the rows logged so far stay in the files
                raise
            finally:
                self.bus.open = False  # notes from now on wait for the next fit
                if early is not None:
                    early.close()  # it never got its job (after run_isolated: nothing to do)
            self.sinks.end(self)
            return self.history

    def _begin(self, resume) -> None:
        """A fresh run state: resumed, or started (earlier files set aside, seeded)."""
        if resume is True and not self.checkpoints.has_last():
            if self.checkpoint_dir is None:
                raise ValueError("fit(resume=True) needs checkpoint_dir=; or pass resume=<path>")
            self.bus.note("resume", f"no checkpoint in {self.checkpoint_dir} yet: starting from "
                          "scratch")
        elif resume is not False and resume is not None:
            self.resume(self.checkpoint_dir if resume is True else resume)
        elif kept := self.checkpoints.set_aside():
            self.bus.note("earlier_run", f"{self.checkpoint_dir} held an earlier run's "
                          f"checkpoints: moved to {kept} (fit(..., resume=True) would have "
                          "continued it)")
        pending, self._resume_from = self._resume_from, None
        opening.begin(self.loop, pending)

    def _where_fit_ran(self, what: str, fn, data, name: str, *args, **kwargs):
        """``fn(loop, data, *args, **kwargs)`` (``made_dataset``'s ``data``, called ``name`` in
        its notes) where fit ran: in a worker after an isolated fit (if it is lost, here on the
        CPU, said once), else in this process."""
        data = made_dataset(data, self.bus, name)
        if self.isolated and not self.loop.fitting:
            done, result = run_worker.job(self, what, fn, data, *args, **kwargs)
            if done:
                return result
        return fn(self.loop, data, *args, **kwargs)

    @torch.no_grad()
    def evaluate(self, data) -> dict:
        """Loss and metrics on ``data``: regression (rmse, nrmse = rmse / std(y), mae, r2) or,
        with ``loss="cross_entropy"``, accuracy and balanced_accuracy; samples with non-finite
        targets are left out and counted (``nonfinite_targets``)."""
        return metrics(*self._predict(data, with_targets=True), task=self.settings.task)

    test = evaluate  # Lightning's name

    @torch.no_grad()
    def predict(self, data, output: str | None = None) -> np.ndarray:
        """Predictions as a numpy array. ``output``: "raw" (the model's outputs: (N,) for one
        per sample, else (N, k)), "labels" (the argmax class, (N,) int64), "probs" (softmax,
        (N, classes)); None: labels with ``loss="cross_entropy"``, else raw."""
        as_output(np.zeros((0, 2)), self.settings.task, output)  # a wrong output=: before work
        return as_output(self._predict(data, with_targets=False)[0], self.settings.task, output)

    def _predict(self, data, with_targets: bool) -> tuple:
        return self._where_fit_ran("predicting", worker_fit.predict, data, "data", with_targets)

    def event(self, kind: str, message: str) -> Event:
        """Record an event (kept in ``events``, shown by the live view)."""
        return self.bus.say(kind, message)

    def summary(self, stopped: Stop | None = None) -> dict:
        """What the view's end() and report() show (speeds are wall clock: progress.py)."""
        return self.progress.summary(self.state, self.settings.monitor, self.device,
                                     self.placement.precision.name, stopped)

    def find_batch_size(self, dataset, headroom: float = 0.1, max_batch: int | None = None,
                        start: int = 1) -> int:
        """The largest batch that fits with ``headroom`` to spare (doubling + bisection over
        real steps); sets ``batch_size`` and raises ``grad_accum`` to keep the effective batch.
        The model and optimizer are restored afterwards. See hybridnb.train.batch_size."""
        result = self._where_fit_ran("finding the batch size", find_batch_size, dataset, "dataset",
                                     headroom=headroom, max_batch=max_batch, start=start)
        self.batch_size, self.grad_accum = result.batch_size, result.grad_accum
        return result.found

    def state_dict(self) -> dict:
        """Everything needed to continue exactly: weights, optimizer, schedule, scaler, EMA,
        the run's state and RNG states (CPU copies; loads with weights_only=True)."""
        return saved.state_dict(self.loop)

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (a ``state_dict()`` or a checkpoint file's content)."""
        saved.load(self.loop, state)

    def restore(self, state: dict) -> None:
        """Back to a ``state_dict()`` taken earlier in this process (weights, optimizer, run
        state, RNG); the events said since are kept."""
        saved.rewind(self.loop, state)

    def resume(self, path: str | Path) -> Trainer:
        """Load a checkpoint file (or the newest good one in a folder) now; the next ``fit``
        continues from it."""
        state, used, problems = read_checkpoint(path, self.model)
        for p in problems:
            self.bus.note("checkpoint_fallback", f"{p}; using {used} instead")
        self.model.load_state_dict(state["model"])
        self._resume_from = state  # the next fit continues from it
        self.bus.note("resume", f"resuming from {used} (epoch {state['position']['epoch']}, "
                      f"step {state['position']['global_step']})")
        return self

    def save(self, path: str | Path, extra: dict | None = None, *,
             init_args: dict | None = None) -> Path:
        """Write ``model``'s weights (after fit: the ones fit chose, best or EMA) with the
        model's class (and the arguments it was built with when known, or ``init_args``), one
        sample's input shape, the versions and ``extra`` (plain data) to ``path``, atomically;
        ``hn.load(path)`` or ``hn.load(path, model)`` reads it back (hybridnb.saving)."""
        from hybridnb.saving import save_model

        best = self.early_stopping and self.state.best.model is not None and any(
            e.kind == "best_restored" for e in self.events)
        weights = "best" if best else "ema" if self.ema is not None else "final"
        return save_model(self.model, path, input_shape=self.learner.input_shape,
                          weights=weights, init_args=init_args, extra={
                              "epochs": len(self.state.history), "global_step": self.global_step,
                              "monitor": self.monitor, "best_value": self.state.best.value,
                              **(extra or {})})

    def model_summary(self, input_shape: tuple[int, ...] | None = None, depth: int = 3):
        """The model's layers, output shapes and parameters (torchinfo), for one sample of
        ``input_shape`` (default: the shape of the data the last fit saw); ``print()`` it."""
        from hybridnb.train.report import model_summary
        shape = self.learner.input_shape if input_shape is None else input_shape
        return model_summary(self.model, shape, depth)

    def report(self, folder: str | Path) -> Path:
        """Write history.csv, steps.csv, events.csv, figures (HTML; PNG when possible),
        model.txt (``model_summary()``) and a text summary into ``folder``."""
        from hybridnb.train.report import write_report
        return write_report(self, folder)

    def lr_find(self, data, *, apply: bool = False, **kwargs):
        """The learning-rate range test: an exponential sweep of real steps on ``data`` (1e-7 to
        1 over at most 100 steps; stops when the loss diverges). Returns ``.lrs``, ``.losses``,
        ``.suggestion`` and ``.plot()``; the model, optimizer, schedule and RNG are restored.
        ``apply=True`` sets ``lr`` to the suggestion. See hybridnb.train.lr_find."""
        from hybridnb.train import lr_find as finder
        result = self._where_fit_ran("running lr_find", finder.lr_find, data, "data", **kwargs)
        if apply and result.suggestion is not None:
            old, lr = self.lr, result.suggestion
            for group in self.optimizer.param_groups:  # own initial LRs kept in proportion
                group["initial_lr"] = group["lr"] = lr * (group.get("initial_lr", old) / old)
            self.settings = self.settings.replace(lr=float(lr))
            result.applied = True
            self.bus.note("lr_find", f"lr set to {result.suggestion:.3g} (was {old:.3g}), the "
                       f"{result.method} suggestion of lr_find")
        return result

