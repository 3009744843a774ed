"""Device-synchronised timers, and NVML's busy reading. GPU work is asynchronous: a host clock
read after the backward pass measures how fast kernels were queued, not how fast they ran.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from hybridnb.hardware import nvml
from hybridnb.measure.memory import cuda_index


def synchronize(device: torch.device | str) -> None:
    """Wait until every kernel queued on ``device`` has finished (a no-op on the CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


class Stopwatch:
    """Time one window of device work: ``start()``, queue the work, ``stop()`` -> seconds
    (between two CUDA events on CUDA: the device's time, not the launch time)."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._t0 = 0.0
        self._events: tuple | None = None

    def start(self) -> None:
        synchronize(self.device)
        if self.device.type == "cuda":
            self._events = tuple(torch.cuda.Event(enable_timing=True) for _ in range(2))
            self._events[0].record()
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> float:
        if self._events is not None:
            begin, end = self._events
            end.record()
            end.synchronize()
            self._events = None
            return begin.elapsed_time(end) / 1000.0
        synchronize(self.device)
        return time.perf_counter() - self._t0


def nvml_busy_reader(device: torch.device | str) -> Callable[[], float | None] | None:
    """A reader of NVML's 'GPU busy' % for ``device`` (``nvml.utilisation``); None without NVML."""
    device = torch.device(device)
    handle = (nvml.locate(cuda_index(device))[0]
              if device.type == "cuda" and not torch.version.hip else None)
    return None if handle is None else lambda: nvml.utilisation(handle)
