"""Where a run executes: the model, its EMA, optimizer state and in-memory data placed on the
device (the first device calls of a run: in the isolated worker when there is one), measured
speedups, and the training step and the recovery object built for that device.

A mixin of ``Trainer`` (the class is split by concern so the loop stays on one screen).
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils.data import default_collate

from hybridnb.strategies.base import SingleDevice
from hybridnb.train import recovery, setup
from hybridnb.train.data import IndexedBatches
from hybridnb.train.precision import Precision
from hybridnb.train.speedups import apply_speedups
from hybridnb.train.step import TrainStep, count_flops


class Placement:
    """Device placement, speedups, and the step with its recovery."""

    def _place(self, loaders: list) -> None:
        """Model, EMA, optimizer state and in-memory data on ``self.device`` (the model once per
        device), and the memory cap."""
        for loader in loaders:
            if isinstance(loader, IndexedBatches):
                loader.place(self.device, self._note)
        if getattr(self, "_placed_on", None) == self.device:
            return
        self.model.to(self.device)
        if self.ema is not None:
            self.ema.to(self.device)
        if self.optimizer.state:  # loading casts the state to each parameter's device
            self.optimizer.load_state_dict(self.optimizer.state_dict())
        if self.memory_fraction is not None:
            setup.cap_memory(self.memory_fraction, self.device, self._notes)
        self._placed_on = self.device

    def _speed_up(self, train_loader) -> None:
        """Apply what measures faster on this model and device (once per device; ``speedups``
        "auto": on CUDA only), said once with the numbers."""
        wanted = self.speedups is True or (self.speedups == "auto" and self.device.type == "cuda")
        if not wanted or getattr(self, "_sped_up_on", None) == self.device:
            return
        self._sped_up_on = self.device
        x = example_batch(train_loader, self.batch_size)[0].to(self.device)
        asked = "auto" if self.precision_arg == "auto" else self.precision
        applied = apply_speedups(self.model, x, self.device, precision=asked)
        self.applied_speedups = applied
        if "precision" in applied.applied and applied.precision in \
                self.strategy.supported_precisions:  # measured faster than the first choice
            self.precision = Precision.choose(applied.precision, self.device)
        self._note("speedups", applied.message)
        for note in applied.notes:
            self._note("speedups", note)
        if self.device.type == "cuda":
            self._flops = count_flops(self.model, (x,)) / len(x)

    def _build_step(self, compiled: bool) -> None:
        """The step (compiled when asked) and the recovery object that runs it."""
        model = self.model
        if compiled:
            mode = None if self.compile is True else self.compile
            try:
                model = torch.compile(model, mode=mode)
            except Exception as exc:  # compile is lazy; this catches a missing backend
                compiled = False
                self.event("compile_fallback", f"torch.compile unavailable ("
                            f"{type(exc).__name__}: {recovery.first_line(exc)}); training eager")
        self.step = self._make_step(model, self.precision)
        self._recovery = recovery.Recovery(
            self.step, model=self.model, on_gpu_error=self.on_gpu_error, guard=self.guard, state=self.state,
            event=self.event, compiled=compiled,
            updating=self._interrupt.updating if self._interrupt else contextlib.nullcontext,
            eager=lambda: self._make_step(self.model, self.precision),
            cpu_batch_step=self._cpu_batch_step)

    def _make_step(self, model: torch.nn.Module, precision) -> TrainStep:
        on_applied = (lambda: self.ema.update_parameters(self.model)) if self.ema else None
        return TrainStep(self.strategy.wrap(model, self.optimizer), self.loss_fn, self.optimizer,
                         precision, clip_grad=self.clip_grad, strategy=self.strategy,
                         params=self._params, guard=self.guard, on_applied=on_applied)

    def _cpu_batch_step(self) -> TrainStep:
        """The per-batch fallback: forward/backward on the CPU (the model moved there for the
        batch), gradients scaled as the device's GradScaler expects."""
        return TrainStep(self.model, self.loss_fn, self.optimizer,
                         setup.cpu_precision(), strategy=SingleDevice("cpu"),
                         params=self._params, loss_scale=self.scaler.get_scale)


def example_batch(loader, n: int) -> tuple:
    """The first ``n`` samples of a loader's data, without drawing from its generator."""
    if isinstance(loader, IndexedBatches):
        return tuple(t[:n] for t in loader.tensors)
    data = loader.dataset
    return tuple(default_collate([data[i] for i in range(min(n, len(data)))]))
