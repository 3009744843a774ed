"""Find GPUs without initialising CUDA (NVIDIA through NVML, AMD through the KFD topology in
sysfs, keeping the process fork-safe), and judge them against known-bad hardware. Whether a card
really computes is the probe's job, in a child.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hybridnb.hardware import nvml

GiB = 2**30
KFD_TOPOLOGY = Path("/sys/class/kfd/kfd/topology/nodes")

_RDNA1 = ("gfx1010", "gfx1011", "gfx1012")
# Consumer RDNA2/RDNA3 chips that ROCm does not list but that run as their officially supported
# sibling when HSA_OVERRIDE_GFX_VERSION names it.
_AMD_OVERRIDE = {**{f"gfx103{c}": "10.3.0" for c in "123456"},
                 **{f"gfx110{c}": "11.0.0" for c in "123"}}


@dataclass
class BuildInfo:
    """What the installed torch was built for (read without touching a device)."""

    torch: str
    cuda: str | None          # torch.version.cuda, e.g. "12.4"
    hip: str | None           # torch.version.hip, e.g. "6.2.41133"
    arch_list: list[str]      # kernel targets compiled in: sm_XY / compute_XY / gfxNNN


@dataclass
class GpuInfo:
    """One GPU as the report shows it. Fields are None where the source could not say."""

    index: int                                # logical index, as torch will number it
    backend: str                              # "cuda" | "rocm" | "mps"
    name: str
    total_memory: int | None = None           # bytes
    free_memory: int | None = None            # bytes
    capability: tuple[int, int] | None = None  # CUDA compute capability
    arch: str | None = None                   # AMD gfx target, e.g. "gfx1030"
    driver_version: str | None = None
    driver_cuda: str | None = None            # highest CUDA the NVIDIA driver supports
    runtime_version: str | None = None        # torch.version.cuda / torch.version.hip
    native_bf16: bool | None = None           # see hardware.rules.native_bf16
    uuid: str | None = None
    physical_index: int | None = None         # index before CUDA/HIP_VISIBLE_DEVICES
    usable: bool = True                       # False for known-bad hardware / no kernel image
    warnings: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    probe: Any = None                         # hybridnb.hardware.probe.ProbeResult once probed

    @property
    def trusted(self) -> bool:
        """Usable hardware whose probe passed: the only kind detect() recommends."""
        return self.usable and self.probe is not None and self.probe.ok

    @property
    def torch_device(self) -> str:
        return "mps" if self.backend == "mps" else f"cuda:{self.index}"

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({self.name})" if self.backend != "mps" else self.name

    def to_dict(self) -> dict:
        return {**asdict(replace(self, probe=None)), "device": self.torch_device,
                "capability": list(self.capability) if self.capability else None,
                "probe": self.probe.to_dict() if self.probe is not None else None}


def nvml_inventory() -> tuple[list[GpuInfo], str]:
    """All NVIDIA GPUs NVML sees (physical order), and a status line (the reason when none)."""
    n = nvml.count()
    if n is None:
        return [], nvml.status() or "NVML did not answer"
    driver_text = nvml.driver() or "?"
    driver_cuda = nvml.cuda_driver()
    gpus: list[GpuInfo] = []
    for i in range(n):
        h, why = nvml.attempt("nvmlDeviceGetHandleByIndex", i)
        mem = nvml.memory(h)  # each reader answers None for no handle
        gpus.append(GpuInfo(
            index=i, physical_index=i, backend="cuda", name=nvml.name(h) or "NVIDIA GPU",
            total_memory=mem and mem.total, free_memory=mem and mem.free,
            capability=nvml.capability(h), driver_version=driver_text, driver_cuda=driver_cuda,
            uuid=nvml.uuid(h)))
        if h is None:  # e.g. NVMLError_GpuIsLost: list it, and say so
            gpus[-1].name, gpus[-1].usable = "NVIDIA GPU (unreadable)", False
            gpus[-1].warnings.append(f"NVML cannot read GPU {i}: {why} (fallen off the bus? "
                                     "check `nvidia-smi`).")
    return gpus, f"NVML: {n} NVIDIA GPU(s), driver {driver_text}"


def rocm_inventory(root: Path = KFD_TOPOLOGY) -> tuple[list[GpuInfo], str]:
    """AMD GPUs from the KFD topology in sysfs (what ROCm itself enumerates), in node order."""
    if not root.is_dir():
        return [], f"no AMD GPU driver found ({root} missing)"
    gpus: list[GpuInfo] = []
    for node in sorted(root.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 1e9):
        props = _kv_file(node / "properties")
        if int(props.get("simd_count", 0)) <= 0:  # CPU nodes have no SIMDs
            continue
        arch = gfx_name(int(props.get("gfx_target_version", 0)))
        name = _read(node / "name")
        total = sum(int(_kv_file(b / "properties").get("size_in_bytes", 0))
                    for b in sorted((node / "mem_banks").glob("*")) if b.is_dir())
        i = len(gpus)
        unique = props.get("unique_id")  # stable per card on recent kernels
        gpus.append(GpuInfo(index=i, physical_index=i, backend="rocm",
                            name=amd_name(arch, name), arch=arch, total_memory=total or None,
                            driver_version=_read(Path("/sys/module/amdgpu/version")) or None,
                            uuid=f"AMD-{unique}" if unique and unique != "0" else None))
    return gpus, f"KFD: {len(gpus)} AMD GPU(s)"


def gfx_name(target_version: int) -> str | None:
    """KFD's gfx_target_version (e.g. 100100, 90010) as an LLVM target ("gfx1010", "gfx90a")."""
    if target_version <= 0:
        return None
    major, minor, step = target_version // 10000, target_version // 100 % 100, target_version % 100
    return f"gfx{major}{minor:x}{step:x}"


