"""What a person watching sees: the live view, the step and epoch rows, the epoch's throughput,
and the summary at the end.

Speeds are wall clock (``measure.throughput.ThroughputMonitor``): ``samples_per_s`` over the
epoch's training loop (waiting for data included; validation and checkpoint writes paused out;
a fit's first two steps not counted), ``data_wait_pct`` the share spent waiting for a batch,
``compute_samples_per_s`` the rate without it, and ``mfu`` the model's FLOP/s over the GPU's
dense peak (NVML's "utilisation" read 100% at 2% of an H100's peak). Epochs count from 0.
"""

from __future__ import annotations

import math
import time

import pandas as pd
import torch

from hybridnb.events import EpochRow, Event
from hybridnb.live import View
from hybridnb.measure.memory import peak_bytes
from hybridnb.measure.throughput import ThroughputMonitor
from hybridnb.train.bus import Ended, EpochEnded, Started, StepEnded, Validated
from hybridnb.train.state import HISTORY_COLUMNS, RunState

METRICS = ("val_loss", "val_rmse", "val_nrmse", "val_mae", "val_r2")
SPEEDS = ("samples_per_s", "data_wait_pct", "compute_samples_per_s", "mfu")


class Progress:
    """The view (silent in an isolated worker), the epoch's throughput window, the step and
    epoch events with their rows, and ``hear``: the view's listener on the bus."""

    def __init__(self) -> None:
        self.view = View()  # silent until a fit starts
        self.started = 0.0
        self._monitor: ThroughputMonitor | None = None  # each epoch's (new_epoch)

    def new_epoch(self, device: torch.device, warmup: bool, flops_per_sample: float | None,
                  precision: str) -> ThroughputMonitor:
        """The epoch's throughput window (a fit's first two steps are warm-up)."""
        self._monitor = ThroughputMonitor(device, warmup_steps=2 if warmup else 0,
                                          flops_per_sample=flops_per_sample,
                                          precision=precision)
        return self._monitor

    def speeds(self) -> dict:
        """The epoch's speeds at the monitor's last measuring point (no device sync)."""
        s = self._monitor.summary(measure=False)
        return {**{k: math.nan if s[k] is None else s[k] for k in SPEEDS},
                "data_bound": s["data_bound"]}

    def row(self, state: RunState, grad_accum: int, lr: float, **extra) -> dict:
        """What the view draws after a step (``extra``: the step's loss, validation metrics)."""
        return {"epoch": state.epoch, "step": math.ceil(state.batches_done / grad_accum),
                "global_step": state.global_step, "lr": lr, "train_loss": state.acc.mean(),
                **self.speeds(), "elapsed_s": time.perf_counter() - self.started, **extra}

    def epoch_ended(self, state: RunState, lr: float, metrics: dict, device: torch.device,
                    grad_accum: int) -> EpochEnded:
        """The epoch's history row appended to ``state.history`` (the task's own metrics among
        ``HISTORY_COLUMNS`` too), and the event with the row the view draws."""
        peak = peak_bytes(device)
        seconds = self._monitor.summary()["seconds"]
        kinds = sorted({e.kind for e in state.events[state.epoch_first_event:]})
        row = {"epoch": state.epoch, "step": state.global_step, "train_loss": state.acc.mean(),
               **{c: float(metrics.get(c, math.nan)) for c in METRICS},
               "lr": lr, **{k: v for k, v in self.speeds().items() if k in SPEEDS},
               "peak_memory_mb": peak / 2**20 if peak is not None else math.nan,
               "time_s": seconds, "events": ",".join(kinds)}
        row.update({k: float(v) for k, v in metrics.items()
                    if k in HISTORY_COLUMNS and k not in row})
        view_row = EpochRow(self.row(state, grad_accum, lr, loss=row["train_loss"],
                                     epoch_end=True, **metrics))
        state.history.append(row)
        return EpochEnded(state.epoch, state.global_step, state.history, view_row)

    def hear(self, event) -> None:
        if isinstance(event, (StepEnded, Validated, EpochEnded)):
            self.view.update(event.row)
        elif isinstance(event, Event):
            self.view.event(event)
        elif isinstance(event, Started):
            self.started = time.perf_counter()
            self.view.start(event.run)
        elif isinstance(event, Ended):
            self.view.end(event.summary)

    def summary(self, state: RunState, monitor: str, device, precision: str,
                stopped=None) -> dict:
        """What the view's end() and report() show (speeds are wall clock, see the module)."""
        hist = pd.DataFrame(state.history, columns=HISTORY_COLUMNS)
        elapsed = time.perf_counter() - self.started if self.started else 0.0
        secs = float(hist["time_s"].sum()) if len(hist) else 0.0
        samples = int((hist["samples_per_s"] * hist["time_s"]).sum())  # NaN speeds left out
        peak = hist["peak_memory_mb"].max() if len(hist) else math.nan
        best = state.best
        return {"history": hist, "elapsed_s": elapsed,
                "samples_per_s": samples / secs if secs else math.nan,
                "peak_memory_bytes": int(peak * 2**20) if peak == peak else None,
                "best": {"monitor": monitor, "value": best.value, "step": best.step,
                         "epoch": best.epoch},
                "events": list(state.events), "device": str(device), "precision": precision,
                "stopped": stopped if stopped is not None else state.stopped}
