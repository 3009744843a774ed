"""The runner that runs the Loop in this process (the kernel without isolation)."""

from __future__ import annotations


class Here:
    """Fit here: the Trainer's Loop runs in this process (evaluate, predict and the searches
    after it too: ``Trainer._elsewhere`` asks a runner only while isolated)."""

    name = "here"

    def fit(self, trainer, train, val, train_loader, val_loader, early=None) -> None:
        trainer.loop.fit(train_loader, val_loader)
