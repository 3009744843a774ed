"""The probe child and its parent-side runner, with faults injected from outside: hybridnb_tools/gpu_sim
fakes torch.cuda (and its faults) in the child, which runs its real steps."""

from __future__ import annotations

import re
import time
from pathlib import Path

import psutil
import pytest

from hybridnb.hardware import probe
from hybridnb_tools.gpu_sim import fake_gpu

CUDA_ERROR = ("CUDA error: no kernel image is available for execution on the device\n"
              "CUDA kernel errors might be asynchronously reported at some other API call")


def _run(monkeypatch, sim: dict, timeout: float = 30, targets=(("cuda", 0),)):
    fake_gpu.use(monkeypatch, sim)
    results = probe.run_probes(list(targets), timeout)
    assert psutil.Process().children(recursive=True) == []
    return results


def test_child_reports_each_step_as_framed_messages(monkeypatch):
    """The protocol itself (the channel's frames, as every child): a start and an end event per
    step."""
    from hybridnb.processes import supervise
    from hybridnb.processes.child import start_framed

    fake_gpu.use(monkeypatch, {"gpu": {"name": "Fake A100"}, "error_at": "tensor"})
    got = []
    out = supervise(lambda: start_framed(probe.CHILD_MODULE, "--backend", "cuda")[0],
                    on_message=got.append, deadline=60)
    assert re.search(r"exited with code 1\b", out.reason), out.output_tail
    assert {m.kind for m in got} == {"probe"}
    events = [m.payload for m in got]
    flow = [(e["e"], e.get("step")) for e in events if e["e"] != "info"]
    assert flow == [("start", "import"), ("ok", "import"), ("start", "available"),
                    ("ok", "available"), ("start", "memory"), ("ok", "memory"),
                    ("start", "tensor"), ("fail", "tensor")]
    info = {k: v for e in events if e["e"] == "info" for k, v in e["info"].items()}
    assert info["name"] == "Fake A100" and info["free_memory"] <= info["total_memory"]


def test_error_with_a_real_cuda_message_is_reported_at_its_step(monkeypatch):
    [r] = _run(monkeypatch, {"error_at": "available", "message": CUDA_ERROR})
    assert r.verdict == "failed" and r.failed_step == "available" and r.returncode == 1
    assert r.message == ("failed at step 'device available': RuntimeError: CUDA error: no "
                         "kernel image is available for execution on the device")
    step = {s.name: s for s in r.steps}
    assert step["import"].status == "ok" and step["available"].status == "failed"
    assert "asynchronously reported" in step["available"].detail   # full text kept in the step
    assert step["memory"].status == "not run"


def test_corrupted_copy_back_is_a_wrong_result(monkeypatch):
    [r] = _run(monkeypatch, {"wrong_at": "copy_back"})
    assert r.verdict == "wrong result" and r.failed_step == "copy_back"
    assert "changed 10 values" in r.message
    assert [s.status for s in r.steps][:5] == ["ok"] * 5


def test_segfault_names_the_signal_and_the_step(monkeypatch):
    [r] = _run(monkeypatch, {"crash_at": "memory"})
    assert r.verdict == "crashed" and r.failed_step == "memory"
    assert r.returncode < 0 and "SIGSEGV" in r.message and "memory query" in r.message


def test_crash_at_shutdown_after_every_step_passed_still_passes_with_a_note(monkeypatch):
    [r] = _run(monkeypatch, {"crash_at": "exit"})
    assert r.ok and all(s.status == "ok" for s in r.steps)
    assert r.returncode < 0 and "SIGSEGV while shutting down" in r.message


def test_child_that_dies_before_any_step_is_a_crash_with_its_stderr(monkeypatch):
    broken = "ImportError: libcuda.so.1: cannot open shared object file"
    [r] = _run(monkeypatch, {"crash_at": "start", "message": broken})
    assert r.verdict == "crashed" and "before its first step" in r.message
    assert "SIGSEGV" in r.message and broken in r.message


def test_children_run_in_parallel_under_one_deadline(monkeypatch):
    """Three GPUs, two hang: the whole call still ends at the one deadline, each verdict its own
    (faults in torch's import: a real import can take longer than this deadline here)."""
    timeout = 2.0
    sim = {"by_index": {"0": {"hang_at": "import"},
                        "1": {"error_at": "import", "message": "libcudart.so.13: not found"},
                        "2": {"hang_at": "import"}}}
    t0 = time.monotonic()
    r0, r1, r2 = _run(monkeypatch, sim, timeout, [("cuda", 0), ("cuda", 1), ("cuda", 2)])
    assert time.monotonic() - t0 <= timeout + 1.0
    assert (r0.verdict, r0.failed_step) == ("hung", "import")
    assert (r1.verdict, r1.failed_step) == ("failed", "import")
    assert "ImportError: libcudart.so.13" in r1.message
    assert (r2.verdict, r2.failed_step) == ("hung", "import")
    assert "no answer for 2 s" in r2.message


