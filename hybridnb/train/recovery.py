"""What happens when a step fails: out of memory, a broken device, a loss that explodes.

``Recovery`` runs a step and acts on its failures (Composer's ``_train_batch``: try, classify,
agree across ranks, shrink, retry). Memory is freed *after* the ``except`` block: while the
exception lives, its traceback pins the failed step's tensors. Sticky device errors raised as
Python exceptions move the run to the CPU; a device that aborts the process or a kernel that
never returns needs ``Trainer(isolate=True)``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from hybridnb.failures import first_line, free_memory, is_device_lost, is_oom
from hybridnb.strategies.batches import batch_len
from hybridnb.torch_state import set_torch_rng_state, torch_rng_state


def micro_batches(window: list, size: int | None) -> Iterator[tuple]:
    """``window`` as ``(x, y, weight)`` pieces of at most ``size`` samples (None: whole batches),
    ``weight`` the piece's share of the window's samples, so the weighted sum of mean losses is
    the whole window's loss (and its gradient)."""
    total = sum(batch_len(b) for b in window)
    for batch in window:
        x, y = batch[0], batch[1]
        n = int(x.shape[0])
        step = n if size is None else size
        for start in range(0, n, step):
            stop = min(start + step, n)
            yield x[start:stop], y[start:stop], (stop - start) / total


def halved(size: int) -> int | None:
    """The micro-batch size after an OOM at ``size``; None when even one sample failed."""
    return None if size <= 1 else math.ceil(size / 2)


@contextlib.contextmanager
def on_cpu(model: torch.nn.Module, device: torch.device):
    """``model`` on the CPU for one batch, then back on ``device``; its parameters keep their
    identity (``Module.to`` swaps ``.data``), so the optimizer steps the same tensors."""
    model.to("cpu")
    try:
        yield torch.device("cpu")
    finally:
        model.to(device)


