"""Building a Trainer freezes the Python heap only while it builds (train/heap.py)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn

import hybridnb as hn
from hybridnb.train.heap import frozen_heap


class _Cycle:
    """Garbage only the cyclic collector can free."""

    def __init__(self) -> None:
        self.me = self


def _trainer(seen: list[int], **kw) -> hn.Trainer:
    def optimizer(params):
        seen.append(gc.get_freeze_count())  # the optimizer is built while the Trainer builds
        return torch.optim.AdamW(params, lr=1e-3)

    return hn.Trainer(nn.Linear(4, 1), optimizer=optimizer, device="cpu", live=False,
                      verbose=False, **kw)


@pytest.fixture
def clean_gc():
    was = gc.isenabled()
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.enable() if was else gc.disable()


def test_the_heap_is_frozen_while_the_trainer_builds_and_given_back(clean_gc):
    garbage = _Cycle()
    gone = weakref.ref(garbage)
    del garbage
    seen: list[int] = []
    _trainer(seen)
    assert seen and seen[0] > 1000  # the objects that were there before were frozen
    assert gc.get_freeze_count() == 0 and gc.isenabled()
    gc.collect()
    assert gone() is None  # the garbage from before was not kept from the collector


def test_a_failing_build_gives_the_heap_back(clean_gc):
    def bad(params):
        raise RuntimeError("no optimizer today")

    with pytest.raises(RuntimeError, match="no optimizer today"):
        hn.Trainer(nn.Linear(4, 1), optimizer=bad, device="cpu", live=False, verbose=False)
    assert gc.get_freeze_count() == 0


def test_a_heap_the_user_froze_or_a_collector_turned_off_is_left_as_it_was(clean_gc):
    gc.freeze()
    frozen = gc.get_freeze_count()
    _trainer([])
    # not unfrozen behind the user's back (that empties the permanent generation); a few
    # frozen objects may die meanwhile, by reference counting
    assert gc.get_freeze_count() >= 0.99 * frozen
    gc.unfreeze()
    gc.disable()
    seen: list[int] = []
    _trainer(seen)
    assert seen == [0] and not gc.isenabled()
    with frozen_heap() as froze:
        assert froze is False
