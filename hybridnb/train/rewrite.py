"""Exact rewrites of convolutions into faster forms of the same arithmetic.

Two forms, each a rule about a layer's shape (never a model's name), each checked on a batch:

- ``rewrite_depthwise``: height-spanning depthwise convolutions as a batched matmul (below).
- ``rewrite_rows``: a temporal ``Conv2d`` with a ``(1, K)`` kernel over several rows (EEG
  channels) as a 1-D convolution with the rows folded into the batch: ``(B, C, H, T)`` ->
  ``(B*H, C, T)``. Same sums, same padding. Why: with the rest in channels_last, oneDNN runs the
  folded 1-D form faster on the CPU; on this project's 2-core AMD EPYC, EEGNeX's two ``(1, 64)``
  convolutions over 129 rows took it from 1.65x (channels_last alone) to 1.86x the stock step
  (fp32, batch 32, forward + backward + AdamW, 4 interleaved rounds in one run, load ~1.5).
  Since then the speedups' CPU rule computes those two as one convolution first (the chain
  rewrite, ``rewrite_chain.py``: 2.24x), and the rows form takes the ``(1, K)`` convolutions left.

The depthwise form:

The rule is about a layer's shape, never a model's name: a ``Conv2d`` with ``groups ==
in_channels`` (any depth multiplier ``K = out_channels / in_channels``), kernel ``(H, 1)``, stride
1 along the width, no padding, no dilation, applied to an input of height exactly ``H``. Each
output channel ``g*K + k`` is then a weighted sum over the H rows of input channel ``g``:

    out[b, g*K + k, 0, t] = sum_h w[g*K + k, 0, h, 0] * x[b, g, h, t]  (+ bias[g*K + k])
    ==  einsum("bght,gkh->bgkt", x, w.view(G, K, H)).reshape(B, G*K, 1, T)

Why: on CUDA, PyTorch sends NCHW depthwise convolutions with a non-square kernel in bf16/fp32 to
its own ``conv_depthwise2d`` kernel, which took 52% of an H100's step for a (129, 1) kernel; a
batched matmul goes to cuBLAS. In fp32 the two agree to rounding (summation order).

How: the convolution keeps its place, its parameters, its state_dict keys and any
``torch.nn.utils.parametrize`` parametrization (``self.weight`` is read, which applies it). Only its
class changes, to a subclass whose ``forward`` does the matmul — the same mechanism ``parametrize``
itself uses — so ``undo_rewrite`` restores the original class. Inputs of another shape (another
height, an unbatched tensor) take the original convolution path. A rewritten module pickles and
loads as its original class, so whole-model files need nothing from hybridnb.

Shapes are only known on a real batch: ``rewrite_depthwise`` finds candidates with forward hooks
on one example batch, compares the matmul with the convolution on that batch layer by layer and
the whole model's output before and after, and keeps nothing if they differ beyond tolerance.
"""

from __future__ import annotations

import contextlib
import copy
import copyreg
from dataclasses import dataclass, field

import torch
from torch import nn

from hybridnb.train.step import evaluating

# fp32 agreement demanded on the example batch: |a - b| <= ATOL + RTOL * max|b|
RTOL, ATOL = 1e-4, 1e-5


def is_candidate_conv(module: nn.Module) -> bool:
    """A depthwise Conv2d with a (H, 1) kernel that the matmul form can replace, whatever H is.

    Subclasses that change ``forward`` or ``_conv_forward`` are left alone: their forward may do
    more than the convolution.
    """
    if not isinstance(module, nn.Conv2d) or isinstance(module, _Rewritten):
        return False
    cls = type(module)
    return (cls.forward is nn.Conv2d.forward and cls._conv_forward is nn.Conv2d._conv_forward
            and module.groups == module.in_channels
            and module.out_channels % module.in_channels == 0
            and module.kernel_size[1] == 1 and module.stride[1] == 1
            and tuple(module.dilation) == (1, 1)
            and module.padding in ((0, 0), "valid"))


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


def is_rows_candidate(module: nn.Module) -> bool:
    """A ``Conv2d`` with a ``(1, K)`` kernel (K >= 2), stride 1, zero padding along the width
    only, no groups: the 1-D form computes it for inputs of any height."""
    if not isinstance(module, nn.Conv2d) or isinstance(module, _Rewritten):
        return False
    cls = type(module)
    padding = module.padding
    return (cls.forward is nn.Conv2d.forward and cls._conv_forward is nn.Conv2d._conv_forward
            and module.groups == 1 and module.kernel_size[0] == 1
            and module.kernel_size[1] >= 2 and tuple(module.stride) == (1, 1)
            and module.padding_mode == "zeros"
            and (padding in ("same", "valid") or padding[0] == 0))


