"""Everyday misuse gets a clear answer (issue 21), each case done for real: targets on another
scale than the model's outputs, a model that returns a tuple or dict, torch loss modules that
would broadcast (batch, 1) against (batch,), a disk that fails mid-run, nothing to train."""

from __future__ import annotations

import builtins
import errno
import shutil
import subprocess

import pandas as pd
import pytest
import torch
from torch import nn

from hybridnb.train import checkpoint, loggers
from hybridnb.train.trainer import Trainer

torch.set_num_threads(1)


def data(n=128, d=8, seed=0, scale=1.0, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    return x, torch.sin(x @ torch.linspace(-1, 1, d)) * scale + shift


def net(outputs=1):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, outputs))


def trainer(model=None, **kw):
    kw = {"device": "cpu", "batch_size": 32, "epochs": 2, "lr": 1e-2, "seed": 0,
          "live": False, "isolate": False, **kw}
    return Trainer(model if model is not None else net(), **kw)


def kinds(tr, kind):
    return [e for e in tr.events if e.kind == kind]


# --- targets on another scale ----------------------------------------------------------------
@pytest.mark.parametrize("scale,shift,says", [
    (300.0, 500.0, ["std 2", "hundreds", "does not rescale"]),   # response times in ms
    (0.1, 1.5, ["mean 1.5", "target stds from the targets' mean"]),  # far from 0, small spread
])
def test_targets_on_another_scale_are_said_once_not_rescaled(scale, shift, says):
    x, y = data(scale=scale, shift=shift)
    before = y.clone()
    tr = trainer()
    tr.fit((x, y))
    said = kinds(tr, "target_scale")
    assert len(said) == 1, [str(e) for e in tr.events]
    for fact in says:
        assert fact in said[0].message, said[0].message
    assert torch.equal(y, before)  # the targets are the user's


def test_standardised_targets_get_no_note():
    tr = trainer()
    tr.fit(data())
    assert not kinds(tr, "target_scale")


# --- the model's output structure --------------------------------------------------------------
class Pair(nn.Module):
    def __init__(self, as_dict=False):
        super().__init__()
        self.net, self.as_dict = net(), as_dict

    def forward(self, x):
        out = self.net(x)
        return {"pred": out, "features": x} if self.as_dict else (out, x)


@pytest.mark.parametrize("as_dict,names", [(False, r"tuple \(\[0\]: tensor \(32, 1\), \[1\]"),
                                           (True, r"dict \('pred': tensor \(32, 1\)")])
def test_a_tuple_or_dict_output_is_named_with_how_to_train_it(as_dict, names):
    with pytest.raises(TypeError, match=names) as err:
        trainer(Pair(as_dict)).fit(data())
    assert "loss=lambda out, y" in str(err.value)
    # the advice works: a loss that picks the prediction trains
    pick = "pred" if as_dict else 0
    tr = trainer(Pair(as_dict), loss=lambda out, y: nn.functional.mse_loss(
        out[pick].squeeze(-1), y))
    tr.fit(data())
    assert tr.history["train_loss"].notna().all()


def test_torch_loss_modules_do_not_broadcast_column_against_flat_targets():
    named = trainer(loss="mse")
    named.fit(data())  # (32, 1) outputs, (32,) targets
    module = trainer(loss=nn.MSELoss())
    module.fit(data())
    assert module.steps["loss"].tolist() == named.steps["loss"].tolist()
    with pytest.raises(ValueError, match=r"shape \(32, 2\) but the targets have shape \(32,\)"):
        trainer(net(outputs=2), loss=nn.L1Loss()).fit(data())
    with pytest.raises(ValueError, match=r"loss=MSELoss\(\)"):
        trainer(loss=nn.MSELoss)


# --- storage failing mid-run -------------------------------------------------------------------
def test_checkpoint_writes_failing_mid_run_keep_the_run_and_the_last_good_file(tmp_path,
                                                                               monkeypatch):
    real, calls = torch.save, []

    def full_disk(obj, f, *a, **kw):
        calls.append(obj.get("position", {}).get("global_step") if isinstance(obj, dict)
                     else None)
        if len(calls) in (2, 3):  # the 2nd and 3rd writes find the disk full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(obj, f, *a, **kw)

    monkeypatch.setattr(torch, "save", full_disk)
    tr = trainer(checkpoint_dir=tmp_path, epochs=3, checkpoint_every=2, logger=None)
    tr.fit(data())  # writes at steps 2, 4 (fails), 4 end of epoch (fails), 6, ...
    assert tr.global_step == 12 and len(tr.history) == 3  # the run went on
    said = kinds(tr, "storage")
    assert len(said) == 2, [str(e) for e in tr.events]
    assert "last.pt" in said[0].message and "ENOSPC" in said[0].message
    assert "step 2" in said[0].message  # the last good file on disk, named
    assert "works again (2 writes missed" in said[1].message
    assert checkpoint.load(tmp_path / "last.pt")["position"]["global_step"] == 12
    assert not list(tmp_path.glob(".last.pt.tmp-*"))


