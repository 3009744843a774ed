"""Trainer: the public class and the loop, on one screen each.

The pieces live in their own modules: setup.py (checks and factories), step.py (the one training
step), recovery.py (what a failure is and what to do), state.py (the run's state as data),
data.py (loaders, resumable batch order), evaluation.py, checkpoint.py, precision.py,
schedules.py, losses.py, ema.py, blocks.py (activation checkpointing), strategies/, live/.

>>> tr = Trainer(model, loss="mse", lr=1e-3, epochs=10, checkpoint_dir="runs/c1")
>>> history = tr.fit(train, val)          # Datasets or DataLoaders; batches (x, y[, extras])
>>> tr.evaluate(test), tr.predict(test), tr.report("runs/c1/report")
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd
import torch

from hybridnb.env import smoke
from hybridnb.events import Event
from hybridnb.live import make_view
from hybridnb.measure.memory import reset_peak
from hybridnb.train import checkpoint, isolate, recovery, setup
from hybridnb.train.blocks import checkpointed_blocks
from hybridnb.train.data import BatchCheck, epoch_batches, make_loader, plan_epochs
from hybridnb.train.ema import make_ema
from hybridnb.train.evaluation import Evaluation
from hybridnb.train.interrupt import GracefulInterrupt
from hybridnb.train.isolate import isolate_decision
from hybridnb.train.losses import make_loss
from hybridnb.train.placement import Placement
from hybridnb.train.progress import Progress
from hybridnb.train.resumable import Resumable
from hybridnb.train.schedules import make_schedule
from hybridnb.train.seeding import seed_everything
from hybridnb.train.state import HISTORY_COLUMNS, STEP_COLUMNS, RunState
from hybridnb.train.worker_fit import Isolation


class Trainer(Progress, Resumable, Evaluation, Placement, Isolation):
    """Train a PyTorch model on whatever device works, surviving OOM and device failures.

    ``batch_size=None``, ``device="auto"``, ``grad_accum=None`` and ``precision="auto"`` take
    ``hybridnb.detect()``'s recommendations.

    - ``loss``: "mse" | "l1" | "huber" (``huber_delta``; ``reweight_after=E`` down-weights large
      residuals from epoch E on) | a callable ``(pred, y) -> mean loss``.
    - ``optimizer``: None (AdamW with ``weight_decay``) | "adamw" | "adam" | "sgd" | a callable
      ``params -> Optimizer``.
    - ``compile``: False | True | "default" | "reduce-overhead" | "max-autotune"; any failure
      while compiling or in a compiled step falls back to eager, once, with a message.
    - ``schedule``: "warmup_cosine" (``warmup``: fraction or steps) | "plateau" | None | an object
      from hybridnb.train.schedules. Schedules count optimizer steps.
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
                 speedups="auto", verbose: bool = True) -> None:
        setup.check_args(model=model, lr=lr, epochs=epochs, batch_size=batch_size,
                         grad_accum=grad_accum, clip_grad=clip_grad, compile=compile,
                         on_gpu_error=on_gpu_error, val_every=val_every,
                         checkpoint_every=checkpoint_every, snapshot_every=snapshot_every,
                         steps_per_epoch=steps_per_epoch, memory_fraction=memory_fraction,
                         early_stopping=early_stopping, monitor=monitor)
        self.epochs, self.lr, self.seed, self.live, self.verbose = epochs, lr, seed, live, verbose
        self.clip_grad, self.on_gpu_error, self.monitor = clip_grad, on_gpu_error, monitor
        self.early_stopping, self.grad_checkpointing = early_stopping, grad_checkpointing
        self.val_every, self.checkpoint_every = val_every, checkpoint_every
        self.snapshot_every, self.steps_per_epoch = snapshot_every, steps_per_epoch
        self.memory_fraction, self.step_timeout, self.speedups = memory_fraction, step_timeout, \
            speedups
        self._channel = None  # the pipe to the kernel, in an isolated worker
        self.checkpoint_dir = checkpoint.check_dir(checkpoint_dir)
        self.state, self._notes, self._pending, self._loaders = RunState(), [], None, []
        self._view, self._interrupt = make_view(False), None
        hw = setup.detect() if ("auto" in (device, precision) or batch_size is None
                           or grad_accum is None) else None
        self.strategy = setup.make_strategy(strategy, setup.resolve_device(device, hw, self._notes))
        self.batch_size = int(batch_size if batch_size is not None else hw.settings.batch_size)
        self.grad_accum = int(grad_accum if grad_accum is not None else
                              (hw.settings.grad_accum if batch_size is None else 1))
        self._loader_kwargs = setup.loader_kwargs(loader_kwargs, hw, device, self.device)
        if device == "auto" and hw is not None and hw.settings.torch_threads:
            torch.set_num_threads(int(hw.settings.torch_threads))
        self.compile = compile if self.strategy.supports_compile else False
        if compile and not self.strategy.supports_compile:
            self._notes.append(("compile_fallback", f"strategy={self.strategy.name!r}: "
                                f"compile={compile!r} is ignored (its engine runs eager)"))
        self.precision_arg = precision
        self.precision = setup.choose_precision(precision, self.strategy,
                                                hw.precision if hw else None, self._notes)
        self.isolated, why = isolate_decision(isolate, self.device,
                                              in_distributed=self.strategy.world_size > 1)
        if self.isolated or isolate is True or (isolate == "auto" and self.device.type != "cpu"):
            self._notes.append(("isolate", why))  # where it trains, and why, said once
        self.model = model
        self.frozen = setup.freeze(self.model, freeze)
        self._params = [p for p in self.model.parameters() if p.requires_grad]
        if not self._params:
            raise ValueError(f"freeze={freeze!r} leaves no trainable parameter in "
                             f"{type(model).__name__}")
        self.optimizer = setup.make_optimizer(optimizer, self._params, lr, weight_decay)
        self._batch = BatchCheck(self._params[0].dtype, self._note)
        self.ema = make_ema(self.model, ema) if ema is not None else None
        self.loss_fn = make_loss(loss, huber_delta=huber_delta, reweight_after=reweight_after)
        self.schedule = make_schedule(schedule, warmup=warmup)
        self.guard = (recovery.LossGuard() if loss_guard is True else
                      loss_guard if isinstance(loss_guard, recovery.LossGuard) else None)
        self.strategy.configure(self.batch_size, clip_grad)
        if not self.isolated:  # isolated: the worker places the model (the kernel never does)
            self._place([])
        self._build_step(compiled=False)

    # ----------------------------------------------------------------------------- properties
    device = property(lambda self: self.strategy.device)
    scaler = property(lambda self: self.precision.scaler)
    events = property(lambda self: self.state.events)
    epoch = property(lambda self: self.state.epoch)
    global_step = property(lambda self: self.state.global_step)
    stopped = property(lambda self: self.state.stopped, doc="Why the last fit stopped early.")
    ema_model = property(lambda self: None if self.ema is None else self.ema.module)

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
        train_loader = self._loader(train, shuffle=True, what="train")
        val_loader = None if val is None else self._loader(val, shuffle=False, what="val")
        self._plan(train_loader)
        self._loaders = [loader for loader in (train_loader, val_loader) if loader is not None]
        if resume is not False and resume is not None:
            self._load_resume(resume)
        elif self.strategy.is_main and (kept := checkpoint.set_aside(self.checkpoint_dir)):
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
        self._train_gen = getattr(train_loader, "generator", None)
        self.schedule.bind(self._total_steps)
        if self.isolated and not isolate.cuda_initialized():
            return self._fit_isolated(train_loader, val_loader)
        if self.isolated:
            self._note("isolate", "CUDA was initialised in this process after the Trainer was "
                       "built: training in this process, without isolation")
        return self._fit_here(train_loader, val_loader)

    def _fit_here(self, train_loader, val_loader, view_started: bool = False) -> pd.DataFrame:
        """The fit in this process (the kernel, or the isolated worker)."""
        self._place(self._loaders)
        self._speed_up(train_loader)
        stopped, failed = None, True
        with GracefulInterrupt() as self._interrupt, \
                checkpointed_blocks(self.model, self.grad_checkpointing) as blocks, \
                setup.compile_settings(bool(self.compile), self.device, self.precision):
            self._build_step(compiled=bool(self.compile))
            self._keep(self.state_dict())
            self._fit_first_step = self.state.global_step
            self._start_view(blocks, view_started)
            try:
                stopped = self._run(train_loader, val_loader)
                failed = False
            finally:
                self._finish(stopped, failed)
                self._interrupt = None  # a Ctrl-C that stopped fit does not also stop evaluate()
        return self.history

    def _run(self, train_loader, val_loader) -> str | None:
        """Epochs until done or stopped; returns why it stopped early (or None)."""
        while self.state.epoch < self._epochs:
            try:
                outcome = self._train_epoch(train_loader, val_loader)
                if outcome == "rewind":
                    continue
                if outcome:
                    return outcome
                metrics, stop = self._validate_epoch(val_loader)
            except KeyboardInterrupt:  # outside a step: loading data or validating
                return self._interrupted()
            self._end_epoch(metrics)
            if stop:
                return "early_stopping"
        return None

    def _train_epoch(self, loader, val_loader) -> str | None:
        """One epoch from the current position: None when complete, "rewind" after a restore,
        else why it stopped."""
        state, acc = self.state, self.state.acc
        self.model.train()
        if hasattr(self.loss_fn, "set_epoch"):
            self.loss_fn.set_epoch(state.epoch)
        if state.batches_done == 0:
            reset_peak(self.device)
        window, self._monitor = [], self._new_monitor()
        batches = self._monitor.batches(epoch_batches(loader, state, self.event))
        for i, batch in enumerate(batches, start=state.batches_done):
            if i >= self._batches_per_epoch:
                break
            window.append(self._batch(batch))
            if len(window) < self.grad_accum and i + 1 < self._batches_per_epoch:
                continue
            self._set_lr()
            outcome = self._recovery.run(window)
            if outcome.kind == "device_lost":
                return self._move_to_cpu(outcome.detail)
            if outcome.kind == "restore":
                return self._restore_after_bad_steps()
            n = sum(recovery.batch_len(b) for b in window)
            if outcome.kind == "ok":
                acc["loss_sum"] += outcome.loss * n
                acc["loss_samples"] += n
            state.batches_done += len(window)
            state.global_step += 1
            window = []
            self._monitor.step_done(n)
            self._record_step(outcome.loss)
            if self._channel is not None:
                self._channel.step_done()
            with self._monitor.paused():
                stopped = self._between_steps(val_loader)
            if stopped:
                return stopped
        return None

    def _set_lr(self) -> None:
        factor = self.schedule.factor(self.state.global_step) * self.state.lr_scale
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"] * factor

    # ----------------------------------------------------------------------------- data
    def _loader(self, data, shuffle: bool, what: str):
        return make_loader(data, batch_size=self.batch_size, shuffle=shuffle, what=what,
                           seed=self.seed, strategy=self.strategy,
                           loader_kwargs=self._loader_kwargs, note=self._note)

    def _plan(self, loader) -> None:
        """Epochs and batches per epoch for this fit (smoke mode caps both and says so)."""
        self._epochs, self._batches_per_epoch, note = plan_epochs(
            loader, self.epochs, self.steps_per_epoch, self.grad_accum, smoke())
        if note:
            self._note("smoke", note)
        self._steps_per_epoch = math.ceil(self._batches_per_epoch / self.grad_accum)
        self._total_steps = self._epochs * self._steps_per_epoch

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
        self._view.event(ev)
        if self.verbose and (self.live is False or self.live is None) and self.strategy.is_main:
            print(f"hybridnb: {ev}", file=sys.stderr)
        return ev

    def find_batch_size(self, dataset, headroom: float = 0.1, max_batch: int | None = None,
                        start: int = 1) -> int:
        """The largest batch that fits with ``headroom`` to spare (doubling + bisection over
        real steps); sets ``batch_size`` and raises ``grad_accum`` to keep the effective batch.
        The model and optimizer are restored afterwards. See hybridnb.train.batch_size."""
        from hybridnb.train.batch_size import find_batch_size
        return find_batch_size(self, dataset, headroom=headroom, max_batch=max_batch, start=start)

    def report(self, folder: str | Path) -> Path:
        """Write history.csv, steps.csv, events.csv, figures (HTML; PNG when possible) and a
        text summary into ``folder``."""
        from hybridnb.train.report import write_report
        return write_report(self, folder)
