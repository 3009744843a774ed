"""Speedups: the depthwise-as-matmul rewrite must be exact, reversible and invisible to saved
weights; apply_speedups must keep only what measured faster and leave the model's state alone.

Everything runs on the CPU with small shapes; EEGNeX (braindecode) is the real case.
"""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

from hybridnb import speedups
from hybridnb.speedups import DEPTHWISE, ROWS, apply_speedups, decide, depthwise, trial


def rewritten_modules(model: nn.Module) -> list[str]:
    return DEPTHWISE.active(model)


def fake_timer(ratio: float):
    """``trial.timed_step`` as a test's measurement: a stock step takes 1 s, a step with the
    knob on ``1 / ratio`` s."""
    def timed_step(toggle, state, *args):
        toggle(state)
        return 1.0 / ratio if state else 1.0
    return timed_step


class MaxNorm(nn.Module):
    """A max-norm parametrization like braindecode's: each output filter's norm capped at 1."""

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return torch.renorm(w, p=2, dim=0, maxnorm=1.0)


class Spatial(nn.Module):
    """(B, 1, H, T) -> temporal conv -> depthwise conv over the whole height -> BN -> head."""

    def __init__(self, height: int, groups: int, mult: int, bias: bool, max_norm: bool) -> None:
        super().__init__()
        self.temporal = nn.Conv2d(1, groups, (1, 5), padding=(0, 2), bias=False)
        self.spatial = nn.Conv2d(groups, groups * mult, (height, 1), groups=groups, bias=bias)
        if max_norm:
            parametrize.register_parametrization(self.spatial, "weight", MaxNorm())
        self.bn = nn.BatchNorm2d(groups * mult)
        self.head = nn.Linear(groups * mult, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.bn(self.spatial(self.temporal(x)))
        return self.head(h.mean((2, 3)))


def _scaled(model: nn.Module) -> nn.Module:
    with torch.no_grad():  # weights large enough that max-norm really clips
        for p in model.parameters():
            p.mul_(3.0)
    return model


@pytest.mark.parametrize("mult", [1, 2, 4])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("max_norm", [False, True])
def test_rewrite_is_exact_over_random_depthwise_shapes(mult, bias, max_norm):
    g = torch.Generator().manual_seed(mult * 10 + bias * 2 + max_norm)
    for _ in range(3):
        groups = int(torch.randint(1, 7, (1,), generator=g))
        height = int(torch.randint(2, 20, (1,), generator=g))
        width = int(torch.randint(3, 30, (1,), generator=g))
        conv = nn.Conv2d(groups, groups * mult, (height, 1), groups=groups, bias=bias)
        if max_norm:
            _scaled(conv)
            parametrize.register_parametrization(conv, "weight", MaxNorm())
        stock = copy.deepcopy(conv)
        conv = nn.Sequential(conv)  # a replacement takes the place of a submodule
        x = torch.randn(5, groups, height, width, generator=g)
        report = DEPTHWISE.apply(conv, x)
        assert report.rewritten == ["0"]
        assert DEPTHWISE.active(conv) == ["0"]
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        out, ref = conv(xa), stock(xb)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        grad = torch.randn(ref.shape, generator=g)
        out.backward(grad)
        ref.backward(grad)
        torch.testing.assert_close(xa.grad, xb.grad, atol=1e-5, rtol=1e-5)
        for (name, p), (_, q) in zip(conv[0].named_parameters(), stock.named_parameters(),
                                     strict=True):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5, msg=name)


def test_only_height_spanning_depthwise_convs_are_rewritten():
    x = torch.randn(2, 4, 6, 9)
    cases = {
        "taller input": (nn.Conv2d(4, 8, (5, 1), groups=4), x),
        "not depthwise": (nn.Conv2d(4, 8, (6, 1)), x),
        "wide kernel": (nn.Conv2d(4, 8, (6, 3), groups=4), x),
        "padded": (nn.Conv2d(4, 8, (6, 1), groups=4, padding=(1, 0)), x),
        "strided in time": (nn.Conv2d(4, 8, (6, 1), groups=4, stride=(1, 2)), x),
    }
    for why, (conv, inp) in cases.items():
        assert not DEPTHWISE.apply(conv, inp), why
        assert type(conv) is nn.Conv2d, why


