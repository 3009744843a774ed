"""Isolated training's supervisor: faults injected in a forked worker, on the CPU.

Every test ends with no child process left (the autouse fixture), so a worker or a worker's own
child that survived its run fails the test that left it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch

from hybridnb import platform
from hybridnb.train import isolate
from hybridnb.train.isolate import isolate_decision, run_isolated
from hybridnb.train.settings import Settings

pytestmark = pytest.mark.timeout(120)  # a supervisor that never returns fails, not hangs


@pytest.fixture(autouse=True)
def nothing_left_running():
    yield
    children = psutil.Process().children(recursive=True)
    assert children == [], f"processes left behind: {children}"


def _collect():
    got = []
    return got, got.append


def _steps_then(n, then, state_at=None):
    """A work fn: n quick steps (a "state" after step ``state_at``), then ``then(channel)``."""
    def work(channel):
        channel.send("pid", os.getpid())
        for i in range(1, n + 1):
            channel.send("view", {"step": i})
            channel.step_done()
            if i == state_at:
                channel.state({"step": i, "w": torch.full((4,), float(i))})
        return then(channel)
    return work


def _gone(pid: int, within: float = 3.0) -> bool:
    """The process ended (a worker's own child, killed with its group, is reparented: it may be
    a zombie of init's for a while, and SIGKILL reaches it a few ms after the call returns)."""
    deadline = time.monotonic() + within
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


# ------------------------------------------------------------------ results, order, errors

def test_messages_arrive_in_order_and_the_result_comes_back():
    got, on = _collect()

    def work(channel):
        for i in range(500):
            channel.send("event" if i % 7 == 0 else "view", {"seq": i, "x": torch.tensor([i])})
        return {"answer": 42, "weights": torch.arange(3.0)}

    out = run_isolated(work, on_message=on)
    assert out.ok and out.status == "done", out.reason
    seqs = [m.payload["seq"] for m in got if m.kind in ("view", "event")]
    assert seqs == list(range(500))
    assert all(int(m.payload["x"]) == m.payload["seq"] for m in got if m.kind == "view")
    assert got[-1].kind == "done"
    assert out.result["answer"] == 42 and torch.equal(out.result["weights"], torch.arange(3.0))


def test_an_exception_in_the_worker_comes_back_with_its_traceback():
    def failing_step(channel):
        raise RuntimeError("CUDA error: device-side assert triggered")

    out = run_isolated(_steps_then(2, failing_step))
    assert out.status == "error" and not out.ok
    assert "RuntimeError" in out.reason and "device-side assert" in out.reason
    assert out.steps == 2
    assert "Traceback (most recent call last)" in out.error["traceback"]
    assert "failing_step" in out.error["traceback"]
    assert out.error["type"] == "RuntimeError"


def test_a_result_that_cannot_be_sent_is_an_error_that_says_so():
    out = run_isolated(lambda channel: (lambda: 0))  # a lambda does not pickle
    assert out.status == "error" and out.error["type"] == "TypeError"
    assert "cannot be sent" in out.reason


def test_exit_without_a_result_is_a_death_that_names_the_code():
    def busy_then_exit(channel):
        time.sleep(0.5)  # step 3's step_done waits in the batch; the channel's thread sends it
        os._exit(3)

    out = run_isolated(_steps_then(3, busy_then_exit, state_at=2))
    assert out.status == "died"
    assert "exited with code 3" in out.reason and out.steps == 3
    assert out.state["step"] == 2


def test_the_worker_is_headless_and_marked_isolated(capfd):
    def work(channel):
        print("printed by the worker")
        print("warned by the worker", file=sys.stderr)
        ok, why = isolate_decision(True, "cpu", in_distributed=False)
        return {"headless": os.environ.get("HYBRIDNB_HEADLESS"), "nested": ok, "why": why,
                "pgid_is_own": os.getpgid(0) == os.getpid()}

    out = run_isolated(work)
    assert out.result["headless"] == "1"
    assert out.result["nested"] is False and "already inside" in out.result["why"]
    assert out.result["pgid_is_own"]
    captured = capfd.readouterr()
    assert "printed by the worker" in captured.out
    assert "warned by the worker" in captured.err
    assert "printed by the worker" in out.output_tail


# ------------------------------------------------------------------ deaths

def test_sigkill_mid_work_names_the_death_and_keeps_the_last_state():
    got, keep = _collect()

    def on(m):
        keep(m)
        if m.kind == "step_done" and sum(x.kind == "step_done" for x in got) == 6:
            os.kill(pid[0], signal.SIGKILL)  # from outside, while it works on step 7
        if m.kind == "pid":
            pid.append(m.payload)

    pid: list[int] = []

    def slow_forever(channel):
        while True:  # a step that is still running when the signal comes
            torch.randn(64, 64) @ torch.randn(64, 64)

    def work(channel):
        channel.send("pid", os.getpid())
        for i in range(1, 7):
            channel.state({"step": i, "w": torch.full((1000,), float(i))})
            channel.step_done()
        slow_forever(channel)

    out = run_isolated(work, on_message=on)
    assert out.status == "died"
    assert out.steps == 6 and "killed by SIGKILL" in out.reason
    assert out.state["step"] == 6 and torch.equal(out.state["w"], torch.full((1000,), 6.0))
    assert _gone(pid[0])


@pytest.mark.parametrize("sig", [signal.SIGABRT, signal.SIGSEGV])
def test_abort_and_segfault_name_the_signal_and_keep_the_last_state(sig):
    def crash(channel):
        time.sleep(0.3)  # mid-step
        print("terminate called after throwing an instance of 'c10::Error'\n"
              "  what():  CUDA error: an illegal memory access was encountered",
              file=sys.stderr)
        os.kill(os.getpid(), sig)
        time.sleep(30)

    out = run_isolated(_steps_then(4, crash, state_at=3), forward_output=False)
    assert out.status == "died"
    assert f"killed by {sig.name}" in out.reason and out.steps == 4, out.reason
    assert "illegal memory access" in out.last_words  # the C++ message, not faulthandler's dump
    assert "illegal memory access" in out.reason
    assert out.state["step"] == 3 and torch.equal(out.state["w"], torch.full((4,), 3.0))
    assert " in crash" in out.output_tail  # faulthandler printed the worker's Python stack


# ------------------------------------------------------------------ hangs

def test_a_step_that_hangs_past_step_timeout_is_caught_and_nothing_is_left():
    helper: list[int] = []

    def hang(channel):
        # a helper process of the worker's own (as a DataLoader worker would be)
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        channel.send("helper", p.pid)
        time.sleep(600)

    def on(m):
        if m.kind == "helper":
            helper.append(m.payload)

    step_timeout = 1.5
    t0 = time.monotonic()
    out = run_isolated(_steps_then(5, hang, state_at=4), on_message=on,
                       step_timeout=step_timeout)
    took = time.monotonic() - t0
    assert out.status == "hung", out.reason
    assert (out.limit_name, out.limit_s, out.steps) == ("step_timeout", 1.5, 5)
    assert out.silent_s >= 1.5
    assert took < step_timeout + 5
    assert out.state["step"] == 4
    assert helper and _gone(helper[0])


def test_dataloader_workers_inside_the_worker_work_and_die_with_it():
    """The real set-up: a DataLoader with worker processes of its own, forked by the worker."""
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.arange(64.0).reshape(32, 2), torch.zeros(32))
    kids: list[int] = []

    def work(channel):
        channel.heartbeat(grace=30.0)  # the loader's start-up may be slow; the hang is not
        loader = DataLoader(data, batch_size=4, num_workers=2, persistent_workers=True)
        total = sum(float(x.sum()) for x, _ in loader)
        channel.send("kids", [p.pid for p in psutil.Process().children()])
        channel.state({"total": total})
        for _ in loader:
            channel.step_done()
            time.sleep(600)  # hangs while its loader workers are alive

    def on(m):
        if m.kind == "kids":
            kids.extend(m.payload)

    out = run_isolated(work, on_message=on, step_timeout=1.0)
    assert out.status == "hung"
    assert out.state["total"] == float(torch.arange(64.0).sum())
    assert len(kids) == 2 and all(_gone(pid) for pid in kids)


