"""How long ``hybridnb.detect()`` takes: cold, cached, and with a GPU probe that hangs.

- cold: a fresh Python process that has already imported torch calls detect() once (on a
  CPU-only machine no probe child is needed);
- cached: a second call in the same process (median per call over 2000 calls);
- known-good GPU, fresh process: a simulated GPU whose passed probe is in the on-disk probe
  cache (a first process probed it); a new process's first detect() must answer without a
  child, in <= 0.3 s (issue 14 item 4);
- simulated GPU, probe passes: a fake NVML inventory and a simulated probe child that imports
  torch and runs every step on CPU tensors (what a GPU machine pays, minus the GPU's own time);
- simulated GPU, probe hangs: the child hangs importing torch; detect() must return by
  probe_timeout + 1 s and leave no process behind.

Run: ``.venv/bin/python -m bench.bench_detect`` (about 30 s here).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time

import psutil

from bench.common import interleaved, markdown_table, median, spread, write_result
from hybridnb_tools.gpu_sim import fake_gpu

HANG_TIMEOUT = 3.0
REPEATS = 3
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

COLD = """
import time, torch, warnings
t0 = time.perf_counter()
import hybridnb
hw = hybridnb.detect()
dt = time.perf_counter() - t0
print(dt, hw.device)
"""


def cold() -> float:
    out = subprocess.run([sys.executable, "-c", COLD], capture_output=True, text=True, cwd=ROOT,
                         timeout=120, check=True)
    seconds, device = out.stdout.split()
    cold.device = device
    return float(seconds)


def cached() -> float:
    D = importlib.import_module("hybridnb.hardware.detect")
    D.detect()
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        D.detect()
    return (time.perf_counter() - t0) / n


def simulated_t4(simulate: dict):
    """One pretend NVIDIA T4 for detect(), NVML and torch.cuda faked in its probe child too."""
    gpu = {"name": "Simulated T4", "total_memory": 15 * 2**30, "capability": [7, 5]}
    return fake_gpu.simulated({"gpus": 1, "gpu": gpu, **simulate})


KNOWN_GOOD = """
import time, torch
torch.version.cuda = torch.version.cuda or "13.0"  # a CPU-only wheel plays a CUDA build
t0 = time.perf_counter()
import hybridnb
from hybridnb.hardware import gpu_info
from hybridnb.hardware.gpu_info import GpuInfo
gpu = GpuInfo(index=0, physical_index=0, backend="cuda", name="Simulated A100",
              total_memory=80 * 2**30, free_memory=79 * 2**30, capability=(8, 0),
              driver_version="580.65", driver_cuda="13.0", uuid="GPU-bench-0000")
gpu_info.nvml_inventory = lambda: ([gpu], "NVML: simulated")
hw = hybridnb.detect()
dt = time.perf_counter() - t0
print(dt, hw.device, hw.gpus[0].probe.cached)
"""


def known_good_fresh_process(cache_dir: str) -> float:
    """A fresh process's first detect() on a known-good (simulated) GPU; the first call of a
    round probes and fills the cache, the others must hit it."""
    env = fake_gpu.environ({}, {**os.environ, "HYBRIDNB_CACHE_DIR": cache_dir})
    env.pop("HYBRIDNB_DEVICE", None)
    out = subprocess.run([sys.executable, "-c", KNOWN_GOOD], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=120, check=True)
    seconds, device, cached = out.stdout.split()
    assert device == "cuda:0", out.stdout
    return float(seconds) if cached == "True" else float("nan")


LEFT_BEHIND: list[int] = []


def probe_pass() -> float:
    D = importlib.import_module("hybridnb.hardware.detect")
    with simulated_t4({}):
        t0 = time.perf_counter()
        hw = D.detect(refresh=True, probe_timeout=60)
        dt = time.perf_counter() - t0
    assert hw.device.type == "cuda", hw.settings.reasons["device"]
    return dt


def probe_hang() -> float:
    import warnings

    D = importlib.import_module("hybridnb.hardware.detect")
    with simulated_t4({"hang_at": "import"}), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        hw = D.detect(refresh=True, probe_timeout=HANG_TIMEOUT)
        dt = time.perf_counter() - t0
    assert hw.device.type == "cpu" and hw.gpus[0].probe.verdict == "hung"
    LEFT_BEHIND.append(len(psutil.Process().children(recursive=True)))
    return dt


def main() -> None:
    import tempfile

    import torch  # noqa: F401  (timings below exclude importing torch)

    with tempfile.TemporaryDirectory() as cache_dir:
        known_good_fresh_process(cache_dir)  # the first process probes and fills the cache
        runs = interleaved({"cold": cold, "cached": cached, "pass": probe_pass,
                            "hang": probe_hang,
                            "known": lambda: known_good_fresh_process(cache_dir)},
                           repeats=REPEATS)
    rows = [
        {"case": "cold: first detect() in a fresh process (torch already imported)",
         "median": f"{median(runs['cold']) * 1e3:.0f} ms",
         "min-max": f"{min(runs['cold']) * 1e3:.0f}-{max(runs['cold']) * 1e3:.0f} ms"},
        {"case": "known-good GPU (simulated inventory), fresh process, probe verdict cached "
                 "on disk (torch already imported; NVML's own start not included)",
         "median": f"{median(runs['known']) * 1e3:.0f} ms",
         "min-max": f"{min(runs['known']) * 1e3:.0f}-{max(runs['known']) * 1e3:.0f} ms"},
        {"case": "cached: detect() again", "median": f"{median(runs['cached']) * 1e6:.2f} µs",
         "min-max": f"{min(runs['cached']) * 1e6:.2f}-{max(runs['cached']) * 1e6:.2f} µs"},
        {"case": "simulated GPU, probe passes (child imports torch)",
         "median": f"{median(runs['pass']):.2f} s", "min-max": spread(runs["pass"]) + " s"},
        {"case": f"simulated GPU, probe hangs (probe_timeout={HANG_TIMEOUT:g} s)",
         "median": f"{median(runs['hang']):.2f} s", "min-max": spread(runs["hang"]) + " s"},
    ]
    body = (f"{REPEATS} interleaved rounds (cold, cached, pass, hang, known-good). Device chosen "
            "by the cold "
            f"runs: {getattr(cold, 'device', '?')}. Processes left after each hung probe: "
            f"{LEFT_BEHIND}.\n\n" + markdown_table(rows))
    goals = [
        ("detect() answers in < 1 s on this CPU-only machine (cold, excluding import torch)",
         median(runs["cold"]) < 1.0),
        ("a cached detect() takes <= 1 ms", median(runs["cached"]) <= 1e-3),
        ("on a known-good GPU a fresh process's detect() answers in <= 0.3 s (worst of "
         f"{REPEATS}; probe verdict from the disk cache, no child)", max(runs["known"]) <= 0.3),
        (f"with a hung probe detect() returns within probe_timeout + 1 s (worst of {REPEATS})",
         max(runs["hang"]) <= HANG_TIMEOUT + 1.0),
        ("no probe process is left behind after a hang", all(n == 0 for n in LEFT_BEHIND)),
    ]
    write_result("detect", "hybridnb.detect() latency", body, goals)


if __name__ == "__main__":
    main()
