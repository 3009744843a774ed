"""Trained weights in one file, with what is needed to use them, and their safe load.

``save_model`` (``trainer.save``) writes the weights atomically with the model's class, the
arguments it was built with when known (``get_config()``/``from_config()`` as braindecode's
models have, ``init_args=``, or an ``__init__`` that takes none), one sample's input shape and
the versions. ``hn.load`` reads them with ``weights_only=True`` (no pickled code runs), and a
hybridnb checkpoint (``last.pt``, ``best.pt``) too.

>>> model = hn.load("runs/c1/model.pt", ShallowFBCSPNet(n_chans=129, n_outputs=1, n_times=200))
"""

from __future__ import annotations

import importlib
import inspect
import os
import time
from pathlib import Path

import torch

from hybridnb import files

FORMAT = "hybridnb-model-1"


class ModelFileError(ValueError):
    """A model file that cannot be used: missing, unreadable, not ours, or not this model's."""


def save_model(model: torch.nn.Module, path: str | os.PathLike, *,
               input_shape: tuple[int, ...] | None = None, weights: str = "final",
               extra: dict | None = None, init_args: dict | None = None) -> Path:
    """Write ``model``'s weights and metadata to ``path`` atomically; returns the path.

    ``weights``: "final", "best" or "ema"; ``extra``: more metadata, plain data;
    ``init_args``: what ``type(model)(**init_args)`` rebuilds it with. A failed write raises
    ``files.WriteError`` naming ``path`` and the cause, leaving an older file there as it was."""
    import hybridnb

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    cls = type(model)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    record = {"format": FORMAT, "model": state,
              "model_class": {"module": cls.__module__, "qualname": cls.__qualname__,
                              "init": _init_record(model, init_args)},
              "input_shape": None if input_shape is None else [int(n) for n in input_shape],
              "weights": weights,
              "versions": {"hybridnb": str(hybridnb.__version__), "torch": str(torch.__version__)},
              "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "extra": {str(k): _plain(v, f"extra[{k!r}]") for k, v in (extra or {}).items()}}
    try:
        return files.atomic_write(path, lambda f: torch.save(record, f))
    except Exception as exc:  # narrowed by is_write_failure
        if not files.is_write_failure(exc):
            raise
        kept = "the older file there is unchanged" if Path(path).exists() else "no file written"
        message = (f"saving the model to {path} failed ({files.describe(exc, path)}); {kept}: "
                   "free space there or save into another folder")
        code = getattr(exc, "errno", None)
        raise (files.WriteError(code, message) if code else files.WriteError(message)) from None


def _init_record(model: torch.nn.Module, init_args: dict | None) -> dict | None:
    """``{"how": "kwargs" | "from_config", "args": {...}}``, or None when not known."""
    cls = type(model)
    if init_args is not None:
        return {"how": "kwargs", "args": _plain(dict(init_args), "init_args")}
    if callable(getattr(model, "get_config", None)) and callable(getattr(cls, "from_config",
                                                                         None)):
        try:
            return {"how": "from_config", "args": _plain(dict(model.get_config()), "config")}
        except (TypeError, ValueError):  # not plain data (e.g. a montage object): not known
            return None
    try:
        takes_none = len(inspect.signature(cls.__init__).parameters) == 1  # self alone
    except (TypeError, ValueError):  # no signature to read
        return None
    return {"how": "kwargs", "args": {}} if takes_none else None


def _plain(value, where: str):
    """``value`` as data ``weights_only=True`` reads, or a TypeError naming ``where``."""
    if value is None:
        return value
    if isinstance(value, (bool, int, float, str)):  # subclasses (e.g. TorchVersion) as the base
        return value if type(value) in (bool, int, float, str) else type(value).__mro__[-2](value)
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if hasattr(value, "item") and getattr(value, "shape", None) == ():  # numpy scalar
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {str(k): _plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    raise TypeError(f"{where} is a {type(value).__name__}: the saved metadata must be plain "
                    "data (numbers, strings, lists, dicts, tensors) so it loads with "
                    "weights_only=True")


_PICKLED_ADVICE = ("save the weights with trainer.save(path) or torch.save(model.state_dict(), "
                   "path) and load those; or, only if you trust the file, load it yourself with "
                   "torch.load(path, weights_only=False)")


def _read(path: str | os.PathLike) -> dict:
    data = files.read_safely(path, "model file", "is not a readable model file (truncated, "
                             "corrupt, or not written by torch.save)", FileNotFoundError,
                             ModelFileError, _PICKLED_ADVICE)
    fmt = data.get("format") if isinstance(data, dict) else None
    if fmt == FORMAT:
        return data
    if fmt == files.CHECKPOINT_FORMAT and isinstance(data.get("model"), dict):
        name = data.get("config", {}).get("model")
        return {"format": fmt, "model": data["model"],
                "model_class": {"module": None, "qualname": name} if name else None,
                "input_shape": data.get("input_shape"), "weights": data.get("kind", "last"),
                "versions": {}, "extra": {}}
    held = "" if isinstance(data, dict) else f" (it holds a {type(data).__name__})"
    raise ModelFileError(f"{path} is not a model saved by hybridnb (trainer.save / "
                         f"hybridnb.saving.save_model): its format is {fmt!r}{held}. A plain "
                         "state dict loads with model.load_state_dict(torch.load(path, "
                         "weights_only=True))")


def read_metadata(path: str | os.PathLike) -> dict:
    """Everything ``save_model`` wrote except the weights (class, input shape, versions, ...)."""
    data = _read(path)
    return {k: v for k, v in data.items() if k != "model"}


def load(path: str | os.PathLike, model: torch.nn.Module | None = None) -> torch.nn.Module:
    """Load the weights saved in ``path`` into ``model`` (built with the saved one's arguments)
    or, with no model, into the saved class rebuilt; returns it in eval mode."""
    if isinstance(model, type):
        raise TypeError(f"load(path, {model.__name__}) needs a model instance built with the "
                        f"same arguments as the saved one, e.g. {model.__name__}(...)")
    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    data = _read(path)
    saved = data.get("model_class") or {}
    mine = type(model)
    if model is None:
        model = _rebuild(path, saved)
    elif saved.get("qualname") and saved["qualname"] != mine.__qualname__:
        where = ".".join(filter(None, (saved.get("module"), saved["qualname"])))
        raise ModelFileError(f"{path} holds weights of a {where}, but the model given is a "
                             f"{mine.__module__}.{mine.__qualname__}: build the saved class "
                             "with the same arguments and load into that")
    _check_keys(path, data["model"], model)  # before loading: torch copies what fits, then raises
    try:  # what the check cannot see (a model's own load_state_dict rules)
        model.load_state_dict(data["model"])
    except RuntimeError as exc:
        raise ModelFileError(f"{path} does not fit this model ({exc}): build the model with the "
                             "arguments it was trained with") from None
    return model.eval()


def _rebuild(path, saved: dict) -> torch.nn.Module:
    module, qualname, init = saved.get("module"), saved.get("qualname"), saved.get("init")
    name = ".".join(filter(None, (module, qualname))) or "model"
    advice = f"pass the model: hn.load({str(path)!r}, {qualname or 'Model'}(...))"
    if not module or not qualname:
        raise ModelFileError(f"{path} does not name the module of its model's class ({name}): "
                             f"{advice}")
    if "<locals>" in qualname:
        raise ModelFileError(f"{path} holds a {name}, a class defined inside a function, "
                             f"which cannot be imported: {advice}")
    try:
        cls = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
    except (ImportError, AttributeError) as exc:
        raise ModelFileError(f"{path} holds a {name}, which cannot be imported here "
                             f"({type(exc).__name__}: {exc}): install or import its package "
                             f"(a class defined in a notebook lives in __main__ there), or "
                             f"{advice}") from None
    if init is None:
        raise ModelFileError(f"{path} holds a {name} but not the arguments it was built with "
                             f"(save it with trainer.save(path, init_args={{...}}) to keep "
                             f"them): {advice}")
    try:
        if init.get("how") == "from_config":
            return cls.from_config(dict(init["args"]))
        return cls(**init["args"])
    except Exception as exc:  # noqa: BLE001 - the user's constructor
        raise ModelFileError(f"{path}: rebuilding {name} with its saved arguments failed "
                             f"({type(exc).__name__}: {exc}): {advice}") from exc


def _check_keys(path, theirs: dict, model: torch.nn.Module) -> None:
    """One error listing every missing, unexpected and differently shaped weight. Old names are
    read as braindecode's ``load_state_dict`` renames them (``model.mapping``); a lazy layer's
    unset weights and non-tensor entries (extra state) have no shape to compare."""
    renamed = getattr(model, "mapping", None) or {}
    theirs = {renamed.get(k, k): v for k, v in theirs.items()}
    mine = model.state_dict()
    missing = [k for k in mine if k not in theirs]
    unexpected = [k for k in theirs if k not in mine]

    def shape(t) -> tuple | None:
        lazy = isinstance(t, torch.nn.parameter.UninitializedTensorMixin)
        return None if lazy or not hasattr(t, "shape") else tuple(t.shape)

    shapes = [f"{k} {shape(theirs[k])} in the file, {shape(v)} in the model"
              for k, v in mine.items() if k in theirs and None not in (shape(theirs[k]), shape(v))
              and shape(theirs[k]) != shape(v)]
    if not (missing or unexpected or shapes):
        return
    parts = [f"{len(items)} {label}: {', '.join(items[:5])}{', ...' if len(items) > 5 else ''}"
             for label, items in (("missing from the file", missing),
                                  ("in the file but not in the model", unexpected),
                                  ("shaped differently", shapes)) if items]
    raise ModelFileError(f"{path} does not fit this model ({'; '.join(parts)}): build the "
                         "model with the arguments it was trained with (n_chans, n_outputs, "
                         "n_times, ...)")
