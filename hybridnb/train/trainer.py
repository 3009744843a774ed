"""Trainer: the training loop, and nothing else.

Policies live in their own modules: recovery.py (out of memory, a lost device, an exploding loss),
checkpoint.py (files), precision.py (autocast + GradScaler chosen once), schedules.py, losses.py,
metrics.py, ema.py, strategy.py (device placement; DDP overrides it), live/ (the view).

>>> tr = Trainer(model, loss="mse", lr=1e-3, epochs=10, checkpoint_dir="runs/c1")
>>> history = tr.fit(train, val)          # Datasets or DataLoaders; batches (x, y[, extras])
>>> tr.evaluate(test), tr.predict(test), tr.report("runs/c1/report")
"""

from __future__ import annotations

import contextlib
import fnmatch
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader

from hybridnb.dist.base import SingleDevice
from hybridnb.env import smoke
from hybridnb.live import make_view
from hybridnb.measure.memory import peak_bytes, reset_peak
from hybridnb.train import checkpoint, recovery
from hybridnb.train.data import ResumableBatchSampler, as_dataset
from hybridnb.train.ema import make_ema
from hybridnb.train.events import Event
from hybridnb.train.interrupt import GracefulInterrupt
from hybridnb.train.losses import ReweightedHuber, make_loss
from hybridnb.train.metrics import higher_is_better, regression_metrics
from hybridnb.train.precision import Precision
from hybridnb.train.schedules import make_schedule
from hybridnb.train.seeding import rng_state, seed_everything, set_rng_state, worker_init_fn

COMPILE_MODES = (False, True, "default", "reduce-overhead", "max-autotune")
SMOKE_EPOCHS, SMOKE_STEPS = 2, 5
HISTORY_COLUMNS = ["epoch", "step", "train_loss", "val_loss", "val_rmse", "val_nrmse", "val_mae",
                   "val_r2", "lr", "samples_per_s", "peak_memory_mb", "time_s", "events"]


class _Rewind(Exception):
    """The state was restored to an earlier position; the epoch loop starts again from there."""


