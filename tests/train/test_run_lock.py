"""One live run per checkpoint_dir (issue 33): a second live run there is refused before its first
step, naming the folder, the holder and the way out, and the first run is not disturbed; a dead
process's lock is taken over and said; a history.csv whose folder is removed mid-run is written
again whole."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from tiny import sine_data, sine_net

from hybridnb.train.bus import Bus
from hybridnb.train.run_lock import LOCK_NAME, RunLock, RunLockError
from hybridnb.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
torch.set_num_threads(1)


def trainer(ck, **kw):
    kw = {"device": "cpu", "batch_size": 32, "epochs": 3, "lr": 1e-2, "seed": 0,
          "live": False, "isolate": False, "checkpoint_dir": ck, **kw}
    return Trainer(sine_net(16), **kw)


SECOND = r"""
import json, sys, torch
torch.set_num_threads(1)
sys.path.insert(0, sys.argv[2])
from tiny import sine_data, sine_net
from hybridnb.train.run_lock import RunLockError
from hybridnb.train.trainer import Trainer

tr = Trainer(sine_net(16), device="cpu", batch_size=32, epochs=3, live=False, isolate=False,
             checkpoint_dir=sys.argv[1])
try:
    tr.fit(sine_data(128, 8, 0))
except RunLockError as exc:
    print(json.dumps({"refused": str(exc), "steps": tr.global_step}))
    sys.exit(3)
