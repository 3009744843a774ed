"""Recovery: OOM splitting, per-batch CPU fallback, moving to the CPU after a sticky device error,
and the loss-explosion guard. Faults are injected by a model wrapper that raises the real
CUDA/HIP/MPS messages on chosen forward calls; the tests compare what was kept (weights, steps,
events) with a run without faults."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from hybridnb import failures
from hybridnb.strategies.base import SingleDevice
from hybridnb.train import recovery
from hybridnb.train.bus import Bus
from hybridnb.train.trainer import Trainer

torch.set_num_threads(1)

CUDA_OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 7.79 GiB total capacity; "
            "5.12 GiB already allocated; 1.01 GiB free; 5.50 GiB reserved in total by PyTorch)")
ILLEGAL = ("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be "
           "asynchronously reported at some other API call, so the stacktrace below might be "
           "incorrect.")


def data(n=320, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    y = torch.sin(x @ torch.linspace(-1, 1, d)) + 0.05 * torch.randn(n, generator=g)
    return x, y


class Faulty(nn.Module):
    """A small MLP (no batch norm: its batch statistics would make a split update differ by
    design) whose training forward raises ``make_error()`` on chosen call numbers."""

    def __init__(self, fail_on=(), make_error=None, d=8, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(d, 32), nn.Tanh(), nn.Linear(32, 1))
        self.fail_on, self.make_error = set(fail_on), make_error
        self.calls = 0
        self.samples = 0

    def forward(self, x):
        if self.training and torch.is_grad_enabled():
            self.calls += 1
            if self.calls in self.fail_on:
                raise self.make_error()
            self.samples += len(x)
        return self.net(x)


def fit(model, epochs=3, **kw):
    kw = {"device": "cpu", "batch_size": 32, "lr": 1e-2, "seed": 0, "live": False, **kw}
    tr = Trainer(model, epochs=epochs, **kw)
    tr.fit(data(), val=data(64, seed=1))
    return tr


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def assert_close(a, b, rtol=1e-5, atol=1e-6):
    for x, y in zip(a, b, strict=True):
        assert torch.allclose(x, y, rtol=rtol, atol=atol), (x - y).abs().max()


# ------------------------------------------------------------------------------- predicates
def test_a_kept_state_is_a_cpu_copy_that_keeps_each_dicts_type():
    """MultiStepLR keeps its milestones in a Counter: a restored run must still decay there."""
    opt = torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[2, 4], gamma=0.1)
    kept = recovery.to_cpu(sched.state_dict())
    assert kept["milestones"] == sched.state_dict()["milestones"]
    restored = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[9])
    restored.load_state_dict(kept)
    lrs = []
    for _ in range(5):
        opt.step()
        restored.step()
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs == pytest.approx([1.0, 0.1, 0.1, 0.01, 0.01])
    t = torch.ones(2)
    copied = recovery.to_cpu({"w": t})["w"]
    assert torch.equal(copied, t) and copied.data_ptr() != t.data_ptr()


def test_training_after_a_restore_leaves_the_snapshot_as_it_was():
    from hybridnb.train import saved

    tr = Trainer(nn.Linear(8, 1), device="cpu", batch_size=16, epochs=1, live=False,
                 isolate=False, seed=0)
    data = (torch.randn(64, 8), torch.randn(64, 1))
    tr.fit(data)
    snapshot = saved.state_dict(tr.loop)
    before = {k: v.clone() for k, v in snapshot["optimizer"]["state"][0].items()}
    saved.restore(tr.loop, snapshot)
    tr.model(data[0]).pow(2).mean().backward()  # a step from the restored state
    tr.optimizer.step()
    after = snapshot["optimizer"]["state"][0]
    assert all(torch.equal(before[k], after[k]) for k in before), "the snapshot changed"


@pytest.mark.parametrize("exc", [
    torch.OutOfMemoryError(CUDA_OOM),
    RuntimeError(CUDA_OOM),
    RuntimeError("HIP out of memory. Tried to allocate 1.50 GiB (GPU 0; 15.98 GiB total)"),
    RuntimeError("MPS backend out of memory (MPS allocated: 17.00 GB, other allocations: 1.2 GB,"
                 " max allowed: 18.13 GB). Tried to allocate 256 MB on private pool."),
    RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed "
                 "in a non-contiguous input."),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate "
                 "memory: you tried to allocate 110336696336 bytes. Error code 12"),
    MemoryError(),
])
def test_is_oom_recognises_every_backend(exc):
    assert recovery.is_oom(exc)
    assert not recovery.is_device_lost(exc)


@pytest.mark.parametrize("msg", [
    ILLEGAL,
    "CUDA error: device-side assert triggered",
    "CUDA error: unspecified launch failure",
    "HIP error: an illegal memory access was encountered",
    "hipErrorLaunchFailure: unspecified launch failure",
])
def test_sticky_device_errors_are_not_oom(msg):
    exc = RuntimeError(msg)
    assert recovery.is_device_lost(exc)
    assert not recovery.is_oom(exc)


def test_ordinary_errors_are_neither():
    for exc in (RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 8x2)"),
                ValueError("out of memory"), KeyError("x")):
        assert not recovery.is_oom(exc) and not recovery.is_device_lost(exc)


def test_micro_batches_weights_sum_to_one_and_cover_every_sample():
    window = [(torch.arange(10.0), torch.arange(10.0)), (torch.arange(7.0), torch.arange(7.0))]
    assert recovery.halved(10) == 5 and recovery.halved(5) == 3
    parts = list(recovery.micro_batches(window, 3))
    assert len(parts) == 4 + 3
    assert math.isclose(sum(w for _, _, w in parts), 1.0)
    assert torch.equal(torch.cat([x for x, _, _ in parts]),
                       torch.cat([torch.arange(10.0), torch.arange(7.0)]))
    assert recovery.halved(1) is None


# ------------------------------------------------------------------------------- OOM splitting
def test_injected_oom_at_ten_percent_of_steps_gives_the_same_weights():
    """~10% of 30 steps hit a fake CUDA OOM, two of them after a first micro-batch's backward
    (partial gradients); the split run ends with the unsplit run's weights and step losses."""
    clean = fit(Faulty(), grad_accum=2, batch_size=16)
    faulty_model = Faulty(fail_on={8, 26, 47}, make_error=lambda: torch.OutOfMemoryError(CUDA_OOM))
    faulty = fit(faulty_model, grad_accum=2, batch_size=16)
    assert_close(params(faulty.model), params(clean.model))
    assert torch.allclose(torch.tensor(faulty.steps["loss"].values),
                          torch.tensor(clean.steps["loss"].values), rtol=1e-5, atol=1e-7)
    splits = [e for e in faulty.events if e.kind == "oom_split"]
    assert len(splits) == 3 and "CUDA out of memory" in splits[0].message
    assert faulty.state.micro == 2  # 16 -> 8 -> 4 -> 2, remembered
    # each step's loss is the mean over its window's samples: a lost or doubled sample would
    # change it, and the per-step losses above match the clean run's
    assert faulty_model.samples > clean.model.samples == 3 * 320  # aborted attempts were redone
    assert faulty.history["events"].str.contains("oom_split").sum() >= 1
    assert len(faulty.history) == 3


