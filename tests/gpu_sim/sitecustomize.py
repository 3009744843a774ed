"""Runs at the start of every process with this folder first on ``PYTHONPATH`` (see
``fake_gpu.environ``): the simulated GPUs of ``fake_gpu``, when ``HYBRIDNB_TEST_GPU_SIM`` asks
for them."""

import os

if os.environ.get("HYBRIDNB_TEST_GPU_SIM"):
    import fake_gpu

    fake_gpu.install()