class Trainer:
    """Train a PyTorch model on whatever device works, surviving OOM and device failures.

    The arguments people change most come first. ``batch_size=None``, ``device="auto"``,
    ``grad_accum=None`` and ``precision="auto"`` take ``hybridnb.detect()``'s recommendations.

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
      "single" | "ddp" | "deepspeed" | a strategy object (see hybridnb.dist.base and
      hybridnb.dist.ddp; under DDP ``batch_size`` is per process).
    - ``loader_kwargs``: DataLoader options for Datasets (default: detect()'s recommendation
      with device="auto", else no workers).
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
                 strategy="auto", verbose: bool = True) -> None:
        _check_args(model=model, lr=lr, epochs=epochs, batch_size=batch_size,
                    grad_accum=grad_accum, clip_grad=clip_grad, compile=compile,
                    on_gpu_error=on_gpu_error, val_every=val_every,
                    checkpoint_every=checkpoint_every, snapshot_every=snapshot_every,
                    steps_per_epoch=steps_per_epoch, memory_fraction=memory_fraction,
                    early_stopping=early_stopping, monitor=monitor)
        self.epochs, self.lr, self.seed, self.live, self.verbose = epochs, lr, seed, live, verbose
        self.clip_grad, self.on_gpu_error, self.monitor = clip_grad, on_gpu_error, monitor
        self.compile, self.early_stopping, self.grad_checkpointing = compile, early_stopping, \
            grad_checkpointing
        self.val_every, self.checkpoint_every, self.snapshot_every = val_every, checkpoint_every, \
            snapshot_every
        self.steps_per_epoch = steps_per_epoch
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.events: list[Event] = []
        self._notes: list[tuple[str, str]] = []  # (kind, message) said when fit starts

        hw = _detect() if ("auto" in (device, precision) or batch_size is None
                           or grad_accum is None) else None
        self._hw = hw
        self.strategy = _make_strategy(strategy, _resolve_device(device, hw, self._notes))
        self.batch_size = int(batch_size if batch_size is not None else hw.settings.batch_size)
        self.grad_accum = int(grad_accum if grad_accum is not None else
                              (hw.settings.grad_accum if batch_size is None else 1))
        self._loader_kwargs = _loader_kwargs(loader_kwargs, hw, device, self.device)
        if device == "auto" and hw is not None and hw.settings.torch_threads:
            torch.set_num_threads(int(hw.settings.torch_threads))
        self._precision_arg = precision
        self.precision = Precision.choose(precision, self.device,
                                          recommended=hw.precision if hw else None)
        if self.precision.note:
            self._notes.append(("precision_fallback", self.precision.note))
        self.scaler = self.precision.scaler
        if memory_fraction is not None:
            self._cap_memory(memory_fraction)

        self.model = model.to(self.device)
        self.frozen = _freeze(self.model, freeze)
        self._params = [p for p in self.model.parameters() if p.requires_grad]
        if not self._params:
            raise ValueError(f"freeze={freeze!r} leaves no trainable parameter in "
                             f"{type(model).__name__}")
        self.optimizer = _make_optimizer(optimizer, self._params, lr, weight_decay)
        for group in self.optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.ema = make_ema(self.model, ema) if ema is not None else None
        self.loss_fn = make_loss(loss, huber_delta=huber_delta, reweight_after=reweight_after)
        self.schedule = make_schedule(schedule, warmup=warmup)
        self.guard = (recovery.LossGuard() if loss_guard is True else
                      loss_guard if isinstance(loss_guard, recovery.LossGuard) else None)
        self._micro = recovery.MicroBatches()
        self.strategy.bind(self)
        self._train_model = self.strategy.wrap(self.model)
        self._compiled = False
        self._reset_run()

    # ----------------------------------------------------------------------------- properties
    @property
    def device(self) -> torch.device:
        return self.strategy.device

    @property
    def history(self) -> pd.DataFrame:
        """One row per epoch: losses, validation metrics, lr, speed, peak memory, events."""
        return pd.DataFrame(self._history, columns=HISTORY_COLUMNS)

    @property
    def steps(self) -> pd.DataFrame:
        """One row per optimizer step: global_step, epoch, loss, lr."""
        return pd.DataFrame(self._steps, columns=["global_step", "epoch", "loss", "lr"])

    @property
    def ema_model(self) -> torch.nn.Module | None:
        return None if self.ema is None else self.ema.module

    # ----------------------------------------------------------------------------- fit
    def fit(self, train, val=None, resume: bool | str | Path = False) -> pd.DataFrame:
        """Train for ``epochs`` epochs; returns the history. ``resume=True`` continues from
        ``checkpoint_dir``'s last good checkpoint, ``resume=path`` from that file."""
        train_loader = self._loader(train, shuffle=True, what="train")
        val_loader = None if val is None else self._loader(val, shuffle=False, what="val")
        self._plan(train_loader)
        if resume is not False and resume is not None:
            self._load_resume(resume)
        self._reset_run()  # a pending resume state survives this and is loaded next
        if self._pending is not None:
            self.load_state_dict(self._pending)
            self._pending = None
        elif self.seed is not None:
            seed_everything(self.seed)
        self._train_gen = getattr(train_loader, "generator", None)
        self.schedule.bind(self._total_steps)
        self._build_train_model()
        self._snapshot = self.state_dict()
        self._view = make_view(self.live) if self.strategy.is_main else make_view(False)
        self._run_started = time.perf_counter()
        self._view.start(self._run_info())
        for kind, message in self._notes:
            self._event(kind, message)
        self._notes = []
        stopped, failed = None, True
        try:
            with GracefulInterrupt() as self._interrupt, self._checkpointed_blocks():
                stopped = self._run(train_loader, val_loader)
            failed = False
        finally:
            self._finish(stopped, failed)
            self._interrupt = None  # a Ctrl-C that stopped fit does not also stop evaluate()
        return self.history

    def _run(self, train_loader, val_loader) -> str | None:
        """Epochs until done or stopped; returns why it stopped early (or None)."""
        while self.epoch < self._epochs:
            try:
                stopped = self._train_epoch(train_loader, val_loader)
                if stopped:
                    return stopped
                stop = False
                if val_loader is None:
                    metrics = {}
                elif self._last_val[0] == self.global_step:  # val_every just validated
                    metrics = self._last_val[1]
                else:
                    metrics = self._validate(val_loader)
                    stop = self._after_validation(metrics)
            except _Rewind:
                continue
            except KeyboardInterrupt:  # outside a step: loading data or validating
                return self._interrupted()
            self._end_epoch(metrics)
            if stop:
                return "early_stopping"
        return None

    def _train_epoch(self, loader, val_loader) -> str | None:
        """One epoch from the current position; returns a stop reason or None when complete."""
        self.model.train()
        if hasattr(self.loss_fn, "set_epoch"):
            self.loss_fn.set_epoch(self.epoch)
        if self.batches_done == 0:
            reset_peak(self.device)
        batches = self._batches(loader)
        window: list = []
        for i, batch in enumerate(batches, start=self.batches_done):
            if i >= self._batches_per_epoch:
                break
            window.append(_as_pair(batch))
            if len(window) < self.grad_accum and i + 1 < self._batches_per_epoch:
                continue
            t0 = time.perf_counter()
            loss = self._step(window)
            n = sum(recovery.batch_len(b) for b in window)
            self._acc["seconds"] += time.perf_counter() - t0
            self._acc["samples"] += n
            if loss is not None:
                self._acc["loss_sum"] += loss * n
                self._acc["loss_samples"] += n
            self.batches_done += len(window)
            self.global_step += 1
            window = []
            stopped = self._after_step(loss, val_loader)
            if stopped:
                return stopped
        return None

    # ----------------------------------------------------------------------------- the step
    def _step(self, window: list) -> float | None:
        """One optimizer step over the window's batches; recovers from OOM and device errors.
        Returns the loss, or None when the step was skipped (loss guard)."""
        self._set_lr()
        cpu_batch = False
        while True:
            failure = None
            try:
                if cpu_batch:
                    total = self._accumulate_on_cpu(window)
                else:
                    total = self._accumulate(window, self._train_model, self.strategy.to_device,
                                             self.precision, self.scaler.scale)
                if self.strategy.world_size > 1:  # all ranks agree, then gradients are averaged
                    total = self.strategy.settle(self._params, total, window)
                return self._update(total)
            except _Rewind:
                raise
            except Exception as exc:
                if self.strategy.world_size > 1 and self._phase != "update":
                    self.strategy.settle(self._params, None, window, failed=exc)  # tell the others
                failure, detail = self._classify(exc)
            # outside the except block: the failed step's tensors are no longer pinned
            self.optimizer.zero_grad(set_to_none=True)
            self.strategy.discard()
            recovery.free_memory(self.device)
            cpu_batch = self._recover(failure, detail, window, cpu_batch)

    def _accumulate(self, window, model, to_device, precision, scale) -> torch.Tensor:
        """Forward and backward over every micro-batch of the window (gradient accumulation);
        each loss is weighted by its share of the window's samples. Returns the summed loss."""
        self._phase = "forward"
        total = 0.0
        pieces = list(self._micro.split(window))
        # DeepSpeed: every rank runs as many backward passes (extra ones weigh nothing), and
        # gradients are weighted by this rank's share of the global batch
        count, share = self.strategy.micro_plan(
            len(pieces), sum(recovery.batch_len(b) for b in window))
        pieces += [(*pieces[-1][:2], 0.0)] * (count - len(pieces))
        for k, (x, y, weight) in enumerate(pieces):
            x, y = to_device(x), to_device(y)
            last = k == len(pieces) - 1
            with self.strategy.no_sync(model, last=last):
                with precision.autocast():
                    loss = self.loss_fn(model(x), y) * weight
                self.strategy.backward(scale(loss * share if share != 1.0 else loss), last=last)
            total = total + loss.detach()
        return total

    def _update(self, total: torch.Tensor) -> float | None:
        """Unscale, clip, check the loss, step, update the scaler, clear the gradients."""
        if self.strategy.owns_update:
            return self._engine_update(total)
        self._phase = "update"
        with self._interrupt.updating():
            self.scaler.unscale_(self.optimizer)
            norm = (torch.nn.utils.clip_grad_norm_(self._params, self.clip_grad)
                    if self.clip_grad else None)
            loss, grad_norm = _read(total, norm if self._check_norm else None)
            verdict = self.guard.check(loss, grad_norm) if self.guard else "ok"
            if verdict == "ok":
                self.scaler.step(self.optimizer)
                if self.ema is not None:
                    self.ema.update_parameters(self.model)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
        self._phase = "idle"
        if verdict != "ok":
            self._bad_loss(verdict, loss)
            return None
        return loss

    def _engine_update(self, total: torch.Tensor) -> float | None:
        """The update when the strategy's engine (DeepSpeed) clips and steps: the loss guard
        decides first; a skipped step drops the engine's gradients."""
        self._phase = "update"
        with self._interrupt.updating():
            loss = float(total)
            verdict = self.guard.verdict(loss) if self.guard else "ok"
            if verdict == "ok":
                if not self.strategy.step():  # the engine found non-finite gradients
                    verdict = "nonfinite"
                elif self.ema is not None:
                    self.ema.update_parameters(self.model)
            else:
                self.strategy.discard()
            if self.guard:
                self.guard.record(verdict, loss)
        self._phase = "idle"
        if verdict != "ok":
            self._bad_loss(verdict, loss)
            return None
        return loss

    # ----------------------------------------------------------------------------- recovery
    def _classify(self, exc: Exception) -> tuple[str, str]:
        """Name a step failure, or re-raise what cannot be recovered. Keeps no reference to
        the exception (its traceback pins the step's tensors)."""
        detail = f"{type(exc).__name__}: {recovery.first_line(exc)}"
        lost = recovery.is_device_lost(exc)
        if self._compiled and not lost:
            return "compile", detail
        if self.on_gpu_error == "raise":
            raise exc
        if lost and self.strategy.accelerator:
            return "device_lost", detail
        if recovery.is_oom(exc):
            if self._phase == "update":
                if self.strategy.accelerator:
                    return "device_lost", detail + " (during the optimizer update)"
                raise MemoryError(f"out of memory in the optimizer update on {self.device}; "
                                  "the model and optimizer state do not fit") from exc
            return "oom", detail
        raise exc

    def _recover(self, failure: str, detail: str, window: list, cpu_batch: bool) -> bool:
        """Act on a classified failure; returns whether the next attempt runs on the CPU."""
        if failure == "compile":
            self._compiled = False
            self._train_model = self.strategy.wrap(self.model)
            self._event("compile_fallback", f"compiled step failed ({detail}); continuing "
                        "eager (uncompiled) for the rest of the run")
            return cpu_batch
        if failure == "device_lost":
            self._move_to_cpu(detail)  # raises _Rewind
        size_before = self._micro.size or max(recovery.batch_len(b) for b in window)
        new = self._micro.shrink(window)
        if new is not None:
            self._event("oom_split", f"out of memory at micro-batch {size_before} on "
                        f"{self.device} ({detail}); re-running the same batch as micro-batches "
                        f"of {new} (same update); later steps keep {new}")
            return False
        if cpu_batch or not self.strategy.accelerator or self.strategy.owns_update:
            raise MemoryError(f"out of memory on {'the CPU' if cpu_batch else self.device} even "
                              f"with one sample per micro-batch ({detail}); use a smaller model "
                              "or input, or free memory used by other processes")
        self._event("cpu_batch", f"one sample does not fit on {self.device} ({detail}); this "
                    "batch runs on the CPU, the next goes back to the GPU")
        return True

    def _accumulate_on_cpu(self, window) -> torch.Tensor:
        """The per-batch fallback: forward/backward on the CPU, gradients back on the device."""
        cpu = torch.device("cpu")
        precision = Precision.choose(_cpu_precision(self._precision_arg), cpu)
        scale_value = self.scaler.get_scale()
        with recovery.on_cpu(self.model, self.device):
            total = self._accumulate(window, self.model, lambda t: t.to(cpu), precision,
                                     lambda loss: loss * scale_value)
        return total.to(self.device)

    def _move_to_cpu(self, detail: str) -> None:
        """Sticky device error: continue the whole run on the CPU from the last good state."""
        lost = self.device
        recovery.mark_lost(lost)
        snapshot = self._snapshot
        self._event("device_lost", f"{detail} — {lost} cannot be trusted again in this process. "
                    "Moving the run (model, optimizer state, scaler, EMA) to the CPU and "
                    f"continuing from the last good state (step {snapshot['position']['global_step']}"
                    "); steps will be slower")
        recovery.rebuild_on_cpu(self.model)
        if self.ema is not None:
            recovery.rebuild_on_cpu(self.ema)
        self.strategy = self.strategy.on_cpu()
        self.precision = Precision.choose(_cpu_precision(self._precision_arg), self.device)
        self.scaler = self.precision.scaler
        self._check_norm = not self.scaler.is_enabled()
        self._compiled = False
        self._train_model = self.strategy.wrap(self.model)
        self._restore(snapshot)
        self._micro = recovery.MicroBatches()  # the GPU's micro-batch size means nothing here
        raise _Rewind

    def _bad_loss(self, verdict: str, loss: float) -> None:
        """A skipped step: cut the LR; after ``patience`` in a row, restore the last good state."""
        self._lr_scale *= self.guard.lr_cut
        what = "non-finite loss or gradient" if verdict == "nonfinite" else \
            f"loss spike ({loss:.4g} vs running mean {self.guard._mean():.4g})"
        self._event("nonfinite_loss" if verdict == "nonfinite" else "loss_spike",
                    f"{what}: step skipped, learning rate x{self.guard.lr_cut} (now "
                    f"{self._lr_scale:.3g} of the schedule)")
        if self.guard.exhausted:
            lr_scale, snapshot = self._lr_scale, self._snapshot
            self._event("restore", f"{self.guard.patience} bad steps in a row: restoring the "
                        f"last good state (step {snapshot['position']['global_step']}) and keeping "
                        f"the lower learning rate ({lr_scale:.3g} of the schedule)")
            self._restore(snapshot)
            self._lr_scale = lr_scale
            self.guard.streak = 0
            raise _Rewind

    def _interrupted(self) -> str:
        """A KeyboardInterrupt inside a step: drop the step, keep the last good weights."""
        self.optimizer.zero_grad(set_to_none=True)
        if self._phase == "update":  # the optimizer may have been half-way through the update
            self._restore(self._snapshot)
            self._event("restore", "interrupted during the optimizer update: restored the last "
                        "good state (step " f"{self.global_step})")
        self._phase = "idle"
        return self._stop("interrupt", "interrupted: the current step was dropped")

    # ----------------------------------------------------------------------------- bookkeeping
    def _after_step(self, loss: float | None, val_loader) -> str | None:
        lr = self._current_lr()
        self._steps.append((self.global_step, self.epoch, math.nan if loss is None else loss, lr))
        secs = self._acc["seconds"]
        self._view.update({
            "epoch": self.epoch, "step": self._steps_done_in_epoch(), "global_step": self.global_step,
            "loss": math.nan if loss is None else loss, "lr": lr,
            "samples_per_s": self._acc["samples"] / secs if secs > 0 else 0.0,
            "elapsed_s": time.perf_counter() - self._run_started})
        # summed over ranks: a stop asked on any rank stops every rank after this same step
        interrupt, button = self.strategy.sum([float(self._interrupt.requested),
                                               float(self._view.stop_requested)])
        if interrupt:
            return self._stop("interrupt", "interrupted: stopping after the current step")
        if button:
            return self._stop("stop_button", "Stop clicked: stopping after the current step")
        if self.val_every and self.global_step % self.val_every == 0 and val_loader is not None:
            metrics = self._validate(val_loader)
            self.model.train()
            self._last_val = (self.global_step, metrics)
            self._view.update({"epoch": self.epoch, "step": self._steps_done_in_epoch(),
                               "global_step": self.global_step, "lr": lr, **metrics,
                               "loss": math.nan if loss is None else loss,
                               "samples_per_s": self._acc["samples"] / secs if secs else 0.0,
                               "elapsed_s": time.perf_counter() - self._run_started})
            if self._after_validation(metrics):
                return self._stop("early_stopping", None)
        if self.checkpoint_every and self.global_step % self.checkpoint_every == 0:
            self._save_last()
        elif (self.snapshot_every and self.global_step % self.snapshot_every == 0
              and (self.guard is None or self.guard.streak == 0)):
            self._snapshot = self.state_dict()
        return None

    def _stop(self, reason: str, message: str | None) -> str:
        if message:
            self._event(reason, message + (f"; checkpoint saved in {self.checkpoint_dir}"
                                           if self.checkpoint_dir else
                                           "; no checkpoint_dir, state kept in memory"))
        self._save_last()
        return reason

    def _end_epoch(self, metrics: dict) -> None:
        acc = self._acc
        peak = peak_bytes(self.device)
        kinds = sorted({e.kind for e in self.events[self._epoch_first_event:]})
        row = {
            "epoch": self.epoch, "step": self.global_step,
            "train_loss": acc["loss_sum"] / acc["loss_samples"] if acc["loss_samples"] else math.nan,
            **{c: float(metrics.get(c, math.nan)) for c in HISTORY_COLUMNS if c.startswith("val_")},
            "lr": self._current_lr(),
            "samples_per_s": acc["samples"] / acc["seconds"] if acc["seconds"] else math.nan,
            "peak_memory_mb": peak / 2**20 if peak is not None else math.nan,
            "time_s": acc["seconds"], "events": ",".join(kinds)}
        self._history.append(row)
        self._view.update({"epoch": self.epoch, "step": self._steps_done_in_epoch(),
                           "global_step": self.global_step, "loss": row["train_loss"],
                           "lr": row["lr"], "samples_per_s": row["samples_per_s"],
                           "elapsed_s": time.perf_counter() - self._run_started,
                           "epoch_end": True, **metrics})
        self.epoch += 1
        self.batches_done = 0
        self._acc = _new_acc()
        self._epoch_first_event = len(self.events)
        if self.checkpoint_dir is not None:
            self._save_last()
        else:
            self._snapshot = self.state_dict()

    def _after_validation(self, metrics: dict) -> bool:
        """Track the best weights; returns True when early stopping says stop."""
        value = metrics.get(self.monitor)
        if value is None or not math.isfinite(value):
            return False
        best = self._best["value"]
        sign = 1 if higher_is_better(self.monitor) else -1
        improved = best is None or sign * (value - best) > 0
        if improved:
            self._best.update(value=float(value), step=self.global_step, epoch=self.epoch, bad=0,
                              model=recovery.to_cpu(self._eval_model().state_dict()))
            if self.checkpoint_dir is not None and self.strategy.is_main:
                checkpoint.save({"kind": "best", "model": self._best["model"],
                                 "monitor": self.monitor, "value": float(value),
                                 "epoch": self.epoch, "global_step": self.global_step,
                                 "ema": self.ema is not None},
                                self.checkpoint_dir / checkpoint.BEST)
        else:
            self._best["bad"] += 1
        note = self.schedule.on_validation(improved)
        if note:
            self._event("lr_plateau", note)
        stop = bool(self.early_stopping and self._best["bad"] >= self.early_stopping)
        if self.strategy.agree(stop):  # every rank stops at the same validation
            self._event("early_stop", f"{self.monitor} did not improve for {self.early_stopping} "
                        f"validations (best {self._best['value']:.4g} at step "
                        f"{self._best['step']})")
            return True
        return False

    def _finish(self, stopped: str | None, failed: bool) -> None:
        """Restore best/EMA weights, close the view (the last checkpoint is already written)."""
        self._stopped = stopped
        if failed:
            self._save_crash()
        elif self.early_stopping and self._best["model"] is not None:
            self.model.load_state_dict(self._best["model"])
            self._event("best_restored", f"model holds the best weights ({self.monitor} "
                        f"{self._best['value']:.4g} at step {self._best['step']})")
        elif self.ema is not None:
            self.model.load_state_dict(self.ema.module.state_dict())
            self._event("ema_weights", "model holds the EMA weights (raw weights are in "
                        "last.pt)" if self.checkpoint_dir else "model holds the EMA weights")
        self._view.end(self.summary(stopped))

    def _save_crash(self) -> None:
        """An unexpected error: keep the last good state on disk so the run can resume."""
        if self.checkpoint_dir is None or self._snapshot is None or not self.strategy.is_main:
            return
        if not self.strategy.file_ready(self._snapshot):  # DeepSpeed: partitions not gathered
            print("hybridnb: training failed; the last checkpoint written (in "
                  f"{self.checkpoint_dir}) is kept: fit(..., resume=True) continues from there",
                  file=sys.stderr)
            return
        path = checkpoint.save(self._snapshot, self.checkpoint_dir / checkpoint.LAST,
                               keep_previous=True)
        print(f"hybridnb: training failed; the last good state (step "
              f"{self._snapshot['position']['global_step']}) is in {path}; "
              "fit(..., resume=True) continues from there", file=sys.stderr)

    def summary(self, stopped: str | None = None) -> dict:
        """What the view's end() and report() show."""
        hist = self.history
        elapsed = time.perf_counter() - self._run_started if self._run_started else 0.0
        secs = float(hist["time_s"].sum()) if len(hist) else self._acc["seconds"]
        samples = self._samples_total()
        peak = hist["peak_memory_mb"].max() if len(hist) else math.nan
        return {"history": hist, "elapsed_s": elapsed,
                "samples_per_s": samples / secs if secs else math.nan,
                "peak_memory_bytes": int(peak * 2**20) if peak == peak else None,
                "best": {"monitor": self.monitor, "value": self._best["value"],
                         "step": self._best["step"], "epoch": self._best["epoch"]},
                "events": list(self.events), "device": str(self.device),
                "precision": self.precision.name, "stopped": stopped}

    # ----------------------------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(self, data) -> dict:
        """Loss and regression metrics (rmse, nrmse = rmse / std(y), mae, r2) on ``data``."""
        loader = self._loader(data, shuffle=False, what="data")
        pred, target, loss = self._predict_loader(loader, with_targets=True)
        out = {"loss": loss}
        if target is not None and target.dtype.kind == "f" and pred.size == target.size:
            out.update(regression_metrics(target, pred))
        return out

    @torch.no_grad()
    def predict(self, data) -> np.ndarray:
        """Predictions as a numpy array: shape (N,) for one output per sample, else (N, k)."""
        loader = self._loader(data, shuffle=False, what="data")
        return self._predict_loader(loader, with_targets=False)[0]

    def _validate(self, loader) -> dict:
        metrics = self.evaluate(loader)
        return {"val_" + k: v for k, v in metrics.items()}

    def _predict_loader(self, loader, with_targets: bool):
        model = self._eval_model()
        was_training = model.training
        model.eval()
        preds, targets, loss_sum, n = [], [], 0.0, 0
        try:
            for batch in loader:
                if self._interrupt is not None and self.strategy.agree(self._interrupt.requested):
                    raise KeyboardInterrupt  # on every rank, before the same batch
                x = batch[0] if isinstance(batch, (tuple, list)) else batch
                with self.precision.autocast():
                    out = model(self.strategy.to_device(x))
                has_y = isinstance(batch, (tuple, list)) and len(batch) > 1
                if with_targets and has_y:
                    y = self.strategy.to_device(batch[1])
                    loss_sum += float(self._eval_loss(out, y)) * len(x)
                    n += len(x)
                    targets.append(self.strategy.gather(y.float().reshape(len(x), -1)).cpu())
                preds.append(self.strategy.gather(out.float().reshape(len(x), -1)).cpu())
        finally:
            model.train(was_training)
        if not preds:
            raise ValueError("no batches to predict on (empty data)")
        pred = torch.cat(preds).numpy()
        pred = pred[:, 0] if pred.shape[1] == 1 else pred
        target = None
        if targets:
            target = torch.cat(targets).numpy()
            target = target[:, 0] if target.shape[1] == 1 else target
        loss = self.strategy.sum([loss_sum, float(n)])
        return pred, target, (loss[0] / loss[1] if loss[1] else math.nan)

    def _eval_loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The loss without training-only reweighting, so validation losses stay comparable."""
        if isinstance(self.loss_fn, ReweightedHuber) and self.loss_fn.reweighting:
            return ReweightedHuber(self.loss_fn.delta)(out, y)
        return self.loss_fn(out, y)

    def _eval_model(self) -> torch.nn.Module:
        """During fit, validation scores the EMA weights when EMA is on; after fit, ``self.model``
        holds the weights fit chose (best or EMA), so evaluate/predict score exactly those."""
        fitting = self._interrupt is not None
        return self.ema.module if self.ema is not None and fitting else self.model

    # ----------------------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """Everything needed to continue exactly: weights, optimizer, schedule, scaler, EMA,
        position, RNG states, history and events (CPU copies; loads with weights_only=True)."""
        gen = getattr(self, "_train_gen", None)
        rng = self._pending_rng if self._pending_rng is not None else {
            **rng_state(), "loader": gen.get_state() if gen is not None else None}
        tensors = recovery.to_cpu({
            "model": self.model.state_dict(),
            "optimizer": self.strategy.optimizer_state(self.optimizer),
            "ema": None if self.ema is None else self.ema.state_dict(),
            "rng": rng,
            "epoch_start": self._epoch_start,
        })
        return {
            "kind": "last", **tensors,
            "schedule": self.schedule.state_dict(),
            "scaler": self.scaler.state_dict(),
            "guard": None if self.guard is None else self.guard.state_dict(),
            "lr_scale": float(self._lr_scale),
            "micro": self._micro.size,
            "position": {"epoch": self.epoch, "batches_done": self.batches_done,
                         "global_step": self.global_step},
            "acc": dict(self._acc),
            "history": [dict(r) for r in self._history],
            "steps": [list(s) for s in self._steps],
            "events": [e.to_dict() for e in self.events],
            "epoch_first_event": self._epoch_first_event,
            "best": dict(self._best),  # best["model"] is already a CPU copy
            "config": {"lr": self.lr, "epochs": self.epochs, "batch_size": self.batch_size,
                       "grad_accum": self.grad_accum, "seed": self.seed,
                       "model": type(self.model).__name__},
            "device": str(self.device), "precision": self.precision.name,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (a ``state_dict()`` or a checkpoint file's content)."""
        self._restore(state)
        self.events = [Event(**e) for e in state["events"]]
        self._epoch_first_event = int(state.get("epoch_first_event", 0))
        saved = state.get("config", {})
        old = (saved.get("batch_size"), saved.get("grad_accum"))
        if None not in old and old != (self.batch_size, self.grad_accum) and self.batches_done:
            samples = self.batches_done * old[0]
            self.batches_done = samples // self.batch_size // self.grad_accum * self.grad_accum
            self._notes.append(("resume", f"the checkpoint used batch_size={old[0]} x grad_accum="
                                f"{old[1]}, this run {self.batch_size} x {self.grad_accum}: the "
                                f"epoch continues after about {samples} samples, not bit for bit"))

    def _restore(self, state: dict) -> None:
        """Weights, optimizer, schedule, scaler, EMA, position and RNG (events are kept)."""
        self.model.load_state_dict(state["model"])
        self.strategy.load_optimizer_state(self.optimizer, state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])
        if self.scaler.is_enabled() and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        if self.ema is not None and state["ema"] is not None:
            self.ema.load_state_dict(state["ema"])
        if self.guard is not None and state["guard"] is not None:
            self.guard.load_state_dict(state["guard"])
        self._lr_scale = float(state["lr_scale"])
        self._micro.size = int(state["micro"]) if state.get("micro") else None
        pos = state["position"]
        self.epoch, self.batches_done = int(pos["epoch"]), int(pos["batches_done"])
        self.global_step = int(pos["global_step"])
        self._acc = dict(state["acc"])
        self._epoch_start = state["epoch_start"]
        self._pending_rng = state["rng"]
        self._history = [dict(r) for r in state["history"]]
        self._steps = [tuple(s) for s in state["steps"]]
        self._best = dict(state["best"])
        self.optimizer.zero_grad(set_to_none=True)

    def resume(self, path: str | Path) -> Trainer:
        """Load a checkpoint file (or the newest good one in a folder) now; the next ``fit``
        continues from it."""
        state, used, problems = _read_checkpoint(path)
        for p in problems:
            self._notes.append(("checkpoint_fallback", f"{p}; using {used} instead"))
        self.model.load_state_dict(state["model"])
        self._pending = state
        self._notes.append(("resume", f"resuming from {used} (epoch {state['position']['epoch']}, "
                            f"step {state['position']['global_step']})"))
        return self

    def _load_resume(self, resume) -> None:
        where = self.checkpoint_dir if resume is True else Path(resume)
        if where is None:
            raise ValueError("fit(resume=True) needs checkpoint_dir=; or pass resume=<path>")
        if resume is True and not any((where / n).exists()
                                      for n in (checkpoint.LAST, checkpoint.PREVIOUS)):
            self._notes.append(("resume", f"no checkpoint in {where} yet: starting from scratch"))
            return
        self.resume(where)

    def _save_last(self) -> None:
        self._snapshot = self.strategy.for_file(self.state_dict())
        if self.checkpoint_dir is not None and self.strategy.is_main:
            checkpoint.save(self._snapshot, self.checkpoint_dir / checkpoint.LAST,
                            keep_previous=True)

    def _reset_run(self) -> None:
        self.epoch = self.batches_done = self.global_step = 0
        self._acc = _new_acc()
        self._lr_scale = 1.0
        self._history: list[dict] = []
        self._steps: list[tuple] = []
        self._best = {"value": None, "step": None, "epoch": None, "bad": 0, "model": None}
        self._epoch_start = None
        self._pending_rng = None
        self._pending = getattr(self, "_pending", None)
        self._snapshot = None
        self._epoch_first_event = len(self.events)
        self._last_val: tuple[int | None, dict] = (None, {})
        self._run_started = 0.0
        self._interrupt = None
        self._phase = "idle"
        self._check_norm = not self.scaler.is_enabled()
        if self.guard is not None:
            self.guard.load_state_dict({"mean": 0.0, "good": 0, "streak": 0})

    # ----------------------------------------------------------------------------- data
    def _loader(self, data, shuffle: bool, what: str):
        """A DataLoader for ``data``: given loaders are used as they are; Datasets get the
        resumable batch order, a seeded generator and detect()'s loader settings."""
        data = as_dataset(data)
        if isinstance(data, DataLoader):
            shards = getattr(data.batch_sampler, "world_size", 1)  # 1: every rank sees all of it
            if shards != self.strategy.world_size:
                raise ValueError(f"{what}: pass the Dataset, not a DataLoader, when training with "
                                 f"{self.strategy.world_size} processes: the Trainer gives each "
                                 "process its shard of every batch")
            return data
        if len(data) == 0:
            raise ValueError(f"{what} dataset is empty")
        gen = torch.Generator()
        if self.seed is not None:
            gen.manual_seed(self.seed)
        else:
            gen.seed()  # a fresh random seed; its state is still saved in checkpoints
        sampler = self.strategy.batch_sampler(len(data), self.batch_size, shuffle, gen)
        kwargs = dict(self._loader_kwargs)
        if kwargs.get("num_workers", 0) == 0:
            kwargs.pop("persistent_workers", None)
            kwargs.pop("prefetch_factor", None)
        return DataLoader(data, batch_sampler=sampler, generator=gen,
                          worker_init_fn=worker_init_fn, **kwargs)

    def _batches(self, loader):
        """An iterator over the epoch's batches from ``batches_done`` on, with the RNG states a
        straight run would have at that point."""
        gen = getattr(loader, "generator", None)
        if self.batches_done == 0:
            if self._pending_rng is not None:
                set_rng_state(self._pending_rng)
                if gen is not None and self._pending_rng.get("loader") is not None:
                    gen.set_state(self._pending_rng["loader"])
                self._pending_rng = None
            self._epoch_start = {"torch": torch.get_rng_state(),
                                 "loader": gen.get_state() if gen is not None else None}
            return iter(loader)
        torch.set_rng_state(self._epoch_start["torch"])
        if gen is not None and self._epoch_start["loader"] is not None:
            gen.set_state(self._epoch_start["loader"])
        sampler = getattr(loader, "batch_sampler", None)
        if isinstance(sampler, ResumableBatchSampler):
            sampler.skip(self.batches_done)
            it = iter(loader)
        else:
            self._event("resume_skip", f"reading and skipping {self.batches_done} batches of this "
                        "epoch to reach the saved position (pass a Dataset to skip without "
                        "reading)")
            it = iter(loader)
            for _ in range(self.batches_done):
                next(it)
        if self._pending_rng is not None:
            set_rng_state(self._pending_rng)
            self._pending_rng = None
        return it

    def _plan(self, loader) -> None:
        """Epochs and batches per epoch for this fit (smoke mode caps both and says so)."""
        try:
            n_batches = len(loader)
        except TypeError as exc:
            raise TypeError("the training data needs a length (an IterableDataset without "
                            "__len__ is not supported)") from exc
        if n_batches == 0:
            raise ValueError("the training data gives no batches")
        epochs = self.epochs
        if self.steps_per_epoch:
            n_batches = min(n_batches, self.steps_per_epoch * self.grad_accum)
        if smoke():
            capped = min(epochs, SMOKE_EPOCHS), min(n_batches, SMOKE_STEPS * self.grad_accum)
            if capped != (epochs, n_batches):
                self._notes.append(("smoke", f"smoke mode (HYBRIDNB_SMOKE): {capped[0]} epochs of "
                                    f"at most {SMOKE_STEPS} steps instead of {epochs} x "
                                    f"{math.ceil(n_batches / self.grad_accum)}"))
            epochs, n_batches = capped
        self._epochs, self._batches_per_epoch = epochs, n_batches
        self._steps_per_epoch = math.ceil(n_batches / self.grad_accum)
        self._total_steps = epochs * self._steps_per_epoch

    def _steps_done_in_epoch(self) -> int:
        return math.ceil(self.batches_done / self.grad_accum)

    def _samples_total(self) -> int:
        return int(sum(r["samples_per_s"] * r["time_s"] for r in self._history
                       if r["samples_per_s"] == r["samples_per_s"]) + self._acc["samples"])

    # ----------------------------------------------------------------------------- setup pieces
    def _build_train_model(self) -> None:
        model, self._compiled = self.model, False
        if self.compile:
            mode = None if self.compile is True else self.compile
            try:
                if self.device.type == "cpu" and self.precision.name == "bf16":
                    import torch._inductor.config as inductor_config

                    # oneDNN's channels-last bf16 grouped convolution asks for ~110 GB on CPU
                    inductor_config.layout_optimization = False
                model, self._compiled = torch.compile(model, mode=mode), True
            except Exception as exc:  # compile is lazy; this catches a missing backend
                self._event("compile_fallback", f"torch.compile unavailable ({type(exc).__name__}"
                            f": {recovery.first_line(exc)}); training eager")
        self._train_model = self.strategy.wrap(model)

    @contextlib.contextmanager
    def _checkpointed_blocks(self):
        """Activation checkpointing of the model's top-level blocks for the duration of fit."""
        if not self.grad_checkpointing:
            yield
            return
        patched = _patch_checkpointing(self.model)
        if not patched:
            self._event("grad_checkpointing", "no top-level block with parameters and without "
                        "batch norm to checkpoint; running without")
        else:
            self._event("grad_checkpointing", f"recomputing activations of {len(patched)} blocks "
                        f"({', '.join(patched[:6])}{'...' if len(patched) > 6 else ''}) in backward")
        try:
            yield
        finally:
            for name in patched:
                del self.model.get_submodule(name).forward

    def _cap_memory(self, fraction: float) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_per_process_memory_fraction(fraction, self.device)
            self._notes.append(("memory_fraction", f"GPU memory capped at {fraction:.0%} of "
                                f"{self.device}"))
        else:
            self._notes.append(("memory_fraction", f"memory_fraction={fraction} has no effect on "
                                f"{self.device} (CUDA only)"))

    def _set_lr(self) -> None:
        factor = self.schedule.factor(self.global_step) * self._lr_scale
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"] * factor

    def _current_lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def _run_info(self) -> dict:
        return {"epochs": self._epochs, "steps_per_epoch": self._steps_per_epoch,
                "batch_size": self.batch_size, "device": str(self.device),
                "precision": self.precision.name, "model": type(self.model).__name__,
                "n_params": sum(p.numel() for p in self.model.parameters()),
                "monitor": self.monitor, "smoke": smoke()}

    def _event(self, kind: str, message: str) -> Event:
        ev = Event(kind, message, step=self.global_step, epoch=self.epoch)
        self.events.append(ev)
        view = getattr(self, "_view", None)
        if view is not None:
            view.event(ev)
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


