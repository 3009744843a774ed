"""The probe's verdicts on disk, so a known-good GPU is not probed again in every new process.

A pass is kept per (GPU UUID, driver, kernel, torch build, probe version) for
``$HYBRIDNB_PROBE_CACHE_TTL`` seconds (a day; 0 turns it off); a new driver or torch is a new
key. Failures are never stored: they can be passing (another process held the GPU), and a stored
one would keep training on the CPU without a fresh look. One JSON file per key in
``<cache dir>/probe/``, written atomically so concurrent ranks are safe.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from pathlib import Path

from hybridnb import env
from hybridnb.hardware.gpu_info import BuildInfo, GpuInfo
from hybridnb.hardware.probe import ProbeResult

VERSION = 1   # bump when the probe's steps change, so older verdicts no longer count
TTL = 24 * 3600.0  # seconds a pass is trusted unless $HYBRIDNB_PROBE_CACHE_TTL says otherwise


def key_for(gpu: GpuInfo, build: BuildInfo) -> dict | None:
    """The facts a stored verdict must match; None without a UUID (nothing stable to key on)."""
    if not gpu.uuid:
        return None
    return {"uuid": gpu.uuid, "backend": gpu.backend, "driver": gpu.driver_version or "",
            "driver_cuda": gpu.driver_cuda or "", "kernel": platform.release(),
            "torch": build.torch, "cuda": build.cuda or "", "hip": build.hip or "",
            "version": VERSION}


def _path(key: dict, environ: dict[str, str] | None) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return env.cache_dir(environ) / "probe" / f"{digest}.json"


def load(key: dict, ttl: float, environ: dict[str, str] | None = None) -> ProbeResult | None:
    """The stored pass for ``key`` if younger than ``ttl`` seconds, else None (also for an
    unreadable or foreign file, which the next store overwrites)."""
    try:
        data = json.loads(_path(key, environ).read_text())
        if data.get("key") != key:
            return None
        result = ProbeResult.from_dict(data["result"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    age = time.time() - (result.proven_at or 0.0)
    if not result.ok or not 0 <= age <= ttl:
        return None
    result.cached = True
    return result


def store(key: dict, result: ProbeResult, environ: dict[str, str] | None = None) -> str:
    """Keep a passed ``result``; "" or, when it cannot be written, a note saying how to fix it
    (the run goes on: the cache only saves time)."""
    if not result.ok or result.cached or result.proven_at is None:
        return ""
    path = _path(key, environ)
    payload = json.dumps({"key": key, "result": result.to_dict()}, indent=1)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".probe-{os.getpid()}-{path.name}")
        tmp.write_text(payload)
        os.replace(tmp, path)
    except OSError as exc:
        return (f"The probe's verdict could not be cached in {path.parent} ({exc}); every new "
                f"process probes again. Set {env.CACHE_DIR_ENV} to a writable folder.")
    return ""
