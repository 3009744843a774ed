"""The rules behind detect(): visibility, known-bad hardware, AMD advice, settings. No processes."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from hybridnb.hardware import gpu_info
from hybridnb.hardware import rules as recommend
from hybridnb.hardware.gpu_info import BuildInfo, GpuInfo
from hybridnb.hardware.host import HostInfo

GiB = 2**30
CU130 = BuildInfo(torch="2.11.0+cu130", cuda="13.0", hip=None,
                  arch_list="sm_75 sm_80 sm_86 sm_90 sm_100 sm_120".split())
ROCM62 = BuildInfo(torch="2.11.0+rocm6.2", cuda=None, hip="6.2.41133",
                   arch_list=["gfx900", "gfx906", "gfx908", "gfx90a", "gfx942", "gfx1030",
                              "gfx1100"])


def nv(i: int, cap=(8, 0), mem=16, uuid=None, driver_cuda="13.0") -> GpuInfo:
    return GpuInfo(index=i, physical_index=i, backend="cuda", name=f"GPU{i}", capability=cap,
                   total_memory=mem * GiB, uuid=uuid or f"GPU-{i}{i}{i}-abcd",
                   driver_cuda=driver_cuda)


def amd(arch: str, name: str = "") -> GpuInfo:
    return GpuInfo(index=0, physical_index=0, backend="rocm", name=name or f"AMD {arch}",
                   arch=arch, total_memory=8 * GiB)


def host(cores: int) -> HostInfo:
    return HostInfo(cores_usable=cores, cores_logical=cores, ram_total=32 * GiB,
                    ram_available=30 * GiB, system="Linux", python="3.11", cpu="test")


# ------------------------------------------------------------------ visibility

@pytest.mark.parametrize("value, physical", [
    (None, [0, 1, 2]),
    ("", []),
    ("1", [1]),
    ("2,0", [2, 0]),
    ("0,7,1", [0]),        # the list ends at the first invalid entry, as in CUDA
    ("1,1", [1]),          # ... or a repeated one
    ("-1", []),
    ("GPU-222", [2]),      # UUID prefix
    ("222-abcd", [2]),     # UUID without the GPU- prefix
])
def test_visible_devices_follow_cuda_rules(value, physical):
    gpus = [nv(0), nv(1), nv(2)]
    visible, note = gpu_info.apply_visible(gpus, value, "CUDA_VISIBLE_DEVICES")
    assert [g.physical_index for g in visible] == physical
    assert [g.index for g in visible] == list(range(len(physical)))   # renumbered from 0
    assert (note == "") == (len(physical) == 3)


# ------------------------------------------------------------------ known-bad and bf16

@pytest.mark.parametrize("cap, ok", [((6, 1), False), ((7, 0), False), ((7, 5), True),
                                     ((8, 7), True), ((9, 0), True), ((12, 0), True)])
def test_no_kernel_image_when_capability_is_missing_from_the_arch_list(cap, ok):
    g = nv(0, cap=cap)
    gpu_info.judge(g, CU130, {})
    assert g.usable is ok
    assert any("no kernel image" in w for w in g.warnings) is (not ok)


def test_ptx_in_the_arch_list_covers_newer_gpus():
    build = BuildInfo(torch="x", cuda="12.4", hip=None, arch_list=["sm_80", "compute_80"])
    assert gpu_info.kernel_image_ok(nv(0, cap=(9, 0)), build, {}) is True
    assert gpu_info.kernel_image_ok(nv(0, cap=(7, 5)), build, {}) is False


def test_driver_older_than_the_torch_cuda_major_is_known_bad():
    g = nv(0, cap=(8, 6), driver_cuda="12.2")
    gpu_info.judge(g, CU130, {})
    assert not g.usable and "driver on your system is too old" in g.warnings[0]


@pytest.mark.parametrize("gpu, native", [
    (nv(0, cap=(7, 5)), False), (nv(0, cap=(8, 0)), True), (nv(0, cap=(9, 0)), True),
    (amd("gfx1030"), False), (amd("gfx90a"), True), (amd("gfx1100"), True),
    (amd("gfx906"), False)])
def test_native_bf16_is_hardware_not_emulation(gpu, native):
    assert recommend.native_bf16(gpu) is native


@pytest.mark.parametrize("hip, bad", [("6.2.41133", True), ("6.0", True), ("5.7.1", False)])
def test_rdna1_is_known_bad_under_rocm6(hip, bad):
    build = BuildInfo(torch="x", cuda=None, hip=hip, arch_list=[])
    g = amd("gfx1010", "AMD Radeon RX 5700 XT")
    gpu_info.judge(g, build, {})
    assert g.usable is (not bad)
    assert any("RDNA1" in w for w in g.warnings) is bad


def test_rdna2_consumer_card_gets_override_advice_with_its_risk_never_set():
    env: dict[str, str] = {}
    g = amd("gfx1031")
    gpu_info.judge(g, ROCM62, env)
    text = " ".join(g.advice)
    assert "HSA_OVERRIDE_GFX_VERSION=10.3.0" in text and "Risk" in text
    assert "PYTORCH_HIP_ALLOC_CONF=expandable_segments:True" in text
    assert env == {}
    # without the override gfx1031 has no kernels in this build; with it, it runs as gfx1030
    assert not g.usable and "not among this ROCm torch build's targets" in g.warnings[0]
    g2 = amd("gfx1031")
    gpu_info.judge(g2, ROCM62, {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"})
    assert g2.usable and "HSA_OVERRIDE_GFX_VERSION=10.3.0 is set" in " ".join(g2.advice)


@pytest.mark.parametrize("version, name", [(100100, "gfx1010"), (90010, "gfx90a"),
                                           (90402, "gfx942"), (110000, "gfx1100"), (0, None)])
def test_kfd_target_version_to_gfx_name(version, name):
    assert gpu_info.gfx_name(version) == name


def test_rocm_inventory_reads_the_kfd_topology(tmp_path):
    def node(n: int, props: str, name: str = "", banks: tuple[int, ...] = ()):
        d = tmp_path / str(n)
        (d / "mem_banks").mkdir(parents=True)
        (d / "properties").write_text(props)
        (d / "name").write_text(name)
        for k, size in enumerate(banks):
            (d / "mem_banks" / str(k)).mkdir()
            (d / "mem_banks" / str(k) / "properties").write_text(f"size_in_bytes {size}\n")

    node(0, "cpu_cores_count 16\nsimd_count 0\ngfx_target_version 0\n")          # the CPU
    node(1, "simd_count 80\ngfx_target_version 100100\n", "navi10", (8 * GiB,))
    node(2, "simd_count 120\ngfx_target_version 100300\n", "", (16 * GiB,))
    gpus, status = gpu_info.rocm_inventory(tmp_path)
    assert [g.arch for g in gpus] == ["gfx1010", "gfx1030"]
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].total_memory == 8 * GiB and "RX 5700" in gpus[0].name
    assert status == "KFD: 2 AMD GPU(s)"
    assert gpu_info.rocm_inventory(tmp_path / "missing")[0] == []


# ------------------------------------------------------------------ settings

def test_cpu_on_two_cores_uses_no_loader_workers_and_all_cores_for_the_model():
    s = recommend.recommend("cpu", None, host(2), "terminal")
    assert (s.batch_size, s.grad_accum, s.num_workers, s.torch_threads) == (64, 2, 0, 2)
    assert s.pin_memory is False and s.persistent_workers is False and s.strategy == "single"
    assert "slower" in s.reasons["num_workers"]


def test_cpu_with_many_cores_uses_min_4_half_the_cores():
    assert recommend.recommend("cpu", None, host(6), "terminal").num_workers == 3
    s = recommend.recommend("cpu", None, host(32), "terminal")
    assert s.num_workers == 4 and s.persistent_workers is True and s.torch_threads == 32


@pytest.mark.parametrize("mem, batch, accum", [(4, 32, 4), (8, 64, 2), (16, 128, 1),
                                               (80, 256, 1)])
def test_gpu_batch_from_memory_tiers_and_accumulation_to_the_target(mem, batch, accum):
    s = recommend.recommend("cuda", nv(0, mem=mem), host(16), "terminal", gpus_ok=1)
    assert (s.batch_size, s.grad_accum) == (batch, accum)
    assert s.effective_batch >= recommend.TARGET_BATCH
    # loader workers on GPU hosts come from measurement (issue 13.3), not the core count: the
    # old rule gave min(8, cores - 1) workers and the rest of the cores as threads
    assert s.pin_memory is True and s.num_workers == 0 and s.torch_threads == 16
    assert s.persistent_workers is False
    assert "0.8x" in s.reasons["num_workers"] and "H100" in s.reasons["num_workers"]
    assert "CPU memory" in s.reasons["pin_memory"]


def test_ddp_in_scripts_single_gpu_in_notebooks_and_under_launch():
    g = nv(0, mem=8)
    script = recommend.recommend("cuda", g, host(16), "terminal", gpus_ok=4)
    assert script.strategy == "ddp" and script.devices == 4
    assert script.num_workers == 0 and script.grad_accum == 1     # measured, see above
    assert script.torch_threads == 4                               # 16 cores / 4 GPUs
    for frontend in ("jupyter", "colab", "vscode"):
        nb = recommend.recommend("cuda", g, host(16), frontend, gpus_ok=4)
        assert nb.strategy == "single" and "hn.launch(fn, num_processes=4)" in \
            nb.reasons["strategy"]
    launched = recommend.recommend("cuda", g, host(16), "jupyter", gpus_ok=4, world_size=4)
    assert launched.strategy == "ddp"
    # with deepspeed importable, scripts on 2+ GPUs are told ZeRO-2; notebooks are not
    ds = recommend.recommend("cuda", g, host(16), "terminal", gpus_ok=4, deepspeed=True)
    assert ds.strategy == "deepspeed" and "strategy='deepspeed'" in ds.reasons["strategy"]
    assert "pip install deepspeed" in script.reasons["strategy"]
    assert recommend.recommend("cuda", g, host(16), "jupyter", gpus_ok=4,
                               deepspeed=True).strategy == "single"


def test_precision_names_match_precision_module():
    from hybridnb.train.precision import NAMES

    for device, gpu in (("cpu", None), ("mps", None), ("cuda", nv(0, cap=(7, 5))),
                        ("cuda", nv(0, cap=(9, 0))), ("cuda", amd("gfx1030"))):
        name, reason = recommend.choose_precision(device, gpu)
        assert name in NAMES and reason
    assert recommend.choose_precision("cuda", nv(0, cap=(7, 5)))[0] == "fp16"
    assert recommend.choose_precision("cuda", nv(0, cap=(8, 6)))[0] == "bf16"


def test_compile_is_recommended_nowhere_unmeasured_and_says_why(monkeypatch):
    """compile is advised only where it measured faster for the run: on the CPU it never paid
    back its compile time; on a GPU it is left to a measured comparison."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "triton" else real(name, *a))
    s = recommend.recommend("cuda", nv(0), host(4), "terminal", gpus_ok=1)
    assert s.compile is False and "Triton" in s.reasons["compile"]
    monkeypatch.setattr(recommend, "cxx_compiler", lambda: None)
    s = recommend.recommend("cpu", None, host(4), "terminal")
    assert s.compile is False and "compiler" in s.reasons["compile"]
    monkeypatch.setattr(recommend, "cxx_compiler", lambda: "/usr/bin/g++")
    s = recommend.recommend("cpu", None, host(4), "terminal")
    assert s.compile is False and "never pays back" in s.reasons["compile"]
    assert "g++" in s.reasons["compile"]  # it can run: said so
    monkeypatch.setattr(importlib.util, "find_spec",  # Triton installed
                        lambda name, *a: object() if name == "triton" else real(name, *a))
    s = recommend.recommend("cuda", nv(0, cap=(9, 0)), host(4), "terminal", gpus_ok=1)
    assert s.compile is False and "hn.compare" in s.reasons["compile"]


