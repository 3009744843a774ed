"""hybridnb.processes: the one supervisor of child processes, with faults injected in real
children (mostly spawned: fresh interpreters that receive a cloudpickled callable).

Every test ends with no child process left (the autouse fixture).
"""

from __future__ import annotations

import ast
import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hybridnb.processes import Ending, start_command, start_fork, start_spawn, supervise
from hybridnb.train.isolate import run_isolated

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def nothing_left_running():
    yield
    children = psutil.Process().children(recursive=True)
    assert children == [], f"processes left behind: {children}"


def _gone(pid: int, within: float = 3.0) -> bool:
    """The process ended (a grandchild killed with its group may be init's zombie a while)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


def _group_gone(pgid: int, within: float = 5.0) -> bool:
    """No process of the group is left: os.killpg(pgid, 0) raises ProcessLookupError (a killed
    grandchild is init's zombie, still in the group, until init reaps it)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


def _shm_files() -> set[str]:
    return set(glob.glob(f"/dev/shm/hybridnb-{os.getpid()}-*"))


# ------------------------------------------------------------------ the spawned child

def test_a_spawned_child_runs_a_notebook_closure_in_a_fresh_headless_interpreter(capfd):
    class Local:  # defined here, as in a notebook cell: it travels by value
        def __init__(self, k):
            self.k = k

    parent_modules = set(sys.modules)

    def work(channel, obj, *, plus):
        import faulthandler

        print("printed by the child")
        return {"value": obj.k + plus, "isolated": os.environ.get("HYBRIDNB_ISOLATED"),
                "headless": os.environ.get("HYBRIDNB_HEADLESS"),
                "own_group": os.getpgid(0) == os.getpid(), "fresh": "pytest" not in sys.modules,
                "faulthandler": faulthandler.is_enabled()}

    out = supervise(lambda: start_spawn(work, Local(40), plus=2), silence=60)
    assert out.status == Ending.DONE and out.status == "done" and out.ok, out.reason
    assert out.result == {"value": 42, "isolated": "1", "headless": "1", "own_group": True,
                          "fresh": True, "faulthandler": True}
    assert "printed by the child" in capfd.readouterr().out
    assert "printed by the child" in out.output_tail
    assert _group_gone(out.pid)
    assert "pytest" in parent_modules


def test_big_tensors_travel_through_shared_memory_and_nothing_is_left_in_dev_shm():
    import torch

    big = torch.arange(1 << 20, dtype=torch.float32).reshape(1024, 1024)  # 4 MiB
    param = torch.nn.Parameter(torch.ones(512, 1024))  # 2 MiB
    small = torch.arange(10)
    before = _shm_files()
    sent = f"/hybridnb-{os.getpid()}-"  # the files this process writes

    def work(channel, tensors):
        b, p, s = tensors["big"], tensors["param"], tensors["small"]
        b.add_(1)  # the child's copy: the parent's tensor must not change
        mapped = None  # no /proc (macOS): not checked
        if os.path.exists("/proc/self/maps"):
            with open("/proc/self/maps") as maps:  # the /dev/shm file, removed once mapped
                mapped = sent in maps.read()
        return {"sum": float(b.sum()), "mapped": mapped,
                "param": isinstance(p, torch.nn.Parameter) and p.requires_grad,
                "small": s.tolist(), "threads": torch.get_num_threads()}

    out = supervise(lambda: start_spawn(work, {"big": big, "param": param, "small": small}),
                    silence=60)
    assert out.ok, out.reason
    n = big.numel()
    assert out.result["sum"] == float(n * (n - 1) / 2 + n)
    assert out.result["mapped"] is (True if os.path.exists("/proc/self/maps") else None)
    assert out.result["param"] is True
    assert out.result["small"] == list(range(10))
    fresh = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                           capture_output=True, text=True, check=True)
    assert out.result["threads"] == int(fresh.stdout)  # a fresh interpreter's count, not 1
    assert float(big[0, 0]) == 0.0  # a snapshot: the child's change stays there
    assert _shm_files() == before


