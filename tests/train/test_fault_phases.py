"""The safety net, phase by phase: an isolated worker (a spawned, fresh interpreter) that is
killed, aborts or hangs in each phase of a fit (set-up before its first state, the first step,
mid-epoch, validation, a checkpoint write, the final hand-over) or of evaluate/predict. Every
case continues on the CPU in the kernel from the last good state (the start state when none
arrived): the live view keeps working, history is continuous, the model ends trained, the lost
worker's event names the phase, and no child is left. Faults come from ``HYBRIDNB_FAULT``, which
the test hook of tests/faults.py reads in the worker (hybridnb reads no fault variable).

Also the kernel's invariant: on an isolated run it never starts the CUDA driver (tripwires on
every torch entry point that would), against a worker that simulates CUDA on the CPU
(``HYBRIDNB_SIMULATE_CUDA=1``, the same test hook)."""

from __future__ import annotations

import math

import psutil
import pytest
import torch
from faults import FAULT_ENV, SIMULATE_CUDA_ENV
from tiny import sine_data, sine_net

from hybridnb import failures
from hybridnb.env import FIRST_STEP_GRACE_ENV
from hybridnb.train.trainer import Trainer

pytestmark = pytest.mark.slow
EPOCHS, STEPS = 2, 8  # 256 samples / batch 32


def data(n=256, d=8, seed=0):
    return sine_data(n, d, seed)


def net():
    return sine_net(32)


class Recorder:
    """A live view that keeps what the kernel drew."""

    def __init__(self):
        self.started, self.rows, self.events, self.ended = 0, [], [], 0
        self.stop_requested = False

    def start(self, run):
        self.started += 1

    def update(self, row):
        self.rows.append(row)

    def event(self, ev):
        self.events.append(ev.kind)

    def end(self, summary):
        self.ended += 1


def children():
    return [p for p in psutil.Process().children(recursive=True) if p.status() != "zombie"]


@pytest.fixture(autouse=True)
def _fresh_lost_devices(monkeypatch):
    monkeypatch.setattr(failures, "_LOST", set())


@pytest.fixture
def view(monkeypatch):
    from hybridnb.train import opening

    rec = Recorder()
    monkeypatch.setattr(opening, "make_view", lambda live: rec)
    return rec


def trainer(tmp_path, **kw):
    kw = {"device": "cpu", "batch_size": 32, "epochs": EPOCHS, "lr": 1e-2, "seed": 0,
          "live": "text", "isolate": True, "snapshot_every": 3, "checkpoint_every": 5,
          "checkpoint_dir": tmp_path / "ck", "schedule": None, **kw}
    return Trainer(net(), **kw)


# (fault, the phase the lost worker's event names): every phase meets each kind of fault at
# least once, each hang twice or more; the full product would cost minutes for no new path
FIT_CASES = [
    ("setup:kill", "setup"),          # before the worker's first state reaches the kernel
    ("setup:hang", "setup"),          # silent past step_timeout (no grace on the CPU)
    ("first step:abort", "first step"),
    ("first step:hang", "first step"),
    ("step:kill:6", None),            # mid-epoch (the 6th step or step-phase heartbeat)
    ("step:hang:4", "step"),
    ("validation:abort", "validation"),
    ("validation:hang", "validation"),
    ("checkpoint:kill", "checkpoint"),
    ("checkpoint:hang:2", "checkpoint"),
    ("hand-over:kill", "hand-over"),  # SIGABRT is lost as SIGKILL is; its name is checked above
    ("hand-over:hang", "hand-over"),
]
HANG_S = 5.0  # step_timeout and first_step_grace of the hang cases (a loaded 2-core host
#              once stayed silent 3 s in a healthy phase)


def hangs(fault: str) -> bool:
    return fault.split(":")[1] == "hang"


