"""Synthetic releases shared by the data_prep tests, written once per test session.

Import the fixtures into a test module (``from data_fixtures import clean_release``); the
releases are cached in this module, so every module reuses the same files.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from data_prep import synthetic

_CACHE: dict[str, Path] = {}
ALL_FAULTS = ("nan_durations", "empty_durations", "no_feedback", "six_channels",
              "short_recording", "no_presses", "nan_stretch", "truncated_bdf",
              "unsorted_onsets", "late_anchor")
CLEAN = {"n_subjects": 4, "ccd_trials": 8, "rest_cycles": 1, "seed": 3}


def _release(factory, name: str, **kwargs) -> Path:
    if name not in _CACHE:
        _CACHE[name] = synthetic.make_hbn_like(factory.mktemp(name), n_jobs=1, **kwargs)
    return _CACHE[name]


@pytest.fixture
def clean_release(tmp_path_factory) -> Path:
    """4 subjects (R5 mini ids), 3 CCD runs of 8 trials + one resting cycle each; no faults."""
    return _release(tmp_path_factory, "clean", **CLEAN)


@pytest.fixture
def faulty_release(tmp_path_factory) -> Path:
    """11 subjects, every fault of synthetic.FAULTS planted once (subjects 10, 9, ... 1)."""
    return _release(tmp_path_factory, "faulty", n_subjects=11, ccd_trials=5, rest_cycles=1,
                    seed=5, faults=ALL_FAULTS)


@pytest.fixture
def private_release(tmp_path_factory, tmp_path) -> Path:
    """A copy of the clean release this test may modify."""
    src = _release(tmp_path_factory, "clean", **CLEAN)
    dst = tmp_path / "cache" / src.name
    shutil.copytree(src, dst)
    return dst


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a network connection fails at once (and is counted)."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network disabled in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    return attempts
