"""Loggers (issue 21): history.csv written as each epoch ends (a SIGKILLed run keeps its finished
epochs, parseable), TensorBoard scalars per step and per epoch, where they write and the clear
errors when they cannot."""

from __future__ import annotations

import os
import shutil
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
    import sys

    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed
    for logger in ("tensorboard", loggers.TensorBoardLogger()):  # said at construction
        with pytest.raises(ImportError, match=r"pip install 'hybridnb\[tensorboard\]'"):
            trainer(logger=logger, log_dir=tmp_path)


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


# ------------------------------------------------------------------ logger objects (issue 35)
class Recorder:
    """A user's own logger: the three methods of loggers.Logger, and every step's row."""

    per_step = True

    def __init__(self):
        self.params, self.rows, self.steps, self.closed = [], [], [], 0

    def log_hparams(self, params):
        self.params.append(params)

    def log_metrics(self, metrics, step):
        (self.rows if "epoch" in metrics else self.steps).append((step, metrics))

    def close(self):
        self.closed += 1


def test_logger_objects_beside_the_names(tmp_path):
    mine, own_csv = Recorder(), loggers.CsvLogger(tmp_path / "elsewhere")
    tr = trainer(log_dir=tmp_path / "logs", epochs=2, logger=["csv", mine, own_csv])
    tr.fit(data(), val=data(64, seed=1))

    assert len(mine.params) == 1 and mine.closed == 1
    params = mine.params[0]
    assert params["lr"] == 1e-2 and params["epochs"] == 2 and params["batch_size"] == 32
    assert params["model"] == "Sequential" and params["n_params"] == 161
    assert params["loss"] == "mse" and params["checkpoint_dir"] is None
    assert [s for s, _ in mine.rows] == [4, 8]  # each epoch's row at its last global step
    assert [m["val_loss"] for _, m in mine.rows] == pytest.approx(tr.history["val_loss"].tolist())
    assert [s for s, _ in mine.steps] == list(range(1, 9))
    assert [m["train/loss"] for _, m in mine.steps] == pytest.approx(tr.steps["loss"].tolist())
    for folder in ("logs", "elsewhere"):  # the name, an object with its own folder
        assert pd.read_csv(tmp_path / folder / "history.csv")["epoch"].tolist() == [0, 1]
    assert tr.settings.loggers[0] == "csv" and tr.settings.for_worker().logger is None


def test_what_is_not_a_logger_is_refused_naming_what_it_lacks(tmp_path):
    with pytest.raises(ValueError, match=r"a object is not a logger, it lacks log_hparams, "
                                         r"log_metrics, close"):
        trainer(logger=object(), log_dir=tmp_path)
    with pytest.raises(ValueError, match=r"passes the class CsvLogger: pass an instance"):
        trainer(logger=loggers.CsvLogger, log_dir=tmp_path)
    with pytest.raises(ValueError, match="log_dir="):  # a folderless CsvLogger needs log_dir
        trainer(logger=loggers.CsvLogger())
    with pytest.raises(ValueError, match=r"two CsvLoggers would write into one folder"):
        trainer(logger=["csv", loggers.CsvLogger()], log_dir=tmp_path)
    folderless = trainer(logger=[loggers.CsvLogger()], log_dir=tmp_path, epochs=1)
    folderless.fit(data())  # an object without a folder writes into log_dir
    assert pd.read_csv(tmp_path / "history.csv")["epoch"].tolist() == [0]
    assert trainer(logger=Recorder()).settings.log_folder is None  # needs no folder


def test_a_logger_whose_package_is_missing_says_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r"MLflowLogger needs the mlflow package: pip install "
                                          r"'hybridnb\[loggers\]'"):
        loggers.MLflowLogger()
    with pytest.raises(ImportError, match=r"WandbLogger needs the wandb package: pip install "
                                          r"'hybridnb\[loggers\]'"):
        loggers.WandbLogger()


