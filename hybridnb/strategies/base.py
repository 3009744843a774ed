"""The whole interface of a strategy: everything that changes between one device and many.

A strategy also says what it supports (precisions, compile, whether its engine owns the update);
the Trainer asks once and never gets patched.
"""

from __future__ import annotations

import contextlib

import torch

from hybridnb.strategies.batches import ResumableBatchSampler


class Strategy:
    """One process, one device: every method of the interface, with its one-process answer.
    ``accelerator``: whether GPU-only recovery (CPU fallbacks) applies."""

    name = "single"
    rank = 0
    world_size = 1
    owns_update = False  # True: its engine runs backward (`backward(loss, last)`) and the step
    supported_precisions: tuple[str, ...] = ("fp32", "bf16", "fp16")
    supports_compile = True

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.accelerator = self.device.type != "cpu"

    @property
    def is_main(self) -> bool:
        """This process draws the live view and writes files."""
        return self.rank == 0

    def configure(self, batch_size: int, clip_grad: float | None) -> None:
        """The Trainer's settings an engine needs before ``wrap`` (DeepSpeed's config)."""

    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> torch.nn.Module:
        """The module the training step calls (DDP wraps it; DeepSpeed builds its engine)."""
        return model

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.device, non_blocking=self.device.type == "cuda")

    def batch_sampler(self, n: int, batch_size: int, shuffle: bool,
                      generator: torch.Generator) -> ResumableBatchSampler:
        """Batches of indices for this process (DDP: this rank's shard)."""
        return ResumableBatchSampler(n, batch_size, shuffle, generator, self.rank,
                                     self.world_size)

    def no_sync(self, model: torch.nn.Module, last: bool) -> contextlib.AbstractContextManager:
        """Context for a micro-step's forward+backward (DDP: no gradient all-reduce)."""
        return contextlib.nullcontext()

    def micro_plan(self, pieces: int, samples: int) -> tuple[int, float]:
        """How many micro-batches this step runs, and the factor on this process's loss for
        backward (DeepSpeed: the same count on every rank, weighed by its share)."""
        return pieces, 1.0

    def settle(self, params: list[torch.Tensor], total: torch.Tensor | None, window: list,
               failed: BaseException | None = None) -> torch.Tensor | None:
        """Agree on a step across processes (one process: nothing to agree on)."""
        return total

    def step(self) -> bool:
        """The engine's optimizer step (only called when ``owns_update``); False if skipped."""
        raise NotImplementedError(f"strategy {self.name!r} does not own the update")

    def discard(self) -> None:
        """Drop gradients of a failed or skipped step that live outside ``param.grad``."""

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        return optimizer.state_dict()

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        optimizer.load_state_dict(state)

    def for_file(self, state: dict) -> dict:
        """The state rank 0 writes to disk (DeepSpeed gathers every rank's partition)."""
        return state

    def file_ready(self, state: dict) -> bool:
        """Whether an in-memory snapshot can be written as a checkpoint as it is."""
        return True

    def agree(self, flag: bool) -> bool:
        """True when any process says True: all then take the same branch."""
        return flag

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum of numbers over processes."""
        return values

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate a per-process tensor along dim 0 over processes."""
        return tensor

    def barrier(self) -> None:
        pass

    def on_cpu(self) -> Strategy:
        """The strategy to continue with after the device was lost."""
        return SingleDevice("cpu")


SingleDevice = Strategy  # one process on one device (the default): the interface's own answers
