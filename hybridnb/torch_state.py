"""Torch's global state, held for a while and put back (eval mode, random generators), and a
model's meta copy (shapes only): for the training step, its preflight, compare(), speedup trials."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def evaluating(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode for the duration, then each module's own training flag back."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, flag in flags:
            m.training = flag


def torch_rng_state(device: torch.device) -> tuple:
    """torch's CPU generator and, on a CUDA device, that device's: what one step draws from."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def set_torch_rng_state(state: tuple, device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def on_meta(t: torch.Tensor) -> torch.Tensor:
    """``t``'s shape, dtype and requires_grad on the meta device: no memory, no compute."""
    return torch.empty_like(t, device="meta").requires_grad_(t.requires_grad)


def meta_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of ``model`` on meta, by name (a tied one under each name), for
    ``torch.func.functional_call``: the model run for its shapes only."""
    return {name: on_meta(t) for name, t in [*model.named_parameters(remove_duplicate=False),
                                             *model.named_buffers(remove_duplicate=False)]}
