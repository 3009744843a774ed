"""The host side of the hardware report: usable CPU cores, RAM, compilers. Cheap, no torch."""

from __future__ import annotations

import math
import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path

import psutil

from hybridnb.env import current
from hybridnb.platform import proc_path

NATIVE_BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})  # bf16 computed in CPU hardware


@dataclass
class HostInfo:
    cores_usable: int          # what this process may run on (affinity, cgroup quota)
    cores_logical: int         # what the machine has
    ram_total: int             # bytes
    ram_available: int         # bytes
    system: str                # "Linux 6.1.0 x86_64"
    python: str
    cpu: str
    cores_note: str = ""       # why usable < logical, when it is


def host_info() -> HostInfo:
    logical = os.cpu_count() or 1
    usable, note = usable_cores()
    vm = psutil.virtual_memory()
    return HostInfo(cores_usable=usable, cores_logical=logical, ram_total=int(vm.total),
                    ram_available=int(vm.available),
                    system=f"{platform.system()} {platform.release()} {platform.machine()}",
                    python=platform.python_version(),
                    cpu=_cpuinfo("model name") or platform.processor() or "?", cores_note=note)


def usable_cores() -> tuple[int, str]:
    """Cores this process may use: CPU affinity, capped by a cgroup CPU quota, and why fewer."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None and quota < affinity:
        return quota, f"cgroup CPU quota allows {quota} of {affinity} cores"
    logical = os.cpu_count() or affinity
    note = f"CPU affinity allows {affinity} of {logical} cores" if affinity < logical else ""
    return affinity, note


def _cgroup_quota(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    try:  # cgroup v2: "max 100000" or "200000 100000"
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return max(1, math.ceil(int(quota) / int(period))) if quota != "max" else None
    except (OSError, ValueError):
        pass
    try:  # cgroup v1
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return max(1, math.ceil(quota / period)) if quota > 0 else None
    except (OSError, ValueError):
        return None


def _cpuinfo(key: str) -> str:
    """The first ``key`` line of /proc/cpuinfo ("" where there is no /proc or no such line)."""
    path = proc_path("cpuinfo")
    try:
        with open(path or os.devnull) as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith(key)), "")
    except OSError:
        return ""


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo; empty where there is no /proc."""
    return set(_cpuinfo("flags").split())


def cxx_compiler() -> str | None:
    """The C++ compiler TorchInductor would use for CPU code ($CXX, else g++/c++/clang++)."""
    candidates = [current().get("CXX", "")] + (["cl"] if os.name == "nt"
                                                 else ["g++", "c++", "clang++"])
    return next(filter(None, map(shutil.which, filter(None, candidates))), None)
