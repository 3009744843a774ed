"""Memory samplers: NVML device mapping by UUID, torch/MPS/host numbers, the sampler thread.

GPU numbers are faked (monkeypatched torch.cuda / torch.mps functions and a fake pynvml module);
no test needs a GPU.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from hybridnb.measure import memory

GIB = 1024**3


class FakeNVML:
    """Three GPUs in NVML (PCI) order with distinct UUIDs and memory numbers."""

    class NVMLError(Exception):
        pass

    def __init__(self, uuids=("GPU-aaaa-0000", "GPU-bbbb-1111", "GPU-cccc-2222"),
                 used=(1 * GIB, 2 * GIB, 3 * GIB), util=(10, 20, 30)):
        self.uuids, self.used, self.util = uuids, used, util
        self.shutdowns = 0
        self.fail_memory = False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("handle", i)

    def nvmlDeviceGetUUID(self, h):
        return self.uuids[h[1]].encode()  # real pynvml may give bytes

    def nvmlDeviceGetMemoryInfo(self, h):
        if self.fail_memory:
            raise self.NVMLError("GPU is lost")
        return SimpleNamespace(used=self.used[h[1]], total=16 * GIB)

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=self.util[h[1]])


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda allocator numbers for ordinals 0 and 1, CUDA 'initialised'."""
    alloc = {0: 1 * GIB, 1: 5 * GIB}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda i: alloc[i])
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: alloc[i] + GIB)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda i: alloc[i] * 2)
    monkeypatch.setattr(torch.version, "hip", None)
    return alloc


def test_uuid_from_torch_picks_the_right_nvml_device_even_when_ordinals_differ():
    nvml = FakeNVML()
    # torch's cuda:0 is the third card in PCI order (CUDA_DEVICE_ORDER=FASTEST_FIRST, say).
    handle, how = memory.nvml_handle_for(0, nvml, uuid="cccc-2222", environ={})
    assert handle == ("handle", 2) and "UUID" in how
    handle, _ = memory.nvml_handle_for(0, nvml, uuid="GPU-BBBB-1111", environ={})
    assert handle == ("handle", 1)
    handle, how = memory.nvml_handle_for(0, nvml, uuid="dddd", environ={})
    assert handle is None and "dddd" in how


def test_cuda_visible_devices_indices_and_uuid_prefixes_are_respected():
    nvml = FakeNVML()
    env = {"CUDA_VISIBLE_DEVICES": "2,0"}
    assert memory.nvml_handle_for(0, nvml, environ=env)[0] == ("handle", 2)
    assert memory.nvml_handle_for(1, nvml, environ=env)[0] == ("handle", 0)
    handle, how = memory.nvml_handle_for(2, nvml, environ=env)
    assert handle is None and "past" in how
    env = {"CUDA_VISIBLE_DEVICES": "GPU-bbbb"}  # CUDA accepts unique UUID prefixes
    assert memory.nvml_handle_for(0, nvml, environ=env)[0] == ("handle", 1)
    handle, how = memory.nvml_handle_for(0, FakeNVML(uuids=("GPU-ab1", "GPU-ab2")),
                                         environ={"CUDA_VISIBLE_DEVICES": "GPU-ab"})
    assert handle is None and "matches 2" in how
    handle, how = memory.nvml_handle_for(0, nvml, environ={"CUDA_VISIBLE_DEVICES": "MIG-x"})
    assert handle is None and "MIG" in how
    assert memory.nvml_handle_for(1, nvml, environ={})[0] == ("handle", 1)


