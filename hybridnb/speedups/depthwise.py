"""Height-spanning depthwise convolutions as a batched matmul (the ``rewrite`` knob).

A stock depthwise ``Conv2d`` (any depth multiplier) whose ``(H, 1)`` kernel covers its input's
height exactly sums, for each output channel, the H rows of one input channel: a batched matmul.
Why: on CUDA, PyTorch sends NCHW depthwise convolutions with a non-square kernel in bf16/fp32 to
its own ``conv_depthwise2d`` kernel, which dominates EEGNeX's step on a GPU; a batched matmul goes
to cuBLAS (``bench/results/gpu-latest.md``). In fp32 the two agree to rounding.
"""

from __future__ import annotations

import torch
from torch import nn

from hybridnb.speedups.replace import FormReplacement, is_stock_conv2d
from hybridnb.speedups.rewrite import LayerRewrite


def spans_height(module: nn.Conv2d, x: torch.Tensor) -> bool:
    """A batched input whose height the kernel covers exactly."""
    return x.dim() == 4 and x.shape[1] == module.in_channels \
        and x.shape[2] == module.kernel_size[0]


def depthwise_as_matmul(module: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` computed as a batched matmul (``x`` must satisfy ``spans_height``)."""
    batch, groups, height, width = x.shape
    mult = module.out_channels // groups
    weight = module.weight  # through any parametrization (braindecode's max-norm)
    out = torch.einsum("bght,gkh->bgkt", x, weight.view(groups, mult, height))
    out = out.reshape(batch, groups * mult, 1, width)
    if module.bias is not None:
        out = out + module.bias.view(1, -1, 1, 1)
    return out


class MatmulDepthwise(FormReplacement):
    fits = staticmethod(spans_height)
    compute = staticmethod(depthwise_as_matmul)


class DepthwiseRewrite(LayerRewrite):
    name = "rewrite"
    label = "depthwise-as-matmul rewrite"
    kind = MatmulDepthwise
    none_found = "no depthwise convolution spans its input's height"

    def applies(self, module: nn.Module) -> bool:  # whatever H is: the input's height decides
        return (is_stock_conv2d(module) and module.groups == module.in_channels
                and module.out_channels % module.in_channels == 0
                and module.kernel_size[1] == 1 and module.stride[1] == 1
                and tuple(module.dilation) == (1, 1) and module.padding in ((0, 0), "valid"))


DEPTHWISE = DepthwiseRewrite()

