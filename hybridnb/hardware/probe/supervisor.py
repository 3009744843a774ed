"""The parent side of the probe: start one child per GPU, watch it, kill it at the deadline.

A flaky card (an unsupported ROCm GPU, a wedged driver) can hang or crash the process that
touches it, so the parent never does. Each child (``probe.child``) runs in a new process group
and writes one JSON line as each step starts and ends, so that when it hangs the parent knows
which step. At the deadline the parent kills the whole group and reaps it: no orphan, no zombie.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from hybridnb.hardware.probe.result import STEPS, TITLES, ProbeResult, StepResult

DEFAULT_TIMEOUT = 15.0    # seconds all probes together may take (detect()'s probe_timeout)
REAP_S = 0.5              # after the deadline: time to collect killed children
CHILD_MODULE = "hybridnb.hardware.probe"


def run_probes(targets: list[tuple[str, int]], timeout: float) -> list[ProbeResult]:
    """Probe each (backend, index) in its own child, all at once, sharing one deadline.

    Returns within ``timeout`` plus at most ``REAP_S`` whatever the children do; children still
    running then are killed with their process groups and reaped, also when this call is
    interrupted (KeyboardInterrupt in a notebook).
    """
    deadline = time.monotonic() + timeout
    children: list[Child] = []
    try:
        children.extend(Child(backend, index) for backend, index in targets)
        for child in children:
            child.wait_until(deadline)
    finally:
        for child in children:
            if child.proc.returncode is None:
                child.kill_group()
        reap_by = time.monotonic() + REAP_S
        for child in children:
            child.reap(reap_by)
    return [child.result(timeout) for child in children]


class Child:
    """One probe process: started in its own process group, read line by line by a thread."""

    def __init__(self, backend: str, index: int) -> None:
        self.backend, self.index = backend, index
        self.events: list[dict] = []
        self.timed_out = False
        self.closed_at: float | None = None
        self.started = time.monotonic()
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", CHILD_MODULE, "--backend", backend, "--index", str(index)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.stderr,
            env=child_env(), **_new_group())
        self.reader = threading.Thread(target=self._read, name=f"probe-{index}", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                self.events.append(json.loads(raw))
            except ValueError:
                continue  # a stray line; the protocol lines are JSON objects
        self.closed_at = time.monotonic()  # the child exited (or was killed)

    def wait_until(self, deadline: float) -> None:
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.timed_out = True

    def kill_group(self) -> None:
        """SIGKILL the child's whole process group (helpers it started too)."""
        try:
            if os.name == "posix":
                os.killpg(self.proc.pid, signal.SIGKILL)
            else:
                self.proc.kill()
        except (ProcessLookupError, PermissionError):
            pass

    def reap(self, by: float) -> None:
        """Collect the exit status (no zombie) and the last output lines, waiting until ``by``.

        A child stuck in a driver call cannot die until the call returns; it is then left to
        subprocess's own later reaping, and the report says so.
        """
        try:
            self.proc.wait(timeout=max(0.0, by - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        self.reader.join(timeout=max(0.0, by - time.monotonic()))
        self.seconds = (self.closed_at or time.monotonic()) - self.started
        if self.proc.stdout is not None and not self.reader.is_alive():
            self.proc.stdout.close()  # (a reader still blocked means a helper escaped the group)

    def result(self, timeout: float) -> ProbeResult:
        steps = {name: StepResult(name, "not run") for name in STEPS}
        current, info, failure, ended = None, {}, None, False
        for ev in list(self.events):
            kind, name = ev.get("e"), ev.get("step")
            if kind == "start" and name in steps:
                current = name
            elif kind == "ok" and name in steps:
                steps[name] = StepResult(name, "ok", ev.get("s"), ev.get("detail", ""))
                current = None
            elif kind == "fail" and name in steps:
                status = "wrong" if ev.get("wrong") else "failed"
                steps[name] = StepResult(name, status, ev.get("s"), ev.get("error", ""))
                failure, current = (name, status, ev.get("error", "")), None
            elif kind == "info":
                info.update(ev.get("info", {}))
            elif kind == "end":
                ended = True
        rc = self.proc.returncode
        res = ProbeResult(self.backend, self.index, "passed", list(steps.values()),
                          round(self.seconds, 3), info=info, returncode=rc,
                          proven_at=round(time.time(), 3))
        where = current or _next_step(steps)
        if ended and (self.timed_out or rc != 0):  # every step passed; only the exit went wrong
            res.message = ("every step passed, but the probe process " + (
                "did not exit in time and was killed" if self.timed_out else
                f"ended with {_exit_reason(rc).replace(' before finishing', '')}")
                + " while shutting down (a driver teardown problem; training may still work)")
        elif self.timed_out:
            res.verdict, res.failed_step = "hung", where
            steps[where].status, steps[where].detail = "hung", f"no answer within {timeout:g} s"
            since = _started_at(self.events, where)
            res.message = (f"hung at step '{TITLES[where]}' (no answer for {timeout:g} s"
                           + (f", {since:.1f} s in that step" if since is not None else "")
                           + "); the probe process was killed")
            if rc is None:
                res.message += " but could not be reaped (stuck in the driver?)"
        elif failure is not None:
            name, status, error = failure
            res.verdict = "wrong result" if status == "wrong" else "failed"
            res.failed_step = name
            first = (error.strip().splitlines() or [""])[0]
            res.message = f"{'wrong result' if status == 'wrong' else 'failed'} at step " \
                          f"'{TITLES[name]}': {first}"
        elif not ended or rc != 0:
            res.verdict, res.failed_step = "crashed", where
            why = _exit_reason(rc)
            tail = self._stderr_tail()
            steps[where].status, steps[where].detail = "crashed", why
            at = f"at step '{TITLES[where]}'" if self.events else "before its first step"
            res.message = f"crashed {at} ({why})" + (f": {tail}" if tail else "")
        res.steps = list(steps.values())
        self.stderr.close()
        return res

    def _stderr_tail(self, limit: int = 400) -> str:
        try:
            self.stderr.seek(0)
            text = self.stderr.read().decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""
        lines = [ln for ln in text.splitlines() if ln.strip()]
        return " | ".join(lines[-3:])[-limit:]


def _next_step(steps: dict[str, StepResult]) -> str:
    return next((n for n in STEPS if steps[n].status == "not run"), STEPS[-1])


def _started_at(events: list[dict], step: str) -> float | None:
    t0 = next((ev.get("t") for ev in events if ev.get("e") == "start" and ev.get("step") == step),
              None)
    return None if t0 is None else max(0.0, time.time() - t0)


def _exit_reason(rc: int | None) -> str:
    if rc is None:
        return "did not exit"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc} before finishing"


def child_env() -> dict[str, str]:
    """The caller's environment, plus the path that holds this package (a notebook may have
    added it to sys.path only) and unbuffered output."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _new_group() -> dict:
    if os.name == "posix":
        return {"start_new_session": True}
    return {"creationflags": getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)}
