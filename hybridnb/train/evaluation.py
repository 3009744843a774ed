"""Evaluation and prediction: the model in eval mode over a loader, gathered across ranks.

Validation scores with the loss without training-only reweighting, so validation losses stay
comparable between epochs; non-finite targets are counted and reported, not averaged into NaN;
float64 inputs (numpy's default) are cast to the model's dtype, as in training, with one note.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from hybridnb.torch_state import evaluating
from hybridnb.train.interrupt import stop_asked
from hybridnb.train.losses import ReweightedHuber
from hybridnb.train.metrics import classification_metrics, regression_metrics
from hybridnb.train.state import Stop


@torch.no_grad()
def predict_here(loop, loader, with_targets: bool, phase: str = "evaluate") -> tuple:
    """Predictions (N,) or (N, k), targets (or None), the mean loss over finite targets, and
    the number of samples whose targets are non-finite, with the run's model (the EMA's while
    fitting): a stop asked (Ctrl-C, Stop) ends a long validation within one batch."""
    placement, in_fit = loop.placement, loop.fitting
    placement.place([loader])
    strategy, precision, loss_fn = placement.strategy, placement.precision, loop.learner.loss_fn
    if isinstance(loss_fn, ReweightedHuber) and loss_fn.reweighting:
        loss_fn = ReweightedHuber(loss_fn.delta)  # without training-only reweighting
    model = loop.learner.eval_model(in_fit)
    preds, targets, loss_sum, n, bad = [], [], 0.0, 0, 0
    with evaluating(model):  # each module's own training flag back after
        for batch in loader:
            loop.heartbeat.beat(phase)
            asked = (in_fit or loop.heartbeat.channel is not None) and \
                stop_asked(loop) not in (None, Stop.CALLBACK)
            if strategy.agree(asked):
                raise KeyboardInterrupt  # on every rank, before the same batch
            x = loop.batch_check.cast(batch[0] if isinstance(batch, (tuple, list)) else batch)
            with precision.autocast():
                out = model(strategy.to_device(x))
            if with_targets and isinstance(batch, (tuple, list)) and len(batch) > 1:
                y = strategy.to_device(batch[1])
                keep = torch.isfinite(y.reshape(len(y), -1)).all(dim=1)  # any dtype
                kept = int(keep.sum())
                bad += len(y) - kept
                if kept:
                    loss_sum += float(loss_fn(out[keep], y[keep])) * kept
                    n += kept
                targets.append(strategy.gather(y.float().reshape(len(x), -1)).cpu())
            preds.append(strategy.gather(out.float().reshape(len(x), -1)).cpu())
    if not preds:
        raise ValueError("no batches to predict on (empty data)")
    pred = _squeeze(torch.cat(preds).numpy())
    target = _squeeze(torch.cat(targets).numpy()) if targets else None
    loss_sum, n, bad = strategy.sum([loss_sum, float(n), float(bad)])  # over every rank
    return pred, target, loss_sum / n if n else math.nan, int(bad)


def _squeeze(a: np.ndarray) -> np.ndarray:
    return a[:, 0] if a.shape[1] == 1 else a


def metrics(pred, target, loss, bad, task: str = "regression") -> dict:
    """Loss and the task's metrics from ``predict_here``'s output (regression: rmse, nrmse,
    mae, r2; classification: accuracy, balanced_accuracy); targets that are not finite are
    left out and counted (``nonfinite_targets``)."""
    out = {"loss": loss}
    if bad:
        out["nonfinite_targets"] = bad
    if target is None:
        return out
    keep = np.isfinite(target)  # classification: whole rows (a sample's class probabilities)
    if task == "classification":
        keep = keep.reshape(len(target), -1).all(axis=1)
        if pred.ndim == 2 and keep.any():
            out.update(classification_metrics(target[keep], pred[keep]))
    elif target.dtype.kind == "f" and pred.size == target.size and keep.any():
        out.update(regression_metrics(target[keep], pred.reshape(target.shape)[keep]))
    return out


def as_output(pred: np.ndarray, task: str, output: str | None) -> np.ndarray:
    """``predict``'s answer: ``"raw"`` the model's outputs; ``"labels"`` the class of each
    sample (argmax, int64); ``"probs"`` the softmax over classes. ``None``: labels for a
    classification loss, raw outputs for regression."""
    if output not in (None, "raw", "labels", "probs"):
        raise ValueError(f"output={output!r}: use 'labels', 'probs', 'raw' (or None: labels "
                         "when classifying, raw outputs otherwise)")
    if output is None:
        output = "labels" if task == "classification" else "raw"
    if output == "raw":
        return pred
    if pred.ndim != 2:
        raise ValueError(f"output={output!r} needs one output per class; the model gives one "
                         "value per sample (a regression): use output='raw'")
    if output == "labels":
        return pred.argmax(axis=1)
    shifted = np.exp(pred - pred.max(axis=1, keepdims=True))
    return (shifted / shifted.sum(axis=1, keepdims=True)).astype(pred.dtype)
