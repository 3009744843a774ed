"""Batches as every strategy sees them: the resumable batch order (each rank's shard of it under
DDP) and a batch's number of samples.

``ResumableBatchSampler`` draws each epoch's order from the loader's own generator, and can start
an epoch at batch k without reading the k batches before it, so a run resumed mid-epoch sees
exactly the batches a straight run would have seen next.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class ResumableBatchSampler(Sampler[list[int]]):
    """Batches of indices over ``n`` samples; ``skip(k)`` makes the next epoch start at batch k."""

    def __init__(self, n: int, batch_size: int, shuffle: bool, generator: torch.Generator) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be >= 1")
        self.n, self.batch_size, self.shuffle = int(n), int(batch_size), shuffle
        self.generator = generator
        self._skip = 0
        # (start, stop) of each batch this process takes from an epoch's order
        self.spans = [(s, min(s + self.batch_size, self.n))
                      for s in range(0, self.n, self.batch_size)]

    def skip(self, batches: int) -> None:
        self._skip = int(batches)

    def __iter__(self) -> Iterator[list[int]]:
        order = (torch.randperm(self.n, generator=self.generator).tolist() if self.shuffle
                 else list(range(self.n)))
        start, self._skip = self._skip, 0
        for lo, hi in self.spans[start:]:
            yield order[lo:hi]

    def __len__(self) -> int:
        return len(self.spans)


def batch_len(batch) -> int:
    """Number of samples in a batch ``x`` or ``(x, y, *extras)``."""
    x = batch[0] if isinstance(batch, (tuple, list)) else batch
    return int(x.shape[0])
