"""The one supervisor: several children in one Watch, and the stop flag's reason."""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil
import pytest

from hybridnb import platform
from hybridnb.processes import Ending, start_command, start_fork, supervise
from hybridnb.processes.channel import StopFlag
from hybridnb.processes.supervise import Watch


def _until_stopped(channel):
    """Steps until asked to stop; returns why it was asked."""
    n = 0
    while channel.stop_reason() is None:
        n += 1
        channel.step_done()
        time.sleep(0.01)
    return {"reason": channel.stop_reason(), "steps": n}


def test_the_stop_flag_says_why_and_an_interrupt_is_never_downgraded():
    flag = StopFlag()
    assert flag.reason() is None
    flag.set("stop")
    assert flag.reason() == "stop"
    flag.set("interrupt")
    flag.set("stop")
    assert flag.reason() == "interrupt"
    with pytest.raises(ValueError, match="'click'"):
        flag.set("click")
    flag.close()


def test_a_stop_callback_reaches_the_child_as_stop():
    steps = []
    out = supervise(lambda: start_fork(_until_stopped), silence=30, poll=0.02,
                    on_message=lambda m: steps.append(m) if m.kind == "step_done" else None,
                    should_stop=lambda: len(steps) >= 3)
    assert out.ok, out.reason
    assert out.result["reason"] == "stop"
    assert out.result["steps"] >= 3 and out.result["reason"] == "stop" and not out.interrupted


def test_sigint_in_the_parent_reaches_the_child_as_interrupt(capsys):
    """The note on the interrupt goes where a run's notices go (an isolated fit: its bus)."""
    sent: list[int] = []
    heard: list[str] = []

    def on(m):
        if m.kind == "step_done" and not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the kernel, from outside

    before = signal.getsignal(signal.SIGINT)
    with platform.notices_to(heard.append):
        out = supervise(lambda: start_fork(_until_stopped), silence=30, on_message=on)
    assert out.ok and out.interrupted and out.result["reason"] == "interrupt"
    assert signal.getsignal(signal.SIGINT) is before
    assert signal.getsignal(signal.SIGTERM) is not None
    assert [n for n in heard if "interrupt again to kill it" in n] == heard != []
    assert "interrupt" not in capsys.readouterr().err


def test_one_watch_holds_children_with_their_own_limits_and_endings():
    """Three children at once: one finishes, one hangs past its silence limit, one dies; each
    outcome is its own, and the hung one does not hold the others back."""
    def finishes(channel):
        channel.step_done()
        return "fine"

    def hangs(channel):
        channel.heartbeat(phase="validation")
        time.sleep(600)

    t0 = time.monotonic()
    with Watch() as watch:
        ok = watch.start(lambda: start_fork(finishes), name="a", silence=30)
        hung = watch.start(lambda: start_fork(hangs), name="b", silence=1.0)
        died = watch.start(lambda: start_command([sys.executable, "-c", "import os; "
                                                  "os.abort()"]), name="c", silence=30)
        watch.run()
    assert time.monotonic() - t0 < 25
    assert ok.outcome.status == Ending.DONE and ok.outcome.result == "fine"
    assert hung.outcome.status == Ending.HUNG and hung.outcome.phase == "validation"
    assert died.outcome.status == Ending.DIED and died.child.exit.signal == "SIGABRT"
    assert psutil.Process().children(recursive=True) == []


def test_an_exception_in_a_watch_kills_every_child():
    def sleeps(channel):
        time.sleep(600)

    with pytest.raises(RuntimeError, match="boom"), Watch() as watch:
        pids = [watch.start(lambda: start_fork(sleeps)).child.pid for _ in range(2)]
        raise RuntimeError("boom")
    assert all(not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
               for pid in pids)
    assert psutil.Process().children(recursive=True) == []


def test_the_outcome_times_the_child_not_the_closing_of_it(monkeypatch):
    """A child stuck in a driver call can take seconds to reap at close: the silence and the
    time the outcome reports (shown as "silent for N s", "probe TIMEOUT in N s") stop when the
    child was ended, not when its pipes were closed."""
    from hybridnb.processes.child import Child

    close = Child.close

    def slow_close(self, *args, **kwargs):
        time.sleep(4.0)
        return close(self, *args, **kwargs)

    def hangs(channel):
        time.sleep(600)

    monkeypatch.setattr(Child, "close", slow_close)
    out = supervise(lambda: start_fork(hangs), silence=0.5)
    assert out.status == Ending.HUNG
    assert out.silent_s < 3.5, out.reason  # 4 s if the closing were counted
