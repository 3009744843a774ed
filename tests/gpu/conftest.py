"""Real-GPU tests: marked ``gpu`` and skipped where no CUDA GPU is usable.

Whether CUDA is usable is asked in a fresh interpreter (``torch.cuda.is_available()`` there),
once per session, so collecting these tests never starts the CUDA driver in the test process:
the isolated worker of the tests must be the first CUDA user, as in a notebook kernel.
"""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (tests/gpu; skipped without one)")


@functools.cache
def cuda_available() -> tuple[bool, str]:
    """(usable, why not) from a fresh interpreter; never touches CUDA in this process."""
    code = ("import torch; ok = torch.cuda.is_available(); "
            "print(ok, torch.cuda.device_count() if ok else 0)")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120)
    except subprocess.TimeoutExpired:
        return False, "asking torch whether CUDA is available took over 120 s"
    words = out.stdout.split()
    if out.returncode != 0 or not words:
        return False, f"torch could not answer ({(out.stderr or '').strip()[-200:]})"
    return words[0] == "True", "no CUDA GPU (torch.cuda.is_available() is False)"


def pytest_collection_modifyitems(config, items) -> None:
    gpu_items = [item for item in items if "tests/gpu/" in str(item.fspath).replace("\\", "/")]
    if not gpu_items:
        return
    usable, why = cuda_available()
    for item in gpu_items:
        item.add_marker(pytest.mark.gpu)
        item.add_marker(pytest.mark.slow)
        if not usable:
            item.add_marker(pytest.mark.skip(reason=why))