def test_other_shapes_take_the_convolution_path_after_rewrite():
    conv = nn.Sequential(nn.Conv2d(3, 6, (4, 1), groups=3))
    stock = copy.deepcopy(conv)
    assert DEPTHWISE.apply(conv, torch.randn(2, 3, 4, 7))
    taller = torch.randn(2, 3, 9, 7)  # kernel no longer spans the height: the conv runs
    torch.testing.assert_close(conv(taller), stock(taller))
    unbatched = torch.randn(3, 4, 7)
    torch.testing.assert_close(conv(unbatched), stock(unbatched))
    assert DEPTHWISE.check(conv, taller)[1] == DEPTHWISE.check(conv, unbatched)[1] == ""


def test_state_dict_round_trip_into_the_stock_model():
    torch.manual_seed(0)
    model = _scaled(Spatial(height=7, groups=3, mult=2, bias=True, max_norm=True))
    x = torch.randn(6, 1, 7, 20)
    keys = list(model.state_dict())
    assert DEPTHWISE.apply(model, x).rewritten == ["spatial"]
    assert list(model.state_dict()) == keys  # parametrization and names untouched
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):  # train the rewritten model so its weights move
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    stock = Spatial(height=7, groups=3, mult=2, bias=True, max_norm=True)
    stock.load_state_dict(model.state_dict())  # strict
    model.eval()
    stock.eval()
    torch.testing.assert_close(model(x), stock(x), atol=1e-5, rtol=1e-5)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    fresh = Spatial(height=7, groups=3, mult=2, bias=True, max_norm=True).eval()
    fresh.load_state_dict(torch.load(buf))
    torch.testing.assert_close(fresh(x), stock(x))


def test_whole_model_files_load_as_the_stock_class_and_undo_restores_it():
    model = Spatial(height=5, groups=2, mult=2, bias=False, max_norm=False)
    x = torch.randn(3, 1, 5, 11)
    DEPTHWISE.apply(model, x)
    assert rewritten_modules(model) == ["spatial"]
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert type(loaded.spatial) is nn.Conv2d
    assert rewritten_modules(copy.deepcopy(model)) == ["spatial"]  # a copy stays fast
    assert DEPTHWISE.undo(model) == 1
    assert type(model.spatial) is nn.Conv2d and not rewritten_modules(model)


def test_a_rewrite_that_differs_is_not_used_and_says_so(monkeypatch):
    real = depthwise.depthwise_as_matmul
    monkeypatch.setattr(depthwise.MatmulDepthwise, "compute",
                        staticmethod(lambda m, x: real(m, x) + 1.0))
    model = Spatial(height=5, groups=2, mult=1, bias=True, max_norm=False)
    x = torch.randn(3, 1, 5, 11)
    report = DEPTHWISE.apply(model, x)
    assert not report and "not used" in report.note
    assert type(model.spatial) is nn.Conv2d
    applied = apply_speedups(model, x, "cpu", mode="all", knobs=["rewrite"])
    assert applied.notes == [report.note]  # said once
    assert "rewrite" not in applied.applied and "rewrite" in applied.skipped


