"""The chain rewrite (conv (1, k) -> BatchNorm2d -> conv (1, k) as one convolution): trains exactly
as the stock layers do (outputs, gradients, running statistics), keeps state_dict keys, pickles as
the stock classes, undoes, refuses what it cannot compute, and the Trainer applies it by rule."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

from hybridnb.speedups import CHAIN, apply_speedups, exact, undo_rewrites
from hybridnb.speedups import ROWS as ROWS_REWRITE
from hybridnb.speedups import chain as rc
from hybridnb.speedups.chain import find_chains


def chained_modules(model: nn.Module) -> list[str]:
    return CHAIN.active(model)

ROWS, TIMES = 5, 40


def eegnex_like(k: int = 8, pad_a="same", pad_b="same", bias: bool = False,
                momentum: float | None = 0.1) -> nn.Sequential:
    """(B, ROWS, TIMES) -> conv (1, k) -> BN -> conv (1, k) -> BN -> depthwise over the rows ->
    ELU -> pool -> linear: EEGNeX's first three blocks in miniature."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Unflatten(1, (1, ROWS)),
        nn.Conv2d(1, 8, (1, k), padding=pad_a, bias=bias), nn.BatchNorm2d(8, momentum=momentum),
        nn.Conv2d(8, 8, (1, k), padding=pad_b, bias=bias), nn.BatchNorm2d(8),
        nn.Conv2d(8, 16, (ROWS, 1), groups=8), nn.ELU(), nn.AdaptiveAvgPool2d((1, 4)),
        nn.Flatten(), nn.Linear(64, 1))
    with torch.no_grad():  # BatchNorm affines away from 1 and 0, so a and b matter
        for bn in (model[2], model[4]):
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.normal_()
    return model


def batches(n: int = 4, times: int = TIMES) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(4, ROWS, times, generator=g) * 2 + 0.5 for _ in range(n)]


def close(a, b, msg=""):
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=msg)


@pytest.mark.parametrize("k,pad_a,pad_b,bias,momentum,optimizer", [
    (8, "same", "same", False, 0.1, "adamw"), (7, "same", "same", False, None, "adamw"),
    (7, "valid", (0, 2), False, 0.1, "adamw"),
    # a bias right before a BatchNorm, and BN1's shift when convB has no padding (every output
    # then sums all taps, and BN2 removes the constant), get a gradient that is zero in exact
    # arithmetic: AdamW turns the stock model's own rounding noise there into lr-sized steps,
    # so plain SGD for these
    (8, (0, 3), "valid", False, 0.1, "sgd"), (8, "same", "same", True, 0.1, "sgd"),
    (7, (0, 3), (0, 2), True, None, "sgd")])
def test_three_steps_match_the_stock_model(k, pad_a, pad_b, bias, momentum, optimizer):
    stock = eegnex_like(k, pad_a, pad_b, bias, momentum)
    fast = copy.deepcopy(stock)
    xs = batches()
    report = CHAIN.apply(fast, xs[0])
    assert report.rewritten == ["1>2>3"] and not report.note
    assert [type(m) for m in fast][1:4] == [rc.ChainHead, rc.ChainNorm, rc.ChainTail]
    make = torch.optim.AdamW if optimizer == "adamw" else torch.optim.SGD
    opts = [make(m.parameters(), lr=1e-2) for m in (stock, fast)]
    target = torch.randn(4, 1, generator=torch.Generator().manual_seed(2))
    for x in xs[1:]:
        outs = []
        for model in (stock, fast):
            out = model(x)
            nn.functional.mse_loss(out, target).backward()
            outs.append(out.detach())
        close(outs[1], outs[0], "training output")
        for (name, p), q in zip(fast.named_parameters(), stock.parameters(), strict=True):
            close(p.grad, q.grad, name)
        for opt in opts:
            opt.step()
            opt.zero_grad()
    for (name, p), q in zip(fast.named_parameters(), stock.parameters(), strict=True):
        close(p, q, name)
    for (name, b), c in zip(fast.named_buffers(), stock.buffers(), strict=True):
        close(b, c, name)  # running_mean, running_var
    assert fast[2].num_batches_tracked.item() == stock[2].num_batches_tracked.item() == 3
    stock.eval()
    fast.eval()
    with torch.no_grad():
        close(fast(xs[0]), stock(xs[0]), "eval output")


