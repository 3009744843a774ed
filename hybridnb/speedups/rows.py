"""Temporal ``(1, K)`` convolutions over several rows as 1-D convolutions (the ``rows`` knob).

A ``Conv2d`` with a ``(1, K)`` kernel over several rows (EEG channels) is computed as a 1-D
convolution with the rows folded into the batch: ``(B, C, H, T)`` -> ``(B*H, C, T)``. Same sums,
same padding. Why: with the rest of the model in channels_last, oneDNN runs the folded 1-D form
faster on the CPU (``bench/results/cpu-speedups-latest.md``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hybridnb.speedups.replace import FormReplacement, is_stock_conv2d
from hybridnb.speedups.rewrite import LayerRewrite

# rows shorter than this stay 2-D: the folded form then runs B*H tiny 1-D convolutions (CBraMod's
# (1, 3) convolutions over 129 rows of 8 samples ran 0.81x; EEG-length rows of 200 gain)
MIN_WIDTH = 16


def is_width_conv(module: nn.Module) -> bool:
    """The stock ``(1, k)`` convolution both this rewrite and the chain rewrite start from."""
    return (is_stock_conv2d(module) and module.groups == 1 and module.kernel_size[0] == 1
            and tuple(module.stride) == (1, 1) and module.padding_mode == "zeros"
            and (module.padding in ("same", "valid") or module.padding[0] == 0))


def several_rows(module: nn.Conv2d, x: torch.Tensor) -> bool:
    """A batched input of several rows (one row gains nothing) of ``MIN_WIDTH`` samples."""
    return (x.dim() == 4 and x.shape[1] == module.in_channels and x.shape[2] > 1
            and x.shape[3] >= MIN_WIDTH)


def time_padding(conv: nn.Conv2d) -> tuple[int, int]:
    """(left, right) zeros ``conv`` adds along time (PyTorch's "same" split: the odd sample
    goes right)."""
    reach = conv.dilation[1] * (conv.kernel_size[1] - 1)
    if conv.padding == "same":
        return reach // 2, reach - reach // 2
    if conv.padding == "valid":
        return 0, 0
    return conv.padding[1], conv.padding[1]


def rows_as_conv1d(module: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` computed as a 1-D convolution over ``(B*H, C, T)``."""
    batch, chans, rows, width = x.shape
    left, right = time_padding(module)
    folded = x.transpose(1, 2).reshape(batch * rows, chans, width)
    if left or right:
        folded = F.pad(folded, (left, right))
    out = F.conv1d(folded, module.weight[:, :, 0, :], module.bias, dilation=module.dilation[1])
    return out.reshape(batch, rows, module.out_channels, -1).transpose(1, 2)


class RowsAsConv1d(FormReplacement):
    fits = staticmethod(several_rows)
    compute = staticmethod(rows_as_conv1d)


class RowsRewrite(LayerRewrite):
    name = "rows"
    label = "rows-as-1-D-convolution rewrite"
    kind = RowsAsConv1d
    none_found = "no (1, K) convolution over several rows"

    def applies(self, module: nn.Module) -> bool:
        return is_width_conv(module) and module.kernel_size[1] >= 2


ROWS = RowsRewrite()
