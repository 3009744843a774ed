"""The Loop runs a fit in this process and says what happens on the bus, as typed events in
order: a listener of the user's own hears the view start, each step with its global step, each
epoch's end after its steps, the states kept, and the end."""

from __future__ import annotations

import torch
from torch import nn

from hybridnb.events import Event
from hybridnb.train.bus import Ended, EpochEnded, Started, StateKept, StepEnded
from hybridnb.train.trainer import Trainer


def data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return x, x.sum(dim=1, keepdim=True)


def test_a_listener_hears_typed_events_in_order_with_their_steps():
    tr = Trainer(nn.Linear(6, 1), device="cpu", isolate=False, batch_size=16, epochs=2, seed=0,
                 live=False, verbose=False, schedule=None, snapshot_every=3,
                 early_stopping=10)
    heard = []
    tr.bus.subscribe(heard.append)
    tr.fit(data(), val=data(32, seed=1))

    assert not tr.isolated
    # the start state is kept, then the view starts with the run's description
    assert isinstance(heard[0], StateKept) and heard[0].step == 0
    assert isinstance(heard[1], Started) and heard[1].run["steps_per_epoch"] == 4
    assert isinstance(heard[-1], Ended) and heard[-1].summary["history"].shape[0] == 2
    flow = [(type(e).__name__, e.step) for e in heard if isinstance(e, (StepEnded, EpochEnded))]
    assert flow == [("StepEnded", 1), ("StepEnded", 2), ("StepEnded", 3), ("StepEnded", 4),
                    ("EpochEnded", 4), ("StepEnded", 5), ("StepEnded", 6), ("StepEnded", 7),
                    ("StepEnded", 8), ("EpochEnded", 8)]
    steps = [e for e in heard if isinstance(e, StepEnded)]
    assert [(e.step, e.epoch, e.loss) for e in steps] == [
        (s, int(ep), loss) for s, ep, loss in tr.steps[["global_step", "epoch", "loss"]]
        .itertuples(index=False)]
    epochs = [e for e in heard if isinstance(e, EpochEnded)]
    assert [e.epoch for e in epochs] == [0, 1] and epochs[-1].history[-1]["step"] == 8
    # states kept: at the start, every 3 steps (snapshot_every) and at each epoch's end
    kept = [e.step for e in heard if isinstance(e, StateKept)]
    assert kept == [0, 3, 4, 6, 8]
    # the notes the view showed are the trainer's events, said through the same bus
    said = [e for e in heard if isinstance(e, Event)]
    assert [e.kind for e in said] == ["best_restored"] and said[0] in tr.events


def test_a_note_before_the_fit_is_queued_and_said_when_the_fit_opens_the_bus():
    tr = Trainer(nn.Linear(6, 1), device="cpu", isolate=False, batch_size=16, epochs=1,
                 live=False, verbose=False)
    tr.bus.note("mine", "said before the fit")
    assert ("mine", "said before the fit") in tr.bus.pending
    assert not any(e.kind == "mine" for e in tr.events)
    tr.fit(data())
    assert [e.kind for e in tr.events].count("mine") == 1 and not tr.bus.pending


def test_every_saved_field_of_the_run_state_survives_a_checkpoint_round_trip():
    """What a checkpoint holds of the run is ``SAVED``: each field set to a value of its own
    comes back from ``state_dict()`` as it was (a resume continues from exactly there)."""
    from hybridnb.train.state import SAVED, Best, EpochTotals, RunState

    before = RunState(epoch=2, batches_done=3, global_step=11, acc=EpochTotals(1.5, 6),
                      lr_scale=0.25, micro=4, history=[{"epoch": 0, "train_loss": 1.0}],
                      steps=[(1, 0, 0.5, 1e-3)], events=[Event("note", "said", step=1)],
                      epoch_first_event=1, best=Best(0.1, 9, 1, 2, None),
                      epoch_start={"torch": None, "loader": None})
    after = RunState()
    after.load_state_dict({**before.state_dict(), "rng": None})
    for name in SAVED:
        if name == "history":  # rows come back with every history column
            assert after.history[0]["train_loss"] == 1.0
            continue
        assert getattr(after, name) == getattr(before, name), name
