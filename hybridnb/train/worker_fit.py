"""``Trainer.fit`` in an isolated worker: the job the worker receives, the view it draws through
the kernel, and the worker's exception rebuilt in the kernel.

The kernel (the notebook's process) never touches the GPU. It hands the worker a ``FitJob``: the
run's settings (resolved, so the worker never detects again), the model, the data as the user
gave it, the start state (``Trainer.state_dict()``) and the notes not yet said. The worker builds
the same Trainer from them and runs the ordinary loop; its live view is a ``ChannelView`` that
sends every call to the kernel, where the real renderer draws it (the Stop button keeps working);
at every snapshot and checkpoint it sends its state. How the kernel answers the worker's end is
the Trainer's (``trainer.py``): the final state is loaded into the user's model; a death or hang
continues on the CPU from the last state received (the start state when none came).
"""

from __future__ import annotations

import builtins
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

import torch

from hybridnb.env import FAULT_ENV, SIMULATE_CUDA_ENV
from hybridnb.train.settings import Settings

# The phases an isolated worker names in its heartbeats (a lost worker's event names the last)
PHASES = ("setup", "first step", "step", "validation", "checkpoint", "hand-over", "evaluate")


@dataclass
class FitJob:
    """What an isolated worker needs to run a fit (or, with ``predict``, an evaluation)."""

    settings: Settings
    model: torch.nn.Module
    train: Any = None
    val: Any = None
    start: dict | None = None
    notes: list | None = None
    py_random: Any = None
    predict: tuple | None = None   # (data, with_targets): evaluate/predict instead of fit
    find_batch: tuple | None = None  # (dataset, kwargs): find_batch_size instead of fit
    sent_at: float | None = None   # time.monotonic() when the kernel handed it to a prestarted
    #                                worker (its start-up note compares it with its own times)
    lr_find: tuple | None = None  # (data, kwargs): lr_find instead of fit


class Faults:
    """Fault injection for tests of the safety net: ``HYBRIDNB_FAULT="phase:kind[:n]"`` makes the
    worker die (kind ``kill``: SIGKILL, ``abort``: SIGABRT as a crashing driver does) or hang
    (``hang``) the ``n``-th time (default 1) it enters ``phase`` (one of ``PHASES``). Read in
    isolated workers only; the kernel never injects."""

    def __init__(self, spec: str | None = None) -> None:
        spec = os.environ.get(FAULT_ENV, "") if spec is None else spec
        parts = spec.split(":") if spec else []
        self.phase = parts[0] if parts else None
        self.kind = parts[1] if len(parts) > 1 else "kill"
        self.at = int(parts[2]) if len(parts) > 2 else 1
        if self.phase is not None and (self.phase not in PHASES
                                       or self.kind not in ("kill", "abort", "hang")):
            raise ValueError(f"{FAULT_ENV}={spec!r}: use phase:kind[:n] with a phase in {PHASES} "
                             "and a kind in kill|abort|hang")
        self.seen = 0

    def enter(self, phase: str) -> None:
        if phase != self.phase:
            return
        self.seen += 1
        if self.seen != self.at:
            return
        if self.kind == "hang":
            time.sleep(3600)
        signal.raise_signal(signal.SIGKILL if self.kind == "kill" else signal.SIGABRT)


def simulate_cuda(settings: Settings) -> tuple[Settings, str | None]:
    """A test seam: with ``HYBRIDNB_SIMULATE_CUDA=1`` an isolated worker given a CUDA run trains
    it on the CPU in fp32 (no pinned memory) and says so; the kernel still believes its device
    is CUDA. Tests arm tripwires on every CUDA entry point in the kernel and run fit, evaluate,
    predict and find_batch_size isolated without a GPU (tests/test_fault_phases.py). Read in
    isolated workers only; without the variable the settings are returned as they are."""
    if os.environ.get(SIMULATE_CUDA_ENV, "") != "1" or not settings.device.startswith("cuda"):
        return settings, None
    loader = {**settings.loader_kwargs, "pin_memory": False}
    note = (f"{SIMULATE_CUDA_ENV}=1: this worker runs the {settings.device} run on the CPU in "
            "fp32 (a test of the kernel's side)")
    return settings.replace(device="cpu", precision="fp32", loader_kwargs=loader), note


class ChannelView:
    """The worker's live view: each call is sent to the kernel, which draws it."""

    def __init__(self, channel) -> None:
        self.channel = channel

    def start(self, run: dict) -> None:
        self.channel.send("view", ("start", run))

    def update(self, row: dict) -> None:
        self.channel.send("view", ("update", row))

    def event(self, ev) -> None:
        self.channel.send("view", ("event", ev))

    def end(self, summary: dict) -> None:
        self.channel.send("view", ("end", summary))
        self.channel.flush()

    @property
    def stop_requested(self) -> bool:
        return self.channel.stop_requested()


class KernelView:
    """The kernel's side: draws what the worker's ``ChannelView`` sent, and knows whether the
    worker started the view (a worker lost before that leaves it to the kernel). The worker's
    ``end`` is held until its final state arrived (``finish``): a worker lost during the
    hand-over leaves the view open for the run to continue here."""

    def __init__(self, view) -> None:
        self.view, self.started, self.summary = view, False, None

    def on_message(self, message) -> None:
        if message.kind == "view":
            method, arg = message.payload
            if method == "start":
                self.started = True
            if method == "end":
                self.summary = arg
                return
            getattr(self.view, method)(arg)

    def finish(self) -> None:
        """The worker's fit arrived whole: close the view with its summary."""
        if self.summary is not None:
            self.view.end(self.summary)


class WorkerError(Exception):
    """The traceback of an error raised in the isolated worker (the cause of the re-raise)."""


def reraise(error: dict) -> BaseException:
    """The worker's exception, rebuilt in the kernel with the same type and message when it is
    a builtin one (a RuntimeError otherwise), its traceback as the cause."""
    cls = getattr(builtins, error.get("type", ""), None)
    message = error.get("message", "")
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        cls, message = RuntimeError, f"{error.get('type')}: {message}"
    exc = cls(f"{message} (raised in the isolated training worker)")
    exc.__cause__ = WorkerError(error.get("traceback", ""))
    return exc
