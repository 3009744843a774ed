"""Evaluation and prediction: the model in eval mode over a loader, gathered across ranks, and
the metrics: regression (RMSE, nRMSE = RMSE / population std of the targets, a generic normalised
score, MAE, R²) and classification (accuracy, balanced accuracy = the mean of the per-class
recalls over the classes present in the targets, as scikit-learn computes it).

Validation scores with the loss without training-only reweighting, so validation losses stay
comparable between epochs; non-finite targets are counted and reported, not averaged into NaN.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from hybridnb.torch_state import evaluating
from hybridnb.train.interrupt import stop_asked
from hybridnb.train.losses import ReweightedHuber
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
    pred = torch.cat(preds).squeeze(1).numpy()  # (N, 1) -> (N,); (N, k) as it is
    target = torch.cat(targets).squeeze(1).numpy() if targets else None
    loss_sum, n, bad = strategy.sum([loss_sum, float(n), float(bad)])  # over every rank
    return pred, target, loss_sum / n if n else math.nan, int(bad)


def metrics(pred, target, loss, bad, task: str = "regression") -> dict:
    """Loss and the task's metrics (below) from ``predict_here``'s output, with the
    count of non-finite targets (``nonfinite_targets``) when there are any."""
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
    """``Trainer.predict``'s answer in the form ``output`` names (see its docstring)."""
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
    return torch.softmax(torch.tensor(pred), dim=1).numpy()


def regression_metrics(y_true, y_pred) -> dict[str, float]:
    """Metrics over flattened arrays of as many values (at least one; ``metrics`` pairs
    them); nRMSE and R² are NaN when the targets are constant."""
    y = np.asarray(y_true, dtype=np.float64).reshape(-1)
    p = np.asarray(y_pred, dtype=np.float64).reshape(-1)
    err = p - y
    rmse = math.sqrt(float(np.mean(err ** 2)))
    std = float(np.std(y))
    nrmse = rmse / std if std > 0 else math.nan
    return {
        "rmse": rmse,
        "nrmse": nrmse,
        "mae": float(np.mean(np.abs(err))),
        "r2": 1.0 - nrmse ** 2,  # 1 - SS_res / SS_tot: MSE / the targets' variance
    }


def classification_metrics(y_true, logits) -> dict[str, float]:
    """Accuracy and balanced accuracy of ``logits`` (N, C) (the predicted class is the argmax)
    against class indices ``y_true`` (N,), or class probabilities (N, C) (their argmax)."""
    scores = np.asarray(logits, dtype=np.float64)
    y = np.asarray(y_true)
    if y.ndim == 2 and y.shape == scores.shape:
        y = y.argmax(axis=1)
    y = y.reshape(-1).astype(np.int64)
    hit = scores.argmax(axis=1) == y
    recalls = [float(hit[y == c].mean()) for c in np.unique(y)]
    return {"accuracy": float(hit.mean()), "balanced_accuracy": float(np.mean(recalls))}


def higher_is_better(metric: str) -> bool:
    """Whether a larger value of ``metric`` (e.g. ``"val_r2"``) is an improvement."""
    return metric.removeprefix("val_") in ("r2", "accuracy", "acc", "balanced_accuracy")
