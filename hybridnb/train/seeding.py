"""Seeds and random-number-generator states (python, numpy, torch CPU, CUDA) as plain values
(tensors, lists, ints), so a checkpoint holding them loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from hybridnb.env import ISOLATED_ENV, current


def seed_everything(seed: int) -> None:
    """Seed python's ``random``, numpy's global generator and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds CUDA devices lazily, without initialising CUDA


def rng_state() -> dict:
    """Every global generator's state as tensors / plain values."""
    version, mt, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    return {
        "python": {"version": int(version), "state": list(mt), "gauss": gauss},
        "numpy": {"key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
                  "pos": int(np_state["state"]["pos"]), "has_gauss": int(np_state["has_gauss"]),
                  "gauss": float(np_state["gauss"])},
        "torch": torch.get_rng_state(),
        # never starts CUDA: a kernel that isolates must not
        "cuda": list(torch.cuda.get_rng_state_all()) if torch.cuda.is_initialized() else None,
    }


def set_rng_state(state: dict) -> None:
    """Restore what ``rng_state`` returned."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state({"bit_generator": "MT19937",
                         "state": {"key": npy["key"].numpy().astype(np.uint32), "pos": npy["pos"]},
                         "has_gauss": npy["has_gauss"], "gauss": npy["gauss"]})
    torch.set_rng_state(state["torch"])
    # only a process that already touched CUDA, or an isolated worker, sets CUDA's states (a
    # kernel that hands training to a worker never starts the CUDA driver)
    if state.get("cuda") is not None and (torch.cuda.is_initialized() or (
            bool(current().get(ISOLATED_ENV)) and torch.cuda.is_available())):
        torch.cuda.set_rng_state_all(state["cuda"])