def test_cpu_ranks_of_a_launched_job_share_the_cores_instead_of_oversubscribing():
    alone = recommend.recommend("cpu", None, host(8), "terminal")
    rank = recommend.recommend("cpu", None, host(8), "terminal", world_size=4)
    assert alone.torch_threads == 8
    assert rank.torch_threads == 2 and "4 ranks" in rank.reasons["torch_threads"]
    assert recommend.recommend("cpu", None, host(2), "terminal",
                               world_size=4).torch_threads == 1


# ------------------------------------------------------------------ one rule each: bf16, compile

def test_device_native_bf16_is_false_off_cuda_and_precision_asks_it(monkeypatch):
    """precision.py asks this one rule (no second bf16 check there)."""
    from hybridnb.train.precision import Precision

    assert recommend.device_native_bf16("cpu") is False
    monkeypatch.setattr(recommend, "device_native_bf16", lambda device: True)
    assert Precision.choose("auto", "cuda").name == "bf16"


@pytest.mark.parametrize("device, mode, needle", [
    ("cpu", "max-autotune", "max-autotune tunes GPU"),
    ("cpu", "reduce-overhead", "CUDA graphs"),
    ("mps", "default", "experimental"),
])
def test_compile_unavailable_names_the_reason(device, mode, needle):
    assert needle in recommend.compile_unavailable(device, mode)


