"""Memory numbers per backend: torch.cuda / NVML / MPS / psutil.

``peak_bytes`` and ``reset_peak`` are what the Trainer records per epoch; the live view's sampler
(extended in this module) collects the time series.
"""

from __future__ import annotations

import torch


def peak_bytes(device: torch.device | str) -> int | None:
    """Peak memory since the last ``reset_peak`` on ``device``: CUDA/ROCm allocator peak, MPS
    driver memory, or the process's peak resident set on CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    if device.type == "mps":
        return int(torch.mps.driver_allocated_memory())
    return _host_peak_rss()


def reset_peak(device: torch.device | str) -> None:
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _host_peak_rss() -> int | None:
    try:
        import resource
        # ru_maxrss is in KiB on Linux, bytes on macOS.
        import sys
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(rss if sys.platform == "darwin" else rss * 1024)
    except (ImportError, OSError):
        return None
