"""A warm worker (hybridnb.processes.spare): after one job, the next prestart_spawn gets a worker
that was ready before it was asked for; a spare never outlives its parent process."""

from __future__ import annotations

import select
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hybridnb.processes import spare, supervise
from hybridnb.processes.child import prestart_spawn

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def warm(monkeypatch):
    monkeypatch.setenv("HYBRIDNB_WARM_WORKER", "1")
    yield
    spare.close_all()
    children = psutil.Process().children(recursive=True)
    assert children == [], f"processes left behind: {children}"


def job(channel, x):
    from hybridnb.processes.worker import startup

    return {"x": x, **startup()}


def _wait_ready(early, within: float = 120.0) -> None:
    """Until the spare has said "ready" (its message waits, unread, in its pipe)."""
    readable, _, _ = select.select([early.child.messages.fd], [], [], within)
    assert readable, "the spare never said it was ready"


def test_the_second_request_gets_a_worker_that_was_ready_before_it_was_asked_for():
    first = prestart_spawn(preload=("json",))
    out = supervise(lambda: first.send(job, 1), silence=60, start_grace=60)
    assert out.ok and out.result["x"] == 1
    assert spare.waiting() == []  # no spare competes with a job for the CPU
    first.start_next()  # the job is over
    [waiting] = spare.waiting()
    _wait_ready(waiting)
    asked = time.monotonic()
    second = prestart_spawn(preload=("json",))
    assert second is waiting
    out = supervise(lambda: second.send(job, 2), silence=60, start_grace=60)
    assert out.ok and out.result["x"] == 2
    second.start_next()
    assert out.result["spawned_at"] < out.result["ready_at"] < asked < out.result["job_at"]
    assert len(spare.waiting()) == 1 and spare.waiting()[0] is not second  # the next one


def test_a_dead_spare_is_replaced_not_handed_out():
    first = prestart_spawn(preload=())
    supervise(lambda: first.send(job, 1), silence=60, start_grace=60)
    first.start_next()
    [dead] = spare.waiting()
    dead.child.kill_group()
    second = prestart_spawn(preload=())
    assert second is not dead and spare.waiting() == []
    out = supervise(lambda: second.send(job, 2), silence=60, start_grace=60)
    assert out.ok and out.result["x"] == 2


def test_warm_workers_off_keep_no_spare(monkeypatch):
    monkeypatch.setenv("HYBRIDNB_WARM_WORKER", "0")
    first = prestart_spawn(preload=())
    out = supervise(lambda: first.send(job, 1), silence=60, start_grace=60)
    first.start_next()
    assert out.ok and spare.waiting() == []


PARENT = r"""
import os, select, sys
from hybridnb.processes import spare, supervise
from hybridnb.processes.child import prestart_spawn

def job(channel):
    return 1

early = prestart_spawn(preload=("json",))
supervise(lambda: early.send(job), silence=60, start_grace=60)
early.start_next()
[waiting] = spare.waiting()
select.select([waiting.child.messages.fd], [], [], 120)
print(waiting.child.pid, flush=True)
if sys.argv[1] == "killed":
    os._exit(0)  # no atexit: the spare must see its parent die
"""


@pytest.mark.parametrize("ending", ["exit", "killed"])
def test_a_spare_is_gone_when_its_parent_process_ends(ending):
    done = subprocess.run([sys.executable, "-c", PARENT, ending], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**__import__("os").environ,
                                                      "HYBRIDNB_WARM_WORKER": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 10
    while psutil.pid_exists(pid) and time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    alive = psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    assert not alive
