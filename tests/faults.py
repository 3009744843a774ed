"""Test-only hooks for isolated workers, registered from here (``install()``, called by
conftest.py): hybridnb itself reads no fault variable.

- ``HYBRIDNB_FAULT="phase:kind[:n]"``: the worker dies (kind ``kill``: SIGKILL, ``abort``:
  SIGABRT as a crashing driver does) or hangs (``hang``) the ``n``-th time (default 1) it enters
  ``phase`` (one of ``worker_fit.PHASES``).
- ``HYBRIDNB_SIMULATE_CUDA=1``: a worker given a CUDA run trains it on the CPU in fp32 (no
  pinned memory) and says so; the kernel still believes its device is CUDA (tests of a kernel
  that never starts the CUDA driver).

The hook travels with every job (``worker_fit.job_hooks``) and reads the variables in the
worker, which inherits the test's environment (``monkeypatch.setenv``).
"""

from __future__ import annotations

import os
import signal
import time

from hybridnb.train import worker_fit

FAULT_ENV = "HYBRIDNB_FAULT"                  # "phase:kind[:n]", read in the worker by this hook
SIMULATE_CUDA_ENV = "HYBRIDNB_SIMULATE_CUDA"  # "1": a "cuda" run trained on the CPU


class EnvFaults:
    """The faults and the simulated CUDA the environment asks for (read in the worker)."""

    def __init__(self) -> None:
        self.seen = 0
        self.spec: tuple | None = None

    def _parse(self) -> tuple:
        spec = os.environ.get(FAULT_ENV, "")
        parts = spec.split(":") if spec else []
        phase = parts[0] if parts else None
        kind = parts[1] if len(parts) > 1 else "kill"
        at = int(parts[2]) if len(parts) > 2 else 1
        if phase is not None and (phase not in worker_fit.PHASES
                                  or kind not in ("kill", "abort", "hang")):
            raise ValueError(f"{FAULT_ENV}={spec!r}: use phase:kind[:n] with a phase in "
                             f"{worker_fit.PHASES} and a kind in kill|abort|hang")
        return phase, kind, at

    def enter(self, phase: str) -> None:
        if self.spec is None:
            self.spec = self._parse()
        want, kind, at = self.spec
        if phase != want:
            return
        self.seen += 1
        if self.seen != at:
            return
        if kind == "hang":
            time.sleep(3600)
        signal.raise_signal(signal.SIGKILL if kind == "kill" else signal.SIGABRT)

    def settings(self, settings):
        if os.environ.get(SIMULATE_CUDA_ENV, "") != "1" or not settings.device.startswith("cuda"):
            return settings, None
        loader = {**settings.loader_kwargs, "pin_memory": False}
        note = (f"{SIMULATE_CUDA_ENV}=1: this worker runs the {settings.device} run on the CPU "
                "in fp32 (a test of the kernel's side)")
        return (settings.replace(device="cpu", precision="fp32", loader_kwargs=loader),
                ("simulated_cuda", note))


def install() -> None:
    """Every job from now on carries an ``EnvFaults`` (idle unless the variables are set)."""
    if not any(isinstance(h, EnvFaults) for h in worker_fit.job_hooks):
        worker_fit.job_hooks.append(EnvFaults())
