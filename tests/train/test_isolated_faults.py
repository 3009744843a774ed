"""No failure of an isolated worker loses the run's progress. Faults come from outside, the way
they come: the user's own Dataset raising, a model or dataset that SIGKILLs or aborts its own
process, a forward that never returns, a Ctrl-C reaching the kernel during a long validation.
Each fault fires in the worker only (its pid differs from the kernel's, recorded when the object
was built). Afterwards the kernel's Trainer holds at least what an in-process run holds at that
moment: global_step, history, steps and weights."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from hybridnb import failures
from hybridnb.processes.channel import Channel
from hybridnb.train.trainer import Trainer

pytestmark = pytest.mark.slow
N, BATCH = 128, 16  # 8 steps per epoch


def data(n=N, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    return x, torch.sin(x @ torch.linspace(-1, 1, d)).unsqueeze(1)


class Items(Dataset):
    """``data()`` as a Dataset; ``fault()`` on item fetch number ``at`` (counted in the process
    that fetches), in the worker only unless ``anywhere``; ``log``: a file each fetch appends to."""

    def __init__(self, n=N, seed=0, at=None, fault=None, anywhere=False, log=None, delay=0.0):
        self.x, self.y = data(n, seed=seed)
        self.at, self.fault, self.anywhere, self.log, self.delay = at, fault, anywhere, log, delay
        self.kernel, self.fetched = os.getpid(), 0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        in_worker = os.getpid() != self.kernel
        if in_worker or self.anywhere:
            self.fetched += 1
            if self.log is not None:
                with open(self.log, "a") as f:
                    f.write("x\n")
            if self.fetched == self.at:
                self.fault()
            if self.delay and in_worker:
                time.sleep(self.delay)
        return self.x[i], self.y[i]


class Net(nn.Module):
    """A seeded MLP; in the worker only, training forward number ``at`` calls ``fault()``."""

    def __init__(self, at=None, fault=None):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
        self.at, self.fault, self.kernel, self.calls = at, fault, os.getpid(), 0

    def forward(self, x):
        if self.training and os.getpid() != self.kernel:
            self.calls += 1
            if self.calls == self.at:
                self.fault()
        return self.net(x)


def trainer(model, isolate, **kw):
    kw = {"device": "cpu", "batch_size": BATCH, "epochs": 2, "lr": 1e-2, "seed": 0,
          "live": False, "verbose": False, "schedule": None, "isolate": isolate, **kw}
    return Trainer(model, **kw)


def children():
    return [p for p in psutil.Process().children(recursive=True) if p.status() != "zombie"]


def same_weights(a, b):
    return all(torch.allclose(x, y, atol=1e-6) for x, y in
               zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def bad_item():
    raise ValueError("item 200 is broken (injected)")


@pytest.fixture(autouse=True)
def _fresh_lost_devices(monkeypatch):
    monkeypatch.setattr(failures, "_LOST", set())


def test_an_error_from_the_users_dataset_keeps_what_an_in_process_run_keeps():
    """ValueError at item 200 (epoch 1, after 12 steps), no checkpoint_dir, snapshots far
    apart: the kernel holds the worker's steps, history and weights, then raises the error."""
    runs = {}
    for isolate in (False, True):
        tr = trainer(Net(), isolate)
        with pytest.raises(ValueError, match="item 200 is broken"):
            tr.fit(Items(at=200, fault=bad_item, anywhere=True))
        runs[isolate] = tr
    here, there = runs[False], runs[True]
    assert here.global_step == 12 and there.global_step == here.global_step
    assert there.steps["global_step"].tolist() == list(range(1, 13))
    assert there.steps["loss"].tolist() == pytest.approx(here.steps["loss"].tolist(), rel=1e-5)
    assert there.history["epoch"].tolist() == here.history["epoch"].tolist() == [0]
    assert same_weights(there.model, here.model)
    assert not same_weights(there.model, Net())  # trained, not the initial weights
    assert not children()


def undecodable_item():
    raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte in sub-07's labels")


def test_a_builtin_error_that_needs_more_arguments_still_names_itself_in_the_kernel():
    """UnicodeDecodeError cannot be rebuilt from its message: the kernel raises a RuntimeError
    that names it and says what it said, not a TypeError from rebuilding it."""
    with pytest.raises(RuntimeError, match="UnicodeDecodeError: .*sub-07's labels") as info:
        trainer(Net(), True, epochs=1).fit(Items(at=3, fault=undecodable_item))
    assert "UnicodeDecodeError" in str(info.value.__cause__)  # the worker's traceback
    assert not children()