def to_cpu(obj):
    """A detached CPU copy of a nested state (dicts, lists, tuples, tensors)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):  # a copy of its own type: Counter (MultiStepLR), OrderedDict
        out = copy.copy(obj)
        for k, v in obj.items():
            out[k] = to_cpu(v)
        return out
    if isinstance(obj, (list, tuple)):
        return (list if isinstance(obj, list) else tuple)(to_cpu(v) for v in obj)
    return obj


@dataclass
class LossGuard:
    """Detects an exploding loss: ``check`` answers "ok", "nonfinite" or "spike" (above
    ``spike`` x the running mean of good losses, after ``warmup`` good steps). A bad step is
    skipped and the learning rate x ``lr_cut``; ``patience`` in a row restore the last good
    state."""

    spike: float = 10.0
    lr_cut: float = 0.5
    patience: int = 3
    warmup: int = 20
    momentum: float = 0.95
    mean: float = 0.0
    good: int = 0
    streak: int = 0

    def check(self, loss: float, grad_norm: float | None = None) -> str:
        """Judge a step and count it (``verdict`` then ``record``)."""
        return self.record(self.verdict(loss, grad_norm), loss)

    def verdict(self, loss: float, grad_norm: float | None = None) -> str:
        """"ok", "nonfinite" or "spike", without counting the step."""
        if not math.isfinite(loss) or (grad_norm is not None and not math.isfinite(grad_norm)):
            return "nonfinite"
        if self.good >= self.warmup and self.spike and \
                loss > self.spike * abs(self.running_mean()):
            return "spike"
        return "ok"

    def record(self, verdict: str, loss: float) -> str:
        """Count a judged step: a good loss joins the running mean, a bad one the streak."""
        if verdict == "ok":
            self.mean = self.momentum * self.mean + (1 - self.momentum) * loss
            self.good += 1
            self.streak = 0
        else:
            self.streak += 1
        return verdict

    def running_mean(self) -> float:
        """The bias-corrected running mean (like Adam's): early steps are not pulled to 0."""
        return self.mean / (1 - self.momentum ** max(self.good, 1))

    def reset(self) -> None:
        """A new run: no running mean, no streak."""
        self.mean, self.good, self.streak = 0.0, 0, 0

    def state_dict(self) -> dict:
        return {"mean": float(self.mean), "good": int(self.good), "streak": int(self.streak)}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.good, self.streak = state["mean"], state["good"], state["streak"]


def nonfinite_inputs(window: list) -> str | None:
    """Which tensor of a window holds NaN/Inf ("y: 4 NaN of 32 values"), or None when all are
    finite. Only called after a non-finite loss, so the cost is paid only then."""
    found = []
    for batch in window:
        for name, t in (("x", batch[0]), ("y", batch[1])):
            if not (isinstance(t, torch.Tensor) and t.is_floating_point()):
                continue
            nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
            if nan or inf:
                what = " and ".join(f"{k} {v}" for k, v in (("NaN", nan), ("Inf", inf)) if v)
                found.append(f"{name}: {what} of {t.numel()} values")
    return "; ".join(found) or None


class Recovery:
    """``eager`` and ``cpu_batch_step`` build the fallback steps (once); ``updating`` holds Ctrl-C
    back during the optimizer update."""

    def __init__(self, step, *, model: torch.nn.Module, on_gpu_error: str,
                 guard: LossGuard | None, state, bus,
                 updating=contextlib.nullcontext, compiled: bool = False, eager=None,
                 cpu_batch_step=None) -> None:
        self.step, self.guard, self.state, self.bus = step, guard, state, bus
        self.model = model  # the unwrapped module: its buffers are what a failed attempt touched
        self.strategy = step.strategy
        self.on_gpu_error, self.updating, self.compiled = on_gpu_error, updating, compiled
        self._eager = eager
        self._cpu = cpu_batch_step and functools.cache(cpu_batch_step)  # built once, if needed
        self.phase = "idle"
        self._bad_data, self._said_unguarded = 0, False

    def run(self, window: list) -> tuple[str, float | None, str]:
        """One optimizer step over ``window`` (the batches of one accumulation window): what it
        came to, its loss when applied, and the device error. It came to "ok" (applied),
        "skipped" (a bad loss), "restore" (too many bad steps in a row: the loop goes back to
        the last good state) or "device_lost" (sticky: the loop moves the run to the CPU)."""
        samples, device = sum(batch_len(b) for b in window), self.strategy.device
        # the buffers (BatchNorm statistics) and RNG states of now: put back after a failed
        # attempt, so one re-run split leaves no trace
        buffers = [(b, b.detach().clone()) for b in self.model.buffers()]
        rng = torch_rng_state(device)
        on_cpu_batch = False
        while True:
            step = self._cpu() if on_cpu_batch else self.step
            try:
                self.phase = "forward"
                pieces = list(micro_batches(window, self.state.micro))
                with on_cpu(step.model, device) if on_cpu_batch else contextlib.nullcontext():
                    total = step.accumulate(pieces, samples).to(device)
                if self.strategy.world_size > 1:  # all ranks agree, then gradients are averaged
                    total = self.strategy.settle(self.step.params, total, window)
                self.phase = "update"
                with self.updating():
                    loss, verdict = self.step.update(total)
                self.phase = "idle"
                break
            except Exception as exc:  # classified: what is no step failure is raised again
                if self.strategy.world_size > 1 and self.phase != "update":
                    self.strategy.settle(self.step.params, None, window, failed=exc)
                failure, detail = self.classify(exc)
            # outside the except block: the failed step's tensors are no longer pinned
            self.step.optimizer.zero_grad(set_to_none=True)
            self.strategy.discard()
            if failure == "device_lost":  # marked lost as the loop moves the run to the CPU
                gc.collect()
                return "device_lost", None, detail
            free_memory(device)
            with torch.no_grad():
                for live, before in buffers:
                    live.copy_(before)
            set_torch_rng_state(rng, device)
            on_cpu_batch = self._act(failure, detail, window, on_cpu_batch)
        return self._judge(loss, verdict, window)

    def classify(self, exc: Exception) -> tuple[str, str]:
        """Name a step failure ("compile", "device_lost", "oom"), or re-raise what cannot be
        recovered. Keeps no reference to the exception (its traceback pins the step's tensors)."""
        detail = f"{type(exc).__name__}: {first_line(exc)}"
        lost = is_device_lost(exc)
        if self.compiled and not lost:
            return "compile", detail
        if self.on_gpu_error == "raise":
            raise exc
        if lost and self.strategy.accelerator:
            return "device_lost", detail
        if is_oom(exc):
            if self.phase == "update":
                if self.strategy.accelerator:
                    return "device_lost", detail + " (during the optimizer update)"
                raise MemoryError(f"out of memory in the optimizer update on "
                                  f"{self.strategy.device}; the model and optimizer state do "
                                  "not fit") from exc
            return "oom", detail
        raise exc

    def _act(self, failure: str, detail: str, window: list, on_cpu_batch: bool) -> bool:
        """Act on a classified failure; returns whether the next attempt runs on the CPU."""
        if failure == "compile":
            self.step, self.compiled = self._eager(), False
            self.bus.say("compile_fallback", f"compiled step failed ({detail}); continuing eager "
                         "(uncompiled) for the rest of the run")
            return on_cpu_batch
        device = self.strategy.device
        size_before = self.state.micro or max(batch_len(b) for b in window)
        new = halved(size_before)
        if new is not None:
            self.state.micro = new
            self.bus.say("oom_split", f"out of memory at micro-batch {size_before} on {device} "
                         f"({detail}); re-running the same batch, batch-norm statistics and RNG "
                         f"restored, as micro-batches of {new} (later steps keep it): the same "
                         "update, except that batch norm normalises per micro-batch")
            return False
        if on_cpu_batch or not self.strategy.accelerator or self.strategy.owns_update:
            raise MemoryError(f"out of memory on {'the CPU' if on_cpu_batch else device} even "
                              f"with one sample per micro-batch ({detail}); use a smaller model "
                              "or input, or free memory used by other processes")
        self.bus.say("cpu_batch", f"one sample does not fit on {device} ({detail}); this batch "
                     "runs on the CPU, the next goes back to the GPU")
        return True

    def _judge(self, loss: float | None, verdict: str, window: list) -> tuple:
        """A skipped step: name bad data, or cut the LR; after ``patience`` bad steps in a row
        the loop restores the last good state."""
        where = f"epoch {self.state.epoch}, step {self.state.global_step}"
        if verdict == "ok":
            self._bad_data = 0
            if self.guard is None and not math.isfinite(loss) and not self._said_unguarded:
                self._said_unguarded = True
                bad = nonfinite_inputs(window)
                self.bus.say("nonfinite_loss", f"non-finite loss at {where}"
                             f"{f' ({bad})' if bad else ''} and loss_guard=False: the update was "
                             "applied, so the weights may now hold NaN. Pass loss_guard=True to "
                             "skip such steps (said once)")
            return "ok", loss, ""
        bad = nonfinite_inputs(window) if verdict == "nonfinite" else None
        if self.strategy.agree(bad is not None):
            self.guard.streak = max(0, self.guard.streak - 1)  # the data, not the model
            self._bad_data += 1
            if self._bad_data >= self.guard.patience:
                raise ValueError(
                    f"the training data holds non-finite values: {self._bad_data} batches in a "
                    f"row up to {where} gave a non-finite loss and hold NaN/Inf "
                    f"({bad or 'on another rank'}). Remove or impute them before training "
                    "(e.g. keep = np.isfinite(y) & np.isfinite(X).reshape(len(X), -1).all(1))")
            self.bus.say("nonfinite_batch", f"non-finite loss at {where} from the batch itself "
                         f"({bad or 'on another rank'}): batch skipped, learning rate kept")
            return "skipped", None, ""
        self._bad_data = 0
        self.state.lr_scale *= self.guard.lr_cut
        what = "non-finite loss or gradient" if verdict == "nonfinite" else \
            f"loss spike ({loss:.4g} vs running mean {self.guard.running_mean():.4g})"
        self.bus.say("nonfinite_loss" if verdict == "nonfinite" else "loss_spike",
                     f"{what}: step skipped, learning rate x{self.guard.lr_cut} (now "
                     f"{self.state.lr_scale:.3g} of the schedule)")
        return "restore" if self.guard.streak >= self.guard.patience else "skipped", None, ""
