"""What a fit opens before its first step: its loaders (handles, kept here and not in the run
state, which is data only), its plan, a fresh or resumed run state with the schedule bound to it,
and the run's description for the view's header."""

from __future__ import annotations

import math
import os

from hybridnb.env import quick
from hybridnb.train.data import make_loader, plan_epochs
from hybridnb.train.seeding import seed_everything
from hybridnb.train.state import Plan, RunState


class Loaders:
    """The loaders of the fit in progress, the train loader's generator (whose state a
    checkpoint holds) and the DataLoader options new loaders are made with."""

    def __init__(self, loader_kwargs: dict) -> None:
        self.kwargs = dict(loader_kwargs)
        self.opened: list = []
        self.generator = None

    def make(self, data, settings, strategy, *, shuffle: bool, what: str, bus):
        """Batches of ``data`` (the loader's notes said on ``bus``)."""
        return make_loader(data, batch_size=settings.batch_size, shuffle=shuffle, what=what,
                           seed=settings.seed, strategy=strategy, loader_kwargs=self.kwargs,
                           bus=bus)

    def open(self, train, val, settings, strategy, bus) -> tuple:
        """This fit's train and validation loaders (``val`` may be None) and its plan."""
        train_loader = self.make(train, settings, strategy, shuffle=True, what="train", bus=bus)
        val_loader = None if val is None else self.make(val, settings, strategy, shuffle=False,
                                                        what="val", bus=bus)
        self.opened = [ld for ld in (train_loader, val_loader) if ld is not None]
        self.generator = getattr(train_loader, "generator", None)
        return train_loader, val_loader, plan(train_loader, settings, bus)

    def on_cpu(self) -> None:
        """The device is lost: the loaders made from now on pin no memory."""
        self.kwargs["pin_memory"] = False


def plan(train_loader, settings, bus=None) -> Plan:
    """Epochs, batches and optimizer steps of a fit on ``train_loader`` (``steps_per_epoch``,
    ``grad_accum`` and quick mode's caps applied; quick mode's cap said on ``bus``, if any)."""
    epochs, batches, said = plan_epochs(train_loader, settings.epochs, settings.steps_per_epoch,
                                        settings.grad_accum, quick())
    if said and bus is not None:
        bus.note("quick", said)
    steps = math.ceil(batches / settings.grad_accum)
    return Plan(epochs, batches, steps, epochs * steps)


def begin(loop, pending: dict | None) -> None:
    """A fresh run state on ``loop``: ``pending`` (a checkpoint to continue from) or a seeded
    start; the schedule bound to its plan."""
    loop.state = RunState.fresh(loop.state.events, carry=loop.state)
    if loop.learner.guard is not None:
        loop.learner.guard.reset()  # a resumed run loads the checkpoint's guard below
    if pending is not None:
        loop.load_state_dict(pending)
    elif loop.settings.seed is not None:
        seed_everything(loop.settings.seed)
    bind_schedule(loop.learner.schedule, loop.state.plan, loop.bus)


def bind_schedule(schedule, plan: Plan, bus) -> None:
    """The schedule told the run's optimizer steps (a factory builds its scheduler now: an
    error before the first step); a resumed fit's replaced scheduler is said once."""
    schedule.bind(plan.total_steps)
    if getattr(schedule, "replaced", None):
        bus.note("schedule", schedule.replaced)


def run_info(plan: Plan, settings, placement, model) -> dict:
    """The run's description for the view's header."""
    applied = placement.applied_speedups
    return {"epochs": plan.epochs, "steps_per_epoch": plan.steps_per_epoch,
            "batch_size": settings.batch_size, "grad_accum": settings.grad_accum,
            "chosen": settings.chosen(placement.precision.name,
                                      tuple(applied.applied) if applied is not None else ()),
            "total_steps": plan.total_steps, "device": str(placement.device),
            "precision": placement.precision.name, "model": type(model).__name__,
            "n_params": sum(p.numel() for p in model.parameters()),
            "monitor": settings.monitor, "quick": quick(), "pid": os.getpid(),
            "metric": "val_accuracy" if settings.task == "classification" else None}
