"""Memory samplers: NVML device mapping by UUID, torch/MPS/host numbers, the sampler thread.

GPU numbers are faked (monkeypatched torch.cuda / torch.mps functions and a fake pynvml module
installed under ``hardware.nvml``, the one NVML module); no test needs a GPU.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from hybridnb.hardware import nvml as nvml_module
from hybridnb.measure import memory, timing

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
        return self.uuids[h[1]]

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


def test_uuid_from_torch_picks_the_right_nvml_device_even_when_ordinals_differ(fake_nvml,
                                                                                 monkeypatch):
    fake_nvml(FakeNVML())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def torch_says(uuid):
        monkeypatch.setattr(nvml_module, "initialised_properties",
                            lambda index: SimpleNamespace(uuid=uuid))

    # torch's cuda:0 is the third card in PCI order (CUDA_DEVICE_ORDER=FASTEST_FIRST, say).
    torch_says("cccc-2222")
    handle, how = nvml_module.locate(0)
    assert handle == ("handle", 2) and "UUID" in how
    torch_says("GPU-BBBB-1111")
    assert nvml_module.locate(0)[0] == ("handle", 1)
    torch_says("dddd")
    handle, how = nvml_module.locate(0)
    assert handle is None and "dddd" in how


def test_cuda_visible_devices_indices_and_uuid_prefixes_are_respected(fake_nvml, monkeypatch):
    fake_nvml(FakeNVML())
    locate = nvml_module.locate

    def visible(value):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)

    visible("2,0")
    assert locate(0)[0] == ("handle", 2)
    assert locate(1)[0] == ("handle", 0)
    handle, how = locate(2)
    assert handle is None and "past" in how
    visible("GPU-bbbb")  # CUDA accepts unique UUID prefixes
    assert locate(0)[0] == ("handle", 1)
    visible("MIG-x")
    handle, how = locate(0)
    assert handle is None and "MIG" in how
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert locate(1)[0] == ("handle", 1)
    fake_nvml(FakeNVML(uuids=("GPU-ab1", "GPU-ab2")))
    visible("GPU-ab")
    handle, how = locate(0)
    assert handle is None and "GPU-ab" in how  # ambiguous: CUDA shows no GPU


def torch_uuids(monkeypatch, by_index: dict[int, str]) -> None:
    """What torch reports as each CUDA ordinal's UUID (CUDA 'initialised' by fake_cuda)."""
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(uuid=by_index[i]))


def test_cuda_sampler_reads_torch_and_the_uuid_matched_nvml_device(fake_cuda, monkeypatch,
                                                                   fake_nvml):
    nvml = FakeNVML()
    fake_nvml(nvml)
    torch_uuids(monkeypatch, {1: "GPU-aaaa-0000", 0: "GPU-cccc-2222"})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")  # would say NVML 0: the UUID wins
    sampler = memory.MemorySampler("cuda:1")
    s = sampler.sample()
    assert s["gpu_allocated"] == 5 * GIB and s["gpu_reserved"] == 6 * GIB
    assert s["gpu_peak"] == 10 * GIB
    assert s["gpu_used"] == 1 * GIB and s["gpu_total"] == 16 * GIB and s["gpu_util"] == 10
    assert s["rss"] > 0 and s["ram_total"] >= s["ram_used"] > 0
    sampler.close()
    # NVML belongs to hardware.nvml, open for the whole process: a sampler never shuts it down
    # (another sampler, or the probe cache, may be reading it)
    assert nvml.shutdowns == 0
    sampler.close()  # twice is harmless
    assert nvml.shutdowns == 0 and len(sampler.series().times) == 2


def test_plain_cuda_means_the_current_device(fake_cuda, monkeypatch, fake_nvml):
    fake_nvml(FakeNVML())
    torch_uuids(monkeypatch, {1: "GPU-aaaa-0000", 0: "GPU-cccc-2222"})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    s = memory.MemorySampler("cuda").sample()
    assert s["gpu_allocated"] == 5 * GIB and s["gpu_used"] == 1 * GIB
    assert memory.cuda_index("cuda") == 1 and memory.cuda_index("cuda:0") == 0
    assert timing.nvml_busy_reader("cuda")() == 10.0