def test_rewrite_check_leaves_batchnorm_and_training_flags_alone():
    model = Spatial(height=5, groups=2, mult=2, bias=True, max_norm=True).train()
    before = copy.deepcopy(model.state_dict())
    DEPTHWISE.apply(model, torch.randn(4, 1, 5, 9))
    assert model.training and model.bn.training
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_eegnex_trains_the_same_after_rewrite():
    models = pytest.importorskip("braindecode.models")
    torch.manual_seed(0)
    stock = models.EEGNeX(n_chans=24, n_outputs=1, n_times=64)
    fast = copy.deepcopy(stock)
    x = torch.randn(4, 24, 64)
    report = DEPTHWISE.apply(fast, x)
    assert len(report.rewritten) == 1, "EEGNeX's spatial filter spans all channels"
    assert "parametrizations" in dict(fast.named_modules())[report.rewritten[0]]._modules
    for model in (stock, fast):
        torch.manual_seed(1)  # same dropout masks
        model.train()
        model(x).pow(2).mean().backward()
    torch.testing.assert_close(fast.eval()(x), stock.eval()(x), atol=1e-5, rtol=1e-4)
    for (name, p), (_, q) in zip(fast.named_parameters(), stock.named_parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)
    back = models.EEGNeX(n_chans=24, n_outputs=1, n_times=64).eval()
    back.load_state_dict(fast.state_dict())
    torch.testing.assert_close(back(x), stock(x), atol=1e-5, rtol=1e-4)


# -- apply_speedups ----------------------------------------------------------------------------

def test_auto_keeps_only_the_knobs_that_measured_faster(monkeypatch):
    gains = {"channels_last": 1.5, "rewrite": 0.8}
    calls = []

    def fake_race(toggle, model, inputs, device, prec, budget):
        knob = list(gains)[len(calls)]  # the knobs are raced in this order
        calls.append(knob)
        return gains[knob]

    monkeypatch.setattr(trial, "race", fake_race)
    model = Spatial(height=5, groups=2, mult=2, bias=True, max_norm=True)
    applied = apply_speedups(model, torch.randn(4, 1, 5, 9), "cpu", mode="measure")
    assert calls == ["channels_last", "rewrite"]
    assert applied.applied == ["channels_last"]
    assert applied.speedup == gains
    assert "rewrite" in applied.skipped and not rewritten_modules(model)
    assert model.temporal.weight.is_contiguous(memory_format=torch.channels_last)
    assert "channels_last 1.50x" in applied.message and "not kept: rewrite 0.80x" in applied.message
    applied.undo()
    assert model.temporal.weight.is_contiguous()


def test_auto_measures_for_real_and_leaves_the_state_as_it_was():
    torch.manual_seed(0)
    model = Spatial(height=5, groups=2, mult=2, bias=True, max_norm=True).train()
    model.head.weight.grad = torch.ones_like(model.head.weight)
    before = copy.deepcopy(model.state_dict())
    x = torch.randn(16, 1, 5, 9)
    rng = torch.random.get_rng_state()
    applied = apply_speedups(model, x, "cpu", mode="measure", budget_s=20.0)  # <= 20 rounds
    assert "not measured" not in str(applied.skipped), applied.skipped
    assert set(applied.speedup) == {"rewrite", "channels_last"}
    assert all(g > 0 for g in applied.speedup.values())
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert torch.equal(model.head.weight.grad, torch.ones_like(model.head.weight))
    assert model.temporal.weight.grad is None
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert ("rewrite" in applied.applied) == bool(rewritten_modules(model))


def test_all_applies_everything_applicable_and_undo_takes_it_back():
    model = Spatial(height=5, groups=2, mult=2, bias=True, max_norm=False)
    x = torch.randn(4, 1, 5, 9)
    ref = copy.deepcopy(model).eval()(x)
    applied = apply_speedups(model, x, "cpu", mode="all")
    assert applied.applied == ["rewrite", "channels_last"] and applied.modules["rewrite"] == ["spatial"]
    torch.testing.assert_close(model.eval()(x), ref, atol=1e-5, rtol=1e-5)
    applied.undo()
    assert type(model.spatial) is nn.Conv2d and model.temporal.weight.is_contiguous()
    off = apply_speedups(model, x, "cpu", mode="off")
    assert not off and off.message == "speedups off"


