"""No child left behind: a signal reaches a hybridnb command from outside, at some moment, and
afterwards no process it started remains (re-parented or not) and its temporary files are gone.

Each command runs as a real subprocess with a marker in its environment, which every process it
starts inherits; after the command ended, no running process may carry the marker.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from torch import nn

from hybridnb_tools.gpu_sim import fake_gpu

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MARK = "HYBRIDNB_SIGNAL_TEST"
EXIT_S = 60.0      # after the signal: the command must be gone by then (2 shared cores)
COMPARE = [sys.executable, "-m", "hybridnb", "compare", "--model", "test_signals:small_model",
           "--batch", "4", "--warmup", "1", "--repeats", "1", "--variants", "fp32", "--device",
           "cpu"]


def small_model() -> nn.Module:
    """compare's model here (imported by the command and its variant's process from this file):
    torch alone, where a braindecode model would add seconds of imports to every process."""
    return nn.Sequential(nn.Flatten(), nn.Linear(8, 1))


small_model.input_shape = (1, 8)


def _marked(token: str) -> list[psutil.Process]:
    """Running processes (zombies excluded) that carry this test's marker."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARK) == token and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _cmdlines(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(" ".join(p.cmdline()))
        except psutil.Error:
            continue
    return out


def _signal_when(argv: list[str], sig: int, ready: Callable[[list[str]], bool], tmp_path: Path,
                 extra_env: dict[str, str] | None = None, wait_s: float = 240.0) -> dict:
    """Start ``argv``; once ``ready(the command lines of its descendants)`` holds, send ``sig``
    to it; wait for it to end. Returns what happened (exit code, seconds, what is left)."""
    token = uuid.uuid4().hex
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, MARK: token, "TMPDIR": str(tmp), "HYBRIDNB_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")])}
    env.pop("HYBRIDNB_QUICK", None)
    env.update(extra_env or {})
    with open(tmp_path / "stdout", "wb") as stdout:  # read by ``_printed`` while it runs
        proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=stdout,
                                stderr=subprocess.PIPE, start_new_session=True)
    parent = psutil.Process(proc.pid)
    seen: list[str] = []
    try:
        deadline = time.monotonic() + wait_s
        while True:
            assert proc.poll() is None, f"it ended before the signal: {proc.communicate()}"
            assert time.monotonic() < deadline, f"never ready; its children: {seen}"
            try:
                seen = _cmdlines(parent.children(recursive=True))
            except psutil.NoSuchProcess:
                seen = []
            if ready(seen):
                break
            time.sleep(0.01)
        os.kill(proc.pid, sig)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=EXIT_S)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    left = _marked(token)
    settle = time.monotonic() + 5
    while left and time.monotonic() < settle:  # a killed process may take a moment to go
        time.sleep(0.1)
        left = _marked(token)
    return {"code": proc.returncode, "seconds": took, "left": _cmdlines(left), "seen": seen,
            "files": sorted(p.name for p in tmp.iterdir() if p.name.startswith("hybridnb")),
            "stderr": err.decode(errors="replace"),
            "shm": glob.glob(f"/dev/shm/hybridnb-{proc.pid}-*")}


def _has(part: str) -> Callable[[list[str]], bool]:
    return lambda cmds: any(part in c for c in cmds)


def _printed(tmp_path: Path, text: str) -> Callable[[list[str]], bool]:
    """Once the command has printed ``text`` (its stdout goes to ``tmp_path / "stdout"``)."""
    out = tmp_path / "stdout"
    return lambda cmds: out.exists() and text in out.read_text(errors="replace")


def _after(seconds: float, ready: Callable[[list[str]], bool]) -> Callable[[list[str]], bool]:
    """``seconds`` after ``ready`` first held (a started child reached its work)."""
    first: list[float] = []

    def check(cmds: list[str]) -> bool:
        if not first and ready(cmds):
            first.append(time.monotonic())
        return bool(first) and time.monotonic() - first[0] > seconds
    return check


def _clean(got: dict) -> None:
    """No process left, no file of hybridnb's in the temporary folder or /dev/shm (torch's own
    caches may stay), and the command ended in time."""
    print(f"ended {got['seconds']:.2f} s after the signal, exit {got['code']}")
    assert got["left"] == [], got
    assert got["files"] == [] and got["shm"] == [], got
    assert got["seconds"] < EXIT_S


