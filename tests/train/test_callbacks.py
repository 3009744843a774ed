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
from faults import FAULT_ENV
from tiny import sine_data, sine_net

from hybridnb import failures
from hybridnb.train import checkpoint
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
    monkeypatch.setattr(failures, "_LOST", set())


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


class Paced(torch.nn.Module):
    """sine_net with a pause in each training forward: an isolated worker's steps take longer
    than the kernel needs to read a row and answer (the test checks facts, not the clock)."""

    def __init__(self):
        super().__init__()
        self.net = sine_net(16)

    def forward(self, x):
        if self.training:
            import time
            time.sleep(0.02)
        return self.net(x)


class StopAt:
    """Sees every step's row; asks the run to stop at ``step``."""

    def __init__(self, step):
        self.step, self.rows, self.ended = step, [], False
        self.lock = threading.Lock()  # never pickled: it stays in this process

    def on_step_end(self, trainer, row):
        self.rows.append(row)
        if row["global_step"] >= self.step:
            trainer.should_stop = True

    def on_fit_end(self, trainer):
        self.ended = True


def check_stopped(tr: Trainer, cb: StopAt, ck, total: int) -> None:
    assert tr.stopped == "callback" and cb.ended
    assert cb.step <= tr.global_step < total
    last = checkpoint.load(ck / "last.pt")
    assert last["position"]["global_step"] == tr.global_step  # the state at the stop is kept
    for name, value in tr.model.state_dict().items():
        assert torch.equal(value, last["model"][name]), name
    assert len(tr.steps) == tr.global_step
    assert [e.kind for e in tr.events].count("callback") + [e.kind for e in tr.events].count(
        "stop_button") == 1


def test_on_step_end_sees_each_step_and_a_callback_stops_the_run(tmp_path):
    cb = StopAt(6)
    tr = trainer(tmp_path, [cb])
    tr.fit(data(), val=data(64, seed=1))
    assert [r["global_step"] for r in cb.rows] == list(range(1, 7))
    assert {"global_step", "epoch", "loss", "lr"} <= set(cb.rows[0])
    assert cb.rows[-1]["loss"] == pytest.approx(tr.steps["loss"].iloc[-1])
    assert tr.global_step == 6  # right after the step it was asked at
    check_stopped(tr, cb, tmp_path / "ck", EPOCHS * 4)
    assert [e.kind for e in tr.events].count("callback") == 1
    resumed = trainer(tmp_path, [])
    resumed.fit(data(), val=data(64, seed=1), resume=True)  # continues from the stop
    assert resumed.global_step == EPOCHS * 4 and resumed.stopped is None


def test_a_stop_asked_in_on_epoch_end_ends_the_fit_after_that_epoch(tmp_path):
    class AfterFirstEpoch:
        asked = 0

        def on_epoch_end(self, trainer, row):
            if not self.asked:
                self.asked += 1
                trainer.should_stop = True

    tr = trainer(tmp_path, [AfterFirstEpoch()])
    tr.fit(data(), val=data(64, seed=1))
    assert tr.stopped == "callback" and tr.history["epoch"].tolist() == [0]
    assert checkpoint.load(tmp_path / "ck" / "last.pt")["position"]["epoch"] == 1
    tr.fit(data(), val=data(64, seed=1))  # a new fit starts with should_stop False
    assert tr.stopped is None and len(tr.history) == EPOCHS


@pytest.mark.slow
def test_a_callback_stops_an_isolated_fit_in_its_worker(tmp_path):
    cb = StopAt(3)
    epochs = 10
    tr = Trainer(Paced(), callbacks=[cb], device="cpu", batch_size=32, epochs=epochs, lr=1e-2,
                 seed=0, live=False, isolate=True, checkpoint_dir=tmp_path / "ck",
                 snapshot_every=2)
    tr.fit(data(), val=data(64, seed=1))
    assert cb.rows  # ran here, in the kernel, on the rows the worker sent
    check_stopped(tr, cb, tmp_path / "ck", epochs * 4)
    assert not [p for p in psutil.Process().children(recursive=True) if p.status() != "zombie"]