@pytest.mark.parametrize("fault,phase", FIT_CASES, ids=[c[0] for c in FIT_CASES])
def test_a_fault_in_any_phase_of_fit_continues_on_the_cpu(tmp_path, monkeypatch, view, fault,
                                                           phase):
    monkeypatch.setenv(FAULT_ENV, fault)
    monkeypatch.setenv(FIRST_STEP_GRACE_ENV, str(HANG_S))
    start = [p.detach().clone() for p in net().parameters()]
    tr = trainer(tmp_path, step_timeout=HANG_S if hangs(fault) else None)
    tr.fit(data(), val=data(64, seed=1))

    lost = [e for e in tr.events if e.kind == "worker_lost"]
    assert len(lost) == 1, [str(e) for e in tr.events]
    if phase is not None:
        assert f"'{phase}'" in lost[0].message
    if hangs(fault):  # the silence, and the limit it passed, are named: on the CPU nothing
        #               asks for a grace, set-up and the first step included
        assert "silent for" in lost[0].message and "step_timeout=" in lost[0].message
    else:
        assert ("SIGKILL" if fault.split(":")[1] == "kill" else "SIGABRT") in lost[0].message
    assert tr.device.type == "cpu" and not tr.isolated
    # history continuous: every epoch once, every step once, in order
    assert tr.history["epoch"].tolist() == list(range(EPOCHS))
    assert [s for s in tr.steps["global_step"]] == list(range(1, EPOCHS * STEPS + 1))
    assert math.isfinite(tr.history["val_loss"].iloc[-1])
    # the model object holds trained weights
    assert any(not torch.equal(a, b) for a, b in zip(start, tr.model.parameters(), strict=True))
    # the kernel's view was started once, kept drawing and ended once
    assert view.started == 1 and view.ended == 1 and "worker_lost" in view.events
    assert view.rows and view.rows[-1]["global_step"] == EPOCHS * STEPS
    assert (tmp_path / "ck" / "last.pt").is_file()
    assert not children()


EVAL_CASES = [("evaluate", "evaluate:kill"), ("predict", "evaluate:abort"),
              ("predict", "evaluate:hang:2")]


@pytest.mark.parametrize("call,fault", EVAL_CASES, ids=[f"{c}-{f}" for c, f in EVAL_CASES])
def test_a_fault_in_evaluate_or_predict_answers_on_the_cpu(tmp_path, monkeypatch, view, call,
                                                           fault):
    """An isolated Trainer evaluates and predicts in a worker (where its fit runs); a worker
    lost there answers on the CPU here, says so at the next fit, and stays here."""
    monkeypatch.setenv(FAULT_ENV, fault)
    monkeypatch.setenv(FIRST_STEP_GRACE_ENV, str(HANG_S))
    tr = trainer(tmp_path, step_timeout=HANG_S if hangs(fault) else None)
    x, y = data(64, seed=2)
    with torch.no_grad():
        expected = net()(x)
    if call == "evaluate":
        got = tr.evaluate((x, y))
        rmse = float(torch.sqrt(torch.mean((expected - y) ** 2)))
        assert got["rmse"] == pytest.approx(rmse, rel=1e-5)
    else:
        got = tr.predict(x)
        assert torch.allclose(torch.as_tensor(got).reshape(-1), expected.reshape(-1), atol=1e-6)
    lost = [m for k, m in tr.bus.pending if k == "worker_lost"]  # said at the next fit
    assert len(lost) == 1 and "'evaluate'" in lost[0]
    if hangs(fault):
        assert "silent for" in lost[0]
    assert tr.isolated is False  # from now on, here
    assert not children()


# Every way the kernel could start the CUDA driver: the driver's own entry points, torch's lazy
# initialisation (tensor creation on "cuda" goes through it too) and the torch.cuda calls that
# need a context. torch.cuda.is_available() / device_count() stay: with
# PYTORCH_NVML_BASED_CUDA_CHECK=1 they ask NVML (here told one GPU exists), never the driver;
# their fallback, torch._C._cuda_getDeviceCount, is wired.
DRIVER = ("_cuda_init", "_cuda_getDeviceCount", "_cuda_getDevice", "_cuda_setDevice",
          "_cuda_emptyCache", "_cuda_memoryStats", "_cuda_resetPeakMemoryStats",
          "_cuda_synchronize", "_cuda_getDeviceProperties", "_cuda_set_sync_debug_mode")