# ------------------------------------------------------------------ compare


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_compare_while_a_variant_runs_leaves_no_process_and_no_file(tmp_path, sig):
    """The variant is timing a long window when the command is told to stop."""
    working = _after(1, _printed(tmp_path, "warmed up"))  # its timed window comes next
    got = _signal_when(COMPARE + ["--steps", "100000"], sig, working, tmp_path)
    _clean(got)
    if sig == signal.SIGTERM:
        assert got["code"] == -signal.SIGTERM  # it ends as SIGTERM ends a process
    else:
        assert got["code"] == 130 and "interrupted" in got["stderr"]


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_variant_process_starts_leaves_nothing(tmp_path, sig):
    """The signal comes the moment the variant's interpreter exists (it is importing torch)."""
    got = _signal_when(COMPARE + ["--steps", "100000"], sig,
                       _has("hybridnb.comparison.worker"), tmp_path)
    _clean(got)
    assert got["code"] in (-signal.SIGTERM, 130)


@pytest.mark.timeout(200)
def test_a_signal_before_any_child_ends_compare_at_once(tmp_path):
    """During the command's own start-up (importing torch): nothing was started, nothing stays."""
    started = time.monotonic()
    got = _signal_when(COMPARE + ["--steps", "100000"], signal.SIGTERM,
                       lambda cmds: time.monotonic() - started > 0.3, tmp_path)
    _clean(got)
    assert got["code"] == -signal.SIGTERM


# ------------------------------------------------------------------ the probe


@pytest.mark.timeout(200)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_detect_with_a_hung_gpu_kills_the_probe_and_its_helper(tmp_path, sig):
    """A GPU that hangs in the probe, whose child started a helper (as drivers do)."""
    sim = {"gpus": 1, "hang_at": "matmul", "helper": True}
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    got = _signal_when([sys.executable, "-m", "hybridnb", "detect", "--timeout", "120",
                        "--refresh"], sig,
                       _has("time.sleep(600)"), tmp_path,  # the helper: the probe hangs
                       fake_gpu.environ(sim, {"PYTHONPATH": path}))
    assert any("hybridnb.hardware.probe" in c for c in got["seen"])  # the probe and its helper
    assert any("time.sleep(600)" in c for c in got["seen"])
    _clean(got)
    assert got["seconds"] < 20  # a probe has nothing to keep: killed at once, not at its deadline
    assert got["code"] == (-signal.SIGTERM if sig == signal.SIGTERM else 130)


# ------------------------------------------------------------------ launch

LAUNCH_SCRIPT = """
import time
import hybridnb as hn

def sleeper():
    print("rank up", flush=True)
    time.sleep(600)

hn.launch(sleeper, num_processes=2, start_method="spawn")
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigterm_to_a_script_in_launch_stops_every_rank(tmp_path):
    """The ranks get SIGINT (the interrupt policy), stop, and the script ends as SIGTERM ends
    it, with no rank left."""
    script = tmp_path / "job.py"
    script.write_text(LAUNCH_SCRIPT)
    got = _signal_when([sys.executable, str(script)], signal.SIGTERM,
                       lambda cmds: sum("hybridnb.processes.worker" in c for c in cmds) >= 2,
                       tmp_path)
    _clean(got)
    assert got["code"] == -signal.SIGTERM


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("sig", [
    pytest.param(getattr(signal, "SIGHUP", None), id="SIGHUP", marks=pytest.mark.skipif(
        not hasattr(signal, "SIGHUP"), reason="this platform has no SIGHUP")),
    pytest.param(signal.SIGKILL, id="SIGKILL")])
def test_compare_closed_with_its_terminal_or_killed_outright_leaves_no_process(tmp_path, sig):
    """SIGHUP (the terminal closed) is handled as SIGTERM; SIGKILL reaches no handler, and the
    variant's process dies with its parent."""
    working = _after(1, _printed(tmp_path, "warmed up"))
    got = _signal_when(COMPARE + ["--steps", "100000"], sig, working, tmp_path)
    _clean(got)
    assert got["code"] == -sig


# ------------------------------------------------------------------ a supervised worker

SUPERVISED = """
import sys, time
from hybridnb.processes import start_spawn, supervise

def work(channel, path):
    while channel.stop_reason() is None:
        channel.step_done()
        time.sleep(0.01)
    with open(path, "w") as f:
        f.write(channel.stop_reason())
    return "stopped"

out = supervise(lambda: start_spawn(work, sys.argv[1]), silence=60)
print("returned", out.status, flush=True)
"""


@pytest.mark.timeout(200)
def test_sigterm_asks_a_supervised_worker_to_stop_then_ends_the_parent(tmp_path):
    """The worker hears "interrupt", stops after its step and says so; then the parent ends as
    SIGTERM ends it (it does not carry on as if nothing happened)."""
    script, said = tmp_path / "fit.py", tmp_path / "said"
    script.write_text(SUPERVISED)
    got = _signal_when([sys.executable, str(script), str(said)], signal.SIGTERM,
                       _after(3, _has("hybridnb.processes.worker")), tmp_path)
    _clean(got)
    assert said.read_text() == "interrupt"
    assert got["code"] == -signal.SIGTERM

