"""The safety net on a real CUDA GPU (skipped without one; see conftest.py).

An isolated fit of a braindecode model (ShallowFBCSPNet, tiny data) meets a real device-side
assert, a GPU kernel that never ends (``torch.cuda._sleep``) and an abort in the worker; each ends
on the CPU with trained weights in the kernel's model, and the kernel never started CUDA. An
out-of-memory error under ``memory_fraction`` splits the batch and the kernel learns the
micro-batch. ``cudnn.benchmark`` is put back after fit. The five notebooks run through the demo
runner in quick mode.

Faults are triggered by the model itself, on its ``trigger``-th training forward on a CUDA
input (the first step of the second epoch: past the grace the worker asks for while the CUDA
context starts, so ``step_timeout`` bounds the endless kernel): the worker's copy counts its own
calls, and the CPU continuation never triggers. An endless kernel in the very first step is
bounded by that grace instead, which the run names once (a "grace" event).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch
from torch import nn

from hybridnb import failures
from hybridnb.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
CHANS, TIMES, N = 8, 200, 128
EPOCHS, BATCH = 2, 32  # 4 steps an epoch


def shallow() -> nn.Module:
    from braindecode.models import ShallowFBCSPNet

    torch.manual_seed(0)
    return ShallowFBCSPNet(n_chans=CHANS, n_outputs=1, n_times=TIMES, final_conv_length="auto")


class Faulty(nn.Module):
    """ShallowFBCSPNet that fails on its ``trigger``-th training forward on a CUDA input:
    ``assert`` (a real device-side assert: an embedding index out of range), ``sleep`` (a GPU
    kernel spinning for ever: the next synchronisation never returns), ``abort`` (os.abort)."""

    def __init__(self, kind: str, trigger: int = 5) -> None:
        super().__init__()
        self.net, self.kind, self.trigger, self.calls = shallow(), kind, trigger, 0
        self.table = nn.Embedding(4, 1)

    def forward(self, x):
        if x.is_cuda and self.training:
            self.calls += 1
            if self.calls == self.trigger:
                if self.kind == "assert":
                    bad = torch.full((x.shape[0],), 1000, device=x.device, dtype=torch.long)
                    return self.net(x) + self.table(bad)
                if self.kind == "sleep":
                    torch.cuda._sleep(1 << 62)
                if self.kind == "abort":
                    os.abort()
        return self.net(x)


def windows(n=N, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, CHANS, TIMES, generator=g)
    return x, x[:, :2].mean(dim=(1, 2)).unsqueeze(1) * 5


def children():
    return [p for p in psutil.Process().children(recursive=True) if p.status() != "zombie"]


@pytest.fixture(autouse=True)
def _fresh_lost_devices(monkeypatch):
    monkeypatch.setattr(failures, "_LOST", set())


@pytest.mark.parametrize("kind", ["assert", "sleep", "abort"])
def test_a_gpu_failure_in_an_isolated_fit_ends_on_the_cpu_with_trained_weights(tmp_path, kind):
    model = Faulty(kind)
    before = [p.detach().clone() for p in model.parameters()]
    tr = Trainer(model, device="cuda", batch_size=BATCH, epochs=EPOCHS, lr=1e-3, seed=0,
                 live=False, verbose=False, checkpoint_dir=tmp_path / "ck", snapshot_every=1,
                 step_timeout=20 if kind == "sleep" else None)
    assert tr.isolated  # "auto" isolates a CUDA run
    tr.fit(windows(), val=windows(64, seed=1))

    kinds = [e.kind for e in tr.events]
    # the assert is a sticky error the worker survives itself (device_lost, then the CPU in the
    # worker); the endless kernel and the abort take the worker down (worker_lost, then the
    # CPU in the kernel)
    lost = "device_lost" if kind == "assert" else "worker_lost"
    assert kinds.count(lost) == 1, [str(e) for e in tr.events]
    message = next(e.message for e in tr.events if e.kind == lost)
    if kind == "sleep":
        assert "silent for" in message and "'step'" in message
    if kind == "abort":
        assert "SIGABRT" in message
    assert tr.device.type == "cpu" and not tr.isolated
    assert tr.history["epoch"].tolist() == list(range(EPOCHS))
    assert tr.steps["global_step"].tolist() == list(range(1, EPOCHS * N // BATCH + 1))
    assert math.isfinite(tr.history["val_loss"].iloc[-1])
    assert any(not torch.equal(a, b.detach().cpu())
               for a, b in zip(before, model.parameters(), strict=True))
    assert not torch.cuda.is_initialized()  # the kernel never started CUDA
    assert not children()


def test_a_hang_in_the_first_cuda_step_is_bounded_by_the_grace_the_worker_asked_for(
        tmp_path, monkeypatch):
    """The first step on CUDA (context creation) is the only one with a grace, and the run says
    so once; an endless kernel there is found once the (shortened) grace has passed."""
    from hybridnb.env import FIRST_STEP_GRACE_ENV

    monkeypatch.setenv(FIRST_STEP_GRACE_ENV, "60")
    tr = Trainer(Faulty("sleep", trigger=1), device="cuda", batch_size=BATCH, epochs=1,
                 live=False, verbose=False, step_timeout=10, speedups=False)
    tr.fit(windows())
    kinds = [e.kind for e in tr.events]
    assert kinds.count("grace") == 1 and kinds.count("worker_lost") == 1
    lost = next(e.message for e in tr.events if e.kind == "worker_lost")
    assert "'first step'" in lost and "the grace the worker asked for" in lost
    assert tr.device.type == "cpu" and len(tr.history) == 1
    assert not torch.cuda.is_initialized()
    assert not children()


def test_an_error_in_the_users_model_on_the_gpu_keeps_the_steps_done(tmp_path):
    """A plain exception from the model mid-run (epoch 1): the kernel holds the worker's steps
    and weights, then raises the error with its type."""

    class Raises(Faulty):
        def forward(self, x):
            if x.is_cuda and self.training:
                self.calls += 1
                if self.calls == 6:
                    raise ValueError("bad window (injected)")
            return self.net(x)

    model = Raises("none")
    before = [p.detach().clone() for p in model.parameters()]
    tr = Trainer(model, device="cuda", batch_size=BATCH, epochs=EPOCHS, live=False,
                 verbose=False, speedups=False)  # no measuring forwards before the steps
    with pytest.raises(ValueError, match="bad window"):
        tr.fit(windows())
    assert tr.global_step == 5 and tr.steps["global_step"].tolist() == [1, 2, 3, 4, 5]
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert not torch.cuda.is_initialized()
    assert not children()


class Wide(nn.Module):
    """105M parameters (1.7 GiB with gradients and AdamW) and about 1 MiB of activations per
    sample: a batch of 4096 needs about 4 GiB more, 1024 about 1 GiB."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(CHANS * TIMES, 1 << 16), nn.Linear(1 << 16, 1)

    def forward(self, x):
        return self.down(torch.relu(self.up(x.flatten(1))))


