"""A GPU for the tests on a machine without one: what a process sees of NVML and CUDA, faked
from outside, faults included. hybridnb is not told.

``environ(spec)`` gives a child process this folder first on ``PYTHONPATH`` and the spec in
``SIM_ENV``; its ``sitecustomize`` then calls ``install()`` at start-up, in every process of the
tree (a ``python -m hybridnb detect`` and its probe children alike). ``installed(spec)`` does
the torch part in this process, for code that runs here; ``simulated(spec)`` the NVML part here
and everything in the children (``detect()`` in a notebook). The spec, a JSON object:

- ``gpus``: N -> NVML (a fake ``pynvml``) lists N NVIDIA GPUs, named "... (simulated)", without
  a UUID (as NVML sometimes answers), so no verdict about them is ever cached;
- ``gpu``: ``{name, total_memory, free_memory, capability}``: what NVML and torch.cuda report;
- ``hang_at`` (+ ``helper``: start a helper process first, as drivers do; its pid is written to
  the file ``helper`` names, when it is a path), ``crash_at`` (a
  SIGSEGV), ``error_at`` (+ ``message``), ``wrong_at``: a fault in the call a probe step makes:
  ``import`` (importing torch), ``available`` (``torch.cuda.get_device_properties``),
  ``memory`` (``torch.cuda.mem_get_info``), ``tensor`` (the first tensor made on the device),
  ``matmul`` (a product on the device; wrong: one element off), ``copy_back`` (a copy from the
  device; wrong: ten values zeroed), ``exit`` (``os._exit``: a driver's teardown); and
  ``crash_at: "start"``: the process dies as it starts, writing ``message`` to stderr;
- ``by_index``: ``{"1": {...}}``: settings for one GPU only (the probe child's ``--index``).

"On the device" is the CPU: a tensor sent to ``cuda`` is a CPU copy marked as on the GPU.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import types
from collections.abc import Callable

SIM_ENV = "HYBRIDNB_TEST_GPU_SIM"
FOLDER = os.path.dirname(os.path.abspath(__file__))
DEFAULT_GPU = {"name": "Simulated GPU", "total_memory": 16 * 2**30, "capability": [8, 0]}
CUDA_ERROR = ("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be "
              "asynchronously reported at some other API call, so the stacktrace below might be "
              "incorrect.")

_SPEC: dict = {}


def environ(spec: dict, base: dict | None = None) -> dict[str, str]:
    """``base`` (this process's environment) with the simulation for every child it starts."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (FOLDER, env.get("PYTHONPATH", "")) if p)
    env[SIM_ENV] = json.dumps(spec)
    return env


def use(monkeypatch, spec: dict) -> None:
    """The children this test starts run with the simulation (``monkeypatch`` undoes it)."""
    env = environ(spec)
    for name in ("PYTHONPATH", SIM_ENV):
        monkeypatch.setenv(name, env[name])


def for_index(index: int, spec: dict | None = None) -> dict:
    """The settings of GPU ``index``: the spec with its ``by_index`` entry laid over it."""
    spec = _SPEC if spec is None else spec
    merged = {k: v for k, v in spec.items() if k != "by_index"}
    merged.update(spec.get("by_index", {}).get(str(index), {}))
    return merged


def gpu(index: int, spec: dict | None = None) -> dict:
    facts = {**DEFAULT_GPU, **for_index(index, spec).get("gpu", {})}
    facts.setdefault("free_memory", int(facts["total_memory"] * 0.95))
    return facts


def install() -> None:
    """At start-up (``sitecustomize``): the spec from ``SIM_ENV``; NVML's list when it asks for
    ``gpus``; torch faked as soon as anything imports it; ``os._exit`` for the ``exit`` faults."""
    _SPEC.update(json.loads(os.environ[SIM_ENV]))
    if for_index(_index()).get("crash_at") == "start":  # before hybridnb runs: a broken library
        sys.stderr.write(for_index(_index()).get("message", "") + "\n")
        sys.stderr.flush()
        signal.raise_signal(signal.SIGSEGV)
    if _SPEC.get("gpus"):
        sys.modules["pynvml"] = _fake_nvml(int(_SPEC["gpus"]))
    sys.meta_path.insert(0, _TorchHook())
    real_exit = os._exit

    def _exit(code: int) -> None:
        _fault("exit")
        real_exit(code)

    os._exit = _exit


@contextlib.contextmanager
def installed(spec: dict):
    """torch (already imported here) faked as ``spec`` says, for the duration."""
    import torch

    _SPEC.clear()
    _SPEC.update(spec)
    undo = _fake_torch(torch)
    try:
        yield
    finally:
        undo()
        _SPEC.clear()


@contextlib.contextmanager
def simulated(spec: dict):
    """``detect()`` here sees the simulated GPUs (NVML faked in this process; NVML and torch.cuda
    in the probe children), for the duration: how a notebook shows a hung or broken GPU on any
    machine. ``gpus`` defaults to 1."""
    from hybridnb.hardware import nvml

    spec = {"gpus": 1, **spec}
    names = ("PYTHONPATH", SIM_ENV)
    saved = {name: os.environ.get(name) for name in names}
    real = sys.modules.get("pynvml")
    os.environ.update({name: environ(spec)[name] for name in names})
    sys.path.insert(0, FOLDER)  # children put this process's path first: ours before any other
    sys.modules["pynvml"] = _fake_nvml(int(spec["gpus"]), spec)
    nvml.reset()
    try:
        yield
    finally:
        sys.path.remove(FOLDER)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if real is None:
            sys.modules.pop("pynvml", None)
        else:
            sys.modules["pynvml"] = real
        nvml.reset()


# ------------------------------------------------------------------ faults

def _index() -> int:
    """The GPU this process probes: the probe child's ``--index`` (0 elsewhere)."""
    argv = sys.argv
    return int(argv[argv.index("--index") + 1]) if "--index" in argv else 0


def _fault(step: str, index: int | None = None) -> None:
    """Hang, crash or raise as the spec says for ``step``."""
    spec = for_index(_index() if index is None else index)
    if spec.get("hang_at") == step:
        if spec.get("helper"):  # a helper process in the same group, as drivers sometimes start
            helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            if isinstance(spec["helper"], str):  # a file the test reads the helper's pid from
                with open(spec["helper"], "w") as f:
                    f.write(str(helper.pid))
        while True:  # nothing more is written, as with a wedged driver call
            time.sleep(3600)
    if spec.get("crash_at") == step:
        signal.raise_signal(signal.SIGSEGV)
    if spec.get("error_at") == step:
        raise (ImportError if step == "import" else RuntimeError)(spec.get("message") or
                                                                  CUDA_ERROR)


# ------------------------------------------------------------------ NVML

class NVMLError(Exception):
    pass


def _fake_nvml(n: int, spec: dict | None = None) -> types.ModuleType:
    """``pynvml`` listing ``n`` GPUs as ``spec`` (default: this process's) describes them."""
    def memory(h):
        g = gpu(h[1], spec)
        return types.SimpleNamespace(total=g["total_memory"], free=g["free_memory"],
                                     used=g["total_memory"] - g["free_memory"])

    def no_uuid(h):
        raise NVMLError("Not Supported")

    def name(h):
        text = gpu(h[1], spec)["name"]
        return text if "simulated" in text.lower() else f"{text} (simulated)"

    lib = types.ModuleType("pynvml")
    lib.NVMLError = NVMLError
    lib.nvmlInit = lambda: None
    lib.nvmlDeviceGetCount = lambda: n
    lib.nvmlSystemGetDriverVersion = lambda: "580.00"
    lib.nvmlSystemGetCudaDriverVersion = lambda: 13000
    lib.nvmlDeviceGetHandleByIndex = lambda i: ("simulated", i)
    lib.nvmlDeviceGetName = name
    lib.nvmlDeviceGetMemoryInfo = memory
    lib.nvmlDeviceGetCudaComputeCapability = lambda h: tuple(gpu(h[1], spec)["capability"])
    lib.nvmlDeviceGetUUID = no_uuid
    return lib


# ------------------------------------------------------------------ torch

class _TorchHook(importlib.abc.MetaPathFinder):
    """Imports torch as usual (after the ``import`` faults), then fakes its CUDA."""

    busy = False

    def find_spec(self, name, path, target=None):
        if name != "torch" or self.busy:
            return None
        self.busy = True
        try:
            spec = importlib.util.find_spec("torch")
        finally:
            self.busy = False
        real_exec = spec.loader.exec_module

        def exec_module(module):
            _fault("import")
            real_exec(module)
            _fake_torch(module)

        spec.loader.exec_module = exec_module
        return spec


def _fake_torch(torch) -> Callable[[], None]:
    """torch.cuda answering for the simulated GPUs, tensors "on" them kept on the CPU; returns
    the function that undoes it."""
    cuda, tensor = torch.cuda, torch.Tensor
    saved = [(cuda, name, getattr(cuda, name)) for name in (
        "is_available", "device_count", "get_device_properties", "get_arch_list",
        "mem_get_info", "synchronize")]
    saved += [(torch, "arange", torch.arange)]
    saved += [(tensor, name, getattr(tensor, name)) for name in ("to", "cpu", "__matmul__")]
    real = {name: value for _, name, value in saved}

    def on_gpu(device) -> bool:
        return isinstance(device, (str, torch.device)) and str(device).startswith("cuda")

    def mark(t, on: bool = True):
        t._simulated_gpu = on
        return t

    def marked(t) -> bool:
        return getattr(t, "_simulated_gpu", False)

    def properties(index: int = 0):
        _fault("available", index)
        g = gpu(index)
        return types.SimpleNamespace(name=g["name"], total_memory=g["total_memory"],
                                     major=g["capability"][0], minor=g["capability"][1])

    def mem_get_info(device=None):
        _fault("memory")
        g = gpu(_index())
        return g["free_memory"], g["total_memory"]

    def arange(*args, device=None, **kwargs):
        if not on_gpu(device):
            return real["arange"](*args, device=device, **kwargs)
        _fault("tensor")
        return mark(real["arange"](*args, **kwargs))

    def to(self, *args, **kwargs):
        if not any(on_gpu(a) for a in (*args, kwargs.get("device"))):
            return real["to"](self, *args, **kwargs)
        args = tuple("cpu" if on_gpu(a) else a for a in args)
        kwargs = {k: "cpu" if on_gpu(v) else v for k, v in kwargs.items()}
        out = real["to"](self, *args, **kwargs)
        return mark(out.clone() if out is self else out)

    def cpu(self, *args, **kwargs):
        if not marked(self):
            return real["cpu"](self, *args, **kwargs)
        _fault("copy_back")
        out = mark(real["cpu"](self, *args, **kwargs).clone(), False)
        if for_index(_index()).get("wrong_at") == "copy_back":
            out[1000:1010] = 0
        return out

    def matmul(self, other):
        out = real["__matmul__"](self, other)
        if not (marked(self) or marked(other)):
            return out
        _fault("matmul")
        if for_index(_index()).get("wrong_at") == "matmul":  # one element off, as a bad card
            out[17, 42] += 0.5 * float(out.abs().max())
        return mark(out)

    fakes = {"is_available": lambda: True,
             "device_count": lambda: max(int(_SPEC.get("gpus") or 0), _index() + 1),
             "get_device_properties": properties, "get_arch_list": lambda: ["sm_80", "sm_90"],
             "mem_get_info": mem_get_info, "synchronize": lambda device=None: None,
             "arange": arange, "to": to, "cpu": cpu, "__matmul__": matmul}
    for owner, name, _ in saved:
        setattr(owner, name, fakes[name])

    def undo() -> None:
        for owner, name, value in saved:
            setattr(owner, name, value)

    return undo
