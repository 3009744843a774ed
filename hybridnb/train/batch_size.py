"""find_batch_size: the largest batch that fits on the device, found by real training steps.

Doubling from ``start`` until a step runs out of memory (or its peak passes the limit), then
bisection between the last size that fitted and the first that did not. A size "fits" when
``steps`` full optimizer steps run and the measured peak stays under ``(1 - headroom)`` of the
device's memory. When the bound came from an out-of-memory error (no peak to compare), the answer
is scaled by ``1 - headroom`` so that the run keeps that margin. The model, optimizer and every
other piece of the Loop's state are restored afterwards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader

from hybridnb.measure.memory import peak_bytes, reset_peak
from hybridnb.train import recovery, saved
from hybridnb.train.data import as_dataset


@dataclass
class BatchFound:
    """The largest batch that fits, and the ``batch_size`` x ``grad_accum`` that keeps the
    effective batch with it."""

    found: int
    batch_size: int
    grad_accum: int


def find_batch_size(loop, dataset, headroom: float = 0.1, max_batch: int | None = None,
                    start: int = 1, steps: int = 2) -> BatchFound:
    """Search on ``loop``'s model and device; the settings are the caller's to change."""
    if not 0 <= headroom < 1:
        raise ValueError(f"headroom={headroom!r} must be in [0, 1)")
    device, s = loop.placement.device, loop.settings
    data = as_dataset(dataset, loop.bus)
    data = data.dataset if isinstance(data, DataLoader) else data
    n = len(data)
    if n == 0:
        raise ValueError("find_batch_size needs a non-empty dataset")
    max_batch = min(max_batch or n, n)
    limit = _capacity(device)
    limit = None if limit is None else (1 - headroom) * limit
    state = saved.state_dict(loop)
    outcome: dict[int, str] = {}

    def fits(bs: int) -> bool:
        if bs not in outcome:
            outcome[bs] = _try(loop, data, bs, steps, limit)
        return outcome[bs] == "ok"

    try:
        good, bad = 0, None
        bs = max(1, min(start, max_batch))
        while True:
            if not fits(bs):
                bad = bs
                break
            good = bs
            if bs >= max_batch:
                break
            bs = min(bs * 2, max_batch)
        if bad is not None:
            lo, hi = good, bad
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if fits(mid) else (lo, mid)
            good, bad = lo, hi
    finally:
        saved.rewind(loop, state)
        recovery.free_memory(device)
    if good == 0:
        raise MemoryError(f"not even a batch of 1 fits on {device} "
                          f"({outcome.get(1, 'out of memory')})")
    found = good
    if bad is not None and outcome[bad] == "oom" and headroom:
        found = max(1, math.floor(good * (1 - headroom)))
    effective = s.batch_size * s.grad_accum
    accum = max(1, math.ceil(effective / found))
    batch_size = math.ceil(effective / accum)
    why = ("bounded by out-of-memory at " + str(bad) if bad is not None and outcome[bad] == "oom"
           else "peak memory limit" if bad is not None else "the largest size tried")
    loop.bus.say("batch_size", f"largest batch that fits on {device}: {good} ({why}); with "
                 f"{headroom:.0%} headroom {found}; now batch_size={batch_size} x grad_accum="
                 f"{accum} (effective {effective} kept)")
    return BatchFound(found, batch_size, accum)


def _try(loop, data, bs: int, steps: int, limit: float | None) -> str:
    """'ok', 'oom' or 'peak' (ran but over the memory limit) for ``steps`` real steps at ``bs``."""
    batch = next(iter(DataLoader(data, batch_size=bs, shuffle=False)))
    x, y = batch[0], batch[1]
    failed = False
    device = loop.placement.device
    reset_peak(device)
    try:
        for _ in range(steps):
            loop.placement.step(x, y)  # the fit's own step: precision, scaler, clipping
    except Exception as exc:  # classified: only an out-of-memory error is caught
        if not recovery.is_oom(exc):
            raise
        failed = True
    # outside the except block, so the failed step's tensors can be freed
    loop.learner.optimizer.zero_grad(set_to_none=True)
    recovery.free_memory(device)
    if failed:
        return "oom"
    peak = peak_bytes(device)
    return "peak" if limit is not None and peak is not None and peak > limit else "ok"


def _capacity(device: torch.device) -> float | None:
    """Bytes this process may use on ``device`` (CUDA: total x the memory-fraction cap)."""
    if device.type == "cuda":
        _, total = torch.cuda.mem_get_info(device)
        get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
        fraction = float(get_fraction(device)) if get_fraction is not None else 1.0
        return float(total) * fraction
    if device.type == "cpu":
        try:
            import psutil
        except ImportError:
            return None
        return float(psutil.virtual_memory().available + psutil.Process().memory_info().rss)
    return None
