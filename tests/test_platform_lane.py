"""The platform lane: the process, probe, isolation, compare, launch and fault-path tests again,
with Linux's own facilities taken away in every process (``tests/platform_sim``: no memfd, no
PR_SET_PDEATHSIG, no fork, no SIGHUP, no waitid/pidfd, no /proc for hybridnb), as on macOS.

It runs inside ``make test`` (one pytest process starting another); on a machine that is not
Linux the real platform runs the whole suite instead, so the lane is skipped there. Tests that
time a fork-only path (a start measured in milliseconds, a forked DataLoader's children) are
left out: spawn starts a fresh interpreter; so are those whose code takes no path that differs
there (the probe's verdicts and cache, a scan of the source) and a repeat that differs only in
a signal the process code handles alike.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIM = ROOT / "tests" / "platform_sim"
SIM_ENV = "HYBRIDNB_TEST_PLATFORM_SIM"

P, S, H = "tests/processes/", "tests/processes/test_signals.py::", "tests/hardware/"
LANE = [
    # the supervisor: start, messages, death with the parent (the lifeline), tree kill, Ctrl-C
    P + "test_processes.py::test_a_spawned_child_dies_with_its_parent",
    P + "test_processes.py::test_a_forked_child_and_a_command_end_the_same_way",
    P + "test_processes.py::test_a_child_killed_by_a_signal_names_it_and_keeps_the_last_state",
    P + "test_processes.py::test_an_exception_in_the_parent_kills_the_child_and_its_helpers",
    P + "test_processes.py::test_ctrl_c_at_any_moment_of_a_start_leaves_no_child_and_no_shared_file",
    P + "test_processes.py::test_a_prestarted_worker_whose_job_never_comes_is_killed",
    P + "test_supervise.py",
    P + "test_spare.py::test_a_spare_is_gone_when_its_parent_process_ends",
    S + "test_sigterm_asks_a_supervised_worker_to_stop_then_ends_the_parent",
    # the probe and detect(): the framed child, its stop flag, MPS reported (not the probe's
    # verdicts and cache, the same on every platform)
    H + "test_probe.py::test_child_reports_each_step_as_framed_messages",
    H + "test_probe.py::test_segfault_names_the_signal_and_the_step",
    H + "test_probe.py::test_child_that_dies_before_any_step_is_a_crash_with_its_stderr",
    H + "test_probe.py::test_children_run_in_parallel_under_one_deadline",
    H + "test_probe.py::test_an_interrupted_probe_leaves_no_process",
    H + "test_detect.py::test_passing_probe_chooses_the_gpu_without_initialising_cuda",
    H + "test_detect.py::test_crashing_gpu_is_skipped_and_the_next_good_gpu_chosen",
    H + "test_platforms.py::test_detect_on_a_mac_whose_mps_fails_its_probe_chooses_the_cpu_and_says_why",
    H + "test_platforms.py::test_every_missing_facility_says_what_hybridnb_does_instead",
    # the isolated worker and its fault paths
    "tests/train/test_isolate.py::test_messages_arrive_in_order_and_the_result_comes_back",
    "tests/train/test_isolate.py::test_sigkill_mid_work_names_the_death_and_keeps_the_last_state",
    "tests/train/test_isolate.py::test_should_stop_sends_stop_and_the_worker_finishes_with_its_state",
    "tests/train/test_isolate.py::test_ctrl_c_asks_the_worker_to_stop_and_it_returns_its_checkpoint",
    "tests/train/test_isolated_training.py::test_an_isolated_run_equals_an_in_process_run_and_fills_the_kernels_model",
    # one signal: how the kernel learns of the death is the same for SIGKILL and SIGABRT
    "tests/train/test_isolated_training.py::test_a_worker_killed_mid_step_ends_on_the_cpu_from_its_last_state[9]",
    # compare() in its own processes, launch() spawning its ranks
    "tests/comparison/test_compare.py::test_a_variant_whose_process_aborts_is_a_row_and_the_caller_lives",
    "tests/strategies/test_distributed.py::test_launch_streams_rank0_output_and_returns_its_result",
]


def _lane_env() -> dict[str, str]:
    env = {**os.environ, SIM_ENV: "1",
           "PYTHONPATH": os.pathsep.join([str(SIM), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("HYBRIDNB_QUICK", None)
    return env


pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"),
                       reason="the lane simulates macOS on Linux; elsewhere the real OS runs"),
    pytest.mark.skipif(os.environ.get(SIM_ENV) == "1", reason="already inside the lane"),
]


def test_the_lane_takes_the_linux_facilities_away_in_every_process():
    """Else the lane below would prove nothing: a child of a child sees them gone too."""
    code = ("import subprocess, sys\n"
            "print(subprocess.run([sys.executable, '-c', 'from hybridnb import platform; "
            "print(sorted(f.name for f in platform.missing()))'], capture_output=True, "
            "text=True).stdout)")
    done = subprocess.run([sys.executable, "-c", code], env=_lane_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    gone = done.stdout.strip()
    for name in ("memfd", "PR_SET_PDEATHSIG", "fork", "/proc", "waitid", "pidfd"):
        assert repr(name) in gone, gone
    check = ("import os, signal, ctypes, multiprocessing\n"
             "assert not hasattr(signal, 'SIGHUP') and not hasattr(os, 'fork')\n"
             "assert multiprocessing.get_start_method() == 'spawn'\n"
             "try:\n    ctypes.CDLL(None).prctl\nexcept AttributeError:\n    pass\n"
             "else:\n    raise SystemExit('prctl is still there')\n")
    done = subprocess.run([sys.executable, "-c", check], env=_lane_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.timeout(900)
def test_the_process_tests_pass_without_linux_only_facilities():
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-o", "addopts=", *LANE], env=_lane_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=880)
    assert done.returncode == 0, (done.stdout[-6000:] + done.stderr[-2000:])
    assert " passed" in done.stdout and " skipped" not in done.stdout.splitlines()[-1], \
        done.stdout[-2000:]
