"""What the loop records between steps: the live view, the step and epoch rows of the history,
validation with best weights and early stopping, stopping, and the end of a fit.

A mixin of ``Trainer`` (the class is split by concern so the loop stays on one screen). Speeds
come from ``measure.throughput.ThroughputMonitor`` and are wall clock: ``samples_per_s`` divides
the epoch's samples by the time its training loop took (waiting for data, the step and this
bookkeeping; validation and checkpoint writes are left out; the first two steps of a fit,
compiling and warming up, are not counted), ``data_wait_pct`` is the share of that time spent
waiting for the next batch, ``compute_samples_per_s`` (labelled as such) the rate without the
waiting, and ``mfu`` the model's FLOP/s over the GPU's dense peak for the precision (NVML's
"utilisation" is only the share of time any kernel ran: an H100 read 100% at 2% of its peak).
One epoch convention everywhere: epochs count from 0, as in ``history["epoch"]``.
"""

from __future__ import annotations

import math
import os
import time

from hybridnb.env import smoke
from hybridnb.live import make_view
from hybridnb.measure.memory import peak_bytes
from hybridnb.measure.throughput import ThroughputMonitor
from hybridnb.train import checkpoint, recovery
from hybridnb.train.metrics import higher_is_better
from hybridnb.train.worker_fit import ChannelView