TORCH_CUDA = ("_lazy_init", "init", "cudart", "mem_get_info", "synchronize", "set_device",
              "current_device", "get_device_properties", "get_device_name",
              "get_device_capability", "get_rng_state", "set_rng_state", "get_rng_state_all",
              "set_rng_state_all", "empty_cache", "memory_allocated", "max_memory_allocated",
              "reset_peak_memory_stats", "set_per_process_memory_fraction", "memory_stats",
              "is_bf16_supported")


class Tripped(list):
    """The tripwires that fired; ``asked``: graph-capture questions (allowed, counted)."""

    asked: list


@pytest.fixture
def tripwires(monkeypatch):
    """The kernel believes one CUDA GPU exists (NVML says so) and every call that would start
    the driver raises; the spawned worker (a fresh interpreter) simulates CUDA on the CPU."""
    tripped = Tripped()

    def wire(name):
        def trip(*a, **k):
            tripped.append(name)
            raise AssertionError(f"the kernel called {name}")
        return trip

    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "_raw_device_count_nvml", lambda: 1)
    monkeypatch.setattr(torch.cuda, "_cached_device_count", None)
    for name in DRIVER:
        if hasattr(torch._C, name):
            monkeypatch.setattr(torch._C, name, wire(f"torch._C.{name}"))
    for name in TORCH_CUDA:
        monkeypatch.setattr(torch.cuda, name, wire(f"torch.cuda.{name}"))
    # torch's optimizers ask before every step whether a CUDA graph is being captured, on any
    # device, whenever CUDA is available; without a CUDA context the answer is "no" and none is
    # created. Counted, not tripped: only the kernel's CPU continuation steps an optimizer.
    asked = []
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing",
                        lambda: asked.append(1) or False)
    monkeypatch.setenv(SIMULATE_CUDA_ENV, "1")
    assert torch.cuda.is_available() and torch.cuda.device_count() == 1  # by NVML alone
    assert tripped == []
    tripped.asked = asked
    return tripped


def test_the_kernel_never_starts_cuda_on_an_isolated_run(tmp_path, view, tripwires):
    """fit, evaluate, predict and find_batch_size on device="cuda" in fp16 (the GradScaler every
    Colab T4 gets), isolated: the kernel computes nothing on CUDA."""
    tr = trainer(tmp_path, device="cuda", precision="fp16", checkpoint_every=None,
                 memory_fraction=0.5)
    assert tr.device.type == "cuda" and tr.isolated and tr.scaler.is_enabled()
    tr.fit(data(), val=data(64, seed=1))
    assert not any(e.kind == "worker_lost" for e in tr.events), [str(e) for e in tr.events]
    assert any(e.kind == "simulated_cuda" for e in tr.events)  # the worker's side was simulated
    assert tr.history["epoch"].tolist() == list(range(EPOCHS))
    metrics = tr.evaluate(data(64, seed=2))
    pred = tr.predict(data(64, seed=2)[0])
    found = tr.find_batch_size(torch.utils.data.TensorDataset(*data()), max_batch=64)
    assert math.isfinite(metrics["rmse"]) and pred.shape == (64,) and found >= 1
    assert tr.device.type == "cuda" and tr.isolated and not tr.bus.pending  # no worker was lost
    assert tripwires == [] and tripwires.asked == []  # the kernel never stepped an optimizer
    assert not torch.cuda.is_initialized()


def test_a_lost_cuda_worker_continues_on_the_cpu_without_starting_cuda(tmp_path, monkeypatch,
                                                                      view, tripwires):
    monkeypatch.setenv(FAULT_ENV, "step:kill:3")
    tr = trainer(tmp_path, device="cuda", precision="bf16")
    tr.fit(data(), val=data(64, seed=1))
    assert [e.kind for e in tr.events].count("worker_lost") == 1
    assert tr.device.type == "cpu" and not tr.isolated
    assert tr.history["epoch"].tolist() == list(range(EPOCHS))
    assert math.isfinite(tr.evaluate(data(64, seed=2))["rmse"])  # here, on the CPU
    assert tripwires == []
    assert not torch.cuda.is_initialized()