def test_without_a_grace_asked_for_a_first_step_hang_meets_the_step_timeout():
    """No warm-up grace by default: a worker that asks for none (nothing to compile, no CUDA)
    is held to the step timeout from its first message on."""
    out = run_isolated(lambda channel: time.sleep(600), step_timeout=0.5)
    assert out.status == "hung", out.reason
    assert (out.limit_name, out.limit_s) == ("step_timeout", 0.5) and out.steps == 0


def test_the_automatic_timeout_follows_the_measured_steps(monkeypatch):
    assert isolate.auto_step_timeout([]) == isolate.STEP_TIMEOUT_FLOOR_S
    assert isolate.auto_step_timeout([0.01, 0.02, 0.03]) == isolate.STEP_TIMEOUT_FLOOR_S
    assert isolate.auto_step_timeout([10.0, 12.0, 11.0]) == pytest.approx(220.0)
    # supervised: with a 1 s floor, 10 ms steps then a hang is caught after about a second
    monkeypatch.setattr(isolate, "STEP_TIMEOUT_FLOOR_S", 1.0)
    t0 = time.monotonic()
    out = run_isolated(_steps_then(6, lambda ch: time.sleep(600)), step_timeout=None)
    assert out.status == "hung" and (out.limit_name, out.limit_s) == ("step_timeout", 1.0)
    assert out.median_step_s < 0.05  # steps of well under a millisecond, then the hang
    assert time.monotonic() - t0 < 6


