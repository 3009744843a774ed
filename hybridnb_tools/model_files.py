"""A challenge model saved with its spec, so another notebook can rebuild and load it.

The file is a ``hybridnb.saving`` model file (class, input shape, versions; loads with
``weights_only=True``) whose ``extra`` holds the ``data_prep.submission.ModelSpec``. It lives here
because it needs both libraries (data_prep never imports hybridnb).
"""

from __future__ import annotations

import os
from pathlib import Path

from data_prep.submission import ModelSpec
from hybridnb.saving import ModelFileError, load, read_metadata
from hybridnb.saving import save_model as save_weights


def save_model(path: str | os.PathLike, spec: ModelSpec, model) -> Path:
    """Write ``model``'s weights with ``spec`` to ``path``, atomically."""
    shape = (spec.kwargs.get("n_chans"), spec.kwargs.get("n_times"))
    return save_weights(model, path, input_shape=shape if None not in shape else None,
                        extra={"spec": spec.to_dict()})


def load_model(path: str | os.PathLike) -> tuple[ModelSpec, object]:
    """``(spec, model)`` from a file written by :func:`save_model`: the model rebuilt from its
    spec, the weights checked by ``hybridnb.load`` (class, names and shapes of every weight)."""
    meta = read_metadata(path)  # FileNotFoundError / ModelFileError name the file
    if "spec" not in meta.get("extra", {}):
        raise ModelFileError(f"{path} holds weights but no model spec: it was not written by "
                             "hybridnb_tools.model_files.save_model (trainer.save files load "
                             "with hybridnb.load(path, model))")
    spec = ModelSpec.from_dict(meta["extra"]["spec"])
    return spec, load(path, spec.build())
