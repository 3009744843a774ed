"""Convolutions that span every electrode from one input channel, as 1-D convolutions (the
``span`` knob).

A first layer that reads a one-channel image of the recording, ``(B, 1, T, C)`` (time by
electrodes), with a ``Conv2d(1, F, (K, C))`` whose kernel covers all ``C`` electrodes, sums
exactly what a 1-D convolution with the electrodes as channels sums:

    conv2d(x, w)[b, f, t, 0] == conv1d(x[:, 0].transpose(1, 2), w[:, 0].transpose(1, 2))[b, f, t]

and likewise for the transposed layout ``(B, 1, C, T)``. braindecode's ``CombinedConv``
(ShallowFBCSPNet's and Deep4Net's first layer) is taken too: its combined weight and bias are
computed as its own forward computes them, so its parameters and gradients are its own.

Why: a one-channel ``Conv2d`` with a 25 x 129 kernel is oneDNN's slow case on the CPU; as a 1-D
convolution (in the FFT form where ``spectra.fits``) the C1 and C2 recipes' whole training step
runs 8.3x and 8.4x stock on one thread (``bench/results/zoo-speed-cpu-models-1thread-latest.md``).
By rule on the CPU, timed on CUDA.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn

from hybridnb.speedups import spectra
from hybridnb.speedups.replace import FormReplacement, is_stock_conv2d
from hybridnb.speedups.rewrite import LayerRewrite

MIN_SPAN = 2  # electrodes: a kernel over one row gains nothing from the 1-D form


def is_combined_conv(module: nn.Module) -> bool:
    """A braindecode ``CombinedConv`` that runs braindecode's own forward. Read from
    ``sys.modules``: a model built from it imported braindecode, hybridnb never does for this."""
    cls = getattr(sys.modules.get("braindecode.modules.convolution"), "CombinedConv", None)
    return (cls is not None and isinstance(module, cls) and type(module).forward is cls.forward
            and isinstance(module.conv_time, nn.Conv2d) and isinstance(module.conv_spat, nn.Conv2d))


def spanned_axes(module: nn.Module) -> tuple[int, ...]:
    """The kernel axes (0: height, 1: width) a one-channel ``Conv2d`` may span. The other axis
    needs two taps: a one-tap spatial filter is a matrix product oneDNN already runs well
    (SignalJEPA_PreLocal's (129, 1) one ran 0.85x as 1-D, issue 34)."""
    if not (is_stock_conv2d(module) and module.in_channels == 1 and module.groups == 1
            and module.padding_mode == "zeros" and module.padding != "same"):
        return ()
    return tuple(axis for axis in (1, 0)
                 if (module.padding == "valid" or module.padding[axis] == 0)
                 and module.stride[axis] == 1 and module.dilation[axis] == 1
                 and module.kernel_size[axis] >= MIN_SPAN and module.kernel_size[1 - axis] >= 2)


def combined_weight_bias(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``CombinedConv``'s weight ``(F, 1, K, C)`` and bias, computed as its own forward does."""
    conv_time, conv_spat = module.conv_time, module.conv_spat
    weight = (conv_time.weight * conv_spat.weight.permute(1, 0, 2, 3)).sum(0).unsqueeze(1)
    bias = None
    if module.bias_time:
        bias = conv_spat.weight.squeeze().sum(-1).mm(conv_time.bias.unsqueeze(-1)).squeeze()
    if module.bias_spat:
        bias = conv_spat.bias if bias is None else bias + conv_spat.bias
    return weight, bias


def input_axis(module: nn.Module, x: torch.Tensor) -> int | None:
    """The kernel axis that spans ``x`` exactly (0: ``x`` is ``(B, 1, C, T)``, 1: ``(B, 1, T,
    C)``), or None when ``x`` is no batched one-channel input the 1-D form computes."""
    if x.dim() != 4 or x.shape[1] != 1:
        return None
    if is_combined_conv(module):
        fits = (x.shape[3] == module.conv_spat.kernel_size[1] >= MIN_SPAN
                and x.shape[2] >= module.conv_time.kernel_size[0])
        return 1 if fits else None
    for axis in spanned_axes(module):
        other = 1 - axis
        reach = module.dilation[other] * (module.kernel_size[other] - 1) + 1
        pad = 0 if module.padding == "valid" else module.padding[other]
        if x.shape[2 + axis] == module.kernel_size[axis] and x.shape[2 + other] + 2 * pad >= reach:
            return axis
    return None


def span_as_conv1d(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` as a 1-D convolution with the spanned axis (``input_axis``) as channels."""
    axis = input_axis(module, x)
    if is_combined_conv(module):
        weight, bias = combined_weight_bias(module)
        stride, padding, dilation = 1, 0, 1
    else:
        weight, bias = module.weight, module.bias  # through any parametrization
        other = 1 - axis
        stride, dilation = module.stride[other], module.dilation[other]
        padding = 0 if module.padding == "valid" else module.padding[other]
    if axis == 1:  # (B, 1, T, C), kernel (K, C): the electrodes are the last axis
        signal = x[:, 0].transpose(1, 2)  # (B, C, T)
        kernel = weight[:, 0].transpose(1, 2).contiguous()  # (F, C, K); a strided kernel
        # would make oneDNN answer in channels-last order, and dropout after it draw other masks
    else:  # (B, 1, C, T), kernel (C, K)
        signal, kernel = x[:, 0], weight[:, 0].contiguous()
    if spectra.fits(signal, kernel, stride, dilation):
        out = spectra.conv1d(signal, kernel, bias, (padding, padding))
    else:
        out = F.conv1d(signal, kernel, bias, stride=stride, padding=padding, dilation=dilation)
    return out.unsqueeze(-1) if axis == 1 else out.unsqueeze(2)


class SpanAsConv1d(FormReplacement):
    fits = staticmethod(lambda module, x: input_axis(module, x) is not None)
    compute = staticmethod(span_as_conv1d)


class SpanRewrite(LayerRewrite):
    name = "span"
    trains = True
    label = "electrode-spanning convolution as 1-D rewrite"
    kind = SpanAsConv1d
    rule = "convolutions over every electrode of a one-channel input as 1-D"
    none_found = "no convolution spans every electrode of a one-channel input"

    def applies(self, module: nn.Module) -> bool:
        return is_combined_conv(module) or bool(spanned_axes(module))


SPAN = SpanRewrite()