def test_keys_pickle_deepcopy_and_undo():
    model = eegnex_like()
    keys = list(model.state_dict())
    x = batches(1)[0]
    assert CHAIN.apply(model, x)
    assert list(model.state_dict()) == keys
    again = pickle.loads(pickle.dumps(model))  # the stock classes, no link
    assert [type(m) for m in again][1:4] == [nn.Conv2d, nn.BatchNorm2d, nn.Conv2d]
    assert not any(hasattr(m, "link") for m in again.modules())
    twin = copy.deepcopy(model)  # stays fast, linked to its own modules
    assert chained_modules(twin) == ["1", "2", "3"]
    assert twin[1].link.originals == tuple(twin[i].original for i in (1, 2, 3))
    assert twin[1].weight is not model[1].weight and twin[1].weight is twin[1].original.weight
    before = model[2].running_mean.clone()
    twin.train()(x)
    assert torch.equal(model[2].running_mean, before)  # the copy's statistics are its own
    assert not torch.equal(twin[2].running_mean, before)
    assert CHAIN.undo(model) == 3 and not chained_modules(model)
    assert [type(m) for m in model][1:4] == [nn.Conv2d, nn.BatchNorm2d, nn.Conv2d]
    assert list(model.state_dict()) == keys
    assert undo_rewrites(twin) == 3 and not chained_modules(twin)


def test_intermediates_stay_real_and_other_inputs_take_the_stock_path():
    stock = eegnex_like()
    fast = copy.deepcopy(stock)
    assert CHAIN.apply(fast, batches(1)[0])
    x = batches(1)[0]
    head, ref_head = fast[:3], stock[:3]  # convA + BN alone: the BatchNorm's own output
    close(head(x), ref_head(x))
    assert fast[:4](x).is_contiguous()  # the next BatchNorm's fast path
    short = torch.randn(4, ROWS, 6)  # too short for the edge corrections: a convolution
    close(fast(short), stock(short))
    assert fast[1].link.pending is None  # nothing held after a call


