"""``trainer.total_steps`` and a schedule factory sized by it (issue 28 item 1): the count is the
run's optimizer steps after gradient accumulation, known before fit once the data is, the same
number a two-argument factory receives; a OneCycleLR built from it anneals to its floor in the
fit; a too-short one is an error before the first step; a resumed fit uses the scheduler given."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler

from hybridnb import failures
from hybridnb.env import QUICK_ENV
from hybridnb.train.opening import QUICK_STEPS
from hybridnb.train.trainer import Trainer

torch.set_num_threads(1)
MAX_LR, DIV, FINAL_DIV = 2e-2, 25.0, 1e4
FLOOR = MAX_LR / DIV / FINAL_DIV


def data(n=128, d=8):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g)
    return x, torch.sin(x @ torch.linspace(-1, 1, d)).unsqueeze(1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        self.calls = 0

    def forward(self, x):
        self.calls += self.training
        return self.net(x)


@pytest.fixture(autouse=True)
def _plain(monkeypatch):
    monkeypatch.setattr(failures, "_LOST", set())
    monkeypatch.delenv(QUICK_ENV, raising=False)


def one_cycle(opt, total_steps):
    return lr_scheduler.OneCycleLR(opt, max_lr=MAX_LR, total_steps=total_steps,
                                   div_factor=DIV, final_div_factor=FINAL_DIV)


def trainer(model, **kw):
    kw = {"device": "cpu", "batch_size": 16, "grad_accum": 2, "epochs": 3, "seed": 0,
          "live": False, "isolate": False, **kw}
    return Trainer(model, **kw)


def test_total_steps_counts_optimizer_steps_after_accumulation_before_fit():
    tr = trainer(Net())
    with pytest.raises(RuntimeError, match=r"plan\(train\)"):
        _ = tr.total_steps
    plan = tr.plan(data())  # 128 samples / 16 = 8 batches, 2 per step: 4 steps x 3 epochs
    assert (plan.batches_per_epoch, plan.steps_per_epoch, plan.total_steps) == (8, 4, 12)
    assert tr.total_steps == 12
    assert tr.model.calls == 0  # planning trains nothing


def test_a_two_argument_factory_gets_total_steps_and_one_cycle_reaches_its_floor():
    seen = []

    def factory(opt, total_steps):
        seen.append(total_steps)
        return one_cycle(opt, total_steps)

    tr = trainer(Net(), schedule=factory)
    planned = tr.plan(data()).total_steps
    tr.fit(data())
    assert seen == [planned] == [tr.total_steps] == [len(tr.steps)]
    lrs = tr.steps["lr"].tolist()
    assert max(lrs) == pytest.approx(MAX_LR, rel=0.05)
    assert lrs[-1] == pytest.approx(FLOOR, rel=1e-6)  # annealed: its last step was taken
    assert lrs == sorted(lrs[:lrs.index(max(lrs)) + 1]) + sorted(
        lrs[lrs.index(max(lrs)) + 1:], reverse=True)


def test_quick_mode_caps_count_in_total_steps(monkeypatch):
    monkeypatch.setenv(QUICK_ENV, "1")
    seen = []
    tr = trainer(Net(), batch_size=4, grad_accum=1, epochs=5,
                 schedule=lambda opt, n: seen.append(n) or one_cycle(opt, n))
    total = tr.plan(data()).total_steps
    assert total < 5 * 32 and tr.plan(data()).steps_per_epoch <= QUICK_STEPS
    tr.fit(data())
    assert seen == [total] == [len(tr.steps)]
    assert tr.steps["lr"].iloc[-1] == pytest.approx(FLOOR, rel=1e-6)


def test_a_one_cycle_shorter_than_the_run_is_an_error_before_the_first_step():
    model = Net()
    tr = trainer(model, schedule=lambda opt: one_cycle(opt, 6))  # sized without grad_accum
    with pytest.raises(ValueError, match=r"total_steps=6.*12 optimizer steps.*total_steps"):
        tr.fit(data())
    assert model.calls == 0 and len(tr.steps) == 0


def test_resume_with_more_epochs_uses_the_new_one_cycle(tmp_path):
    """The user's way: fit, then a new Trainer resuming with one more epoch and a fresh
    OneCycleLR over the longer run."""
    first = trainer(Net(), epochs=1, schedule=one_cycle, checkpoint_dir=tmp_path)
    first.fit(data())
    assert first.steps["lr"].iloc[-1] == pytest.approx(FLOOR, rel=1e-6)
    again = trainer(Net(), epochs=2, schedule=one_cycle, checkpoint_dir=tmp_path)
    again.fit(data(), resume=True)
    assert again.total_steps == 8 and again.global_step == 8
    steps = again.steps
    assert steps["global_step"].tolist()[-4:] == [5, 6, 7, 8]
    assert steps["lr"].iloc[-1] == pytest.approx(FLOOR, rel=1e-6)
    # the new cycle's LR at step 4 (of 8) is near its peak, not the old cycle's floor
    assert steps["lr"].iloc[-4] > 0.5 * MAX_LR
    said = [e.message for e in again.events if e.kind == "schedule"]
    assert len(said) == 1 and "total_steps" in said[0]


def test_resume_with_a_scheduler_sized_for_the_old_run_fails_before_the_first_step(tmp_path):
    trainer(Net(), epochs=1, schedule=lambda opt: one_cycle(opt, 4),
            checkpoint_dir=tmp_path).fit(data())
    model = Net()
    again = trainer(model, epochs=2, schedule=lambda opt: one_cycle(opt, 4),
                    checkpoint_dir=tmp_path)
    with pytest.raises(ValueError, match=r"total_steps=4.*8 optimizer steps"):
        again.fit(data(), resume=True)
    assert model.calls == 0


def test_resume_with_the_same_chained_scheduler_continues_it_exactly(tmp_path):
    def chained(opt, total_steps):
        warm = lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=3)
        cos = lr_scheduler.CosineAnnealingLR(opt, T_max=total_steps - 3)
        return lr_scheduler.SequentialLR(opt, [warm, cos], milestones=[3])

    straight = trainer(Net(), schedule=chained)
    straight.fit(data())
    class AfterOneEpoch:  # the same run, stopped after its first epoch
        def on_epoch_end(self, trainer, row):
            trainer.should_stop = True

    first = Trainer(Net(), callbacks=[AfterOneEpoch()], device="cpu", batch_size=16,
                    grad_accum=2, epochs=3, seed=0, live=False, isolate=False,
                    schedule=chained, checkpoint_dir=tmp_path)
    first.fit(data())
    assert first.global_step == 4 and first.stopped == "callback"
    again = trainer(Net(), schedule=chained, checkpoint_dir=tmp_path)
    again.fit(data(), resume=True)
    assert not [e for e in again.events if e.kind == "schedule"]  # the same: its state loaded
    assert again.steps["lr"].tolist() == pytest.approx(straight.steps["lr"].tolist(),
                                                       rel=1e-9)
