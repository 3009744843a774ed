"""A first step that compiles says so with a rough duration, the ETA leaves the first step out,
and a CPU compile does not print torch's "No CUDA runtime is found" line."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import torch
from torch import nn

from hybridnb.live.record import RunRecord
from hybridnb.train.bus import Bus
from hybridnb.train.placement import compile_estimate_s, say_compiling


def test_the_first_compiled_call_says_compiling_with_an_estimate_then_how_long_it_took():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    compiled = nn.Sequential(model)  # stands in for torch.compile's wrapper: a module, called
    said, bus = [], Bus(lambda: (0, 0))
    bus.subscribe(lambda event: said.append((event.kind, event.message)))
    say_compiling(compiled, model, torch.device("cpu"), bus)
    compiled(torch.randn(2, 4))
    compiled(torch.randn(2, 4))  # later steps say nothing
    assert [k for k, _ in said] == ["compiling", "compiling"]
    assert said[0][1].startswith(f"compiling, about {compile_estimate_s(model, 'cpu'):.0f} s")
    assert "ETA" in said[0][1] and said[1][1].startswith("compiled the forward in")


def test_compile_estimate_grows_with_the_layers():
    small = nn.Linear(2, 2)
    big = nn.Sequential(*[nn.Linear(2, 2) for _ in range(30)])
    assert compile_estimate_s(big, torch.device("cpu")) > compile_estimate_s(small, "cpu")


def test_the_eta_leaves_a_slow_first_step_out():
    record = RunRecord({"epochs": 1, "steps_per_epoch": 10})
    record.add({"epoch": 0, "step": 1, "global_step": 1, "elapsed_s": 80.0})  # compiled: 80 s
    assert record.remaining_s() is None  # no pace yet
    record.add({"epoch": 0, "step": 2, "global_step": 2, "elapsed_s": 81.0})
    record.add({"epoch": 0, "step": 3, "global_step": 3, "elapsed_s": 82.0})
    assert abs(record.remaining_s() - 7.0) < 1e-9  # 1 s a step, 7 steps left; not 187 s


def test_a_cpu_compile_does_not_print_the_cuda_home_line(tmp_path):
    """The line comes from importing torch.utils.cpp_extension where a CUDA toolkit is found
    (CUDA_HOME) but no GPU; injected here by pointing CUDA_HOME at a folder."""
    script = textwrap.dedent("""
        import sys, torch
        if torch.cuda.is_available():
            print("SKIP"); sys.exit()
        if sys.argv[1] == "quiet":
            from hybridnb.train.placement import quiet_cuda_home_warning
            quiet_cuda_home_warning()
        import torch.utils.cpp_extension
    """)
    env = {**os.environ, "CUDA_HOME": str(tmp_path)}
    runs = {how: subprocess.run([sys.executable, "-c", script, how], env=env,
                                capture_output=True, text=True, timeout=120)
            for how in ("stock", "quiet")}
    if "SKIP" in runs["stock"].stdout:
        return  # a GPU here: torch says nothing
    assert "No CUDA runtime is found" in runs["stock"].stderr  # the fault is real
    assert "No CUDA runtime is found" not in runs["quiet"].stderr
