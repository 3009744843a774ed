"""Which part of a job cannot be sent to a worker, by its attribute path from the root: once
pickling the job has failed, ``not_sendable`` walks it as pickle does down to the innermost part
that fails (``job.model.encoder._lock``), leaving tensors and arrays out.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import pickle
import sys
import types
from collections.abc import Iterator
from typing import Any

import cloudpickle

from hybridnb.processes import loaders, parametrized

MAX_DEPTH = 40
MAX_NODES = 20000


class NotSendable(TypeError):
    """An object in the job cannot be pickled for a worker process: ``path``, where it is from
    the root (``job.model.encoder._lock``), and ``kind``, its type."""

    def __init__(self, message: str, path: str = "", kind: str = "") -> None:
        super().__init__(message)
        self.path, self.kind = path, kind


_NULL = types.SimpleNamespace(write=len)  # a file that keeps nothing: only failures count


class JobPickler(cloudpickle.Pickler):
    """cloudpickle with the reductions a job needs: a DataLoader (``loaders``) and a
    parametrized module (``parametrized``); ``payload``'s pickler and the probe here."""

    live_loaders = False  # a DataLoader with live worker processes was sent as its settings

    def reducer_override(self, obj: Any):
        if loaders.is_loader(obj):
            self.live_loaders = self.live_loaders or loaders.has_live_workers(obj)
            return loaders.reduce_loader(obj)
        if parametrized.is_parametrized(obj):
            return parametrized.reduce(obj)
        return super().reducer_override(obj)


class _Probe(JobPickler):
    """As ``payload`` pickles, arrays and tensors left out."""

    def persistent_id(self, obj: Any):
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor) and not obj.is_meta:
            return "tensor"
        np = sys.modules.get("numpy")
        if np is not None and isinstance(obj, np.ndarray) and not obj.dtype.hasobject:
            return "array"
        return None


def _fails(obj: Any) -> BaseException | None:
    try:
        _Probe(_NULL, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    except Exception as exc:  # noqa: BLE001 - any failure (recursion too) marks the object
        return exc
    return None


def _parts(obj: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(path, part) for each part pickle would send of ``obj``."""
    if isinstance(obj, (dict, list, tuple, set, frozenset)):
        for k, v in obj.items() if isinstance(obj, dict) else enumerate(obj):
            yield f"{path}[{k!r}]", v
        return
    if isinstance(obj, functools.partial):
        yield f"{path}.func", obj.func
        for name, v in _named(obj.func, obj.args, obj.keywords):
            yield f"{path}.<argument {name}>", v
        return
    if inspect.isfunction(obj):
        for name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or (), strict=False):
            with contextlib.suppress(ValueError):
                yield f"{path}.<closure {name}>", cell.cell_contents
        for i, v in enumerate(obj.__defaults__ or ()):
            yield f"{path}.<default {i}>", v
        for k, v in (obj.__kwdefaults__ or {}).items():
            yield f"{path}.<default {k}>", v
        if obj.__module__ == "__main__" or obj.__module__ not in sys.modules:
            for name in obj.__code__.co_names:  # globals travel with a notebook's function
                if name in obj.__globals__:
                    yield f"{path}.<global {name}>", obj.__globals__[name]
        return
    if inspect.ismethod(obj):
        yield f"{path}.__self__", obj.__self__
        return
    state: Any = None
    getstate = getattr(type(obj), "__getstate__", None)
    if getstate is not None and getstate is not getattr(object, "__getstate__", None):
        with contextlib.suppress(Exception):  # a user's __getstate__ may raise anything
            state = obj.__getstate__()
    elif hasattr(obj, "__dict__"):
        state = vars(obj)
    if isinstance(state, dict):
        held = ("_modules", "_parameters", "_buffers")  # an nn.Module's parts: model.encoder
        for key in held:
            if isinstance(state.get(key), dict):
                for name, v in state[key].items():
                    yield f"{path}.{name}", v
        for k, v in state.items():
            if k not in held:
                yield f"{path}.{k}", v
    elif state is not None:
        yield f"{path}.<state>", state
    for cls in type(obj).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if isinstance(name, str) and name not in ("__dict__", "__weakref__") \
                    and hasattr(obj, name):
                yield f"{path}.{name}", getattr(obj, name)


_CHANNEL = object()  # the channel's place among a job's arguments


def _named(fn: Any, args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    """The arguments by the parameters they fill (by position where they do not fit)."""
    try:
        named = list(inspect.signature(fn).bind_partial(*args, **kwargs).arguments.items())
    except (TypeError, ValueError):  # no signature, or arguments it does not take
        named = [(f"args[{i}]", a) for i, a in enumerate(args)] + list(kwargs.items())
    return [(name, v) for name, v in named if v is not _CHANNEL]


def _job_parts(fn: Any, args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    """The arguments by their parameter names (a partial's too), then the function."""
    if isinstance(fn, functools.partial):
        named = _named(fn.func, (*fn.args, _CHANNEL, *args), {**fn.keywords, **kwargs})
        fn = fn.func
    else:
        named = _named(fn, (_CHANNEL, *args), kwargs)
    return [*named, (getattr(fn, "__qualname__", None) or "the function", fn)]


def not_sendable(obj: Any) -> NotSendable | None:
    """The ``NotSendable`` naming the innermost part of ``obj`` that cannot be pickled (in a job
    ``(fn, args, kwargs)``: from its arguments' names), or None when no part can be named."""
    job = (isinstance(obj, tuple) and len(obj) == 3 and callable(obj[0])
           and isinstance(obj[1], tuple) and isinstance(obj[2], dict))
    seen: set[int] = set()
    nodes = 0

    def walk(path: str, node: Any, err: BaseException, depth: int):
        nonlocal nodes
        seen.add(id(node))
        if depth < MAX_DEPTH:
            for sub_path, part in _parts(node, path):
                nodes += 1
                if nodes > MAX_NODES:
                    break
                if id(part) in seen or part is None or isinstance(part, (str, int, float)):
                    continue
                sub_err = _fails(part)
                if sub_err is not None:
                    return walk(sub_path, part, sub_err, depth + 1)
        return path, node, err

    for name, root in _job_parts(*obj) if job else [("the object", obj)]:
        error = _fails(root)
        if error is None:
            continue
        path, part, err = walk(name, root, error, 0)
        cls = type(part)
        kind = (cls.__qualname__ if cls.__module__ == "builtins"
                else f"{cls.__module__}.{cls.__qualname__}")
        return NotSendable(
            f"{path} (a {kind}) cannot be sent to the worker process ({type(err).__name__}: "
            f"{err}). Drop it or create it again in its class's __getstate__/__setstate__, or "
            "train in this process with isolate=False", path, kind)
    return None
