"""Test-only faults for isolated workers, registered from here (``install()``, called by
conftest.py): hybridnb itself reads no fault variable and has no hook for them.

- ``HYBRIDNB_FAULT="phase:kind[:n]"``: the worker dies (kind ``kill``: SIGKILL, ``abort``:
  SIGABRT as a crashing driver does) or hangs (``hang``) the ``n``-th time (default 1) it enters
  ``phase`` (one of ``PHASES``: what its heartbeats name).
- ``HYBRIDNB_SIMULATE_CUDA=1``: a worker given a CUDA run trains it on the CPU in fp32 (no
  pinned memory) and says so; the kernel still believes its device is CUDA (tests of a kernel
  that never starts the CUDA driver).

``install()`` makes the kernel send ``work`` (below) instead of ``worker_fit.work``: it travels
to the worker by reference (tests/ is on the worker's ``sys.path``), where it wraps the
worker's ``Heartbeat`` to see each phase entered, reads the variables (the worker inherits the
test's environment: ``monkeypatch.setenv``) and runs the job.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time

from hybridnb.train import heartbeat, worker_fit

# the phases an isolated worker names in its heartbeats (a lost worker's event names the last)
PHASES = ("setup", "first step", "step", "validation", "checkpoint", "hand-over", "evaluate")
REAL_WORK = worker_fit.work

FAULT_ENV = "HYBRIDNB_FAULT"                  # "phase:kind[:n]", read in the worker by this hook
SIMULATE_CUDA_ENV = "HYBRIDNB_SIMULATE_CUDA"  # "1": a "cuda" run trained on the CPU


class EnvFaults:
    """The fault the environment asks for (read in the worker)."""

    def __init__(self) -> None:
        self.seen = 0
        spec = os.environ.get(FAULT_ENV, "")
        parts = spec.split(":") if spec else []
        self.phase = parts[0] if parts else None
        self.kind = parts[1] if len(parts) > 1 else "kill"
        self.at = int(parts[2]) if len(parts) > 2 else 1
        if self.phase is not None and (self.phase not in PHASES
                                       or self.kind not in ("kill", "abort", "hang")):
            raise ValueError(f"{FAULT_ENV}={spec!r}: use phase:kind[:n] with a phase in "
                             f"{PHASES} and a kind in kill|abort|hang")

    def enter(self, phase: str) -> None:
        if phase != self.phase:
            return
        self.seen += 1
        if self.seen != self.at:
            return
        if self.kind == "hang":
            time.sleep(3600)
        signal.raise_signal(signal.SIGKILL if self.kind == "kill" else signal.SIGABRT)


def _watch_phases(faults: EnvFaults) -> None:
    """Every phase the worker's heartbeat enters (each step too) is told to ``faults``."""
    beat, before_step = heartbeat.Heartbeat.beat, heartbeat.Heartbeat.before_step

    def beat_(self, phase, grace=None):
        beat(self, phase, grace)
        faults.enter(phase)

    def before_step_(self, first):
        before_step(self, first)
        faults.enter("first step" if first else "step")

    heartbeat.Heartbeat.beat, heartbeat.Heartbeat.before_step = beat_, before_step_


def work(job, channel):
    """In the worker: the job with the environment's faults (and simulated CUDA)."""
    _watch_phases(EnvFaults())
    device = job.settings.device
    if os.environ.get(SIMULATE_CUDA_ENV, "") != "1" or not device.startswith("cuda"):
        return REAL_WORK(job, channel)
    settings = job.settings.replace(device="cpu", precision="fp32", loader_kwargs={
        **job.settings.loader_kwargs, "pin_memory": False})
    job = dataclasses.replace(job, settings=settings)
    if isinstance(job, worker_fit.FitJob):  # said by the worker's fit, with the kernel's notes
        job.notes = [*job.notes, ("simulated_cuda", f"{SIMULATE_CUDA_ENV}=1: this worker runs "
                                  f"the {device} run on the CPU in fp32 (a test of the "
                                  "kernel's side)")]
    result = REAL_WORK(job, channel)
    if isinstance(result, worker_fit.FitResult):  # the kernel's run keeps its device
        result.state["device"] = device
    return result


def install() -> None:
    """Every job from now on runs through ``work`` (idle unless the variables are set)."""
    worker_fit.work = work
