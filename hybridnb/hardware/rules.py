"""The rules, each decided in one place: native bf16, whether torch.compile can run, and the
recommended training settings, each with its reason. Pure functions of the hardware facts (so
testable on a CPU box); the live-device ones never initialise CUDA themselves.
"""

from __future__ import annotations

import importlib.util
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from hybridnb.env import INTERACTIVE_FRONTENDS
from hybridnb.hardware import nvml
from hybridnb.hardware.gpu_info import GiB, GpuInfo
from hybridnb.hardware.host import NATIVE_BF16_FLAGS, HostInfo, cpu_flags, cxx_compiler

TARGET_BATCH = 128          # effective batch the challenge start kit trains with
CPU_BATCH = 64
# (GPU memory below this many GiB, per-device batch): a starting point the Trainer's batch-size
# finder refines. EEG windows are small (129 x 200 floats = 103 KB), models small too.
MEMORY_TIERS = ((6, 32), (12, 64), (40, 128), (math.inf, 256))
# AMD architectures with bf16 matrix hardware (CDNA1+, RDNA3+). RDNA1/2 and Vega only emulate it.
_AMD_NATIVE_BF16 = re.compile(r"^gfx(908|90a|94\d|95\d|11\d\d|12\d\d)$")
# measured: torch.compile on a 2-core CPU (bench/results/speedups-rules.md); loader workers on
# an H100 host (shared/reference/gpu-h100.md)
CPU_COMPILE_MEASURED = ("measured on 2 cores, compiling cost 38-77 s on the first step and the "
                        "compiled step then ran 1.0x eager (EEGNeX; a 2-epoch fit took 99.5 s "
                        "against 14 s eager), so it never pays back on a CPU run of this size")
GPU_LOADER_MEASURED = ("measured on a 16-core H100 host: 8 loader workers ran an in-memory "
                       "dataset at 0.8x the speed of none (each batch pickled across processes)")


@dataclass
class Recommended:
    """What to train with; ``reasons`` holds one sentence per choice (and for device/precision)."""

    batch_size: int
    grad_accum: int
    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    strategy: str            # "single" | "ddp" | "deepspeed"
    compile: bool
    torch_threads: int
    devices: int = 1         # processes (GPUs) the strategy uses
    reasons: dict[str, str] = field(default_factory=dict)

    @property
    def effective_batch(self) -> int:
        return self.batch_size * self.grad_accum * self.devices

    def to_dict(self) -> dict:
        return {**asdict(self), "effective_batch": self.effective_batch}


def native_bf16(gpu: GpuInfo) -> bool | None:
    """bf16 in hardware (CUDA capability >= 8.0, CDNA/RDNA3+; not MPS), None when unknown:
    ``torch.cuda.is_bf16_supported()`` also says True where it is emulated (a T4)."""
    if gpu.backend == "cuda":
        return None if gpu.capability is None else gpu.capability[0] >= 8
    if gpu.backend == "rocm":
        return None if gpu.arch is None else bool(_AMD_NATIVE_BF16.match(gpu.arch))
    return False


