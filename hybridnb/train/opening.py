"""What a fit opens before its first step: its loaders (handles, kept here and not in the run
state, which is data only), its plan, a fresh or resumed run state with the schedule bound to it,
and the run's description for the view's header."""

from __future__ import annotations

import math
import os

from hybridnb.env import quick
from hybridnb.train import saved
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

    def on_cpu(self) -> None:
        """The device is lost: the loaders made from now on pin no memory."""
        self.kwargs["pin_memory"] = False


def loader(loop, data, *, shuffle: bool, what: str, bus=None):
    """Batches of ``data`` for ``loop`` (the loader's notes said on ``bus``, else the loop's)."""
    s = loop.settings
    return make_loader(data, batch_size=s.batch_size, shuffle=shuffle, what=what, seed=s.seed,
                       strategy=loop.placement.strategy, loader_kwargs=loop.loaders.kwargs,
                       bus=bus or loop.bus)


def open_loaders(loop, train, val) -> tuple:
    """This fit's train and validation loaders (``val`` may be None); its plan on the run
    state."""
    train_loader = loader(loop, train, shuffle=True, what="train")
    val_loader = None if val is None else loader(loop, val, shuffle=False, what="val")
    loop.loaders.opened = [ld for ld in (train_loader, val_loader) if ld is not None]
    loop.loaders.generator = getattr(train_loader, "generator", None)
    loop.state.plan = plan(train_loader, loop.settings, loop.bus)
    return train_loader, val_loader


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
        saved.load(loop, pending)
    elif loop.settings.seed is not None:
        seed_everything(loop.settings.seed)
    bind_schedule(loop.learner.schedule, loop.state.plan, loop.bus)


def bind_schedule(schedule, plan: Plan, bus) -> None:
    """The schedule told the run's optimizer steps (a factory builds its scheduler now: an
    error before the first step); a resumed fit's replaced scheduler is said once."""
    schedule.bind(plan.total_steps)
    if getattr(schedule, "replaced", None):
        bus.note("schedule", schedule.replaced)


def run_info(loop) -> dict:
    """The run's description for the view's header."""
    plan, settings, placement, model = loop.state.plan, loop.settings, loop.placement, \
        loop.learner.model
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
