"""What a model holds outside ``state_dict()``, brought back from an isolated worker.

An in-process fit leaves on the model what its ``forward`` changed outside the state dict (a plain
attribute such as an annealed temperature, a non-persistent buffer, the ``training`` flag); the
worker's model is another object, so without this ``predict()`` after an isolated fit would differ.
``Fingerprint(model)``, taken as the job arrives, and its ``changes()`` after the fit list each
submodule's own attributes and non-persistent buffers that differ, by path; ``apply`` sets them on
the kernel's model. What cannot be pickled is named instead, once. Left alone: submodules (walked
themselves), nn.Module's bookkeeping and aliases of the model's parameters or buffers.
"""

from __future__ import annotations

import hashlib
import io
import pickle
from typing import Any

import cloudpickle
import torch
from torch import nn

from hybridnb.processes.channel import TensorPickler

# nn.Module's own bookkeeping in every module's __dict__ (hooks, parameter/buffer/module dicts)
_INTERNAL = frozenset(k for k in nn.Module().__dict__ if k != "training") | {
    "_compiled_call_impl", "_version"}


def _path(module_path: str, name: str) -> str:
    return f"{module_path}.{name}" if module_path else name


class _TensorBytes(cloudpickle.Pickler):
    """Pickles any value (a notebook's function or class by value); every tensor inside as its
    dtype, shape and bytes (any device)."""

    def persistent_id(self, obj: Any):
        if isinstance(obj, torch.Tensor):
            if obj.is_meta or obj.layout != torch.strided:
                return ("tensor", str(obj.dtype), tuple(obj.shape), obj.layout)
            flat = obj.detach().cpu().contiguous().reshape(-1)
            digest = hashlib.blake2b(flat.view(torch.uint8).numpy().tobytes()
                                     if flat.numel() else b"", digest_size=16).hexdigest()
            return ("tensor", str(obj.dtype), tuple(obj.shape), digest)
        return None


def _pickled(pickler: type[pickle.Pickler], value: Any) -> bytes | BaseException:
    """``value`` pickled, or the error pickling it raised (it cannot be compared or sent)."""
    sink = io.BytesIO()
    try:
        pickler(sink).dump(value)
    except Exception as exc:  # noqa: BLE001 - any failure: said as the reason
        return exc
    return sink.getvalue()


def _fingerprint(value: Any) -> str | BaseException:
    """A digest of ``value`` (its tensors by their bytes), or the error pickling it raised."""
    done = _pickled(_TensorBytes, value)
    return done if isinstance(done, BaseException) else \
        hashlib.blake2b(done, digest_size=16).hexdigest()


def _refers_to_modules(value: Any) -> bool:
    """A module, or a plain list/tuple/dict of them: a reference into the model (or another
    model), not state of its own."""
    items = value.values() if isinstance(value, dict) else value \
        if isinstance(value, (list, tuple)) else (value,)
    return any(isinstance(v, nn.Module) for v in items)


class Fingerprint:
    """``model``'s state outside the state dict as it is now; ``changes()`` compares with it."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.modules = model, list(model.named_modules(remove_duplicate=True))
        self.before: dict[tuple[str, str, str], str | BaseException] = {
            key: _fingerprint(value) for key, value, alias in self._watched() if not alias}

    def _watched(self):
        """((module path, name, kind), value, whether it names one of the model's parameters or
        buffers: an alias, not state of its own) for each module's own attributes and
        non-persistent buffers."""
        held = {id(t) for t in self.model.parameters()} | {id(t) for t in self.model.buffers()}
        for path, module in self.modules:
            for name, value in vars(module).items():
                if name not in _INTERNAL and not _refers_to_modules(value):
                    yield (path, name, "attr"), value, id(value) in held
            buffers = module.__dict__.get("_buffers", {})
            for name in module.__dict__.get("_non_persistent_buffers_set", ()):
                if buffers.get(name) is not None:
                    yield (path, name, "buffer"), buffers[name], False

    def changes(self) -> dict:
        """What differs from the fingerprint, as plain data for the channel: ``values``
        [(module path, name, kind, value now)] (kind "attr", "buffer" or "deleted"; tensors on
        the CPU) and ``unsendable`` {attribute path: why}."""
        values, unsendable, seen = [], {}, set()
        for key, value, alias in self._watched():
            seen.add(key)
            if alias:
                continue
            now, was = _fingerprint(value), self.before.get(key)
            if isinstance(now, str) and now == was:
                continue
            if isinstance(now, BaseException) and isinstance(was, BaseException):
                continue  # could not be compared before either: it came as it is
            why = _pickled(TensorPickler, value) if isinstance(now, str) else now  # as sent
            if isinstance(why, BaseException):
                unsendable[_path(key[0], key[1])] = f"{type(value).__name__}: {why}"
                continue
            if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                value = value.detach().cpu().requires_grad_(value.requires_grad and value.is_leaf)
            values.append((*key, value))
        values += [(path, name, "deleted", None) for path, name, _ in self.before.keys() - seen]
        return {"values": values, "unsendable": unsendable}


def _unwrap(module: nn.Module) -> nn.Module:
    """A speed-up's stand-in (``speedups.replace.Replacement``) read as the module it stands in
    for, whose attributes the worker watched."""
    while "original" in module.__dict__ and isinstance(module.__dict__["original"], nn.Module) \
            and getattr(type(module), "stock", None) is not None:
        module = module.__dict__["original"]
    return module


def apply(model: nn.Module, payload: dict | None) -> dict[str, str]:
    """Set what the worker's ``Fingerprint.changes()`` lists on the kernel's ``model``; returns
    {attribute path: why} for what could not be brought back."""
    if not payload:
        return {}
    lost = dict(payload.get("unsendable") or {})
    for path, name, kind, value in payload.get("values") or ():
        try:
            module = _unwrap(model.get_submodule(path))  # "": the model itself
        except AttributeError as exc:
            lost[_path(path, name)] = f"the kernel's model has no module {path!r} ({exc})"
            continue
        if kind == "buffer":
            module._buffers[name] = value
        elif kind == "deleted":
            module.__dict__.pop(name, None)
        else:
            module.__dict__[name] = value
    return lost


def describe(lost: dict[str, str]) -> str:
    """One sentence naming what an isolated fit could not bring back to the kernel's model."""
    shown = "; ".join(f"{path} ({why[:120]})" for path, why in list(lost.items())[:8])
    more = f" and {len(lost) - 8} more" if len(lost) > 8 else ""
    return (f"the model's state outside state_dict() that the worker changed could not all be "
            f"brought back to this process's model: {shown}{more}. These attributes keep "
            "their values from before fit; make them picklable, or train with isolate=False")
