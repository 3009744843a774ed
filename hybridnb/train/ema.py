"""Exponential moving average of the weights, with torch's own AveragedModel helpers."""

from __future__ import annotations

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn


def make_ema(model: torch.nn.Module, decay: float) -> AveragedModel:
    """An EMA copy of ``model``, buffers (batch-norm statistics) averaged too: after each step
    ``ema.update_parameters(model)`` does ``ema = decay * ema + (1 - decay) * weights``."""
    if not 0.0 < decay < 1.0:
        raise ValueError(f"ema={decay!r}: the decay must be between 0 and 1 (e.g. 0.999)")
    return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)
