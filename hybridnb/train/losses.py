"""Losses by name: regression (mse, l1, huber with residual reweighting) and classification
(cross_entropy, with class weights).

Every loss here is a mean over samples of a per-sample term, so a batch split into micro-batches
(each weighted by its share of samples) gives exactly the unsplit loss and gradient.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def match_target(pred: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Targets of shape (B,) or (B, 1) against predictions of either shape, both in float32 (a
    regression loss under bf16/fp16 autocast is computed in full precision)."""
    if not isinstance(pred, torch.Tensor):
        raise TypeError(output_structure(pred))
    if y.shape != pred.shape:
        if y.numel() != pred.numel():
            raise ValueError(f"the model's output has shape {tuple(pred.shape)} but the targets "
                             f"have shape {tuple(y.shape)}: the loss would broadcast them into "
                             "a wrong result. Make the model's number of outputs match the "
                             "targets (or pass targets of shape (batch,) for one output)")
        y = y.reshape(pred.shape)
    return pred.float(), y.float()


def output_structure(out) -> str:
    """What a model returned that is not one tensor, and how to train it anyway."""
    if not isinstance(out, (dict, tuple, list)):  # a dict: also transformers' ModelOutput
        return (f"the model returned a {type(out).__name__}, not a tensor: the loss needs the "
                "predictions as one tensor of shape (batch,) or (batch, outputs)")
    keys = list(out) if isinstance(out, dict) else list(range(len(out)))
    form = "{!r}: {}" if isinstance(out, dict) else "[{}]: {}"  # as the user would index it
    parts = [form.format(k, f"tensor {tuple(out[k].shape)}" if isinstance(out[k], torch.Tensor)
                         else type(out[k]).__name__) for k in keys]
    pick = f"out[{keys[0]!r}]" if keys else "out[...]"
    return (f"the model returned a {type(out).__name__} ({', '.join(parts[:6])}"
            f"{', ...' if len(parts) > 6 else ''}), not one tensor: the named losses need the "
            "predictions alone. Return them alone from forward(), or pass a loss that picks "
            f"them, e.g. loss=lambda out, y: torch.nn.functional.mse_loss({pick}.squeeze(-1), y)")


# torch's regression losses broadcast (batch, 1) against (batch,) into (batch, batch) with only a
# warning: passed as loss=, they get the same shape check as the named losses
_REGRESSION_MODULES = (torch.nn.MSELoss, torch.nn.L1Loss, torch.nn.HuberLoss,
                       torch.nn.SmoothL1Loss)


