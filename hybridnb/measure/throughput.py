"""Wall-clock throughput, time spent waiting for data, and FLOP/s against the device's peak.

A step timer alone flatters a run: on an H100 the Trainer once reported 41-53k samples/s where
the wall clock gave 14-18k (collating batches, outside the timed step, was the bottleneck). So
``ThroughputMonitor`` counts the wall clock, data loading included, synchronising the device only
at measuring points. MFU is the model's FLOPs over the device's dense peak in the same time, not
NVML's "utilisation" (an H100 read 97-100% busy at 2% of its bf16 peak).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterable, Iterator

import torch

from hybridnb.measure.timing import synchronize

DATA_BOUND_PCT = 50.0  # waiting for data above this share of wall time: the run is data-bound

# Dense peak TFLOP/s by precision (vendors' data sheets, no sparsity); the first match wins.
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    (r"H100.*PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0}),
    (r"H100(?!.*NVL)|H200", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0}),  # SXM
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


class ThroughputMonitor:
    """Samples/s by the wall clock, data-wait share, FLOP/s and MFU for a training loop: iterate
    through ``batches(loader)`` and call ``step_done(n_samples)`` after each step; the first
    ``warmup_steps`` (compiling, autotuning, loader start-up) are not counted."""

    def __init__(self, device: torch.device | str = "cpu", *, warmup_steps: int = 2,
                 every: int = 20, flops_per_sample: float | None = None,
                 precision: str = "fp32") -> None:
        self.device = torch.device(device)
        self.warmup_steps, self.every = warmup_steps, every
        self.flops_per_sample = flops_per_sample
        if precision == "fp32" and (torch.backends.cuda.matmul.allow_tf32
                                    or torch.backends.cudnn.allow_tf32):
            precision = "tf32"  # the peak-table column of fp32 matmuls where torch allows TF32
        self.peak = (peak_tflops(torch.cuda.get_device_name(self.device), precision)
                     if self.device.type == "cuda" else None)  # dense TFLOP/s
        self._steps = 0  # all steps, warm-up included
        self._start: float | None = None  # the window's first measuring point (set by reset)
        # last measuring point: (time, samples, steps, seconds waiting, seconds paused)
        self._point = (0.0, 0, 0, 0.0, 0.0)
        if warmup_steps == 0:
            self.reset()

    def step_done(self, n_samples: int) -> None:
        """A step on ``n_samples`` was queued (a synchronise every ``every`` counted steps)."""
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
        """Yield from ``iterable``, timing each fetch as waiting; when the loop ends (or is left)
        so does the window: what the caller does next is never counted."""
        t0 = time.perf_counter()
        try:
            for batch in iterable:
                if self._start is not None:
                    self._wait += time.perf_counter() - t0
                yield batch
                t0 = time.perf_counter()
        finally:
            self.close()

    def close(self) -> None:
        """A measuring point now, so a later ``summary()`` does not count what came after."""
        if self._start is not None and self._counted != self._point[2]:
            self._measure()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Leave the time inside out of the wall clock (validation, checkpoint writes)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self._start is not None:
                self._paused += time.perf_counter() - t0

    def reset(self) -> None:
        synchronize(self.device)
        now = time.perf_counter()
        self._start = now
        self._samples = self._counted = 0
        self._wait = self._paused = 0.0
        self._point = (now, 0, 0, 0.0, 0.0)

    def summary(self, measure: bool = True) -> dict:
        """The window's numbers: samples_per_s (wall clock, waiting included), data_wait_pct,
        compute_samples_per_s (time not waiting: not what the run achieves), tflops, mfu (None
        when the peak is unknown), data_bound. ``measure=False``: the last measuring point,
        without a synchronise (for per-step displays)."""
        if measure:
            self.close()
        t, samples, steps, wait, paused = self._point
        wall = t - self._start - paused if self._start is not None else 0.0
        rate = samples / wall if wall > 0 else None
        wait_pct = 100.0 * wait / wall if wall > 0 else None
        busy = wall - wait
        tflops = (rate * self.flops_per_sample / 1e12
                  if rate is not None and self.flops_per_sample else None)
        return {"samples_per_s": rate, "data_wait_pct": wait_pct,
                "compute_samples_per_s": samples / busy if busy > 0 else None, "tflops": tflops,
                "mfu": tflops / self.peak if tflops is not None and self.peak else None,
                "data_bound": bool(wait_pct is not None and wait_pct > DATA_BOUND_PCT),
                "steps": steps, "samples": samples, "seconds": wall}

    def _measure(self) -> None:
        synchronize(self.device)
        self._point = (time.perf_counter(), self._samples, self._counted, self._wait,
                       self._paused)
