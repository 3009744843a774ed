"""Regression metrics: RMSE, nRMSE (= RMSE / population std of the targets, a generic normalised
score), MAE and R²."""

from __future__ import annotations

import math

import numpy as np


def regression_metrics(y_true, y_pred) -> dict[str, float]:
    """Metrics over flattened arrays; nRMSE and R² are NaN when the targets are constant."""
    y = np.asarray(y_true, dtype=np.float64).reshape(-1)
    p = np.asarray(y_pred, dtype=np.float64).reshape(-1)
    if y.shape != p.shape:
        raise ValueError(f"y_true has {y.size} values but y_pred has {p.size}")
    if y.size == 0:
        raise ValueError("no samples to score (empty data)")
    err = p - y
    rmse = math.sqrt(float(np.mean(err ** 2)))
    std = float(np.std(y))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    return {
        "rmse": rmse,
        "nrmse": rmse / std if std > 0 else math.nan,
        "mae": float(np.mean(np.abs(err))),
        "r2": 1.0 - float(np.sum(err ** 2)) / ss_tot if ss_tot > 0 else math.nan,
    }


def higher_is_better(metric: str) -> bool:
    """Whether a larger value of ``metric`` (e.g. ``"val_r2"``) is an improvement."""
    return metric.removeprefix("val_") in ("r2", "accuracy", "acc")
