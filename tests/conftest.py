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


@pytest.fixture(scope="session")
def tour_cache(tmp_path_factory):
    """The cache of the tour's synthetic release, shared by tests/test_readme.py and
    tests/test_tour.py: the first to run writes the release and its windows (seconds), the
    other reads them, as a user's second run does."""
    return tmp_path_factory.mktemp("tour-cache")


@pytest.fixture(autouse=True)
def _no_warm_worker(monkeypatch):
    """No spare worker kept between a test's isolated fits (tests of the spare turn it on):
    tests check that no child process is left, and a spare imports torch on 2 cores."""
    monkeypatch.setenv("HYBRIDNB_WARM_WORKER", "0")


# isolated workers read the test-only fault variables through a hook registered here
# (tests/faults.py); hybridnb itself reads none
import faults  # noqa: E402

faults.install()
