"""The worker's side of an isolated fit (run_worker.py: the kernel's).

A spawned worker gets one job: a ``FitJob`` (the resolved settings, so the worker never detects
again), or after a fit a ``LoopJob`` (predict, lr_find, find_batch_size). It builds the same Loop
over fresh parts (``parts.build_loop``, no Trainer) and runs it; whatever ends its fit early, it
sends the state it holds then, before the error.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hybridnb.processes.worker import startup as worker_startup
from hybridnb.train import opening, outside_state, saved
from hybridnb.train.evaluation import predict_here
from hybridnb.train.heap import frozen_heap
from hybridnb.train.parts import build_loop
from hybridnb.train.settings import Settings
from hybridnb.train.state import Stop


def work(job, channel) -> object:
    """In the isolated worker: ``job.run(channel)`` (the function the kernel sends)."""
    return job.run(channel)


def worker_loop(settings: Settings, model: torch.nn.Module, channel):
    """The Loop for ``settings`` in this worker, its bus linked to the kernel."""
    with frozen_heap():  # building the optimizer imports torch._dynamo (heap.py)
        loop = build_loop(model, settings, channel)
    loop.placement.place([])  # the kernel's never is
    loop.placement.build_step(loop)
    return loop


@dataclass
class FitResult:
    """A worker fit's final state (CPU), why it stopped early (or None), what it decided and
    measured (``Placement.facts()``) and what it changed outside the state dict."""

    state: dict
    stopped: Stop | None
    placement: dict
    outside_state: dict | None


@dataclass
class FitJob:
    """A fit from ``start`` (``Trainer.state_dict()``), the notes not yet said first."""

    settings: Settings
    model: torch.nn.Module
    train: Any
    val: Any
    start: dict
    notes: list
    py_random: Any
    sent_at: float  # time.monotonic() when the kernel handed it over (the start-up note)

    def run(self, channel) -> FitResult:
        watch = outside_state.Fingerprint(self.model)  # the model as the kernel sent it
        loop = worker_loop(self.settings, self.model, channel)
        heartbeat = loop.heartbeat
        loop.bus.pending = list(self.notes)  # the kernel's notes: its set-up is the same
        began = worker_startup()  # the kernel's clock too: how long the fit waited for this
        if {"spawned_at", "ready_at"} <= set(began):
            spawned, ready = began["spawned_at"], began["ready_at"]
            loop.bus.note("worker_start", f"worker process ready {ready - spawned:.1f} s after "
                          "it started (a fresh interpreter importing torch), started "
                          f"{self.sent_at - spawned:.1f} s before the job came: the fit waited "
                          f"{max(0.0, ready - self.sent_at):.1f} s for it")
        heartbeat.beat("setup")  # the job arrived: alive (its faults come later)
        loop.stop_flag = lambda: heartbeat.stop_asked() is Stop.CALLBACK
        random.setstate(self.py_random)
        train_loader, val_loader = opening.open_loaders(loop, self.train, self.val)
        opening.begin(loop, self.start)  # as the kernel's fit began: its state, resumed here
        try:
            loop.fit(train_loader, val_loader)
        except BaseException:  # whatever ended it: the state held now first, then the error
            with contextlib.suppress(Exception):  # best effort: the pipe may be gone
                channel.state(saved.state_dict(loop))
            raise
        heartbeat.beat("hand-over")
        return FitResult(saved.state_dict(loop), loop.state.stopped,
                         loop.placement.facts(), watch.changes())


@dataclass
class LoopJob:
    """``fn(loop, *args, **kwargs)`` on the worker's Loop after a fit (``predict``, lr_find,
    find_batch_size); the notes of its set-up were said by the kernel already."""

    settings: Settings
    model: torch.nn.Module
    fn: Callable
    args: tuple
    kwargs: dict

    def run(self, channel):
        loop = worker_loop(self.settings, self.model, channel)
        channel.heartbeat(phase="evaluate", grace=loop.heartbeat.grace(
            "the first batch", compiling=False, device_type=loop.placement.device.type))
        loop.bus.pending.clear()  # said by the kernel already
        return self.fn(loop, *self.args, **self.kwargs)


def predict(loop, data, with_targets: bool) -> tuple:
    """Predictions (and the targets, with ``with_targets``) on ``data`` with ``loop``'s model."""
    loader = opening.loader(loop, data, shuffle=False, what="data")
    return predict_here(loop, loader, with_targets)
