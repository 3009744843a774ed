"""Where a run executes: the strategy (and so the device), the precision decided once, the
learner and in-memory data placed on the device, measured speedups, and the training step with
the recovery object built for that device.

The first device calls of a run happen here, in the process that trains (the isolated worker
when there is one).
"""

from __future__ import annotations

import contextlib
import logging
import time

import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate

from hybridnb import failures, speedups
from hybridnb.measure.memory import cuda_index
from hybridnb.train import recovery, setup
from hybridnb.train.data import IndexedBatches
from hybridnb.train.learner import Learner
from hybridnb.train.precision import Precision
from hybridnb.train.settings import Settings
from hybridnb.train.step import TrainStep, count_flops

FLOP_SLICE = 8  # samples of the example batch the FLOP count runs on
# a rough scale for the first step's compile time: a base plus a cost per layer (measured on
# this project's 2-core CPU: 14 s for a small model, 38-77 s for EEGNeX; GPUs compile faster)
COMPILE_S = {"cpu": (10.0, 1.5), "cuda": (5.0, 0.7)}


class Placement:
    def __init__(self, settings: Settings, learner: Learner, bus) -> None:
        self.settings, self.learner, self.bus = settings, learner, bus
        self.strategy = setup.make_strategy(settings.strategy, torch.device(settings.device))
        self.compile = settings.compile if self.strategy.supports_compile else False
        if settings.compile and not self.strategy.supports_compile:
            bus.note("compile_fallback", f"strategy={self.strategy.name!r}: compile="
                     f"{settings.compile!r} is ignored (its engine runs eager)")
        self.precision = setup.choose_precision(settings.precision, self.strategy,
                                                settings.recommended_precision, bus)
        self.strategy.configure(settings.batch_size, settings.clip_grad)
        self.applied_speedups: speedups.Applied | None = None
        self.flops_per_sample: float | None = None
        self.recovery: recovery.Recovery | None = None
        self._placed_on: torch.device | None = None
        self._sped_up_on: torch.device | None = None

    @property
    def device(self) -> torch.device:
        return self.strategy.device

    def place(self, loaders: list) -> None:
        """The learner and in-memory data on the device (the learner once per device), and this
        process's share of a CUDA device's memory capped."""
        for loader in loaders:
            if isinstance(loader, IndexedBatches):
                loader.place(self.device, self.bus)
        if self._placed_on == self.device:
            return
        self.learner.to(self.device)
        fraction = self.settings.memory_fraction
        if fraction is not None and self.device.type == "cuda":
            index = cuda_index(self.device)  # "cuda": the current device
            torch.cuda.set_per_process_memory_fraction(fraction, index)
            self.bus.note("memory_fraction", f"GPU memory capped at {fraction:.0%} of cuda:{index}")
        elif fraction is not None:
            self.bus.note("memory_fraction", f"memory_fraction={fraction} has no effect on "
                          f"{self.device} (CUDA only)")
        self._placed_on = self.device  # after the cap: a cap that raised is tried again

    def speed_up(self, train_loader, batch_size: int, steps: int) -> None:
        """Apply what measures faster on this model and device (once per device, said with the
        numbers); count the FLOPs per sample (the live view's MFU on a GPU)."""
        if not speedups.wanted(self.settings.speedups, self.device) or \
                self._sped_up_on == self.device:
            return
        self._sped_up_on = self.device
        model = self.learner.model
        if self.device.type == "cpu" and self.settings.speedups == "auto" and \
                not speedups.cpu_candidate(model):
            return
        # the first samples, on the device and cast as BatchCheck does (no draw from a generator)
        if isinstance(train_loader, IndexedBatches):
            x = train_loader.tensors[0][:batch_size]
        elif isinstance(train_loader.dataset, IterableDataset):  # a fresh pass's first batch
            x = next(iter(train_loader))[0]
        else:
            data = train_loader.dataset
            x = default_collate([data[i] for i in range(min(batch_size, len(data)))])[0]
        x = x.to(self.device, self.learner.dtype if x.is_floating_point() else x.dtype)
        asked = "auto" if self.settings.precision == "auto" else self.precision
        applied = speedups.apply_speedups(model, x, self.device, precision=asked, steps=steps)
        self.applied_speedups = applied
        if applied.applied:
            self.learner.follow_rewrites()
        if "precision" in applied.applied and applied.precision in \
                self.strategy.supported_precisions:  # measured faster than the first choice
            self.precision = Precision.choose(applied.precision, self.device)
        # a CPU left as it was with nothing timed: nothing to say; a trial that lost is said
        if applied.applied or applied.speedup or self.device.type != "cpu":
            for line in (applied.message, *applied.notes):
                self.bus.note("speedups", line)
        # counted on a slice: FLOPs grow linearly with the batch, and a slice rarely runs out of
        # memory where the whole fp32 batch might
        x = x[:FLOP_SLICE]
        flops = count_flops(model, (x,), bus=self.bus)
        self.flops_per_sample = None if flops is None else flops / len(x)

    def facts(self) -> dict:
        """What this process decided and measured (an isolated worker sends it with its final
        state, so the kernel's Trainer reports what the run really used)."""
        applied = self.applied_speedups  # portable: its undo closures stay in the worker
        return {"precision": self.precision.name, "flops_per_sample": self.flops_per_sample,
                "applied_speedups": None if applied is None else applied.portable()}

    def adopt(self, facts: dict) -> bool:
        """Take what the isolated worker decided (``facts()``); True when the precision changed
        (the step must be rebuilt). Touches no device: the kernel never does."""
        self.applied_speedups = facts["applied_speedups"]
        self.flops_per_sample = facts["flops_per_sample"]
        if facts["precision"] == self.precision.name:
            return False
        self.precision = Precision.choose(facts["precision"], self.device)
        return True

    def end_fit(self) -> None:
        """Process-wide switches the speedups turned on are put back (cuDNN autotuning)."""
        if self.applied_speedups is not None:
            self.applied_speedups.restore_globals()

    def build_step(self, loop, compiled: bool = False) -> None:
        """``loop``'s step (compiled when asked) and the recovery object that runs it: a Ctrl-C
        waits out the optimizer update while a fit runs."""
        updating = loop.interrupt.updating if loop.interrupt else contextlib.nullcontext
        learner, model = self.learner, self.learner.model
        if compiled:
            mode = None if self.compile is True else self.compile
            if self.device.type != "cuda":
                quiet_cuda_home_warning()
            try:
                model = torch.compile(model, mode=mode)
            except Exception as exc:  # compile is lazy; this catches a missing backend
                compiled = False
                self.bus.say("compile_fallback", f"torch.compile unavailable "
                             f"({type(exc).__name__}: {failures.first_line(exc)}); training eager")
            else:
                say_compiling(model, learner.model, self.device, self.bus)
        self.recovery = recovery.Recovery(
            self._make_step(model), model=learner.model, on_gpu_error=loop.settings.on_gpu_error,
            guard=learner.guard, state=loop.state, bus=self.bus, compiled=compiled,
            updating=updating, eager=lambda: self._make_step(learner.model),
            cpu_batch_step=self._cpu_batch_step)

    def _make_step(self, model: torch.nn.Module) -> TrainStep:
        learner = self.learner
        on_applied = (lambda: learner.ema.update_parameters(learner.model)) if learner.ema \
            else None
        return TrainStep(self.strategy.wrap(model, learner.optimizer), learner.loss_fn,
                         learner.optimizer, self.precision, clip_grad=self.settings.clip_grad,
                         strategy=self.strategy, params=learner.params, guard=learner.guard,
                         on_applied=on_applied)

    def _cpu_batch_step(self) -> TrainStep:
        """The per-batch fallback: forward/backward on the CPU (the model moved there for the
        batch), gradients scaled as the device's GradScaler expects."""
        learner = self.learner
        return TrainStep(learner.model, learner.loss_fn, learner.optimizer, setup.cpu_precision(),
                         params=learner.params, loss_scale=self.precision.scaler.get_scale)

    def continue_on_cpu(self, loaders) -> None:
        """The device is lost for good: the rest runs on the CPU in fp32 (``loaders``: Loop's)."""
        failures.mark_lost(self.device)
        for loader in loaders.opened:  # no more pinning (a CUDA call); batches from the CPU copy
            if isinstance(loader, IndexedBatches):
                loader.to_cpu()
            elif isinstance(loader, DataLoader) and loader.pin_memory:
                loader.pin_memory = False
        loaders.kwargs["pin_memory"] = False
        self.strategy = self.strategy.on_cpu()
        self.precision = setup.cpu_precision()
        self.compile = False
        self._placed_on = None