def test_compile_unavailable_on_cuda_needs_triton_and_capability_7(monkeypatch):
    real = importlib.util.find_spec
    assert recommend.compile_unavailable("cuda", capability=(6, 1)) is not None
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "triton" else real(name, *a))
    assert recommend.compile_unavailable("cuda:0", capability=(8, 0)) is None
    assert "7.0" in recommend.compile_unavailable("cuda:0", capability=(6, 1))
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "triton" else real(name, *a))
    assert "Triton" in recommend.compile_unavailable("cuda", capability=(9, 0))
    monkeypatch.setattr(recommend, "cxx_compiler", lambda: None)
    assert "C++ compiler" in recommend.compile_unavailable("cpu")
    monkeypatch.setattr(recommend, "cxx_compiler", lambda: "/usr/bin/g++")
    assert recommend.compile_unavailable("cpu") is None


# ------------------------------------------------------------------ the one NVML module

class FakeNVML:
    """Just enough of pynvml: two GPUs; GPU 1 can fall off the bus."""

    class NVMLError(Exception):
        pass

    def __init__(self, lost: bool = False):
        self.lost, self.inits = lost, 0
        self.uuids = ["GPU-aaaa-1111", "GPU-bbbb-2222"]

    def nvmlInit(self):
        self.inits += 1

    def nvmlSystemGetDriverVersion(self):
        return "580.159.04"

    def nvmlSystemGetCudaDriverVersion(self):
        return 13000

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        if self.lost and i == 1:
            raise self.NVMLError("GPU is lost")
        return ("h", i)

    def nvmlDeviceGetUUID(self, h):
        return self.uuids[h[1]]

    def nvmlDeviceGetName(self, h):
        return f"Fake H100 #{h[1]}"

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return (9, 0)

    def nvmlDeviceGetMemoryInfo(self, h):
        from types import SimpleNamespace
        return SimpleNamespace(total=80 * GiB, free=79 * GiB, used=1 * GiB)

    def nvmlDeviceGetUtilizationRates(self, h):
        from types import SimpleNamespace
        if h[1] == 1:
            raise self.NVMLError("Not Supported")
        return SimpleNamespace(gpu=97)


