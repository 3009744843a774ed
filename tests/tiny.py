"""The tiny regression problem the Trainer's fast tests share: ``sine_data`` and ``sine_net``
(``from tiny import sine_data, sine_net``)."""

from __future__ import annotations

import torch
from torch import nn


def sine_data(n: int = 128, d: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` inputs of ``d`` features and a smooth target of shape (n, 1)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    return x, torch.sin(x @ torch.linspace(-1, 1, d)).unsqueeze(1)


def sine_net(hidden: int = 16, d: int = 8) -> nn.Module:
    """A seeded two-layer MLP for ``sine_data``."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(d, hidden), nn.Tanh(), nn.Linear(hidden, 1))
