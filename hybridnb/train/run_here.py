"""The runner that runs the Loop in this process (the kernel without isolation)."""

from __future__ import annotations


class Here:
    """Fit, evaluate and predict here: the Trainer's Loop runs in this process."""

    name = "here"

    def fit(self, trainer, train, val, train_loader, val_loader, early=None) -> None:
        trainer.loop.fit(train_loader, val_loader)

    def job(self, trainer, what: str, job_type, *args) -> tuple[bool, object]:
        """Nothing runs elsewhere: (False, None), the caller does it here."""
        return False, None