def test_models_without_candidates_say_why():
    model = nn.Sequential(nn.Flatten(), nn.Linear(20, 1))
    applied = apply_speedups(model, torch.randn(4, 4, 5), "cpu", mode="all")
    assert not applied
    assert "no depthwise" in applied.skipped["rewrite"]
    assert "no 2-D convolution" in applied.skipped["channels_last"]


def test_bad_arguments_name_the_argument():
    model = nn.Linear(3, 1)
    with pytest.raises(ValueError, match="mode='fast'"):
        apply_speedups(model, torch.randn(2, 3), "cpu", mode="fast")
    with pytest.raises(ValueError, match="knobs"):
        apply_speedups(model, torch.randn(2, 3), "cpu", knobs=["warp"])
    with pytest.raises(TypeError, match="example_x"):
        apply_speedups(model, "x", "cpu")


def test_the_check_runs_without_tf32_and_restores_the_flags(monkeypatch):
    seen = []
    real = depthwise.depthwise_as_matmul

    def spy(module, x):
        seen.append((torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32))
        return real(module, x)

    monkeypatch.setattr(depthwise.MatmulDepthwise, "compute", staticmethod(spy))
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    assert DEPTHWISE.apply(nn.Sequential(nn.Conv2d(2, 4, (3, 1), groups=2)),
                             torch.randn(2, 2, 3, 5))
    assert set(seen) == {(False, False)}  # layer check and whole-model check: exact fp32
    assert torch.backends.cudnn.allow_tf32 is True


# -- the CPU's cheap decision, process-wide flags, FLOP counting --------------------------------

class ConvNet(nn.Module):
    """A small Conv2d model: (B, C, T) -> temporal and spatial convolutions -> head."""

    def __init__(self, chans: int = 8, times: int = 64) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, (1, 9), padding=(0, 4))
        self.depthwise = nn.Conv2d(8, 16, (chans, 1), groups=8)
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.depthwise(torch.relu(self.conv(x.unsqueeze(1))))
        return self.head(h.mean((2, 3)))


def test_wanted_follows_the_setting_and_the_device():
    assert speedups.wanted(True, "cpu") and speedups.wanted(True, "mps")
    assert speedups.wanted("auto", "cuda") and speedups.wanted("auto", torch.device("cpu"))
    assert not speedups.wanted("auto", "mps")
    assert not speedups.wanted(False, "cuda") and not speedups.wanted(None, "cpu")
    with pytest.raises(ValueError, match="speedups='fast'"):
        speedups.wanted("fast", "cpu")


