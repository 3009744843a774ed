"""What a fit opens before its first step (its loaders, kept here as handles; its plan; a fresh or
resumed run state; the view's header) and ``fitting``: the set-up around the epochs and the end."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator

from hybridnb.env import quick
from hybridnb.failures import free_memory
from hybridnb.live import make_view
from hybridnb.train import saved, setup
from hybridnb.train.blocks import checkpointed_blocks
from hybridnb.train.bus import Started
from hybridnb.train.data import make_loader
from hybridnb.train.interrupt import GracefulInterrupt
from hybridnb.train.recovery import LossGuard
from hybridnb.train.seeding import seed_everything
from hybridnb.train.state import Plan, RunState
from hybridnb.train.validation import Validation

QUICK_EPOCHS, QUICK_STEPS = 2, 5  # quick mode (HYBRIDNB_QUICK): a fit capped to these


class CancelFit(Exception):
    """Raised by a bus listener to end the fit now, normally (fastai's ``CancelFitException``)."""


@contextlib.contextmanager
def fitting(loop, train_loader, view_started: bool) -> Iterator[None]:
    """Around a fit's epochs: its set-up (the view started unless ``view_started``) and, however
    it ends, ``saved.finish``."""
    s, placement = loop.settings, loop.placement
    grace = loop.heartbeat.grace("set-up and the first step", compiling=bool(placement.compile),
                                 device_type=placement.device.type)
    loop.heartbeat.beat("setup", grace=grace)
    placement.place(loop.loaders.opened)
    placement.speed_up(train_loader, s.batch_size, loop.state.plan.total_steps)
    loop.validation = Validation(loop)
    loop.restores = {}  # global step restored to -> how many times (saved.after_bad_steps)
    failed = True
    with GracefulInterrupt() as loop.interrupt, \
            checkpointed_blocks(loop.learner.model, s.grad_checkpointing, loop.bus), \
            setup.compile_settings(bool(placement.compile), placement.device,
                                   placement.precision):
        loop.placement.build_step(loop, compiled=bool(placement.compile))
        loop.checkpoints.keep(saved.state_dict(loop))
        loop.first_step = loop.state.global_step
        if not view_started:
            # an isolated worker's events are drawn by the kernel; ranks other than 0 draw nothing
            drawn = placement.strategy.is_main and loop.heartbeat.channel is None
            loop.progress.view = make_view(s.live if drawn else False)
            loop.bus.emit(Started(run_info(loop)))
        loop.bus.flush()
        loop.heartbeat.beat("first step", grace=grace)
        try:
            yield
            failed = False
        except CancelFit:
            failed = False
        finally:
            saved.finish(loop, failed)
            loop.interrupt = None  # a Ctrl-C that stopped fit does not also stop evaluate()
            loop.bus.open = False


class Loaders:
    """The loaders of the fit in progress, the train loader's generator (whose state a
    checkpoint holds) and the DataLoader options new loaders are made with."""

    def __init__(self, loader_kwargs: dict) -> None:
        self.kwargs = dict(loader_kwargs)
        self.opened: list = []
        self.generator = None


def loader(loop, data, *, shuffle: bool, what: str, bus=None):
    """Batches of ``data`` for ``loop`` (the loader's notes said on ``bus``, else the loop's)."""
    s = loop.settings
    return make_loader(data, batch_size=s.batch_size, shuffle=shuffle, what=what, seed=s.seed,
                       strategy=loop.placement.strategy, loader_kwargs=loop.loaders.kwargs,
                       bus=bus or loop.bus)


def open_loaders(loop, train, val) -> tuple:
    """This fit's train and validation loaders (``val`` may be None); its plan on the run state."""
    train_loader = loader(loop, train, shuffle=True, what="train")
    val_loader = None if val is None else loader(loop, val, shuffle=False, what="val")
    loop.loaders.opened = [ld for ld in (train_loader, val_loader) if ld is not None]
    loop.loaders.generator = getattr(train_loader, "generator", None)
    loop.state.plan = plan(train_loader, loop.settings, loop.bus)
    return train_loader, val_loader


def plan(train_loader, settings, bus=None) -> Plan:
    """Epochs, batches and optimizer steps of a fit on ``train_loader`` (``steps_per_epoch``,
    ``grad_accum`` and quick mode's caps applied; quick mode's cap said on ``bus``, if any)."""
    accum, per_epoch, epochs = settings.grad_accum, settings.steps_per_epoch, settings.epochs
    try:
        batches = len(train_loader)
    except TypeError:
        if not per_epoch:
            kind = type(getattr(train_loader, "dataset", train_loader)).__name__
            raise TypeError(f"the training data ({kind}) has no length, so an epoch has no "
                            "end: pass steps_per_epoch= (the optimizer steps each epoch reads; "
                            "fewer when the stream ends first), or give it a __len__") from None
        batches = per_epoch * accum
    if batches == 0:
        raise ValueError("the training data gives no batches")
    if per_epoch:
        batches = min(batches, per_epoch * accum)
    capped = min(epochs, QUICK_EPOCHS), min(batches, QUICK_STEPS * accum)
    if quick() and capped != (epochs, batches):
        if bus is not None:
            bus.note("quick", f"quick mode (HYBRIDNB_QUICK): {capped[0]} epochs of at most "
                     f"{QUICK_STEPS} steps instead of {epochs} x {math.ceil(batches / accum)}")
        epochs, batches = capped
    steps = math.ceil(batches / accum)
    return Plan(epochs, batches, steps, epochs * steps)


def begin(loop, pending: dict | None) -> None:
    """A fresh run state on ``loop``: ``pending`` (a checkpoint to continue from) or a seeded
    start; the schedule bound to its plan (a factory's error comes before the first step)."""
    loop.state = RunState.fresh(loop.state.events, plan=loop.state.plan)
    if loop.learner.guard is not None:
        loop.learner.guard.reset()  # a resumed run loads the checkpoint's guard below
    if pending is not None:
        saved.load(loop, pending)
    elif loop.settings.seed is not None:
        seed_everything(loop.settings.seed)
    schedule = loop.learner.schedule
    schedule.bind(loop.state.plan.total_steps)  # a factory builds its scheduler now
    if getattr(schedule, "replaced", None):  # a resumed fit's replaced scheduler, said once
        loop.bus.note("schedule", schedule.replaced)


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


@contextlib.contextmanager
def trial(loop, loader, plan: Plan, listener, schedule,
          recover_oom: bool = False) -> Iterator[None]:
    """The Loop set up for a trial fit on ``loader`` (lr_find's sweep, find_batch_size's probe),
    then back as it was (a device lost meanwhile stays lost). ``recover_oom`` (the probe, whose
    signal is an out-of-memory error): a lost device ends its search whatever ``on_gpu_error``."""
    start = saved.state_dict(loop)
    placement, learner = loop.placement, loop.learner
    own = loop.settings, loop.state, loop.stop_flag, loop.loaders.opened, \
        loop.loaders.generator, learner.schedule, learner.guard, learner.ema
    loop.settings = loop.settings.replace(
        grad_accum=1, schedule=None, val_every=None, checkpoint_every=None, snapshot_every=None,
        checkpoint_dir=None, early_stopping=None,
        on_gpu_error="recover" if recover_oom else loop.settings.on_gpu_error)
    loop.state = RunState.fresh(loop.state.events)  # the events said go on in the trainer's
    loop.state.plan = plan
    loop.stop_flag = lambda: False
    loop.loaders.opened, loop.loaders.generator = [loader], getattr(loader, "generator", None)
    learner.schedule, learner.ema = schedule, None
    learner.guard = LossGuard(spike=0.0, lr_cut=1.0, patience=plan.total_steps + 1)  # skips NaN/inf
    loop.bus.subscribe(listener)
    try:
        yield
    finally:
        loop.bus.listeners.remove(listener)
        loop.settings, loop.state, loop.stop_flag, loop.loaders.opened, loop.loaders.generator, \
            learner.schedule, learner.guard, learner.ema = own
        saved.rewind(loop, start)  # gradients cleared too (Learner.load_state_dict)
        loop.placement.build_step(loop)  # the trainer's own guard, EMA and on_gpu_error again
        free_memory(placement.device)
