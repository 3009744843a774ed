"""Isolated training: the steps run in a worker process that the kernel supervises, so whatever
the GPU does to the worker (an abort or segfault in a C++ thread, a sticky CUDA error, a kernel
launch that never returns) the kernel survives, with the last state the worker sent.

Here: whether to isolate, and the silence limit that follows the measured steps; starting,
watching and killing the worker is ``hybridnb.processes``'s. ``start="fork"`` (the default here)
is safe only while no CUDA context and no thread of the caller's holds a lock across the call;
the Trainer spawns.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from hybridnb import platform
from hybridnb.env import ISOLATED_ENV, LAUNCHED_ENV, current
from hybridnb.processes import child as _child
from hybridnb.processes.channel import Channel, Message
from hybridnb.processes.ended import ChildOutcome
from hybridnb.processes.supervise import ChildProgress, supervise

STEP_TIMEOUT_FLOOR_S = 120.0         # the automatic step timeout is never shorter than this
STEP_TIMEOUT_FACTOR = 20.0           # ... and at least this many median steps
START_GRACE_S = 120.0                # a worker's start-up, before it says "ready" (import torch)
# what a prestarted worker imports while it waits (building an optimizer imports torch._dynamo):
# nothing slow runs between the job arriving and its first step
PRELOAD = ("torch", "torch._dynamo", "psutil", "hybridnb.train.trainer")


def isolate_decision(isolate: bool | str, device: Any, *, in_distributed: bool
                     ) -> tuple[bool, str]:
    """Whether ``fit`` should run its steps in an isolated worker, and the reason in a sentence.
    ``"auto"``: on for CUDA/ROCm runs; off on the CPU, under torchrun / ``hn.launch`` (each rank
    is already a supervised process) and inside a worker. ``True`` isolates on the CPU too."""
    kind = str(device).split(":", 1)[0]
    if isolate is False:
        return False, "isolate=False: training in this process"
    if not platform.child_pipes():  # Windows
        return False, f"{platform.child_pipes().why}: training in this process"
    env = current()
    if env.get(ISOLATED_ENV):
        return False, "already inside an isolated worker: training in this process"
    if in_distributed or env.get(LAUNCHED_ENV) == "1" or "LOCAL_RANK" in env:
        return False, ("distributed run (torchrun or hn.launch): each rank is already a "
                       "supervised process, training in it without a second worker")
    if kind == "cpu":
        if isolate is True:
            return True, "isolate=True: training on the CPU in a supervised worker process"
        return False, "CPU run: training in this process (isolation guards accelerator runs)"
    if kind != "cuda":
        return False, (f"isolated training supports CUDA/ROCm devices, not {kind!r}: training "
                       "in this process")
    return True, ("training in a supervised worker process: a crash or hang of the GPU costs "
                  "the steps since the last good state, not the kernel")


def auto_step_timeout(step_seconds: list[float]) -> float:
    """max(floor, factor x the median step): generous, so only a real hang trips it."""
    median = statistics.median(step_seconds) if step_seconds else 0.0
    return max(STEP_TIMEOUT_FLOOR_S, STEP_TIMEOUT_FACTOR * median)


def run_isolated(work: Callable[[Channel], Any], *,
                 on_message: Callable[[Message], None] | None = None,
                 step_timeout: float | None = None, start: str = "fork",
                 prestarted: _child.PrestartedWorker | None = None, **watch: Any) -> ChildOutcome:
    """``work(channel)`` in a worker, each message to ``on_message``; returns how it ended (a
    ``ChildOutcome``), nothing left running. ``step_timeout``: seconds of silence allowed (None:
    ``auto_step_timeout``; a worker that needs longer asks in a heartbeat's ``grace``).
    ``start``: "fork" or "spawn" (``work`` travels with cloudpickle); ``prestarted``: a worker
    ``prestart()`` started earlier; ``watch``: ``supervise``'s keywords."""
    if start not in ("fork", "spawn"):
        raise ValueError(f"start={start!r}: use 'fork' or 'spawn'")

    def silence(progress: ChildProgress) -> tuple[float, str]:
        return (step_timeout if step_timeout is not None
                else auto_step_timeout(list(progress.step_seconds))), "step_timeout"

    begin = prestarted.send if prestarted is not None else \
        _child.start_fork if start == "fork" else _child.start_spawn
    out = supervise(lambda: begin(work), name="the worker", on_message=on_message,
                    silence=silence, start_grace=START_GRACE_S, **watch)
    if prestarted is not None:  # the job is over: the next fit's worker may take the CPU now
        prestarted.start_next()
    return out

