"""Fixtures shared by several test modules."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture
def fake_nvml(monkeypatch):
    """Install a fake ``pynvml`` behind ``hybridnb.hardware.nvml``; returns the installer, which
    returns the ``nvml`` module reading the fake."""
    from hybridnb.hardware import nvml

    def install(fake):
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        nvml.reset()
        return nvml

    yield install
    nvml.reset()


# isolated workers read the test-only fault variables through a hook registered here
# (tests/faults.py); hybridnb itself reads none
import faults  # noqa: E402

faults.install()