class Residual(nn.Module):
    """convA -> BN -> (convB(z) + other(z)): the BatchNorm output feeds two modules."""

    def __init__(self, functional: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.functional = functional
        self.a = nn.Conv2d(1, 8, (1, 8), padding="same", bias=False)  # no zero-grad bias
        self.bn = nn.BatchNorm2d(8)
        self.b = nn.Conv2d(8, 8, (1, 8), padding="same")
        self.other = nn.Identity()

    def forward(self, x):
        z = self.bn(self.a(x.unsqueeze(1)))
        return self.b(z) + (z if self.functional else self.other(z))


def test_a_reused_intermediate_is_refused_or_computed_exactly():
    x = batches(1)[0]
    assert find_chains(Residual(functional=False), x) == []  # another module takes z
    stock = Residual(functional=True)  # a reuse no hook sees: z is real, so still exact
    fast = copy.deepcopy(stock)
    assert CHAIN.apply(fast, x)
    target = torch.randn(4, 8, ROWS, TIMES)
    for model in (stock, fast):
        (model(x) * target).sum().backward()
    close(fast(x), stock(x))
    for (name, p), q in zip(fast.named_parameters(), stock.parameters(), strict=True):
        close(p.grad, q.grad, name)


def test_a_nonlinearity_between_or_a_costlier_composite_is_not_rewritten():
    x = batches(1)[0]
    between = eegnex_like()
    between.insert(3, nn.ELU())
    assert find_chains(between, x) == [] and not CHAIN.apply(between, x)
    wide = nn.Sequential(nn.Unflatten(1, (1, ROWS)), nn.Conv2d(1, 2, (1, 8), padding="same"),
                         nn.BatchNorm2d(2), nn.Conv2d(2, 8, (1, 8), padding="same"))
    assert find_chains(wide, x) == [("1", "2", "3")]
    assert rc.cost_share(wide[1], wide[3], TIMES) > rc.MAX_COST_SHARE  # 2 -> 8 channels
    assert not CHAIN.apply(wide, x) and not chained_modules(wide)


def test_a_chain_that_differs_is_not_used_and_says_so(monkeypatch):
    real = rc.chain_output
    monkeypatch.setattr(rc, "chain_output", lambda *a: real(*a) * 1.01)
    model = eegnex_like()
    report = CHAIN.apply(model, batches(1)[0])
    assert not report and "differed" in report.note and report.max_rel_diff > exact.RTOL
    assert not chained_modules(model)
    assert all(m.training for m in model.modules())  # the check left the flags alone
    assert model[2].num_batches_tracked.item() == 0  # and the statistics


def test_cpu_rule_applies_the_chain_before_rows_and_says_so():
    model = eegnex_like()
    x = batches(1)[0]
    applied = apply_speedups(model, x, "cpu", precision="fp32", steps=10)
    assert applied.applied[0] == "chain" and applied.modules["chain"] == ["1>2>3"]
    assert "chain" in applied.rules and "1>2>3" in applied.message
    assert not ROWS_REWRITE.active(model)  # rows found nothing left
    applied.undo()
    assert not chained_modules(model) and not applied.modules.get("chain")


def test_trainer_applies_it_by_rule_and_trains_the_same_weights():
    hn = pytest.importorskip("hybridnb")
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(48, ROWS, TIMES, generator=g), torch.randn(48, generator=g)

    def model():
        m = eegnex_like()
        m.append(nn.Flatten(0))
        return m

    runs = {}
    for speedups in ("auto", False):
        tr = hn.Trainer(model(), device="cpu", batch_size=16, epochs=1, live=False, seed=0,
                        speedups=speedups)
        tr.fit((x, y))
        runs[speedups] = tr
    said = [e.message for e in runs["auto"].events if e.kind == "speedups"]
    assert len(said) == 1 and "conv-BatchNorm-conv" in said[0] and "1>2>3" in said[0]
    assert runs["auto"].applied_speedups.modules["chain"] == ["1>2>3"]
    fast, stock = runs["auto"].model.state_dict(), runs[False].model.state_dict()
    assert fast.keys() == stock.keys()
    for name in stock:
        close(fast[name].float(), stock[name].float(), name)


def test_the_input_gradient_matches_when_the_input_needs_one():
    """A chain after other layers: the gradient reaches the chain's input as stock."""
    stock = eegnex_like()
    fast = copy.deepcopy(stock)
    assert CHAIN.apply(fast, batches(1)[0])
    x = batches(1)[0].requires_grad_()
    fast_grad, stock_grad = (torch.autograd.grad(m(x).square().sum(), x)[0] for m in (fast, stock))
    close(fast_grad, stock_grad)


def test_a_gradient_penalty_differentiates_through_the_chain_as_stock():
    """Double backward (a gradient penalty, ``create_graph=True``) works as on the stock model."""
    stock = eegnex_like()
    fast = copy.deepcopy(stock)
    x = batches(1)[0]
    assert CHAIN.apply(fast, x)
    for m in (stock, fast):
        grads = torch.autograd.grad(m(x).square().sum(), list(m.parameters()), create_graph=True)
        sum(g.square().sum() for g in grads).backward()
    for name, p in stock.named_parameters():
        close(dict(fast.named_parameters())[name].grad, p.grad, name)
