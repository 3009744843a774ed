"""``schedule=`` as a factory ``optimizer -> torch.optim.lr_scheduler`` (issue 21): stepped once
per optimizer step, ReduceLROnPlateau with the monitored metric at each validation, resumed bit
for bit, and carried to an isolated worker (cloudpickle) and back to the CPU when it dies."""

from __future__ import annotations

import pytest
import torch
from faults import FAULT_ENV
from torch import nn
from torch.optim import lr_scheduler

from hybridnb import failures
from hybridnb.train import checkpoint
from hybridnb.train.trainer import Trainer

torch.set_num_threads(1)
EPOCHS, STEPS = 3, 4  # 128 samples / batch 32
MAX_LR = 2e-2


def data(n=128, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    return x, torch.sin(x @ torch.linspace(-1, 1, d)).unsqueeze(1)


class Net(nn.Module):
    """An MLP with dropout (RNG matters for an exact resume); raises KeyboardInterrupt (Ctrl-C)
    at training call ``stop_at``."""

    def __init__(self, stop_at=None):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Dropout(0.1), nn.Linear(16, 1))
        self.stop_at, self.calls = stop_at, 0

    def forward(self, x):
        if self.training:
            self.calls += 1
            if self.calls == self.stop_at:
                raise KeyboardInterrupt
        return self.net(x)


def one_cycle(opt):
    return lr_scheduler.OneCycleLR(opt, max_lr=MAX_LR, total_steps=EPOCHS * STEPS)


def trainer(model, tmp_path=None, **kw):
    kw = {"device": "cpu", "batch_size": 32, "epochs": EPOCHS, "lr": 1e-3, "seed": 0,
          "live": False, "isolate": False, "schedule": one_cycle,
          "checkpoint_dir": tmp_path, **kw}
    return Trainer(model, **kw)


@pytest.fixture(autouse=True)
def _fresh_lost_devices(monkeypatch):
    monkeypatch.setattr(failures, "_LOST", set())


def reference_lrs(factory, n):
    """The LR a plain torch loop uses at each of ``n`` optimizer steps."""
    opt = torch.optim.AdamW(nn.Linear(1, 1).parameters(), lr=1e-3)
    sched, lrs = factory(opt), []
    for _ in range(n):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


def test_a_factory_is_stepped_once_per_optimizer_step():
    tr = trainer(Net())
    tr.fit(data())
    assert tr.steps["lr"].tolist() == pytest.approx(reference_lrs(one_cycle, EPOCHS * STEPS),
                                                    rel=1e-9)
    assert max(tr.steps["lr"]) == pytest.approx(MAX_LR, rel=0.05)


def test_reduce_on_plateau_is_stepped_with_the_monitored_metric():
    def plateau(opt):  # mode="max" on a falling val_loss: a cut at every validation
        return lr_scheduler.ReduceLROnPlateau(opt, mode="max", patience=0, factor=0.5)

    tr = trainer(Net(), schedule=plateau, lr=1e-2)
    tr.fit(data(), val=data(64, seed=1))
    ref = lr_scheduler.ReduceLROnPlateau(
        torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=1e-2), mode="max", patience=0,
        factor=0.5)
    expected = []
    for v in tr.history["val_loss"]:
        ref.step(v)
        expected.append(ref.optimizer.param_groups[0]["lr"])
    # the epoch's lr is the one its steps used: the cut after epoch k shows in epoch k+1
    assert tr.history["lr"].tolist()[1:] == pytest.approx(expected[:-1], rel=1e-9)
    assert tr.steps["lr"].tolist() == pytest.approx(
        [lr for lr in [1e-2] + expected[:-1] for _ in range(STEPS)], rel=1e-9)
    cuts = [e for e in tr.events if e.kind == "lr_plateau"]
    assert len(cuts) == sum(b < a for a, b in zip([1e-2] + expected, expected, strict=False))


def test_a_factory_resumes_bit_for_bit_mid_epoch(tmp_path):
    straight = trainer(Net(), tmp_path / "a")
    straight.fit(data())

    first = trainer(Net(stop_at=6), tmp_path / "b")  # Ctrl-C during step 6 (epoch 1)
    first.fit(data())
    saved = checkpoint.load(tmp_path / "b" / "last.pt")
    assert saved["position"]["global_step"] == 5 and saved["schedule"]["torch"]
    resumed = trainer(Net(), tmp_path / "b")
    resumed.fit(data(), resume=True)
    assert resumed.global_step == EPOCHS * STEPS
    assert resumed.steps["lr"].tolist() == straight.steps["lr"].tolist()
    assert resumed.steps["loss"].tolist() == straight.steps["loss"].tolist()
    for a, b in zip(resumed.model.parameters(), straight.model.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_a_factory_travels_to_a_worker_and_survives_its_death(tmp_path, monkeypatch):
    straight = trainer(Net())
    straight.fit(data())
    monkeypatch.setenv(FAULT_ENV, "step:kill:6")
    tr = trainer(Net(), tmp_path, isolate=True, schedule=lambda opt: one_cycle(opt),
                 snapshot_every=2)
    tr.fit(data())
    assert [e.kind for e in tr.events].count("worker_lost") == 1
    assert tr.steps["lr"].tolist() == pytest.approx(straight.steps["lr"].tolist(), rel=1e-12)


def test_a_factory_that_is_wrong_is_named():
    with pytest.raises(ValueError, match=r"OneCycleLR is a scheduler class: pass a factory"):
        trainer(Net(), schedule=lr_scheduler.OneCycleLR)
    tr = trainer(Net(), schedule=lambda opt: 0.5)
    with pytest.raises(TypeError, match="returned a float"):
        tr.fit(data())
    short = trainer(Net(), schedule=lambda opt: lr_scheduler.OneCycleLR(opt, 1e-2,
                                                                        total_steps=5))
    with pytest.raises(ValueError, match=r"total_steps=5, but this run takes 12 optimizer steps"):
        short.fit(data())  # before the first step (issue 28), no longer at step 7
    assert short.global_step == 0


def test_resuming_with_a_differently_built_scheduler_names_what_differs(tmp_path):
    x, y = torch.randn(64, 8), torch.randn(64)

    def run(step_size: int, resume: bool) -> Trainer:
        tr = Trainer(nn.Linear(8, 1), device="cpu", epochs=1 + resume, batch_size=16, live=False,
                     seed=0, checkpoint_dir=tmp_path, verbose=False,
                     schedule=lambda opt: lr_scheduler.StepLR(opt, step_size=step_size))
        tr.fit((x, y), resume=resume)
        return tr

    run(100, False)
    [said] = [e.message for e in run(200, True).events if "other settings" in e.message]
    assert "step_size=100 saved, 200 given" in said
