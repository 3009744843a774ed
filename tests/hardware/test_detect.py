"""detect() end to end, with GPUs simulated (on any machine: a real GPU stays hidden).

A fake NVML/sysfs inventory makes detect() believe GPUs exist; hybridnb_tools/gpu_sim fakes torch.cuda in
the real probe child (a real subprocess), which then passes, hangs, crashes or computes wrong
numbers on CPU tensors.
The ``machine`` fixture makes the simulated machine complete, so a GPU the test machine really has
never leaks in: the inventory is faked, the NVIDIA driver file is hidden, the probe child always
runs simulated, and the probe cache lives in the test's own folder.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import time
from copy import deepcopy
from dataclasses import replace

import psutil
import pytest
import torch

import hybridnb
from hybridnb import env
from hybridnb.hardware import gpu_info, probe
from hybridnb.hardware.detect import HardwareWarning
from hybridnb.hardware.gpu_info import BuildInfo, GpuInfo
from hybridnb_tools.gpu_sim import fake_gpu

D = importlib.import_module("hybridnb.hardware.detect")  # (`import a.b as c` may give the function)
GiB = 2**30
CUDA_BUILD = BuildInfo(torch="2.11.0+cu124", cuda="12.4", hip=None,
                       arch_list=["sm_75", "sm_80", "sm_86", "sm_90"])
ROCM_BUILD = BuildInfo(torch="2.11.0+rocm6.2", cuda=None, hip="6.2.41133",
                       arch_list=["gfx900", "gfx906", "gfx908", "gfx90a", "gfx942", "gfx1030",
                                  "gfx1100"])
ENV_VARS = (D.DEVICE_ENV, D.LAUNCHED_ENV, "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
            "ROCR_VISIBLE_DEVICES", "HSA_OVERRIDE_GFX_VERSION", "PYTORCH_HIP_ALLOC_CONF",
            "LOCAL_RANK", "WORLD_SIZE", "RANK", fake_gpu.SIM_ENV, env.CACHE_DIR_ENV,
            env.PROBE_CACHE_TTL_ENV)


def t4(i: int = 0) -> GpuInfo:
    return GpuInfo(index=i, physical_index=i, backend="cuda", name="Tesla T4",
                   total_memory=15 * GiB, free_memory=14 * GiB, capability=(7, 5),
                   driver_version="550.54", driver_cuda="12.4", uuid=f"GPU-t4{i}-0000")


def a100(i: int = 0) -> GpuInfo:
    return GpuInfo(index=i, physical_index=i, backend="cuda", name="NVIDIA A100-SXM4-80GB",
                   total_memory=80 * GiB, free_memory=79 * GiB, capability=(8, 0),
                   driver_version="550.54", driver_cuda="12.4", uuid=f"GPU-a1{i}-0000")


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """Clean environment and caches; returns a function that installs a fake machine.

    Complete, so that a real GPU cannot leak in: the NVML/KFD inventories are fakes, the NVIDIA
    driver's /proc file is hidden (else detect() would probe "GPU 0" for real), the probe child
    always runs simulated (``simulate={}`` is a healthy GPU), and the on-disk probe cache is
    this test's own (``tmp_path``).
    """
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(D, "_CACHE", {})
    monkeypatch.setenv(env.CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(D, "_nvidia_driver_loaded", lambda: False)

    def install(nvidia=(), amd=(), build=CUDA_BUILD, simulate=None, frontend="terminal"):
        monkeypatch.setattr(gpu_info, "nvml_inventory",
                            lambda: ([deepcopy(g) for g in nvidia],
                                     f"NVML: {len(nvidia)} fake GPU(s)"))
        monkeypatch.setattr(gpu_info, "rocm_inventory",
                            lambda *a, **k: ([deepcopy(g) for g in amd],
                                             f"KFD: {len(amd)} fake GPU(s)"))
        monkeypatch.setattr(D, "_torch_build", lambda: build)
        monkeypatch.setattr(D.runtime, "frontend", lambda: frontend)
        fake_gpu.use(monkeypatch, {} if simulate is None else simulate)

    return install


def _no_probe(monkeypatch):
    def fail(*a, **k):
        raise AssertionError("no probe child should be started here")
    monkeypatch.setattr(probe, "run_probes", fail)


def assert_warned(caught, text: str) -> None:
    """One HardwareWarning says ``text`` (each warning is also in hw.warnings)."""
    messages = [str(w.message) for w in caught]
    assert any(text in m for m in messages), messages


def _assert_no_children():
    kids = psutil.Process().children(recursive=True)
    assert kids == [], f"probe processes left behind: {kids}"


# ------------------------------------------------------------------ the real machine

def test_this_machine_reports_host_facts_and_caches(monkeypatch, tmp_path):
    """No fakes: this machine's real core count and RAM; on a CPU-only box, the CPU."""
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(D, "_CACHE", {})
    monkeypatch.setenv(env.CACHE_DIR_ENV, str(tmp_path))
    hw = hybridnb.detect()
    assert hw.host.cores_usable == (len(os.sched_getaffinity(0))
                                    if hasattr(os, "sched_getaffinity") else os.cpu_count())
    assert hw.host.ram_total == psutil.virtual_memory().total
    assert 0 < hw.host.ram_available <= hw.host.ram_total
    if not gpu_info.nvml_inventory()[0] and not gpu_info.rocm_inventory()[0]:
        assert hw.device == torch.device("cpu") and hw.gpus == []
        assert hw.precision == "fp32" and hw.settings.pin_memory is False
        _assert_no_children()
    assert hybridnb.detect() is hw                      # cached
    assert hybridnb.detect(refresh=True) is not hw      # re-detected
    assert torch.cuda.is_initialized() is False


