"""``Trainer.fit`` in an isolated worker: the job the worker receives, the view it draws through
the kernel, and the worker's exception rebuilt in the kernel.

The kernel (the notebook's process) never touches the GPU. It hands the worker a ``FitJob``: the
run's settings (resolved, so the worker never detects again), the model, the data as the user
gave it, the start state (``Trainer.state_dict()``) and the notes not yet said. The worker builds
the same Trainer from them and runs the same Loop; its live view is a ``ChannelView`` that sends
every call to the kernel, where ``KernelView`` emits it again on the kernel's bus (the renderer,
loggers and callbacks listen there; the Stop button keeps working); at every snapshot and
checkpoint it sends its state, and whatever ends its fit early (an error, Ctrl-C) it sends the
state it holds then, before the error. The kernel applies each state as it arrives, so it always
holds what an in-process run would. How the kernel answers the worker's end is the worker
runner's (``run_worker.py``): the final state is loaded into the user's model; an error is
re-raised (after its state was applied); a death or hang continues on the CPU from the last
state received (the start state when none came).
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Any

import torch

from hybridnb.events import row_kind
from hybridnb.train.bus import Ended, EpochEnded, Started, StepEnded, Validated
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
    hooks: tuple = ()  # the kernel's ``job_hooks`` when the job was made (tests)

    def __post_init__(self) -> None:
        if not self.hooks:
            self.hooks = tuple(job_hooks)


# Hooks every job carries to its worker (tests register theirs here: fault injection, a worker
# that simulates CUDA on the CPU). Nothing in hybridnb registers one.
job_hooks: list = []


class Hooks:
    """The job's hooks, called in the worker, each method optional: ``settings(settings)`` ->
    ``(settings, (kind, message) or None)`` before the worker builds its Trainer (the note is
    said as an event; the kernel's run keeps its own device), and ``enter(phase)`` as the
    worker enters each of ``PHASES``."""

    def __init__(self, hooks=()) -> None:
        self.hooks = tuple(hooks)

    def settings(self, settings: Settings) -> tuple[Settings, list[tuple[str, str]]]:
        notes = []
        for hook in self.hooks:
            if hasattr(hook, "settings"):
                settings, note = hook.settings(settings)
                if note:
                    notes.append(tuple(note))
        return settings, notes

    def enter(self, phase: str) -> None:
        for hook in self.hooks:
            if hasattr(hook, "enter"):
                hook.enter(phase)


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
    """The kernel's side: what the worker's ``ChannelView`` sent, emitted again on the kernel's
    bus (its typed rows as ``StepEnded`` / ``Validated`` / ``EpochEnded``, its notes as
    ``Event``), so the kernel's view, loggers and callbacks hear an isolated fit as they hear
    one in process. It knows whether the worker started the view (a worker lost before that
    leaves it to the kernel); the worker's ``end`` is held until its final state arrived
    (``finish``): a worker lost during the hand-over leaves the view open for the run to
    continue here."""

    def __init__(self, bus, history) -> None:
        """``history()``: the kernel's epoch rows (its state, applied as each one arrived)."""
        self.bus, self.history, self.started, self.summary = bus, history, False, None

    def on_message(self, message) -> None:
        if message.kind != "view":
            return
        method, arg = message.payload
        if method == "start":
            self.started = True
            self.bus.emit(Started(arg))
        elif method == "end":
            self.summary = arg
        elif method == "event":
            self.bus.emit(arg)
        elif method == "update":
            self.bus.emit(row_event(arg, self.history()))

    def finish(self) -> None:
        """The worker's fit arrived whole: close the view with its summary."""
        if self.summary is not None:
            self.bus.emit(Ended(self.summary))


def row_event(row: dict, history: list):
    """The bus event a row drawn in the worker stands for (its kind is its type's)."""
    kind = row_kind(row)
    if kind == "epoch":
        return EpochEnded(row["epoch"], row["global_step"], history, row)
    if kind == "validation":
        return Validated(row["global_step"], {k: v for k, v in row.items()
                                              if k.startswith("val_")}, row)
    return StepEnded(row["global_step"], row["epoch"], row.get("loss"), row.get("lr"), row)


class WorkerError(Exception):
    """The traceback of an error raised in the isolated worker (the cause of the re-raise)."""


def reraise(error: dict) -> BaseException:
    """The worker's exception, rebuilt in the kernel with the same type and message when it is
    a builtin one or a KeyboardInterrupt (a RuntimeError otherwise), its traceback as the
    cause."""
    cls = getattr(builtins, error.get("type", ""), None)
    message = error.get("message", "")
    if not (isinstance(cls, type) and issubclass(cls, (Exception, KeyboardInterrupt))):
        cls, message = RuntimeError, f"{error.get('type')}: {message}"
    exc = cls(f"{message} (raised in the isolated training worker)")
    exc.__cause__ = WorkerError(error.get("traceback", ""))
    return exc