# --------------------------------------------------------------------------------- helpers
def _new_acc() -> dict:
    return {"loss_sum": 0.0, "loss_samples": 0, "samples": 0, "seconds": 0.0}


def _as_pair(batch):
    """``(x, y)`` from a batch ``(x, y, *extras)`` (braindecode windows carry extras)."""
    if not isinstance(batch, (tuple, list)) or len(batch) < 2:
        raise ValueError("training batches must be (x, y) or (x, y, *extras); got "
                         f"{type(batch).__name__}" + (f" of length {len(batch)}"
                                                       if isinstance(batch, (tuple, list)) else ""))
    return batch[0], batch[1]


def _read(total: torch.Tensor, norm: torch.Tensor | None) -> tuple[float, float | None]:
    """Loss (and gradient norm) as floats with one device sync."""
    if norm is None:
        return float(total), None
    loss, grad_norm = torch.stack([total.float(), norm.float()]).tolist()
    return loss, grad_norm


def _detect():
    from hybridnb.hardware.detect import detect
    return detect()


def _resolve_device(device, hw, notes: list) -> torch.device:
    dev = hw.device if device == "auto" else torch.device(device)
    if dev.type != "cpu" and str(dev) in recovery.lost_devices():
        notes.append(("device_lost", f"{dev} failed earlier in this process; using the CPU"))
        return torch.device("cpu")
    return dev


