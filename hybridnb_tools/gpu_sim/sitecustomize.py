"""Runs at the start of every process with this folder on ``PYTHONPATH`` before any other
sitecustomize (see ``fake_gpu.environ``): the simulated GPUs of ``fake_gpu``, when
``HYBRIDNB_TEST_GPU_SIM`` asks for them; then the platform lane's (tests/platform_sim)."""

import os

if os.environ.get("HYBRIDNB_TEST_GPU_SIM"):
    from hybridnb_tools.gpu_sim import fake_gpu

    fake_gpu.install()


from hybridnb_tools.gpu_sim.site_chain import run_the_next  # noqa: E402 - after this one's work

run_the_next(__file__)
