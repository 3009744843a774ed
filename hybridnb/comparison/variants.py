"""What a compare() variant is, how its name is read, and whether it can run on a device.

A precision, then ``+``-joined changes applied in this order: ``channels_last`` (NHWC weights and
4-D inputs), ``rewrite`` (the exact depthwise-as-matmul rewrite, ``hybridnb.speedups.depthwise``),
``speedups`` (the Trainer's ``speedups="auto"`` decision; it picks layout and rewrites itself, so
it excludes the two before), ``compile`` or ``compile:<mode>``. E.g. ``"fp32+speedups"``,
``"bf16+channels_last+rewrite+compile:max-autotune"``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridnb.hardware.rules import compile_unavailable, device_native_bf16
from hybridnb.train.precision import Precision

PRECISIONS = ("fp32", "bf16", "fp16")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CHANGES = ("channels_last", "rewrite", "speedups", "compile")
DEFAULT_VARIANTS = ("fp32", "bf16", "fp16", "fp32+compile", "bf16+compile", "bf16+channels_last",
                    "bf16+channels_last+rewrite", "bf16+channels_last+rewrite+compile")


@dataclass(frozen=True)
class Variant:
    """One way to run the step: ``precision``, the layout and rewrite changes, and ``compile``
    mode (None = eager)."""

    label: str
    precision: str
    compile: str | None = None
    channels_last: bool = False
    rewrite: bool = False
    speedups: bool = False

    @property
    def is_baseline(self) -> bool:
        """fp32 eager with nothing changed: what every speed-up is measured against."""
        return (self.precision == "fp32" and self.compile is None and not self.channels_last
                and not self.rewrite and not self.speedups)


def parse_variant(text: str) -> Variant:
    """``"bf16"``, ``"fp32+compile"``, ``"bf16+channels_last+rewrite+compile:max-autotune"`` ->
    Variant; a ValueError names the part it does not understand."""
    spec = text.strip().lower()
    prec, *changes = spec.split("+")
    if prec not in PRECISIONS:
        raise ValueError(f"variants: {text!r} has precision {prec!r}; use one of {PRECISIONS}")
    found: dict[str, str | bool] = {}
    for change in changes:
        kind, _, mode = change.partition(":")
        if kind not in CHANGES or (mode and kind != "compile"):
            raise ValueError(f"variants: {text!r} — after '+' only {', '.join(CHANGES[:-1])}, "
                             f"'compile' or 'compile:<mode>' is understood, not {change!r}")
        if kind in found:
            raise ValueError(f"variants: {text!r} names {kind!r} twice")
        if kind == "compile" and (mode or "default") not in COMPILE_MODES:
            raise ValueError(f"variants: {text!r} has compile mode {mode!r}; "
                             f"use one of {COMPILE_MODES}")
        found[kind] = (mode or "default") if kind == "compile" else True
    if "speedups" in found and ("channels_last" in found or "rewrite" in found):
        raise ValueError(f"variants: {text!r} — 'speedups' decides the layout and the rewrites "
                         f"itself; write it without 'channels_last' and 'rewrite'")
    return Variant(label=spec, precision=prec, **found)  # CHANGES are Variant's field names


def unavailable(variant: Variant, device: torch.device, *, live: bool = False) -> str:
    """Why ``variant`` cannot run on ``device`` ("" when it can, as far as is known here).

    ``live=False`` (the caller's process) uses only facts that need no device: it never
    initialises CUDA. ``live=True`` (inside the variant's own process, where the device is in
    use anyway) adds the device's own answers: native bf16 and the compute capability.
    """
    native = device_native_bf16(device) if live and device.type == "cuda" else None
    chosen = Precision.choose(variant.precision, device, native_bf16=native)
    if chosen.name != variant.precision:
        return (f"{variant.precision} is not run on {device.type}: hybridnb trains a "
                f"{variant.precision} request there as {chosen.name} (that row measures it). "
                f"Why: {chosen.note}")
    if not variant.compile:
        return ""
    capability = (torch.cuda.get_device_capability(device)
                  if live and device.type == "cuda" and not torch.version.hip else None)
    return compile_unavailable(device, variant.compile, capability=capability) or ""