def test_one_sample_not_fitting_runs_that_batch_on_the_cpu(monkeypatch):
    """On a (pretend) GPU, OOM down to micro-batches of 1 -> the batch runs on the CPU, the next
    batch goes back to the device; weights equal a run without faults."""
    in_fallback = {"on": False, "runs": 0}
    real_on_cpu = recovery.on_cpu

    def spy_on_cpu(model, device):
        in_fallback["runs"] += 1
        in_fallback["on"] = True
        try:
            with real_on_cpu(model, device) as cpu:
                yield cpu
        finally:
            in_fallback["on"] = False

    monkeypatch.setattr(recovery, "on_cpu", __import__("contextlib").contextmanager(spy_on_cpu))

    class FullGpu(Faulty):
        """From call 12 on, nothing fits 'on the GPU' until one batch ran on the CPU."""

        def forward(self, x):
            if self.training and torch.is_grad_enabled() and not in_fallback["on"]:
                self.calls += 1
                if self.calls >= 12 and in_fallback["runs"] == 0:
                    raise torch.OutOfMemoryError(CUDA_OOM)
            return self.net(x)

    clean = fit(Faulty(), epochs=2)
    gpu = SingleDevice("cpu")
    gpu.accelerator = True  # pretend: the device is a GPU, so the per-batch fallback applies
    tr = fit(FullGpu(), epochs=2, strategy=gpu)
    kinds = [e.kind for e in tr.events]
    assert kinds.count("oom_split") == 5  # 32 -> 16 -> 8 -> 4 -> 2 -> 1
    assert kinds.count("cpu_batch") == 1 and in_fallback["runs"] == 1
    assert tr.strategy is gpu  # back on the device afterwards
    assert_close(params(tr.model), params(clean.model))


