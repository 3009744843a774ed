"""Exactness on a sample: how far a rewritten model may differ from the stock one, measured.

A rewrite is kept only when, on the first batch, every compared tensor ``a`` agrees with the
stock one ``b`` as ``|a - b| <= ATOL + RTOL * max|b|`` (fp32, TF32 off).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from hybridnb.torch_state import evaluating

# fp32 agreement demanded on the example batch: |a - b| <= ATOL + RTOL * max|b|
RTOL, ATOL = 1e-4, 1e-5


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


def eval_output(model: nn.Module, example: tuple):
    """``model(*example)`` in eval mode, fp32 without TF32, without gradients: no BatchNorm
    statistics move and no random numbers are drawn."""
    with torch.no_grad(), evaluating(model), exact_fp32():
        return model(*example)


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a - b| / (max|b| + ATOL/RTOL): at most RTOL exactly when |a - b| <= ATOL + RTOL max|b|
    (non-finite values must sit at the same places)."""
    a, b = a.detach().float(), b.detach().float()
    if a.shape != b.shape:
        return float("inf")
    finite = b.isfinite()
    if not torch.equal(a.isfinite(), finite):
        return float("inf")
    a, b = a[finite], b[finite]
    if not b.numel():
        return 0.0
    return (a - b).abs().max().item() / (b.abs().max().item() + ATOL / RTOL)


def rel_diff_any(a, b) -> float:
    """``rel_diff`` over tensors nested in tuples/lists/dicts (model outputs of any shape)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return rel_diff(a, b)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b):
        return max((rel_diff_any(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return max((rel_diff_any(a[k], b[k]) for k in a), default=0.0)
    return 0.0 if a == b else float("inf")


def tensors_of(out) -> list[torch.Tensor]:
    """Every tensor of a model's output (a tensor, or tensors nested in tuples/lists/dicts)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        return [t for item in out for t in tensors_of(item)]
    return []