def test_step_times_come_from_the_worker_clock_despite_batching():
    def steps(channel):
        for _ in range(8):
            time.sleep(0.03)  # shorter than the channel's batching interval
            channel.step_done()

    out = run_isolated(steps)
    assert out.ok and out.steps == 8
    assert 0.025 <= out.median_step_s < 0.09, out.median_step_s


def test_a_heartbeat_with_grace_keeps_a_long_pause_alive():
    def compile_then_finish(channel):
        channel.heartbeat(grace=4.0)  # "compiling: the next step may take a while"
        time.sleep(2.0)
        channel.step_done()
        return "finished"

    out = run_isolated(_steps_then(3, compile_then_finish), step_timeout=0.7)
    assert out.ok and out.result == "finished", out.reason


# ------------------------------------------------------------------ stopping

def _until_stopped(channel):
    steps = 0
    while channel.stop_reason() is None:
        time.sleep(0.01)
        steps += 1
        channel.step_done()
    channel.state({"stopped_at": steps})
    return {"stopped_at": steps}


def test_should_stop_sends_stop_and_the_worker_finishes_with_its_state():
    got, on = _collect()
    out = run_isolated(_until_stopped, on_message=on, poll=0.02,
                       should_stop=lambda: sum(m.kind == "step_done" for m in got) >= 5)
    assert out.ok and not out.interrupted  # ok: it returned, so it was asked to stop
    assert out.result["stopped_at"] >= 5 and out.state == out.result


def test_ctrl_c_asks_the_worker_to_stop_and_it_returns_its_checkpoint(capsys):
    def on(m):
        if m.kind == "step_done" and not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the kernel

    sent: list[int] = []
    before = signal.getsignal(signal.SIGINT)
    out = run_isolated(_until_stopped, on_message=on)
    assert out.ok and out.interrupted  # ok: it returned, so it was asked to stop
    assert out.state["stopped_at"] >= 1
    assert signal.getsignal(signal.SIGINT) is before  # the handler is put back
    assert "interrupt again to kill it" in capsys.readouterr().err