def device_native_bf16(device: Any) -> bool:
    """``native_bf16`` for a device this process trains on (False for CPU/MPS): reads torch's
    device properties, so call it where the device is used anyway, not in the kernel."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    props = torch.cuda.get_device_properties(device)
    arch = getattr(props, "gcnArchName", "") or ""
    gpu = GpuInfo(index=device.index or 0, name=props.name,
                  backend="rocm" if torch.version.hip else "cuda",
                  capability=(props.major, props.minor), arch=arch.split(":")[0] or None)
    return bool(native_bf16(gpu))


def compile_unavailable(device: Any, mode: str = "default",
                        capability: tuple[int, int] | None = None) -> str | None:
    """Why ``torch.compile`` (in ``mode``) cannot work on ``device`` here, or None when it can.
    ``capability`` unknown: read from torch only where CUDA is initialised already."""
    kind = str(device).split(":")[0]
    if kind == "cpu":
        if mode.startswith("max-autotune"):
            return ("max-autotune tunes GPU (Triton) kernels; on the CPU it only adds compile "
                    "time, so it is not run — use +compile")
        if mode == "reduce-overhead":
            return "reduce-overhead replays CUDA graphs, which the CPU does not have"
        if cxx_compiler() is None:
            return ("torch.compile on the CPU needs a C++ compiler and none was found "
                    "(g++, c++, clang++ or $CXX); install one (e.g. apt install g++)")
        return None
    if kind == "cuda":
        if importlib.util.find_spec("triton") is None:
            return ("torch.compile on the GPU needs Triton, which is not installed, so "
                    "TorchInductor cannot build GPU kernels")
        props = None if capability is not None else nvml.initialised_properties(device)
        cap = capability or (props and (props.major, props.minor))  # ROCm's majors are >= 8
        if cap is not None and cap[0] < 7:
            return f"Triton needs a GPU of compute capability >= 7.0; this one is {cap[0]}.{cap[1]}"
        return None
    return f"torch.compile on {kind.upper()} is experimental, so it is not used"


def choose_precision(device_type: str, gpu: GpuInfo | None) -> tuple[str, str]:
    """bf16 where the GPU has it in hardware, fp16 + GradScaler on older CUDA, fp32 elsewhere."""
    if device_type == "cpu":
        hw_bf16 = sorted(cpu_flags() & NATIVE_BF16_FLAGS)
        extra = (f" This CPU has {', '.join(hw_bf16)}: bf16 autocast may pay off, measure it "
                 "with hn.compare." if hw_bf16 else "")
        return "fp32", ("on the CPU: fp16 has no CPU fast path, and bf16 autocast only helps "
                        "on CPUs with AMX / AVX-512 BF16." + extra)
    if device_type == "mps":
        return "fp32", "on Apple MPS: autocast support there depends on the macOS version."
    native = gpu and native_bf16(gpu)
    if native is None:
        return "fp16", ("with a GradScaler: this GPU's bf16 support could not be read, and fp16 "
                        "autocast works on every CUDA/ROCm GPU.")
    what = (f"compute capability {gpu.capability[0]}.{gpu.capability[1]}" if gpu.capability
            else (gpu.arch or gpu.name))
    if native:
        return "bf16", f"{what} has native bf16 (fp32's range, no GradScaler needed)."
    return "fp16", (f"with a GradScaler: {what} has no native bf16 (it would be emulated and "
                    "slow, though torch.cuda.is_bf16_supported() may say True).")


def recommend(device_type: str, gpu: GpuInfo | None, host: HostInfo, frontend: str,
              gpus_ok: int = 0, world_size: int = 1, deepspeed: bool = False) -> Recommended:
    """Settings for training on ``device_type``: ``gpus_ok`` GPUs passed the probe (DDP
    candidates); ``world_size``: this launched job's ranks; ``deepspeed``: it is importable."""
    why: dict[str, str] = {}
    cores = max(1, host.cores_usable)
    on_gpu, ranks = device_type == "cuda", world_size > 1
    strategy, procs = "single", 1
    if ranks:
        strategy, procs = "ddp", world_size
        why["strategy"] = f"this process is one of {world_size} launched ranks."
    elif on_gpu and gpus_ok >= 2 and frontend in INTERACTIVE_FRONTENDS:
        why["strategy"] = (f"one GPU: {gpus_ok} GPUs passed, but inside a notebook DDP needs one "
                           "process per GPU, which a cell is not; use "
                           f"hn.launch(fn, num_processes={gpus_ok}) to train on all of them.")
    elif on_gpu and gpus_ok >= 2:
        strategy, procs = ("deepspeed" if deepspeed else "ddp"), gpus_ok
        why["strategy"] = (
            f"{gpus_ok} GPUs passed the probe; run the script with torchrun "
            f"--nproc-per-node={gpus_ok} (or hn.launch) for one process per GPU. " + (
                "deepspeed is installed: strategy='deepspeed' (ZeRO-2) also splits the optimizer "
                "state and gradients over them; 'ddp' is as fast while they fit one GPU."
                if deepspeed else "pip install deepspeed adds ZeRO-2 (strategy='deepspeed'), "
                "which also splits the optimizer state over them."))
    else:
        why["strategy"] = ("one GPU passed the probe." if on_gpu
                           else f"one device: the {device_type.upper()}.")

    if on_gpu and gpu is not None and gpu.total_memory:
        gib = gpu.total_memory / GiB
        batch = next(b for limit, b in MEMORY_TIERS if gib < limit)
        why["batch_size"] = (f"per GPU, from {gib:.0f} GiB of GPU memory (tiers <6/12/40 GiB -> "
                             "32/64/128, else 256); the Trainer's batch-size finder refines it.")
    elif on_gpu:
        batch = 64
        why["batch_size"] = "the GPU's memory could not be read; a cautious start."
    else:
        batch = CPU_BATCH
        why["batch_size"] = (f"on the {device_type.upper()} memory is no limit; a smaller batch "
                             "gives more frequent updates and progress.")
    accum = max(1, math.ceil(TARGET_BATCH / (batch * procs)))
    why["grad_accum"] = (f"{batch} x {accum}" + (f" x {procs} GPUs" if procs > 1 else "")
                         + f" = {batch * accum * procs} samples per optimizer step "
                         f"(target {TARGET_BATCH}).")

    share = max(1, cores // procs)
    workers = 0 if on_gpu or share <= 2 else min(4, cores // 2)
    why["num_workers"] = (
        f"no worker processes: {GPU_LOADER_MEASURED}; a dataset already on the GPU must not use "
        "workers at all. Raise it only for data read from disk or decoded per item, and measure."
        if on_gpu else
        f"only {share} core(s) per process; measured on 2 cores, loader worker processes made "
        "in-memory EEG windows slower (pickling 100-200 KB arrays, cores shared with training)."
        if workers == 0 else
        f"min(4, cores // 2) with {cores} usable cores; the rest run the model.")
    why["pin_memory"] = ("for data held in CPU memory: page-locked copies to the GPU are faster "
                         "and asynchronous (data already on the GPU is not pinned)."
                         if on_gpu else "no CUDA/ROCm device to copy to.")
    why["persistent_workers"] = ("keeps the workers between epochs (no restart cost)."
                                 if workers else "no worker processes.")
    why["torch_threads"] = (
        "this process's share of the cores (the GPU does the math; it has no loader workers)."
        if on_gpu else
        f"this rank's share of the cores ({cores} over {world_size} ranks), so the ranks don't "
        "oversubscribe them." if ranks else
        "all usable cores for the model; loader worker processes run 1 thread each (DataLoader "
        "sets that).")

    # torch.compile: recommended only where it measured faster for a run of this length
    why_not = compile_unavailable(device_type, capability=gpu.capability if gpu else None)
    why["compile"] = (
        why_not + "." if why_not is not None else
        "not recommended by default: Triton is installed, so torch.compile can run, but its "
        "first step compiles for tens of seconds and it has not been measured faster for this "
        "model and run length; compare first (hn.compare with a '+compile' variant), then pass "
        "Trainer(compile=True) where it wins." if on_gpu else
        f"not recommended on the CPU: {CPU_COMPILE_MEASURED}. It can run here (a C++ compiler, "
        f"{cxx_compiler()}, is present): Trainer(compile=True) still compiles.")
    return Recommended(batch_size=batch, grad_accum=accum, num_workers=workers, pin_memory=on_gpu,
                       persistent_workers=workers > 0, strategy=strategy, compile=False,
                       torch_threads=share, devices=procs, reasons=why)
