"""Torch's global state, held for a while and put back (eval mode, random generators): one
definition below the training step, compare() and the speedups' trials."""

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
    """Put back what ``torch_rng_state(device)`` returned."""
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)