print(json.dumps({"trained": tr.global_step}))
"""


class SecondRunMidway:
    """At the first run's 5th step, a second process fits into the same folder; the first run
    waits for it and keeps what it said."""

    def __init__(self, script, ck):
        self.script, self.ck, self.result = script, ck, None

    def on_step_end(self, trainer, row):
        if row["global_step"] != 5:
            return
        before = sorted(p.name for p in Path(self.ck).iterdir())
        out = subprocess.run([sys.executable, str(self.script), str(self.ck),
                              str(ROOT / "tests")], capture_output=True, text=True, timeout=240,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        after = sorted(p.name for p in Path(self.ck).iterdir())
        self.result = (out, before, after)


def test_a_second_live_run_in_the_folder_is_refused_and_the_first_goes_on(tmp_path):
    script = tmp_path / "second.py"
    script.write_text(SECOND)
    ck = tmp_path / "ck"
    spy = SecondRunMidway(script, ck)
    first = trainer(ck, checkpoint_every=2, callbacks=[spy])
    first.fit(sine_data(128, 8, 0), val=sine_data(64, 8, 1))

    out, before, after = spy.result
    assert out.returncode == 3, out.stdout + out.stderr[-3000:]
    said = json.loads(out.stdout.strip().splitlines()[-1])
    assert said["steps"] == 0  # refused before its first step
    message = said["refused"]
    assert str(ck) in message and f"pid {os.getpid()}" in message
    assert "another checkpoint_dir=" in message and "wait for that run to end" in message
    assert after == before  # nothing of the first run's was moved aside or written

    # the first run is whole and alone: every epoch's row, its own checkpoints, no earlier-*
    assert first.global_step == 12 and len(first.history) == 3
    assert not any(p.name.startswith("earlier-") for p in ck.iterdir())
    assert pd.read_csv(ck / "history.csv")["epoch"].tolist() == [0, 1, 2]
    assert torch.load(ck / "last.pt", weights_only=True)["position"]["global_step"] == 12
    assert not [e for e in first.events if e.kind in ("run_lock", "earlier_run")]
    assert (ck / LOCK_NAME).read_text() == ""  # released at the end: the next run may start


DEAD = r"""
import os, sys
sys.path.insert(0, sys.argv[2])
from hybridnb.train.bus import Bus
from hybridnb.train.run_lock import RunLock
RunLock(sys.argv[1]).acquire(Bus(lambda: (0, 0)))
print(os.getpid(), flush=True)
os._exit(0)  # gone without releasing: the OS drops the lock, the file still names the holder
"""


def test_a_dead_processs_lock_is_taken_over_and_said(tmp_path):
    ck = tmp_path / "ck"
    trainer(ck, epochs=1).fit(sine_data(128, 8, 0))  # an earlier run's checkpoints
    script = tmp_path / "dead.py"
    script.write_text(DEAD)
    out = subprocess.run([sys.executable, str(script), str(ck), str(ROOT)], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    pid = out.stdout.split()[0]
    assert f"pid {pid} on host" in (ck / LOCK_NAME).read_text()

    tr = trainer(ck, epochs=1)
    tr.fit(sine_data(128, 8, 0), resume=True)  # continues the run whose holder died
    stale = [e for e in tr.events if e.kind == "run_lock"]
    assert len(stale) == 1 and f"pid {pid}" in stale[0].message and "stale" in stale[0].message
    assert any(e.kind == "resume" for e in tr.events)


def test_the_lock_within_one_process_and_its_release(tmp_path):
    bus = Bus(lambda: (0, 0))
    first = RunLock(tmp_path)
    first.acquire(bus)
    with pytest.raises(RunLockError, match=r"checkpoint_dir=.*in use by a live run \(pid "):
        RunLock(tmp_path).acquire(bus)
    first.release()
    second = RunLock(tmp_path)
    second.acquire(bus)
    assert bus.pending == []  # released cleanly: no stale lock said
    second.release()


class RemoveFolder:
    """Removes the run's folder from outside after epoch 1's row was written."""

    def __init__(self, folder):
        self.folder = folder

    def on_epoch_end(self, trainer, row):
        if row["epoch"] == 1:  # an isolated run's worker may write a checkpoint there meanwhile
            shutil.rmtree(self.folder, ignore_errors=True)


@pytest.mark.parametrize("isolate", [False, True])  # isolated: the loggers still write here
def test_a_log_folder_removed_mid_run_is_written_again_whole(tmp_path, isolate):
    ck = tmp_path / "ck"
    names = ["csv", "tensorboard"] if _has("tensorboard") and not isolate else ["csv"]
    tr = trainer(ck, epochs=4, logger=names, callbacks=[RemoveFolder(ck)], isolate=isolate)
    tr.fit(sine_data(128, 8, 0), val=sine_data(64, 8, 1))

    csv = pd.read_csv(ck / "history.csv")
    assert list(csv.columns) == list(tr.history.columns)  # the header is back
    assert csv["epoch"].tolist() == [0, 1, 2, 3]
    assert csv["val_loss"].tolist() == pytest.approx(tr.history["val_loss"].tolist())
    said = [e.message for e in tr.events if e.kind == "storage"]
    assert any("history.csv disappeared mid-run" in m and "header" in m for m in said), said
    if "tensorboard" in names:
        assert any("TensorBoard event file" in m and "lost" in m for m in said), said
        assert list(ck.glob("events.out.tfevents.*"))


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


class SecondIntoTheLogDir:
    """During the first run, a second one in this process with its own checkpoint_dir and the
    first's log_dir."""

    def __init__(self, tmp_path):
        self.tmp_path, self.refused = tmp_path, None

    def on_epoch_end(self, trainer_, row):
        second = trainer(self.tmp_path / "ck2", log_dir=self.tmp_path / "logs", epochs=1)
        with pytest.raises(RunLockError) as refused:
            second.fit(sine_data(128, 8, 0))
        self.refused = str(refused.value)
        assert second.global_step == 0 and not (self.tmp_path / "ck2" / "last.pt").exists()


def test_a_shared_log_dir_is_held_by_the_live_run_too(tmp_path):
    spy = SecondIntoTheLogDir(tmp_path)
    first = trainer(tmp_path / "ck1", log_dir=tmp_path / "logs", epochs=1, callbacks=[spy])
    first.fit(sine_data(128, 8, 0))
    assert "log_dir=" in spy.refused and "in use by a live run" in spy.refused
    assert pd.read_csv(tmp_path / "logs" / "history.csv")["epoch"].tolist() == [0]
    trainer(tmp_path / "ck2", log_dir=tmp_path / "logs", epochs=1).fit(sine_data(128, 8, 0))