def test_an_interrupted_probe_leaves_no_process(monkeypatch):
    """Ctrl-C (a notebook's interrupt) while waiting: the children are killed at once and
    reaped, then the KeyboardInterrupt reaches the caller."""
    import contextlib
    import os
    import signal
    import threading

    fake_gpu.use(monkeypatch, {"hang_at": "import"})

    def probes() -> int:  # this run's probe children (not another test's child still exiting)
        alive = 0
        for child in psutil.Process().children():
            with contextlib.suppress(psutil.Error):
                alive += probe.CHILD_MODULE in " ".join(child.cmdline())
        return alive

    def interrupt_when_probing():
        deadline = time.monotonic() + 20
        while probes() < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    # Ctrl-C as a plain Python process or a kernel has it, whatever an earlier test left set
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=interrupt_when_probing, daemon=True).start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            probe.run_probes([("cuda", 0), ("cuda", 1)], 30)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - t0 < 20
    assert psutil.Process().children(recursive=True) == []


# ------------------------------------------------------------------ structure

def test_the_package_knows_nothing_of_the_simulation():
    """The faults are the tests' (hybridnb_tools/gpu_sim): no module of hybridnb names one, nor the
    simulation's variable."""
    import hybridnb

    names = ("hang_at", "crash_at", "error_at", "wrong_at", fake_gpu.SIM_ENV, "SIMULATE")
    found = [f"{path.name}: {name}" for path in Path(hybridnb.__file__).parent.rglob("*.py")
             for name in names if name in path.read_text()]
    assert found == []


# ------------------------------------------------------------------ the cache, as data

def _passed(proven_at: float) -> probe.ProbeResult:
    steps = [probe.ProbeStep(name, "ok", 0.1) for name in probe.STEPS]
    return probe.ProbeResult("cuda", 0, "passed", steps, 4.2, proven_at=proven_at,
                             info={"name": "Fake"})


def test_cache_round_trip_expiry_and_foreign_files(tmp_path):
    from hybridnb.hardware.probe import cache

    env = {"HYBRIDNB_CACHE_DIR": str(tmp_path)}
    key = {"uuid": "GPU-1", "driver": "580", "torch": "2.11"}
    now = time.time()
    assert cache.store(key, _passed(now), env) == ""
    hit = cache.load(key, 3600, env)
    assert hit is not None and hit.cached and hit.ok and hit.proven_at == pytest.approx(now)
    assert hit.steps == _passed(now).steps and hit.info == {"name": "Fake"}
    assert cache.store(key, _passed(now - 3601), env) == ""
    assert cache.load(key, 3600, env) is None                           # too old
    assert cache.store(key, _passed(now), env) == ""
    assert cache.load(key, 0, env) is None                              # cache off
    assert cache.load({**key, "driver": "590"}, 3600, env) is None      # another driver
    [path] = (tmp_path / "probe").glob("*.json")
    path.write_text("{broken")
    assert cache.load(key, 3600, env) is None                           # unreadable: a miss
    assert list((tmp_path / "probe").glob(".probe-*")) == []               # no temp file left


def test_cache_never_stores_a_failure(tmp_path):
    from hybridnb.hardware.probe import cache

    env = {"HYBRIDNB_CACHE_DIR": str(tmp_path)}
    bad = _passed(time.time())
    bad.verdict = "hung"
    assert cache.store({"uuid": "GPU-1"}, bad, env) == ""
    assert not (tmp_path / "probe").exists()


def test_a_probe_that_exits_cleanly_mid_step_is_called_crashed_before_finishing():
    """Exit code 0 without the end event reads like success: the verdict says the probe stopped
    before finishing, and at which step."""
    first = probe.STEPS[0]
    res = probe.verdict("cuda", 0, [{"e": "start", "step": first, "t": 0.0}], 1.0,
                             timed_out=False, rc=0, timeout=15.0)
    assert res.verdict == "crashed" and res.failed_step == first
    assert "exited with code 0 before finishing" in res.message
