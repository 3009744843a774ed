"""Exactness on a sample: a rewrite is kept only when, on the first batch, every compared tensor
``a`` agrees with the stock one ``b`` as ``|a - b| <= ATOL + RTOL * max|b|`` (fp32, TF32 off).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from hybridnb.torch_state import evaluating
from hybridnb.torch_state import set_torch_rng_state as set_rng_state
from hybridnb.torch_state import torch_rng_state as rng_state

RTOL, ATOL = 1e-4, 1e-5
# a gradient is compared relative to its own size, but at least this share of the largest one: a
# parameter whose gradient is zero in exact arithmetic (a bias right before a BatchNorm) holds
# only rounding noise, which scales with the others
GRAD_FLOOR = 1e-2


@contextlib.contextmanager
def exact_fp32() -> Iterator[None]:
    """TF32 off for a check: cuDNN would run a convolution in TF32 (10-bit mantissa) by default,
    which differs from an fp32 matmul for reasons unrelated to the rewrite."""
    cudnn, matmul = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = cudnn, matmul


def eval_output(model: nn.Module, example: tuple, hooks: Iterable[RemovableHandle] = ()):
    """``model(*example)`` in eval mode, fp32 without TF32, without gradients (no BatchNorm
    statistics move, no random numbers drawn); ``hooks`` are removed after, whatever happens."""
    try:
        with torch.no_grad(), evaluating(model), exact_fp32():
            return model(*example)
    finally:
        for h in hooks:
            h.remove()


def rel_diff(a: torch.Tensor, b: torch.Tensor, floor: float = 0.0) -> float:
    """max|a - b| / (max(max|b|, floor) + ATOL/RTOL): at most RTOL exactly when |a - b| <= ATOL +
    RTOL max|b| (non-finite values must sit at the same places)."""
    a, b = a.detach().float(), b.detach().float()
    finite = b.isfinite()
    if not torch.equal(a.isfinite(), finite):  # another shape, too
        return float("inf")
    a, b = a[finite], b[finite]
    if not b.numel():
        return 0.0
    return (a - b).abs().max().item() / (max(b.abs().max().item(), floor) + ATOL / RTOL)


def first_samples(example: tuple, n: int) -> tuple:
    """The first ``n`` samples of each batched tensor of a model's positional inputs."""
    return tuple(a[:n] if isinstance(a, torch.Tensor) and a.dim() else a for a in example)


def tensors_of(out) -> list[torch.Tensor]:
    """Every tensor of a model's output (a tensor, or tensors nested in tuples/lists/dicts)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        return [t for item in out for t in tensors_of(item)]
    return []


def first_tensor(out) -> torch.Tensor:
    """The first tensor of a model's output: the one a training pass takes the loss of."""
    found = tensors_of(out)
    if not found:
        raise TypeError(f"the model returned a {type(out).__name__} without a tensor; a backward "
                        "pass needs one")
    return found[0]


def training_diff(stock: nn.Module, fast: nn.Module, inputs: tuple) -> float:
    """Largest relative difference of one training forward + backward of ``stock`` and ``fast``
    (copies: both change), same random streams, a fixed random projection of the output as the
    loss: outputs, gradients (``GRAD_FLOOR``) and buffers."""
    device = next((a.device for a in inputs if isinstance(a, torch.Tensor)), torch.device("cpu"))
    state = rng_state(device)
    results = []
    try:
        for model in (stock, fast):
            set_rng_state(state, device)
            model.train()
            model.zero_grad()
            with exact_fp32():
                tensors = tensors_of(model(*inputs))
                gen = torch.Generator().manual_seed(0)
                loss = sum((t.float() * torch.randn(t.shape, generator=gen).to(t.device)).sum()
                           for t in tensors if t.is_floating_point() and t.requires_grad)
                if isinstance(loss, torch.Tensor):
                    loss.backward()
            results.append(([t.detach() for t in tensors],
                            [p.grad for p in model.parameters()],
                            [b.detach() for b in model.buffers()]))
    finally:
        set_rng_state(state, device)
    worst = 0.0
    for kind, (part_a, part_b) in enumerate(zip(*results, strict=True)):
        if [a is None for a in part_a] != [b is None for b in part_b]:  # or another count
            return float("inf")
        pairs = [(a, b) for a, b in zip(part_a, part_b, strict=True) if a is not None]
        floor = 0.0
        if kind == 1:  # gradients: rounding noise scales with the largest of them
            floor = GRAD_FLOOR * max((a.abs().max().item() for a, _ in pairs), default=0.0)
        worst = max([worst] + [rel_diff(b, a, floor) for a, b in pairs])
    return worst