def _make_strategy(strategy, device: torch.device):
    if strategy is None or isinstance(strategy, str):
        from hybridnb.dist.ddp import make_strategy  # "auto": DDP under torchrun / hn.launch

        return make_strategy(strategy, device) or SingleDevice(device)
    return strategy


def _loader_kwargs(given: dict | None, hw, device, resolved: torch.device) -> dict:
    if given is not None:
        return dict(given)
    if device == "auto" and hw is not None:
        return dict(hw.dataloader_kwargs())
    return {"num_workers": 0, "pin_memory": resolved.type == "cuda"}


def _cpu_precision(asked: str) -> str:
    """What to run on the CPU after leaving the GPU: bf16 only when it was asked for."""
    return "bf16" if asked == "bf16" else "fp32"


def _freeze(model: torch.nn.Module, patterns: list[str] | None) -> list[str]:
    """Set requires_grad=False on parameters whose name matches a pattern; returns their names."""
    if not patterns:
        return []
    if isinstance(patterns, str):
        patterns = [patterns]
    names = [n for n, _ in model.named_parameters()]
    frozen = []
    for pattern in patterns:
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            raise ValueError(f"freeze pattern {pattern!r} matches no parameter of "
                             f"{type(model).__name__} (names look like {names[:4]})")
        frozen.extend(hits)
    for name, p in model.named_parameters():
        if name in frozen:
            p.requires_grad_(False)
    return sorted(set(frozen))


