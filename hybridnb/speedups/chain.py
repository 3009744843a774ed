"""The "chain" rewrite: ``Conv2d (1, k1) -> BatchNorm2d -> Conv2d (1, k2)`` as one convolution.

No nonlinearity sits between the two temporal convolutions and the BatchNorm, so with
``c1 = convA(x)`` and the BatchNorm's per-channel affine ``z = a * c1 + b`` (``a = gamma /
sqrt(var + eps)``, ``b = beta - mean * a``; batch statistics in training, running ones in eval),
convB's output is, exactly (same sums, other order):

    convB(z)[o, t] = bias_B[o] + sum_c (b_c + a_c bias_A[c]) S[o, c, t]        (a (C2, T2) table)
                   + sum_{i, m} K[o, i, m] x_padded[i, t + m]                   (one convolution)
                   - (the edge correction below)
    K[o, i, m] = sum_c a_c sum_{j + k = m} wB[o, c, j] wA[c, i, k]   (kernel k1 + k2 - 1)

where ``S[o, c, t]`` sums convB's taps that land inside ``z``'s extent (its zero padding sees
zeros, not ``b``). The composite also sums convA's output at the few positions left (right) of
``z`` that convB's padding would have zeroed; the edge correction, a small matrix from the first
(last) samples of ``x`` to the first ``left_B`` (last ``right_B``) outputs, subtracts them.

Why: when convB maps many channels to many (EEGNeX's blocks 1-2: 1 -> 8 -> 32 channels, two
(1, 64) kernels), the composite costs a fraction of the multiply-adds (``cost_share``); the
CPU's rules apply it by rule (``bench/results/cpu-speedups-latest.md``). Rule (shapes, never
names): two stock width convolutions around a stock ``BatchNorm2d``, each called once on the
example batch, each feeding only the next.

The three modules are replaced and share a link carrying the call in flight: convA and the
BatchNorm compute their real outputs (statistics move as stock), so hooks and residuals see real
intermediates; only convB's arithmetic changes. Any other input (another shape, an interrupted
chain, autocast, not fp32/fp64) takes the stock path. Precision: ``b`` absorbs ``-mean * a``, so
a mean far larger than the spread cancels digits; the first-batch check refuses the rewrite when
that costs more than ``RTOL``.
"""

from __future__ import annotations

import weakref
from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn

from hybridnb.speedups import replace
from hybridnb.speedups.exact import eval_output
from hybridnb.speedups.rewrite import Rewrite
from hybridnb.speedups.rows import is_width_conv, time_padding

MAX_COST_SHARE = 0.5  # the composite's multiply-adds must be at most this share of the stock two


# ----------------------------------------------------------------------------- rule and shapes

def is_temporal_conv(module: nn.Module) -> bool:
    return is_width_conv(module) and tuple(module.dilation) == (1, 1)


def is_plain_batchnorm(module: nn.Module) -> bool:
    return isinstance(module, nn.BatchNorm2d) and type(module).forward is nn.BatchNorm2d.forward


def _geometry(conv_a: nn.Conv2d, conv_b: nn.Conv2d, width: int) -> dict:
    k1, k2 = conv_a.kernel_size[1], conv_b.kernel_size[1]
    la, ra = time_padding(conv_a)
    lb, rb = time_padding(conv_b)
    t1 = width + la + ra - k1 + 1
    return {"k1": k1, "k2": k2, "la": la, "ra": ra, "lb": lb, "rb": rb, "t1": t1,
            "t2": t1 + lb + rb - k2 + 1, "nl": max(k1 - 1 - la, 0), "nr": max(k1 - 1 - ra, 0)}


def cost_share(conv_a: nn.Conv2d, conv_b: nn.Conv2d, width: int) -> float:
    """The composite's multiply-adds per (row, sample) over the stock chain's (the composite
    still runs convA, for the statistics)."""
    g = _geometry(conv_a, conv_b, width)
    ci, c1, c2 = conv_a.in_channels, conv_a.out_channels, conv_b.out_channels
    edges = ci * c2 * (g["nl"] * g["lb"] + g["nr"] * g["rb"]) / max(width, 1)
    fused = c2 * ci * (g["k1"] + g["k2"] - 1) + c1 * ci * g["k1"] + edges
    return fused / (c1 * ci * g["k1"] + c2 * c1 * g["k2"])


def _fits(link: _Link, x: torch.Tensor) -> bool:
    """Whether the composite form computes this call: a batched fp32/fp64 input wide enough that
    the two edge corrections do not overlap, no autocast."""
    conv_a, _, conv_b = link.originals
    if x.dim() != 4 or x.shape[1] != conv_a.in_channels or torch.is_autocast_enabled(
            x.device.type) or x.dtype not in (torch.float32, torch.float64):
        return False
    width = x.shape[3]
    g = _geometry(conv_a, conv_b, width)
    return (g["t1"] >= 1 and g["nl"] <= width and g["nr"] <= width
            and g["t2"] >= g["lb"] + g["rb"] and x.shape[0] * x.shape[2] * g["t1"] > 1)