def amd_name(arch: str | None, node_name: str = "") -> str:
    families = {"gfx1010": "RX 5700 / 5700 XT class", "gfx1011": "Radeon Pro V520 / 5600M class",
                "gfx1012": "RX 5500 class", "gfx1030": "RX 6800 / 6900 class",
                "gfx1031": "RX 6700 class", "gfx1032": "RX 6600 class",
                "gfx1100": "RX 7900 class", "gfx1101": "RX 7800 / 7700 class",
                "gfx1102": "RX 7600 class", "gfx90a": "Instinct MI200", "gfx942": "Instinct MI300",
                "gfx908": "Instinct MI100", "gfx906": "Vega 20 / MI50"}
    base = f"AMD {arch}" if arch else "AMD GPU"
    extra = families.get(arch or "") or (node_name if node_name and node_name != arch else "")
    return f"{base} ({extra})" if extra else base


def apply_visible(gpus: list[GpuInfo], value: str | None, var: str) -> tuple[list[GpuInfo], str]:
    """Keep the GPUs a ``*_VISIBLE_DEVICES`` value shows, renumbered as the runtime will
    (``nvml.visible_indices``' rules). Returns (visible GPUs, a note or "")."""
    if value is None:
        return gpus, ""
    shown = nvml.visible_indices(value, [g.uuid for g in gpus])
    visible = [replace(gpus[k], index=i) for i, k in enumerate(shown)]
    if len(visible) == len(gpus) and value.strip():
        return visible, ""
    names = ", ".join(str(g.physical_index) for g in visible) or "none"
    return visible, (f"{var}={value!r} hides {len(gpus) - len(visible)} of {len(gpus)} GPU(s) "
                     f"(visible: {names}).")


def kernel_image_ok(gpu: GpuInfo, build: BuildInfo, environ: dict[str, str]) -> bool | None:
    """Whether the installed torch carries kernels for this GPU (None when it cannot be told):
    an ``sm_XY`` of the same major and a minor <= the GPU's, a ``compute_XY`` PTX at or below
    it, or the gfx target (HSA_OVERRIDE_GFX_VERSION's where set)."""
    if not build.arch_list:
        return None
    if gpu.backend == "cuda" and gpu.capability:
        for kind, major, minor in re.findall(r"\b(sm|compute)_(\d+)(\d)[a-z]?\b",
                                             " ".join(build.arch_list)):
            cap = (int(major), int(minor))
            if cap <= gpu.capability and (kind == "compute" or cap[0] == gpu.capability[0]):
                return True
        return False
    if gpu.backend == "rocm" and gpu.arch:
        arch = override_arch(environ) or gpu.arch
        return arch in {a.split(":")[0] for a in build.arch_list}
    return None