def _make_optimizer(optimizer, params, lr: float, weight_decay: float):
    if optimizer is None or optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay)
    if isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("pass optimizer as a callable params -> Optimizer (e.g. "
                        "lambda p: torch.optim.SGD(p, lr=0.1)) so frozen parameters are left out")
    if callable(optimizer):
        return optimizer(params)
    raise ValueError(f"optimizer={optimizer!r}: use None, 'adamw', 'adam', 'sgd' or a callable")


def _patch_checkpointing(model: torch.nn.Module) -> list[str]:
    """Wrap the forward of each top-level child that has parameters (and no batch norm, whose
    running statistics would be updated twice) in torch.utils.checkpoint."""
    from torch.utils.checkpoint import checkpoint as ckpt

    patched = []
    for name, child in model.named_children():
        has_params = any(True for _ in child.parameters())
        has_bn = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in child.modules())
        if not has_params or has_bn:
            continue
        original = child.forward

        def forward(*args, _f=original, **kwargs):
            if torch.is_grad_enabled():
                return ckpt(_f, *args, use_reentrant=False, **kwargs)
            return _f(*args, **kwargs)

        child.forward = forward
        patched.append(name)
    return patched


def _read_checkpoint(path) -> tuple[dict, Path, list[str]]:
    path = Path(path)
    if path.is_dir():
        return checkpoint.load_latest(path)
    try:
        return checkpoint.load(path), path, []
    except checkpoint.CheckpointError as first:
        prev = path.with_name(f"{path.stem}.prev{path.suffix}")
        if prev.exists():
            return checkpoint.load(prev), prev, [str(first)]
        raise


