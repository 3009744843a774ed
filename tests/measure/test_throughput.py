"""ThroughputMonitor: the rate it reports must be the wall clock's, with the waiting for data
named; FLOP counts must be the analytic ones; MFU must use the right peak."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from hybridnb.measure.throughput import ThroughputMonitor, peak_tflops
from hybridnb.train.step import _count_pass as _REAL_COUNT_PASS
from hybridnb.train.step import count_flops


class SlowDataset(Dataset):
    """Each item takes ``delay`` seconds to load: a loader-bound run."""

    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.delay)
        return torch.randn(16), torch.randn(1)


def _train_step(model, opt, x, y) -> None:
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def test_slow_dataset_rate_is_the_wall_clock_and_data_bound():
    model = nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowDataset(4 * 24, delay=0.005), batch_size=4)
    mon = ThroughputMonitor("cpu", warmup_steps=2, every=5)
    t0 = time.perf_counter()
    n = 0
    for x, y in mon.batches(loader):
        _train_step(model, opt, x, y)
        mon.step_done(len(x))
        n += len(x)
    wall_rate = n / (time.perf_counter() - t0)
    s = mon.summary()
    assert s["samples_per_s"] == pytest.approx(wall_rate, rel=0.10)
    assert s["data_wait_pct"] > 50
    assert s["data_bound"] is True
    assert s["samples"] == n - 2 * 4 and s["steps"] == 22  # warm-up steps are not counted
    # the compute-only figure is what a step timer would say: far above the truth
    assert s["compute_samples_per_s"] > 2 * s["samples_per_s"]


def test_compute_bound_loop_is_not_data_bound():
    w = torch.randn(128, 128) / 12
    batches = [torch.randn(64, 128) for _ in range(12)]
    mon = ThroughputMonitor("cpu", warmup_steps=1, every=4)
    for x in mon.batches(batches):
        for _ in range(20):
            x = torch.tanh(x @ w)
        mon.step_done(64)
    s = mon.summary()
    assert s["data_wait_pct"] < 20 and s["data_bound"] is False
    assert s["steps"] == 11 and s["samples"] == 11 * 64
    assert s["compute_samples_per_s"] >= s["samples_per_s"]


def test_warmup_steps_are_left_out():
    mon = ThroughputMonitor("cpu", warmup_steps=2, every=3)
    for i in range(8):
        time.sleep(0.15 if i < 2 else 0.01)  # compiling, then fast steps
        mon.step_done(10)
    s = mon.summary()
    assert s["steps"] == 6
    assert s["samples_per_s"] > 300  # 10 samples / ~0.01 s, not dragged down by the warm-up
    assert ThroughputMonitor("cpu", warmup_steps=3).summary()["samples_per_s"] is None


def test_linear_flops_match_the_analytic_count():
    batch, fan_in, fan_out = 8, 64, 32
    layer = nn.Linear(fan_in, fan_out)
    x = torch.randn(batch, fan_in)
    forward = 2 * batch * fan_in * fan_out  # one multiply and one add per weight per sample
    assert count_flops(layer, (x,)) == 2 * forward  # + the weight gradient
    assert count_flops(layer, x.requires_grad_()) == 3 * forward  # + the input gradient
    assert layer.weight.grad is None, "counting leaves gradients as they were"


def test_count_flops_leaves_batchnorm_statistics_alone():
    model = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4)).train()
    count_flops(model, torch.randn(5, 6))
    assert model.training and int(model[1].num_batches_tracked) == 0


class _MadeOnTheCpu(nn.Module):
    """A forward that makes a tensor on a real device: it cannot run on meta."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(3, 4, 5)

    def forward(self, x):
        return self.conv(x) + torch.ones(1)


def test_count_flops_on_meta_equals_the_real_count(monkeypatch):
    from braindecode.models import EEGNeX

    from hybridnb.train import step

    torch.manual_seed(0)
    model = EEGNeX(n_chans=4, n_outputs=1, n_times=64, sfreq=32)  # parametrized constraints too
    x = torch.randn(3, 4, 64)
    weights = [p.detach().clone() for p in model.parameters()]
    on_meta = count_flops(model, (x,))
    real_passes = []
    monkeypatch.setattr(step, "_count_on_meta", lambda *a: None)
    monkeypatch.setattr(step, "_count_pass", lambda *a: real_passes.append(a[1]) or
                        _REAL_COUNT_PASS(*a))
    assert count_flops(model, (x,)) == on_meta > 0
    assert real_passes and real_passes[0][0] is x  # the second count really ran on the tensors
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())


def test_a_model_that_cannot_run_on_meta_is_counted_for_real():
    from hybridnb.train import step

    model = _MadeOnTheCpu()
    x = torch.randn(2, 3, 20)
    assert step._count_on_meta(model, (x,)) is None
    forward = 2 * 2 * 4 * 3 * 5 * 16  # batch, out, in, taps, output length
    assert count_flops(model, (x,)) == 2 * forward
    assert model.conv.weight.grad is None


def test_mfu_uses_the_peak_for_the_precision():
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.0
    assert peak_tflops("NVIDIA H100 PCIe", "bf16") == 756.0
    assert peak_tflops("NVIDIA H100 NVL", "bf16") is None  # not in the table: no guess
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "tf32") == 156.0
    assert peak_tflops("NVIDIA A10", "bf16") == 125.0
    assert peak_tflops("Tesla T4", "bf16") is None  # no bf16 hardware
    assert peak_tflops("Some Future GPU", "bf16") is None
    mon = ThroughputMonitor("cpu", warmup_steps=0, every=2, flops_per_sample=1e9,
                            precision="bf16")
    mon.peak = 10.0  # a device whose dense peak is 10 TFLOP/s
    for _ in range(4):
        time.sleep(0.01)
        mon.step_done(100)
    s = mon.summary()
    assert s["tflops"] == pytest.approx(s["samples_per_s"] * 1e9 / 1e12)
    assert s["mfu"] == pytest.approx(s["tflops"] / 10.0)
    assert ThroughputMonitor("cpu").summary()["mfu"] is None  # no peak on a CPU


def test_pausing_between_steps_does_not_synchronise_and_leaves_the_pause_out(monkeypatch):
    import hybridnb.measure.throughput as throughput

    syncs = []
    monkeypatch.setattr(throughput, "synchronize", lambda device: syncs.append(device))
    mon = ThroughputMonitor("cpu", warmup_steps=0, every=20)
    synced_at_start = len(syncs)
    for _ in range(5):
        mon.step_done(10)
        with mon.paused():
            time.sleep(0.05)  # validation between steps
    assert len(syncs) == synced_at_start  # only the measuring points synchronise
    s = mon.summary()
    assert s["seconds"] < 0.05 and s["samples"] == 50  # the 0.25 s of pauses are left out
