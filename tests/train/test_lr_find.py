"""trainer.lr_find: an exponential LR sweep that suggests a learning rate and trains nothing."""

from __future__ import annotations

import logging
import os
import re

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import hybridnb as hn
from hybridnb.speedups import SPAN
from hybridnb.train.bus import Ended, Started, StepEnded
from hybridnb.train.lr_find import suggestion


def _regression(n: int = 512, d: int = 8, seed: int = 0) -> TensorDataset:
    """y = X w + noise with X ~ N(0, I): for SGD on the MSE the Hessian is 2 I, so steps
    diverge above lr = 1 and the best constant step is about 0.5."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g)
    w = torch.randn(d, 1, generator=g)
    return TensorDataset(X, X @ w + 0.05 * torch.randn(n, 1, generator=g))


def _sgd(params):
    return torch.optim.SGD(params, lr=1e-3)  # no momentum: the stability bound is exactly 1


def _trainer(**kw) -> hn.Trainer:
    torch.manual_seed(0)
    opts = dict(loss="mse", lr=1e-3, epochs=1, batch_size=32, device="cpu", live=False,
                verbose=False, seed=0, isolate=False, speedups=False)
    return hn.Trainer(torch.nn.Linear(8, 1), **{**opts, **kw})


def test_sweep_leaves_model_optimizer_and_next_fit_unchanged():
    data = _regression()
    plain, swept = _trainer(ema=0.9), _trainer(ema=0.9)
    plain.fit(data)
    swept.fit(data)  # both have optimizer state (Adam moments) and an EMA copy now
    before = swept.state_dict()
    rng = torch.get_rng_state()
    result = swept.lr_find(data, num_steps=30)
    assert len(result.lrs) > 5
    after = swept.state_dict()
    for k, v in before["model"].items():
        assert torch.equal(v, after["model"][k]), k
    for p, state in before["optimizer"]["state"].items():
        for name, t in state.items():
            assert torch.equal(t, after["optimizer"]["state"][p][name]), (p, name)
    assert [g["lr"] for g in after["optimizer"]["param_groups"]] == \
        [g["lr"] for g in before["optimizer"]["param_groups"]]
    assert torch.equal(torch.get_rng_state(), rng)
    # the next fit is the same as without the sweep
    plain.fit(data)
    swept.fit(data)
    np.testing.assert_array_equal(plain.history["train_loss"], swept.history["train_loss"])
    for k, v in plain.model.state_dict().items():
        assert torch.equal(v, swept.model.state_dict()[k]), k


@pytest.mark.parametrize("method", ["valley", "steepest"])
def test_suggestion_lands_near_the_known_good_lr(method):
    tr = _trainer(optimizer=_sgd, clip_grad=None)
    result = tr.lr_find(_regression(), start_lr=1e-5, end_lr=10.0, num_steps=80, suggest=method)
    # plain SGD on this problem: diverges above 1, learns nothing in 80 steps below ~1e-3
    assert result.suggestion is not None
    assert 1e-2 <= result.suggestion <= 1.0, result.suggestion
    assert result.method == method


def test_divergence_stops_the_sweep_early():
    tr = _trainer(optimizer=_sgd, clip_grad=None)
    result = tr.lr_find(_regression(), start_lr=1e-4, end_lr=1e3, num_steps=100)
    assert result.stopped_early
    assert len(result.lrs) < 100
    assert result.lrs[-1] < 1e2  # stopped soon after the divergence at ~1, far before 1e3
    finite = result.losses[np.isfinite(result.losses)]
    assert result.losses[-1] > 4 * finite.min() or not np.isfinite(result.losses[-1])


def test_dataloader_and_dataset_both_work_and_apply_sets_lr():
    data = _regression()
    by_dataset = _trainer(optimizer=_sgd).lr_find(
        data, start_lr=1e-5, end_lr=10.0, num_steps=40)
    tr = _trainer(optimizer=_sgd)
    by_loader = tr.lr_find(DataLoader(data, batch_size=16, shuffle=True), start_lr=1e-5,
                           end_lr=10.0, num_steps=40, apply=True)
    for r in (by_dataset, by_loader):
        assert r.suggestion is not None and len(r.lrs) == len(r.losses) == len(r.raw_losses)
        assert np.all(np.diff(r.lrs) > 0)
    assert by_loader.applied
    assert tr.lr == pytest.approx(by_loader.suggestion)
    assert tr.optimizer.param_groups[0]["lr"] == pytest.approx(by_loader.suggestion)
    assert any(kind == "lr_find" for kind, _ in tr.bus.pending)
    tr.fit(data)  # trains at the applied LR: the schedule peaks there
    assert tr.history["lr"].max() <= by_loader.suggestion * (1 + 1e-6)


def test_plot_marks_the_suggestion():
    result = _trainer(optimizer=_sgd).lr_find(
        _regression(), start_lr=1e-5, end_lr=10.0, num_steps=40)
    fig = result.plot()
    names = [t.name for t in fig.data]
    assert any(n and n.startswith("suggestion") for n in names)
    assert fig.layout.xaxis.type == "log"


def test_flat_curve_gives_no_suggestion_and_bad_arguments_are_named():
    lrs = np.logspace(-7, 0, 20)
    value, why = suggestion(lrs, np.linspace(1.0, 2.0, 20), "valley")
    assert value is None and "valley" in why
    with pytest.raises(ValueError, match="start_lr"):
        _trainer().lr_find(_regression(), start_lr=1.0, end_lr=1e-3)
    with pytest.raises(ValueError, match="suggest"):
        _trainer().lr_find(_regression(), suggest="median")


class OnlyInWorker(torch.nn.Linear):
    """Trains only in an isolated worker (HYBRIDNB_ISOLATED is set there): a sweep that ran in
    the kernel would raise."""

    def forward(self, x):
        if self.training and not os.environ.get("HYBRIDNB_ISOLATED"):
            raise RuntimeError("trained in the kernel")
        return super().forward(x)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="isolation needs os.fork")
def test_an_isolated_trainer_sweeps_in_its_worker_and_applies_here():
    torch.manual_seed(0)
    model = OnlyInWorker(8, 1)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    tr = hn.Trainer(model, loss="mse", lr=1e-3, batch_size=32, device="cpu", live=False,
                    verbose=False, seed=0, isolate=True, optimizer=_sgd)
    result = tr.lr_find(_regression(), start_lr=1e-5, end_lr=10.0, num_steps=40, apply=True)
    assert not any(kind == "worker_lost" for kind, _ in tr.bus.pending)
    assert result.suggestion is not None and tr.lr == pytest.approx(result.suggestion)
    for k, v in model.state_dict().items():
        assert torch.equal(v, weights[k]), k


class _Spanning(torch.nn.Module):
    """A 2-D convolution spanning every electrode of a one-channel input: the CPU's span rule
    applies to it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(1, 4, (3, 6))
        self.head = torch.nn.Linear(4 * 22, 1)

    def forward(self, x):  # (B, 4, 6, 6) read as (B, 1, 24, 6)
        return self.head(self.conv(x.flatten(1, 2).unsqueeze(1)).flatten(1))


