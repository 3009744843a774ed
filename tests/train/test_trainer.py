"""The Trainer's loop: results, history, accumulation, EMA, freeze, early stopping, schedules,
precision and compile fallbacks, interrupts, the live-view calls, batch-size search, reports."""

from __future__ import annotations

import math
import os

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import hybridnb.train.trainer as trainer_mod
from hybridnb.live import View
from hybridnb.train import checkpoint, opening
from hybridnb.train.losses import ReweightedHuber
from hybridnb.train.schedules import Plateau, WarmupCosine
from hybridnb.train.trainer import Trainer
from hybridnb.train.validation import Validation

torch.set_num_threads(1)
CUDA_OOM = "CUDA out of memory. Tried to allocate 1.00 GiB (GPU 0; 7.79 GiB total capacity)"


def data(n=256, d=8, seed=0, flip=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    y = torch.sin(x @ torch.linspace(-1, 1, d))
    return x, (-y if flip else y)


def mlp(seed=0, d=8):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d, 32), nn.Tanh(), nn.Linear(32, 1))


def run(model=None, train=None, val=None, epochs=2, **kw):
    kw = {"device": "cpu", "batch_size": 32, "lr": 1e-2, "seed": 0, "live": False, **kw}
    tr = Trainer(model if model is not None else mlp(), epochs=epochs, **kw)
    tr.fit(train if train is not None else data(), val)
    return tr


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def close(a, b, rtol=1e-5, atol=1e-6):
    return all(torch.allclose(x, y, rtol=rtol, atol=atol) for x, y in zip(a, b, strict=True))


# ------------------------------------------------------------------------------- basics
def test_evaluate_and_predict_give_each_layer_back_its_own_mode():
    """A layer the user froze in eval mode (a BatchNorm kept on its statistics) stays so."""
    model = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.Tanh(), nn.Linear(32, 1))
    model[1].eval()
    tr = Trainer(model, device="cpu", batch_size=32, live=False)
    tr.evaluate(data(64))
    tr.predict(data(64)[0])
    assert model.training and not model[1].training and model[0].training


def test_fit_learns_and_fills_history_evaluate_predict():
    val = data(64, seed=1)
    before = Trainer(mlp(), device="cpu", batch_size=32, live=False).evaluate(val)["rmse"]
    tr = run(val=val, epochs=4)
    h = tr.history
    assert list(h.columns) == trainer_mod.HISTORY_COLUMNS
    assert h["epoch"].tolist() == [0, 1, 2, 3] and h["step"].tolist() == [8, 16, 24, 32]
    assert h["train_loss"].iloc[-1] < h["train_loss"].iloc[0]
    assert h[["val_loss", "val_rmse", "val_nrmse", "val_mae", "val_r2", "samples_per_s"]]\
        .notna().all().all()
    m = tr.evaluate(val)
    assert m["rmse"] < before
    pred = tr.predict(val[0])
    assert pred.shape == (64,)
    y = val[1].numpy()
    rmse = float(np.sqrt(np.mean((pred - y) ** 2)))
    assert math.isclose(m["rmse"], rmse, rel_tol=1e-5)
    assert math.isclose(m["nrmse"], rmse / float(np.std(y)), rel_tol=1e-5)
    assert math.isclose(h["val_rmse"].iloc[-1], m["rmse"], rel_tol=1e-5)
    assert len(tr.steps) == 32 and tr.steps["global_step"].tolist() == list(range(1, 33))


def test_targets_b_and_b1_and_extras_give_the_same_run():
    x, y = data()

    class WithExtras(Dataset):  # braindecode windows yield (x, y, crop_inds)
        def __len__(self):
            return len(x)

        def __getitem__(self, i):
            return x[i], y[i:i + 1], torch.tensor([i, 0, 200])

    a = run(train=(x, y))
    b = run(train=(x, y[:, None]))
    c = run(train=WithExtras())
    assert close(params(a.model), params(b.model), 0, 0)
    assert close(params(a.model), params(c.model), 0, 0)


