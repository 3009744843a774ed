"""DataLoaders for the Trainer: built from a Dataset with a resumable batch order.

``ResumableBatchSampler`` draws each epoch's order from the loader's own generator, and can start
an epoch at batch k without reading the k batches before it, so a run resumed mid-epoch sees
exactly the batches a straight run would have seen next.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset


class ResumableBatchSampler(Sampler[list[int]]):
    """Batches of indices over ``n`` samples; ``skip(k)`` makes the next epoch start at batch k."""

    def __init__(self, n: int, batch_size: int, shuffle: bool, generator: torch.Generator,
                 drop_last: bool = False) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be >= 1")
        self.n, self.batch_size, self.shuffle = int(n), int(batch_size), shuffle
        self.generator, self.drop_last = generator, drop_last
        self._skip = 0

    def skip(self, batches: int) -> None:
        self._skip = int(batches)

    def __iter__(self) -> Iterator[list[int]]:
        order = (torch.randperm(self.n, generator=self.generator).tolist() if self.shuffle
                 else list(range(self.n)))
        start, self._skip = self._skip, 0
        for b in range(start, len(self)):
            yield order[b * self.batch_size:(b + 1) * self.batch_size]

    def __len__(self) -> int:
        return self.n // self.batch_size if self.drop_last else math.ceil(self.n / self.batch_size)


def as_dataset(data) -> Dataset | DataLoader:
    """A Dataset or DataLoader as given; ``(X, y)`` arrays/tensors become a TensorDataset."""
    if isinstance(data, (Dataset, DataLoader)):
        return data
    if isinstance(data, (tuple, list)) and len(data) >= 1 and all(
            isinstance(a, (np.ndarray, torch.Tensor)) for a in data):
        return TensorDataset(*(torch.as_tensor(a) for a in data))
    if isinstance(data, (np.ndarray, torch.Tensor)):
        return TensorDataset(torch.as_tensor(data))
    if hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        return data
    raise TypeError(f"data of type {type(data).__name__} is not a Dataset, a DataLoader or "
                    "(X, y) arrays")
