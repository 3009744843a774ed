"""A fit's data handles: the loaders it opened, the train loader's generator (whose state a
checkpoint holds), the DataLoader options in force, and the fit's plan read off the train loader.
They live here, not in the run state (which is data only)."""

from __future__ import annotations

import math

from hybridnb.env import quick
from hybridnb.train.data import make_loader, plan_epochs
from hybridnb.train.state import Plan


class Loaders:
    """The loaders of the fit in progress and the options new ones are made with."""

    def __init__(self, loader_kwargs: dict) -> None:
        self.kwargs = dict(loader_kwargs)
        self.opened: list = []
        self.generator = None  # the train loader's

    def make(self, data, settings, strategy, *, shuffle: bool, what: str, note):
        """Batches of ``data`` (``note`` hears the loader's notes)."""
        return make_loader(data, batch_size=settings.batch_size, shuffle=shuffle, what=what,
                           seed=settings.seed, strategy=strategy, loader_kwargs=self.kwargs,
                           note=note)

    def open(self, train, val, settings, strategy, note) -> tuple:
        """This fit's train and validation loaders (``val`` may be None) and its plan."""
        train_loader = self.make(train, settings, strategy, shuffle=True, what="train", note=note)
        val_loader = None if val is None else self.make(val, settings, strategy, shuffle=False,
                                                        what="val", note=note)
        self.opened = [ld for ld in (train_loader, val_loader) if ld is not None]
        self.generator = getattr(train_loader, "generator", None)
        return train_loader, val_loader, plan(train_loader, settings, note)

    def on_cpu(self) -> None:
        """The device is lost: the loaders made from now on pin no memory."""
        self.kwargs["pin_memory"] = False


def plan(train_loader, settings, note=lambda kind, message: None) -> Plan:
    """Epochs, batches and optimizer steps of a fit on ``train_loader`` (``steps_per_epoch``,
    ``grad_accum`` and quick mode's caps applied; ``note`` hears quick mode's cap)."""
    epochs, batches, said = plan_epochs(train_loader, settings.epochs, settings.steps_per_epoch,
                                        settings.grad_accum, quick())
    if said:
        note("quick", said)
    steps = math.ceil(batches / settings.grad_accum)
    return Plan(epochs, batches, steps, epochs * steps)