def test_oom_on_the_cpu_at_one_sample_raises_a_clear_error():
    model = Faulty(fail_on=set(range(5, 100)), make_error=lambda: RuntimeError(
        "DefaultCPUAllocator: can't allocate memory: you tried to allocate 9000000000 bytes"))
    with pytest.raises(MemoryError, match="even with one sample per micro-batch"):
        fit(model, epochs=1)


def test_on_gpu_error_raise_propagates_the_oom():
    model = Faulty(fail_on={3}, make_error=lambda: torch.OutOfMemoryError(CUDA_OOM))
    with pytest.raises(torch.OutOfMemoryError):
        fit(model, epochs=1, on_gpu_error="raise")


def test_other_errors_are_not_swallowed():
    model = Faulty(fail_on={3}, make_error=lambda: RuntimeError("shape mismatch (fake bug)"))
    with pytest.raises(RuntimeError, match="shape mismatch"):
        fit(model, epochs=1)


# ------------------------------------------------------------------------------- sticky errors
def test_sticky_device_error_moves_the_run_to_cpu_from_the_last_good_state(monkeypatch):
    """An illegal memory access at step 13 on a (pretend) GPU: the run continues on the CPU from
    the snapshot of step 10 and, replaying the same batches and RNG, ends exactly where a run
    without the fault ends."""
    monkeypatch.setattr(failures, "_LOST", set())
    clean = fit(Faulty(), snapshot_every=5)
    gpu = SingleDevice("cpu")
    gpu.accelerator = True
    tr = fit(Faulty(fail_on={13}, make_error=lambda: RuntimeError(ILLEGAL)), strategy=gpu,
             snapshot_every=5, precision="auto")
    lost = [e for e in tr.events if e.kind == "device_lost"]
    assert len(lost) == 1
    assert "illegal memory access" in lost[0].message and "step 10" in lost[0].message
    assert tr.strategy is not gpu and not tr.strategy.accelerator  # never back to the device
    assert tr.device.type == "cpu" and tr.precision.name == "fp32"
    assert len(tr.history) == 3 and tr.global_step == 30
    assert "device_lost" in tr.history["events"].iloc[1]
    for a, b in zip(params(tr.model), params(clean.model), strict=True):
        assert torch.equal(a, b)
    assert tr.steps["global_step"].tolist() == list(range(1, 31))  # redone steps not doubled


class FakeGpu(SingleDevice):
    """A pretend GPU (tensors stay on the CPU) that fails the test if anything calls into it
    after it was lost: placing tensors, wrapping, reductions, RNG or memory queries."""

    def __init__(self):
        super().__init__("cpu")
        self.accelerator = True
        self.lost = False
        self.calls_after_loss = []

    def _touch(self, what):
        if self.lost:
            self.calls_after_loss.append(what)
            raise RuntimeError(f"called the lost device ({what})")

    def to_device(self, tensor):
        self._touch("to_device")
        return super().to_device(tensor)

    def wrap(self, model, optimizer):
        self._touch("wrap")
        return model

    def agree(self, flag):
        self._touch("agree")
        return flag

    def sum(self, values):
        self._touch("sum")
        return values

    def optimizer_state(self, optimizer):
        self._touch("optimizer_state")
        return super().optimizer_state(optimizer)


def test_after_a_lost_device_nothing_calls_into_it_and_the_run_finishes_on_cpu(monkeypatch):
    monkeypatch.setattr(failures, "_LOST", set())
    gpu = FakeGpu()
    calls = []
    for name in ("empty_cache", "synchronize", "mem_get_info", "memory_allocated",
                 "max_memory_allocated", "reset_peak_memory_stats", "get_rng_state",
                 "set_rng_state"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, _n=name, **k: calls.append(_n))

    def lose():
        gpu.lost = True
        return RuntimeError("CUDA error: device-side assert triggered (fake)")

    clean = fit(Faulty(), snapshot_every=5)
    tr = fit(Faulty(fail_on={13}, make_error=lose), strategy=gpu, snapshot_every=5)
    assert gpu.calls_after_loss == [] and calls == []
    assert [e.kind for e in tr.events].count("device_lost") == 1
    assert tr.strategy is not gpu and tr.global_step == 30 and len(tr.history) == 3
    for a, b in zip(params(tr.model), params(clean.model), strict=True):
        assert torch.equal(a, b)  # finished on the CPU from the snapshot, as a clean run
    with pytest.raises(RuntimeError, match="called the lost device"):
        gpu.to_device(torch.zeros(1))  # the fake really refuses (the test can fail)


