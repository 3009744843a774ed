"""The Trainer's state in and out: ``state_dict()`` / ``load_state_dict()``, going back to the
last good state after a failure (a lost device, bad steps, an interrupt), resuming from a
checkpoint, and writing ``last.pt``.

A mixin of ``Trainer`` (the class is split by concern so the loop stays on one screen); the
run's own state is ``state.RunState``, to which this adds model, optimizer, schedule, scaler, EMA
and RNG states.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hybridnb.train import checkpoint, recovery, setup
from hybridnb.train.data import leave_device
from hybridnb.train.seeding import rng_state, set_rng_state


class Resumable:
    """state_dict / load_state_dict / resume, and the files a run keeps."""

    def state_dict(self) -> dict:
        """Everything needed to continue exactly: weights, optimizer, schedule, scaler, EMA,
        the run's state and RNG states (CPU copies; loads with weights_only=True)."""
        gen = getattr(self, "_train_gen", None)
        rng = self.state.pending_rng if self.state.pending_rng is not None else {
            **rng_state(), "loader": gen.get_state() if gen is not None else None}
        return {
            "kind": "last", **recovery.to_cpu({
                "model": self.model.state_dict(),
                "optimizer": self.strategy.optimizer_state(self.optimizer),
                "ema": None if self.ema is None else self.ema.state_dict(), "rng": rng}),
            **recovery.to_cpu(self.state.state_dict()),
            "schedule": self.schedule.state_dict(), "scaler": self.scaler.state_dict(),
            "guard": None if self.guard is None else self.guard.state_dict(),
            "config": {"lr": self.lr, "epochs": self.epochs, "batch_size": self.batch_size,
                       "grad_accum": self.grad_accum, "seed": self.seed,
                       "model": type(self.model).__name__},
            "device": str(self.device), "precision": self.precision.name,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (a ``state_dict()`` or a checkpoint file's content)."""
        self._restore(state, events=True)
        old = (state.get("config", {}).get("batch_size"), state.get("config", {}).get("grad_accum"))
        if None not in old and old != (self.batch_size, self.grad_accum) and \
                self.state.batches_done:
            samples = self.state.batches_done * old[0]
            self.state.batches_done = samples // self.batch_size // self.grad_accum * \
                self.grad_accum
            self._note("resume", f"the checkpoint used batch_size={old[0]} x grad_accum="
                       f"{old[1]}, this run {self.batch_size} x {self.grad_accum}: the epoch "
                       f"continues after about {samples} samples, not bit for bit")

    def _restore(self, state: dict, events: bool = False) -> None:
        """Weights, optimizer, schedule, scaler, EMA, guard and the run's state."""
        self.model.load_state_dict(state["model"])
        self.strategy.load_optimizer_state(self.optimizer, state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])
        if self.scaler.is_enabled() and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        if self.ema is not None and state["ema"] is not None:
            self.ema.load_state_dict(state["ema"])
        if self.guard is not None and state["guard"] is not None:
            self.guard.load_state_dict(state["guard"])
        self.state.load_state_dict(state, events=events)
        self._recovery.micro.size = self.state.micro
        self.optimizer.zero_grad(set_to_none=True)

    def resume(self, path: str | Path) -> Resumable:
        """Load a checkpoint file (or the newest good one in a folder) now; the next ``fit``
        continues from it."""
        state, used, problems = checkpoint.read(path, self.model)
        for p in problems:
            self._note("checkpoint_fallback", f"{p}; using {used} instead")
        self.model.load_state_dict(state["model"])
        self._pending = state
        self._note("resume", f"resuming from {used} (epoch {state['position']['epoch']}, "
                   f"step {state['position']['global_step']})")
        return self

    def _load_resume(self, resume) -> None:
        where = self.checkpoint_dir if resume is True else Path(resume)
        if where is None:
            raise ValueError("fit(resume=True) needs checkpoint_dir=; or pass resume=<path>")
        if resume is True and not any((where / n).exists()
                                      for n in (checkpoint.LAST, checkpoint.PREVIOUS)):
            self._note("resume", f"no checkpoint in {where} yet: starting from scratch")
            return
        self.resume(where)

    def restore(self, state: dict) -> None:
        """Back to a ``state_dict()`` taken earlier in this process (weights, optimizer, run
        state, RNG); the events said since are kept."""
        self._restore(state)
        set_rng_state(self.state.pending_rng)
        self.state.pending_rng = None

    def _move_to_cpu(self, detail: str) -> str:
        """Sticky device error: continue the whole run on the CPU from the last good state
        (a CPU-side snapshot; nothing reads the lost device again)."""
        lost, snapshot = self.device, self.state.snapshot
        self.event("device_lost", f"{detail} — {lost} cannot be trusted again in this process. "
                    "Moving the run (model, optimizer state, scaler, EMA) to the CPU and "
                    f"continuing from the last good state (step "
                    f"{snapshot['position']['global_step']}) in fp32; steps will be slower")
        self._continue_on_cpu()
        recovery.rebuild_on_cpu(self.model)
        if self.ema is not None:
            recovery.rebuild_on_cpu(self.ema)
        self._restore(snapshot)
        self.state.micro = None  # the GPU's micro-batch size means nothing here
        self._build_step(compiled=False)
        return "rewind"

    def _continue_on_cpu(self) -> None:
        """The device is lost: it is never used again in this process, and what follows runs on
        the CPU in fp32 (no pinned memory, no compile, no isolation)."""
        recovery.mark_lost(self.device)
        leave_device(self._loaders)
        self._loader_kwargs["pin_memory"] = False
        self.strategy = self.strategy.on_cpu()
        self.precision = setup.cpu_precision()
        self.compile = self.isolated = False

    def _restore_after_bad_steps(self) -> str:
        """``patience`` bad steps in a row: back to the last good state with the lower LR;
        a bounded number of times at the same place, then a clear error."""
        state, snapshot = self.state, self.state.snapshot
        at = snapshot["position"]["global_step"]
        state.restores[at] = state.restores.get(at, 0) + 1
        if state.restores[at] > 3:
            raise FloatingPointError(
                f"the loss stays non-finite or spiking after 3 restores to step {at} (epoch "
                f"{snapshot['position']['epoch']}), with the learning rate cut to "
                f"{state.lr_scale:.3g} of the schedule. Likely causes: non-finite values in a "
                "custom loss or model output, or a learning rate far too high; check "
                "trainer.steps and trainer.events")
        lr_scale = state.lr_scale
        self.event("restore", f"{self.guard.patience} bad steps in a row: restoring the last "
                    f"good state (step {at}) and keeping the lower learning rate ({lr_scale:.3g} "
                    "of the schedule)")
        self._restore(snapshot)
        state.lr_scale = lr_scale
        self.guard.streak = 0
        return "rewind"

    def _interrupted(self) -> str:
        """A KeyboardInterrupt inside a step: drop the step, keep the last good weights."""
        self.optimizer.zero_grad(set_to_none=True)
        if self._recovery.phase == "update":  # the optimizer may have been half-way through
            self._restore(self.state.snapshot)
            self.event("restore", "interrupted during the optimizer update: restored the last "
                        f"good state (step {self.state.global_step})")
        self._recovery.phase = "idle"
        return self._stop("interrupt", "interrupted: the current step was dropped")

    def _keep(self, snapshot: dict) -> None:
        """The last good state: kept for recovery (and, in an isolated worker, sent to the
        kernel)."""
        self.state.snapshot = snapshot
        if self._channel is not None:
            self._channel.state(recovery.to_cpu(snapshot))

    def _save_last(self) -> None:
        self._keep(self.strategy.for_file(self.state_dict()))
        if self.checkpoint_dir is not None and self.strategy.is_main:
            checkpoint.save(self.state.snapshot, self.checkpoint_dir / checkpoint.LAST,
                            keep_previous=True)

    def _save_crash(self) -> None:
        """An unexpected error: keep the last good state on disk so the run can resume. A
        failing save is reported and never hides the original error."""
        snapshot = self.state.snapshot
        if self.checkpoint_dir is None or snapshot is None or not self.strategy.is_main:
            return
        if not self.strategy.file_ready(snapshot):  # DeepSpeed: partitions not gathered
            print("hybridnb: training failed; the last checkpoint written (in "
                  f"{self.checkpoint_dir}) is kept: fit(..., resume=True) continues from there",
                  file=sys.stderr)
            return
        try:
            path = checkpoint.save(snapshot, self.checkpoint_dir / checkpoint.LAST,
                                   keep_previous=True)
        except Exception as exc:
            print(f"hybridnb: training failed, and saving the last good state into "
                  f"{self.checkpoint_dir} failed too ({type(exc).__name__}: "
                  f"{recovery.first_line(exc)}); the original error follows", file=sys.stderr)
            return
        print(f"hybridnb: training failed; the last good state (step "
              f"{snapshot['position']['global_step']}) is in {path}; "
              "fit(..., resume=True) continues from there", file=sys.stderr)