def _images(n: int = 256) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, 6, 6, generator=g)
    return TensorDataset(x, x.mean((1, 2, 3)).unsqueeze(1))


def test_lr_find_runs_with_the_speedups_fit_uses():
    """Issue 28: lr_find ran before the CPU speedups were chosen (slower steps than fit's)."""
    tr = hn.Trainer(_Spanning(), epochs=1, batch_size=32, device="cpu", live=False,
                    verbose=False, seed=0, isolate=False, speedups="auto")
    result = tr.lr_find(_images(), num_steps=10)
    assert "span" in result.speedups
    assert SPAN.active(tr.model) == ["conv"]
    tr.fit(_images())
    assert tuple(tr.applied_speedups.applied) == result.speedups  # kept by fit, not re-chosen
    # the same choice, said as often, as a fit without a sweep before it
    alone = hn.Trainer(_Spanning(), epochs=1, batch_size=32, device="cpu", live=False,
                       verbose=False, seed=0, isolate=False, speedups="auto")
    alone.fit(_images())
    assert tuple(alone.applied_speedups.applied) == result.speedups
    def said(trainer):  # the decision's own seconds vary
        return [re.sub(r"in [\d.]+ s", "", e.message) for e in trainer.events
                if e.kind == "speedups"]

    assert said(tr) == said(alone) and said(tr)


