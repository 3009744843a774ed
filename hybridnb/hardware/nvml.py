"""NVML (``pynvml``), the one place hybridnb talks to it: it never initialises CUDA, so the
kernel may use it. Kept open once opened (~50 ms; closing would race with a reading thread).
Without NVML, or when a device stops answering, every function returns None.
"""

from __future__ import annotations

import functools
import re
import sys
from typing import Any

from hybridnb.env import current


def status() -> str:
    """Why NVML is not usable ("" when it is)."""
    return _opened()[1]


def reset() -> None:
    """Open it again on the next call (``pynvml`` was swapped)."""
    _opened.cache_clear()


@functools.cache
def _opened() -> tuple[Any | None, str]:
    """Once per process (two threads racing here would both init: NVML counts inits)."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed, so NVIDIA GPUs cannot be listed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - broad: pynvml has one error class per NVML code
        return None, f"no NVIDIA driver found (NVML: {exc})"
    return pynvml, ""


def attempt(name: str, *args: Any) -> tuple[Any | None, str]:
    """Call ``pynvml.<name>(*args)``: ``(value, "")``, or ``(None, why)`` on any failure."""
    lib, why = _opened()
    if lib is None:
        return None, why
    try:
        return getattr(lib, name)(*args), ""
    except Exception as exc:  # noqa: BLE001 - broad: any NVML code, or a missing symbol
        return None, str(exc)


def _get(name: str, *args: Any, convert: Any = None) -> Any | None:
    """``pynvml.<name>(*args)`` through ``convert``; None for a None argument or any failure."""
    value = None if None in args else attempt(name, *args)[0]
    return value if value is None or convert is None else convert(value)


def count() -> int | None:
    """NVML ignores CUDA_VISIBLE_DEVICES."""
    return _get("nvmlDeviceGetCount")


def driver() -> str | None:
    return _get("nvmlSystemGetDriverVersion", convert=str)


def cuda_driver() -> str | None:
    """The highest CUDA version the driver supports, e.g. "13.0"."""
    return _get("nvmlSystemGetCudaDriverVersion", convert=lambda v: f"{v // 1000}.{v % 1000 // 10}")


def handle_by_index(physical: int) -> Any | None:
    """``physical``: PCI order, before CUDA_VISIBLE_DEVICES."""
    return _get("nvmlDeviceGetHandleByIndex", physical)


def locate(index: int) -> tuple[Any | None, str]:
    """``(NVML handle, how)`` for torch's CUDA ordinal ``index``, or ``(None, why not)``.

    NVML numbers devices in PCI order, CUDA renumbers the visible ones: the stable key is the UUID
    torch reports where CUDA is initialised already, else the ordinal goes through
    ``CUDA_VISIBLE_DEVICES`` as CUDA reads it.
    """
    n = count()
    if n is None:
        return None, f"NVML not available ({status() or 'no answer'})"
    handles = [handle_by_index(i) for i in range(n)]
    uuids = [uuid(h) for h in handles]
    want = getattr(initialised_properties(index), "uuid", None)
    if want:
        found = [h for h, u in zip(handles, uuids, strict=True) if norm_uuid(u) == norm_uuid(want)]
        return (found[0], f"matched by UUID {want}") if found else (
            None, f"no NVML device has the UUID {want} that torch reports for cuda:{index}")
    visible = current().get("CUDA_VISIBLE_DEVICES")
    order = list(range(n)) if visible is None else visible_indices(visible, uuids)
    where = "" if visible is None else f" (CUDA_VISIBLE_DEVICES={visible!r})"
    if index >= len(order):
        return None, f"cuda:{index} is past the {len(order)} visible NVML device(s){where}"
    return handles[order[index]], f"NVML index {order[index]}{where}"


def visible_indices(value: str, uuids: list[str | None]) -> list[int]:
    """The physical indices a ``*_VISIBLE_DEVICES`` value shows, in the runtime's order.

    CUDA's rules: comma-separated indices or unique UUID prefixes ("GPU-" optional); the list
    ends at the first entry that is invalid, unknown, ambiguous or repeated (so a MIG entry
    shows no whole GPU).
    """
    out: list[int] = []
    for token in (t.strip() for t in value.split(",")):
        if re.fullmatch(r"-?\d+", token):
            hits = [int(token)] if 0 <= int(token) < len(uuids) else []
        else:
            hits = [i for i, u in enumerate(uuids)
                    if token and u and norm_uuid(u).startswith(norm_uuid(token))]
        if len(hits) != 1 or hits[0] in out:
            break
        out.append(hits[0])
    return out


def initialised_properties(device: Any) -> Any | None:
    """torch's properties of a CUDA ``device`` (an ordinal, "cuda", "cuda:N"), only where this
    process initialised CUDA already (reading them would initialise it); None otherwise."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized() or torch.device(device).type != "cuda":
            return None
        return torch.cuda.get_device_properties(device)
    except Exception:  # noqa: BLE001 - broad: torch's error for a bad ordinal varies by version
        return None


def memory(h: Any) -> Any | None:
    """NVML's ``.total``, ``.free``, ``.used`` bytes (every process on the GPU counts)."""
    return _get("nvmlDeviceGetMemoryInfo", h)


def utilisation(h: Any) -> float | None:
    """NVML's "GPU busy" %: the share of its last sample period (1/6 s to 1 s) in which any
    kernel ran; no measure of how well the GPU is used (a tiny kernel counts)."""
    return _get("nvmlDeviceGetUtilizationRates", h, convert=lambda r: float(r.gpu))


def uuid(h: Any) -> str | None:
    return _get("nvmlDeviceGetUUID", h, convert=str)


def name(h: Any) -> str | None:
    return _get("nvmlDeviceGetName", h, convert=str)


def capability(h: Any) -> tuple[int, int] | None:
    return _get("nvmlDeviceGetCudaComputeCapability", h, convert=lambda v: (int(v[0]), int(v[1])))


def norm_uuid(value: Any) -> str:
    """A UUID lower case, without the "GPU-" prefix ("" for None)."""
    return str(value or "").strip().lower().removeprefix("gpu-")