@pytest.mark.parametrize("how", ["kill-in-forward", "abort-in-dataset"])
def test_a_worker_that_dies_leaves_its_last_state_and_the_run_goes_on(how):
    """SIGKILL at the 11th forward, or abort() at the 170th item fetched (both in epoch 1):
    the kernel continues on the CPU from the last state the worker sent (snapshot_every=3:
    step 9), every step once, and ends where a straight run ends."""
    if how == "kill-in-forward":
        model, dataset = Net(at=11, fault=lambda: os.kill(os.getpid(), signal.SIGKILL)), Items()
        signame = "SIGKILL"
    else:
        model, dataset = Net(), Items(at=170, fault=os.abort)
        signame = "SIGABRT"
    straight = trainer(Net(), False, snapshot_every=3)
    straight.fit(Items())
    tr = trainer(model, True, snapshot_every=3)
    tr.fit(dataset)
    lost = [e for e in tr.events if e.kind == "worker_lost"]
    assert len(lost) == 1 and signame in lost[0].message
    assert lost[0].step == 9  # the last state the worker sent, applied as it arrived
    assert tr.global_step == 16 and tr.steps["global_step"].tolist() == list(range(1, 17))
    assert tr.history["epoch"].tolist() == [0, 1]
    assert same_weights(tr.model, straight.model)
    assert not children()


def test_a_hang_in_the_first_step_on_the_cpu_is_found_by_the_step_timeout():
    """Nothing to compile and no CUDA: no grace is asked for, so a worker hanging in its first
    forward is lost after step_timeout of silence (not a 600 s warm-up grace), and the run
    goes on here."""
    tr = trainer(Net(at=1, fault=lambda: time.sleep(3600)), True, step_timeout=5.0)
    tr.fit(Items())
    lost = [e for e in tr.events if e.kind == "worker_lost"]
    assert len(lost) == 1, [str(e) for e in tr.events]
    assert "'first step'" in lost[0].message and "step_timeout=5.0 s" in lost[0].message
    assert "grace" not in lost[0].message
    assert not any(e.kind == "grace" for e in tr.events)
    assert tr.device.type == "cpu" and tr.global_step == 16 and len(tr.history) == 2
    assert not children()


def test_ctrl_c_during_a_long_validation_stops_within_a_batch(tmp_path):
    """The validation fetches slowly (64 items, batches of 8); a SIGINT reaches the kernel once
    it started. The worker stops within about a batch, not at the validation's end; the kernel
    holds the epoch's steps and weights (what an in-process run holds), the fit returns."""
    log = tmp_path / "val.log"
    val = Items(64, seed=1, log=log, delay=0.05)

    def interrupt_once_validating():
        while not log.exists():
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    sender = threading.Thread(target=interrupt_once_validating, daemon=True)
    tr = trainer(Net(), True, epochs=1, batch_size=8, snapshot_every=None,
                 loader_kwargs={"num_workers": 0})
    sender.start()
    tr.fit(Items(), val)
    sender.join(timeout=60)
    fetched = len(log.read_text().splitlines())
    assert fetched < 64  # the validation was cut short: a few batches, not all 8
    assert tr.global_step == 16 and tr.steps["global_step"].tolist() == list(range(1, 17))
    assert tr.history.empty  # the epoch never ended: its validation was dropped
    assert not same_weights(tr.model, Net())
    # a Ctrl-C is an interrupt; the channel tells it from the Stop button where it can
    expected = ("interrupt",) if hasattr(Channel, "stop_reason") else ("interrupt",
                                                                        "stop_button")
    assert tr.stopped in expected
    assert not children()


def test_ctrl_c_during_a_predict_in_the_worker_raises_keyboardinterrupt_within_a_batch(
        tmp_path):
    """After an isolated fit, predict runs in the worker; a SIGINT reaching the kernel while it
    fetches slowly stops it within about a batch and arrives as a KeyboardInterrupt, as it would
    in process."""
    tr = trainer(Net(), True, epochs=1, loader_kwargs={"num_workers": 0})
    tr.fit(Items())
    log = tmp_path / "predict.log"

    def interrupt_once_predicting():
        while not log.exists():
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    sender = threading.Thread(target=interrupt_once_predicting, daemon=True)
    sender.start()
    with pytest.raises(KeyboardInterrupt):
        tr.predict(Items(64, seed=2, log=log, delay=0.05))
    sender.join(timeout=60)
    assert len(log.read_text().splitlines()) < 64  # cut short, not predicted to the end
    assert tr.global_step == 8 and not children()
