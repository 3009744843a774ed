"""The span rewrite: a convolution over every electrode of a one-channel input computed as a 1-D
convolution computes what the stock layer does (outputs and gradients), keeps the parameters
and state_dict keys, undoes, and is what the CPU's rules choose for ShallowFBCSPNet and
Deep4Net (braindecode's CombinedConv)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from hybridnb.speedups import SPAN, apply_speedups, span

N_CHANS, N_TIMES = 129, 200


def step(model: nn.Module, x: torch.Tensor, seed: int = 1):
    """One training-mode forward + backward (same dropout masks for the same seed): the output
    and every parameter's gradient."""
    model.train()
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(seed)
    out = model(x)
    (out.float() * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


def assert_same_step(stock: nn.Module, fast: nn.Module, x: torch.Tensor) -> None:
    out_a, grads_a = step(stock, x)
    out_b, grads_b = step(fast, x)
    torch.testing.assert_close(out_b, out_a, rtol=1e-4, atol=1e-5)
    floor = 1e-2 * max(g.abs().max().item() for g in grads_a)  # a bias before a BatchNorm: noise
    for a, b in zip(grads_a, grads_b, strict=True):
        assert (a - b).abs().max().item() <= 1e-4 * max(a.abs().max().item(), floor) + 1e-6


@pytest.mark.parametrize(("layout", "conv"), [
    ("time_by_chans", dict(kernel_size=(9, 12), bias=True)),  # oneDNN's kernel gradient
    ("time_by_chans", dict(kernel_size=(11, 12), stride=(2, 1), padding=(4, 0), bias=False)),
    ("chans_by_time", dict(kernel_size=(12, 10), dilation=(1, 2), padding=(0, 3), bias=True)),
    ("time_by_chans", dict(kernel_size=(16, 12), padding=(3, 0), bias=True)),  # the FFT form
])
def test_a_plain_spanning_conv2d_trains_the_same_keeps_its_keys_and_undoes(layout, conv):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 6, **conv), nn.BatchNorm2d(6), nn.ELU(), nn.Dropout(0.5),
                          nn.Flatten(), nn.LazyLinear(1))
    x = torch.randn(5, 1, 40, 12) if layout == "time_by_chans" else torch.randn(5, 1, 12, 40)
    model(x)  # the lazy layer
    stock = copy.deepcopy(model)
    keys = {k: v.data_ptr() for k, v in model.state_dict().items()}
    first = model[0]
    assert SPAN.apply(model, x).rewritten == ["0"]
    assert isinstance(model[0], span.SpanAsConv1d)
    assert {k: v.data_ptr() for k, v in model.state_dict().items()} == keys
    assert_same_step(stock, model, x)
    # another width: the stock path, same answer
    other = x[..., :-1] if layout == "chans_by_time" else x[:, :, :-1]
    torch.testing.assert_close(model[0](other), first(other))
    assert SPAN.undo(model) == 1 and model[0] is first


def test_the_input_gradient_is_the_stock_one_too():
    """Behind another layer the spanning convolution's input needs a gradient: through
    ``F.conv1d`` (a dilated kernel) and through the FFT form."""
    torch.manual_seed(0)
    for dilation in (2, 1):  # F.conv1d, then the FFT form
        model = nn.Sequential(nn.Conv2d(1, 1, 1), nn.Conv2d(1, 6, (10, 12), dilation=(dilation, 1)))
        x = torch.randn(5, 1, 40, 12)
        stock = copy.deepcopy(model)
        assert SPAN.apply(model, x).rewritten == ["1"]
        assert_same_step(stock, model, x)


def test_a_spanning_conv_trains_under_bf16_autocast():
    """Under autocast the 1-D form is ``F.conv1d`` in bf16 (the FFT form is fp32 only), and its
    gradients are stock's within bf16 rounding."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 6, (9, 12)), nn.Flatten(), nn.LazyLinear(1))
    x = torch.randn(5, 1, 40, 12)
    model(x)
    stock = copy.deepcopy(model)
    assert SPAN.apply(model, x).rewritten == ["0"]
    grads = []
    for m in (stock, model):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = m(x)
        out.float().sum().backward()
        grads.append([p.grad for p in m.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(b, a, rtol=2e-2, atol=2e-2 * a.abs().max().item())


def test_a_conv_that_does_not_span_its_input_is_left_alone():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, (1, 7), padding=(0, 3)), nn.Conv2d(4, 4, (3, 3)))
    assert not SPAN.could_apply(model)  # padded time kernel, several input channels
    assert not SPAN.could_apply(nn.Sequential(nn.Conv2d(1, 4, (12, 1))))  # one tap: a matmul
    narrow = nn.Sequential(nn.Conv2d(1, 4, (5, 6)))  # would span 6 electrodes
    assert not SPAN.apply(narrow, torch.randn(2, 1, 20, 8))  # but the input has 8


def braindecode_model(name: str) -> nn.Module:
    from braindecode import models

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(models, name)(n_chans=N_CHANS, n_times=N_TIMES, n_outputs=1, sfreq=100)


@pytest.mark.parametrize("bias", [(True, True), (False, True), (True, False)])
def test_combined_conv_keeps_its_own_parameters_and_gradients(bias):
    from braindecode.modules import CombinedConv

    torch.manual_seed(0)
    model = nn.Sequential(CombinedConv(16, 5, 4, 7, bias_time=bias[0], bias_spat=bias[1]),
                          nn.Flatten(), nn.LazyLinear(1))
    x = torch.randn(3, 1, 30, 16)
    model(x)
    stock = copy.deepcopy(model)
    names = [n for n, _ in model.named_parameters()]
    assert SPAN.apply(model, x).rewritten == ["0"]
    assert [n for n, _ in model.named_parameters()] == names  # conv_time and conv_spat, as before
    assert_same_step(stock, model, x)


@pytest.mark.parametrize("name", ["ShallowFBCSPNet", "Deep4Net"])
def test_the_cpu_rules_choose_the_span_rewrite_for_braindecodes_combined_conv(name):
    model = braindecode_model(name)
    stock = copy.deepcopy(model)
    x = torch.randn(4, N_CHANS, N_TIMES)
    keys = list(model.state_dict())
    applied = apply_speedups(model, x, "cpu", mode="auto")
    assert "span" in applied.applied and applied.modules["span"] == ["conv_time_spat"]
    assert "electrode-spanning" in applied.message
    assert list(model.state_dict()) == keys
    assert_same_step(stock, model, x)
    applied.undo()
    assert not SPAN.active(model)
    assert type(model.conv_time_spat).__name__ == "CombinedConv"