def test_cuda_sampler_reads_torch_and_the_uuid_matched_nvml_device(fake_cuda, monkeypatch):
    nvml = FakeNVML()
    monkeypatch.setattr(memory, "torch_device_uuid", lambda i: "GPU-aaaa-0000" if i == 1
                        else "GPU-cccc-2222")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")  # would say NVML 0: the UUID wins
    sampler = memory.MemorySampler("cuda:1", nvml_loader=lambda: nvml)
    s = sampler.sample()
    assert s["gpu_allocated"] == 5 * GIB and s["gpu_reserved"] == 6 * GIB
    assert s["gpu_peak"] == 10 * GIB
    assert s["gpu_used"] == 1 * GIB and s["gpu_total"] == 16 * GIB and s["gpu_util"] == 10
    assert s["rss"] > 0 and s["ram_total"] >= s["ram_used"] > 0
    sampler.close()
    assert nvml.shutdowns == 1
    sampler.close()  # twice is harmless
    assert nvml.shutdowns == 1


def test_nvml_failures_are_reported_not_fatal(fake_cuda, monkeypatch):
    def broken_loader():
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    sampler = memory.MemorySampler("cuda:0", nvml_loader=broken_loader)
    assert any("NVML not available" in n and "libnvidia-ml" in n for n in sampler.notes)
    s = sampler.sample()
    assert s["gpu_allocated"] == 1 * GIB and "gpu_used" not in s and s["rss"] > 0

    # NVML working at start, then the GPU falls off the bus: the probe is dropped, noted.
    nvml = FakeNVML()
    monkeypatch.setattr(memory, "torch_device_uuid", lambda i: "GPU-aaaa-0000")
    sampler = memory.MemorySampler("cuda:0", nvml_loader=lambda: nvml)
    assert sampler.sample()["gpu_used"] == 1 * GIB
    nvml.fail_memory = True
    s = sampler.sample()
    assert "gpu_used" not in s and s["gpu_allocated"] == 1 * GIB
    assert any("nvml memory probe stopped" in n and "GPU is lost" in n for n in sampler.notes)
    series = sampler.series()
    assert series.values["gpu_used"][0] == 1 * GIB and series.values["gpu_used"][1] != \
        series.values["gpu_used"][1]  # NaN where the source had nothing


def test_torch_probe_never_initialises_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)

    def boom(*a):
        raise AssertionError("would initialise CUDA")

    monkeypatch.setattr(torch.cuda, "memory_allocated", boom)
    assert memory.torch_cuda_probe(0)() == {}


def test_rocm_skips_nvml(fake_cuda, monkeypatch):
    monkeypatch.setattr(torch.version, "hip", "6.2")
    called = []
    probes, notes, _ = memory.probes_for("cuda:0", nvml_loader=lambda: called.append(1))
    assert not called and [n for n, _ in probes] == ["torch.cuda", "host"]
    assert "ROCm" in notes[0]


def test_mps_and_cpu_probes(monkeypatch):
    monkeypatch.setattr(torch.mps, "current_allocated_memory", lambda: 3 * GIB)
    monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: 4 * GIB)
    s = memory.MemorySampler("mps").sample()
    assert s["mps_current"] == 3 * GIB and s["mps_driver"] == 4 * GIB and s["rss"] > 0
    called = []
    probes, notes, _ = memory.probes_for("cpu", nvml_loader=lambda: called.append(1))
    assert not called and [n for n, _ in probes] == ["host"] and notes == []


def test_sampler_thread_collects_until_closed_and_stays_bounded():
    ticks = iter(range(10**6))
    sampler = memory.MemorySampler(
        "cpu", interval=0.01, max_points=20,
        probes=[("fake", lambda: {"rss": float(next(ticks))})])
    sampler.start()
    deadline = time.time() + 5
    while sampler.interval < 0.04 and time.time() < deadline:  # two halvings
        time.sleep(0.01)
    sampler.close()
    n_closed = len(sampler.series().times)
    time.sleep(0.05)
    series = sampler.series()
    assert len(series.times) == n_closed  # nothing collected after close()
    assert 10 <= len(series.times) <= 21  # halved past max_points
    assert sampler.interval >= 0.04  # and sampling slowed down accordingly
    assert series.times == sorted(series.times)
    assert series.values["rss"] == sorted(series.values["rss"])
    assert series.peak("rss") == series.values["rss"][-1]
