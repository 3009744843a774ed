"""Wall-clock throughput, time spent waiting for data, and FLOP/s against the device's peak.

A step timer alone flatters a run: on an H100 the Trainer once reported 41-53k samples/s for a
model whose wall clock gave 14-18k, because collating each batch — outside the timed step — was
the bottleneck. ``ThroughputMonitor`` counts the wall clock between measuring points (data
loading included), the share of it spent waiting for the next batch, and a compute-only rate
labelled as such. The device is synchronised only at the measuring points (the end of warm-up,
every ``every`` steps, and ``summary()``), so measuring does not slow the loop.

>>> mon = ThroughputMonitor(device, flops_per_sample=step.count_flops(model, (x,)) / len(x))
>>> for x, y in mon.batches(loader):           # times each fetch as waiting for data
...     step(x, y)
...     mon.step_done(len(x))
>>> mon.summary()   # samples_per_s, data_wait_pct, compute_samples_per_s, tflops, mfu, ...

MFU (model FLOPs utilisation) is the FLOPs the model needs divided by what the device could do in
the same time at its dense peak for the precision in use. It is not NVML's "utilisation", which is
the share of time any kernel was running: an H100 read 97-100% busy at 2% of its bf16 peak.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterable, Iterator

import torch

from hybridnb.measure.timing import synchronize

DATA_BOUND_PCT = 50.0  # waiting for data above this share of wall time: the run is data-bound

# Dense peak TFLOP/s by precision, from the vendors' data sheets (without structured sparsity).
# tf32: fp32 tensors on tensor cores (cuDNN's default for convolutions on Ampere and later).
# Order matters: the first pattern that matches the device's name wins.
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    (r"H100.*PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0}),
    (r"H100(?!.*NVL)", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0}),  # SXM
    (r"H200", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0}),
    (r"A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    (r"L40S", {"bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6}),
    (r"\bL4\b", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    (r"\bA10\b", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    (r"\bT4\b", {"fp16": 65.0, "fp32": 8.1}),
    (r"V100", {"fp16": 125.0, "fp32": 15.7}),
]


def peak_tflops(device_name: str, precision: str) -> float | None:
    """The dense peak (TFLOP/s) of a GPU by its name for ``precision``; None when not known."""
    for pattern, peaks in PEAK_TFLOPS:
        if re.search(pattern, device_name):
            return peaks.get(precision)
    return None


def peak_key(precision: str) -> str:
    """The peak-table column for a training precision: fp32 counts as tf32 where torch allows it."""
    if precision == "fp32" and (torch.backends.cuda.matmul.allow_tf32
                                or torch.backends.cudnn.allow_tf32):
        return "tf32"
    return precision


class ThroughputMonitor:
    """Samples/s by the wall clock, data-wait share, FLOP/s and MFU for a training loop.

    Iterate the batches through ``batches(loader)`` (it times each fetch as waiting), and call
    ``step_done(n_samples)`` after each step. The first ``warmup_steps`` steps (compiling, cuDNN
    autotuning, loader start-up) are not counted. ``summary()`` gives the numbers over the steps
    since warm-up or the last ``reset()``.

    ``flops_per_sample``: from ``hybridnb.train.step.count_flops`` (divide by the batch size); ``precision``: the
    training precision, for the peak; ``peak`` (TFLOP/s) overrides the table.
    """

    def __init__(self, device: torch.device | str = "cpu", *, warmup_steps: int = 2,
                 every: int = 20, flops_per_sample: float | None = None,
                 precision: str = "fp32", peak: float | None = None) -> None:
        if warmup_steps < 0 or every < 1:
            raise ValueError(f"ThroughputMonitor: warmup_steps={warmup_steps} must be >= 0 and "
                             f"every={every} >= 1")
        self.device = torch.device(device)
        self.warmup_steps, self.every = warmup_steps, every
        self.flops_per_sample = flops_per_sample
        self.precision = precision
        if peak is None and self.device.type == "cuda":
            peak = peak_tflops(torch.cuda.get_device_name(self.device), peak_key(precision))
        self.peak = peak
        self._steps = 0  # all steps, warm-up included
        self._start: float | None = None  # the window's first measuring point
        # last measuring point: (time, samples, steps, seconds waiting, seconds paused)
        self._point = (0.0, 0, 0, 0.0, 0.0)
        self._samples = self._counted = 0
        self._wait = self._paused = 0.0
        if warmup_steps == 0:
            self.reset()

    # -- the loop's calls ------------------------------------------------------------------
    def step_done(self, n_samples: int) -> None:
        """A step on ``n_samples`` samples was queued (the device is synchronised only every
        ``every`` counted steps)."""
        self._steps += 1
        if self._start is None:
            if self._steps >= self.warmup_steps:
                self.reset()
            return
        self._samples += int(n_samples)
        self._counted += 1
        if self._counted % self.every == 0:
            self._measure()

    def batches(self, iterable: Iterable) -> Iterator:
        """Yield from ``iterable``, timing each fetch as waiting for data. When the loop over
        them ends (exhausted, or left with ``break``/``return``), so does the window
        (``close``): what the caller does next, validating, is never counted."""
        it = iter(iterable)
        try:
            while True:
                t0 = time.perf_counter()
                try:
                    batch = next(it)
                except StopIteration:
                    return
                self._add_wait(time.perf_counter() - t0)
                yield batch
        finally:
            self.close()

    def close(self) -> None:
        """The training loop ended: a measuring point now, so that a later ``summary()`` does
        not stretch the window over what came after (validation, checkpoint writes)."""
        if self._start is not None and self._counted != self._point[2]:
            self._measure()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Leave the time inside out of the wall clock (validation, checkpoint writes between
        training steps). Counted apart, so no device synchronise is needed here."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self._start is not None:
                self._paused += time.perf_counter() - t0

    def reset(self) -> None:
        """Start a new window now (after a synchronise): counts from here on."""
        synchronize(self.device)
        now = time.perf_counter()
        self._start = now
        self._samples = self._counted = 0
        self._wait = self._paused = 0.0
        self._point = (now, 0, 0, 0.0, 0.0)

    # -- the numbers -----------------------------------------------------------------------
    def summary(self, measure: bool = True) -> dict:
        """The window's numbers (a synchronise first when steps ran since the last point).

        samples_per_s: wall clock, waiting included; data_wait_pct: % of that time spent waiting
        for batches; compute_samples_per_s: samples over the time not waiting (compute-only, not
        what the run achieves); tflops: achieved model TFLOP/s by the wall clock; mfu: tflops over
        the device's dense peak for the precision (None when either is unknown); data_bound:
        waiting took more than DATA_BOUND_PCT % of the time. ``measure=False`` reports the last
        measuring point without synchronising the device (for per-step displays).
        """
        if measure and self._start is not None and self._counted != self._point[2]:
            self._measure()
        t, samples, steps, wait, paused = self._point
        wall = t - self._start - paused if self._start is not None else 0.0
        rate = samples / wall if wall > 0 else None
        wait_pct = 100.0 * wait / wall if wall > 0 else None
        busy = wall - wait
        tflops = (rate * self.flops_per_sample / 1e12
                  if rate is not None and self.flops_per_sample else None)
        return {
            "samples_per_s": rate,
            "data_wait_pct": wait_pct,
            "compute_samples_per_s": samples / busy if busy > 0 else None,
            "tflops": tflops,
            "mfu": tflops / self.peak if tflops is not None and self.peak else None,
            "peak_tflops": self.peak,
            "precision": self.precision,
            "data_bound": bool(wait_pct is not None and wait_pct > DATA_BOUND_PCT),
            "steps": steps,
            "samples": samples,
            "seconds": wall,
        }

    def _add_wait(self, seconds: float) -> None:
        if self._start is not None:
            self._wait += seconds

    def _measure(self) -> None:
        synchronize(self.device)
        self._point = (time.perf_counter(), self._samples, self._counted, self._wait,
                       self._paused)