# ----------------------------------------------------------------------------- the arithmetic

def batchnorm_affine(bn: nn.BatchNorm2d, c1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-channel ``(a, b)`` of ``bn(c1) = a * c1 + b``, with the statistics BatchNorm2d
    used (call it after ``bn``'s own forward)."""
    if bn.training or (bn.running_mean is None and bn.running_var is None):
        var, mean = torch.var_mean(c1, dim=(0, 2, 3), unbiased=False)
    else:
        mean, var = bn.running_mean, bn.running_var
    a = torch.rsqrt(var + bn.eps)
    if bn.weight is not None:
        a = a * bn.weight
    return a, -mean * a if bn.bias is None else bn.bias - mean * a


def chain_output(conv_a: nn.Conv2d, conv_b: nn.Conv2d, x: torch.Tensor, a: torch.Tensor,
                 shift: torch.Tensor) -> torch.Tensor:
    """``conv_b(a * conv_a(x) + shift)`` (``conv_a``'s bias in ``shift``) as one convolution of
    ``x`` plus a table and edge corrections (the module docstring)."""
    batch, ci, rows, width = x.shape
    g = _geometry(conv_a, conv_b, width)
    k2, lb, rb, t2 = g["k2"], g["lb"], g["rb"], g["t2"]
    wa = conv_a.weight[:, :, 0, :]  # (C1, Ci, k1), through any parametrization
    wb = conv_b.weight[:, :, 0, :]  # (C2, C1, k2)
    c1n, c2n = wa.shape[0], wb.shape[0]
    scaled = wb * a.view(1, c1n, 1)
    # K[o, i, m] = sum_c sum_j scaled[o, c, j] wa[c, i, m - j]: convA's kernels convolved by convB's
    composite = F.conv1d(F.pad(wa.transpose(0, 1), (k2 - 1, k2 - 1)),
                         scaled.flip(-1)).transpose(0, 1)  # (C2, Ci, k1 + k2 - 1)
    # shift on z's extent [0, T1), zeros in convB's padding: a (C2, T2) table, constant inside
    table = _shift_table(wb, shift, g)
    if conv_b.bias is not None:
        table = table + conv_b.bias.view(c2n, 1)
    inner = table[:, lb] if t2 > lb + rb else table.new_zeros(c2n)  # (all of convB's taps in z)
    padded = F.pad(x, (g["la"] + lb, g["ra"] + rb))
    out = _CompositeConv.apply(padded, composite, inner)  # (B, C2, H, T2), contiguous
    edges = [_edge(x, wa, scaled, table - inner.view(c2n, 1), g, left) for left in (True, False)]
    edges = [e if e is None else e.view(batch, rows, c2n, -1).transpose(1, 2) for e in edges]
    return _AddEdges.apply(out, *edges)


def _edge(x, wa, scaled, table, g, left: bool) -> torch.Tensor | None:
    """What the first ``lb`` (``left``) or last ``rb`` outputs need added: the shift table's edge
    (``table`` less its inner value) less what the composite sums from convA's output outside z,
    a map from x's first ``nl`` (last ``nr``) samples. Left: output t, convB tap j at position
    s = t + j - lb < 0, x sample p = s + k - la for convA's tap k; right: position T1 + s,
    j = s - t + k2 - 1, x's q-th last sample q = s + k."""
    outs, ins = (g["lb"], g["nl"]) if left else (g["rb"], g["nr"])
    if not outs:
        return None
    batch, ci, rows, width = x.shape
    c2n, folded = table.shape[0], batch * rows
    edge = table[:, :outs] if left else table[:, table.shape[1] - outs:]
    edge = edge.expand(folded, c2n, outs)
    if not ins:
        return edge
    dev, k1, k2 = wa.device, wa.shape[-1], scaled.shape[-1]
    s = torch.arange(-min(ins, outs), 0, device=dev) if left else torch.arange(
        min(ins, outs), device=dev)
    taps = s.view(1, -1) - torch.arange(outs, device=dev).view(-1, 1) + (
        outs if left else k2 - 1)  # (t, s) -> j
    reach = torch.arange(ins, device=dev).view(-1, 1) - s.view(1, -1) + (
        g["la"] if left else 0)  # (p, s) -> k
    wb_at = scaled[:, :, taps.clamp(0, k2 - 1)] * ((taps >= 0) & (taps < k2))  # (C2, C1, T, S)
    wa_at = wa[:, :, reach.clamp(0, k1 - 1)] * ((reach >= 0) & (reach < k1))  # (C1, Ci, P, S)
    edge_map = torch.einsum("octs,cips->ipot", wb_at, wa_at).reshape(ci * ins, c2n * outs)
    xs = x[..., :ins] if left else x[..., width - ins:]
    return edge - (xs.transpose(1, 2).reshape(folded, ci * ins) @ edge_map).view(folded, c2n, outs)


def _shift_table(wb, shift, g) -> torch.Tensor:
    """The (C2, T2) table ``sum_c shift_c S[o, c, t]`` of the module docstring, by prefix sums
    over the taps."""
    k2, lb, t1, t2 = g["k2"], g["lb"], g["t1"], g["t2"]
    prefix = F.pad(wb.cumsum(-1), (1, 0))  # (C2, C1, k2 + 1): sums of the first n taps
    t = torch.arange(t2, device=wb.device)
    hi = (t1 + lb - t).clamp(0, k2)
    lo = (lb - t).clamp(0, k2)
    inside = prefix[:, :, hi] - prefix[:, :, lo]  # (C2, C1, T2)
    return torch.einsum("oct,c->ot", inside, shift)


class _CompositeConv(torch.autograd.Function):
    """``F.conv2d`` of the padded ``x`` (B, Ci, H, W) with the composite (C2, Ci, K) along W,
    whose kernel gradient is a convolution with the batch and rows as channels, ``grad_w[o, i,
    k] = sum_{b,h,t} g[b, o, h, t] x[b, i, h, t + k]``: oneDNN's own backward for one input
    channel and 127 taps is its slow case (EEGNeX, 64 x 129 x 200, one thread: 0.63 s against
    0.45 s, the gradient's copy included). The output stays contiguous: a BatchNorm after a
    transposed view takes a slow path."""

    @staticmethod
    def forward(ctx, padded, kernel, bias):
        ctx.save_for_backward(padded, kernel)
        return F.conv2d(padded, kernel.unsqueeze(2), bias)

    @staticmethod
    def backward(ctx, grad):
        padded, kernel = ctx.saved_tensors
        grad_x = grad_kernel = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.ops.aten.convolution_backward(
                grad, padded, kernel.unsqueeze(2), None, [1, 1], [0, 0], [1, 1], False, [0, 0],
                1, [True, False, False])[0]
        if ctx.needs_input_grad[1]:
            ci, c2 = padded.shape[1], grad.shape[1]
            signal = padded.transpose(0, 1).reshape(ci, -1, padded.shape[-1])  # (Ci, B*H, W)
            taps = grad.transpose(0, 1).reshape(c2, -1, grad.shape[-1])  # (C2, B*H, T2)
            grad_kernel = F.conv1d(signal, taps).transpose(0, 1)
        return grad_x, grad_kernel, grad.sum((0, 2, 3)) if ctx.needs_input_grad[2] else None


class _AddEdges(torch.autograd.Function):
    """``out[..., :L] += left; out[..., -R:] += right`` in place (``out`` is a fresh convolution
    output nothing saved). Autograd's own in-place slice add would copy the whole gradient in
    backward, and ``index_add_`` gathers it slowly; here the gradient passes through and the
    edges take slices of it."""

    @staticmethod
    def forward(ctx, out, left, right):
        ctx.widths = (None if left is None else left.shape[-1],
                      None if right is None else right.shape[-1])
        if left is not None:
            out[..., :left.shape[-1]] += left
        if right is not None:
            out[..., out.shape[-1] - right.shape[-1]:] += right
        ctx.mark_dirty(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        lw, rw = ctx.widths
        return (grad, None if lw is None else grad[..., :lw],
                None if rw is None else grad[..., grad.shape[-1] - rw:])


# ----------------------------------------------------------------------------- the forms

class _Link:
    """One rewritten chain's stock convA, BatchNorm and convB; the call in flight (not copied)."""

    def __init__(self, originals: tuple[nn.Module, nn.Module, nn.Module]) -> None:
        self.originals = originals
        self.pending = None

    def __getstate__(self):
        return {"originals": self.originals, "pending": None}

    def take(self, step: str, tensor: torch.Tensor) -> tuple | None:
        """The call in flight if its ``step`` produced exactly ``tensor``, else None; clears it."""
        pending, self.pending = self.pending, None
        if pending is None or pending[0] != step or pending[2]() is not tensor:
            return None
        return pending


class ChainForm(replace.Replacement):

    link: _Link


class ChainHead(ChainForm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.link.pending = None
        out = self.stock(x)
        if _fits(self.link, x):
            self.link.pending = ("head", x, weakref.ref(out))
        return out


class ChainNorm(ChainForm):
    def forward(self, c1: torch.Tensor) -> torch.Tensor:
        pending = self.link.take("head", c1)
        out = self.stock(c1)  # the stock output and statistics update
        if pending is None:
            return out
        conv_a, bn, _ = self.link.originals
        a, shift = batchnorm_affine(bn, c1)
        if conv_a.bias is not None:
            shift = shift + a * conv_a.bias  # the composite runs convA without its bias
        self.link.pending = ("norm", pending[1], weakref.ref(out), a, shift)
        return out


class ChainTail(ChainForm):
    def forward(self, z: torch.Tensor) -> torch.Tensor:
        pending = self.link.take("norm", z)
        if pending is None:
            return self.stock(z)
        _, x, _, a, shift = pending
        conv_a, _, conv_b = self.link.originals
        return chain_output(conv_a, conv_b, x, a, shift)


# ----------------------------------------------------------------------------- find and check

def _scan(model: nn.Module, example: tuple) -> tuple[list[tuple[str, str, str]], object]:
    """The chains the rule takes on ``example`` and the stock eval output (the reference)."""
    names = {m: n for n, m in model.named_modules()}
    calls: list[tuple[nn.Module, list[int], int]] = []
    keep: list = []  # the tensors seen, alive until the end so their ids stay unique

    def hook(module, args, output):
        ins = [a for a in args if isinstance(a, torch.Tensor)]
        keep.append((args, output))
        calls.append((module, [id(a) for a in ins],
                      id(output) if isinstance(output, torch.Tensor) else -1))

    output = eval_output(model, example, [m.register_forward_hook(hook) for m in names])
    count = Counter(module for module, _, _ in calls)

    def sole_consumer(tensor_id: int, consumer: nn.Module) -> bool:
        """No module but ``consumer`` and those containing it takes the tensor."""
        parts = names[consumer].split(".")
        allowed = {consumer} | {model.get_submodule(".".join(parts[:i])) for i in range(len(parts))}
        return {m for m, ins, _ in calls if tensor_id in ins} <= allowed

    found = []
    by_output = {out: module for module, _, out in calls}
    for bn, ins, out in calls:
        if not is_plain_batchnorm(bn) or count[bn] != 1 or len(ins) != 1:
            continue
        conv_a = by_output.get(ins[0])
        if conv_a is None or not is_temporal_conv(conv_a) or count[conv_a] != 1 \
                or conv_a.out_channels != bn.num_features:
            continue
        tails = [m for m, m_ins, _ in calls if m_ins == [out] and is_temporal_conv(m)
                 and m.in_channels == conv_a.out_channels and count[m] == 1]
        if len(tails) != 1 or not sole_consumer(ins[0], bn) or not sole_consumer(out, tails[0]):
            continue
        found.append((names[conv_a], names[bn], names[tails[0]]))
    return found, output


class ChainRewrite(Rewrite):
    name = "chain"
    trains = True
    label = "conv-BatchNorm-conv chain as one convolution"
    kind = ChainForm
    check_samples = 2
    rule = (f"conv-BatchNorm-conv with <= {MAX_COST_SHARE:g} of the multiply-adds as one "
            "convolution")
    none_found = ("no conv-BatchNorm-conv chain that one convolution computes with fewer "
                  "multiply-adds")

    def applies(self, module: nn.Module) -> bool:
        return is_temporal_conv(module) or is_plain_batchnorm(module)

    def could_apply(self, model: nn.Module) -> bool:
        mods = list(model.modules())  # a plain BatchNorm2d and two temporal convolutions
        return any(map(is_plain_batchnorm, mods)) and sum(map(is_temporal_conv, mods)) >= 2

    def find(self, model: nn.Module, example: tuple) -> tuple[list, object, float]:
        """The chains ``find_chains`` sees whose composite costs at most ``MAX_COST_SHARE``."""
        width = next((a.shape[-1] for a in example if isinstance(a, torch.Tensor) and a.dim()), 0)
        found, output = _scan(model, example)
        get = model.get_submodule
        cheap = [c for c in found if cost_share(get(c[0]), get(c[2]), width) <= MAX_COST_SHARE]
        return cheap, output, 0.0

    def swap_in(self, model: nn.Module, group: tuple[str, ...]) -> None:
        forms = [form(model.get_submodule(n))
                 for form, n in zip((ChainHead, ChainNorm, ChainTail), group, strict=True)]
        link = _Link(tuple(form.original for form in forms))
        for name, form in zip(group, forms, strict=True):
            form.link = link
            replace.put(model, name, form)


CHAIN = ChainRewrite()


def find_chains(model: nn.Module, *example) -> list[tuple[str, str, str]]:
    """The (convA, bn, convB) names that follow the rule on ``example``."""
    return _scan(model, example)[0]
