"""Activation (gradient) checkpointing of a model's top-level blocks (torch.utils.checkpoint)
for the duration of a ``with``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.utils.checkpoint import checkpoint


class Checkpointed(torch.nn.Module):
    """``block`` with its forward recomputed in backward; same parameters and state_dict keys."""

    def __init__(self, block: torch.nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "block", block)  # not a child: the registries below are its own
        self._parameters, self._buffers, self._modules = (block._parameters, block._buffers,
                                                          block._modules)

    def train(self, mode: bool = True) -> Checkpointed:
        self.block.train(mode)  # the block's own flag (its children are shared already)
        return super().train(mode)

    def forward(self, *args, **kwargs):
        if torch.is_grad_enabled():
            return checkpoint(self.block, *args, use_reentrant=False, **kwargs)
        return self.block(*args, **kwargs)


@contextlib.contextmanager
def checkpointed_blocks(model: torch.nn.Module, enabled: bool, bus) -> Iterator[None]:
    """Wrap the eligible blocks while the ``with`` runs; which ones is noted on ``bus`` (said
    as the fit's view opens)."""
    # top-level children with parameters and without batch norm (whose running statistics the
    # recomputation would update twice)
    batch_norm = torch.nn.modules.batchnorm._BatchNorm
    names = [name for name, child in model.named_children() if enabled
             and any(True for _ in child.parameters())
             and not any(isinstance(m, batch_norm) for m in child.modules())]
    if enabled:
        bus.note("grad_checkpointing", (
            f"recomputing activations of {len(names)} blocks ({', '.join(names[:6])}"
            f"{'...' if len(names) > 6 else ''}) in backward") if names else (
            "no top-level block with parameters and without batch norm to checkpoint; "
            "running without"))
    originals = {name: model.get_submodule(name) for name in names}
    for name, block in originals.items():
        setattr(model, name, Checkpointed(block))
    try:
        yield
    finally:
        for name, block in originals.items():
            setattr(model, name, block)
