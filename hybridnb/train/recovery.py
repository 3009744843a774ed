"""What happens when a step fails: out of memory, a broken device, a loss that explodes.

Two small predicates decide what an error is (``is_oom``, ``is_device_lost``); the policies around
them are short and separate:

- ``MicroBatches``: re-run the same batch as halves, quarters, ... with each micro-batch's loss
  weighted by its share of the samples, so the update equals the unsplit one; the working size is
  remembered for later steps.
- ``on_cpu``: run one batch's forward/backward on the CPU when even one sample does not fit on the
  GPU (the per-batch fallback), then go back to the GPU.
- ``LossGuard``: a non-finite loss or a spike against the running mean skips the step and cuts the
  learning rate; after ``patience`` bad steps in a row the Trainer restores its last good state.

Memory is freed by ``free_memory`` *after* the ``except`` block has ended: while the exception is
alive its traceback pins every tensor of the failed step.
"""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

# Messages that mean "this batch does not fit", across backends (torch raises some of them as a
# plain RuntimeError, e.g. from cuDNN, the driver or the CPU allocator).
OOM_MESSAGES = (
    "CUDA out of memory",
    "HIP out of memory",
    "MPS backend out of memory",
    "XPU out of memory",
    "CUDA error: out of memory",
    "hipErrorOutOfMemory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_NOT_SUPPORTED",  # cuDNN's answer to a batch too large for its kernels
    "DefaultCPUAllocator: can't allocate memory",
)

# Messages after which the device (or its context) cannot be trusted again in this process.
DEVICE_LOST_MESSAGES = (
    "device-side assert",
    "illegal memory access",
    "an illegal instruction was encountered",
    "misaligned address",
    "unspecified launch failure",
    "hipErrorLaunchFailure",
    "hipErrorIllegalAddress",
    "hipErrorNoDevice",
    "HIP error: an illegal",
    "uncorrectable ECC error",
    "GPU is lost",
    "device lost",
    "CUDA error: unknown error",
    "CUBLAS_STATUS_EXECUTION_FAILED",
    "CUDNN_STATUS_EXECUTION_FAILED",
    "no CUDA GPUs are available",
    "CUDA driver version is insufficient",
)


def is_oom(exc: BaseException) -> bool:
    """True when ``exc`` says the batch did not fit in memory (any backend, or the CPU)."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    text = str(exc)
    return any(m in text for m in OOM_MESSAGES) and not is_device_lost(exc)


def is_device_lost(exc: BaseException) -> bool:
    """True for a sticky device error: the GPU must not be used again in this process."""
    if not isinstance(exc, RuntimeError) or isinstance(exc, torch.OutOfMemoryError):
        return False
    text = str(exc)
    return any(m in text for m in DEVICE_LOST_MESSAGES)


def first_line(exc: BaseException, limit: int = 160) -> str:
    """The exception's first line, shortened, for an event message."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


_LOST: set[str] = set()


def mark_lost(device: torch.device) -> None:
    """Remember that ``device`` failed with a sticky error: never use it again in this process."""
    _LOST.add(str(device))


def lost_devices() -> frozenset[str]:
    return frozenset(_LOST)


def free_memory(device: torch.device) -> None:
    """Release what a failed step left behind. Call it outside the ``except`` block.

    A full collection (tenths of a second with torch and pandas loaded) runs for accelerators,
    where cached blocks must go back to the driver; on the CPU the young generations suffice.
    """
    if device.type == "cpu":
        gc.collect(1)
    else:
        gc.collect()
    if device.type == "cuda" and torch.cuda.is_available():
        torch.cuda.empty_cache()
    elif device.type == "mps" and hasattr(torch, "mps"):
        torch.mps.empty_cache()


def batch_len(batch) -> int:
    """Number of samples in a batch ``x`` or ``(x, y, *extras)``."""
    x = batch[0] if isinstance(batch, (tuple, list)) else batch
    return int(x.shape[0])