def override_arch(environ: dict[str, str]) -> str | None:
    """The gfx target HSA_OVERRIDE_GFX_VERSION (e.g. "10.3.0") makes ROCm use, if set."""
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", environ.get("HSA_OVERRIDE_GFX_VERSION", "").strip())
    return f"gfx{int(m.group(1))}{int(m.group(2)):x}{int(m.group(3)):x}" if m else None


def judge(gpu: GpuInfo, build: BuildInfo, environ: dict[str, str]) -> None:
    """Add known-bad warnings (marking the GPU unusable) and AMD advice to ``gpu`` in place."""
    def bad(message: str) -> None:
        gpu.usable = False
        gpu.warnings.append(f"{gpu.label}: {message}")

    if gpu.backend == "rocm":
        hip_major = _major(build.hip)
        override = environ.get("HSA_OVERRIDE_GFX_VERSION")
        rdna1 = gpu.arch in _RDNA1 or re.search(r"RX ?5[5-7]00", gpu.name)
        if rdna1 and (hip_major is None or hip_major >= 6):
            bad(f"AMD RDNA1 ({gpu.arch or 'RX 5000 series'}) is not supported by ROCm "
                f"{build.hip or '>= 6'}; kernels on these cards are known to hang the GPU or "
                "return wrong results, so it is not chosen. Train on the CPU (or a supported "
                "GPU); to try it anyway at your own risk set HYBRIDNB_DEVICE=cuda (with a ROCm "
                "5.x torch and HSA_OVERRIDE_GFX_VERSION=10.3.0 it sometimes works, sometimes "
                "hangs).")
        target = _AMD_OVERRIDE.get(gpu.arch or "")
        if target and not override:
            gpu.advice.append(
                f"{gpu.label}: {gpu.arch} is a consumer card ROCm does not list. Advice: start "
                f"Python with HSA_OVERRIDE_GFX_VERSION={target} (set before torch starts, e.g. in "
                "the shell) so ROCm runs it as its supported sibling, then run detect() again. "
                "Risk: unsupported by AMD; a kernel can crash or hang the GPU, which the probe "
                "here is meant to catch. hybridnb never sets it for you.")
        elif override:
            gpu.advice.append(
                f"{gpu.label}: HSA_OVERRIDE_GFX_VERSION={override} is set; ROCm runs this card as "
                f"{override_arch(environ) or '?'}. This is unsupported by AMD; trust it only while "
                "the probe passes.")
        if not environ.get("PYTORCH_HIP_ALLOC_CONF"):
            gpu.advice.append(
                f"{gpu.label}: if training stops with out-of-memory errors while free memory is "
                "reported, try PYTORCH_HIP_ALLOC_CONF=expandable_segments:True (set before torch "
                "starts) to reduce fragmentation. Risk: less tested on ROCm than on CUDA; older "
                "ROCm releases ignore it or can crash with it. Not set by hybridnb.")
    drv, need = _major(gpu.driver_cuda), _major(build.cuda)
    if gpu.backend == "cuda" and drv is not None and need is not None and drv < need:
        bad(f"the NVIDIA driver supports CUDA {gpu.driver_cuda} but this torch wheel is built for "
            f"CUDA {build.cuda}; torch would report 'The NVIDIA driver on your system is too "
            f"old'. Update the driver, or install a torch built for CUDA {drv}.x.")
    if kernel_image_ok(gpu, build, environ) is not False:
        return
    if gpu.backend == "cuda":
        cap = f"{gpu.capability[0]}.{gpu.capability[1]}"
        bad(f"compute capability {cap} (sm_{cap.replace('.', '')}) is not among this torch "
            f"build's kernels ({' '.join(build.arch_list)}); CUDA would fail with 'no kernel "
            "image is available for execution on the device'. Install a torch wheel built for "
            "this GPU (an older CUDA build still carries older architectures).")
    elif gpu.usable:  # ROCm, not known-bad already
        bad(f"{override_arch(environ) or gpu.arch} is not among this ROCm torch build's targets "
            f"({' '.join(build.arch_list)}); HIP would fail with 'invalid device function' or "
            "'no kernel image'.")


def _major(version: str | None) -> int | None:
    m = re.match(r"(\d+)", version or "")
    return int(m.group(1)) if m else None


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _kv_file(path: Path) -> dict[str, str]:
    pairs = (line.split() for line in _read(path).splitlines())
    return {p[0]: p[1] for p in pairs if len(p) == 2}


def gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GiB:.1f} GiB"
