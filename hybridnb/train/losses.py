"""Regression losses by name, and Huber with residual reweighting.

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
    if y.shape != pred.shape:
        if y.numel() != pred.numel():
            raise ValueError(f"the model's output has shape {tuple(pred.shape)} but the targets "
                             f"have shape {tuple(y.shape)}: the loss would broadcast them into "
                             "a wrong result. Make the model's number of outputs match the "
                             "targets (or pass targets of shape (batch,) for one output)")
        y = y.reshape(pred.shape)
    return pred.float(), y.float()


class ReweightedHuber:
    """Huber loss; from epoch ``after_epoch`` on, samples with large residuals count less.

    Weight of a sample with residual r: 1 while ``|r| <= c * delta``, else ``c * delta / |r|``
    (weights are constants for the gradient). The response-time targets of challenge 1 have a long
    tail of slow or missed responses; down-weighting them once the model has learned the bulk
    keeps them from dominating the fit. The weight depends only on the sample's own residual, so
    micro-batch splitting leaves the loss unchanged.
    """

    def __init__(self, delta: float = 1.0, after_epoch: int | None = None, c: float = 2.0) -> None:
        if delta <= 0 or c <= 0:
            raise ValueError(f"ReweightedHuber(delta={delta!r}, c={c!r}): both must be > 0")
        self.delta, self.after_epoch, self.c = float(delta), after_epoch, float(c)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

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


def _named(fn) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    def loss(pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return fn(*match_target(pred, y))
    loss.__name__ = fn.__name__
    return loss


def make_loss(loss, huber_delta: float = 1.0, reweight_after: int | None = None) -> Callable:
    """``"mse"`` | ``"l1"`` | ``"huber"`` | a callable ``(pred, y) -> scalar`` (a mean over samples
    for micro-batch splitting to stay exact)."""
    if callable(loss):
        return loss
    if loss == "mse":
        return _named(F.mse_loss)
    if loss in ("l1", "mae"):
        return _named(F.l1_loss)
    if loss == "huber":
        return ReweightedHuber(delta=huber_delta, after_epoch=reweight_after)
    raise ValueError(f"loss={loss!r}: use 'mse', 'l1', 'huber' or a callable (pred, y) -> loss")
