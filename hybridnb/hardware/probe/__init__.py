"""Validate a GPU in a child process, step by step, under a hard timeout: here the parent side
(one child per GPU, watched together, killed at the deadline) and its results; ``child`` (the
steps), ``cache`` (passed verdicts on disk).

A flaky card can hang or crash the process that touches it, so the parent never does. Where the
OS cannot supervise a child (``platform.child_pipes()``) the steps run here without the
deadline, and each result says so.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from hybridnb import platform
from hybridnb.hardware.probe import child as probe_child
from hybridnb.hardware.probe.child import EVENT, STEPS, TITLES
from hybridnb.processes.channel import Message
from hybridnb.processes.child import start_framed
from hybridnb.processes.ended import Ending, Exit
from hybridnb.processes.supervise import Watch, Watched

DEFAULT_TIMEOUT = 15.0    # seconds all probes together may take (detect()'s probe_timeout)
REAP_S = 0.5              # after the deadline: time to collect killed children
CHILD_MODULE = "hybridnb.hardware.probe"


@dataclass
class ProbeStep:
    name: str
    status: str              # "ok" | "failed" | "wrong" | "hung" | "crashed" | "not run"
    seconds: float | None = None
    detail: str = ""


@dataclass
class ProbeResult:
    """What one probe child did. ``verdict``: passed | failed | wrong result | hung | crashed.
    ``proven_at``: seconds since the epoch; ``cached``: read from ``probe.cache``."""

    backend: str
    index: int
    verdict: str
    steps: list[ProbeStep]
    seconds: float
    message: str = ""                 # one sentence for the report ("" when passed)
    failed_step: str | None = None
    info: dict = field(default_factory=dict)   # properties the child read from the device
    returncode: int | None = None
    proven_at: float | None = None
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.verdict == "passed"

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}

    @classmethod
    def from_dict(cls, data: dict) -> ProbeResult:
        """The inverse of ``to_dict`` (unknown keys ignored)."""
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["steps"] = [ProbeStep(**s) for s in data.get("steps", [])]
        return cls(**fields)


def run_probes(targets: list[tuple[str, int]], timeout: float) -> list[ProbeResult]:
    """Probe each (backend, index) in its own child, all at once, sharing one deadline:
    returns within ``timeout`` + ``REAP_S`` whatever the children do (also when interrupted)."""
    if not platform.child_pipes():
        return [run_here(backend, index) for backend, index in targets]
    deadline = time.monotonic() + timeout
    events: list[list[dict]] = [[] for _ in targets]
    with Watch() as watch:
        children = [_start(watch, backend, index, got, max(0.0, deadline - time.monotonic()))
                    for (backend, index), got in zip(targets, events, strict=True)]
        watch.run()
    results = []
    for (backend, index), got, watched in zip(targets, events, children, strict=True):
        proc = watched.child  # return code None: the child was not reaped
        rc = proc.exit.returncode if proc.reaped and proc.exit else None
        tail = " | ".join([ln for ln in proc.tail if ln.strip()][-3:])[-400:]
        results.append(verdict(backend, index, got, watched.outcome.seconds,
                               watched.outcome.status == Ending.TIMEOUT, rc, timeout, tail))
    return results


def _start(watch: Watch, backend: str, index: int, events: list[dict], seconds: float
           ) -> Watched:
    def take(message: Message) -> None:
        if message.kind == EVENT and isinstance(message.payload, dict):
            events.append(message.payload)

    argv = ("--backend", backend, "--index", str(index))
    return watch.start(
        lambda: start_framed(CHILD_MODULE, *argv)[0],
        name=f"the probe of {backend}:{index}", on_message=take, deadline=seconds,
        stop_grace=0.0, forward_output=False, reap_s=REAP_S)


def run_here(backend: str, index: int) -> ProbeResult:
    """The probe's steps in this process (no child can be supervised here): a hang or a crash
    is not caught, and the message says so."""
    events: list[dict] = []
    t0 = time.monotonic()
    probe_child.run_steps(backend, index, lambda **event: events.append(event))
    res = verdict(backend, index, events, time.monotonic() - t0, timed_out=False, rc=0,
                  timeout=0.0)
    note = (f"probed in this process, without a time limit: {platform.child_pipes().why}; a GPU "
            "that hangs would hang this process too")
    res.message = f"{res.message}; {note}" if res.message else note
    return res


def verdict(backend: str, index: int, events: list[dict], seconds: float, timed_out: bool,
            rc: int | None, timeout: float, tail: str = "") -> ProbeResult:
    """The result of one probe from the events its child sent and how it ended (``tail``: the
    last lines of its stderr)."""
    steps = {name: ProbeStep(name, "not run") for name in STEPS}
    current, since, info, ended = None, None, {}, False
    for ev in events:
        kind, name = ev.get("e"), ev.get("step")
        if kind == "start" and name in steps:
            current, since = name, ev.get("t")
        elif kind in ("ok", "fail") and name in steps:
            status = "ok" if kind == "ok" else "wrong" if ev.get("wrong") else "failed"
            steps[name] = ProbeStep(name, status, ev.get("s"), ev.get("detail", ""))
            current = None
        elif kind == "info":
            info.update(ev.get("info", {}))
        ended = ended or kind == "end"
    res = ProbeResult(backend, index, "passed", list(steps.values()), round(seconds, 3),
                      info=info, returncode=rc, proven_at=round(time.time(), 3))
    failed = next((s for s in res.steps if s.status in ("failed", "wrong")), None)
    where = current or next((n for n in STEPS if steps[n].status == "not run"), STEPS[-1])
    if ended and (timed_out or rc != 0):  # every step passed; only the exit went wrong
        res.message = ("every step passed, but the probe process " + (
            "did not exit in time and was killed" if timed_out else
            f"ended: {_exit_reason(rc)}")
            + " while shutting down (a driver teardown problem; training may still work)")
    elif timed_out:
        res.verdict, res.failed_step = "hung", where
        steps[where].status, steps[where].detail = "hung", f"no answer within {timeout:g} s"
        res.message = (f"hung at step '{TITLES[where]}' (no answer for {timeout:g} s"
                       + (f", {max(0.0, time.time() - since):.1f} s in that step"
                          if since is not None and current else "")
                       + "); the probe process was killed")
        if rc is None:
            res.message += " but could not be reaped (stuck in the driver?)"
    elif failed is not None:
        res.verdict = "wrong result" if failed.status == "wrong" else "failed"
        res.failed_step = failed.name
        first = (failed.detail.strip().splitlines() or [""])[0]
        res.message = f"{res.verdict} at step '{TITLES[failed.name]}': {first}"
    elif not ended or rc != 0:
        res.verdict, res.failed_step = "crashed", where
        # rc 0 without the end event reads like success: say the probe stopped early
        why = _exit_reason(rc) + (" before finishing" if rc is not None and rc >= 0 else "")
        steps[where].status, steps[where].detail = "crashed", why
        at = f"at step '{TITLES[where]}'" if events else "before its first step"
        res.message = f"crashed {at} ({why})" + (f": {tail}" if tail else "")
    return res


def _exit_reason(rc: int | None) -> str:
    return "did not exit" if rc is None else Exit.from_returncode(rc).says()
