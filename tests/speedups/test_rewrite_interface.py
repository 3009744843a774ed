"""The one interface every rewrite keeps: same state_dict keys and tensors, the original modules
back on undo, pickling as the stock model, hooks and training flags kept, a standalone check."""

from __future__ import annotations

import copy
import pickle

import cloudpickle
import pytest
import torch
from torch import nn

from hybridnb.speedups import CHAIN, DEPTHWISE, REWRITES, ROWS, depthwise, undo_rewrites


def model_for_all() -> nn.Sequential:
    """A chain (1, 2, 3), a (1, K) convolution left for rows (5) and a depthwise over rows (6)."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Unflatten(1, (1, 6)),
        nn.Conv2d(1, 8, (1, 7), padding="same", bias=False), nn.BatchNorm2d(8),
        nn.Conv2d(8, 8, (1, 7), padding="same"), nn.ELU(),
        nn.Conv2d(8, 8, (1, 5), padding=(0, 2)),
        nn.Conv2d(8, 16, (6, 1), groups=8), nn.Flatten(), nn.LazyLinear(1))


@pytest.fixture
def setup():
    model = model_for_all()
    x = torch.randn(4, 6, 30)
    model(x)  # the lazy layer
    return model, x


def test_every_rewrite_keeps_the_keys_and_the_very_tensors_and_undo_puts_the_originals_back(setup):
    model, x = setup
    stock_modules = list(model)
    before = {k: v.data_ptr() for k, v in model.state_dict().items()}
    params = list(model.parameters())
    ref = copy.deepcopy(model).eval()(x)
    assert CHAIN.apply(model, x).rewritten == ["1>2>3"]
    assert ROWS.apply(model, x).rewritten == ["5"]
    assert DEPTHWISE.apply(model, x).rewritten == ["6"]
    assert {k: v.data_ptr() for k, v in model.state_dict().items()} == before
    assert list(model.parameters()) == params  # an optimizer built before steps the same ones
    torch.testing.assert_close(model.eval()(x), ref, atol=1e-5, rtol=1e-4)
    assert model[6].kernel_size == (6, 1)  # attributes read from the original
    assert undo_rewrites(model) == 5
    assert list(model) == stock_modules  # the very module objects back
    assert not any(r.active(model) for r in REWRITES)


def test_pickle_and_cloudpickle_write_the_stock_model_and_a_deepcopy_stays_fast(setup):
    model, x = setup
    for r in REWRITES:
        r.apply(model, x)
    for dumps in (pickle.dumps, cloudpickle.dumps):
        loaded = pickle.loads(dumps(model))
        assert not any(r.active(loaded) for r in REWRITES)
        assert type(loaded[1]) is nn.Conv2d and type(loaded[2]) is nn.BatchNorm2d
        torch.testing.assert_close(loaded.eval()(x), model.eval()(x), atol=1e-5, rtol=1e-4)
    twin = copy.deepcopy(model)
    assert [r.active(twin) for r in REWRITES] == [r.active(model) for r in REWRITES]
    assert twin[6].weight is not model[6].weight
    assert twin[6].weight is twin[6].original.weight  # still shared inside the copy


def test_hooks_run_once_and_training_flags_reach_the_originals(setup):
    model, x = setup
    calls = []
    model[6].register_forward_hook(lambda m, a, out: calls.append("before"))
    DEPTHWISE.apply(model, x)
    model[6].register_forward_hook(lambda m, a, out: calls.append("after"))
    calls.clear()
    model(x)
    assert calls == ["before", "after"]
    CHAIN.apply(model, x)
    model.eval()
    assert model[2].original.training is False
    model.train()
    running = model[2].running_mean.clone()
    model(x)
    assert not torch.equal(model[2].running_mean, running)  # batch statistics moved
    assert model[2].original.num_batches_tracked.item() == model[2].num_batches_tracked.item()


def test_check_says_ok_or_why(setup, monkeypatch):
    model, x = setup
    DEPTHWISE.apply(model, x)
    worst, why = DEPTHWISE.check(model, x)
    assert not why and worst <= 1e-4
    real = depthwise.depthwise_as_matmul
    form = depthwise.MatmulDepthwise  # the replacement's compute, which check() also runs
    monkeypatch.setattr(form, "compute", staticmethod(lambda m, t: real(m, t) * 1.1))
    worst, why = DEPTHWISE.check(model, x)
    assert worst > 1e-4 and "differed from the convolution" in why
    monkeypatch.setattr(form, "compute",
                        staticmethod(lambda m, t: (_ for _ in ()).throw(RuntimeError("boom"))))
    worst, why = DEPTHWISE.check(model, x)
    assert worst == float("inf") and "RuntimeError: boom" in why
