"""macOS and Windows on this Linux machine: what a user there gets when a facility is missing.

The lane (``tests/test_platform_lane.py``) runs the process tests with Linux's own facilities
taken away in every process; these tests cover what the lane cannot: Apple's MPS reported
(torch.mps faked), no child process that can be supervised (Windows: ``platform.child_pipes``
missing), and the signals Windows lacks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from torch import nn

import hybridnb
from hybridnb import env, platform
from hybridnb.hardware import gpu_info, probe
from hybridnb.hardware.detect import HardwareWarning
from hybridnb.hardware.gpu_info import BuildInfo
from hybridnb.hardware.probe import child as probe_child
from hybridnb_tools.gpu_sim import fake_gpu

D = sys.modules["hybridnb.hardware.detect"]
ROOT = Path(__file__).resolve().parents[2]
GiB = 2**30


def test_the_mps_probe_reads_its_memory_through_torch_mps(monkeypatch):
    """The steps a Mac runs: MPS available, then memory from torch.mps (what Metal recommends
    for this process, less what the driver holds). Here the next step fails (no real MPS):
    a failed step, not an exception."""
    fake = types.SimpleNamespace(
        current_allocated_memory=lambda: 1 * GiB, driver_allocated_memory=lambda: 3 * GiB,
        recommended_max_memory=lambda: 12 * GiB, synchronize=lambda: None)
    monkeypatch.setattr(torch, "mps", fake)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    events: list[dict] = []
    passed = probe_child.run_steps("mps", 0, lambda **e: events.append(e))
    ok = {e["step"]: e for e in events if e["e"] == "ok"}
    info = {k: v for e in events if e["e"] == "info" for k, v in e["info"].items()}
    assert list(ok)[:3] == ["import", "available", "memory"]
    assert info["name"] == "Apple GPU (MPS)" and info["total_memory"] == 12 * GiB
    assert info["free_memory"] == 9 * GiB  # the driver's 3 GiB, not the tensors' 1 GiB
    assert "9.0 of 12.0 GiB free" in ok["memory"]["detail"]
    if not passed:  # no real MPS here: the tensor step fails and says why
        assert [e["step"] for e in events if e["e"] == "fail"] == ["tensor"]


def test_detect_on_a_mac_whose_mps_fails_its_probe_chooses_the_cpu_and_says_why(monkeypatch,
                                                                               tmp_path):
    """MPS reported (as on every Apple Silicon Mac): detect() probes it in a child; here the
    child finds no MPS, and detect() warns and falls back to the CPU instead of raising."""
    for var in (D.DEVICE_ENV, fake_gpu.SIM_ENV, "LOCAL_RANK", "WORLD_SIZE", D.LAUNCHED_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(env.CACHE_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(D, "_CACHE", {})
    monkeypatch.setattr(D, "_torch_build", lambda: BuildInfo(
        torch=torch.__version__, cuda=None, hip=None, arch_list=[]))
    monkeypatch.setattr(gpu_info, "nvml_inventory", lambda: ([], "NVML: no GPU (faked)"))
    monkeypatch.setattr(gpu_info, "rocm_inventory", lambda *a, **k: ([], "KFD: none"))
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    with pytest.warns(HardwareWarning) as caught:
        hw = hybridnb.detect(refresh=True, probe_timeout=60)
    assert any("Apple GPU (MPS)" in str(w.message) for w in caught)
    mps = [g for g in hw.gpus if g.backend == "mps"]
    assert len(mps) == 1 and mps[0].probe is not None
    assert mps[0].probe.verdict == "failed" and mps[0].probe.failed_step == "available"
    assert hw.device.type == "cpu"


@pytest.fixture
def no_child_pipes(monkeypatch):
    """This process as on Windows: no child process can be passed pipes and watched."""
    missing = platform.Facility("child pipes", False, "this OS cannot pass pipes to a child "
                                "(simulated)")
    monkeypatch.setattr(platform, "child_pipes", lambda: missing)
    return missing


def test_without_supervised_children_the_probe_runs_here_and_says_so(monkeypatch,
                                                                     no_child_pipes):
    with fake_gpu.installed({"gpus": 2}):  # torch.cuda of this process, faked
        healthy, also = probe.run_probes([("cuda", 0), ("cuda", 1)], 5.0)
    assert healthy.ok and also.ok and "probed in this process" in healthy.message
    assert no_child_pipes.why in healthy.message
    with fake_gpu.installed({"wrong_at": "copy_back"}):
        (wrong,) = probe.run_probes([("cuda", 0)], 5.0)
    assert wrong.verdict == "wrong result" and wrong.failed_step == "copy_back"


def test_without_supervised_children_compare_and_launch_run_here_and_say_so(
        no_child_pipes, capsys):
    def tiny() -> nn.Module:
        return nn.Sequential(nn.Flatten(), nn.Linear(8, 1))

    x = torch.randn(4, 2, 4, generator=torch.Generator().manual_seed(0))
    df = hybridnb.compare(tiny, (x, x.mean((1, 2))), ("fp32",), steps=1, warmup=1, repeats=1,
                          device="cpu", progress=False)
    assert df.attrs["isolated"] is False and df["status"].iloc[0] == "ok"
    assert any(no_child_pipes.why in n and "in this process" in n for n in df.attrs["notes"])
    assert hybridnb.launch(os.getpid, num_processes=2) == os.getpid()
    assert "1 process instead of 2" in capsys.readouterr().err
    from hybridnb.train.isolate import isolate_decision

    isolated, why = isolate_decision(True, "cuda", in_distributed=False)
    assert isolated is False and no_child_pipes.why in why and "in this process" in why


WINDOWS_LACKS = ("fork", "killpg", "setsid", "setpgid", "getpgid", "waitid", "pidfd_open",
                 "memfd_create", "sched_getaffinity")


def test_the_process_machinery_imports_and_detect_runs_without_what_windows_lacks(tmp_path):
    """Windows has no SIGKILL, SIGHUP, fork or process groups: nothing may read them at import,
    and detect() and a fit's isolation decision answer with a sentence."""
    code = ("import os, signal\n"
            f"for name in {WINDOWS_LACKS!r}:\n"
            "    delattr(os, name)\n"
            "del signal.SIGKILL, signal.SIGHUP\n"
            "import hybridnb as hn, hybridnb.processes, hybridnb.processes.supervise\n"
            "import hybridnb.strategies.launch, hybridnb.comparison.worker\n"
            "import hybridnb.train.isolate, hybridnb.processes.worker\n"
            "from hybridnb import platform\n"
            "assert platform.HANGUP is None and platform.KILL == signal.SIGTERM\n"
            "assert not platform.fork()\n"
            "print(hn.detect().device)\n")
    environ = {**os.environ, "PYTHONPATH": str(ROOT), env.CACHE_DIR_ENV: str(tmp_path),
               "HYBRIDNB_DEVICE": "cpu"}
    done = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("cpu")


def _refresh() -> None:
    """Forget platform's cached facts (a facility was taken away in this process)."""
    for facility in platform.FACILITIES:
        facility.cache_clear()


def test_every_missing_facility_says_what_hybridnb_does_instead(monkeypatch):
    for facility in platform.FACILITIES:
        fact = facility()
        assert fact.available == bool(fact) and (fact.available or fact.why)
    monkeypatch.delattr(os, "memfd_create", raising=False)
    _refresh()
    try:
        assert not platform.memfd() and "temporary file" in platform.memfd().why
        from hybridnb.processes.channel import StopFlag

        flag = StopFlag()  # the stop flag still works, through a file
        other = StopFlag(fd=os.dup(flag.fd))
        flag.set("interrupt")
        assert other.reason() == "interrupt"
        other.close()
        flag.close()
    finally:
        monkeypatch.undo()
        _refresh()
