"""Which way a metric improves: one fact for the Trainer (early stopping, best checkpoint) and
the live view's summary (hybridnb.live may not import hybridnb.train)."""

from __future__ import annotations

HIGHER_IS_BETTER = ("r2", "accuracy", "acc", "balanced_accuracy")


def higher_is_better(metric: str) -> bool:
    """Whether a larger value of ``metric`` (e.g. ``"val_r2"``) is an improvement."""
    return metric.removeprefix("val_") in HIGHER_IS_BETTER