def several_rows(module: nn.Conv2d, x: torch.Tensor) -> bool:
    """True when ``x`` is a batched input with more than one row (one row gains nothing)."""
    return x.dim() == 4 and x.shape[1] == module.in_channels and x.shape[2] > 1


def rows_as_conv1d(module: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` computed as a 1-D convolution over ``(B*H, C, T)``."""
    batch, chans, rows, width = x.shape
    reach = module.dilation[1] * (module.kernel_size[1] - 1)
    if module.padding == "same":  # PyTorch's own split: the odd sample goes to the right
        left, right = reach // 2, reach - reach // 2
    elif module.padding == "valid":
        left = right = 0
    else:
        left = right = module.padding[1]
    folded = x.transpose(1, 2).reshape(batch * rows, chans, width)
    if left or right:
        folded = torch.nn.functional.pad(folded, (left, right))
    out = torch.nn.functional.conv1d(folded, module.weight[:, :, 0, :], module.bias,
                                     dilation=module.dilation[1])
    return out.reshape(batch, rows, module.out_channels, -1).transpose(1, 2)


class _Rewritten:
    """Mixin placed before a convolution's own class: the faster form for inputs it applies to
    (``_hn_applies``/``_hn_compute``), the class's own forward for any other input."""

    _hn_stock: type  # the class it was before the rewrite
    _hn_form: tuple[str, str]  # this module's functions: (applies, compute)
    _hn_transient: tuple[str, ...] = ()  # ``__dict__`` keys the form adds: never pickled
    _hn_suffix: str = ""  # the rewritten class's name: the stock name + this

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        applies, compute = _form_functions(type(self))
        if applies(self, x):
            return compute(self, x)
        return self._hn_stock.forward(self, x)

    def _hn_undo(self) -> None:
        """Back to the original class, without what the form added to ``__dict__``."""
        for key in self._hn_transient:
            self.__dict__.pop(key, None)
        self.__class__ = type(self)._hn_stock

    def __reduce_ex__(self, protocol):
        # pickle as the original class (rebuilt by the standard library), so a whole model saved
        # with torch.save loads without hybridnb; a class that refuses pickling still refuses
        state = self.__getstate__()
        if self._hn_transient:
            state = {k: v for k, v in state.items() if k not in self._hn_transient}
        return copyreg._reconstructor, (type(self)._hn_stock, object, None), state

    def __deepcopy__(self, memo):
        cls = type(self)
        self.__class__ = cls._hn_stock
        try:
            replica = copy.deepcopy(self, memo)
        finally:
            self.__class__ = cls
        replica.__class__ = cls
        return replica


class _MatmulDepthwise(_Rewritten):
    """The depthwise convolution as a batched matmul (``rewrite_depthwise``)."""

    _hn_form = ("spans_height", "depthwise_as_matmul")
    _hn_suffix = "AsMatmul"


class _RowsAsConv1d(_Rewritten):
    """The ``(1, K)`` convolution as a 1-D convolution over folded rows (``rewrite_rows``)."""

    _hn_form = ("several_rows", "rows_as_conv1d")
    _hn_suffix = "AsConv1d"


def _form_functions(form: type) -> tuple:
    """``form``'s (applies, compute) functions, looked up when called (tests replace them)."""
    return tuple(globals()[name] for name in form._hn_form)


_CLASSES: dict[tuple[type, type], type] = {}


def _rewritten_class(stock: type, form: type) -> type:
    """The rewritten class for ``stock`` in ``form`` (one per pair, built once; every form,
    the chain's included)."""
    if (stock, form) not in _CLASSES:
        _CLASSES[(stock, form)] = type(f"{stock.__name__}{form._hn_suffix}", (form, stock),
                                       {"_hn_stock": stock, "__module__": form.__module__})
    return _CLASSES[(stock, form)]


@dataclass
class RewriteReport:
    """What ``rewrite_depthwise`` did: the modules rewritten (names), and why not otherwise."""

    rewritten: list[str] = field(default_factory=list)
    max_rel_diff: float = 0.0  # worst layer/model disagreement seen on the example batch
    note: str = ""  # one sentence when something was found but not rewritten

    def __bool__(self) -> bool:
        return bool(self.rewritten)


_FORMS = {"depthwise": (_MatmulDepthwise, is_candidate_conv, "depthwise-as-matmul rewrite"),
          "rows": (_RowsAsConv1d, is_rows_candidate, "rows-as-1-D-convolution rewrite")}


def _scan(model: nn.Module, example: tuple, form: type, candidate
          ) -> tuple[dict[str, float], object]:
    """One eval-mode forward with hooks on the candidate layers: (layer -> difference, output)."""
    found: dict[str, float] = {}
    hooks = []

    def check(name):
        def hook(module, args, output):
            applies, compute = _form_functions(form)
            if args and isinstance(args[0], torch.Tensor) and applies(module, args[0]):
                alt = compute(module, args[0])
                found[name] = max(found.get(name, 0.0), _rel_diff(alt, output))
        return hook

    for name, module in model.named_modules():
        if candidate(module):
            hooks.append(module.register_forward_hook(check(name)))
    try:
        with torch.no_grad(), evaluating(model), _exact_fp32():
            output = model(*example)
    finally:
        for h in hooks:
            h.remove()
    return found, output


def _rewrite(model: nn.Module, example: tuple, kind: str) -> RewriteReport:
    form, candidate, label = _FORMS[kind]
    report = RewriteReport()
    if not any(candidate(m) for m in model.modules()):
        return report  # nothing to check: no forward
    layers, before = _scan(model, example, form, candidate)
    if not layers:
        return report
    worst_layer = max(layers.values())
    names = sorted(layers)
    _swap(model, names, form)
    with torch.no_grad(), evaluating(model), _exact_fp32():
        after = model(*example)
    whole = _rel_diff_any(after, before)
    report.max_rel_diff = max(worst_layer, whole)
    if report.max_rel_diff > RTOL:
        undo_rewrite(model, kind)
        report.note = (f"{label} not used: it differed from the convolution by "
                       f"{report.max_rel_diff:.2g} (relative) on the first batch, more than "
                       f"{RTOL:g}; the model runs unchanged")
        return report
    report.rewritten = names
    return report


def rewrite_depthwise(model: nn.Module, *example) -> RewriteReport:
    """Rewrite every candidate depthwise convolution of ``model`` in place, checked on ``example``.

    ``example`` is one batch's positional inputs on the model's device. The check runs in fp32
    without gradients in eval mode (no BatchNorm statistics change, no random numbers drawn). If
    a layer or the whole output differs by more than ``RTOL`` (relative), nothing is rewritten and
    ``note`` says why.
    """
    return _rewrite(model, example, "depthwise")


def rewrite_rows(model: nn.Module, *example) -> RewriteReport:
    """Rewrite every ``(1, K)`` convolution of ``model`` that sees several rows on ``example``
    into the folded 1-D form, in place; checked like ``rewrite_depthwise``."""
    return _rewrite(model, example, "rows")


def rewritten_modules(model: nn.Module, kind: str = "depthwise") -> list[str]:
    """Names of the modules of ``model`` that currently run the ``kind`` form."""
    form = _FORMS[kind][0]
    return [n for n, m in model.named_modules() if isinstance(m, form)]


def undo_rewrite(model: nn.Module, kind: str | None = None) -> int:
    """Give every rewritten convolution of ``model`` (of ``kind``, or of any form) its original
    class back; returns how many."""
    return undo_forms(model, _Rewritten if kind is None else _FORMS[kind][0])


def undo_forms(model: nn.Module, form: type) -> int:
    """Every module of ``model`` running ``form`` (a ``_Rewritten`` subclass) back to its stock
    class; returns how many."""
    count = 0
    for module in model.modules():
        if isinstance(module, form):
            module._hn_undo()
            count += 1
    return count


def _swap(model: nn.Module, names: list[str], form: type) -> None:
    modules = dict(model.named_modules())
    for name in names:
        module = modules[name]
        module.__class__ = _rewritten_class(type(module), form)


@contextlib.contextmanager
def _exact_fp32():
    """TF32 off for the check: cuDNN would run the convolution in TF32 (10-bit mantissa) by
    default, which differs from the fp32 matmul by ~1e-3 for reasons unrelated to the rewrite."""
    cudnn, matmul = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = cudnn, matmul


def _rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a - b| / (max|b| + ATOL/RTOL): at most RTOL exactly when |a - b| <= ATOL + RTOL max|b|."""
    a, b = a.detach().float(), b.detach().float()
    if a.shape != b.shape:
        return float("inf")
    finite = b.isfinite()
    if not torch.equal(a.isfinite(), finite):
        return float("inf")
    a, b = a[finite], b[finite]
    if not b.numel():
        return 0.0
    return (a - b).abs().max().item() / (b.abs().max().item() + ATOL / RTOL)


def _rel_diff_any(a, b) -> float:
    """``_rel_diff`` over tensors nested in tuples/lists/dicts (model outputs of any shape)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return _rel_diff(a, b)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b):
        return max((_rel_diff_any(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return max((_rel_diff_any(a[k], b[k]) for k in a), default=0.0)
    return 0.0 if a == b else float("inf")
