"""Checkpoints: atomic writes, weights_only loads, corrupt files, and exact resume — in process
and after a real SIGKILL of a child process."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from hybridnb.train import checkpoint
from hybridnb.train.trainer import Trainer

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]


class Noisy(Dataset):
    """Adds numpy noise per item, so the numpy RNG state matters for an exact resume."""

    def __init__(self, n=320, d=8, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, d, generator=g)
        self.y = torch.sin(self.x @ torch.linspace(-1, 1, d))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        noise = np.random.normal(0, 0.01, size=self.x.shape[1]).astype(np.float32)
        return self.x[i] + torch.from_numpy(noise), self.y[i]


class Stopper(nn.Module):
    """An MLP with dropout (torch RNG matters). On training call ``stop_at`` it sends itself a
    real SIGINT (Ctrl-C / the notebook's interrupt), or raises KeyboardInterrupt (``drop``: a
    second Ctrl-C, or an interrupt where no handler could be installed)."""

    def __init__(self, stop_at=None, drop=False):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Dropout(0.2), nn.Linear(32, 1))
        self.stop_at, self.drop, self.calls = stop_at, drop, 0

    def forward(self, x):
        if self.training:
            self.calls += 1
            if self.calls == self.stop_at:
                if self.drop:
                    raise KeyboardInterrupt
                os.kill(os.getpid(), signal.SIGINT)
        return self.net(x)


def trainer(model, ck, **kw):
    kw = {"device": "cpu", "batch_size": 32, "epochs": 3, "lr": 1e-2, "seed": 3, "live": False,
          "checkpoint_dir": ck, "checkpoint_every": 7, "ema": 0.9, **kw}
    return Trainer(model, **kw)


def same(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# ------------------------------------------------------------------------------- files
def test_save_is_atomic_and_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    checkpoint.save({"v": torch.tensor([1.0])}, path, keep_previous=True)
    checkpoint.save({"v": torch.tensor([2.0])}, path, keep_previous=True)
    assert checkpoint.load(path)["v"].item() == 2.0
    assert checkpoint.load(tmp_path / "last.prev.pt")["v"].item() == 1.0

    real_save = torch.save

    def dying_save(obj, f, *a, **k):  # writes half a file, then the process "dies"
        real_save(obj, f, *a, **k)
        f.truncate(f.tell() // 2)
        raise OSError("No space left on device (injected)")

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(OSError, match="injected"):
        checkpoint.save({"v": torch.tensor([3.0])}, path, keep_previous=True)
    monkeypatch.undo()
    assert checkpoint.load(path)["v"].item() == 2.0  # the old file is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.prev.pt", "last.pt"]  # no tmp


def test_a_stale_link_from_a_killed_save_does_not_stop_the_next_one(tmp_path):
    """A kill between keeping last.pt's copy (a hard link) and the rename leaves that link
    behind; a process that later gets the same pid (a restarted container) must still save."""
    import os

    path = tmp_path / "last.pt"
    checkpoint.save({"v": torch.tensor([1.0])}, path)
    os.link(path, tmp_path / f".last.prev.pt.tmp-{os.getpid()}")  # the killed save's leftover
    checkpoint.save({"v": torch.tensor([2.0])}, path, keep_previous=True)
    assert checkpoint.load(path)["v"].item() == 2.0
    assert checkpoint.load(tmp_path / "last.prev.pt")["v"].item() == 1.0


def test_a_checkpoint_with_extra_state_the_model_lacks_is_named(tmp_path):
    """A non-tensor entry (a module's ``get_extra_state``) on one side only is named like any
    missing key, with the file."""

    class WithExtra(nn.Linear):
        def get_extra_state(self):
            return {"note": 1}

        def set_extra_state(self, state):
            pass

    saved = {"model": nn.Sequential(WithExtra(2, 1)).state_dict()}
    path = tmp_path / "last.pt"
    with pytest.raises(checkpoint.CheckpointError, match=r"last\.pt.*'0\._extra_state' is in "):
        checkpoint.check_fits(saved, path, nn.Sequential(nn.Linear(2, 1)))


def test_truncated_file_gives_an_error_naming_it(tmp_path):
    path = tmp_path / "last.pt"
    checkpoint.save({"w": torch.randn(1000)}, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(checkpoint.CheckpointError, match=str(path).replace(".", r"\.")):
        checkpoint.load(path)
    path.write_bytes(b"garbage" * 10)
    with pytest.raises(checkpoint.CheckpointError, match="truncated or corrupt"):
        checkpoint.load(path)


class Evil:
    def __reduce__(self):
        return (os.system, ("echo should-not-run",))


def test_load_refuses_pickled_code(tmp_path):
    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        torch.save({"format": checkpoint.FORMAT, "x": Evil()}, f, pickle_module=pickle)
    with pytest.raises(checkpoint.CheckpointError, match="evil.pt"):
        checkpoint.load(path)


def test_trainer_checkpoint_loads_with_weights_only(tmp_path):
    tr = trainer(Stopper(), tmp_path, epochs=1)
    tr.fit(Noisy(), val=Noisy(64, seed=1))
    for name in ("last.pt", "last.prev.pt", "best.pt"):
        state = torch.load(tmp_path / name, weights_only=True)
        assert state["format"] == checkpoint.FORMAT
    last = torch.load(tmp_path / "last.pt", weights_only=True)
    assert last["position"] == {"epoch": 1, "batches_done": 0, "global_step": 10}
    assert {"python", "numpy", "torch", "loader"} <= set(last["rng"])
    assert last["ema"] is not None and len(last["history"]) == 1


# ------------------------------------------------------------------------------- resume
def test_interrupted_then_resumed_run_is_bitwise_identical(tmp_path):
    straight = trainer(Stopper(), tmp_path / "a")
    straight.fit(Noisy(), val=Noisy(64, seed=1))

    first = trainer(Stopper(stop_at=17), tmp_path / "b")  # Ctrl-C during step 17 (epoch 1)
    first.fit(Noisy(), val=Noisy(64, seed=1))
    assert first.global_step == 17 and len(first.history) == 1  # step 17 was finished
    assert [e.kind for e in first.events].count("interrupt") == 1
    saved = checkpoint.load(tmp_path / "b" / "last.pt")
    assert saved["position"] == {"epoch": 1, "batches_done": 7, "global_step": 17}

    resumed = trainer(Stopper(), tmp_path / "b")
    resumed.fit(Noisy(), val=Noisy(64, seed=1), resume=True)
    assert resumed.global_step == 30
    assert same(resumed.model, straight.model) and same(resumed.ema, straight.ema)
    timing = ["samples_per_s", "data_wait_pct", "compute_samples_per_s", "time_s",
              "peak_memory_mb", "events"]
    pd_equal = resumed.history.drop(columns=timing).equals(straight.history.drop(columns=timing))
    assert pd_equal
    assert resumed.steps["loss"].tolist() == straight.steps["loss"].tolist()


def test_corrupt_last_checkpoint_falls_back_to_the_previous_one(tmp_path):
    straight = trainer(Stopper(), tmp_path / "a")
    straight.fit(Noisy())
    first = trainer(Stopper(stop_at=23), tmp_path / "b")  # saves at 7, 10, 14, 20, 21, 23
    first.fit(Noisy())
    last = tmp_path / "b" / "last.pt"
    last.write_bytes(last.read_bytes()[:1000])  # truncated, e.g. by a full disk

    with pytest.raises(checkpoint.CheckpointError, match="last.pt"):
        checkpoint.load(last)
    resumed = trainer(Stopper(), tmp_path / "b")
    resumed.fit(Noisy(), resume=True)
    fallback = [e for e in resumed.events if e.kind == "checkpoint_fallback"]
    assert len(fallback) == 1 and "last.pt" in fallback[0].message
    assert "last.prev.pt" in fallback[0].message
    resume_ev = next(e for e in resumed.events if e.kind == "resume")
    assert "step 21" in resume_ev.message
    assert same(resumed.model, straight.model)


def test_resume_method_and_explicit_path(tmp_path):
    first = trainer(Stopper(stop_at=5), tmp_path)
    first.fit(Noisy())
    tr = trainer(Stopper(), tmp_path / "other", epochs=1)
    tr.resume(tmp_path / "last.pt")
    raw = checkpoint.load(tmp_path / "last.pt")["model"]  # first.model holds the EMA weights
    assert all(torch.equal(v, tr.model.state_dict()[k]) for k, v in raw.items())  # loaded at once
    tr.fit(Noisy())
    assert tr.global_step == 10


def test_resume_without_checkpoint_starts_fresh_and_says_so(tmp_path):
    tr = trainer(Stopper(), tmp_path, epochs=1)
    tr.fit(Noisy(), resume=True)
    assert any(e.kind == "resume" and "from scratch" in e.message for e in tr.events)
    assert tr.global_step == 10


CHILD = r"""
import sys, time
import numpy as np, torch
from torch import nn
torch.set_num_threads(1)
from hybridnb.train.trainer import Trainer

ck, out, resume, delay = sys.argv[1], sys.argv[2], sys.argv[3] == "resume", float(sys.argv[4])

class Data(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 8, generator=g)
        self.y = torch.sin(self.x @ torch.linspace(-1, 1, 8))
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        time.sleep(delay)
        noise = np.random.normal(0, 0.01, size=8).astype(np.float32)
        return self.x[i] + torch.from_numpy(noise), self.y[i]

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Dropout(0.2), nn.Linear(32, 1))
tr = Trainer(model, device="cpu", batch_size=16, epochs=3, lr=1e-2, seed=7, live=False,
             checkpoint_dir=ck, checkpoint_every=5, ema=0.9)