def compile_estimate_s(model: torch.nn.Module, device: torch.device | str) -> float:
    """A rough scale for compiling ``model``'s first step on ``device`` (``COMPILE_S``)."""
    base, per_layer = COMPILE_S.get(torch.device(device).type, COMPILE_S["cuda"])
    layers = sum(1 for m in model.modules() if not any(True for _ in m.children()))
    return base + per_layer * layers


def say_compiling(compiled: torch.nn.Module, model: torch.nn.Module, device: torch.device,
                  bus) -> None:
    """The first forward of ``compiled`` (which compiles) says so with a rough duration, then
    how long it took: a first step that compiles is otherwise a long silence."""
    started = []

    def before(module, args):
        started.append(time.perf_counter())
        bus.say("compiling", f"compiling, about {compile_estimate_s(model, device):.0f} s "
                f"(torch.compile of {type(model).__name__} on the first step, "
                f"{device.type.upper()}); the ETA starts after it")
        pre.remove()

    def after(module, args, output):
        post.remove()
        bus.say("compiling", f"compiled the forward in {time.perf_counter() - started[0]:.0f} s "
                "(the backward compiles in this first step too)")

    pre = compiled.register_forward_pre_hook(before)
    post = compiled.register_forward_hook(after)


def _no_cuda_home_line(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("No CUDA runtime is found")


def quiet_cuda_home_warning() -> None:
    """Import ``torch.utils.cpp_extension`` (TorchInductor's CPU builder imports it when it first
    compiles) without its one-time "No CUDA runtime is found, using CUDA_HOME=...": noise for a
    CPU compile on a machine with a CUDA toolkit but no GPU. Other messages of that logger pass
    (the filter stays: one function, added once)."""
    logging.getLogger("torch.utils.cpp_extension").addFilter(_no_cuda_home_line)
    import torch.utils.cpp_extension  # noqa: F401 — the warning is said at import
