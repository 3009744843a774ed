"""Mixed precision chosen once: an autocast context and a GradScaler, so the step has no
branches (``with p.autocast(): loss = ...``; ``p.scaler.scale(loss).backward()``)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from hybridnb.hardware import rules  # the one bf16 rule

NAMES = ("auto", "bf16", "fp16", "fp32")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class Precision:
    """The chosen precision for one device: ``name`` in bf16 | fp16 | fp32; ``note`` the
    sentence to show when the request was changed (fp16 asked on a CPU), else ``""``."""

    name: str
    device: torch.device
    note: str = ""
    scaler: torch.amp.GradScaler = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.name == "fp16")

    def autocast(self) -> contextlib.AbstractContextManager:
        """The context for the forward pass (a no-op for fp32)."""
        if self.name == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=_DTYPES[self.name])

    @classmethod
    def choose(cls, name: str, device: torch.device | str, native_bf16: bool | None = None,
               recommended: str | None = None) -> Precision:
        """``"auto"``: ``recommended`` (``detect()``'s) when given, else bf16 on a GPU with
        native bf16, fp16 on an older CUDA GPU, fp32 on CPU/MPS. fp16 asked on CPU becomes bf16
        (no fp16 GradScaler path worth using there), said in ``note``."""
        device = torch.device(device)
        if name not in NAMES:
            raise ValueError(f"precision={name!r} is not one of {NAMES}")
        if name == "auto":
            if recommended in _DTYPES:
                return cls(recommended, device)
            if device.type == "cuda":
                bf16 = native_bf16 if native_bf16 is not None else rules.device_native_bf16(device)
                return cls("bf16" if bf16 else "fp16", device)
            return cls("fp32", device)
        if name == "fp16" and device.type == "cpu":
            return cls("bf16", device, note="fp16 was asked on the CPU; using bf16 autocast "
                       "instead (CPU has no fast fp16 path and no need for a GradScaler).")
        if name == "bf16" and device.type == "cuda" and native_bf16 is False:
            return cls("fp16", device, note="bf16 was asked but this GPU only emulates it; "
                       "using fp16 with a GradScaler instead.")
        return cls(name, device)
