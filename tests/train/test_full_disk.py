"""A disk that fills up during a fit, for real (issue 27, item 8): a small tmpfs (where this
process may mount one) and a file-size limit (``RLIMIT_FSIZE``, in a child process). torch's own
write error (``unexpected pos ...``) is a storage event like an ``OSError``: the fit runs all its
steps, the last good checkpoint on disk still loads, no temporary file is left, and
``trainer.save`` raises one error naming the file and the cause."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from hybridnb import files
from hybridnb.train import checkpoint
from hybridnb.train.trainer import Trainer

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]


def data(n=128, d=8):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g)
    return x, torch.sin(x.sum(1, keepdim=True))


def wide(hidden=300):
    """About 94k parameters: a checkpoint (weights + Adam's two moments) of about 1.1 MB."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                         nn.Linear(hidden, 1))


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MB tmpfs mounted in ``tmp_path`` (skipped where this process may not mount)."""
    folder = tmp_path / "disk"
    folder.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs",
                                            str(folder)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root, or no mount)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True)


def storage_events(tr):
    return [e for e in tr.events if e.kind == "storage"]


def test_a_disk_filling_up_mid_fit_keeps_the_run_and_the_last_good_checkpoint(small_disk):
    # last.pt ~1.1 MB: epoch 0 writes it, epoch 1 writes it again and keeps the old one as
    # last.prev.pt (2.2 MB on disk); epoch 2's temporary file no longer fits in 3 MB
    tr = Trainer(wide(), device="cpu", batch_size=32, epochs=4, lr=1e-3, seed=0, live=False,
                 isolate=False, checkpoint_dir=small_disk)
    tr.fit(data())
    assert tr.global_step == 16 and len(tr.history) == 4  # the run went on to its end
    said = storage_events(tr)
    assert len(said) == 1, [str(e) for e in tr.events]  # said once, not at every failed write
    message = said[0].message
    assert str(small_disk / "last.pt") in message
    assert "unexpected pos" in message or "ENOSPC" in message  # torch's words, or the errno
    assert "step 8" in message  # the last good file on disk, named with its step
    kept = checkpoint.load(small_disk / "last.pt")
    assert kept["position"]["global_step"] == 8
    assert checkpoint.load(small_disk / "last.prev.pt")["position"]["global_step"] == 4
    assert not [p.name for p in small_disk.iterdir() if ".tmp-" in p.name]
    # the history's rows are all on disk: the csv logger's small appends still fit
    assert (small_disk / "history.csv").read_text().count("\n") == 5


def test_trainer_save_on_a_full_disk_names_the_file_and_leaves_the_old_one(small_disk):
    tr = Trainer(wide(), device="cpu", batch_size=32, epochs=1, lr=1e-3, seed=0, live=False,
                 isolate=False)
    tr.fit(data())
    small = small_disk / "model.pt"
    tr.save(small)  # ~0.4 MB: fits
    before = small.read_bytes()
    (small_disk / "filler").write_bytes(b"\0" * 2_400_000)  # the disk fills up
    with pytest.raises(files.WriteError) as caught:
        tr.save(small)
    assert str(small) in str(caught.value)
    assert "unexpected pos" in str(caught.value) or "ENOSPC" in str(caught.value)
    assert small.read_bytes() == before  # the older file is unchanged
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "model.pt"]


CHILD = textwrap.dedent("""
    import json, resource, signal, sys
    import torch
    from torch import nn
    sys.path.insert(0, {tests!r})
    from test_full_disk import data, wide
    from hybridnb import files
    from hybridnb.train.trainer import Trainer

    torch.set_num_threads(1)
    folder = {folder!r}
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))  # < a checkpoint (~1.1 MB)
    tr = Trainer(wide(), device="cpu", batch_size=32, epochs=3, lr=1e-3, seed=0, live=False,
                 isolate=False, checkpoint_dir=folder)
    tr.fit(data(), val=data(64))
    out = {{"steps": tr.global_step, "epochs": len(tr.history),
            "storage": [e.message for e in tr.events if e.kind == "storage"]}}
    try:
        tr.save(folder + "/model.pt")
        out["save"] = None
    except files.WriteError as exc:
        out["save"] = str(exc)
    print(json.dumps(out))
""")


def test_a_file_size_limit_fails_every_checkpoint_write_and_the_fit_still_ends(tmp_path):
    folder = tmp_path / "run"
    code = CHILD.format(tests=str(Path(__file__).resolve().parent), folder=str(folder))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")])}
    env.pop("HYBRIDNB_QUICK", None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["steps"] == 12 and out["epochs"] == 3
    said = out["storage"]
    named = sorted(name for m in said for name in ("last.pt", "best.pt") if f"/{name} " in m)
    assert named == ["best.pt", "last.pt"], said  # each file said once
    assert len(said) == 2 and all("unexpected pos" in m or "EFBIG" in m for m in said)
    assert all("kept in memory only" in m for m in said)  # no checkpoint ever fit
    # none ever fit, so none is on disk (and no temporary file either)
    names = sorted(p.name for p in folder.iterdir() if p.is_file())
    assert names == [".hybridnb-run.lock", "history.csv"], names  # the run lock (run_lock.py)
    assert str(folder / "model.pt") in out["save"]


def test_only_write_errors_count_as_storage_failures():
    assert files.is_write_failure(OSError(28, "No space left on device"))
    assert files.is_write_failure(RuntimeError(
        "[enforce fail at inline_container.cc:672] . unexpected pos 1519360 vs 1519252"))
    assert files.is_write_failure(RuntimeError("[enforce fail at inline_container.cc:858] . "
                                                "PytorchStreamWriter failed writing file "
                                                "data/3: file write failed"))
    # a bug is not a full disk: raised, never turned into a storage event
    assert not files.is_write_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not files.is_write_failure(ValueError("No space left on device"))


def test_torchs_write_error_names_the_free_space_where_the_file_was_going(tmp_path):
    error = RuntimeError("[enforce fail at inline_container.cc] unexpected pos 64 vs 32")
    said = files.describe(error, tmp_path / "last.pt")
    assert said.startswith("torch's writer stopped: unexpected pos 64 vs 32; the disk is full")
    assert said.endswith(" MB free there")
    assert "free there" not in files.describe(error)  # no path: nothing to measure
