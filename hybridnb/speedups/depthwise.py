"""Height-spanning depthwise convolutions as a batched matmul (the ``rewrite`` knob).

The rule is about a layer's shape, never a model's name: a stock ``Conv2d`` with ``groups ==
in_channels`` (any depth multiplier ``K = out_channels / in_channels``), kernel ``(H, 1)``,
stride 1 along the width, no padding, no dilation, applied to an input of height exactly ``H``.
Each output channel ``g*K + k`` is then a weighted sum over the H rows of input channel ``g``:

    out[b, g*K + k, 0, t] = sum_h w[g*K + k, 0, h, 0] * x[b, g, h, t]  (+ bias[g*K + k])
    ==  einsum("bght,gkh->bgkt", x, w.view(G, K, H)).reshape(B, G*K, 1, T)

Why: on CUDA, PyTorch sends NCHW depthwise convolutions with a non-square kernel in bf16/fp32 to
its own ``conv_depthwise2d`` kernel, which dominates EEGNeX's step on a GPU; a batched matmul goes
to cuBLAS (``bench/results/gpu-latest.md``). In fp32 the two agree to rounding.

The weight is read through any ``torch.nn.utils.parametrize`` parametrization (braindecode's
max-norm). Inputs of another shape (another height, an unbatched tensor) take the convolution.
"""

from __future__ import annotations

import torch
from torch import nn

from hybridnb.speedups.replace import FormReplacement, is_stock_conv2d
from hybridnb.speedups.rewrite import LayerRewrite


def spans_height(module: nn.Conv2d, x: torch.Tensor) -> bool:
    """True when ``x`` is a batched input whose height the kernel covers exactly."""
    return x.dim() == 4 and x.shape[1] == module.in_channels \
        and x.shape[2] == module.kernel_size[0]


def depthwise_as_matmul(module: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` computed as a batched matmul (``x`` must satisfy ``spans_height``)."""
    batch, groups, height, width = x.shape
    mult = module.out_channels // groups
    weight = module.weight  # through any parametrization
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