class Progress:
    """The view, history rows, validation and early stopping, stopping and finishing."""

    def _start_view(self, blocks: list[str], started: bool = False) -> None:
        """The view for this fit (in an isolated worker: the channel to the kernel's view);
        ``started``: the kernel's view already runs (continuing after the worker was lost)."""
        self._run_started = getattr(self, "_run_started", 0.0) if started else time.perf_counter()
        if not started:
            self._view = ChannelView(self._channel) if self._channel is not None else \
                make_view(self.live) if self.strategy.is_main else make_view(False)
            self._view.start(self._run_info())
        for kind, message in self._notes:
            self.event(kind, message)
        self._notes = []
        if self.grad_checkpointing:
            self.event("grad_checkpointing", (
                f"recomputing activations of {len(blocks)} blocks ({', '.join(blocks[:6])}"
                f"{'...' if len(blocks) > 6 else ''}) in backward") if blocks else (
                "no top-level block with parameters and without batch norm to checkpoint; "
                "running without"))

    def _run_info(self) -> dict:
        return {"epochs": self._epochs, "steps_per_epoch": self._steps_per_epoch,
                "batch_size": self.batch_size, "device": str(self.device),
                "precision": self.precision.name, "model": type(self.model).__name__,
                "n_params": sum(p.numel() for p in self.model.parameters()),
                "monitor": self.monitor, "smoke": smoke(), "pid": os.getpid()}

    def _new_monitor(self) -> ThroughputMonitor:
        """The epoch's throughput window (the fit's first two steps are warm-up)."""
        first = self.state.global_step == getattr(self, "_fit_first_step", -1)
        return ThroughputMonitor(self.device, warmup_steps=2 if first else 0,
                                 flops_per_sample=getattr(self, "_flops", None),
                                 precision=self.precision.name)

    def _speeds(self) -> dict:
        """The epoch's speeds at the monitor's last measuring point (no device sync here)."""
        s = self._monitor.summary(measure=False)
        speeds = {k: math.nan if s[k] is None else s[k]
                  for k in ("samples_per_s", "data_wait_pct", "compute_samples_per_s", "mfu")}
        return {**speeds, "data_bound": s["data_bound"]}

    def _view_row(self, **extra) -> dict:
        state = self.state
        return {"epoch": state.epoch, "step": math.ceil(state.batches_done / self.grad_accum),
                "global_step": state.global_step, "lr": self._current_lr(),
                "train_loss": state.train_loss(), **self._speeds(),
                "elapsed_s": time.perf_counter() - self._run_started, **extra}

    def _current_lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def _record_step(self, loss: float | None) -> None:
        """Keep the step's row and show it."""
        loss = math.nan if loss is None else loss
        self.state.steps.append((self.state.global_step, self.state.epoch, loss,
                                 self._current_lr()))
        self._view.update(self._view_row(loss=loss))

    def _between_steps(self, val_loader) -> str | None:
        """Stop requests, validation every ``val_every`` steps, checkpoints and snapshots."""
        state = self.state
        # summed over ranks: a stop asked on any rank stops every rank after this same step
        interrupt, button = self.strategy.sum([float(self._interrupt.requested),
                                               float(self._view.stop_requested)])
        if interrupt:
            return self._stop("interrupt", "interrupted: stopping after the current step")
        if button:
            return self._stop("stop_button", "Stop clicked: stopping after the current step")
        if self.val_every and state.global_step % self.val_every == 0 and val_loader is not None:
            metrics = self._validate(val_loader)
            self.model.train()
            state.last_val = (state.global_step, metrics)
            self._view.update(self._view_row(loss=state.steps[-1][2], **metrics))
            if self._after_validation(metrics):
                return self._stop("early_stopping", None)
        if self.checkpoint_every and state.global_step % self.checkpoint_every == 0:
            self._save_last()
        elif (self.snapshot_every and state.global_step % self.snapshot_every == 0
              and (self.guard is None or self.guard.streak == 0)):
            self._keep(self.state_dict())
        return None

    def _stop(self, reason: str, message: str | None) -> str:
        if message:
            self.event(reason, message + (f"; checkpoint saved in {self.checkpoint_dir}"
                                           if self.checkpoint_dir else
                                           "; no checkpoint_dir, state kept in memory"))
        self._save_last()
        return reason

    def _validate(self, loader) -> dict:
        return {"val_" + k: v for k, v in self.evaluate(loader).items()}

    def _validate_epoch(self, val_loader) -> tuple[dict, bool]:
        """The epoch's validation (reused when ``val_every`` just ran); whether to stop."""
        if val_loader is None:
            return {}, False
        if self.state.last_val[0] == self.state.global_step:
            return self.state.last_val[1], False
        metrics = self._validate(val_loader)
        return metrics, self._after_validation(metrics)

    def _end_epoch(self, metrics: dict) -> None:
        state = self.state
        peak = peak_bytes(self.device)
        window = self._monitor.summary()
        speeds = self._speeds()
        row = {"epoch": state.epoch, "step": state.global_step, "train_loss": state.train_loss(),
               **{c: float(metrics.get(c, math.nan)) for c in
                  ("val_loss", "val_rmse", "val_nrmse", "val_mae", "val_r2")},
               "lr": self._current_lr(), "samples_per_s": speeds["samples_per_s"],
               "data_wait_pct": speeds["data_wait_pct"],
               "compute_samples_per_s": speeds["compute_samples_per_s"], "mfu": speeds["mfu"],
               "peak_memory_mb": peak / 2**20 if peak is not None else math.nan,
               "time_s": window["seconds"], "events": state.epoch_events()}
        state.history.append(row)
        self._view.update(self._view_row(loss=row["train_loss"], epoch_end=True, **metrics))
        state.end_epoch()
        if self.checkpoint_dir is not None:
            self._save_last()
        else:
            self._keep(self.state_dict())

    def _after_validation(self, metrics: dict) -> bool:
        """Track the best weights; returns True when early stopping says stop."""
        best = self.state.best
        self._check_validation(metrics)
        value = metrics.get(self.monitor)
        if value is None or not math.isfinite(value):
            return False
        sign = 1 if higher_is_better(self.monitor) else -1
        improved = best["value"] is None or sign * (value - best["value"]) > 0
        if improved:
            best.update(value=float(value), step=self.state.global_step, epoch=self.state.epoch,
                        bad=0, model=recovery.to_cpu(self._eval_model().state_dict()))
            if self.checkpoint_dir is not None and self.strategy.is_main:
                checkpoint.save({"kind": "best", "model": best["model"], "monitor": self.monitor,
                                 "value": float(value), "epoch": self.state.epoch,
                                 "global_step": self.state.global_step,
                                 "ema": self.ema is not None},
                                self.checkpoint_dir / checkpoint.BEST)
        else:
            best["bad"] += 1
        note = self.schedule.on_validation(improved)
        if note:
            self.event("lr_plateau", note)
        stop = bool(self.early_stopping and best["bad"] >= self.early_stopping)
        if self.strategy.agree(stop):  # every rank stops at the same validation
            self.event("early_stop", f"{self.monitor} did not improve for "
                        f"{self.early_stopping} validations (best {best['value']:.4g} at epoch "
                        f"{best['epoch']}, step {best['step']})")
            return True
        return False

    def _check_validation(self, metrics: dict) -> None:
        """The first validation: ``monitor`` must exist; non-finite targets are said once."""
        if self.monitor not in metrics:
            raise ValueError(f"monitor={self.monitor!r} is not a validation metric; the "
                             f"validation gives {sorted(metrics)}")
        bad = metrics.get("val_nonfinite_targets")
        if bad and not any(e.kind == "nonfinite_targets" for e in self.state.events):
            self.event("nonfinite_targets", f"{int(bad)} validation samples have non-finite "
                        "targets: they are left out of val_loss and the metrics")

    def _finish(self, stopped: str | None, failed: bool) -> None:
        """Restore best/EMA weights, close the view (the last checkpoint is already written)."""
        self.state.stopped = stopped
        best = self.state.best
        if failed:
            self._save_crash()
        elif self.early_stopping and best["model"] is not None:
            self.model.load_state_dict(best["model"])
            self.event("best_restored", f"model holds the best weights ({self.monitor} "
                        f"{best['value']:.4g} at epoch {best['epoch']}, step {best['step']})")
        elif self.ema is not None:
            self.model.load_state_dict(self.ema.module.state_dict())
            self.event("ema_weights", "model holds the EMA weights (raw weights are in "
                        "last.pt)" if self.checkpoint_dir else "model holds the EMA weights")
        self._view.end(self.summary(stopped))

    def summary(self, stopped: str | None = None) -> dict:
        """What the view's end() and report() show (speeds are wall clock, see the module)."""
        hist = self.history
        started = getattr(self, "_run_started", 0.0)
        elapsed = time.perf_counter() - started if started else 0.0
        secs = float(hist["time_s"].sum()) if len(hist) else 0.0
        peak = hist["peak_memory_mb"].max() if len(hist) else math.nan
        best = self.state.best
        return {"history": hist, "elapsed_s": elapsed,
                "samples_per_s": self.state.samples_total() / secs if secs else math.nan,
                "peak_memory_bytes": int(peak * 2**20) if peak == peak else None,
                "best": {"monitor": self.monitor, "value": best["value"], "step": best["step"],
                         "epoch": best["epoch"]},
                "events": list(self.events), "device": str(self.device),
                "precision": self.precision.name,
                "stopped": stopped if stopped is not None else self.state.stopped}