def test_mlflow_file_store_read_back_by_mlflows_own_client(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks it for a file store
    uri = (tmp_path / "mlruns").as_uri()  # file:///...
    logger = loggers.MLflowLogger(uri, experiment="c1", run_name="first")
    tr = trainer(logger=logger, epochs=2)
    tr.fit(data(), val=data(64, seed=1))

    client = MlflowClient(uri)
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "first"
    assert client.get_experiment(run.info.experiment_id).name == "c1"
    assert run.data.params["lr"] == "0.01" and run.data.params["epochs"] == "2"
    val = client.get_metric_history(logger.run_id, "val_loss")
    assert [m.step for m in val] == [4, 8]
    assert [m.value for m in val] == pytest.approx(tr.history["val_loss"].tolist())
    steps = client.get_metric_history(logger.run_id, "train/loss")
    assert [m.step for m in steps] == list(range(1, 9))
    assert "events" not in run.data.metrics  # numbers only


def wandb_records(path: Path) -> list:
    """The records of a W&B run file (``run-<id>.wandb``: a ':W&B' header, then LevelDB's log
    format: 32 KiB blocks of chunks with a 7-byte header each, protobuf ``Record``s)."""
    from wandb.proto import wandb_internal_pb2 as pb

    raw = path.read_bytes()
    assert raw[:4] == b":W&B"
    pos, out, buf = 7, [], b""
    while pos + 7 <= len(raw):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        length, kind = int.from_bytes(raw[pos + 4:pos + 6], "little"), raw[pos + 6]
        chunk = raw[pos + 7:pos + 7 + length]
        pos += 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk  # full/first start, middle/last add
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            out.append(record)
    return out


def test_wandb_offline_writes_its_run_files_and_no_network(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # any network use would fail
    logger = loggers.WandbLogger(project="c1", dir=tmp_path / "wb")
    tr = trainer(logger=logger, epochs=2)
    tr.fit(data(), val=data(64, seed=1))

    import wandb

    wandb.teardown()  # wandb's service process writes the run file after finish() returns
    files = list((tmp_path / "wb" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1 and logger.run is None  # finished at the fit's end
    records = wandb_records(files[0])
    config = {i.key: i.value_json for r in records for i in (
        r.run.config.update if r.WhichOneof("record_type") == "run" else
        r.config.update if r.WhichOneof("record_type") == "config" else ())}
    assert config["lr"] == "0.01" and config["model"] == '"Sequential"'
    history = [{i.key or ".".join(i.nested_key): i.value_json for i in r.history.item}
               for r in records
               if r.WhichOneof("record_type") == "history"]
    val = [(int(h["_step"]), float(h["val_loss"])) for h in history if "val_loss" in h]
    assert [s for s, _ in val] == [4, 8]
    assert [v for _, v in val] == pytest.approx(tr.history["val_loss"].tolist())
    assert sum("train/loss" in h for h in history) == 8
    assert any(r.WhichOneof("record_type") == "exit" for r in records)


# ------------------------------------------------------------ messages through logging
def test_the_librarys_notes_are_records_of_the_hybridnb_logger(tmp_path, caplog):
    trainer(checkpoint_dir=tmp_path, epochs=1).fit(data())
    caplog.set_level("INFO", logger="hybridnb")
    tr = trainer(checkpoint_dir=tmp_path, epochs=1, verbose=False)
    tr.fit(data())
    records = [r for r in caplog.records if r.name == "hybridnb"]
    earlier = [r for r in records if r.kind == "earlier_run"]
    assert len(earlier) == 1 and earlier[0].levelname == "INFO"
    assert str(next(e for e in tr.events if e.kind == "earlier_run")) == earlier[0].getMessage()
    assert any(r.kind == "start" and "Sequential" in r.getMessage() for r in records)
    # each of the fit's notes once (records of other runs' threads may share the logger)
    messages = [r.getMessage() for r in records]
    assert tr.events and all(messages.count(str(e)) == 1 for e in tr.events)

    caplog.clear()
    caplog.set_level("WARNING", logger="hybridnb")  # the user's filter: warnings only
    shutil.rmtree(tmp_path)
    trainer(checkpoint_dir=tmp_path, epochs=2, callbacks=[RemoveAfterFirst(tmp_path)]).fit(
        data())
    said = [(r.levelname, r.kind) for r in caplog.records if r.name == "hybridnb"]
    assert said and all(s == ("WARNING", "storage") for s in said), said


class RemoveAfterFirst:
    def __init__(self, folder):
        self.folder = folder

    def on_epoch_end(self, trainer, row):
        if row["epoch"] == 0:
            shutil.rmtree(self.folder)


PRINTS = r"""
import logging, sys, torch
sys.path.insert(0, sys.argv[1])
from tiny import sine_data, sine_net
from hybridnb.train.trainer import Trainer

def fit(verbose):
    tr = Trainer(sine_net(16), device="cpu", batch_size=32, epochs=1, live=False,
                 isolate=False, verbose=verbose)
    tr.fit(sine_data(64, 8, 0))
    tr.event("note", "a note from the test")

fit(True)  # the stderr printer only
print("=== configured", file=sys.stderr, flush=True)
logging.basicConfig(level=logging.INFO, format="LOG %(levelname)s %(kind)s: %(message)s")
fit(False)  # the user's logging configuration prints them, the printer is off
"""


def test_nothing_is_printed_twice_and_a_configured_logging_gets_the_notes(tmp_path):
    script = tmp_path / "prints.py"
    script.write_text(PRINTS)
    out = subprocess.run([sys.executable, str(script), str(ROOT / "tests")],
                         capture_output=True, text=True, timeout=240, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    plain, configured = out.stderr.split("=== configured")
    assert plain.count("a note from the test") == 1 and "LOG" not in plain
    assert configured.count("a note from the test") == 1
    assert "LOG INFO note: [step 2] note: a note from the test" in configured
    assert "LOG INFO start: Sequential" in configured


# ------------------------------------------------------------------------ model summary
def test_model_summary_on_request_and_in_the_report(tmp_path):
    pytest.importorskip("torchinfo")
    tr = trainer(epochs=1)
    assert "Output Shape" not in str(tr.model_summary())  # before a fit: parameters only
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    rng = torch.random.get_rng_state()
    tr.fit(data())
    after = {k: v.clone() for k, v in tr.model.state_dict().items()}
    table = str(tr.model_summary())
    assert "Output Shape" in table and "[1, 16]" in table and "Total params: 161" in table
    assert all(torch.equal(after[k], v) for k, v in tr.model.state_dict().items())
    assert before.keys() == after.keys() and not torch.equal(rng, torch.random.get_rng_state())
    tr.report(tmp_path / "report")
    assert "Total params: 161" in (tmp_path / "report" / "model.txt").read_text()


def test_an_mlflow_store_that_cannot_open_says_what_to_pass(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    try:
        import sqlalchemy  # noqa: F401 — the full mlflow opens sqlite stores
        pytest.skip("the full mlflow package is installed: sqlite stores open")
    except ImportError:
        pass
    from hybridnb.train.loggers import MLflowLogger

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="sqlite:///mlflow.db.*pip install mlflow.*file:./mlruns"):
        MLflowLogger("sqlite:///mlflow.db")
