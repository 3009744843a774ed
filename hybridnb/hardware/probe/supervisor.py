"""The parent side of the probe: start one child per GPU, watch it, kill it at the deadline.

A flaky card (an unsupported ROCm GPU, a wedged driver) can hang or crash the process that
touches it, so the parent never does. Each child (``probe.child``) runs in a new process group
(``hybridnb.processes``) and writes one JSON line as each step starts and ends, so that when it
hangs the parent knows which step. At the deadline the parent kills the whole group and reaps
it: no orphan, no zombie. The verdict (``ProbeResult``) is built from the steps the child
reported and how the process ended.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time
from pathlib import Path

from hybridnb.hardware.probe.result import STEPS, TITLES, ProbeResult, StepResult
from hybridnb.processes.child import Child as Process
from hybridnb.processes.child import start_command
from hybridnb.processes.ended import Exit

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
            child.end(REAP_S)
    return [child.result(timeout) for child in children]


class Child:
    """One probe process, in its own process group; its JSON lines read as they come."""

    def __init__(self, backend: str, index: int) -> None:
        self.backend, self.index = backend, index
        self.events: list[dict] = []
        self.timed_out = False
        self.started = time.monotonic()
        self.closed_at: float | None = None
        self.seconds = 0.0
        self.proc: Process = start_command(
            [sys.executable, "-m", CHILD_MODULE, "--backend", backend, "--index", str(index)],
            env=child_env())
        self.stdout_fd = next(fd for fd, stream in self.proc.output_fds.items() if stream == 1)
        self._buffer = ""

    def _pump(self, fds: list[int]) -> None:
        for fd in fds:
            if fd not in self.proc.output_fds:
                continue
            got = self.proc.read_output(fd)
            if fd == self.stdout_fd:
                if got is None:
                    self.closed_at = self.closed_at or time.monotonic()
                    continue
                for raw in got[2]:
                    try:
                        self.events.append(json.loads(raw))
                    except ValueError:
                        continue  # a stray line; the protocol lines are JSON objects

    def wait_until(self, deadline: float) -> None:
        """Read its lines until it ends or ``deadline`` passes (then ``timed_out``)."""
        while self.proc.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                self.timed_out = True
                return
            fds = self.proc.wait_fds()
            self._pump(select.select(fds, [], [], min(left, 0.1))[0])
        self._pump(list(self.proc.output_fds))

    def end(self, reap_s: float) -> None:
        """Kill its process group (helpers it started too) if it still runs, reap it, and read
        what it wrote. A child stuck in a driver call cannot die until the call returns; it is
        then reaped later, and the report says so."""
        self.proc.kill_group(reap_s)
        self._pump(list(self.proc.output_fds))
        self.seconds = (self.closed_at or time.monotonic()) - self.started

    @property
    def returncode(self) -> int | None:
        """As Popen says it (minus the signal), None when it could not be reaped."""
        return self.proc.exit.returncode if self.proc.reaped and self.proc.exit else None

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
        rc = self.returncode
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
        self.proc.close()
        return res

    def _stderr_tail(self, limit: int = 400) -> str:
        """Its last lines that were not protocol lines (stderr: the protocol owns stdout)."""
        lines = [ln for ln in self.proc.tail if ln.strip() and not ln.startswith('{"e"')]
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
        return Exit.from_returncode(rc).says()
    return f"exit code {rc} before finishing"


def child_env() -> dict[str, str]:
    """The caller's environment, plus the path that holds this package (a notebook may have
    added it to sys.path only) and unbuffered output."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env

