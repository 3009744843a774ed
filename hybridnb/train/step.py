"""The one training step (forward and backward over micro-batches, then the update) and the
FLOP count of that pass (MFU). Precision and the strategy's hooks are captured once when the
step is built, so the step has no branches for them (nanoGPT's shape). The Trainer runs it
through ``recovery.Recovery``; ``hn.compare()`` calls it directly:

>>> step = TrainStep(model, loss_fn, optimizer, Precision.choose("bf16", "cpu"))
>>> loss = step(x, y)            # one whole optimizer step; a 0-dim tensor, no host sync
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hybridnb.failures import first_line, free_memory, is_oom
from hybridnb.speedups.exact import first_tensor
from hybridnb.strategies.base import SingleDevice, Strategy
from hybridnb.torch_state import evaluating, meta_state, on_meta
from hybridnb.train.precision import Precision


class TrainStep:
    """``guard``: a ``recovery.LossGuard`` judging each loss before the optimizer steps;
    ``on_applied``: called after every applied update (the EMA); ``loss_scale``: the factor the
    loss is multiplied by before backward when the forward runs on another device than the
    optimizer's (the per-batch CPU fallback), so gradients match the device's GradScaler."""

    def __init__(self, model: torch.nn.Module, loss_fn: Callable, optimizer: torch.optim.Optimizer,
                 precision: Precision, *, clip_grad: float | None = None,
                 strategy: Strategy | None = None, params: list[torch.Tensor] | None = None,
                 guard=None, on_applied: Callable[[], None] | None = None,
                 loss_scale: Callable[[], float] | None = None) -> None:
        self.model, self.loss_fn, self.optimizer = model, loss_fn, optimizer
        self.autocast, self.scaler = precision.autocast, precision.scaler
        self.strategy = strategy if strategy is not None else SingleDevice(precision.device)
        self.params = params if params is not None else [
            p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
        self.clip_grad, self.guard, self.on_applied = clip_grad, guard, on_applied
        # decided once: who runs backward, who runs the update, whether the norm is read
        if loss_scale is not None:
            self._backward = lambda loss, last: (loss * loss_scale()).backward()
        elif self.strategy.owns_update:
            self._backward = self.strategy.backward
        else:
            self._backward = lambda loss, last: self.scaler.scale(loss).backward()
        self.update = self._engine_update if self.strategy.owns_update else self._optimizer_update
        self._read_norm = not self.scaler.is_enabled()  # a GradScaler skips inf steps itself

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One whole optimizer step on one batch; returns the loss (0-dim, detached, no sync)."""
        total = self.accumulate([(x, y, 1.0)], int(x.shape[0]))
        self.update(total, read=self.guard is not None)
        return total

    def accumulate(self, pieces: list, samples: int) -> torch.Tensor:
        """Forward and backward of every micro-batch ``(x, y, weight)``; each loss is weighted
        by its share of the window's ``samples``. Returns the summed (detached) loss."""
        # DeepSpeed: every rank runs as many backward passes (extra ones weigh nothing), and each
        # rank's gradients are weighted by its share of the global batch
        count, share = self.strategy.micro_plan(len(pieces), samples)
        pieces = list(pieces) + [(*pieces[-1][:2], 0.0)] * (count - len(pieces))
        total = 0.0
        for k, (x, y, weight) in enumerate(pieces):
            x, y = self.strategy.to_device(x), self.strategy.to_device(y)
            last = k == len(pieces) - 1
            with self.strategy.no_sync(self.model, last=last):
                with self.autocast():
                    loss = self.loss_fn(self.model(x), y) * weight
                self._backward(loss * share if share != 1.0 else loss, last)
            total = total + loss.detach()
        return total

    def _optimizer_update(self, total: torch.Tensor, read: bool = True) -> tuple:
        """Returns ``(loss, verdict)``: "ok" (applied), "nonfinite" or "spike" (skipped)."""
        self.scaler.unscale_(self.optimizer)
        norm = (torch.nn.utils.clip_grad_norm_(self.params, self.clip_grad)
                if self.clip_grad else None)
        loss = grad_norm = None
        if read and norm is not None and self._read_norm:  # one device sync for both
            loss, grad_norm = torch.stack([total.float(), norm.float()]).tolist()
        elif read:
            loss = float(total)
        verdict = self.guard.check(loss, grad_norm) if self.guard else "ok"
        if verdict == "ok":
            self.scaler.step(self.optimizer)
            if self.on_applied is not None:
                self.on_applied()
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return loss, verdict

    def _engine_update(self, total: torch.Tensor, read: bool = True) -> tuple:
        """The update when the strategy's engine (DeepSpeed) clips and steps: the loss guard
        decides first; a skipped step drops the engine's gradients."""
        loss = float(total)
        verdict = self.guard.verdict(loss) if self.guard else "ok"
        if verdict == "ok":
            if not self.strategy.step():  # the engine found non-finite gradients
                verdict = "nonfinite"
            elif self.on_applied is not None:
                self.on_applied()
        else:
            self.strategy.discard()
        if self.guard:
            self.guard.record(verdict, loss)
        return loss, verdict


def count_flops(model: torch.nn.Module, inputs: tuple | torch.Tensor, *, bus=None) -> int | None:
    """FLOPs of one forward and backward of ``model`` on ``inputs`` (``FlopCounterMode``:
    element-wise work is not counted, as is usual for MFU); gradients, BatchNorm statistics and
    training flags are kept. Counted on the meta device first (0.03 s for EEGNeX on 8 samples on
    a 2-core EPYC against 0.47 s for the real pass), else on the real tensors in fp32; out of
    memory there gives one "flops" note on ``bus`` and None (no MFU), other errors raise."""
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    counted = _count_on_meta(model, inputs)
    if counted is not None:
        return counted
    grads = [(p, p.grad) for p in model.parameters()]
    try:
        return _count_pass(model, inputs, model)
    except (MemoryError, RuntimeError) as exc:  # torch.OutOfMemoryError is a RuntimeError
        if not (is_oom(exc) or "out of memory" in str(exc)):
            raise
        skipped = (f"FLOP count skipped: an fp32 batch of {len(inputs[0])} ran out of memory "
                   f"({first_line(exc, limit=100)}); training goes on, MFU is not shown")
    finally:
        for p, g in grads:
            p.grad = g
    free_memory(inputs[0].device)  # outside the except: the failed pass's tensors are gone now
    if bus is not None:
        bus.note("flops", skipped)
    return None


def _count_pass(model: torch.nn.Module, inputs: tuple, call) -> int:
    """FLOPs of ``call(*inputs)`` and its backward with ``model`` in eval mode (no BatchNorm
    statistics update; the FLOPs of the layers are the same)."""
    from torch.utils.flop_counter import FlopCounterMode

    with evaluating(model), FlopCounterMode(display=False) as counter:
        loss = first_tensor(call(*inputs)).float().mean()
        if loss.requires_grad:
            loss.backward()
    return int(counter.get_total_flops())


def _count_on_meta(model: torch.nn.Module, inputs: tuple) -> int | None:
    """The count on meta tensors, or None when the model cannot run on meta."""
    from torch.func import functional_call

    try:
        swapped = meta_state(model)
        fake = tuple(on_meta(x) if isinstance(x, torch.Tensor) else x for x in inputs)
        return _count_pass(model, fake,
                           lambda *xs: functional_call(model, swapped, xs, tie_weights=True))
    except Exception:  # noqa: BLE001 - any failure on meta means: count on the real tensors
        return None
