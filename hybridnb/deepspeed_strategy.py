"""``strategy="deepspeed"``: what happens when it is asked for.

DeepSpeed's ZeRO-2 shards optimizer state and gradients over GPUs; it pays off when those do not
fit on one GPU, which EEG-sized models (well under 100M parameters) never reach, so DDP
(``strategy="ddp"``) is the recommendation here. The answer is a clear message either way:

- deepspeed missing: how to install it, and that DDP does the same job for these models;
- deepspeed present: DeepSpeed's engine must own backward, gradient clipping, loss scaling and
  the optimizer step, which the Trainer's loop does itself (that is what makes its OOM recovery
  and cross-rank agreement possible), so the Trainer does not drive DeepSpeed yet.
"""

from __future__ import annotations

import importlib.util

import torch

MISSING = ("strategy='deepspeed' needs the deepspeed package, which is not installed: pip install "
           "deepspeed (Linux with CUDA and a compiler; see deepspeed.ai). For EEG-sized models "
           "strategy='ddp' trains just as fast: ZeRO-2 saves optimizer and gradient memory that "
           "these models do not need.")
NOT_WIRED = ("strategy='deepspeed': deepspeed is installed, but hybridnb's Trainer does not drive "
             "DeepSpeed's engine (the engine must own backward, clipping, loss scaling and the "
             "optimizer step, which the Trainer does itself to recover from OOM across ranks). "
             "Use strategy='ddp' (same speed for EEG-sized models), or DeepSpeed's own training "
             "loop for models whose optimizer state does not fit on one GPU.")


def available() -> bool:
    """Whether ``import deepspeed`` would find the package (without importing it)."""
    return importlib.util.find_spec("deepspeed") is not None


def make_strategy(device: torch.device | str):
    """Raise the message that fits this machine (see the module doc)."""
    if not available():
        raise ImportError(MISSING)
    raise NotImplementedError(NOT_WIRED)