def test_oom_in_the_optimizer_update_on_a_gpu_is_treated_as_lost_device(monkeypatch):
    monkeypatch.setattr(failures, "_LOST", set())
    gpu = SingleDevice("cpu")
    gpu.accelerator = True
    model = Faulty()
    tr = Trainer(model, device="cpu", batch_size=32, epochs=1, live=False, seed=0, strategy=gpu)
    real_step = tr.optimizer.step
    calls = {"n": 0}

    def step(*a, **k):
        calls["n"] += 1
        if calls["n"] == 4:
            raise torch.OutOfMemoryError(CUDA_OOM)
        return real_step(*a, **k)

    monkeypatch.setattr(tr.optimizer, "step", step)
    tr.fit(data())
    assert [e.kind for e in tr.events].count("device_lost") == 1
    assert tr.global_step == 10 and not tr.strategy.accelerator


# ------------------------------------------------------------------------------- loss guard
class Poison(Faulty):
    """Multiplies the output by ``factor`` (NaN or a large number) on chosen training calls."""

    def __init__(self, poison_on=(), factor=float("nan")):
        super().__init__()
        self.poison_on, self.factor = set(poison_on), factor

    def forward(self, x):
        out = super().forward(x)
        return out * self.factor if self.calls in self.poison_on and self.training else out


def test_nan_loss_is_skipped_lr_cut_and_the_run_continues():
    clean = fit(Faulty(), schedule=None)
    tr = fit(Poison({5, 17}), schedule=None)
    bad = [e for e in tr.events if e.kind == "nonfinite_loss"]
    assert len(bad) == 2 and [e.step for e in bad] == [4, 16]
    assert math.isclose(tr.optimizer.param_groups[0]["lr"], 1e-2 * 0.25)
    losses = tr.steps["loss"]
    assert losses.isna().sum() == 2 and losses.iloc[[4, 16]].isna().all()
    assert all(torch.isfinite(p).all() for p in tr.model.parameters())
    assert not any(e.kind == "restore" for e in tr.events)
    # the first 4 steps are identical; the skipped step left the weights as they were, so the
    # run differs from the clean one only through the lower learning rate afterwards
    assert torch.allclose(torch.tensor(losses.iloc[:4].values),
                          torch.tensor(clean.steps["loss"].iloc[:4].values))
    assert len(tr.history) == 3


def test_consecutive_bad_steps_restore_the_last_good_state():
    from hybridnb.train.recovery import LossGuard

    tr = fit(Poison({13, 14, 15}), schedule=None, snapshot_every=5,
             loss_guard=LossGuard(patience=3, lr_cut=0.5))
    kinds = [e.kind for e in tr.events]
    assert kinds.count("nonfinite_loss") == 3 and kinds.count("restore") == 1
    restore = next(e for e in tr.events if e.kind == "restore")
    assert "step 10" in restore.message
    assert tr.global_step == 30 and len(tr.history) == 3
    assert math.isclose(tr.optimizer.param_groups[0]["lr"], 1e-2 * 0.125)  # cut kept
    assert tr.steps["global_step"].tolist() == list(range(1, 31))
    assert all(torch.isfinite(p).all() for p in tr.model.parameters())


def test_loss_spike_is_detected_against_the_running_mean():
    from hybridnb.train.recovery import LossGuard

    tr = fit(Poison({25}, factor=1e4), schedule=None, loss_guard=LossGuard(warmup=10))
    spikes = [e for e in tr.events if e.kind == "loss_spike"]
    assert len(spikes) == 1 and spikes[0].step == 24


def test_loss_guard_unit():
    g = recovery.LossGuard(spike=5, warmup=3, patience=2)
    assert [g.check(v) for v in (1.0, 1.1, 0.9, 1.0)] == ["ok"] * 4
    assert g.check(100.0) == "spike" and g.check(float("inf")) == "nonfinite"
    assert g.streak >= g.patience  # the loop goes back to the last good state
    assert g.check(1.0) == "ok" and g.streak == 0
    assert g.check(1.0, grad_norm=float("nan")) == "nonfinite"


