"""Metrics: regression (RMSE, nRMSE = RMSE / population std of the targets, a generic normalised
score, MAE, R²) and classification (accuracy, balanced accuracy = the mean of the per-class
recalls over the classes present in the targets, as scikit-learn computes it)."""

from __future__ import annotations

import math

import numpy as np

HIGHER_IS_BETTER = ("r2", "accuracy", "acc", "balanced_accuracy")


def regression_metrics(y_true, y_pred) -> dict[str, float]:
    """Metrics over flattened arrays of as many values (at least one; ``evaluation.metrics``
    pairs them); nRMSE and R² are NaN when the targets are constant."""
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
    return metric.removeprefix("val_") in HIGHER_IS_BETTER