def test_user_dataloader_is_used_as_given():
    x, y = data()
    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)
    tr = run(train=loader, val=DataLoader(TensorDataset(*data(64, seed=1)), batch_size=64))
    assert tr.history["step"].tolist() == [4, 8]


def test_same_seed_same_result_different_seed_differs():
    a, b, c = run(seed=5), run(seed=5), run(seed=6)
    assert close(params(a.model), params(b.model), 0, 0)
    assert not close(params(a.model), params(c.model))


def test_bad_arguments_name_the_argument_and_value():
    with pytest.raises(ValueError, match="lr=-1"):
        Trainer(mlp(), lr=-1, device="cpu", batch_size=8)
    with pytest.raises(ValueError, match="compile='fast'"):
        Trainer(mlp(), compile="fast", device="cpu", batch_size=8)
    with pytest.raises(ValueError, match="grad_accum=0"):
        Trainer(mlp(), grad_accum=0, device="cpu", batch_size=8)
    with pytest.raises(ValueError, match="freeze pattern 'backbone.*'"):
        Trainer(mlp(), freeze=["backbone.*"], device="cpu", batch_size=8)
    with pytest.raises(ValueError, match="loss='cosine'"):
        Trainer(mlp(), loss="cosine", device="cpu", batch_size=8)
    with pytest.raises(ValueError, match="loss_guard='auto'"):
        Trainer(mlp(), loss_guard="auto", device="cpu", batch_size=8)


def test_device_auto_uses_detect():
    import hybridnb

    hw = hybridnb.detect()
    tr = Trainer(mlp(), live=False)
    assert tr.device == hw.device and tr.batch_size == hw.settings.batch_size
    assert tr.precision.name == hw.precision


# ------------------------------------------------------------------------------- the loop
def test_accumulation_4x8_equals_batch_32():
    a = run(batch_size=32, grad_accum=1, epochs=3)
    b = run(batch_size=8, grad_accum=4, epochs=3)
    assert close(params(a.model), params(b.model))
    assert a.history["step"].tolist() == b.history["step"].tolist() == [8, 16, 24]


def test_uneven_last_window_is_weighted_by_samples():
    x, y = data(212)  # 6 windows of 4x8, then one of batches 8, 8 and 4 (weights 0.4/0.4/0.2)
    a = run(train=(x, y), batch_size=32, epochs=1)
    b = run(train=(x, y), batch_size=8, grad_accum=4, epochs=1)
    assert close(params(a.model), params(b.model))