def test_an_oom_under_memory_fraction_splits_the_batch_and_the_kernel_learns_it():
    total = _nvml_total_bytes()
    fraction = (3 << 30) / total  # 3 GiB: the weights and ~1000 samples' activations
    tr = Trainer(Wide(), device="cuda", batch_size=4096, epochs=1, steps_per_epoch=2,
                 precision="fp32", memory_fraction=fraction, live=False, verbose=False,
                 speedups=False, schedule=None)
    tr.fit(windows(8192))
    kinds = [e.kind for e in tr.events]
    assert "oom_split" in kinds and "device_lost" not in kinds and "worker_lost" not in kinds
    assert "memory_fraction" in kinds
    assert tr.device.type == "cuda" and tr.isolated
    assert tr.state.micro is not None and tr.state.micro < 4096
    assert len(tr.history) == 1 and math.isfinite(tr.history["train_loss"].iloc[0])
    assert not torch.cuda.is_initialized()


def _nvml_total_bytes() -> int:
    """GPU 0's memory from NVML (the test process never starts CUDA)."""
    from hybridnb.hardware import nvml

    memory = nvml.memory(nvml.handle_by_index(0))
    assert memory is not None, f"NVML unavailable: {nvml.status()}"
    return memory.total


def test_cudnn_benchmark_is_put_back_after_a_fit_that_turned_it_on():
    """In a fresh interpreter (this one must not start CUDA): an in-process CUDA fit with the
    speedups turns cuDNN autotuning on for its fixed shapes, and off again at the end."""
    code = (
        "import torch, hybridnb as hn\n"
        "from braindecode.models import ShallowFBCSPNet\n"
        "torch.backends.cudnn.benchmark = False\n"
        f"x = torch.randn(128, {CHANS}, {TIMES}); y = torch.randn(128, 1)\n"
        f"m = ShallowFBCSPNet(n_chans={CHANS}, n_outputs=1, n_times={TIMES})\n"
        "tr = hn.Trainer(m, device='cuda', isolate=False, batch_size=32, epochs=1, "
        "live=False, verbose=False, speedups='auto')\n"
        "seen = []\n"
        "orig = tr.placement.speed_up\n"
        "def spy(*a, **k):\n"
        "    orig(*a, **k); seen.append(torch.backends.cudnn.benchmark)\n"
        "tr.placement.speed_up = spy\n"
        "tr.fit((x, y))\n"
        "print('RESULT', seen, torch.backends.cudnn.benchmark)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT"))
    assert line == "RESULT [True] False"


def test_the_five_notebooks_run_on_the_gpu_in_quick_mode(tmp_path):
    out = subprocess.run([sys.executable, "-m", "hybridnb_tools.demo", "--quick", "--no-html",
                          "--out", str(tmp_path / "run")], cwd=ROOT, capture_output=True,
                         text=True, timeout=3600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    executed = sorted((tmp_path / "run").glob("0*.ipynb"))
    assert len(executed) == 5, executed
