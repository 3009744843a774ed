"""Trainer(isolate=True): the steps run in a forked worker the kernel supervises. Faults are
injected in the worker only (HYBRIDNB_ISOLATED is set there): a SIGKILL or SIGABRT mid-step, a
step that never returns. The run must finish in the kernel on the CPU, from the last good state,
with nothing left running."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
import torch
from torch import nn

from hybridnb import failures
from hybridnb.train.trainer import Trainer

torch.set_num_threads(1)


def data(n=256, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    return x, torch.sin(x @ torch.linspace(-1, 1, d))


class Net(nn.Module):
    """An MLP with dropout (the RNG matters); in the worker only, training call ``at`` does
    ``fault()``."""

    def __init__(self, at=None, fault=None):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Dropout(0.1), nn.Linear(32, 1))
        self.at, self.fault, self.calls = at, fault, 0

    def forward(self, x):
        if self.training and os.environ.get("HYBRIDNB_ISOLATED"):
            self.calls += 1
            if self.calls == self.at:
                self.fault()
        return self.net(x)


def fit(model, isolate, **kw):
    kw = {"device": "cpu", "batch_size": 32, "epochs": 3, "lr": 1e-2, "seed": 0, "live": False,
          "snapshot_every": 5, "isolate": isolate, **kw}
    tr = Trainer(model, **kw)
    tr.fit(data(), val=data(64, seed=1))
    return tr


def children():
    return [p for p in psutil.Process().children(recursive=True) if p.status() != "zombie"]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                 b.state_dict().values(), strict=True))


@pytest.fixture(autouse=True)
def _fresh_lost_devices(monkeypatch):
    monkeypatch.setattr(failures, "_LOST", set())


def test_an_isolated_run_equals_an_in_process_run_and_fills_the_kernels_model():
    here = fit(Net(), isolate=False)
    model = Net()
    there = fit(model, isolate=True)
    assert there.model is model and same(model, here.model)  # the user's object, trained
    timing = ["samples_per_s", "data_wait_pct", "compute_samples_per_s", "mfu", "time_s",
              "peak_memory_mb", "events"]
    assert there.history.drop(columns=timing).equals(here.history.drop(columns=timing))
    # where it trains and the worker's start-up, each said once; nothing else happened
    assert [e.kind for e in there.events] == ["isolate", "worker_start"]
    assert not children()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGABRT])
def test_a_worker_killed_mid_step_ends_on_the_cpu_from_its_last_state(sig):
    straight = fit(Net(), isolate=False)
    tr = fit(Net(at=23, fault=lambda: os.kill(os.getpid(), sig)), isolate=True)
    lost = [e for e in tr.events if e.kind == "worker_lost"]
    assert len(lost) == 1 and signal.Signals(sig).name in lost[0].message
    assert "step 20" in lost[0].message  # the last state the worker sent (snapshot_every=5)
    assert tr.device.type == "cpu" and tr.global_step == 24 and len(tr.history) == 3
    assert tr.steps["global_step"].tolist() == list(range(1, 25))  # continuous, none doubled
    # resumed in this process from the same state, with the same RNG: a straight run's weights
    assert same(tr.model, straight.model)
    assert not children()


def test_a_hung_step_is_caught_within_step_timeout_and_the_run_finishes():
    t0 = time.perf_counter()
    tr = fit(Net(at=12, fault=lambda: time.sleep(600)), isolate=True, step_timeout=3.0,
             epochs=2)
    elapsed = time.perf_counter() - t0
    hung = [e for e in tr.events if e.kind == "worker_lost"]
    assert len(hung) == 1 and "step_timeout" in hung[0].message
    assert tr.global_step == 16 and elapsed < 3.0 + 5 + 10  # the timeout, +5 s, + the run itself
    assert not children()


def test_an_error_in_the_worker_is_raised_in_the_kernel_with_its_type():
    def bad():
        raise ValueError("bad batch (injected)")

    with pytest.raises(ValueError, match="bad batch") as info:
        fit(Net(at=3, fault=bad), isolate=True)
    assert "in forward" in str(info.value.__cause__)  # the worker's traceback, its frames
    assert "ValueError: bad batch" in str(info.value.__cause__)
    assert not children()


def test_evaluate_and_predict_after_an_isolated_fit_run_in_a_worker_too(monkeypatch):
    here = fit(Net(), isolate=False)
    there = fit(Net(), isolate=True)
    started = []
    import hybridnb.train.isolate as isolate_mod

    real = isolate_mod.run_isolated
    monkeypatch.setattr(isolate_mod, "run_isolated",
                        lambda *a, **k: started.append(1) or real(*a, **k))
    x, y = data(64, seed=2)
    assert torch.equal(torch.as_tensor(there.predict(x)), torch.as_tensor(here.predict(x)))
    assert there.evaluate((x, y)) == here.evaluate((x, y))
    assert len(started) == 2 and not children()


def test_why_an_isolated_fit_stopped_reaches_the_kernel():
    kw = {"early_stopping": 1, "epochs": 5, "lr": 1e-12}  # no improvement: stops after epoch 1
    here = fit(Net(), isolate=False, **kw)
    there = fit(Net(), isolate=True, **kw)
    assert here.stopped == "early_stopping" and there.stopped == here.stopped
    assert len(there.history) == len(here.history) == 2 and not children()