def _check_args(**a) -> None:
    """Every argument check in one place, before any work; messages name argument and value."""
    if not isinstance(a["model"], torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(a['model']).__name__}")
    if not (isinstance(a["lr"], (int, float)) and a["lr"] > 0):
        raise ValueError(f"lr={a['lr']!r} must be a positive number")
    if not (isinstance(a["epochs"], int) and a["epochs"] >= 1):
        raise ValueError(f"epochs={a['epochs']!r} must be an integer >= 1")
    for name in ("batch_size", "grad_accum", "val_every", "checkpoint_every", "snapshot_every",
                 "steps_per_epoch", "early_stopping"):
        v = a[name]
        if v is not None and not (isinstance(v, int) and v >= 1):
            raise ValueError(f"{name}={v!r} must be None or an integer >= 1")
    if a["clip_grad"] is not None and not a["clip_grad"] > 0:
        raise ValueError(f"clip_grad={a['clip_grad']!r} must be None or > 0")
    if a["compile"] not in COMPILE_MODES:
        raise ValueError(f"compile={a['compile']!r} must be one of {COMPILE_MODES}")
    if a["on_gpu_error"] not in ("recover", "raise"):
        raise ValueError(f"on_gpu_error={a['on_gpu_error']!r} must be 'recover' or 'raise'")
    mf = a["memory_fraction"]
    if mf is not None and not 0 < mf <= 1:
        raise ValueError(f"memory_fraction={mf!r} must be in (0, 1]")
    if not isinstance(a["monitor"], str):
        raise ValueError(f"monitor={a['monitor']!r} must be a metric name such as 'val_loss'")