def test_lr_find_reports_each_step_through_the_fits_bus_and_its_notes(capsys):
    """The sweep is a fit on the Trainer's Loop: the view hears it start, every step and its
    end; with live=False and verbose its notes go to stderr as a fit's do."""
    tr = _trainer(verbose=True)
    heard = []
    tr.bus.subscribe(heard.append)
    result = tr.lr_find(_regression(), num_steps=30)
    kinds = [type(e) for e in heard]
    assert kinds.index(Started) < kinds.index(StepEnded) and kinds.count(Ended) == 1
    steps = [e for e in heard if isinstance(e, StepEnded)]
    assert [e.step for e in steps] == list(range(1, len(result.lrs) + 1))
    np.testing.assert_array_equal([e.loss for e in steps], result.raw_losses)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "lr_find:" in ln]
    assert "sweeping lr" in lines[0] and "speedups: none" in lines[0]
    assert "suggestion" in lines[-1] and len(lines) == 2
    assert [e.kind for e in tr.events] == ["lr_find", "lr_find"] and tr.history.empty


def test_lr_find_is_quiet_when_asked(capsys, monkeypatch):
    # its notes are still records of the "hybridnb" logger (as a fit's are): a library that put
    # a handler on the root logger (eegdash does) would print them, so they stay with hybridnb
    monkeypatch.setattr(logging.getLogger("hybridnb"), "propagate", False)
    _trainer(verbose=False).lr_find(_regression(), num_steps=10)
    out = capsys.readouterr()
    assert "lr_find" not in out.err + out.out


@pytest.mark.slow
def test_an_isolated_lr_find_uses_fits_speedups_and_its_notes_reach_the_kernel(capfd):
    tr = hn.Trainer(_Spanning(), epochs=1, batch_size=32, device="cpu", live=False,
                    verbose=True, seed=0, isolate=True, speedups="auto")
    result = tr.lr_find(_images(), num_steps=10)  # in a worker, as fit will be
    out = capfd.readouterr()
    # one string: a logging handler another library installed may wrap the printed lines
    text = " ".join((out.out + out.err).split())
    assert re.search(r"lr_find: sweeping .*? steps on cpu \(fp32; speedups: span\)", text)
    assert re.search(r"lr_find: 10 steps; suggestion", text)
    tr.fit(_images())
    assert "span" in result.speedups
    assert tuple(tr.applied_speedups.applied) == result.speedups


class SmallBatchesOnly(torch.nn.Linear):
    """Runs out of memory on more than 8 samples at once, as a full GPU would."""

    def forward(self, x):
        if x.shape[0] > 8:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().forward(x)


def test_a_sweep_that_runs_out_of_memory_goes_on_split_as_a_fit_would():
    torch.manual_seed(0)
    tr = hn.Trainer(SmallBatchesOnly(8, 1), lr=1e-3, batch_size=32, device="cpu", live=False,
                    verbose=False, seed=0, isolate=False, speedups=False, optimizer=_sgd)
    result = tr.lr_find(_regression(), start_lr=1e-5, end_lr=10.0, num_steps=20)
    assert len(result.lrs) >= 10 and result.suggestion is not None
    assert [e.kind for e in tr.events].count("oom_split") == 2  # 32 -> 16 -> 8, said once each
    assert tr.state.micro is None  # the trainer's own run state is left as it was
