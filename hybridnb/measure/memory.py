"""Memory numbers per backend (torch.cuda, NVML, MPS, psutil): ``peak_bytes`` per epoch, and
``MemorySampler``, a thread that only collects numbers (ipykernel drops displays from other
threads) from probes, functions returning ``{series_name: value}``, chosen once per device. A
probe that fails is dropped with its reason in ``sampler.notes``: never fatal, never silent.
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import psutil
import torch

from hybridnb.hardware import nvml

#: Series names and what they mean (bytes unless the name ends in ``_util``).
SERIES = {
    "gpu_allocated": "GPU allocated (torch)", "gpu_reserved": "GPU reserved (torch)",
    "gpu_peak": "GPU peak allocated (torch)", "gpu_used": "GPU used (NVML, all processes)",
    "gpu_total": "GPU total (NVML)", "gpu_util": "GPU utilisation % (NVML)",
    "mps_current": "MPS allocated", "mps_driver": "MPS driver", "rss": "process RSS",
    "ram_used": "system RAM used", "ram_total": "system RAM total",
}

Probe = Callable[[], dict[str, float]]


def peak_bytes(device: torch.device | str) -> int | None:
    """Peak bytes since the last ``reset_peak``: the CUDA/ROCm allocator's, MPS driver memory,
    or the process's peak resident set on the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    if device.type == "mps":
        return int(torch.mps.driver_allocated_memory())
    try:
        import resource  # not on Windows
    except ImportError:
        return None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # KiB on Linux, bytes on macOS


def reset_peak(device: torch.device | str) -> None:
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def cuda_index(device: torch.device | str) -> int:
    """The ordinal of a CUDA device; plain "cuda" means the current device (0 until CUDA is
    initialised: asking would initialise it)."""
    device = torch.device(device)
    if device.index is not None:
        return device.index
    return torch.cuda.current_device() if torch.cuda.is_initialized() else 0


def probes_for(device: torch.device | str, pid: int | None = None
               ) -> tuple[list[tuple[str, Probe]], list[str]]:
    """``(named probes, notes saying why a source is missing)`` for ``device``; the host's
    probe reads the resident set of this process (or of ``pid``, a worker)."""
    device = torch.device(device)
    probes: list[tuple[str, Probe]] = []
    notes: list[str] = []
    if device.type == "cuda":
        index = cuda_index(device)

        def allocator() -> dict[str, float]:  # nothing until the training initialised CUDA:
            if not torch.cuda.is_initialized():  # the sampler must never create a context
                return {}
            return {"gpu_allocated": float(torch.cuda.memory_allocated(index)),
                    "gpu_reserved": float(torch.cuda.memory_reserved(index)),
                    "gpu_peak": float(torch.cuda.max_memory_allocated(index))}

        probes.append(("torch.cuda", allocator))
        handle, how = (None, "a ROCm device") if torch.version.hip else nvml.locate(index)
        if handle is None:
            notes.append(f"NVML numbers not shown ({how}); showing torch's allocator")
        else:
            probes.append(("nvml", lambda: _nvml_sample(handle)))
    elif device.type == "mps":
        probes.append(("mps", lambda: {"mps_current": float(torch.mps.current_allocated_memory()),
                                       "mps_driver": float(torch.mps.driver_allocated_memory())}))
    proc = psutil.Process(pid)

    def host() -> dict[str, float]:
        vm = psutil.virtual_memory()
        return {"rss": float(proc.memory_info().rss), "ram_used": float(vm.total - vm.available),
                "ram_total": float(vm.total)}

    probes.append(("host", host))
    return probes, notes


def _nvml_sample(handle) -> dict[str, float]:
    """NVML's memory used (every process), total and utilisation; raises when the device stops
    answering (the sampler then drops this probe, saying why)."""
    mem, why = nvml.attempt("nvmlDeviceGetMemoryInfo", handle)
    if mem is None:
        raise RuntimeError(why)
    out = {"gpu_used": float(mem.used), "gpu_total": float(mem.total)}
    util = nvml.utilisation(handle)  # some vGPU/MIG setups do not report utilisation
    if util is not None:
        out["gpu_util"] = util
    return out