def test_nvml_failures_are_reported_not_fatal(fake_cuda, monkeypatch, fake_nvml):
    class NoLibrary(FakeNVML):
        def nvmlInit(self):
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    fake_nvml(NoLibrary())
    sampler = memory.MemorySampler("cuda:0")
    assert any("NVML not available" in n and "libnvidia-ml" in n for n in sampler.notes)
    s = sampler.sample()
    assert s["gpu_allocated"] == 1 * GIB and "gpu_used" not in s and s["rss"] > 0

    # NVML working at start, then the GPU falls off the bus: the probe is dropped, noted.
    nvml = FakeNVML()
    fake_nvml(nvml)
    torch_uuids(monkeypatch, {0: "GPU-aaaa-0000"})
    sampler = memory.MemorySampler("cuda:0")
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
    probes, _ = memory.probes_for("cuda:0")
    assert dict(probes)["torch.cuda"]() == {}


class CountingNVML(FakeNVML):
    def __init__(self, called: list) -> None:
        super().__init__()
        self.called = called

    def nvmlInit(self):
        self.called.append(1)


def test_rocm_skips_nvml(fake_cuda, monkeypatch, fake_nvml):
    monkeypatch.setattr(torch.version, "hip", "6.2")
    called = []
    fake_nvml(CountingNVML(called))
    probes, notes = memory.probes_for("cuda:0")
    assert not called and [n for n, _ in probes] == ["torch.cuda", "host"]
    assert "ROCm" in notes[0]


def test_mps_and_cpu_probes(monkeypatch, fake_nvml):
    monkeypatch.setattr(torch.mps, "current_allocated_memory", lambda: 3 * GIB)
    monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: 4 * GIB)
    s = memory.MemorySampler("mps").sample()
    assert s["mps_current"] == 3 * GIB and s["mps_driver"] == 4 * GIB and s["rss"] > 0
    called = []
    fake_nvml(CountingNVML(called))
    probes, notes = memory.probes_for("cpu")
    assert not called and [n for n, _ in probes] == ["host"] and notes == []


def test_a_lost_device_is_no_longer_read(fake_cuda, monkeypatch, fake_nvml):
    fake_nvml(FakeNVML())
    torch_uuids(monkeypatch, {0: "GPU-aaaa-0000"})
    sampler = memory.MemorySampler("cuda:0")
    assert "gpu_used" in sampler.sample()

    def boom(*a):
        raise AssertionError("the lost device was called")

    sampler.drop_device("device-side assert triggered")
    monkeypatch.setattr(torch.cuda, "memory_allocated", boom)
    s = sampler.sample()
    assert "gpu_allocated" not in s and "gpu_used" not in s and s["rss"] > 0
    assert any("device-side assert" in n for n in sampler.notes)


def test_one_sampler_thread_serves_as_a_peak_reader_with_an_exact_peak():
    values = iter([1.0, 5.0, 2.0] + [3.0] * 10**6)
    with memory.MemorySampler("cpu", interval=0.001, max_points=4,
                              probes=[("x", lambda: {"v": next(values)})]) as sampler:
        time.sleep(0.05)
    series = sampler.series()
    assert series.values["v"][0] == 1.0  # sampled on entry
    assert series.peaks["v"] == 5.0  # exact though the series was halved past max_points
    assert len(series.times) <= 5
    assert not [t for t in __import__("threading").enumerate() if t.name == "hybridnb-sampler"
                and t.is_alive()]


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
    assert series.peaks["rss"] == series.values["rss"][-1]


def test_heap_reader_sees_an_allocation():
    read, what = memory.heap_reader()
    before = read()
    block = b"x" * (64 * 2**20)  # written: the resident set rises too where that is the reader
    assert read() - before >= 60 * 2**20 and what
    del block
