"""A DataLoader a user builds on this rank's shard (``ResumableBatchSampler``) is taken as it is
under DDP; one that would give every rank all of the data is refused."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from hybridnb.strategies.base import Strategy
from hybridnb.strategies.batches import ResumableBatchSampler
from hybridnb.train.data import make_loader


class TwoRanks(Strategy):
    world_size = 2


def loader_for(data):
    return make_loader(data, batch_size=2, shuffle=False, what="train", seed=0,
                       strategy=TwoRanks("cpu"), loader_kwargs={}, bus=None)


def test_a_dataloader_sharded_for_this_rank_is_used_and_an_unsharded_one_refused():
    ds = TensorDataset(torch.arange(8.0), torch.arange(8.0))
    sharded = DataLoader(ds, batch_sampler=ResumableBatchSampler(8, 2, False, torch.Generator(),
                                                                 rank=1, world_size=2))
    assert loader_for(sharded) is sharded
    with pytest.raises(ValueError, match="pass the Dataset, not a DataLoader"):
        loader_for(DataLoader(ds, batch_size=2))
