"""Fault simulation for the probe child: how the tests play a GPU on a machine without one.

Only the child reads ``HYBRIDNB_PROBE_SIMULATE``, a JSON object such as ``{"hang_at": "matmul"}``.
With it set the steps run on CPU tensors while pretending to be a GPU, and inject the fault asked
for:

- ``hang_at`` (+ ``helper``: start a helper process first, to show the group kill);
- ``crash_at`` (a SIGSEGV; ``"exit"``: after the last step, as a driver teardown can);
- ``error_at`` (+ ``message``: an exception, e.g. a real CUDA error text);
- ``wrong_at`` (``"matmul"`` | ``"copy_back"``: corrupt the device result);
- ``gpu`` (properties to report: name, total_memory, free_memory, capability);
- ``torch: false`` (skip importing torch until a tensor step needs it: fast, for timing tests);
- ``delay`` (seconds each step after the import takes);
- ``by_index`` (``{"1": {...}}``: settings for one GPU index only);
- ``gpus`` (N: ``detect()`` lists N simulated NVIDIA GPUs instead of NVML's, each probed with
  its ``by_index`` settings: how notebook 01 shows a hung or broken GPU on any machine).

The real steps (``probe.child``) call the hooks below and know nothing of the faults.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from hybridnb.env import PROBE_SIMULATE_ENV as SIMULATE_ENV
from hybridnb.env import current

DEFAULT_GPU = {"name": "Simulated GPU", "total_memory": 16 * 2**30, "capability": [8, 0]}


def read(index: int, environ: dict[str, str] | None = None) -> dict | None:
    """This GPU's simulation settings, or None when no simulation is asked for."""
    raw = (current() if environ is None else environ).get(SIMULATE_ENV)
    if not raw:
        return None
    try:
        sim = json.loads(raw)
    except ValueError as exc:
        raise SystemExit(f"{SIMULATE_ENV}={raw!r} is not valid JSON: {exc}") from exc
    merged = {k: v for k, v in sim.items() if k != "by_index"}
    merged.update(sim.get("by_index", {}).get(str(index), {}))
    return merged


def listed(environ: dict[str, str] | None = None) -> list[dict] | None:
    """The simulated GPUs ``detect()`` lists (name and memory per index) when the simulation
    asks for ``gpus``: N; None otherwise (NVML's inventory is used)."""
    env = current() if environ is None else environ
    raw = env.get(SIMULATE_ENV)
    n = json.loads(raw).get("gpus") if raw else None
    if not n:
        return None
    out = []
    for i in range(int(n)):
        gpu = {**DEFAULT_GPU, **(read(i, env) or {}).get("gpu", {})}
        name = gpu["name"] if "simulated" in gpu["name"].lower() else f"{gpu['name']} (simulated)"
        out.append({"name": name, "total_memory": gpu["total_memory"],
                    "capability": tuple(gpu["capability"])})
    return out


def inject(sim: dict | None, step: str, emit: Callable[..., None]) -> None:
    """Before ``step`` (or at ``"exit"``): hang, crash, raise or wait as the simulation says."""
    if not sim:
        return
    if sim.get("hang_at") == step:
        if sim.get("helper"):  # a helper process in the same group, as drivers sometimes start
            helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            emit(e="info", info={"helper_pid": helper.pid})
        while True:  # a hang: nothing more is written, as with a wedged driver call
            time.sleep(3600)
    if sim.get("crash_at") == step:
        if hasattr(signal, "SIGSEGV") and os.name == "posix":
            signal.raise_signal(signal.SIGSEGV)
        os.abort()
    if sim.get("error_at") == step:
        raise RuntimeError(sim.get("message") or "CUDA error: an illegal memory access was "
                           "encountered\nCUDA kernel errors might be asynchronously reported at "
                           "some other API call, so the stacktrace below might be incorrect.")
    if step != "import" and sim.get("delay"):
        time.sleep(float(sim["delay"]))


def skips_torch(sim: dict | None) -> bool:
    """A light simulation imports torch only when a tensor step needs it."""
    return sim is not None and sim.get("torch") is False


def device_facts(sim: dict) -> dict:
    """The properties the simulated GPU reports in the 'device available' step."""
    return {**DEFAULT_GPU, **sim.get("gpu", {}), "simulated": True}


def memory(sim: dict) -> tuple[int, int]:
    """(free, total) bytes of the simulated GPU."""
    gpu = sim.get("gpu", {})
    total = int(gpu.get("total_memory", DEFAULT_GPU["total_memory"]))
    return int(gpu.get("free_memory", total * 0.95)), total


def corrupt(sim: dict | None, step: str, result, reference=None):
    """The device's ``result`` of ``step``, corrupted when ``wrong_at`` names that step."""
    if (sim or {}).get("wrong_at") != step:
        return result
    result = result.clone()
    if step == "matmul":  # one corrupted element, as a bad card gives
        result[17, 42] += 0.5 * float(reference.abs().max())
    else:
        result[1000:1010] = 0
    return result
