"""Batches as every strategy sees them, and a batch's number of samples.

``ResumableBatchSampler`` draws each epoch's order from the loader's own generator, and can start
an epoch at batch k without reading the k batches before it, so a run resumed mid-epoch sees
exactly the batches a straight run would have seen next.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


def global_batches(n: int, batch: int, world: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of each global batch (``batch`` samples per rank) in an epoch's order.
    A last global batch too small to give every rank a sample joins the one before it, so every
    rank gets the same number of batches and none is empty (collectives stay in step)."""
    size = batch * world
    spans = [(s, min(s + size, n)) for s in range(0, n, size)]
    if len(spans) > 1 and spans[-1][1] - spans[-1][0] < world:
        spans[-2:] = [(spans[-2][0], spans[-1][1])]
    return spans


def shard(start: int, stop: int, rank: int, world: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous part of ``[start, stop)``: sizes differ by at most one, in rank
    order, so concatenating the ranks' parts gives back the global batch in order."""
    base, extra = divmod(stop - start, world)
    lo = start + rank * base + min(rank, extra)
    return lo, lo + base + (rank < extra)


class ResumableBatchSampler(Sampler[list[int]]):
    """Batches of indices over ``n`` samples; ``skip = k`` makes the next epoch start at batch k.
    Of ``world_size`` ranks (DDP), rank ``rank`` takes its slice of every global batch
    (``batch_size x world_size``, cut as one process with that batch size would); every rank
    draws the same order from rank 0's generator state."""

    def __init__(self, n: int, batch_size: int, shuffle: bool, generator: torch.Generator,
                 rank: int = 0, world_size: int = 1) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be >= 1")
        if world_size > 1 and n < world_size:
            raise ValueError(f"{n} samples cannot be shared by {world_size} processes (each needs "
                             "at least one); use more data or fewer processes")
        self.n, self.batch_size, self.shuffle = int(n), int(batch_size), shuffle
        self.generator = generator
        self.world_size = world_size  # data.make_loader takes a DataLoader sharded this way
        self.skip = 0
        # (start, stop) of each batch this process takes from an epoch's order
        self.spans = [shard(lo, hi, rank, world_size)
                      for lo, hi in global_batches(self.n, self.batch_size, world_size)]

    def __iter__(self) -> Iterator[list[int]]:
        order = (torch.randperm(self.n, generator=self.generator).tolist() if self.shuffle
                 else list(range(self.n)))
        start, self.skip = self.skip, 0
        for lo, hi in self.spans[start:]:
            yield order[lo:hi]

    def __len__(self) -> int:
        return len(self.spans)


def batch_len(batch) -> int:
    """Number of samples in a batch ``x`` or ``(x, y, *extras)``."""
    x = batch[0] if isinstance(batch, (tuple, list)) else batch
    return int(x.shape[0])
