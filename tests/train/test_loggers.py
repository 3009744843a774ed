"""Loggers (issue 21): history.csv written as each epoch ends (a SIGKILLed run keeps its finished
epochs, parseable), TensorBoard scalars per step and per epoch, where they write and the clear
errors when they cannot."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from tiny import sine_data, sine_net

from hybridnb.train import loggers
from hybridnb.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
torch.set_num_threads(1)


def data(n=128, d=8, seed=0):
    return sine_data(n, d, seed)


def net():
    return sine_net(16)


def trainer(**kw):
    kw = {"device": "cpu", "batch_size": 32, "epochs": 3, "lr": 1e-2, "seed": 0,
          "live": False, "isolate": False, **kw}
    return Trainer(net(), **kw)


def test_csv_rows_equal_the_history_and_a_resumed_fit_appends_each_epoch_once(tmp_path):
    tr = trainer(checkpoint_dir=tmp_path, epochs=2)
    tr.fit(data(), val=data(64, seed=1))
    csv = pd.read_csv(tmp_path / "history.csv")
    assert csv["epoch"].tolist() == [0, 1]
    assert csv["val_loss"].tolist() == pytest.approx(tr.history["val_loss"].tolist())
    assert list(csv.columns) == list(tr.history.columns)

    more = trainer(checkpoint_dir=tmp_path, epochs=4)
    more.fit(data(), val=data(64, seed=1), resume=True)
    csv = pd.read_csv(tmp_path / "history.csv")
    assert csv["epoch"].tolist() == [0, 1, 2, 3]
    assert csv["train_loss"].tolist() == pytest.approx(more.history["train_loss"].tolist())

    fresh = trainer(checkpoint_dir=tmp_path, epochs=1)  # an earlier run's log is set aside
    fresh.fit(data())
    assert pd.read_csv(tmp_path / "history.csv")["epoch"].tolist() == [0]
    earlier = [p for p in tmp_path.glob("earlier-*/history.csv")]
    assert len(earlier) == 1 and len(pd.read_csv(earlier[0])) == 4


def test_where_loggers_write_and_the_errors_when_they_cannot(tmp_path):
    logs = tmp_path / "logs"
    trainer(checkpoint_dir=tmp_path / "ck", log_dir=logs, epochs=1).fit(data())
    assert (logs / "history.csv").is_file() and not (tmp_path / "ck" / "history.csv").exists()

    quiet = trainer(epochs=1)  # the default logger without any folder writes nothing
    assert quiet.settings.loggers == ()
    assert trainer(epochs=1, logger=None, checkpoint_dir=tmp_path / "n").settings.loggers == ()

    with pytest.raises(ValueError, match="log_dir=.*checkpoint_dir="):
        trainer(logger="csv")
    with pytest.raises(ValueError, match="'wandb'"):
        trainer(logger=["csv", "wandb"], log_dir=logs)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="log_dir="):
        trainer(logger="csv", log_dir=blocker)


def test_tensorboard_without_the_package_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(loggers, "tensorboard_available", lambda: False)
    from hybridnb.train import settings

    monkeypatch.setattr(settings, "tensorboard_available", lambda: False)
    with pytest.raises(ImportError, match=r"pip install 'hybridnb\[tensorboard\]'"):
        trainer(logger="tensorboard", log_dir=tmp_path)


def test_tensorboard_scalars_per_step_and_per_epoch(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tr = trainer(logger=["csv", "tensorboard"], log_dir=tmp_path, epochs=2)
    tr.fit(data(), val=data(64, seed=1))
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/lr", "epoch/train_loss", "epoch/val_loss", "epoch/lr"} <= tags
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(1, 9))
    assert [e.value for e in acc.Scalars("train/loss")] == pytest.approx(
        tr.steps["loss"].tolist(), rel=1e-6)
    assert [e.step for e in acc.Scalars("epoch/val_loss")] == [4, 8]
    assert [e.value for e in acc.Scalars("epoch/val_loss")] == pytest.approx(
        tr.history["val_loss"].tolist(), rel=1e-6)
    assert (tmp_path / "history.csv").is_file()


CHILD = r"""
import sys, time, torch
from torch import nn
torch.set_num_threads(1)
from hybridnb.train.trainer import Trainer

class Slow(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(64, 8, generator=g)
        self.y = self.x.sum(1)
    def __len__(self):
        return 64
    def __getitem__(self, i):
        time.sleep(0.01)
        return self.x[i], self.y[i]

torch.manual_seed(0)
tr = Trainer(nn.Linear(8, 1), device="cpu", batch_size=16, epochs=50, live=False,
             isolate=False, checkpoint_dir=sys.argv[1])
tr.fit(Slow())
"""


@pytest.mark.slow
def test_sigkill_mid_run_leaves_every_finished_epochs_row(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    child = subprocess.Popen([sys.executable, str(script), str(tmp_path / "run")],
                             env={**os.environ, "PYTHONPATH": str(ROOT)},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    csv = tmp_path / "run" / "history.csv"
    deadline = time.time() + 120
    while child.poll() is None and time.time() < deadline:
        if csv.exists() and csv.read_text().count("\n") >= 3:  # header + epochs 0 and 1
            break
        time.sleep(0.02)
    assert child.poll() is None, child.communicate()[0].decode()[-2000:]
    child.send_signal(signal.SIGKILL)
    child.wait(30)
    rows = pd.read_csv(csv)
    assert len(rows) >= 2 and rows["epoch"].tolist() == list(range(len(rows)))
    assert rows["train_loss"].notna().all()
    assert len(rows) < 50