def test_silence_in_a_named_phase_is_killed_and_names_the_phase_and_the_silence():
    def work(channel):
        channel.step_done()
        channel.state({"step": 1})
        channel.heartbeat(phase="validation")
        time.sleep(600)

    t0 = time.monotonic()
    out = supervise(lambda: start_spawn(work), silence=1.0)
    assert out.status == Ending.HUNG, out.reason
    assert out.phase == "validation" and out.limit_s == 1.0
    assert 1.0 <= out.silent_s < 5 and time.monotonic() - t0 < 10
    assert out.state == {"step": 1} and out.steps == 1
    assert "validation" in out.reason
    assert _group_gone(out.pid)


def test_the_limit_bounds_silence_not_the_length_of_a_phase():
    def work(channel):
        channel.heartbeat(phase="validation")
        for _ in range(10):  # 2 s of validation, a heartbeat every 0.2 s
            time.sleep(0.2)
            channel.heartbeat(phase="validation")
        return "validated"

    out = supervise(lambda: start_spawn(work), silence=0.8)
    assert out.ok and out.result == "validated", out.reason
    assert out.phase == "validation" and out.seconds > 2.0


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGABRT])
def test_a_child_killed_by_a_signal_names_it_and_keeps_the_last_state(sig):
    def work(channel, number):
        channel.heartbeat(phase="train")
        channel.state({"epoch": 3})
        channel.flush()
        print("what():  CUDA error: an illegal memory access was encountered", file=sys.stderr,
              flush=True)
        time.sleep(0.2)
        signal.raise_signal(number)

    out = supervise(lambda: start_spawn(work, int(sig)), silence=60)
    assert out.status == Ending.DIED
    assert f"killed by {sig.name}" in out.reason
    assert out.state == {"epoch": 3} and out.phase == "train"
    assert "illegal memory access" in out.last_words
    assert _group_gone(out.pid)


def test_an_exception_comes_back_with_its_type_and_traceback():
    def failing_in_the_child(channel):
        channel.heartbeat(phase="setup")
        raise ValueError("no such column: 'age'")

    out = supervise(lambda: start_spawn(failing_in_the_child), silence=60)
    assert out.status == Ending.ERROR and out.error["type"] == "ValueError"
    assert "failing_in_the_child" in out.error["traceback"] and "'age'" in out.error["message"]
    assert out.phase == "setup"


def test_a_deadline_bounds_the_whole_run():
    def chatty(channel):
        while True:
            channel.heartbeat(phase="loop")
            time.sleep(0.1)

    out = supervise(lambda: start_spawn(chatty), silence=5, deadline=1.0)
    assert out.status == Ending.TIMEOUT and out.limit_name == "deadline"
    assert out.phase == "loop" and 1.0 <= out.seconds < 6


def test_an_exception_in_the_parent_kills_the_child_and_its_helpers():
    helpers: list[int] = []
    pids: list[int] = []

    def work(channel):
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        channel.send("pids", (os.getpid(), helper.pid))
        time.sleep(600)

    def on_message(m):
        if m.kind == "pids":
            pids.append(m.payload[0])
            helpers.append(m.payload[1])
            raise ValueError("the renderer broke")

    with pytest.raises(ValueError, match="renderer broke"):
        supervise(lambda: start_spawn(work), silence=60, on_message=on_message)
    assert pids and _gone(pids[0]) and _gone(helpers[0])
    assert _group_gone(pids[0])


