"""``detect()``: which device to train on, and with what settings, on this machine.

``HYBRIDNB_DEVICE=cpu|cuda|cuda:N|mps`` forces the device (obeyed even when the probe failed,
with a warning); ``RANK``/``WORLD_SIZE`` (2+), as torchrun and ``hn.launch`` set them, mark a rank.
"""

from __future__ import annotations

import importlib.util
import os
import re
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field

import torch

from hybridnb import env as runtime
from hybridnb import platform
from hybridnb.env import DEVICE_ENV, LAUNCHED_ENV, PROBE_CACHE_TTL_ENV, current
from hybridnb.hardware import gpu_info, probe, views
from hybridnb.hardware.gpu_info import BuildInfo, GpuInfo
from hybridnb.hardware.host import HostInfo, host_info
from hybridnb.hardware.probe import ProbeResult
from hybridnb.hardware.probe import cache as probe_cache
from hybridnb.hardware.rules import Recommended, choose_precision, native_bf16, recommend

_CACHE_VARS = (DEVICE_ENV, LAUNCHED_ENV, "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
               "ROCR_VISIBLE_DEVICES", "HSA_OVERRIDE_GFX_VERSION", "LOCAL_RANK", "WORLD_SIZE",
               "RANK")


class HardwareWarning(UserWarning):
    """A GPU that is known-bad, failed its probe, or a device request that cannot be met."""


@dataclass
class Hardware:
    """The report: chosen device, precision, settings, and the facts behind them."""

    device: torch.device
    precision: str
    settings: Recommended
    gpus: list[GpuInfo]
    host: HostInfo
    frontend: str
    build: BuildInfo
    warnings: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    probe_timeout: float = probe.DEFAULT_TIMEOUT
    seconds: float = 0.0

    def dataloader_kwargs(self) -> dict:
        """``num_workers``, ``pin_memory``, ``persistent_workers`` for torch's DataLoader
        (for data held in CPU memory: a dataset that yields GPU tensors takes no workers and
        no pinning)."""
        return {k: getattr(self.settings, k)
                for k in ("num_workers", "pin_memory", "persistent_workers")}

    def to_dict(self) -> dict:
        """Everything in the report as plain JSON types."""
        b = self.build
        return {"device": str(self.device), "precision": self.precision,
                "settings": self.settings.to_dict(), "gpus": [g.to_dict() for g in self.gpus],
                "host": asdict(self.host), "frontend": self.frontend,
                "torch": {"version": b.torch, "cuda": b.cuda, "hip": b.hip,
                          "arch_list": list(b.arch_list)},
                "warnings": list(self.warnings), "advice": list(self.advice),
                "notes": list(self.notes), "probe_timeout": self.probe_timeout,
                "seconds": round(self.seconds, 4)}

    __str__ = views.text
    _repr_html_ = views.html


_CACHE: dict[tuple, Hardware] = {}
_LOCK = threading.Lock()


def detect(refresh: bool = False, probe_timeout: float = probe.DEFAULT_TIMEOUT) -> Hardware:
    """Find the GPUs, probe each in a child process, and recommend a device and settings.

    Cached per process (per value of the device-related environment variables), a passed probe
    on disk for ``HYBRIDNB_PROBE_CACHE_TTL`` seconds (a day); ``refresh=True`` probes again.
    Returns within ``probe_timeout`` + 1 s whatever a GPU does; each warning is also raised once
    as ``HardwareWarning``.
    """
    if not isinstance(probe_timeout, (int, float)) or not probe_timeout > 0:
        raise ValueError(f"probe_timeout={probe_timeout!r} must be a positive number of seconds")
    key = tuple(current().get(v) for v in _CACHE_VARS)
    with _LOCK:
        if not refresh and key in _CACHE:
            return _CACHE[key]
        hw = _detect(float(probe_timeout), dict(current()), refresh)
        _CACHE.clear()  # after: a detection that raises (Ctrl-C) keeps the last answer
        _CACHE[key] = hw
    for message in hw.warnings:
        warnings.warn(message, HardwareWarning, stacklevel=2)
    return hw