@dataclass
class MicroBatches:
    """The micro-batch size that fits, found by halving on OOM and then remembered.

    ``size`` None means whole batches. ``split(window)`` yields ``(x, y, weight)`` for every
    micro-batch of every batch in the accumulation window; ``weight`` is the micro-batch's share of
    the window's samples, so the weighted sum of mean-reduced losses equals the loss of the whole
    window (and its gradient the unsplit gradient).
    """

    size: int | None = None

    def split(self, window: list) -> Iterator[tuple[torch.Tensor, torch.Tensor, float]]:
        total = sum(batch_len(b) for b in window)
        for batch in window:
            x, y = batch[0], batch[1]
            n = int(x.shape[0])
            step = n if self.size is None else self.size
            for start in range(0, n, step):
                stop = min(start + step, n)
                yield x[start:stop], y[start:stop], (stop - start) / total

    def shrink(self, window: list) -> int | None:
        """Halve the size after an OOM; None when even one sample per micro-batch failed."""
        current = self.size or max(batch_len(b) for b in window)
        if current <= 1:
            return None
        self.size = math.ceil(current / 2)
        return self.size


@contextlib.contextmanager
def on_cpu(model: torch.nn.Module, device: torch.device):
    """Move ``model`` (parameters and gradients) to the CPU for one batch, then back to ``device``.

    Parameters keep their identity (``Module.to`` swaps ``.data``), so the optimizer, whose state
    stays on the GPU, steps the same tensors afterwards.
    """
    model.to("cpu")
    try:
        yield torch.device("cpu")
    finally:
        model.to(device)


def to_cpu(obj):
    """A detached CPU copy of a nested state (dicts, lists, tuples, tensors)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return type(obj)((k, to_cpu(v)) for k, v in obj.items())
    if isinstance(obj, list):
        return [to_cpu(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(to_cpu(v) for v in obj)
    return obj


def rebuild_on_cpu(module: torch.nn.Module) -> None:
    """Give ``module`` fresh, uninitialised CPU storage without reading the old device's memory.

    After a sticky error every read from the GPU fails; the caller loads a saved CPU state into
    the new storage. Gradients are dropped.
    """
    module.to_empty(device="cpu")
    for p in module.parameters():
        p.grad = None


@dataclass
class LossGuard:
    """Detects an exploding loss. ``check`` answers "ok", "nonfinite" or "spike".

    A spike is a loss above ``spike`` times the running mean of good losses, looked for once
    ``warmup`` good steps were seen. On every bad step the Trainer skips the update and multiplies
    the learning rate by ``lr_cut``; after ``patience`` bad steps in a row it restores the last good
    state.
    """

    spike: float = 10.0
    lr_cut: float = 0.5
    patience: int = 3
    warmup: int = 20
    momentum: float = 0.95
    mean: float = 0.0
    good: int = 0
    streak: int = field(default=0)

    def check(self, loss: float, grad_norm: float | None = None) -> str:
        """Judge a step and count it (``verdict`` then ``record``)."""
        return self.record(self.verdict(loss, grad_norm), loss)

    def verdict(self, loss: float, grad_norm: float | None = None) -> str:
        """"ok", "nonfinite" or "spike", without counting the step."""
        if not math.isfinite(loss) or (grad_norm is not None and not math.isfinite(grad_norm)):
            return "nonfinite"
        if self.good >= self.warmup and self.spike and loss > self.spike * abs(self._mean()):
            return "spike"
        return "ok"

    def record(self, verdict: str, loss: float) -> str:
        """Count a judged step: a good loss joins the running mean, a bad one the streak."""
        if verdict == "ok":
            self.mean = self.momentum * self.mean + (1 - self.momentum) * loss
            self.good += 1
            self.streak = 0
        else:
            self.streak += 1
        return verdict

    def _mean(self) -> float:
        # bias-corrected running mean (like Adam's), so early steps are not pulled towards 0
        return self.mean / (1 - self.momentum ** max(self.good, 1))

    @property
    def exhausted(self) -> bool:
        return self.streak >= self.patience

    def state_dict(self) -> dict:
        return {"mean": float(self.mean), "good": int(self.good), "streak": int(self.streak)}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.good, self.streak = float(state["mean"]), int(state["good"]), int(
            state["streak"])
