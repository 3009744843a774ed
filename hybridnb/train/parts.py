"""The Loop and the parts it runs over, built from one ``Settings``: the Trainer's, and an
isolated worker's (which builds no Trainer)."""

from __future__ import annotations

import torch

from hybridnb.events import Event
from hybridnb.train import loggers, setup
from hybridnb.train.bus import Bus
from hybridnb.train.checkpoint import Checkpoints
from hybridnb.train.data import BatchCheck
from hybridnb.train.heartbeat import Heartbeat
from hybridnb.train.learner import Learner
from hybridnb.train.loop import Loop
from hybridnb.train.placement import Placement
from hybridnb.train.progress import Progress
from hybridnb.train.settings import Settings
from hybridnb.train.target_scale import TargetScale


def build_loop(model: torch.nn.Module, settings: Settings, channel=None) -> Loop:
    """The Loop over fresh parts for ``settings`` (``detect()`` fills in what is left to it):
    the Trainer's, and an isolated worker's with ``channel``, its link to the kernel."""
    bus = Bus(lambda: (loop.state.global_step, loop.state.epoch))
    hw = None
    if settings.needs_detect:  # imported (the probe, its cache) only when an option needs it
        from hybridnb.hardware.detect import detect

        hw = detect()
    device = setup.resolve_device(settings.device, hw, bus)
    settings = settings.resolved(hw, device)
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    learner = Learner(model, settings)
    placement = Placement(settings, learner, bus)
    checkpoints = Checkpoints(
        settings.checkpoint_dir, placement.strategy.is_main, bus,
        log_patterns=loggers.patterns(settings.loggers)
        if settings.log_folder == settings.checkpoint_dir else ())
    target_scale = TargetScale(model, bus, enabled=not settings.compile,
                               loss=settings.loss, task=settings.task)
    batch_check = BatchCheck(learner.dtype, bus, first=lambda x, y: (
        learner.see_input(x), target_scale.targets(y)))
    heartbeat = Heartbeat(bus, channel)
    loop = Loop(settings, learner=learner, placement=placement, checkpoints=checkpoints,
                progress=Progress(), heartbeat=heartbeat, batch_check=batch_check, bus=bus)
    bus.subscribe(lambda event: loop.state.events.append(event)
                  if isinstance(event, Event) else None)
    bus.subscribe(loop.progress.hear)
    bus.subscribe(heartbeat.hear)
    return loop