def heap_reader() -> tuple[Callable[[], float], str]:
    """A reader of this process's host memory in use, and what it measures: glibc's heap in use
    (bytes malloc handed out, freed or not returned to the OS alike; psutil >= 7.1), else the
    resident set, which lags frees and reuse."""
    if sys.platform.startswith("linux") and hasattr(psutil, "heap_info"):
        return (lambda: float(sum(psutil.heap_info()[:2])),  # heap_used + mmap_used
                "heap bytes in use (glibc mallinfo2, sampled every 2 ms)")
    return (lambda: float(psutil.Process().memory_info().rss),
            "resident-set rise (approximate: sampled, and freed memory may be reused)")


@dataclass
class MemorySeries:
    """``times`` (seconds since the start) and one list per series, all the same length (NaN
    where a source had nothing); ``peaks``: each series' highest value, halved samples too."""

    times: list[float] = field(default_factory=list)
    values: dict[str, list[float]] = field(default_factory=dict)
    peaks: dict[str, float] = field(default_factory=dict)

    def append(self, t: float, sample: Mapping[str, float]) -> None:
        n = len(self.times)
        self.times.append(t)
        for name, value in sample.items():
            self.values.setdefault(name, [float("nan")] * n).append(value)
            if value == value and not value <= self.peaks.get(name, -math.inf):
                self.peaks[name] = value
        for seq in self.values.values():
            if len(seq) == n:
                seq.append(float("nan"))

    def halve(self) -> None:
        self.times = self.times[::2]
        self.values = {k: v[::2] for k, v in self.values.items()}


class MemorySampler:
    """hybridnb's one sampling thread: every ``interval`` seconds for one device. Past
    ``max_points`` samples it keeps every second one and doubles the interval, so a day-long run
    costs what a short one does. ``probes`` replaces the device's default sources."""

    def __init__(self, device: torch.device | str, interval: float = 0.5,
                 max_points: int = 4000, probes: list[tuple[str, Probe]] | None = None,
                 pid: int | None = None):
        self.interval = float(interval)
        self.max_points = int(max_points)
        self.probes, self.notes = (probes_for(device, pid) if probes is None
                                   else (list(probes), []))
        self.start_time = time.time()
        self._series = MemorySeries()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        with self._lock:
            probes = list(self.probes)
        for name, probe in probes:
            try:
                out.update(probe())
            except Exception as exc:  # noqa: BLE001 - a probe's library may raise anything
                self._drop([name], f"{name} memory probe stopped ({type(exc).__name__}: {exc})")
        now = time.time()
        with self._lock:
            self._series.append(now - self.start_time, out)
            if len(self._series.times) > self.max_points:
                self._series.halve()
                self.interval *= 2
        return out

    def drop_device(self, reason: str) -> None:
        """Stop reading the lost device (nothing may call into it again); keep the host's."""
        self._drop(["torch.cuda", "nvml", "mps"], f"device memory no longer read: {reason}")

    def _drop(self, names: list[str], note: str) -> None:
        with self._lock:
            kept = [(n, p) for n, p in self.probes if n not in names]
            if len(kept) != len(self.probes):
                self.probes = kept
                self.notes.append(note)

    def start(self) -> MemorySampler:
        if self._thread is None:
            self.sample()
            self._thread = threading.Thread(target=self._run, name="hybridnb-sampler",
                                            daemon=True)
            self._thread.start()
        return self

    def __enter__(self) -> MemorySampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def series(self) -> MemorySeries:
        with self._lock:
            return MemorySeries(list(self._series.times),
                                {k: list(v) for k, v in self._series.values.items()},
                                dict(self._series.peaks))

    def latest(self) -> dict[str, float]:
        """The last sample's values (a source that had nothing left out)."""
        with self._lock:
            return {k: v[-1] for k, v in self._series.values.items() if v[-1] == v[-1]}

    def close(self) -> None:
        """Stop the thread and take one last sample (NVML stays open: the process shares it)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(Exception):  # a last sample is best effort
            self.sample()