def _detect(probe_timeout: float, env: dict[str, str], refresh: bool = False) -> Hardware:
    t0 = time.perf_counter()
    forced = parse_device(env.get(DEVICE_ENV))
    ttl = runtime.seconds_from_env(PROBE_CACHE_TTL_ENV, probe_cache.TTL, env,
                                   zero="turns the probe cache off")
    job = runtime.launch_env(env)  # launched: a rank of 2+, or any process hn.launch started
    launched = job is not None and (env.get(LAUNCHED_ENV) == "1" or job[2] > 1)
    local_rank, world = (job[1], job[2]) if launched else (None, 1)
    build = _torch_build()
    host = host_info()
    frontend = runtime.frontend()
    gpus, notes, warns = _find_gpus(build, env)
    none_found = " ".join(notes).rstrip(".") or "none listed"

    if forced is not None and forced.type == "cpu":
        targets = []
        if gpus:
            notes.append(f"{DEVICE_ENV}=cpu: the GPU probe was skipped.")
    else:
        # One GPU when the request names it (cuda:N, or this rank's GPU), else all of them.
        index = forced.index if forced is not None else local_rank
        targets = [g for g in gpus if g.backend != "mps" and g.index == index] or list(gpus)
    _probe(targets, build, env, probe_timeout, ttl, refresh, notes)
    for g in gpus:  # known-bad judgement, with what the probe added
        g.native_bf16 = native_bf16(g)
        gpu_info.judge(g, build, env)  # nothing to judge for MPS
        warns.extend(w for w in g.warnings if w not in warns)
    device, chosen, reason = _choose(gpus, forced, local_rank, warns, env, none_found)
    precision, precision_reason = choose_precision(device.type, chosen)
    same_kind_ok = [g for g in gpus if g.backend == (chosen.backend if chosen else None)
                    and g.trusted]
    settings = recommend(device.type, chosen, host, frontend,
                         gpus_ok=len(same_kind_ok) if forced is None else 1, world_size=world,
                         deepspeed=importlib.util.find_spec("deepspeed") is not None)
    settings.reasons = {"device": reason, "precision": precision_reason, **settings.reasons}
    advice = [a for g in gpus for a in g.advice]
    if host.cores_note:
        notes.append(host.cores_note + ".")
    return Hardware(device=device, precision=precision, settings=settings, gpus=gpus, host=host,
                    frontend=frontend, build=build, warnings=warns, advice=advice, notes=notes,
                    probe_timeout=probe_timeout, seconds=time.perf_counter() - t0)


def parse_device(value: str | None) -> torch.device | None:
    """``HYBRIDNB_DEVICE``'s value as a device, None for unset/empty/"auto"; ValueError if bad."""
    text = (value or "").strip().lower()
    if text in ("", "auto"):
        return None
    if re.fullmatch(r"cpu|mps|cuda(:\d+)?", text):
        return torch.device(text)
    raise ValueError(f"{DEVICE_ENV}={value!r} is not a device hybridnb understands; use one of "
                     "cpu, cuda, cuda:N (N = 0, 1, ...), mps, or leave it unset for automatic.")


def _torch_build() -> BuildInfo:
    try:  # get_arch_list() would init CUDA
        arch = torch._C._cuda_getArchFlags() or ""
    except Exception:  # noqa: BLE001 - broad: a private torch call (absent or failing): unknown
        arch = ""
    return BuildInfo(torch=torch.__version__, cuda=torch.version.cuda, hip=torch.version.hip,
                     arch_list=arch.split())


def _find_gpus(build: BuildInfo, env: dict[str, str]) -> tuple[list[GpuInfo], list[str],
                                                                 list[str]]:
    """Visible GPUs (logical numbering), notes, warnings. No CUDA initialisation."""
    notes: list[str] = []
    warns: list[str] = []
    if build.hip:
        raw, status = gpu_info.rocm_inventory()
        masks = ["ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES" if "HIP_VISIBLE_DEVICES" in env
                 else "CUDA_VISIBLE_DEVICES"]
    else:
        raw, status = gpu_info.nvml_inventory()
        masks = ["CUDA_VISIBLE_DEVICES"]
        if raw and not build.cuda:
            warns.append(f"NVML sees {len(raw)} NVIDIA GPU(s), but this torch ({build.torch}) is "
                         "a CPU-only build, so it cannot use them. Install a CUDA build of "
                         "torch (https://pytorch.org/get-started/locally/).")
            for g in raw:
                g.usable = False
        elif not raw and build.cuda and _nvidia_driver_loaded():
            # The driver is loaded but NVML is not usable here (e.g. a container without
            # libnvidia-ml): let the probe child find out what GPU 0 is.
            raw = [GpuInfo(index=0, physical_index=0, backend="cuda", name="NVIDIA GPU")]
            notes.append(f"{status}, but an NVIDIA driver is loaded; only GPU 0 is probed, and "
                         "its facts come from the probe.")
        elif not raw and (amd := gpu_info.rocm_inventory()[0]):
            warns.append(f"{len(amd)} AMD GPU(s) found ({amd[0].name}), but this torch "
                         f"({build.torch}) is not a ROCm build. Install torch from "
                         "https://download.pytorch.org/whl/rocm6.x to use them.")
    gpus = raw
    for var in masks:
        gpus, note = gpu_info.apply_visible(gpus, env.get(var), var)
        notes += [note] if note else []
    for g in gpus:
        g.runtime_version = build.hip if g.backend == "rocm" else build.cuda
    if not raw:
        notes.append(status + ".")
    if torch.backends.mps.is_available():  # False where torch was built without MPS
        gpus.append(GpuInfo(index=0, backend="mps", name="Apple GPU (MPS)"))
    return gpus, notes, warns


