"""The probe child: validate one device step by step (``STEPS``), sending a "start" event
before each step and an "ok"/"fail" event after it, so a hang is placed at its step.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
import warnings
from collections.abc import Iterator
from typing import NoReturn

from hybridnb.processes.child import leave
from hybridnb.processes.framed import connect

EVENT = "probe"   # the kind of the child's messages: {"e": start|ok|fail|info|end, ...}
TITLES = {"import": "import torch", "available": "device available", "memory": "memory query",
          "tensor": "small tensor", "matmul": "matmul vs CPU", "copy_back": "copy back"}
STEPS = tuple(TITLES)  # in the order they run
MATMUL_TOLERANCE = 1e-3   # max |gpu - cpu| / max |cpu| for a 256x256 fp32 product (TF32 off)


class _WrongResult(Exception):
    """The device computed, but not what the CPU computed."""


def main(argv: list[str] | None = None) -> NoReturn:
    channel, _, rest = connect(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m hybridnb.hardware.probe")
    parser.add_argument("--backend", choices=("cuda", "rocm", "mps"), required=True)
    parser.add_argument("--index", type=int, default=0)
    args = parser.parse_args(rest)

    def emit(**event) -> None:
        """Out at once: a hang in the next step must not keep this event back."""
        channel.send(EVENT, event)
        channel.flush()

    # no interpreter teardown (about 1 s with torch loaded): the OS frees the device
    leave(0 if run_steps(args.backend, args.index, emit) else 1)


def run_steps(backend: str, index: int, emit) -> bool:
    """Run the steps, ``emit(**event)`` for each start, end and fact, up to the first failure;
    True when every step passed."""
    steps = _steps(backend, index, emit)
    for name in STEPS:
        emit(e="start", step=name, t=time.time())
        t0 = time.perf_counter()
        try:
            detail = next(steps)
        except Exception as exc:  # noqa: BLE001 - broad: any failure is this step's verdict
            wrong = isinstance(exc, _WrongResult)
            emit(e="fail", step=name, s=round(time.perf_counter() - t0, 4), wrong=wrong,
                 detail=str(exc) if wrong else f"{type(exc).__name__}: {str(exc).strip()[:500]}")
            return False
        emit(e="ok", step=name, s=round(time.perf_counter() - t0, 4), detail=detail)
    emit(e="end")
    return True


def _steps(backend: str, index: int, emit) -> Iterator[str]:
    """The steps in ``STEPS``' order, sharing what they made: each yields its detail when it is
    done, so what raises before a yield is that step's failure."""
    import torch

    yield f"torch {torch.__version__}"  # step "import"

    if backend == "mps":  # step "available"
        if not torch.backends.mps.is_available():
            raise RuntimeError("torch.backends.mps.is_available() is False")
        device, sync = torch.device("mps"), torch.mps.synchronize
        emit(e="info", info={"name": "Apple GPU (MPS)", "runtime": "mps"})
        yield "MPS available"
    else:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            available = torch.cuda.is_available()
            count = torch.cuda.device_count() if available else 0
        if not available:
            why = " ".join(str(w.message) for w in caught).strip()
            raise RuntimeError("torch.cuda.is_available() is False" + (f": {why}" if why else ""))
        if index >= count:
            raise RuntimeError(f"torch sees {count} device(s); index {index} does not exist")
        props = torch.cuda.get_device_properties(index)
        info = {"name": props.name, "total_memory": int(props.total_memory),
                "capability": [props.major, props.minor], "count": count,
                "arch_list": torch.cuda.get_arch_list(),
                "runtime": torch.version.hip or torch.version.cuda}
        arch = getattr(props, "gcnArchName", None)
        if torch.version.hip and arch:
            info["arch"] = arch.split(":")[0]
        device = torch.device("cuda", index)
        sync = functools.partial(torch.cuda.synchronize, device)
        emit(e="info", info=info)
        yield f"{props.name}, {count} device(s) visible"

    if backend == "mps":  # step "memory": Metal's recommended memory less the driver's
        used = max(int(torch.mps.current_allocated_memory()),
                   int(torch.mps.driver_allocated_memory()))
        total = int(torch.mps.recommended_max_memory())
        free = max(0, total - used)
    else:
        free, total = (int(v) for v in torch.cuda.mem_get_info(device))
    emit(e="info", info={"free_memory": free, "total_memory": total})
    yield f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB free"

    x = torch.arange(4096, dtype=torch.float32, device=device)  # step "tensor"
    got = float((x * 2).sum().item())
    sync()
    if got != 4095 * 4096.0:
        raise _WrongResult(f"sum of 2*arange(4096) gave {got}, expected {4095 * 4096.0}")
    yield "4096 floats allocated and summed"

    gen = torch.Generator().manual_seed(0)  # step "matmul"
    a = torch.randn(256, 256, generator=gen)
    b = torch.randn(256, 256, generator=gen)
    ref = a @ b
    # true fp32 against the CPU; torch >= 2.9 has fp32_precision (reading allow_tf32 there
    # raises once a user set the new one)
    matmul = torch.backends.cuda.matmul
    flag, off = (("fp32_precision", "ieee") if hasattr(matmul, "fp32_precision")
                 else ("allow_tf32", False))
    before = getattr(matmul, flag)
    setattr(matmul, flag, off)
    try:
        out = a.to(device) @ b.to(device)
        sync()
    finally:  # put back: on Windows these steps run in the user's own process
        setattr(matmul, flag, before)
    err = float((out - ref.to(out.device)).abs().max().item()) / float(ref.abs().max())
    if not err <= MATMUL_TOLERANCE:  # also catches NaN
        raise _WrongResult(f"256x256 fp32 product differs from the CPU result: max relative "
                           f"error {err:.2e} (tolerance {MATMUL_TOLERANCE:g})")
    yield f"max relative error {err:.1e} vs CPU"

    host = torch.randint(-2**31, 2**31 - 1, (1 << 20,), dtype=torch.int32,  # step "copy_back"
                         generator=torch.Generator().manual_seed(1))
    back = host.to(device).cpu()
    sync()
    bad = int((back != host).sum())
    if bad:
        raise _WrongResult(f"4 MiB round trip host -> device -> host changed {bad} values")
    yield "4 MiB round trip identical"