tr.fit(Data(400, 0), val=Data(48, 1), resume=resume)
torch.save({"model": tr.model.state_dict(), "ema": tr.ema.state_dict(),
            "steps": tr.global_step, "loss": tr.steps["loss"].tolist()}, out)
"""


@pytest.mark.slow
def test_sigkill_then_resume_is_bitwise_identical_to_a_straight_run(tmp_path):
    """A real child process is killed with SIGKILL mid-run (after its second checkpoint); a new
    process resumes from the checkpoint; the final weights equal a straight run's bit for bit."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def child(ck, out, mode, delay):
        return subprocess.Popen([sys.executable, str(script), str(ck), str(out), mode,
                                 str(delay)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)

    straight = child(tmp_path / "a", tmp_path / "a.pt", "fresh", 0.0)
    victim = child(tmp_path / "b", tmp_path / "b.pt", "fresh", 0.004)  # ~64 ms per batch
    prev = tmp_path / "b" / "last.prev.pt"
    deadline = time.time() + 120
    while not prev.exists() and victim.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(0.15)  # land between checkpoints (every 5 steps, ~0.3 s)
    assert victim.poll() is None, victim.communicate()[0].decode()[-2000:]
    victim.send_signal(signal.SIGKILL)
    victim.wait(30)
    assert victim.returncode == -signal.SIGKILL
    assert not (tmp_path / "b.pt").exists()
    pos = checkpoint.load(tmp_path / "b" / "last.pt")["position"]
    assert 0 < pos["global_step"] < 75

    resumed = child(tmp_path / "b", tmp_path / "b.pt", "resume", 0.0)
    for p in (straight, resumed):
        out = p.communicate(timeout=180)[0].decode()
        assert p.returncode == 0, out[-3000:]
    a = torch.load(tmp_path / "a.pt", weights_only=True)
    b = torch.load(tmp_path / "b.pt", weights_only=True)
    assert a["steps"] == b["steps"] == 75
    assert a["loss"] == b["loss"]
    for part in ("model", "ema"):
        for k in a[part]:
            assert torch.equal(a[part][k], b[part][k]), (part, k)


def test_resume_with_another_batch_size_continues_by_samples_and_says_so(tmp_path):
    first = trainer(Stopper(stop_at=5), tmp_path, epochs=1)  # 5 steps of 32 = 160 samples
    first.fit(Noisy())
    tr = trainer(Stopper(), tmp_path, epochs=1, batch_size=16)
    tr.fit(Noisy(), resume=True)
    note = next(e for e in tr.events if e.kind == "resume" and "batch_size=32" in e.message)
    assert "160 samples" in note.message
    assert tr.global_step == 5 + 10  # the remaining 160 samples in batches of 16


def test_a_fresh_run_keeps_an_earlier_runs_checkpoints_and_says_so(tmp_path):
    first = trainer(Stopper(), tmp_path, epochs=1)
    first.fit(Noisy(), val=Noisy(64, seed=1))
    before = {n: (tmp_path / n).read_bytes() for n in ("last.pt", "last.prev.pt", "best.pt")}
    second = trainer(Stopper(), tmp_path, epochs=1, seed=4)
    second.fit(Noisy(), val=Noisy(64, seed=1))
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("earlier-")]
    assert len(kept) == 1
    assert {n: (kept[0] / n).read_bytes() for n in before} == before  # nothing overwritten
    notes = [e for e in second.events if e.kind == "earlier_run"]
    assert len(notes) == 1 and kept[0].name in notes[0].message
    assert (tmp_path / "last.pt").read_bytes() != before["last.pt"]  # the new run's own
