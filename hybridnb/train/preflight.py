"""What ``fit`` can tell before anything starts: the skorch habit ``fit(X, y)``, inputs without
targets, items that are not ``(x, y[, extras])``, and outputs a named loss cannot pair with the
targets, found by running the model on the meta device (shapes only: nothing computed or
changed). Reads at most the first training item."""

from __future__ import annotations

import numpy as np
import torch
from torch.func import functional_call
from torch.utils.data import Dataset, IterableDataset, TensorDataset, default_collate

from hybridnb.torch_state import evaluating, meta_state, on_meta

_ARRAY = (np.ndarray, torch.Tensor)


def check_fit_data(train, val) -> tuple | None:
    """``fit(X, y)``, a lone array as val, and the training items' structure: the first
    training item, checked to be (x, y[, extras]) (else a ValueError saying the fix); None when
    not read here (a loader, a stream, an empty or failing Dataset)."""
    if isinstance(val, _ARRAY):
        if isinstance(train, _ARRAY):
            raise TypeError("fit(X, y): fit's second argument is the validation data, not the "
                            "targets: pass the training arrays as one tuple, trainer.fit((X, y)), "
                            "and validation data as another, trainer.fit((X, y), (X_val, y_val))")
        raise TypeError("val: one array has no targets: pass (X_val, y_val) as one tuple")
    if isinstance(train, _ARRAY) or (isinstance(train, (tuple, list)) and len(train) == 1
                                     and isinstance(train[0], _ARRAY)):
        raise ValueError("train: inputs without targets: pass (X, y) as one tuple, e.g. "
                         "trainer.fit((X, y))")
    if isinstance(train, (tuple, list)) and train and all(isinstance(a, _ARRAY) for a in train):
        if not all(a.ndim and len(a) for a in train):
            return None  # empty or scalar: as_dataset and the loader say what is wrong
        return tuple(torch.as_tensor(a[0]) for a in train)
    if isinstance(train, TensorDataset):
        if len(train.tensors) < 2:
            raise ValueError(f"train: a TensorDataset of {len(train.tensors)} tensor has no "
                             "targets: TensorDataset(X, y)")
        return train[0] if len(train) else None
    if not isinstance(train, Dataset) or isinstance(train, IterableDataset):
        return None
    try:
        if len(train) == 0:
            return None
        item = train[0]
    except Exception:  # noqa: BLE001 - the loader meets the same error, with torch's words
        return None
    if isinstance(item, (tuple, list)) and len(item) >= 2:
        return tuple(item)
    kind = type(train).__name__
    if isinstance(item, dict):
        got = f"a dict with keys {sorted(map(str, item))[:6]}"
    elif isinstance(item, (tuple, list)):
        got = f"a {type(item).__name__} of length {len(item)}"
    else:
        got = f"a {type(item).__name__}" + (f" of shape {tuple(item.shape)}"
                                            if isinstance(item, _ARRAY) else "")
    raise ValueError(f"train: {kind}[0] is {got}; the Trainer needs items (x, y) or "
                     "(x, y, *extras): return them from __getitem__ (or pass a DataLoader whose "
                     "collate_fn makes (x, y) batches)")


def check_outputs(model: torch.nn.Module, loss_fn, item: tuple, dtype: torch.dtype,
                  batch_size: int) -> None:
    """The named loss's own check (``loss_fn.check``) of the model's output for ``batch_size``
    samples shaped as ``item`` (on the meta device): its error now rather than at the first step.
    A loss without a check, or a model that cannot run on meta, is left to the first step."""
    check = getattr(loss_fn, "check", None)
    if check is None:
        return
    try:
        x, y = (default_collate([v]) for v in item[:2])
    except Exception:  # noqa: BLE001 - the loader's collate says it at the first batch
        return
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        return
    x = x.to(dtype) if x.is_floating_point() else x
    try:  # the input, parameters and buffers as meta tensors, in eval mode
        x = on_meta(x.expand(batch_size, *x.shape[1:]))
        with evaluating(model), torch.no_grad():
            out = functional_call(model, meta_state(model), (x,), tie_weights=True)
    except Exception:  # noqa: BLE001 - any failure on meta: the first step checks instead
        return
    if isinstance(out, torch.Tensor):
        check(out, y.expand(batch_size, *y.shape[1:]))
