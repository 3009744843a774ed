"""Device-synchronised timers and samplers for honest speed and memory numbers.

GPU work is asynchronous: a host clock read right after ``loss.backward()`` measures how fast the
Python loop *queued* kernels, not how fast they ran. ``Stopwatch`` brackets a window with CUDA events
(after a synchronise) on CUDA/ROCm, synchronises MPS/XPU before reading the host clock, and uses
``time.perf_counter`` on the CPU, where every op is synchronous already.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch


def synchronize(device: torch.device | str) -> None:
    """Wait until every kernel queued on ``device`` has finished (a no-op on the CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
    elif device.type == "xpu":
        torch.xpu.synchronize(device)


class Stopwatch:
    """Time one window of device work: ``start()``, queue the work, ``stop()`` -> seconds.

    On CUDA the window is measured between two CUDA events on the current stream; ``stop()``
    waits for the second event, so the number is the device's time, not the launch time.
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        self._t0 = 0.0
        self._events: tuple | None = None

    def start(self) -> None:
        synchronize(self.device)
        if self._cuda:
            begin = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            begin.record()
            self._events = (begin, end)
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> float:
        """Seconds since ``start()``, after the device finished the queued work."""
        if self._cuda and self._events is not None:
            begin, end = self._events
            end.record()
            end.synchronize()
            self._events = None
            return begin.elapsed_time(end) / 1000.0
        synchronize(self.device)
        return time.perf_counter() - self._t0


class PeakSampler:
    """Sample ``read()`` every ``interval`` seconds in a thread; keep the highest value.

    For quantities that cannot be reset and read afterwards (a process's resident memory, the
    MPS allocator, NVML utilisation), a sampler is the honest way to see a peak: it may miss a
    spike shorter than ``interval``, and says nothing about other processes. ``values`` keeps
    every sample (for utilisation, the median is what matters).
    """

    def __init__(self, read: Callable[[], float | None], interval: float = 0.002) -> None:
        self._read = read
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.values: list[float] = []

    def __enter__(self) -> PeakSampler:
        self.values = []
        self._sample()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="hybridnb-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()

    @property
    def peak(self) -> float | None:
        return max(self.values) if self.values else None

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def _sample(self) -> None:
        try:
            value = self._read()
        except Exception:  # a failing reader (NVML gone) ends the series, never the run
            return
        if value is not None:
            self.values.append(float(value))


def rss_bytes() -> int:
    """The resident set of this process now (bytes)."""
    import psutil
    return int(psutil.Process().memory_info().rss)


def nvml_busy_reader(device: torch.device | str) -> Callable[[], float | None] | None:
    """A function returning NVML's 'GPU busy' percentage for ``device``, or None without NVML.

    NVML reports the share of its last sample period (1/6 s to 1 s, by GPU) in which at least
    one kernel was running: a coarse number, meaningful over windows of a second or more.
    """
    device = torch.device(device)
    if device.type != "cuda" or torch.version.hip:
        return None
    try:
        import pynvml
        pynvml.nvmlInit()
        props = torch.cuda.get_device_properties(device)
        bus = getattr(props, "pci_bus_id", None)
        if bus is not None:
            domain = getattr(props, "pci_domain_id", 0)
            dev = getattr(props, "pci_device_id", 0)
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(
                f"{domain:08x}:{bus:02x}:{dev:02x}.0".encode())
        else:
            handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
    except Exception:
        return None

    def read() -> float:
        return float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)

    return read


def heap_reader() -> tuple[Callable[[], float | None], str]:
    """A reader of this process's host memory in use, and what it measures.

    With glibc, ``mallinfo2()`` gives the bytes malloc has handed out and not taken back (arenas
    plus mmapped blocks) — what torch's CPU tensors use, whether or not freed memory was returned
    to the OS. Elsewhere the resident set is the fallback; it lags frees and reuse, so a rise in it
    is approximate.
    """
    info = _mallinfo2()
    if info is not None:
        return info, "heap bytes in use (glibc mallinfo2, sampled every 2 ms)"
    return rss_bytes, "resident-set rise (approximate: sampled, and freed memory may be reused)"


def _mallinfo2() -> Callable[[], float] | None:
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return None

    class _Info(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost")]

    fn.restype = _Info

    def read() -> float:
        info = fn()
        return float(info.uordblks + info.hblkhd)

    return read