def test_report_views_and_json(machine):
    machine()
    hw = D.detect()
    data = json.loads(json.dumps(hw.to_dict()))
    assert data["device"] == "cpu" and data["precision"] == "fp32"
    assert data["host"]["cores_usable"] == hw.host.cores_usable
    assert set(data["settings"]) >= {"batch_size", "grad_accum", "num_workers", "pin_memory",
                                     "persistent_workers", "strategy", "compile",
                                     "torch_threads", "reasons"}
    text, html = str(hw), hw._repr_html_()
    for key in ("batch_size", "num_workers", "torch_threads", "strategy"):
        assert key in text and key in html
    assert "device     cpu" in text and "GPUs: none" in text
    assert html.startswith("<table") and html.rstrip().endswith("</table>")
    assert hw.settings.reasons["device"] in text


def test_dataloader_kwargs_work_in_a_dataloader(machine):
    machine()
    hw = D.detect()
    ds = torch.utils.data.TensorDataset(torch.randn(10, 3), torch.randn(10))
    loader = torch.utils.data.DataLoader(ds, batch_size=4, **hw.dataloader_kwargs())
    assert sum(len(x) for x, _ in loader) == 10
    assert set(hw.dataloader_kwargs()) == {"num_workers", "pin_memory", "persistent_workers"}