def _probe(targets: list[GpuInfo], build: BuildInfo, env: dict[str, str], timeout: float,
           ttl: float, refresh: bool, notes: list[str]) -> None:
    """Attach a probe result to each target: a cached pass younger than ``ttl`` seconds (0: no
    cache) unless ``refresh``, else a new child's (passes are stored)."""
    todo = []
    for g in targets:
        key = probe_cache.key_for(g, build) if ttl > 0 else None
        hit = probe_cache.load(key, ttl, env) if key is not None and not refresh else None
        if hit is not None:
            _merge_probe(g, hit)
        else:
            todo.append((g, key))
    backends = [("mps" if g.backend == "mps" else "cuda", g.index) for g, _ in todo]
    for (g, key), res in zip(todo, probe.run_probes(backends, timeout) if todo else [],
                             strict=True):
        _merge_probe(g, res)
        note = probe_cache.store(key, res, env) if key is not None else ""
        if note and note not in notes:
            notes.append(note)


def _nvidia_driver_loaded() -> bool:
    path = platform.proc_path("driver", "nvidia", "version")
    return path is not None and os.path.exists(path)


def _merge_probe(g: GpuInfo, res: ProbeResult) -> None:
    """Attach a probe result; fill facts NVML/sysfs could not give from what the child read."""
    g.probe, info = res, res.info
    if g.name in ("", "NVIDIA GPU") and info.get("name"):
        g.name = info["name"]
    for key in ("total_memory", "free_memory", "arch"):
        if getattr(g, key) is None:
            setattr(g, key, info.get(key))
    if g.capability is None and info.get("capability") and g.backend == "cuda":
        g.capability = tuple(info["capability"])


def _choose(gpus: list[GpuInfo], forced: torch.device | None, local_rank: int | None,
            warns: list[str], env: dict[str, str], none_found: str
            ) -> tuple[torch.device, GpuInfo | None, str]:
    """(device, its GpuInfo or None, the reason in one sentence)."""
    failed = [g for g in gpus if g.probe is not None and not g.probe.ok]
    warns.extend(f"{g.label} {g.probe.message}." for g in failed)
    asked = f"{DEVICE_ENV}={env.get(DEVICE_ENV)}"
    if forced is not None:
        if forced.type == "cpu":
            return forced, None, f"forced by {asked}."
        kind = ("mps",) if forced.type == "mps" else ("cuda", "rocm")
        pool = [g for g in gpus if g.backend in kind and (forced.index is None
                                                         or g.index == forced.index)]
        if pool:
            g = next((g for g in pool if g.trusted), pool[0])
            if not g.trusted:
                why = g.probe.message if g in failed else "it is known-bad (see the warnings)"
                warns.append(f"{asked} forces {g.label} although {why}; training may hang, "
                             "crash or compute wrong numbers.")
            return torch.device(g.torch_device), g, f"forced by {asked} ({g.name})."
        have = ", ".join(g.torch_device for g in gpus) or "no GPU"
        warns.append(f"{asked} asks for {forced}, but this machine has {have}; choosing "
                     "automatically instead.")
    good = [g for g in gpus if g.trusted]
    if local_rank is not None:
        good = [g for g in good if g.index == local_rank] or good
    best = next((g for g in good if g.backend != "mps"), None) or (good[0] if good else None)
    if best is not None:
        return torch.device(best.torch_device), best, (
            f"{best.name} passed every probe step in {best.probe.seconds:.1f} s"
            f"{views.cached(best.probe)}.")
    if failed or any(not g.usable for g in gpus):
        warns.append("Falling back to the CPU: no GPU both passed its probe and is free of "
                     "known problems.")
        names = "; ".join(f"{g.label} " + (
            g.probe.message if g in failed else
            "has a known problem (see the warnings)" if not g.usable else "was not probed")
            for g in gpus)
        return torch.device("cpu"), None, f"no GPU can be trusted ({names})."
    # "not probed": only when none was targeted
    return torch.device("cpu"), None, "no GPU was probed." if gpus else f"no GPU found: {none_found}."