class ShapeChecked:
    """A regression loss (torch's module or function), its inputs matched by ``match_target``."""

    def __init__(self, module: Callable) -> None:
        self.module = module
        self.__name__ = getattr(module, "__name__", type(module).__name__)

    def __call__(self, pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.module(*match_target(pred, y))

    check = staticmethod(match_target)  # what fit checks before it starts (preflight.py)

    def __repr__(self) -> str:
        return f"ShapeChecked({self.module!r})"


class ReweightedHuber:
    """Huber loss; from epoch ``after_epoch`` on, samples with large residuals count less.

    Weight of a sample with residual r: 1 while ``|r| <= c * delta``, else ``c * delta / |r|``
    (weights are constants for the gradient; one sample's own, so micro-batches split exactly).
    The response-time targets of challenge 1 have a long tail of slow or missed responses;
    down-weighting them once the model has learned the bulk keeps them from dominating the fit.
    """

    def __init__(self, delta: float = 1.0, after_epoch: int | None = None, c: float = 2.0) -> None:
        if delta <= 0 or c <= 0:
            raise ValueError(f"ReweightedHuber(delta={delta!r}, c={c!r}): both must be > 0")
        self.delta, self.after_epoch, self.c = float(delta), after_epoch, float(c)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    check = staticmethod(match_target)

    @property
    def reweighting(self) -> bool:
        return self.after_epoch is not None and self.epoch >= self.after_epoch

    def __call__(self, pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        pred, y = match_target(pred, y)
        per_sample = F.huber_loss(pred, y, reduction="none", delta=self.delta)
        if not self.reweighting:
            return per_sample.mean()
        limit = self.c * self.delta
        r = (pred - y).detach().abs()
        weight = torch.where(r <= limit, torch.ones_like(r), limit / r.clamp_min(1e-12))
        return (per_sample * weight).mean()

    def __repr__(self) -> str:
        return f"ReweightedHuber(delta={self.delta}, after_epoch={self.after_epoch}, c={self.c})"


CLASSIFICATION_NAMES = ("cross_entropy", "ce", "crossentropy")


def is_classification(loss) -> bool:
    """Whether ``loss=`` classifies: "cross_entropy", or torch's CrossEntropyLoss / NLLLoss."""
    if isinstance(loss, str):
        return loss in CLASSIFICATION_NAMES
    return isinstance(loss, (torch.nn.CrossEntropyLoss, torch.nn.NLLLoss))


def class_targets(pred: torch.Tensor, y: torch.Tensor, check_range: bool = True
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits in float32 and targets as class indices (B,) int64 (or probabilities (B, C)),
    checked: one output per class and, with ``check_range``, indices within them (an index out
    of range is a device-side assert on CUDA that the process does not survive; the check costs
    a device sync, so ``CrossEntropy`` asks it for every CPU batch and a device's first)."""
    if not isinstance(pred, torch.Tensor):
        raise TypeError(output_structure(pred))
    if pred.dim() != 2 or pred.shape[1] < 2:
        raise ValueError(f"loss='cross_entropy' needs the model's output as (batch, classes) "
                         f"logits with one output per class (2 or more); it gives shape "
                         f"{tuple(pred.shape)}. Build the model with n_outputs = the number "
                         "of classes (two classes: n_outputs=2)")
    if y.is_floating_point() and y.shape == pred.shape:
        return pred.float(), y.float()  # class probabilities
    if y.dim() == 2 and y.shape[1] == 1 or y.dim() == 0:
        y = y.reshape(-1)
    if y.dim() != 1 or len(y) != len(pred):
        raise ValueError(f"loss='cross_entropy' needs targets of shape (batch,) holding class "
                         f"indices (or (batch, classes) probabilities); they have shape "
                         f"{tuple(y.shape)} against outputs {tuple(pred.shape)}")
    if check_range and y.is_floating_point() and not (  # (a device batch's check syncs)
            torch.isfinite(y).all() and torch.equal(y, y.round())):
        raise ValueError("loss='cross_entropy' needs class indices 0..C-1 as targets; these are "
                         "floats that are not whole numbers (regression targets? use "
                         "loss='mse' or 'huber')")
    if y.is_floating_point() or y.dtype == torch.bool:
        y = y.long()
    if check_range:
        low, high = (int(v) for v in torch.stack([y.min(), y.max()]).tolist())
        if low < 0 or high >= pred.shape[1]:
            raise ValueError(f"the targets hold class indices {low}..{high}, but the model "
                             f"gives {pred.shape[1]} outputs (classes 0..{pred.shape[1] - 1}): "
                             "number the classes from 0 (e.g. y - y.min(), or "
                             "np.unique(y, return_inverse=True)[1]) and give the model one "
                             "output per class")
    return pred.float(), y


class CrossEntropy:
    """Cross-entropy over logits (B, C) and class indices (B,) or (B, 1): int64 targets, or
    floats holding whole numbers (cast); or class probabilities (B, C). ``weights``: one per
    class. The loss is the mean over samples of ``weight[y] * nll`` (not torch's division by
    the batch's summed weights), so a batch split into micro-batches gives the same loss."""

    __name__ = "cross_entropy"

    def __init__(self, weights: tuple[float, ...] | None = None) -> None:
        self.weights = None if weights is None else torch.tensor(weights, dtype=torch.float32)
        self._seen = False  # targets on a device: their range is checked on the first batch

    def __call__(self, pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        pred, y = class_targets(pred, y, check_range=y.device.type == "cpu" or not self._seen)
        self._seen = True
        per_sample = F.cross_entropy(pred, y, reduction="none")
        if self.weights is None:
            return per_sample.mean()
        if len(self.weights) != pred.shape[1]:
            raise ValueError(f"class_weights has {len(self.weights)} weights but the model gives "
                             f"{pred.shape[1]} outputs (one per class): give one weight per class")
        if self.weights.device != pred.device:  # moved when the run's device changes, not per step
            self.weights = self.weights.to(pred.device)
        return (per_sample * (self.weights[y] if y.dim() == 1 else y @ self.weights)).mean()

    check = staticmethod(class_targets)  # the shapes and the classes' range (preflight.py)

    def __getstate__(self) -> dict:
        return {"weights": None if self.weights is None else self.weights.cpu(), "_seen": False}

    def __repr__(self) -> str:
        w = None if self.weights is None else self.weights.tolist()
        return f"CrossEntropy(class_weights={w})"


def make_loss(loss, huber_delta: float = 1.0, reweight_after: int | None = None,
              class_weights: tuple[float, ...] | None = None) -> Callable:
    """``"mse"`` | ``"l1"`` | ``"huber"`` | ``"cross_entropy"`` (``class_weights``) | a callable
    ``(pred, y) -> scalar`` (a mean over samples for micro-batch splitting to stay exact)."""
    if isinstance(loss, str) and loss in CLASSIFICATION_NAMES:
        return CrossEntropy(class_weights)
    if isinstance(loss, _REGRESSION_MODULES):
        return ShapeChecked(loss)
    if isinstance(loss, type) and issubclass(loss, torch.nn.Module):
        raise ValueError(f"loss={loss.__name__} is a class: pass an instance, "
                         f"loss={loss.__name__}()")
    if callable(loss):
        return loss
    if loss == "mse":
        return ShapeChecked(F.mse_loss)
    if loss in ("l1", "mae"):
        return ShapeChecked(F.l1_loss)
    if loss == "huber":
        return ReweightedHuber(delta=huber_delta, after_epoch=reweight_after)
    raise ValueError(f"loss={loss!r}: use 'mse', 'l1', 'huber' (regression), 'cross_entropy' "
                     "(classification) or a callable (pred, y) -> loss")