def test_ctrl_c_kills_a_worker_that_does_not_stop_in_time():
    def on(m):
        if m.kind == "step_done" and not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGINT)

    sent: list[int] = []
    t0 = time.monotonic()
    out = run_isolated(_steps_then(2, lambda ch: time.sleep(600), state_at=2), on_message=on,
                       stop_grace=1.0)
    assert out.status == "interrupted" and out.interrupted
    assert "had not stopped 1.0 s after Ctrl-C" in out.reason
    assert out.state["step"] == 2
    assert time.monotonic() - t0 < 6


def test_a_second_ctrl_c_kills_the_worker_at_once():
    def on(m):
        if m.kind == "step_done" and len(sent) < 2:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)

    sent: list[int] = []
    t0 = time.monotonic()
    out = run_isolated(_steps_then(1, lambda ch: time.sleep(600)), on_message=on,
                       stop_grace=60)
    assert out.status == "interrupted" and out.interrupted and "twice" in out.reason
    assert time.monotonic() - t0 < 5


def test_an_error_in_on_message_kills_the_worker_and_propagates():
    def on(m):
        if m.kind == "view":
            raise ValueError("the renderer broke")

    with pytest.raises(ValueError, match="the renderer broke"):
        run_isolated(_steps_then(3, lambda ch: time.sleep(600)), on_message=on)


# ------------------------------------------------------------------ a large state

def test_a_large_state_arrives_intact_and_fast():
    """~50 MB of tensors of several dtypes and layouts, bit for bit; prints the transfer time."""
    g = torch.Generator().manual_seed(0)
    state = {
        "model": {f"layer{i}.weight": torch.randn(1024, 1024, generator=g) for i in range(12)},
        "optimizer": {"exp_avg": torch.randn(256, 1024, generator=g).to(torch.bfloat16),
                      "step": torch.tensor(17), "mask": torch.rand(1000, generator=g) > 0.5,
                      "ids": torch.arange(10_000, dtype=torch.int64)},
        "transposed": torch.randn(300, 200, generator=g).t(),  # not contiguous
        "param": torch.nn.Parameter(torch.randn(10, generator=g)),
        "empty": torch.empty(0, 5),
        "history": [{"epoch": e, "loss": 1.0 / (e + 1)} for e in range(100)],
    }
    state["again"] = state["model"]["layer0.weight"]  # the same tensor twice
    nbytes = sum(t.nbytes for t in state["model"].values())
    assert nbytes >= 40e6
    arrived: list[float] = []

    def work(channel):
        t0 = time.perf_counter()
        channel.send("stamp", t0)
        channel.state(state)
        return time.perf_counter() - t0

    def on(m):
        if m.kind in ("stamp", "state"):
            arrived.append(time.perf_counter())

    out = run_isolated(work, on_message=on)
    assert out.ok, out.reason
    got = out.state
    for key, t in state["model"].items():
        assert torch.equal(got["model"][key], t)
    for key in ("exp_avg", "step", "mask", "ids"):
        assert got["optimizer"][key].dtype == state["optimizer"][key].dtype
        assert torch.equal(got["optimizer"][key], state["optimizer"][key])
    assert torch.equal(got["transposed"], state["transposed"])
    assert isinstance(got["param"], torch.nn.Parameter) and got["param"].requires_grad
    assert torch.equal(got["param"].detach(), state["param"].detach())
    assert got["empty"].shape == (0, 5)
    assert got["history"] == state["history"]
    assert got["again"] is got["model"]["layer0.weight"]
    seconds = arrived[1] - arrived[0]
    print(f"\n{nbytes / 1e6:.1f} MB of weights: {seconds * 1e3:.0f} ms from send to delivery "
          f"({nbytes / 1e6 / seconds:.0f} MB/s); worker blocked {out.result * 1e3:.0f} ms")


# ------------------------------------------------------------------ the decision