def test_nvml_opens_once_and_reads_a_device(fake_nvml, monkeypatch):
    fake = FakeNVML()
    nvml = fake_nvml(fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    h = nvml.locate(0)[0]
    assert h == ("h", 0) and nvml.locate(1)[0] == ("h", 1)
    mem = nvml.memory(h)
    assert (mem.total, mem.free, mem.used) == (80 * GiB, 79 * GiB, GiB)
    assert nvml.utilisation(h) == 97.0 and nvml.utilisation(("h", 1)) is None
    assert nvml.uuid(h) == "GPU-aaaa-1111" and nvml.uuid(nvml.handle_by_index(1)) == "GPU-bbbb-2222"
    assert nvml.driver() == "580.159.04" and nvml.cuda_driver() == "13.0"
    assert nvml.capability(h) == (9, 0) and nvml.name(h) == "Fake H100 #0"
    assert fake.inits == 1


@pytest.mark.parametrize("visible, torch_uuid, physical", [
    ("1", None, 1), ("bbbb", None, 1), ("GPU-aaaa-1111,1", None, 0), (None, "aaaa-1111", 0),
    ("0", "GPU-bbbb-2222", 1),   # torch's UUID wins over the list
    ("5", None, None), ("MIG-xyz", None, None),
])
def test_nvml_maps_torch_ordinals_through_cuda_visible_devices(fake_nvml, monkeypatch, visible,
                                                              torch_uuid, physical):
    nvml = fake_nvml(FakeNVML())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setattr(nvml, "initialised_properties",
                        lambda index: torch_uuid and SimpleNamespace(uuid=torch_uuid))
    h, how = nvml.locate(0)
    assert (h[1] if h else None) == physical, how


def test_nvml_absent_means_none_everywhere(fake_nvml):
    class NoDriver(FakeNVML):
        def nvmlInit(self):
            raise self.NVMLError("Driver Not Loaded")

    nvml = fake_nvml(NoDriver())
    assert "Driver Not Loaded" in nvml.status()
    assert (nvml.count(), nvml.driver(), nvml.locate(0)[0], nvml.memory(None),
            nvml.utilisation(None), nvml.handle_by_index(0)) == (None,) * 6
    gpus, status = gpu_info.nvml_inventory()
    assert gpus == [] and "no NVIDIA driver found" in status


def test_inventory_through_nvml_lists_a_lost_gpu_as_unusable(fake_nvml):
    fake_nvml(FakeNVML(lost=True))
    gpus, status = gpu_info.nvml_inventory()
    assert status == "NVML: 2 NVIDIA GPU(s), driver 580.159.04"
    good, lost = gpus
    assert good.uuid == "GPU-aaaa-1111" and good.capability == (9, 0)
    assert good.total_memory == 80 * GiB and good.driver_cuda == "13.0"
    assert not lost.usable and "GPU is lost" in lost.warnings[0]


# ------------------------------------------------------------------ the environment, read once

def test_launch_environment_parsed_once():
    from hybridnb import env

    assert env.launch_env({"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}) == (1, 1, 4)
    assert env.launch_env({"WORLD_SIZE": "4"}) is None
    assert env.launch_env({"RANK": "3", "WORLD_SIZE": "4"}) == (3, 3, 4)  # no LOCAL_RANK


def test_cache_folder_and_ttl(tmp_path):
    from pathlib import Path

    from hybridnb import env

    assert env.cache_dir({env.CACHE_DIR_ENV: str(tmp_path)}) == tmp_path
    assert env.cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/hybridnb")
    assert env.cache_dir({}) == Path("~/.cache/hybridnb").expanduser()
    assert env.seconds_from_env("T", 5.0, {}) == 5.0
    assert env.seconds_from_env("T", 5.0, {"T": "60"}) == 60
    assert env.seconds_from_env("T", 5.0, {"T": "0"}, zero="turns it off") == 0
    with pytest.raises(ValueError, match="T='0' must be a number of seconds > 0"):
        env.seconds_from_env("T", 5.0, {"T": "0"})


def test_every_hybridnb_variable_is_named_in_env():
    """grep: a HYBRIDNB_* name in the package's code is one of env's constants (the GPU
    simulation's own switch, for tests and notebook 01, is not a setting)."""
    import re
    from pathlib import Path

    from hybridnb import env

    root = Path(__file__).resolve().parents[2]
    declared = {v for k, v in vars(env).items() if k.endswith("_ENV")}
    used = set()
    for package in ("hybridnb", "hybridnb_tools"):
        for path in (root / package).rglob("*.py"):
            if "gpu_sim" not in path.parts:
                used |= set(re.findall(r"HYBRIDNB_[A-Z_]+", path.read_text()))
    assert used <= declared, sorted(used - declared)
