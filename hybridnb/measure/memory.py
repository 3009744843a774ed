"""Memory numbers per backend: torch.cuda / NVML / MPS / psutil.

``peak_bytes`` and ``reset_peak`` are what the Trainer records per epoch. The live view uses a
``MemorySampler``: a small background thread that only *collects* numbers (it never touches a
widget or a display; ipykernel drops display messages from other threads) while the training loop
renders them on the main thread.

Each source is a "probe": a function returning ``{series_name: value}``. Probes are chosen once
for the device; a probe that fails is dropped with its reason kept in ``sampler.notes``, so a
broken NVML never stops training and never fails silently.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

#: Series names and what they mean (bytes unless the name ends in ``_util``).
SERIES = {
    "gpu_allocated": "GPU allocated (torch)",
    "gpu_reserved": "GPU reserved (torch)",
    "gpu_peak": "GPU peak allocated (torch)",
    "gpu_used": "GPU used (NVML, all processes)",
    "gpu_total": "GPU total (NVML)",
    "gpu_util": "GPU utilisation % (NVML)",
    "mps_current": "MPS allocated",
    "mps_driver": "MPS driver",
    "rss": "process RSS",
    "ram_used": "system RAM used",
    "ram_total": "system RAM total",
}

Probe = Callable[[], dict[str, float]]


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
        import sys

        # ru_maxrss is in KiB on Linux, bytes on macOS.
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(rss if sys.platform == "darwin" else rss * 1024)
    except (ImportError, OSError):
        return None


# --------------------------------------------------------------------------- probes


def torch_cuda_probe(index: int) -> Probe:
    """Allocator numbers for CUDA/ROCm device ``index``. Reads nothing until CUDA is initialised
    by the training itself (the sampler must never be the thing that creates a CUDA context)."""

    def probe() -> dict[str, float]:
        if not torch.cuda.is_initialized():
            return {}
        return {
            "gpu_allocated": float(torch.cuda.memory_allocated(index)),
            "gpu_reserved": float(torch.cuda.memory_reserved(index)),
            "gpu_peak": float(torch.cuda.max_memory_allocated(index)),
        }

    return probe


def mps_probe() -> Probe:
    def probe() -> dict[str, float]:
        return {
            "mps_current": float(torch.mps.current_allocated_memory()),
            "mps_driver": float(torch.mps.driver_allocated_memory()),
        }

    return probe


def host_probe() -> Probe:
    """This process's resident set and the machine's RAM in use (total - available)."""
    import psutil

    proc = psutil.Process()

    def probe() -> dict[str, float]:
        vm = psutil.virtual_memory()
        return {
            "rss": float(proc.memory_info().rss),
            "ram_used": float(vm.total - vm.available),
            "ram_total": float(vm.total),
        }

    return probe


def nvml_probe(handle, nvml) -> Probe:
    """NVML numbers for one device handle: memory used by every process, total, utilisation."""

    def probe() -> dict[str, float]:
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
        out = {"gpu_used": float(mem.used), "gpu_total": float(mem.total)}
        try:
            out["gpu_util"] = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except nvml.NVMLError:  # some vGPU/MIG setups do not report utilisation
            pass
        return out

    return probe


def _norm_uuid(uuid: object) -> str:
    text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    text = text.strip().lower()
    return text[4:] if text.startswith("gpu-") else text


def torch_device_uuid(index: int) -> str | None:
    """The UUID torch reports for CUDA ordinal ``index`` (None when unknown)."""
    try:
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    except (RuntimeError, AssertionError, AttributeError):
        return None
    return _norm_uuid(uuid) if uuid is not None else None


def nvml_handle_for(index: int, nvml, uuid: str | None = None,
                    environ: Mapping[str, str] | None = None):
    """Map CUDA ordinal ``index`` (what torch calls ``cuda:index``) to an NVML device handle.

    NVML numbers devices in PCI order and ignores ``CUDA_VISIBLE_DEVICES``; CUDA renumbers the
    visible devices (and may order them fastest-first). The one stable key is the UUID: match the
    UUID torch reports (``uuid``), else the ``CUDA_VISIBLE_DEVICES`` entry for this ordinal (an
    NVML index, or a ``GPU-`` UUID or unique UUID prefix). Returns ``(handle, how)``; handle is
    None when no device can be matched, with ``how`` saying why.
    """
    env = os.environ if environ is None else environ
    count = nvml.nvmlDeviceGetCount()
    uuids = []
    for i in range(count):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        uuids.append((h, _norm_uuid(nvml.nvmlDeviceGetUUID(h))))
    if uuid:
        want = _norm_uuid(uuid)
        for h, u in uuids:
            if u == want:
                return h, f"matched by UUID GPU-{want}"
        return None, f"no NVML device has the UUID GPU-{want} that torch reports for cuda:{index}"
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        if index < count:
            return uuids[index][0], f"NVML index {index} (CUDA_VISIBLE_DEVICES unset)"
        return None, f"cuda:{index} is past the {count} NVML devices"
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if index >= len(entries):
        return None, f"cuda:{index} is past CUDA_VISIBLE_DEVICES={visible!r}"
    entry = entries[index]
    if entry.isdigit():
        i = int(entry)
        if i < count:
            return uuids[i][0], f"NVML index {i} from CUDA_VISIBLE_DEVICES={visible!r}"
        return None, f"CUDA_VISIBLE_DEVICES entry {entry!r} is past the {count} NVML devices"
    if entry.lower().startswith("mig-"):
        return None, f"MIG instance {entry!r}: NVML per-device numbers would not be this GPU's"
    prefix = _norm_uuid(entry)
    found = [h for h, u in uuids if u.startswith(prefix)]
    if len(found) == 1:
        return found[0], f"matched CUDA_VISIBLE_DEVICES entry {entry!r} by UUID"
    return None, f"CUDA_VISIBLE_DEVICES entry {entry!r} matches {len(found)} NVML devices"


def _load_nvml():
    import pynvml  # provided by nvidia-ml-py

    pynvml.nvmlInit()
    return pynvml


def probes_for(device: torch.device | str, nvml_loader: Callable | None = None,
               ) -> tuple[list[tuple[str, Probe]], list[str], Callable[[], None]]:
    """Choose the probes for ``device`` once. Returns ``(probes, notes, close)``: named probes,
    sentences saying why a source is missing, and a function that releases NVML."""
    device = torch.device(device)
    probes: list[tuple[str, Probe]] = []
    notes: list[str] = []
    close: Callable[[], None] = lambda: None  # noqa: E731
    if device.type == "cuda":
        index = device.index if device.index is not None else 0
        probes.append(("torch.cuda", torch_cuda_probe(index)))
        if getattr(torch.version, "hip", None):
            notes.append("ROCm device: NVML numbers are not available; showing torch's allocator")
        else:
            try:
                nvml = (nvml_loader or _load_nvml)()
                handle, how = nvml_handle_for(index, nvml, uuid=torch_device_uuid(index))
                if handle is None:
                    notes.append(f"NVML not used: {how}")
                    with _suppress():
                        nvml.nvmlShutdown()
                else:
                    probes.append(("nvml", nvml_probe(handle, nvml)))
                    close = nvml.nvmlShutdown
            except Exception as exc:  # library missing, driver missing, permission
                notes.append(f"NVML not available ({type(exc).__name__}: {exc})")
    elif device.type == "mps":
        probes.append(("mps", mps_probe()))
    try:
        probes.append(("host", host_probe()))
    except ImportError as exc:
        notes.append(f"host memory not shown: {exc}")
    return probes, notes, close


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return True


# --------------------------------------------------------------------------- sampler


@dataclass
class MemorySeries:
    """Time series of memory numbers: ``times`` (seconds since the sampler started) and one list
    per series name, all the same length (NaN where a source had nothing)."""

    times: list[float] = field(default_factory=list)
    values: dict[str, list[float]] = field(default_factory=dict)

    def append(self, t: float, sample: Mapping[str, float]) -> None:
        n = len(self.times)
        self.times.append(t)
        for name, value in sample.items():
            self.values.setdefault(name, [float("nan")] * n).append(value)
        for seq in self.values.values():
            if len(seq) == n:
                seq.append(float("nan"))

    def halve(self) -> None:
        """Keep every second sample (bounded memory for very long runs)."""
        self.times = self.times[::2]
        self.values = {k: v[::2] for k, v in self.values.items()}

    def latest(self) -> dict[str, float]:
        if not self.times:
            return {}
        return {k: v[-1] for k, v in self.values.items() if v[-1] == v[-1]}

    def peak(self, name: str) -> float | None:
        vals = [v for v in self.values.get(name, ()) if v == v]
        return max(vals) if vals else None


class MemorySampler:
    """Collects memory numbers for one device every ``interval`` seconds on a daemon thread.

    Only numbers are collected there; renderers call ``series()`` from the main thread. The
    series is bounded: past ``max_points`` samples it keeps every second one and doubles the
    interval, so a day-long run costs the same memory as a short one.
    """

    def __init__(self, device: torch.device | str, interval: float = 0.5,
                 max_points: int = 4000, probes: list[tuple[str, Probe]] | None = None,
                 nvml_loader: Callable | None = None, clock: Callable[[], float] = time.time):
        self.device = str(device)
        self.interval = float(interval)
        self.max_points = int(max_points)
        self.clock = clock
        if probes is None:
            probes, notes, close = probes_for(device, nvml_loader=nvml_loader)
        else:
            notes, close = [], (lambda: None)
        self.probes = list(probes)
        self.notes: list[str] = list(notes)
        self._close_sources = close
        self.start_time = clock()
        self._series = MemorySeries()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> dict[str, float]:
        """Read every probe once (a failing probe is dropped and its reason noted)."""
        out: dict[str, float] = {}
        for name, probe in list(self.probes):
            try:
                out.update(probe())
            except Exception as exc:
                self.probes.remove((name, probe))
                self.notes.append(f"{name} memory probe stopped ({type(exc).__name__}: {exc})")
        now = self.clock()
        with self._lock:
            self._series.append(now - self.start_time, out)
            if len(self._series.times) > self.max_points:
                self._series.halve()
                self.interval *= 2
        return out

    def start(self) -> MemorySampler:
        if self._thread is None:
            self.sample()
            self._thread = threading.Thread(target=self._run, name="hybridnb-memory",
                                            daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def series(self) -> MemorySeries:
        """A copy of what was collected so far (safe to read while the thread keeps going)."""
        with self._lock:
            return MemorySeries(list(self._series.times),
                                {k: list(v) for k, v in self._series.values.items()})

    def latest(self) -> dict[str, float]:
        with self._lock:
            return self._series.latest()

    def close(self) -> None:
        """Stop the thread, take one last sample and release NVML. Safe to call twice."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with _suppress():
            self.sample()
        with _suppress():
            self._close_sources()