def test_isolate_decision(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("HYBRIDNB_LAUNCHED", raising=False)
    monkeypatch.delenv(isolate.ISOLATED_ENV, raising=False)
    decide = isolate_decision
    assert decide("auto", "cuda", in_distributed=False)[0] is True
    assert decide("auto", "cuda:1", in_distributed=False)[0] is True
    assert decide(True, "cuda", in_distributed=False)[0] is True
    off, why = decide("auto", "cpu", in_distributed=False)
    assert off is False and "CPU run" in why
    assert decide(True, "cpu", in_distributed=False) == (
        True, "isolate=True: training on the CPU in a supervised worker process")
    assert decide(False, "cuda", in_distributed=False)[0] is False
    assert decide("auto", "cuda", in_distributed=True)[0] is False
    assert "not 'mps'" in decide("auto", "mps", in_distributed=False)[1]
    monkeypatch.setenv("LOCAL_RANK", "0")  # torchrun
    off, why = decide("auto", "cuda", in_distributed=False)
    assert off is False and "already a supervised process" in why
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.setenv("HYBRIDNB_LAUNCHED", "1")  # hn.launch
    assert decide(True, "cuda", in_distributed=False)[0] is False
    monkeypatch.delenv("HYBRIDNB_LAUNCHED")
    # the worker is spawned: CUDA already started here, or no fork, changes nothing
    assert decide("auto", "cuda", in_distributed=False)[0] is True
    assert decide(True, "cpu", in_distributed=False)[0] is True
    with pytest.raises(ValueError, match="isolate='yes'"):
        Settings.build(isolate="yes")  # checked with every option, before any decision


def test_say_once(capsys):
    platform.say_once("a reason seen for the first time in this test")
    platform.say_once("a reason seen for the first time in this test")
    assert capsys.readouterr().err.count("a reason seen") == 1


def test_the_worker_computes_with_the_kernels_torch_thread_count():
    """A user's torch.set_num_threads holds in the isolated worker too (a fresh interpreter would
    take every core, and two processes on the same cores slow each other down)."""
    import torch
    from torch import nn

    from hybridnb.train.trainer import Trainer

    class Counts(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 1)
            self.register_buffer("threads", torch.zeros(()))

        def forward(self, x):
            self.threads.fill_(torch.get_num_threads())
            return self.lin(x)

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tr = Trainer(Counts(), device="cpu", precision="fp32", batch_size=8, grad_accum=1,
                     epochs=1, live=False, isolate=True, speedups=False)
        tr.fit((torch.randn(16, 4), torch.randn(16)))
    finally:
        torch.set_num_threads(before)
    assert tr.isolated and tr.global_step == 2
    assert int(tr.model.threads) == 1


def test_a_full_dev_shm_during_an_isolated_fit_is_an_event_of_the_run(monkeypatch, capfd):
    """The data sent to the worker through files instead of /dev/shm is said once, as the
    run's event (its view, trainer.events, the stderr printer), not as a bare stderr line."""
    from hybridnb.processes import payload
    from hybridnb.train.trainer import Trainer

    monkeypatch.setattr(platform, "_said", set())
    full = platform.SharedMemory("/dev/shm", 64 << 20, 1 << 20)  # Docker's default, full
    monkeypatch.setattr(payload.platform, "shared_memory", lambda path: full)
    tr = Trainer(torch.nn.Linear(1024, 1), device="cpu", precision="fp32", batch_size=128,
                 epochs=1, steps_per_epoch=1, live=False, verbose=False, isolate=True,
                 speedups=False)
    tr.fit((torch.randn(512, 1024), torch.randn(512)))  # 2 MiB: sent through a file
    said = [e for e in tr.events if e.kind == "worker_notice"]
    assert len(said) == 1 and "/dev/shm has 1 MiB free of 64 MiB" in said[0].message
    assert "/dev/shm" not in capfd.readouterr().err  # verbose=False: said nowhere else