def test_ema_weights_are_the_moving_average_of_the_step_weights():
    seen = []

    class Recorder(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp()

        def forward(self, x):
            if self.training:
                seen.append([p.detach().clone() for p in self.net.parameters()])
            return self.net(x)

    tr = run(Recorder(), ema=0.8, epochs=1)
    # weights after each step: before the next step's forward, and the raw final weights
    raw_final = list(tr.checkpoints.snapshot["model"].values())
    after = seen[1:] + [raw_final]
    avg = [w.clone() for w in after[0]]  # the first update copies
    for ws in after[1:]:
        avg = [0.8 * a + 0.2 * w for a, w in zip(avg, ws, strict=True)]
    assert close(params(tr.ema.module.net), avg)
    assert close(params(tr.model.net), avg)  # the model holds the EMA weights after fit
    assert any(e.kind == "ema_weights" for e in tr.events)


def test_freeze_trains_only_the_head():
    model = mlp()
    first = params(model[0])
    tr = run(model, freeze=["0.*"])
    assert tr.frozen == ["0.bias", "0.weight"]
    assert close(params(tr.model[0]), first, 0, 0)
    assert not close(params(tr.model[2]), params(mlp()[2]))
    in_opt = {id(p) for g in tr.optimizer.param_groups for p in g["params"]}
    assert in_opt == {id(p) for p in tr.model[2].parameters()}


def test_early_stopping_restores_the_best_weights(tmp_path):
    val = data(64, seed=1, flip=True)  # val targets are the negation: val loss rises
    tr = run(val=val, epochs=30, early_stopping=2, checkpoint_dir=tmp_path, lr=3e-2)
    h = tr.history
    assert len(h) < 30
    best_epoch = int(h["val_loss"].idxmin())
    assert len(h) == best_epoch + 3  # two validations without improvement
    assert math.isclose(tr.evaluate(val)["loss"], h["val_loss"].min(), rel_tol=1e-5)
    best = checkpoint.load(tmp_path / "best.pt")
    assert all(torch.equal(best["model"][k], v) for k, v in tr.model.state_dict().items())
    assert [e.kind for e in tr.events][-2:] == ["early_stop", "best_restored"]



def test_with_ema_and_early_stopping_predict_scores_the_weights_fit_chose(tmp_path):
    val = data(64, seed=1, flip=True)  # val loss rises: the best EMA weights come early
    tr = run(val=val, epochs=30, early_stopping=2, ema=0.9, checkpoint_dir=tmp_path, lr=3e-2)
    best_loss = tr.history["val_loss"].min()
    with torch.no_grad():
        direct = tr.model(val[0]).reshape(-1).numpy()
    np.testing.assert_array_equal(tr.predict(val), direct)
    assert math.isclose(tr.evaluate(val)["loss"], best_loss, rel_tol=1e-5)
    best = checkpoint.load(tmp_path / "best.pt")
    assert all(torch.equal(best["model"][k], v) for k, v in tr.model.state_dict().items())

def test_val_every_and_checkpoint_every_steps(tmp_path, monkeypatch):
    calls = []
    real = Validation.run

    def spy(self, loader):
        calls.append(self.loop.state.global_step)
        return real(self, loader)

    monkeypatch.setattr(Validation, "run", spy)
    tr = run(val=data(64, seed=1), val_every=3, checkpoint_every=5, checkpoint_dir=tmp_path)
    assert calls == [3, 6, 8, 9, 12, 15, 16]  # every 3 steps + epoch ends (8, 16)
    last = checkpoint.load(tmp_path / "last.pt")
    assert last["position"]["global_step"] == 16
    assert checkpoint.load(tmp_path / "last.prev.pt")["position"]["global_step"] == 15
    assert tr.history["val_loss"].notna().all()


def test_warmup_cosine_and_plateau_schedules():
    s = WarmupCosine(warmup=0.1)
    s.bind(100)
    assert s.factor(0) == pytest.approx(0.1) and s.factor(10) == pytest.approx(1.0)
    assert s.factor(55) == pytest.approx(0.5) and s.factor(100) == pytest.approx(0.0)
    tr = run(schedule="warmup_cosine", warmup=4, epochs=1)
    lrs = tr.steps["lr"].tolist()
    assert lrs[:4] == pytest.approx([1e-2 * k / 4 for k in (1, 2, 3, 4)])
    assert lrs[-1] < lrs[4]
    p = Plateau(patience=2, factor=0.5)
    assert [p.on_validation(i) is not None for i in (True, False, False, False, False)] == \
        [False, False, True, False, True]
    assert p.factor(0) == 0.25
    tr = run(val=data(64, seed=1, flip=True), schedule="plateau", epochs=6, lr=3e-2)
    assert any(e.kind == "lr_plateau" for e in tr.events)
    assert tr.history["lr"].iloc[-1] < 3e-2


def test_reweighted_huber_downweights_large_residuals_and_splits_exactly():
    loss = ReweightedHuber(delta=1.0, after_epoch=1, c=2.0)
    pred = torch.tensor([0.0, 0.0, 0.0, 0.0])
    y = torch.tensor([0.5, 1.0, 3.0, 10.0])
    plain = loss(pred, y)
    loss.set_epoch(1)
    weighted = loss(pred, y)
    huber = torch.nn.functional.huber_loss(pred, y, reduction="none")
    w = torch.tensor([1.0, 1.0, 2 / 3, 2 / 10])
    assert plain == pytest.approx(float(huber.mean()))
    assert weighted == pytest.approx(float((huber * w).mean()))
    halves = 0.5 * loss(pred[:2], y[:2]) + 0.5 * loss(pred[2:], y[2:])
    assert weighted == pytest.approx(float(halves))
    tr = run(loss="huber", reweight_after=1, epochs=2)
    assert tr.loss_fn.reweighting and tr.history["train_loss"].notna().all()


def test_grad_checkpointing_same_result_and_unpatched_after():
    a = run(epochs=1)
    b = run(epochs=1, grad_checkpointing=True)
    assert close(params(a.model), params(b.model))
    assert any(e.kind == "grad_checkpointing" and "2 blocks" in e.message for e in b.events)
    assert "forward" not in vars(b.model[0])


def test_memory_fraction_on_cpu_says_it_has_no_effect():
    tr = run(epochs=1, memory_fraction=0.5)
    assert any(e.kind == "memory_fraction" and "no effect" in e.message for e in tr.events)


# ------------------------------------------------------------------------------- fallbacks
def test_fp16_on_cpu_becomes_bf16_with_one_message(capsys):
    tr = run(precision="fp16", epochs=1)
    assert tr.precision.name == "bf16"
    notes = [e for e in tr.events if e.kind == "precision_fallback"]
    assert len(notes) == 1 and "bf16" in notes[0].message and "fp16" in notes[0].message
    assert capsys.readouterr().err.count("precision_fallback") == 1


@pytest.mark.parametrize("error", [
    RuntimeError("backend='inductor' raised: CppCompileError: C++ compile error (injected)"),
    torch.OutOfMemoryError("DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                           "110336696336 bytes (injected, while compiling)"),
])
def test_compile_failure_falls_back_to_eager_once(monkeypatch, error):
    import torch._inductor.config as inductor_config

    compiled_calls, layout_during = [], []
    before = inductor_config.layout_optimization

    class Broken(nn.Module):  # torch.compile's module is lazy: it fails on the first call
        def __init__(self, mode):
            super().__init__()
            self.mode = mode

        def forward(self, x):
            compiled_calls.append(self.mode)
            layout_during.append(inductor_config.layout_optimization)
            raise error

    def fake_compile(model, mode=None):
        return Broken(mode)

    monkeypatch.setattr(torch, "compile", fake_compile)
    eager = run(epochs=1)
    tr = run(epochs=1, compile="max-autotune", precision="bf16")
    assert compiled_calls == ["max-autotune"]
    falls = [e for e in tr.events if e.kind == "compile_fallback"]
    assert len(falls) == 1 and "injected" in falls[0].message
    assert not any(e.kind == "oom_split" for e in tr.events)
    bf16 = run(epochs=1, precision="bf16")
    assert close(params(tr.model), params(bf16.model), 0, 0)
    assert not close(params(tr.model), params(eager.model), 0, 0)  # bf16 really was used
    assert layout_during == [False]  # CPU bf16: the oneDNN workaround while compiling...
    assert inductor_config.layout_optimization == before  # ...scoped to fit, never left set


# ------------------------------------------------------------------------------- interrupts
class KeyboardAt(nn.Module):
    def __init__(self, at):
        super().__init__()
        self.net, self.at, self.calls = mlp(), at, 0

    def forward(self, x):
        if self.training:
            self.calls += 1
            if self.calls == self.at:
                raise KeyboardInterrupt
        return self.net(x)


def test_interrupt_mid_step_drops_it_and_keeps_checkpoint_and_history(tmp_path):
    tr = run(KeyboardAt(at=12), val=data(64, seed=1), epochs=3, checkpoint_dir=tmp_path)
    assert tr.global_step == 11 and len(tr.history) == 1  # epoch 0 complete, step 12 dropped
    assert tr.steps["global_step"].tolist() == list(range(1, 12))
    saved = checkpoint.load(tmp_path / "last.pt")
    assert saved["position"] == {"epoch": 1, "batches_done": 3, "global_step": 11}
    assert len(saved["history"]) == 1
    assert all(torch.equal(saved["model"][k], v) for k, v in tr.model.state_dict().items())
    assert all(p.grad is None for p in tr.model.parameters())
    assert [e.kind for e in tr.events] == ["interrupt"]


class FakeView(View):
    """A view that records the Trainer's calls and clicks Stop after ``stop_after`` updates."""

    def __init__(self, stop_after=None):
        super().__init__()
        self.stop_after, self.updates, self.events, self.run, self.summary = stop_after, [], [], \
            None, None

    def start(self, run):
        self.run = run

    def update(self, state):
        self.updates.append(state)
        if self.stop_after and len(self.updates) >= self.stop_after:
            self.stop_requested = True

    def event(self, ev):
        self.events.append(ev)

    def end(self, summary):
        self.summary = summary


def test_live_view_contract_and_stop_button(tmp_path, monkeypatch):
    views = []

    def make_view(live):
        views.append(FakeView(stop_after=None if live == "text" else 13))
        return views[-1]

    monkeypatch.setattr(opening, "make_view", make_view)
    tr = run(val=data(64, seed=1), epochs=2, live="text", precision="fp16")
    view = views[0]
    assert view.run == {"epochs": 2, "steps_per_epoch": 8, "batch_size": 32, "device": "cpu",
                        "precision": "bf16", "model": "Sequential", "n_params": 321,
                        "monitor": "val_loss", "metric": None, "quick": False, "grad_accum": 1,
                        "total_steps": 16, "chosen": view.run["chosen"],
                        "pid": os.getpid()}  # the training process: its memory is plotted
    assert "schedule warmup_cosine (warmup 0.05)" in view.run["chosen"]  # a default, named
    steps = [u for u in view.updates if not u.get("epoch_end")]
    ends = [u for u in view.updates if u.get("epoch_end")]
    assert len(steps) == 16 and len(ends) == 2
    assert {"epoch", "step", "global_step", "loss", "lr", "samples_per_s", "elapsed_s"} <= \
        set(steps[0])
    assert [u["step"] for u in steps[:8]] == list(range(1, 9))
    assert ends[0]["val_loss"] == pytest.approx(tr.history["val_loss"][0])
    assert [e.kind for e in view.events] == ["precision_fallback"]
    assert view.summary["stopped"] is None and isinstance(view.summary["history"], pd.DataFrame)
    assert set(view.summary) >= {"history", "best", "elapsed_s", "samples_per_s",
                                 "peak_memory_bytes", "events", "device", "precision", "stopped"}

    tr = run(val=data(64, seed=1), epochs=3, live="widgets", checkpoint_dir=tmp_path)
    assert views[1].summary["stopped"] == "stop_button"
    assert tr.global_step == 12  # 8 steps + epoch end update + 4 steps = 13 updates
    assert checkpoint.load(tmp_path / "last.pt")["position"]["global_step"] == 12
    assert len(tr.history) == 1


def test_quick_mode_caps_epochs_and_steps_and_says_so(monkeypatch):
    monkeypatch.setenv("HYBRIDNB_QUICK", "1")
    tr = run(epochs=10)
    assert len(tr.history) == 2 and tr.history["step"].tolist() == [5, 10]
    quick = [e for e in tr.events if e.kind == "quick"]
    assert len(quick) == 1 and "HYBRIDNB_QUICK" in quick[0].message


# ------------------------------------------------------------------------------- batch size
class TooBig(nn.Module):
    """Raises a CUDA OOM for batches larger than ``limit``."""

    def __init__(self, limit):
        super().__init__()
        self.net, self.limit = mlp(), limit

    def forward(self, x):
        if len(x) > self.limit:
            raise torch.OutOfMemoryError(CUDA_OOM)
        return self.net(x)


@pytest.mark.parametrize("isolate", [False, pytest.param(True, marks=pytest.mark.skipif(
    not hasattr(os, "fork"), reason="isolation needs os.fork"))])
def test_find_batch_size_bisects_keeps_headroom_and_restores_state(isolate):
    """The search is a fit on the Loop, here or in the worker alike: its out-of-memory steps
    are recovered as a fit's (whatever on_gpu_error says) and the view hears its steps."""
    model = TooBig(limit=48)
    tr = Trainer(model, device="cpu", batch_size=128, grad_accum=1, live=False, lr=1e-2,
                 verbose=False, isolate=isolate, on_gpu_error="raise")
    before = params(model)
    heard = []
    tr.bus.subscribe(heard.append)
    found = tr.find_batch_size(TensorDataset(*data(256)))
    assert found == 43  # 48 fits, 49 does not; 10% headroom
    assert (tr.batch_size, tr.grad_accum) == (43, 3)  # effective 129 >= 128
    assert close(params(model), before, 0, 0) and not tr.optimizer.state
    assert any(e.kind == "batch_size" and "48" in e.message for e in tr.events)
    kinds = [type(e).__name__ for e in heard]
    assert kinds.index("Started") < kinds.index("StepEnded") and kinds.count("Ended") == 1
    assert any(e.kind == "oom_split" for e in tr.events)  # 64 ran out of memory: recovered
    if isolate:
        return
    searched = len(tr.events)
    tr.fit(data())
    assert not any(e.kind == "oom_split" for e in tr.events[searched:])


# ------------------------------------------------------------------------------- report
def test_report_writes_csv_html_png_and_summary(tmp_path):
    tr = run(val=data(64, seed=1), epochs=2)
    folder = tr.report(tmp_path / "report")
    names = {p.name for p in folder.iterdir()}
    assert {"history.csv", "steps.csv", "events.csv", "summary.txt", "figures.html"} <= names
    assert pd.read_csv(folder / "history.csv").shape[0] == 2
    text = (folder / "summary.txt").read_text()  # the live view's end paragraph
    assert "for 2 of 2 epochs" in text and "on cpu" in text and "Best val_loss" in text
    assert "samples/s" in text
    assert "figures.png" in names or "PNG figures skipped" in text
    html = (folder / "figures.html").read_text()  # the live view's panels, with the run's data
    assert "train loss (epoch)" in html and "val loss" in html and "learning rate" in html


class NumpyNoise(Dataset):
    """Each item adds numpy noise: reproducible in worker processes only if workers are seeded."""

    def __init__(self):
        self.x, self.y = data(128)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i] + torch.from_numpy(np.random.normal(0, 0.1, 8).astype(np.float32)), \
            self.y[i]


@pytest.mark.slow
def test_seed_makes_loader_workers_reproducible():
    kw = {"loader_kwargs": {"num_workers": 2}, "epochs": 1}
    a, b = run(train=NumpyNoise(), seed=11, **kw), run(train=NumpyNoise(), seed=11, **kw)
    c = run(train=NumpyNoise(), seed=12, **kw)
    assert a.steps["loss"].tolist() == b.steps["loss"].tolist()
    assert a.steps["loss"].tolist() != c.steps["loss"].tolist()


# ------------------------------------------------------------------------------- speed truth
class SlowData(Dataset):
    """Each item takes ``delay`` seconds to load: the run is data-bound (a batch of 16 waits
    0.32 s, far longer than the MLP's step even on a loaded 2-core machine)."""

    def __init__(self, n=64, delay=0.02):
        self.x, self.y = data(n)
        self.delay = delay

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        import time

        time.sleep(self.delay)
        return self.x[i], self.y[i]


def test_samples_per_s_is_wall_clock_and_names_the_data_wait():
    import time

    tr = Trainer(mlp(), device="cpu", batch_size=16, epochs=1, live=False, seed=0,
                 loader_kwargs={"num_workers": 0})
    t0 = time.perf_counter()
    tr.fit(SlowData())
    wall = time.perf_counter() - t0
    row = tr.history.iloc[0]
    # wall clock, not compute: at most the rate the loading sleeps alone allow (1.28 s for 64
    # samples), about the whole fit's rate or more (the epoch is inside it; its warm-up step is
    # not counted, so a busy machine's slower later steps may put it a little below)
    slow = SlowData()
    assert 0.8 * len(slow) / wall <= row["samples_per_s"] <= 1 / slow.delay
    assert row["data_wait_pct"] > 50
    assert row["compute_samples_per_s"] > 3 * row["samples_per_s"]  # the step alone, labelled


def test_the_live_line_names_a_data_bound_run(capsys):
    tr = Trainer(mlp(), device="cpu", batch_size=16, epochs=1, live="text", seed=0,
                 loader_kwargs={"num_workers": 0})
    tr.fit(SlowData())
    out = capsys.readouterr().out
    assert "data-bound" in out and "waiting for the next batch" in out
    fast = Trainer(mlp(), device="cpu", batch_size=16, epochs=1, live="text", seed=0)
    fast.fit(data())
    assert "data-bound" not in capsys.readouterr().out  # in-memory tensors: compute sets the pace


def test_a_dataset_yielding_device_tensors_gets_no_loader_workers():
    class OnDevice(Dataset):  # "meta" stands in for a GPU: a tensor not in CPU memory
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return torch.empty(3, device="meta"), torch.empty((), device="meta")

    tr = Trainer(mlp(), device="cpu", batch_size=4, epochs=1, live=False,
                 loader_kwargs={"num_workers": 2, "pin_memory": True})
    loader = opening.loader(tr.loop, OnDevice(), shuffle=False, what="train")
    assert loader.num_workers == 0 and loader.pin_memory is False
    assert [k for k, _ in tr.bus.pending].count("loader") == 1


def test_in_memory_tensors_are_batched_by_indexing_without_a_dataloader():
    from hybridnb.train.data import IndexedBatches

    tr = Trainer(mlp(), device="cpu", batch_size=32, epochs=1, live=False, seed=0)
    loader = opening.loader(tr.loop, TensorDataset(*data()), shuffle=True, what="train")
    assert isinstance(loader, IndexedBatches) and len(loader) == 8
    # the same batches, in the same order, as a DataLoader with the same generator state
    gen = torch.Generator().manual_seed(0)
    ref = DataLoader(TensorDataset(*data()), batch_sampler=tr.strategy.batch_sampler(
        256, 32, True, gen), generator=gen)
    for (a, b), (c, d) in zip(loader, ref, strict=True):
        assert torch.equal(a, c) and torch.equal(b, d)


class Spatial(nn.Module):
    """A convolution spanning every electrode of a one-channel input: the span rewrite's case."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(1, 8, (5, 6))
        self.head = nn.Linear(8 * 16, 1)

    def forward(self, x):
        return self.head(self.conv(x.unsqueeze(1)).flatten(1))


def test_speedups_are_measured_said_once_and_leave_the_weights_loadable_by_the_stock_model():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 20, 6, generator=g), torch.randn(64, generator=g)
    tr = Trainer(Spatial(), device="cpu", batch_size=16, epochs=1, live=False, seed=0,
                 speedups=True)
    tr.fit((x, y))
    said = [e.message for e in tr.events if e.kind == "speedups"]
    assert said and said[0] == tr.applied_speedups.message  # what was applied and measured
    assert said.count(said[0]) == 1  # said once
    stock = Spatial()
    stock.load_state_dict(tr.model.state_dict())  # same keys and shapes
    tr.model.eval()
    stock.eval()
    with torch.no_grad():
        assert torch.allclose(stock(x), tr.model(x), atol=1e-5)
    auto = Trainer(Spatial(), device="cpu", batch_size=16, epochs=1, live=False, seed=0)
    auto.fit((x, y))  # "auto" on a CPU: decided by rule, said once, only when it applies
    assert auto.applied_speedups.applied == ["span"]
    assert [e.kind for e in auto.events].count("speedups") == 1
    off = Trainer(Spatial(), device="cpu", batch_size=16, epochs=1, live=False, seed=0,
                  speedups=False)
    off.fit((x, y))
    assert off.applied_speedups is None
    assert not any(e.kind == "speedups" for e in off.events)


def test_validation_scores_the_ema_through_the_layers_the_speedups_rewrote():
    from hybridnb.speedups.replace import Replacement

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 20, 6, generator=g), torch.randn(64, generator=g)
    tr = Trainer(Spatial(), device="cpu", batch_size=16, epochs=2, live=False, seed=0,
                 speedups=True, ema=0.9)
    tr.fit((x, y), val=(x[:32], y[:32]))
    rewritten = {n for n, m in tr.model.named_modules() if isinstance(m, Replacement)}
    assert rewritten, tr.applied_speedups.message
    assert rewritten == {n for n, m in tr.ema_model.named_modules() if isinstance(m, Replacement)}
    assert int(tr.ema.n_averaged) == tr.global_step  # the average went on across the rebuild
    assert len(tr.history) == 2 and tr.history["val_loss"].notna().all()
