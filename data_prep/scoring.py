"""The challenge's metrics: nRMSE per challenge and the overall score (lower is better).

nRMSE = RMSE / population std of the true values (``numpy.std``, ddof=0), as the organisers'
local scoring computes it; predicting the test mean scores exactly 1.0. Overall =
0.3 × C1 + 0.7 × C2 (reference §4; checked against the final leaderboard in the tests).
"""

from __future__ import annotations

import numpy as np

WEIGHTS = (0.3, 0.7)


def rmse(y_true, y_pred) -> float:
    y_true, y_pred = _pair(y_true, y_pred)
    return float(np.sqrt(np.mean((y_true - y_pred) ** 2)))


def nrmse(y_true, y_pred) -> float:
    """RMSE divided by the population standard deviation of ``y_true``."""
    y_true, y_pred = _pair(y_true, y_pred)
    sd = float(np.std(y_true))
    if sd == 0:
        raise ValueError("nrmse: y_true is constant (std 0); the score is undefined")
    return float(np.sqrt(np.mean((y_true - y_pred) ** 2)) / sd)


def overall(c1: float, c2: float) -> float:
    """The challenge's overall score, 0.3 × C1 + 0.7 × C2, rounded to 5 decimals as published."""
    return round(WEIGHTS[0] * float(c1) + WEIGHTS[1] * float(c2), 5)


def _pair(y_true, y_pred) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(y_true, float).reshape(-1)
    b = np.asarray(y_pred, float).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"y_true has {a.size} values but y_pred has {b.size}")
    if a.size == 0:
        raise ValueError("no values to score")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("y_true / y_pred hold NaN or infinite values")
    return a, b