def test_last_good_checkpoint_is_intact_while_writes_keep_failing(tmp_path, monkeypatch):
    real, calls = torch.save, []

    def read_only(obj, f, *a, **kw):
        calls.append(1)
        if len(calls) >= 2:
            raise OSError(errno.EROFS, "Read-only file system")
        return real(obj, f, *a, **kw)

    monkeypatch.setattr(torch, "save", read_only)
    tr = trainer(checkpoint_dir=tmp_path, epochs=2, logger=None)
    tr.fit(data())
    assert len(tr.history) == 2
    said = kinds(tr, "storage")
    assert len(said) == 1 and "EROFS" in said[0].message
    assert checkpoint.load(tmp_path / "last.pt")["position"]["global_step"] == 4


def test_a_log_write_failing_is_said_and_the_row_written_with_the_next(tmp_path, monkeypatch):
    appends = []

    def flaky_open(path, mode="r", *a, **kw):
        if "a" in mode:
            appends.append(path)
            if len(appends) == 2:
                raise OSError(errno.ENOSPC, "No space left on device")
        return builtins.open(path, mode, *a, **kw)

    monkeypatch.setattr(loggers, "open", flaky_open, raising=False)
    tr = trainer(log_dir=tmp_path, epochs=3)
    tr.fit(data())
    said = kinds(tr, "storage")
    assert len(said) == 2 and "history.csv" in said[0].message
    assert "ENOSPC" in said[0].message and "works again" in said[1].message
    assert pd.read_csv(tmp_path / "history.csv")["epoch"].tolist() == [0, 1, 2]


def _lock(folder) -> bool:
    """Make ``folder`` unwritable, for root too (chattr +i); False where that is impossible."""
    folder.chmod(0o555)
    try:
        (folder / ".probe").write_bytes(b"")
    except OSError:
        return True
    (folder / ".probe").unlink()
    return bool(shutil.which("chattr")) and subprocess.run(
        ["chattr", "+i", str(folder)], capture_output=True).returncode == 0


def _unlock(folder) -> None:
    if shutil.which("chattr"):
        subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
    folder.chmod(0o755)


class LockAfterFirstEpoch:
    def __init__(self, folder):
        self.folder, self.locked, self.digest = folder, None, None

    def on_epoch_end(self, trainer, row):
        if row["epoch"] == 0:
            self.locked = _lock(self.folder)
            self.digest = {p.name: p.read_bytes() for p in self.folder.iterdir() if p.is_file()}


def test_a_folder_turning_read_only_mid_run_is_said_and_the_run_goes_on(tmp_path):
    folder = tmp_path / "run"
    lock = LockAfterFirstEpoch(folder)
    tr = trainer(checkpoint_dir=folder, epochs=3, callbacks=[lock])
    try:
        tr.fit(data(), val=data(64, seed=1))
        if not lock.locked:
            pytest.skip("cannot make a folder read-only here (root without chattr)")
        after = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    finally:
        _unlock(folder)
    assert len(tr.history) == 3 and tr.global_step == 12
    said = kinds(tr, "storage")
    files = sorted(f for e in said for f in ("last.pt", "history.csv", "best.pt")
                   if f in e.message)
    assert "last.pt" in files
    assert len(said) == len(files)  # each file said once, not at every write
    assert all(("EACCES" in e.message or "EPERM" in e.message) for e in said)
    assert "step 4" in next(e for e in said if "last.pt" in e.message).message  # named
    # an immutable folder still lets existing files grow: history.csv got every row
    assert pd.read_csv(folder / "history.csv")["epoch"].tolist() == [0, 1, 2]
    after.pop("history.csv"), lock.digest.pop("history.csv")
    for files in (after, lock.digest):  # the run lock, emptied when the run ends (run_lock.py)
        files.pop(".hybridnb-run.lock")
    assert after == lock.digest  # the checkpoints of epoch 0 stay as they were, whole
    assert checkpoint.load(folder / "last.pt")["position"]["global_step"] == 4


# --- nothing to train --------------------------------------------------------------------------
def test_nothing_to_train_says_why():
    with pytest.raises(ValueError, match="Identity has no parameters to train"):
        trainer(nn.Identity())
    frozen = net()
    frozen.requires_grad_(False)
    with pytest.raises(ValueError, match="every parameter of Sequential has requires_grad=False"):
        trainer(frozen)


@pytest.mark.parametrize("key", ["batch_size", "shuffle", "sampler"])
def test_loader_kwargs_that_the_trainer_sets_are_refused_by_name(key):
    """Before: a raw DataLoader error for a Dataset, and a stream silently took the Trainer's."""
    with pytest.raises(ValueError, match=rf"{key} is set by the Trainer.*batch_size="):
        Trainer(net(), device="cpu", live=False, loader_kwargs={key: 8})
