"""find_batch_size: the largest batch that fits on the device, found by real training steps.

Doubling from ``start`` until a size fails, then bisection. A size fits when ``STEPS`` optimizer
steps run without running out of memory and the peak stays under ``(1 - headroom)`` of the
device's memory; a bound set by an out-of-memory error (no peak to compare) scales the answer by
``1 - headroom`` instead. The search is one trial fit on the Loop (``opening.trial``, as lr_find's
sweep), so an out-of-memory step is recovered as in any fit and the Loop's state restored.
"""

from __future__ import annotations

import math
from collections import namedtuple

import psutil
import torch
from torch.utils.data import DataLoader

from hybridnb.events import Event
from hybridnb.failures import free_memory
from hybridnb.measure.memory import peak_bytes, reset_peak
from hybridnb.train import opening
from hybridnb.train.bus import StepEnded
from hybridnb.train.data import as_dataset
from hybridnb.train.opening import CancelFit
from hybridnb.train.schedules import Constant
from hybridnb.train.state import Plan

STEPS = 2  # optimizer steps each size is tried with


# the largest batch that fits, and the batch_size x grad_accum that keeps the effective batch
BatchFound = namedtuple("BatchFound", "found batch_size grad_accum")


def find_batch_size(loop, dataset, headroom: float = 0.1, max_batch: int | None = None,
                    start: int = 1) -> BatchFound:
    """Search on ``loop``'s model and device; the settings are the caller's to change."""
    if not 0 <= headroom < 1:
        raise ValueError(f"headroom={headroom!r} must be in [0, 1)")
    data = as_dataset(dataset, loop.bus)
    data = data.dataset if isinstance(data, DataLoader) else data
    n = len(data)
    if n == 0:
        raise ValueError("find_batch_size needs a non-empty dataset")
    max_batch = min(max_batch or n, n)
    probe = Probe(loop, data, max_batch, max(1, min(start, max_batch)), headroom)
    loop.bus.note("batch_size", f"searching the largest batch from {probe.size} up to "
                  f"{max_batch}, {STEPS} steps each, on {loop.placement.device}")
    trials = 2 * math.ceil(math.log2(max_batch) + 1)  # doubling, then bisection
    with opening.trial(loop, probe, Plan(1, trials * STEPS, trials * STEPS, trials * STEPS),
                       probe, Constant(), recover_oom=True):
        loop.fit(probe, None)
    if probe.lost:
        raise RuntimeError(f"find_batch_size: the device failed at batch {probe.size} and the "
                           f"run moved to the CPU ({probe.lost}); no batch size was chosen. "
                           "Check the GPU (hn.detect(refresh=True)) before searching again")
    good, bad, device = probe.good, probe.bad, loop.placement.device
    if good == 0:
        raise MemoryError(f"not even a batch of 1 fits on {device} "
                          f"({probe.bad_why})")
    oom = bad is not None and probe.bad_why == "oom"
    found = max(1, math.floor(good * (1 - headroom))) if oom and headroom else good
    s = loop.settings
    effective = s.batch_size * s.grad_accum
    accum = max(1, math.ceil(effective / found))
    batch_size = math.ceil(effective / accum)
    why = (f"bounded by out-of-memory at {bad}" if oom else
           "peak memory limit" if bad is not None else "the largest size tried")
    loop.bus.say("batch_size", f"largest batch that fits on {device}: {good} ({why}); with "
                 f"{headroom:.0%} headroom {found}; now batch_size={batch_size} x grad_accum="
                 f"{accum} (effective {effective} kept)")
    return BatchFound(found, batch_size, accum)


class Probe:
    """The trial fit's batches (the data's first ``size`` samples, again and again) and a
    listener on its bus that judges each size ("ok", "oom", or "peak": over the memory limit)
    and picks the next, ending the fit (``CancelFit``) when the search is over."""

    def __init__(self, loop, dataset, max_batch: int, size: int, headroom: float) -> None:
        self.loop, self.dataset, self.max_batch, self.headroom = loop, dataset, max_batch, headroom
        self.good, self.bad = 0, None  # the largest size that fits, the smallest that does not
        self.bad_why = "out of memory"  # the smallest failing size's verdict ("oom", "peak")
        self.lost: str | None = None  # why the device was lost mid-search
        self._start(size)

    def _start(self, size: int) -> None:
        self.size, self.taken, self.oom = size, 0, False
        self.batch = next(iter(DataLoader(self.dataset, batch_size=size, shuffle=False)))

    def __iter__(self):
        while True:
            if self.taken == 0:  # a size's peak counts its own steps (not set-up, speedups)
                reset_peak(self.loop.placement.device)
            yield self.batch

    def __call__(self, event) -> None:
        if isinstance(event, Event) and event.kind in ("oom_split", "cpu_batch"):
            self.oom = True  # recovery's notes: the step ran out of memory
        if isinstance(event, Event) and event.kind == "device_lost":
            self.lost = event.message  # recovery moved the run to the CPU: no size to find here
        if not isinstance(event, StepEnded):
            return
        if self.lost:
            raise CancelFit
        self.taken += 1
        if not self.oom and self.taken < STEPS:
            return
        placement = self.loop.placement
        limit, peak = _capacity(placement.device), peak_bytes(placement.device)
        over = limit is not None and peak is not None and peak > (1 - self.headroom) * limit
        verdict = "oom" if self.oom else "peak" if over else "ok"
        if verdict == "ok":
            self.good = self.size
        else:
            self.bad, self.bad_why = self.size, verdict
        self.loop.state.micro = None  # the next size starts whole again
        self.loop.learner.optimizer.zero_grad(set_to_none=True)
        free_memory(placement.device)
        if self.bad is None:  # doubling until a size fails, then bisection
            size = None if self.good >= self.max_batch else min(2 * self.good, self.max_batch)
        else:
            size = None if self.bad - self.good <= 1 else (self.good + self.bad) // 2
        if size is None:
            raise CancelFit
        self._start(size)


def _capacity(device: torch.device) -> float | None:
    """Bytes this process may use on ``device`` (CUDA: total x the memory-fraction cap)."""
    if device.type == "cuda":
        _, total = torch.cuda.mem_get_info(device)
        get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
        fraction = float(get_fraction(device)) if get_fraction is not None else 1.0
        return float(total) * fraction
    if device.type == "cpu":
        return float(psutil.virtual_memory().available + psutil.Process().memory_info().rss)
    return None
