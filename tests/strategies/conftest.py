"""Shared by the DDP and DeepSpeed tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def single():
    """The one-process run (twice the per-rank batch) both files compare their ranks with,
    trained once for the two."""
    from test_distributed import train_single

    return train_single()