def test_a_spawned_child_dies_with_its_parent():
    """The parent (a small script) starts a child and dies with os._exit: PR_SET_PDEATHSIG."""
    script = (
        "import sys, time\n"
        "from hybridnb.processes import start_spawn\n"
        "def sleep(channel):\n"
        "    channel.send('up')\n"
        "    time.sleep(600)\n"
        "c = start_spawn(sleep)\n"
        "while not c.messages.read(): time.sleep(0.01)\n"
        "print(c.pid, flush=True)\n"
        "import os; os._exit(0)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    pid = int(done.stdout.split()[0])
    assert _gone(pid, within=5)


def test_the_spawn_start_reports_its_first_message_quickly():
    """The start-up cost (start to the first message; no torch in the child)."""
    first: list[float] = []
    t0 = time.perf_counter()
    out = supervise(lambda: start_spawn(lambda channel: channel.send("up")), silence=60,
                    on_message=lambda m: first.append(time.perf_counter() - t0))
    assert out.ok
    print(f"\nspawn start-up: {first[0] * 1e3:.0f} ms to the first message")
    assert first[0] < 20


def test_a_prestarted_worker_imports_first_and_runs_the_job_sent_later():
    """Start now, job later: the worker imports its modules and says "ready" while this
    process is still busy; the job sent afterwards runs at once; the worker knows its times."""
    from hybridnb.processes.child import prestart_spawn

    kinds: list[str] = []
    early = prestart_spawn(preload=("json",))
    time.sleep(0.5)  # this process's own set-up
    sent = time.monotonic()

    def job(channel, x):
        from hybridnb.processes.worker import startup

        return {"x": x * 2, **startup()}

    out = supervise(lambda: early.send(job, 21), silence=60, start_grace=60,
                    on_message=lambda m: kinds.append(m.kind))
    early.close()  # after send: nothing to do
    assert out.ok and out.result["x"] == 42
    assert kinds[0] == "ready"
    times = out.result
    assert times["spawned_at"] < times["ready_at"] < sent + 5
    assert times["job_at"] >= times["ready_at"]


def test_a_packed_job_crosses_the_request_pipe_as_it_is():
    """The job ``payload.pack`` made is written as the frame's body, not pickled a second time
    (a job of tens of MB would be copied once more on each side)."""
    from hybridnb.processes.channel import PACKED, Inbox
    from hybridnb.processes.child import Requests
    from hybridnb.processes.payload import pack, unpack

    data, _ = pack((print, (b"x" * 5000,), {}))
    r, w = os.pipe()
    Requests(w).send_packed(data)  # and closes
    inbox = Inbox(r)
    got = inbox.get()
    assert got.kind == PACKED and bytes(got.payload) == data
    assert unpack(got.payload) == (print, (b"x" * 5000,), {})
    assert inbox.get() is None
    inbox.close()


def test_a_prestarted_worker_whose_job_never_comes_is_killed():
    from hybridnb.processes.child import prestart_spawn

    early = prestart_spawn(preload=())
    pid = early.child.pid
    early.close()
    assert _gone(pid)
    with pytest.raises(RuntimeError, match="already given its job or closed"):
        early.send(print)


def test_the_start_grace_covers_a_slow_start_and_ends_at_ready():
    """Silence before the first message is allowed up to ``start_grace`` (an interpreter that
    imports torch); after "ready" the ordinary limit applies and names the phase."""
    def slow_then_hang(channel):
        channel.heartbeat(phase="setup")
        time.sleep(600)

    from hybridnb.processes.child import prestart_spawn

    early = prestart_spawn(preload=())
    out = supervise(lambda: early.send(slow_then_hang), silence=1.0, start_grace=30)
    assert out.status == "hung" and out.phase == "setup" and out.limit_name == "silence_limit"
    silent = supervise(lambda: start_command([sys.executable, "-c", "import time; "
                                              "time.sleep(600)"]), silence=0.5, start_grace=1.5)
    assert silent.status == "hung" and silent.limit_name == "start_grace"


# ------------------------------------------------------------------ fork, commands, run_isolated

def test_run_isolated_spawn_start_keeps_its_outcome_fields():
    def steps(channel):
        for _ in range(3):
            channel.step_done()
        channel.state({"step": 3})
        channel.heartbeat(phase="checkpoint")
        time.sleep(600)

    out = run_isolated(steps, start="spawn", step_timeout=1.0)
    assert out.status == "hung" and out.phase == "checkpoint" and out.state == {"step": 3}
    assert (out.limit_name, out.steps) == ("step_timeout", 3)
    with pytest.raises(ValueError, match="start='thread'"):
        run_isolated(steps, start="thread")


def test_a_forked_child_and_a_command_end_the_same_way():
    out = supervise(lambda: start_fork(lambda channel: os._exit(4)), silence=30)
    assert out.status == Ending.DIED and "exited with code 4" in out.reason
    cmd = supervise(lambda: start_command([sys.executable, "-c",
                                           "import sys; print('bye'); sys.exit(3)"]),
                    name="the command", silence=30)
    assert cmd.status == Ending.DIED and "exited with code 3" in cmd.reason
    assert "bye" in cmd.output_tail


def test_ended_is_a_string_enum():
    assert Ending.DONE == "done" and Ending("hung") is Ending.HUNG and str(Ending.ERROR) == "error"


def test_only_the_child_module_sends_signals():
    """One module of hybridnb may call os.kill, os.killpg or a Popen's kill."""
    senders = set()
    for path in (ROOT / "hybridnb").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("kill", "killpg"):
                value = node.value
                if isinstance(value, ast.Name) and value.id == "os" or node.attr == "kill":
                    senders.add(path.relative_to(ROOT).as_posix())
    assert senders == {"hybridnb/processes/child.py"}


# ------------------------------------------------------------------ Ctrl-C during start-up

INTERRUPTED_STARTS = r"""
import glob, json, os, signal, sys, threading, time
import psutil, torch
from hybridnb.processes import spare
from hybridnb.processes.child import prestart_spawn, start_fork, start_spawn

def job(channel, t):
    return float(t.sum())

big = torch.ones(1 << 20)  # 4 MiB: it goes through a /dev/shm file

def start(kind, held):
    if kind == "spawn":
        held.append(start_spawn(job, big))
    elif kind == "fork":
        held.append(start_fork(job, big))
    else:
        held.append(prestart_spawn(preload=()))
        held.append(held[-1].send(job, big))

report = []
for kind in ("spawn", "fork", "prestart"):
    t0 = time.perf_counter()
    held = []
    start(kind, held)
    took = time.perf_counter() - t0
    for h in held:
        h.close()
    n = int(sys.argv[1])
    for i in range(n):
        offset = took * 1.2 * i / (n - 1)
        timer = threading.Timer(offset, os.kill, (os.getpid(), signal.SIGINT))
        held, hit = [], False
        try:
            timer.start()
            start(kind, held)
            timer.join()
            time.sleep(0.5)  # the interrupt comes here when it missed the start
        except KeyboardInterrupt:
            hit = len(held) < (2 if kind == "prestart" else 1)
        for h in held:
            h.close()
        spares = {w.child.pid for w in spare.waiting()}  # kept on purpose (warm workers)
        left = [p.pid for p in psutil.Process().children(recursive=True) if p.pid not in spares]
        shm = glob.glob(f"/dev/shm/hybridnb-{os.getpid()}-*")
        report.append({"kind": kind, "offset": offset, "during_start": hit, "left": left,
                       "shm": shm})
print(json.dumps(report))
"""


@pytest.mark.parametrize("warm", ["0", "1"])
def test_ctrl_c_at_any_moment_of_a_start_leaves_no_child_and_no_shared_file(warm):
    """SIGINT at offsets spread over each start (spawn, fork, prestart + send; with warm
    workers on, prestart hands out the spare and send starts the next), measured in the same
    run: a start either returns a child its caller closes, or leaves nothing."""
    done = subprocess.run([sys.executable, "-c", INTERRUPTED_STARTS, "12"], capture_output=True,
                          text=True, timeout=240, cwd=ROOT,
                          env={**os.environ, "HYBRIDNB_WARM_WORKER": warm})
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(report) == 36
    assert [r for r in report if r["left"] or r["shm"]] == []
    hits = {kind: sum(r["during_start"] for r in report if r["kind"] == kind)
            for kind in ("spawn", "fork", "prestart")}
    assert all(hits.values()), hits  # some interrupts did land inside each kind of start
