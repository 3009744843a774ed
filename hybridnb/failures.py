"""What an error from torch means: the batch did not fit (``is_oom``), or the device cannot be
trusted again in this process (``is_device_lost``). The devices already lost (``mark_lost``) are
remembered here, so ``free_memory`` never calls one again.
"""

from __future__ import annotations

import contextlib
import gc

import torch

from hybridnb.measure.memory import cuda_index

# Messages that mean "this batch does not fit", across backends (torch raises some of them as a
# plain RuntimeError, e.g. from cuDNN, the driver or the CPU allocator).
OOM_MESSAGES = (
    "CUDA out of memory", "HIP out of memory", "MPS backend out of memory", "XPU out of memory",
    "CUDA error: out of memory", "hipErrorOutOfMemory", "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_NOT_SUPPORTED",  # cuDNN's answer to a batch too large for its kernels
    "DefaultCPUAllocator: can't allocate memory",
)

# Messages after which the device (or its context) cannot be trusted again in this process.
DEVICE_LOST_MESSAGES = (
    "device-side assert", "illegal memory access", "an illegal instruction was encountered",
    "misaligned address", "unspecified launch failure", "hipErrorLaunchFailure",
    "hipErrorIllegalAddress", "hipErrorNoDevice", "HIP error: an illegal",
    "uncorrectable ECC error", "GPU is lost", "device lost", "CUDA error: unknown error",
    "CUBLAS_STATUS_EXECUTION_FAILED", "CUDNN_STATUS_EXECUTION_FAILED",
    "no CUDA GPUs are available", "CUDA driver version is insufficient",
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


def _key(device: torch.device) -> str:
    """"cuda" and "cuda:N" name the same GPU when N is the current one."""
    device = torch.device(device)
    return f"cuda:{cuda_index(device)}" if device.type == "cuda" else str(device)


def mark_lost(device: torch.device) -> None:
    """Remember that ``device`` failed with a sticky error: never use it again in this process."""
    _LOST.add(_key(device))


def is_lost(device: torch.device) -> bool:
    return _key(device) in _LOST


def free_memory(device: torch.device) -> None:
    """Release what a failed step left behind (outside the ``except`` block). A full
    collection (tenths of a second) only for accelerators, whose cached blocks go back to the
    driver; a device marked lost is never called."""
    gc.collect(1 if device.type == "cpu" else 2)
    if device.type == "cpu" or is_lost(device):
        return
    if device.type == "cuda" and torch.cuda.is_available():
        with contextlib.suppress(RuntimeError):  # a sticky error not yet marked lost refuses
            torch.cuda.empty_cache()
    elif device.type == "mps":
        torch.mps.empty_cache()