def test_cli_json_and_text(machine, capsys):
    from hybridnb.__main__ import main

    machine()
    assert main(["detect", "--json", "--timeout", "3"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["device"] == "cpu" and data["probe_timeout"] == 3.0
    D._CACHE.clear()
    assert main(["detect"]) == 0
    out = capsys.readouterr().out
    assert "hybridnb.detect()" in out and "Settings" in out


# ------------------------------------------------------------------ simulated GPUs

def test_passing_probe_chooses_the_gpu_without_initialising_cuda(machine, monkeypatch):
    """A T4 that passes is chosen; bf16 is only emulated there, so fp16 + GradScaler."""
    def forbidden(*a, **k):
        raise AssertionError("detect() must not touch torch.cuda in the calling process")
    for name in ("_lazy_init", "init", "is_available", "device_count", "get_device_properties",
                 "get_device_capability", "mem_get_info", "is_bf16_supported", "get_arch_list"):
        monkeypatch.setattr(torch.cuda, name, forbidden)
    machine(nvidia=[t4()], simulate={"gpu": {"name": "Tesla T4", "capability": [7, 5]}})
    hw = D.detect(probe_timeout=30)
    assert torch.cuda.is_initialized() is False
    assert hw.device == torch.device("cuda:0")
    g = hw.gpus[0]
    assert g.probe.ok and [s.status for s in g.probe.steps] == ["ok"] * len(probe.STEPS)
    assert all(s.seconds is not None for s in g.probe.steps)
    assert g.native_bf16 is False
    assert hw.precision == "fp16" and "GradScaler" in hw.settings.reasons["precision"]
    assert hw.settings.pin_memory is True and hw.settings.batch_size == 128
    assert hw.settings.num_workers == 0 and "0.8x" in hw.settings.reasons["num_workers"]
    assert hw.warnings == []
    _assert_no_children()


@pytest.mark.slow
def test_hanging_probe_is_killed_in_time_and_cpu_is_chosen(machine, tmp_path):
    timeout = 3.0
    # hang in torch's import (a real import can take seconds here, longer than the deadline)
    pid_file = tmp_path / "helper.pid"
    machine(nvidia=[t4()], simulate={"hang_at": "import", "helper": str(pid_file)})
    t0 = time.monotonic()
    with pytest.warns(HardwareWarning) as caught:
        hw = D.detect(probe_timeout=timeout)
    assert_warned(caught, "hung at step 'import torch'")
    elapsed = time.monotonic() - t0
    assert elapsed <= timeout + 1.0
    assert hw.device == torch.device("cpu") and hw.precision == "fp32"
    p = hw.gpus[0].probe
    assert p.verdict == "hung" and p.failed_step == "import"
    assert [s.status for s in p.steps] == ["hung"] + ["not run"] * 5
    assert "GPU 0 (Tesla T4) hung at step 'import torch'" in str(hw)
    _assert_no_children()
    helper = int(pid_file.read_text())  # the child's own helper process died with its group
    deadline = time.monotonic() + 3
    while psutil.pid_exists(helper) and psutil.Process(helper).status() != "zombie":
        assert time.monotonic() < deadline, "the probe's helper process outlived the kill"
        time.sleep(0.05)


def test_wrong_matmul_falls_back_to_cpu_and_says_why(machine):
    machine(nvidia=[t4()], simulate={"wrong_at": "matmul"})
    with pytest.warns(HardwareWarning):
        hw = D.detect(probe_timeout=30)
    p = hw.gpus[0].probe
    assert hw.device == torch.device("cpu")
    assert p.verdict == "wrong result" and p.failed_step == "matmul"
    assert "relative error" in p.message and "tolerance" in p.message
    assert any("wrong result at step 'matmul vs CPU'" in w for w in hw.warnings)
    assert any(w.startswith("Falling back to the CPU") for w in hw.warnings)
    # the device line alone says which GPU and why (a report shows it without the warnings)
    assert "GPU 0 (Tesla T4) wrong result at step 'matmul vs CPU'" in hw.settings.reasons["device"]


def test_a_notebook_shows_a_simulated_gpu_whose_matmul_is_wrong(machine):
    """``fake_gpu.simulated``, notebook 01's way on any machine: NVML faked here, torch.cuda in
    the probe child; the wrong GPU is listed, not trusted, and the CPU chosen."""
    gpu = {"name": "A100", "total_memory": 80 * GiB}
    with fake_gpu.simulated({"gpu": gpu, "wrong_at": "matmul"}), pytest.warns(HardwareWarning):
        hw = D.detect(refresh=True, probe_timeout=60)
    assert [g.name for g in hw.gpus] == ["A100 (simulated)"]
    assert hw.gpus[0].probe.verdict == "wrong result" and hw.device == torch.device("cpu")
    assert hw.gpus[0].uuid is None and fake_gpu.SIM_ENV not in os.environ  # nothing cached, kept


def test_crashing_gpu_is_skipped_and_the_next_good_gpu_chosen(machine):
    machine(nvidia=[t4(0), a100(1)],
            simulate={"by_index": {"0": {"crash_at": "tensor"}}})
    with pytest.warns(HardwareWarning) as caught:
        hw = D.detect(probe_timeout=30)
    assert_warned(caught, "crashed at step 'small tensor'")
    crashed, good = hw.gpus[0].probe, hw.gpus[1].probe
    assert crashed.verdict == "crashed" and crashed.failed_step == "tensor"
    assert "SIGSEGV" in crashed.message
    assert good.ok
    assert hw.device == torch.device("cuda:1") and hw.precision == "bf16"
    assert hw.settings.strategy == "single"  # only one GPU passed
    _assert_no_children()


def test_two_good_gpus_ddp_in_a_script_one_gpu_in_a_notebook(machine):
    machine(nvidia=[a100(0), a100(1)], simulate={}, frontend="terminal")
    hw = D.detect(probe_timeout=30)
    # ZeRO-2 is the advice when deepspeed is importable here (the dev set-up installs it)
    zero = importlib.util.find_spec("deepspeed") is not None
    assert hw.device == torch.device("cuda:0")
    assert hw.settings.strategy == ("deepspeed" if zero else "ddp")
    assert hw.settings.devices == 2 and "torchrun" in hw.settings.reasons["strategy"]
    # the same machine seen from a notebook (the probe results are facts; the policy differs)
    from hybridnb.hardware.rules import recommend
    nb = recommend("cuda", hw.gpus[0], hw.host, "jupyter", gpus_ok=2)
    assert nb.strategy == "single" and "hn.launch" in nb.reasons["strategy"]


def test_a_launched_rank_probes_and_uses_its_own_gpu(machine, monkeypatch):
    """Under hn.launch (HYBRIDNB_LAUNCHED=1) rank 1 of 2 takes GPU 1 and DDP, even in a notebook."""
    machine(nvidia=[a100(0), a100(1)], simulate={}, frontend="jupyter")
    for var, value in ((D.LAUNCHED_ENV, "1"), ("RANK", "1"), ("LOCAL_RANK", "1"),
                       ("WORLD_SIZE", "2")):
        monkeypatch.setenv(var, value)
    hw = D.detect(probe_timeout=30)
    assert hw.device == torch.device("cuda:1") and hw.settings.strategy == "ddp"
    assert hw.gpus[0].probe is None and hw.gpus[1].probe.ok
    assert hw.settings.devices == 2


def test_rdna1_on_rocm6_is_warned_about_and_not_chosen(machine):
    rx5700 = GpuInfo(index=0, physical_index=0, backend="rocm",
                     name="AMD gfx1010 (RX 5700 / 5700 XT class)", arch="gfx1010",
                     total_memory=8 * GiB)
    machine(amd=[rx5700], build=ROCM_BUILD, simulate={})
    with pytest.warns(HardwareWarning) as caught:
        hw = D.detect(probe_timeout=30)
    assert_warned(caught, "RDNA1")
    assert hw.gpus[0].probe.ok          # even a passing probe does not clear known-bad cards
    assert hw.device == torch.device("cpu")
    assert any("RDNA1" in w and "ROCm 6.2" in w for w in hw.warnings)
    assert any("PYTORCH_HIP_ALLOC_CONF" in a for a in hw.advice)
    assert "PYTORCH_HIP_ALLOC_CONF" not in os.environ   # advice only, never set


# ------------------------------------------------------------------ visibility and forcing

def test_empty_cuda_visible_devices_hides_every_gpu(machine, monkeypatch):
    machine(nvidia=[t4()])
    _no_probe(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    hw = D.detect()
    assert hw.device == torch.device("cpu") and hw.gpus == []
    assert any("CUDA_VISIBLE_DEVICES=''" in n and "hides 1 of 1" in n for n in hw.notes)


def test_hybridnb_device_cpu_skips_the_probe(machine, monkeypatch):
    machine(nvidia=[a100()])
    _no_probe(monkeypatch)
    monkeypatch.setenv(D.DEVICE_ENV, "cpu")
    hw = D.detect()
    assert hw.device == torch.device("cpu") and hw.gpus[0].probe is None
    assert "HYBRIDNB_DEVICE=cpu" in hw.settings.reasons["device"]


def test_hybridnb_device_cuda_n_probes_and_uses_that_gpu(machine, monkeypatch):
    machine(nvidia=[t4(0), a100(1)], simulate={})
    monkeypatch.setenv(D.DEVICE_ENV, "cuda:1")
    hw = D.detect(probe_timeout=30)
    assert hw.device == torch.device("cuda:1") and hw.precision == "bf16"
    assert hw.gpus[0].probe is None and hw.gpus[1].probe.ok


def test_hybridnb_device_forces_a_gpu_whose_probe_failed_with_a_warning(machine, monkeypatch):
    machine(nvidia=[t4()], simulate={"error_at": "available"})
    monkeypatch.setenv(D.DEVICE_ENV, "cuda")
    with pytest.warns(HardwareWarning) as caught:
        hw = D.detect(probe_timeout=30)
    assert_warned(caught, "forces GPU 0")
    assert hw.device == torch.device("cuda:0")
    assert "illegal memory access" in hw.gpus[0].probe.message


@pytest.mark.parametrize("value", ["mps", "cuda:3"])
def test_hybridnb_device_that_cannot_be_met_warns_and_chooses(machine, monkeypatch, value):
    machine()
    monkeypatch.setenv(D.DEVICE_ENV, value)
    with pytest.warns(HardwareWarning) as caught:
        hw = D.detect()
    assert_warned(caught, f"HYBRIDNB_DEVICE={value} asks for")
    assert hw.device == torch.device("cpu")


@pytest.mark.parametrize("value", ["gpu", "cuda:x", "cuda0", "tpu"])
def test_invalid_hybridnb_device_is_a_clear_error(machine, monkeypatch, capsys, value):
    from hybridnb.__main__ import main

    machine()
    monkeypatch.setenv(D.DEVICE_ENV, value)
    with pytest.raises(ValueError, match=f"HYBRIDNB_DEVICE='{value}'.*cpu, cuda, cuda:N"):
        D.detect()
    assert main(["detect"]) == 2
    # errors go to stderr (issue 15, item 18): stdout stays clean for --json
    assert "HYBRIDNB_DEVICE" in capsys.readouterr().err


def test_cache_follows_the_device_variables(machine, monkeypatch):
    machine()
    first = D.detect()
    assert D.detect() is first
    monkeypatch.setenv(D.DEVICE_ENV, "cpu")
    forced = D.detect()
    assert forced is not first and "forced" in forced.settings.reasons["device"]


def test_bad_probe_timeout_is_rejected(machine):
    machine()
    with pytest.raises(ValueError, match="probe_timeout=0"):
        D.detect(probe_timeout=0)


def test_html_escapes_device_names(machine, monkeypatch):
    evil = t4()
    evil.name = "<script>alert(1)</script>"
    machine(nvidia=[evil])
    monkeypatch.setenv(D.DEVICE_ENV, "cpu")
    html = D.detect()._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;" in html


# ------------------------------------------------------------------ the probe cache (issue 14.4)

def _count_probes(monkeypatch) -> list[list]:
    """Record each probe run's targets (the real children still run)."""
    calls: list[list] = []
    real = probe.run_probes

    def spy(targets, timeout):
        calls.append(list(targets))
        return real(targets, timeout)

    monkeypatch.setattr(probe, "run_probes", spy)
    return calls


def _fresh_process() -> None:
    """What a new Python process starts with: no in-memory report."""
    D._CACHE.clear()


def test_a_passed_probe_is_cached_on_disk_and_a_new_process_starts_no_child(machine, monkeypatch):
    machine(nvidia=[a100()], simulate={})
    calls = _count_probes(monkeypatch)
    first = D.detect(probe_timeout=30)
    assert calls == [[("cuda", 0)]] and first.gpus[0].probe.ok
    assert first.gpus[0].probe.cached is False and first.gpus[0].probe.proven_at is not None

    _fresh_process()
    _no_probe(monkeypatch)  # a hit must not start a child (its time: bench/bench_detect.py)
    again = D.detect(probe_timeout=30)
    p = again.gpus[0].probe
    assert again.device == torch.device("cuda:0") and again.precision == "bf16"
    assert p.ok and p.cached and p.proven_at == first.gpus[0].probe.proven_at
    assert [s.status for s in p.steps] == ["ok"] * len(probe.STEPS)
    # the report says when the GPU was last proven
    assert "cached: proven" in str(again) and "refresh=True" in str(again)
    assert "cached: proven" in again.settings.reasons["device"]
    assert "cached" in again._repr_html_()
    assert again.to_dict()["gpus"][0]["probe"]["cached"] is True
    _assert_no_children()


@pytest.mark.parametrize("change", ["driver", "torch build", "gpu"])
def test_a_new_driver_torch_build_or_gpu_is_probed_again(machine, monkeypatch, change):
    machine(nvidia=[a100()], simulate={})
    calls = _count_probes(monkeypatch)
    D.detect(probe_timeout=30)
    _fresh_process()
    if change == "driver":
        gpu = a100()
        gpu.driver_version = "580.159.04"
        machine(nvidia=[gpu], simulate={})
    elif change == "torch build":
        machine(nvidia=[a100()], build=replace(CUDA_BUILD, torch="2.12.0+cu124"),
                simulate={})
    else:
        gpu = a100()
        gpu.uuid = "GPU-another-card"
        machine(nvidia=[gpu], simulate={})
    hw = D.detect(probe_timeout=30)
    assert len(calls) == 2, f"a changed {change} must be probed again"
    assert hw.gpus[0].probe.ok and not hw.gpus[0].probe.cached


def test_refresh_probes_again_and_renews_the_cached_verdict(machine, monkeypatch):
    machine(nvidia=[a100()], simulate={})
    calls = _count_probes(monkeypatch)
    first = D.detect(probe_timeout=30)
    _fresh_process()
    again = D.detect(refresh=True, probe_timeout=30)
    assert len(calls) == 2 and not again.gpus[0].probe.cached
    assert again.gpus[0].probe.proven_at > first.gpus[0].probe.proven_at
    _fresh_process()
    third = D.detect(probe_timeout=30)
    assert len(calls) == 2 and third.gpus[0].probe.proven_at == again.gpus[0].probe.proven_at


def test_a_failed_probe_is_never_cached(machine, monkeypatch):
    machine(nvidia=[a100()], simulate={"wrong_at": "matmul"})
    calls = _count_probes(monkeypatch)
    with pytest.warns(HardwareWarning):
        D.detect(probe_timeout=30)
    _fresh_process()
    with pytest.warns(HardwareWarning):
        hw = D.detect(probe_timeout=30)
    assert len(calls) == 2 and hw.gpus[0].probe.verdict == "wrong result"
    assert hw.device == torch.device("cpu")


def test_an_old_verdict_expires_and_ttl_zero_turns_the_cache_off(machine, monkeypatch):
    machine(nvidia=[a100()], simulate={})
    calls = _count_probes(monkeypatch)
    D.detect(probe_timeout=30)
    _fresh_process()
    for path in (env.cache_dir() / "probe").glob("*.json"):  # the stored verdict is two days old
        data = json.loads(path.read_text())
        data["result"]["proven_at"] -= 2 * 24 * 3600  # the default trusts a pass for a day
        path.write_text(json.dumps(data))
    D.detect(probe_timeout=30)
    assert len(calls) == 2
    monkeypatch.setenv(env.PROBE_CACHE_TTL_ENV, "0")
    _fresh_process()
    D.detect(probe_timeout=30)
    assert len(calls) == 3


@pytest.mark.parametrize("value", ["soon", "-5", "inf"])
def test_a_bad_cache_ttl_is_a_clear_error(machine, monkeypatch, value):
    machine()
    monkeypatch.setenv(env.PROBE_CACHE_TTL_ENV, value)
    with pytest.raises(ValueError, match=f"HYBRIDNB_PROBE_CACHE_TTL='{value}'.*seconds"):
        D.detect()


def test_an_unwritable_cache_folder_is_a_note_not_a_failure(machine, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    machine(nvidia=[a100()], simulate={})
    monkeypatch.setenv(env.CACHE_DIR_ENV, str(blocker))
    hw = D.detect(probe_timeout=30)
    assert hw.device == torch.device("cuda:0")
    assert any("could not be cached" in n and "HYBRIDNB_CACHE_DIR" in n for n in hw.notes)


def test_an_interrupted_refresh_keeps_the_last_answer(machine, monkeypatch):
    """A refresh that raises (Ctrl-C, a bad $HYBRIDNB_PROBE_CACHE_TTL) must not throw away the
    cached detection."""
    machine()
    first = hybridnb.detect()

    def interrupted(*args, **kwargs):
        raise ValueError("refresh failed")

    monkeypatch.setattr(D, "_detect", interrupted)
    with pytest.raises(ValueError):
        hybridnb.detect(refresh=True)
    assert hybridnb.detect() is first