def test_cpu_auto_puts_a_conv_model_in_channels_last_when_its_trial_says_faster(monkeypatch):
    race = []
    monkeypatch.setattr(trial, "race", lambda *a, **k: race.append(a) or 2.0)
    monkeypatch.setattr(trial, "timed_step", fake_timer(1.5))
    model = ConvNet()
    x = torch.randn(32, 8, 64)
    ref = copy.deepcopy(model).eval()(x)
    applied = apply_speedups(model, x, "cpu", precision="fp32", steps=10_000)
    assert applied.applied == ["channels_last", "rows"] and "channels_last" in applied.rules
    assert applied.speedup == {"channels_last": 1.5} and "1.50x" in applied.message
    assert applied.modules["rows"] == ["conv"] and "rows" in applied.rules
    assert model.conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert not rewritten_modules(model) and "rewrite" in applied.skipped
    assert not race, "precision fp32 was asked: nothing to time"
    assert "channels_last" in applied.message and "as 1-D (conv)" in applied.message
    torch.testing.assert_close(model.eval()(x), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("ratio", [1.02, 0.7])
def test_cpu_auto_keeps_stock_unless_channels_last_measures_clearly_faster(monkeypatch, ratio):
    """A wash (CTNet measured 0.96-1.05x) or a loss stays stock, the measurement said."""
    monkeypatch.setattr(trial, "timed_step", fake_timer(ratio))
    model = ConvNet()
    x = torch.randn(32, 8, 64)
    before = copy.deepcopy(model.state_dict())
    applied = apply_speedups(model, x, "cpu", precision="fp32")
    assert "channels_last" not in applied.applied and "rows" not in applied.applied
    assert not applied.modules.get("rows") and not ROWS.active(model)
    assert all(p.is_contiguous() for p in model.parameters())
    assert f"not kept: channels_last {ratio:.2f}x" in applied.message
    for k, v in model.state_dict().items():  # the trial's steps moved nothing
        torch.testing.assert_close(v, before[k], msg=k)


def test_a_short_run_keeps_stock_without_a_channels_last_trial(monkeypatch):
    steps = []
    timer = fake_timer(2.0)
    monkeypatch.setattr(trial, "timed_step", lambda *a: steps.append(a[1]) or timer(*a))
    applied = apply_speedups(ConvNet(), torch.randn(32, 8, 64), "cpu", precision="fp32",
                             steps=20)  # 10% of 20 steps: two, and a trial takes six
    assert "channels_last" not in applied.applied and "too short for a trial" in applied.message
    assert steps == [], "no step was timed"


def test_the_paired_trial_stops_early_when_clear_and_stays_in_its_budget():
    calls = []

    def step(times):
        return lambda on: calls.append(on) or times[on]

    assert trial.paired(step({False: 1.0, True: 0.5}), budget=100) == [2.0, 2.0]
    assert len(calls) == 6  # warm-ups and two rounds: a clear gain needs no third
    calls.clear()
    assert trial.paired(step({False: 1.0, True: 1.0}), budget=100) == [1.0, 1.0, 1.0]
    calls.clear()
    assert trial.paired(step({False: 1.0, True: 1.0}), budget=7) == [1.0, 1.0]
    assert "budget is 5" in trial.paired(step({False: 1.0, True: 1.0}), budget=5)
    calls.clear()
    assert "run of 40 steps is too short" in trial.paired(step({False: 1.0, True: 1.0}),
                                                          budget=100, run_steps=40)
    assert not calls  # known before any step: six steps are more than 10 % of 40


def test_cpu_auto_leaves_an_mlp_alone():
    model = nn.Sequential(nn.Flatten(), nn.Linear(40, 16), nn.ReLU(), nn.Linear(16, 1))
    applied = apply_speedups(model, torch.randn(8, 4, 10), "cpu", precision="fp32")
    assert not applied and applied.applied == []
    assert all(p.is_contiguous() for p in model.parameters())
    assert "none applied" in applied.message
    plain = nn.Sequential(nn.Unflatten(1, (1, 4)), nn.Conv2d(1, 4, (3, 1)), nn.Flatten(),
                          nn.LazyLinear(1))
    plain(torch.randn(2, 4, 10))
    assert not apply_speedups(plain, torch.randn(8, 4, 10), "cpu", precision="fp32"), \
        "plain convolutions stay NCHW on the CPU (ShallowFBCSPNet measured 0.94x)"


def test_no_bf16_on_a_cpu_without_bf16_in_hardware(monkeypatch):
    monkeypatch.setattr(decide, "cpu_flags", lambda: {"avx2", "avx512f", "fma"})
    monkeypatch.setattr(decide, "usable_cores", lambda: (64, ""))  # enough cores for a trial otherwise
    tried = []
    monkeypatch.setattr(trial, "race", lambda *a, **k: tried.append(a) or 2.0)
    monkeypatch.setattr(trial, "timed_step", lambda *a, **k: tried.append(a) or 0.0)
    real_autocast = torch.autocast

    def spy_autocast(*args, **kwargs):
        if kwargs.get("dtype") == torch.bfloat16 and kwargs.get("enabled", True):
            tried.append("bf16 autocast")
        return real_autocast(*args, **kwargs)

    monkeypatch.setattr(torch, "autocast", spy_autocast)
    model = ConvNet()
    no_layout = [k for k in speedups.KNOBS if k != "channels_last"]  # its own trial
    applied = apply_speedups(model, torch.randn(16, 8, 64), "cpu", precision="auto",
                             knobs=no_layout)
    assert not tried
    assert applied.precision == "fp32" and "precision" not in applied.applied
    assert "bf16" in applied.skipped["precision"]
    assert not decide.cpu_native_bf16()
    monkeypatch.setattr(decide, "cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    assert decide.cpu_native_bf16()


def test_cpu_bf16_is_kept_only_when_the_trial_says_faster(monkeypatch):
    monkeypatch.setattr(decide, "cpu_flags", lambda: {"amx_bf16", "amx_tile"})
    monkeypatch.setattr(decide, "usable_cores", lambda: (64, ""))
    monkeypatch.setattr(trial, "timed_step", lambda *a, **k: 0.0)
    for gain, kept in ((1.5, True), (1.02, False), ("its timed step failed (x)", False)):
        monkeypatch.setattr(trial, "race", lambda *a, g=gain, **k: g)
        model = ConvNet()
        applied = apply_speedups(model, torch.randn(16, 8, 64), "cpu", precision="auto")
        assert (applied.precision == "bf16") is kept, gain
        assert ("precision" in applied.applied) is kept
        assert bool(rewritten_modules(model)) is kept, "the rewrite goes with bf16 only"
    short = apply_speedups(ConvNet(), torch.randn(16, 8, 64), "cpu", precision="auto", steps=5)
    assert short.precision == "fp32" and "short run" in short.skipped["precision"]


def test_the_memory_cap_turns_a_runaway_allocation_into_an_error():
    if not trial.can_cap_memory():
        pytest.skip("no address-space cap here")
    import resource

    before = resource.getrlimit(resource.RLIMIT_AS)
    with trial.memory_cap(), pytest.raises(RuntimeError):
        torch.empty(2**50, dtype=torch.uint8)  # a PiB
    assert resource.getrlimit(resource.RLIMIT_AS) == before


def test_restore_globals_puts_cudnn_benchmark_back(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    applied = speedups.Applied(device="cuda", precision="bf16", mode="auto")
    decide.use_cudnn_benchmark(applied)
    assert torch.backends.cudnn.benchmark is True and "cudnn_benchmark" in applied.applied
    applied.restore_globals()
    assert torch.backends.cudnn.benchmark is False and "cudnn_benchmark" not in applied.applied
    applied.restore_globals()  # twice is harmless
    assert torch.backends.cudnn.benchmark is False


@pytest.mark.parametrize("error", [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
    RuntimeError("HIP out of memory. Tried to allocate 2.00 GiB"),
])
def test_a_flop_count_that_runs_out_of_memory_returns_none_with_a_note(error):
    from hybridnb.train.bus import Bus
    from hybridnb.train.step import count_flops

    model = ConvNet()
    grads_before = [p.grad for p in model.parameters()]

    def oom(module, args):
        raise error

    handle = model.depthwise.register_forward_pre_hook(oom)
    bus = Bus(lambda: (0, 0))
    assert count_flops(model, torch.randn(4, 8, 64), bus=bus) is None
    assert len(bus.pending) == 1 and bus.pending[0][0] == "flops"
    assert bus.pending[0][1].startswith("FLOP count skipped")
    assert count_flops(model, torch.randn(4, 8, 64)) is None  # no bus: still None
    assert [p.grad for p in model.parameters()] == grads_before and model.training
    handle.remove()
    assert count_flops(model, torch.randn(4, 8, 64)) > 0


def test_a_flop_count_error_that_is_not_memory_propagates():
    from hybridnb.train.step import count_flops

    model = ConvNet()
    model.depthwise.register_forward_pre_hook(lambda m, a: (_ for _ in ()).throw(
        RuntimeError("shape mismatch")))
    with pytest.raises(RuntimeError, match="shape mismatch"):
        count_flops(model, torch.randn(4, 8, 64))


# -- the rows rewrite: (1, K) convolutions over several rows as 1-D convolutions ----------------

def _rows_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 4, (1, 8), padding="same", dilation=(1, 3), bias=False),
                         nn.ELU(), nn.Conv2d(4, 3, (1, 5), padding=(0, 2)),
                         nn.Conv2d(3, 3, (1, 4)), nn.Conv2d(3, 2, (3, 1)))


def test_rows_rewrite_computes_the_same_forward_and_gradients():
    model, x = _rows_net(), torch.randn(5, 2, 7, 40)
    stock = copy.deepcopy(model)
    report = ROWS.apply(model, x)
    assert report.rewritten == ["0", "2", "3"]  # the (3, 1) convolution is not a (1, K) one
    assert ROWS.active(model) == ["0", "2", "3"]
    target = torch.randn_like(stock(x))
    (model(x) * target).sum().backward()
    (stock(x) * target).sum().backward()
    torch.testing.assert_close(model(x), stock(x), atol=1e-5, rtol=1e-5)
    for (name, p), (_, q) in zip(model.named_parameters(), stock.named_parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=name)
    assert model.state_dict().keys() == stock.state_dict().keys()
    again = pickle.loads(pickle.dumps(model))  # pickles as the stock class
    assert type(again[0]) is nn.Conv2d
    assert ROWS.undo(model) == 3 and type(model[0]) is nn.Conv2d


def test_rows_rewrite_leaves_single_row_inputs_alone():
    model = nn.Sequential(nn.Conv2d(2, 4, (1, 5), padding="same"))
    assert not ROWS.apply(model, torch.randn(3, 2, 1, 30))
    assert type(model[0]) is nn.Conv2d


def test_cpu_auto_folds_eegnex_temporal_convolutions_and_says_so(monkeypatch):
    models = pytest.importorskip("braindecode.models")
    monkeypatch.setattr(trial, "timed_step", fake_timer(2.0))
    model = models.EEGNeX(n_chans=24, n_outputs=1, n_times=64)
    x = torch.randn(6, 24, 64)
    ref = copy.deepcopy(model).eval()(x)
    no_chain = [k for k in speedups.KNOBS if k != "chain"]  # the chain rule would take both
    applied = apply_speedups(model, x, "cpu", precision="fp32", knobs=no_chain)
    assert applied.applied[:2] == ["channels_last", "rows"]
    assert applied.modules["rows"] == ["block_1.1", "block_2.0"]  # blocks 4 and 5 see one row
    assert "block_2.0" in applied.message
    torch.testing.assert_close(model.eval()(x), ref, atol=1e-5, rtol=1e-4)
    applied.undo()
    assert not ROWS.active(model)


def test_cpu_auto_computes_eegnex_blocks_1_2_as_one_convolution_and_says_so(monkeypatch):
    models = pytest.importorskip("braindecode.models")
    monkeypatch.setattr(trial, "timed_step", fake_timer(2.0))
    model = models.EEGNeX(n_chans=24, n_outputs=1, n_times=64)
    x = torch.randn(6, 24, 64)
    ref = copy.deepcopy(model).eval()(x)
    applied = apply_speedups(model, x, "cpu", precision="fp32")
    assert applied.applied[:2] == ["chain", "channels_last"]
    assert applied.modules["chain"] == ["block_1.1>block_1.2>block_2.0"] and not applied.modules.get("rows")
    assert "block_1.1>block_1.2>block_2.0" in applied.message
    torch.testing.assert_close(model.eval()(x), ref, atol=1e-5, rtol=1e-4)


def test_cpu_auto_keeps_nchw_for_a_depthwise_convolution_along_the_width(monkeypatch):
    """channels_last only for (H, 1) depthwise kernels: ATCNet's (1, 129) one ran 0.53x."""
    monkeypatch.setattr(trial, "timed_step", fake_timer(2.0))
    model = nn.Sequential(nn.Unflatten(1, (1, 8)), nn.Conv2d(1, 8, (1, 5)),
                          nn.Conv2d(8, 16, (8, 1), groups=8), nn.Flatten(), nn.LazyLinear(1))
    along_width = nn.Sequential(nn.Unflatten(1, (1, 30)), nn.Conv2d(1, 8, (5, 1)),
                                nn.Conv2d(8, 16, (1, 8), groups=8), nn.Flatten(),
                                nn.LazyLinear(1))  # (B, 1, T, C), as ATCNet
    x = torch.randn(4, 8, 30)
    model(x)
    along_width(x.transpose(1, 2))
    assert "channels_last" in apply_speedups(model, x, "cpu", precision="fp32").applied
    applied = apply_speedups(along_width, x.transpose(1, 2), "cpu", precision="fp32")
    assert "channels_last" not in applied.applied and "(H, 1)" in applied.skipped["channels_last"]


class _Functional(nn.Module):
    """SincShallowNet's way: filters applied with F.conv2d, permuted, made contiguous."""

    def __init__(self) -> None:
        super().__init__()
        self.band = nn.Parameter(torch.randn(4, 1, 1, 5))
        self.spatial = nn.Conv2d(4, 8, (8, 1), groups=4)

    def forward(self, x):
        z = nn.functional.conv2d(x.unsqueeze(1), self.band, padding=(0, 2))
        return self.spatial(z.permute(0, 1, 2, 3).contiguous()).mean((1, 2, 3))


class _Branches(nn.Module):
    """TCFormer's way: temporal branches, each with its BatchNorm, concatenated before the
    spatial filter."""

    def __init__(self) -> None:
        super().__init__()
        self.branches = nn.ModuleList(nn.Sequential(nn.Conv2d(1, 4, (1, k), padding=(0, k // 2)),
                                                    nn.BatchNorm2d(4)) for k in (3, 5))
        self.spatial = nn.Conv2d(8, 8, (8, 1), groups=8)

    def forward(self, x):
        x = x.unsqueeze(1)
        return self.spatial(torch.cat([b(x) for b in self.branches], 1)).mean((1, 2, 3))


def test_cpu_auto_keeps_nchw_unless_the_filter_spans_a_convolutions_output(monkeypatch):
    """EEGTCNet (a grouped (16, 1) filter along time over 25 rows) ran 0.4x in channels_last,
    SincShallowNet (a spatial filter over functional sinc filters' output) 0.5x, TCFormer (over
    concatenated branches) 0.42x: not even timed."""
    monkeypatch.setattr(trial, "timed_step", fake_timer(2.0))
    along_time = nn.Sequential(nn.Unflatten(1, (1, 8)), nn.Conv2d(1, 8, (1, 5)),
                               nn.Conv2d(8, 8, (4, 1), groups=8), nn.Flatten(), nn.LazyLinear(1))
    x = torch.randn(4, 8, 30)
    along_time(x)
    for model in (along_time, _Functional(), _Branches()):
        applied = apply_speedups(model, x, "cpu", precision="fp32")
        assert "channels_last" not in applied.applied
        assert "spanning the height" in applied.skipped["channels_last"], model


def test_cpu_auto_folds_rows_only_beside_channels_last():
    """Alone, the rows rewrite ran 0.75-0.84x (TIDNet, TSception, EEGConformer)."""
    model = nn.Sequential(nn.Unflatten(1, (1, 8)), nn.Conv2d(1, 4, (1, 5)), nn.Flatten(),
                          nn.LazyLinear(1))
    x = torch.randn(4, 8, 30)
    model(x)
    applied = apply_speedups(model, x, "cpu", precision="fp32")
    assert "rows" not in applied.applied and "beside channels_last" in applied.skipped["rows"]


def test_rows_shorter_than_the_minimum_stay_two_dimensional():
    """CBraMod's (1, 3) convolutions over rows of 8 samples ran 0.81x folded."""
    conv = nn.Sequential(nn.Conv2d(4, 4, (1, 3), padding=(0, 1)))
    assert not ROWS.apply(conv, torch.randn(2, 4, 16, 8))
    assert ROWS.apply(conv, torch.randn(2, 4, 16, 40)).rewritten == ["0"]