def test_a_failed_attempt_leaves_no_trace_in_batch_norm_statistics_or_the_rng():
    """An OOM after batch norm has updated its running statistics and dropout has drawn from
    the RNG: the split re-run starts from the state before the failed attempt, so the result
    equals running the split directly (and the event says batch norm normalises per
    micro-batch)."""
    from hybridnb.train.precision import Precision
    from hybridnb.train.state import RunState
    from hybridnb.train.step import TrainStep

    class BnNet(nn.Module):
        def __init__(self, fail_first=False):
            super().__init__()
            torch.manual_seed(0)
            self.bn, self.drop, self.lin = nn.BatchNorm1d(8), nn.Dropout(0.3), nn.Linear(8, 1)
            self.fail_first = fail_first

        def forward(self, x):
            h = self.drop(self.bn(x))  # statistics updated, random numbers drawn ...
            if self.fail_first and len(x) == 32:
                self.fail_first = False
                raise torch.OutOfMemoryError(CUDA_OOM)  # ... then the attempt fails
            return self.lin(h)

    def one_step(model, micro):
        torch.manual_seed(7)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        step = TrainStep(model, lambda out, y: nn.functional.mse_loss(out[:, 0], y), opt,
                         Precision.choose("fp32", "cpu"))
        events, bus = [], Bus(lambda: (0, 0))
        bus.subscribe(lambda event: events.append((event.kind, event.message)))
        rec = recovery.Recovery(step, model=model, on_gpu_error="recover", guard=None,
                                state=RunState(micro=micro), bus=bus)
        x, y = data(32)
        assert rec.run([(x, y)])[0] == "ok"
        return events, torch.rand(3)  # the RNG's position after the step

    failed = BnNet(fail_first=True)
    events, rng_after = one_step(failed, None)
    direct = BnNet()
    _, rng_direct = one_step(direct, 16)
    assert [k for k, _ in events] == ["oom_split"] and "batch norm" in events[0][1]
    assert torch.equal(failed.bn.running_mean, direct.bn.running_mean)
    assert torch.equal(failed.bn.running_var, direct.bn.running_var)
    assert failed.bn.num_batches_tracked == direct.bn.num_batches_tracked == 2
    assert torch.equal(rng_after, rng_direct)
    assert_close(params(failed), params(direct))


def test_without_the_loss_guard_a_non_finite_loss_is_said_once():
    x, y = data()
    y[::10] = float("nan")
    tr = Trainer(Faulty(), device="cpu", batch_size=32, epochs=2, live=False, seed=0,
                 loss_guard=False)
    tr.fit((x, y))
    said = [e for e in tr.events if e.kind == "nonfinite_loss"]
    assert len(said) == 1 and "loss_guard=False" in said[0].message
    assert "y: NaN" in said[0].message  # names the tensor that holds it
    assert tr.global_step == 20  # it did what was asked: trained every step


# ------------------------------------------------------------------------------- trial fits
def pretend_gpu() -> SingleDevice:
    gpu = SingleDevice("cpu")
    gpu.accelerator = True  # tensors stay on the CPU; recovery treats it as a GPU
    return gpu


def test_lr_find_leaves_on_gpu_error_raise_as_the_user_set_it(monkeypatch):
    """Only the batch-size probe recovers out-of-memory on its own; a sweep raises it."""
    monkeypatch.setattr(failures, "_LOST", set())
    model = Faulty(fail_on={3}, make_error=lambda: torch.OutOfMemoryError(CUDA_OOM))
    tr = Trainer(model, device="cpu", strategy=pretend_gpu(), batch_size=32, lr=1e-2, seed=0,
                 live=False, on_gpu_error="raise")
    with pytest.raises(torch.OutOfMemoryError):
        tr.lr_find(data())
    assert not any(e.kind == "oom_split" for e in tr.events)


def test_a_device_lost_during_the_batch_size_search_ends_it_with_no_size(monkeypatch):
    monkeypatch.setattr(failures, "_LOST", set())

    class FailsOnce(Faulty):
        def forward(self, x):
            if self.training and not self.calls:
                self.calls += 1
                raise RuntimeError(ILLEGAL)  # sticky: the run moves to the CPU
            return self.net(x)

    tr = Trainer(FailsOnce(), device="cpu", strategy=pretend_gpu(), batch_size=32, lr=1e-2,
                 seed=0, live=False)
    with pytest.raises(RuntimeError, match="device failed at batch 32.*no batch size was chosen"):
        tr.find_batch_size(torch.utils.data.TensorDataset(*data()), start=32)
    assert tr.batch_size == 32 and tr.device.type == "cpu"
