"""Each row the live view gets says its kind by its type (step, validation, epoch), in process
and from an isolated worker; loggers and the live record read the type, not the keys."""

from __future__ import annotations

import pytest
from tiny import sine_data, sine_net

from hybridnb.events import EpochRow, StepRow, ValidationRow, row_kind
from hybridnb.live.record import RunRecord
from hybridnb.train import opening
from hybridnb.train.trainer import Trainer


class Rows:
    stop_requested = False

    def __init__(self):
        self.rows = []

    def start(self, run):
        pass

    def update(self, row):
        self.rows.append(row)

    def event(self, ev):
        pass

    def end(self, summary):
        pass


@pytest.mark.parametrize("isolate", [False, True])
def test_a_fits_rows_are_typed_by_kind(monkeypatch, isolate):
    view = Rows()
    monkeypatch.setattr(opening, "make_view", lambda live, **k: view)
    tr = Trainer(sine_net(), device="cpu", batch_size=32, epochs=2, val_every=2, live="text",
                 verbose=False, isolate=isolate)
    tr.fit(sine_data(128), val=sine_data(64, seed=1))  # 4 steps an epoch
    kinds = [type(r) for r in view.rows]
    assert kinds.count(StepRow) == 8 and kinds.count(EpochRow) == 2
    assert kinds.count(ValidationRow) == 4  # every 2 steps
    assert all(row_kind(r) == t.kind for r, t in zip(view.rows, kinds, strict=True))
    assert all(r["epoch_end"] for r in view.rows if isinstance(r, EpochRow))


def test_the_record_reads_a_rows_type_not_its_keys():
    record = RunRecord({"epochs": 1, "steps_per_epoch": 2})
    record.add(StepRow(global_step=1, epoch=0, loss=1.0, lr=0.1))
    record.add(ValidationRow(global_step=1, epoch=0, val_loss=0.5))  # few keys: still typed
    record.add(StepRow(global_step=2, epoch=0, loss=0.8, lr=0.1))
    record.add(EpochRow(global_step=2, epoch=0, train_loss=0.9, epoch_end=True))
    assert record.steps == [1, 2] and [(r["global_step"], r["val_loss"]) for r in record.val_rows] == [(1, 0.5)]
    assert len(record.epoch_ends) == 1 and record.at_epoch_end
