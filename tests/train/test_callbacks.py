"""Callbacks (issue 21): called once per hook, in the user's process, also when the fit trains in
an isolated worker and when that worker is killed mid-run (no duplicate epochs, in callbacks or
in history.csv); an exception in a callback names it and keeps the run's last checkpoint."""

from __future__ import annotations

import os
import threading

import pandas as pd
import psutil
import pytest
import torch
from tiny import sine_data, sine_net

from hybridnb.env import FAULT_ENV
from hybridnb.train import checkpoint, recovery
from hybridnb.train.callbacks import CallbackError
from hybridnb.train.trainer import Trainer

torch.set_num_threads(1)
EPOCHS = 3


def data(n=128, d=8, seed=0):
    return sine_data(n, d, seed)


def net():
    return sine_net(16)


class Record:
    """Where and with what each hook was called (as a notebook cell's callback would); its lock
    cannot be pickled: a callback never travels to a worker."""

    def __init__(self):
        self.calls = []
        self.lock = threading.Lock()

    def on_fit_start(self, trainer):
        self.calls.append(("start", os.getpid(), None))

    def on_epoch_end(self, trainer, row):
        self.calls.append(("epoch", os.getpid(), row))

    def on_fit_end(self, trainer):
        self.calls.append(("end", os.getpid(), trainer.global_step))


class OnlyEpochs:
    def __init__(self):
        self.epochs = []

    def on_epoch_end(self, trainer, row):
        self.epochs.append(row["epoch"])


class Boom:
    def on_epoch_end(self, trainer, row):
        if row["epoch"] == 1:
            raise KeyError("no such column")


def trainer(tmp_path, callbacks, **kw):
    kw = {"device": "cpu", "batch_size": 32, "epochs": EPOCHS, "lr": 1e-2, "seed": 0,
          "live": False, "isolate": False, "checkpoint_dir": tmp_path / "ck",
          "snapshot_every": 2, **kw}
    return Trainer(net(), callbacks=callbacks, **kw)


@pytest.fixture(autouse=True)
def _fresh_lost_devices(monkeypatch):
    monkeypatch.setattr(recovery, "_LOST", set())


def check_calls(rec: Record, tr: Trainer) -> None:
    assert [c[0] for c in rec.calls] == ["start"] + ["epoch"] * EPOCHS + ["end"]
    assert {c[1] for c in rec.calls} == {os.getpid()}  # every hook ran in this process
    rows = [c[2] for c in rec.calls if c[0] == "epoch"]
    assert [r["epoch"] for r in rows] == list(range(EPOCHS))
    assert [r["val_loss"] for r in rows] == pytest.approx(tr.history["val_loss"].tolist())
    assert rec.calls[-1][2] == tr.global_step == EPOCHS * 4
    csv = pd.read_csv(tr.checkpoint_dir / "history.csv")
    assert csv["epoch"].tolist() == list(range(EPOCHS))  # each epoch once


def test_callbacks_in_process_and_missing_methods_skipped(tmp_path):
    rec, only = Record(), OnlyEpochs()
    tr = trainer(tmp_path, [rec, only])
    tr.fit(data(), val=data(64, seed=1))
    check_calls(rec, tr)
    assert only.epochs == list(range(EPOCHS))


@pytest.mark.slow
@pytest.mark.parametrize("fault", [None, "step:kill:5"])
def test_isolated_fit_calls_back_in_the_kernel_also_when_the_worker_dies(tmp_path, monkeypatch,
                                                                         fault):
    if fault:
        monkeypatch.setenv(FAULT_ENV, fault)
    rec = Record()
    tr = trainer(tmp_path, [rec], isolate=True)
    tr.fit(data(), val=data(64, seed=1))
    assert [e.kind for e in tr.events].count("worker_lost") == (1 if fault else 0)
    check_calls(rec, tr)
    assert tr.predict(data(32, seed=2)[0]).shape == (32,)  # evaluate/predict jobs too
    assert not [p for p in psutil.Process().children(recursive=True) if p.status() != "zombie"]


def test_a_failing_callback_is_named_and_the_last_checkpoint_kept(tmp_path):
    tr = trainer(tmp_path, [Boom()])
    with pytest.raises(CallbackError, match=r"Boom\.on_epoch_end raised KeyError") as err:
        tr.fit(data(), val=data(64, seed=1))
    assert isinstance(err.value.__cause__, KeyError)
    last = checkpoint.load(tmp_path / "ck" / "last.pt")
    assert last["position"]["epoch"] == 2 and len(last["history"]) == 2  # epoch 1 was saved
    assert pd.read_csv(tmp_path / "ck" / "history.csv")["epoch"].tolist() == [0, 1]
    resumed = trainer(tmp_path, [])
    resumed.fit(data(), val=data(64, seed=1), resume=True)
    assert resumed.history["epoch"].tolist() == list(range(EPOCHS))


def test_callback_mistakes_are_clear(tmp_path):
    with pytest.raises(TypeError, match=r"callbacks=\[Record\(\)\]"):
        trainer(tmp_path, [Record])
    with pytest.raises(TypeError, match="object has none of the methods"):
        trainer(tmp_path, [object()])
