"""A model summary on request: torchinfo's table of layers, output shapes and parameters,
computed with one zero-filled sample of the input shape the Trainer saw, in eval mode and
without gradients, so asking for it never changes a run (no random numbers, no statistics).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def model_summary(model: torch.nn.Module, input_shape: Sequence[int] | None = None,
                  depth: int = 3, **kwargs):
    """torchinfo's ``ModelStatistics`` (``str()``: the table) for a module or a Trainer (its
    first batch's input shape). ``input_shape``: one sample's, without the batch dimension;
    unknown: parameters only. Other keyword arguments go to ``torchinfo.summary``."""
    import torchinfo  # imported only when a summary is asked for

    if not isinstance(model, torch.nn.Module):  # a Trainer
        if input_shape is None:
            input_shape = model.learner.input_shape
        model = model.model
    weights = next(iter(model.parameters()), None)
    device = weights.device if weights is not None else torch.device("cpu")
    data = None
    if input_shape is not None:
        dtype = weights.dtype if weights is not None and weights.is_floating_point() else \
            torch.float32
        data = [torch.zeros((1, *input_shape), dtype=dtype, device=device)]
    options = {"depth": depth, "verbose": 0, "mode": "eval", "device": device,
               "col_names": ("output_size", "num_params") if data is not None
               else ("num_params",), **kwargs}
    with torch.no_grad():
        return torchinfo.summary(model, input_data=data, **options)
