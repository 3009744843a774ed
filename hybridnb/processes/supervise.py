"""Watch one child until it ends: its messages, its output, heartbeats and a silence limit.

``supervise(start, ...)`` starts the child (``start()`` returns a ``Child``; the Ctrl-C handler
is in place first, so an interrupt can never strand one), passes each message to
``on_message``, copies the child's stdout/stderr into this process's (keeping the tail), and
returns an ``Outcome``. Nothing is left running when it returns or raises (an exception in
``on_message``, a KeyboardInterrupt): the child's process group is killed and reaped.

The silence limit bounds *silence*, not a phase's length: every "step_done" or "heartbeat"
restarts the clock, so a validation of an hour that beats every minute is fine, and a child
silent for longer than the limit is killed; its outcome (``Ended.HUNG``) names the last phase
a heartbeat reported (``{"phase": "validation"}``) and how long it had been silent. A
heartbeat's ``grace`` lengthens the limit until the next message (compiling). ``deadline``
bounds the whole run instead (``Ended.TIMEOUT``).

Ctrl-C while supervising asks the child to stop (``channel.stop_requested()`` turns true): it
finishes its step, sends its state and result; if it has not finished within ``stop_grace``
(or at a second Ctrl-C) it is killed (``Ended.INTERRUPTED``). ``should_stop`` (a Stop button)
sends the same request without a time limit.
"""

from __future__ import annotations

import collections
import contextlib
import select
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hybridnb.processes.channel import DONE, ERROR, HEARTBEAT, READY, STATE, STEP_DONE, Message
from hybridnb.processes.child import Child
from hybridnb.processes.ended import SIGNAL_HINTS, Ended, Outcome

STOP_GRACE_S = 30.0     # after Ctrl-C: time to finish the step and send the result
EXIT_GRACE_S = 10.0     # after "done"/"error": time for the child to exit by itself


@dataclass
class Progress:
    """What the child has said so far; a silence policy reads it."""

    steps: int = 0
    step_seconds: collections.deque = field(default_factory=lambda: collections.deque(maxlen=201))
    phase: str | None = None
    grace: float | None = None            # from the last heartbeat, until the next message
    last_message: float = 0.0             # time.monotonic() of the last step or heartbeat
    last_step: float = 0.0
    started: bool = False                 # it sent something ("ready" or more)
    ready_at: float | None = None         # when it said "ready" (its clock: time.monotonic())

    @property
    def median_step_s(self) -> float | None:
        return statistics.median(self.step_seconds) if self.step_seconds else None


SilenceLimit = Callable[[Progress], tuple[float, str]]


def fixed_silence(seconds: float, name: str = "silence_limit") -> SilenceLimit:
    """A silence limit of ``seconds`` whatever the child did before."""
    return lambda progress: (seconds, name)


def supervise(start: Callable[[], Child], *, name: str = "the worker",
              on_message: Callable[[Message], None] | None = None,
              silence: SilenceLimit | float | None = None, deadline: float | None = None,
              poll: float = 0.1, should_stop: Callable[[], bool] | None = None,
              stop_grace: float = STOP_GRACE_S, exit_grace: float = EXIT_GRACE_S,
              forward_output: bool = True, start_grace: float | None = None) -> Outcome:
    """Start a child with ``start()`` and watch it until it ends; see the module docstring.

    ``name``: how reasons call it ("the worker"). ``silence``: seconds of silence allowed, or a
    function of ``Progress`` returning (seconds, the rule's name), or None (no limit).
    ``deadline``: seconds the whole run may take (None: no bound). ``poll``: how often the child
    and ``should_stop`` are checked when nothing arrives. ``start_grace``: seconds of silence
    allowed before the child's first message (its interpreter starting, ``import torch``: a
    child of ``start_spawn``/``start_fork`` says "ready" first), when longer than the limit."""
    if isinstance(silence, (int, float)):
        silence = fixed_silence(float(silence))
    watch = _Watch(name, on_message, silence, deadline, poll, should_stop, stop_grace,
                   exit_grace, forward_output)
    watch.start_grace = start_grace
    return watch.run(start)


class _Watch:
    def __init__(self, name, on_message, silence, deadline, poll, should_stop, stop_grace,
                 exit_grace, forward_output) -> None:
        self.name, self.on_message, self.silence = name, on_message, silence
        self.deadline_s, self.poll, self.should_stop = deadline, poll, should_stop
        self.stop_grace, self.exit_grace, self.forward_output = stop_grace, exit_grace, forward_output
        self.progress = Progress()
        self.queue: collections.deque[Message] = collections.deque()
        self.interrupts = 0
        self.state = self.state_steps = self.result = self.error = None
        self.got_done = self.stop_sent = False
        self.finished_at: float | None = None
        self.stop_deadline: float | None = None
        self.stop_wait = 0.0
        self.child: Child | None = None
        self.t0 = time.monotonic()
        self.start_grace: float | None = None

    # ---------------------------------------------------------------- start and stop
    def run(self, start: Callable[[], Child]) -> Outcome:
        cause = "exited"
        try:
            with self._sigint():  # before the start: a Ctrl-C can never strand a child
                self.child = start()
                self.t0 = self.progress.last_message = self.progress.last_step = time.monotonic()
                cause = self._loop()
        finally:
            if self.child is not None:
                self.child.kill_group()
                ended_at = time.monotonic()
                self.bytes = self.child.messages.bytes_read if self.child.messages else 0
                self.partial = bool(self.child.messages and self.child.messages.partial)
                self.child.close()
                self.ended_at = ended_at
        return self._outcome(cause)

    @contextlib.contextmanager
    def _sigint(self):
        """Count Ctrl-Cs instead of raising, so no message is torn mid-read (main thread only;
        elsewhere a KeyboardInterrupt is counted where it lands)."""
        previous = None
        if threading.current_thread() is threading.main_thread():
            with contextlib.suppress(ValueError):
                previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            yield
        finally:
            if previous is not None or signal.getsignal(signal.SIGINT) == self._on_sigint:
                signal.signal(signal.SIGINT, previous if previous is not None
                              else signal.default_int_handler)

    def _on_sigint(self, signum, frame) -> None:
        self.interrupts += 1

    # ---------------------------------------------------------------- the loop
    def _loop(self) -> str:
        child = self.child
        while True:
            wait = max(0.0, min(self.poll, self._deadline() - time.monotonic()))
            try:
                ready = select.select(child.wait_fds(), [], [], wait)[0]
                self._read(ready)
                self._deliver()
            except KeyboardInterrupt:  # not the main thread: it lands here
                self.interrupts += 1
            self._watch_stop()
            if child.poll() is not None:
                fds = list(child.output_fds)
                if child.messages is not None:
                    fds.append(child.messages.fd)
                self._read(fds)  # what it wrote before it ended
                self._deliver()
                return "exited"
            now = time.monotonic()
            if self.interrupts >= 2:
                return "interrupted"
            if self.finished_at is not None:
                if now > self.finished_at + self.exit_grace:
                    return "finished"
                continue
            if self.stop_deadline is not None and now > self.stop_deadline:
                return "stop_timeout"
            if self.deadline_s is not None and now > self.t0 + self.deadline_s:
                return "deadline"
            if now > self._deadline():
                return "silent"

    def _read(self, ready: list[int]) -> None:
        child = self.child
        reader = child.messages
        if reader is not None and reader.fd in ready and not reader.eof:
            self.queue.extend(reader.read())
        for fd in ready:
            if fd in child.output_fds:
                got = child.read_output(fd)
                if got is not None and self.forward_output and got[1]:
                    out = sys.stdout if got[0] == 1 else sys.stderr
                    out.write(got[1])
                    out.flush()

    def _deliver(self) -> None:
        while self.queue:
            message = self.queue.popleft()
            self._note(message)
            if self.on_message is not None:
                self.on_message(message)

    def _note(self, m: Message) -> None:
        now = time.monotonic()
        p = self.progress
        p.started = True
        info = m.payload if isinstance(m.payload, dict) else {}
        if m.kind == READY:
            p.last_message, p.ready_at = now, info.get("at", now)
        elif m.kind == STEP_DONE:
            p.steps += 1
            seconds, at = info.get("seconds"), info.get("at")
            at = now if at is None else at  # time.monotonic() is one clock for both processes
            if seconds is None and p.steps > 1:  # the first one includes start-up
                seconds = at - p.last_step
            if seconds is not None:
                p.step_seconds.append(float(seconds))
            p.last_step, p.last_message, p.grace = at, now, None
        elif m.kind == HEARTBEAT:
            p.last_message = now
            p.grace = float(info["grace"]) if info.get("grace") else None
            if info.get("phase"):
                p.phase = str(info["phase"])
        elif m.kind == STATE:
            self.state, self.state_steps = m.payload, p.steps
        elif m.kind in (DONE, ERROR):
            if m.kind == DONE:
                self.result, self.got_done = m.payload, True
            else:
                self.error = m.payload if isinstance(m.payload, dict) else {
                    "type": "?", "message": str(m.payload), "traceback": ""}
            self.finished_at = now

    def _watch_stop(self) -> None:
        asked = self.interrupts > 0
        if not asked and self.should_stop is not None and not self.stop_sent:
            asked = bool(self.should_stop())
        if asked and not self.stop_sent:
            if self.child.stop is not None:
                self.child.stop.set()
            self.stop_sent = True
        if self.interrupts and self.stop_deadline is None and self.finished_at is None:
            median = self.progress.median_step_s or 0.0
            self.stop_wait = max(self.stop_grace, 3 * median)
            self.stop_deadline = time.monotonic() + self.stop_wait
            print(f"hybridnb: interrupt: {self.name} stops after its current step and sends "
                  "its state (interrupt again to kill it)", file=sys.stderr)

    def _limit(self) -> tuple[float, str]:
        """Seconds of silence allowed now, and the name of the rule that set them."""
        if self.silence is None:
            limit, name = float("inf"), ""
        else:
            limit, name = self.silence(self.progress)
        grace = self.progress.grace
        if grace is not None and grace > limit:
            limit, name = grace, "the grace the worker asked for"
        if not self.progress.started and self.start_grace is not None and \
                self.start_grace > limit:
            limit, name = self.start_grace, "start_grace"
        return limit, name

    def _deadline(self) -> float:
        if self.finished_at is not None:
            return self.finished_at + self.exit_grace
        deadline = self.progress.last_message + self._limit()[0]
        if self.stop_deadline is not None:
            deadline = min(deadline, self.stop_deadline)
        if self.deadline_s is not None:
            deadline = min(deadline, self.t0 + self.deadline_s)
        return deadline

    # ---------------------------------------------------------------- the outcome
    def _outcome(self, cause: str) -> Outcome:
        child, p = self.child, self.progress
        now = getattr(self, "ended_at", time.monotonic())
        ex = child.exit if child is not None else None
        exit_text = (child.not_reaped if child is not None and child.not_reaped
                     else str(ex) if ex is not None else "unknown")
        out = Outcome(status=Ended.DIED, reason="", result=self.result, error=self.error,
                      state=self.state, state_steps=self.state_steps, steps=p.steps,
                      median_step_s=p.median_step_s, seconds=now - self.t0, phase=p.phase,
                      exit=exit_text, signal=ex.signal if ex else None,
                      exit_code=ex.code if ex else None, interrupted=self.interrupts > 0,
                      stop_sent=self.stop_sent, bytes_received=getattr(self, "bytes", 0),
                      output_tail=child.output_text() if child else "",
                      last_words=child.last_words.best() if child else "",
                      pid=child.pid if child else None)
        steps = f"after {p.steps} step{'s' if p.steps != 1 else ''}"
        in_phase = f" in phase '{p.phase}'" if p.phase else ""
        who = self.name
        if self.got_done:
            out.status, out.reason = Ended.DONE, f"{who} finished {steps}"
        elif self.error is not None:
            first = (str(self.error.get("message", "")).strip().splitlines() or [""])[0][:200]
            out.status = Ended.ERROR
            out.reason = f"{who} raised {self.error.get('type', '?')} {steps}{in_phase}: {first}"
        elif cause in ("silent", "deadline"):
            limit, rule = self._limit()
            out.silent_s = now - p.last_message
            if cause == "silent":
                out.status, out.limit_s, out.limit_name = Ended.HUNG, limit, rule
                out.reason = (f"{who} was silent for {_secs(out.silent_s)}{in_phase} ({rule}="
                              f"{_secs(limit)}): no step completed; killed {steps}")
            else:
                out.status, out.limit_s, out.limit_name = Ended.TIMEOUT, self.deadline_s, "deadline"
                out.reason = (f"{who} was still running at its deadline of "
                              f"{_secs(self.deadline_s)}{in_phase} (silent for "
                              f"{_secs(out.silent_s)}); killed {steps}")
        elif cause == "interrupted":
            out.status = Ended.INTERRUPTED
            out.reason = f"interrupted twice: {who} was killed {steps}{in_phase}"
        elif cause == "stop_timeout":
            out.status = Ended.INTERRUPTED
            out.reason = (f"interrupted: {who} had not stopped {_secs(self.stop_wait)} after "
                          f"Ctrl-C and was killed {steps}{in_phase}")
        else:  # it exited without "done" or "error"
            out.status = Ended.DIED
            if ex is not None and ex.how == "signal":
                hint = SIGNAL_HINTS.get(ex.signal or "")
                out.reason = (f"{who} was killed by {ex.signal} {steps}{in_phase}"
                              + (f" ({hint})" if hint else ""))
            else:
                out.reason = (f"{who} exited with {exit_text} {steps}{in_phase} without sending "
                              "a result")
            if out.last_words:
                out.reason += f"; its last output: {out.last_words[:200]}"
        if getattr(self, "partial", False) and out.status != Ended.DONE:
            out.reason += "; a message it was sending was cut off"
        return out


def _secs(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


def outcome_of(child: Child, *, name: str = "the child", timed_out: bool = False,
               deadline: float | None = None) -> tuple[Ended, str]:
    """For a child watched by other means (a request with a timeout, a probe's deadline): its
    kind of ending and a sentence, from its exit and its last words. Call after ``kill_group()``."""
    if timed_out:
        return Ended.TIMEOUT, (f"{name} was still running at its deadline"
                               + (f" of {_secs(deadline)}" if deadline is not None else "")
                               + " and its process group was killed")
    ex = child.exit
    if ex is None:
        return Ended.DIED, f"{name} {child.not_reaped or 'ended (how is unknown)'}"
    if ex.how == "code" and ex.number == 0:
        return Ended.DONE, f"{name} exited with code 0"
    words = child.last_words.best()
    return Ended.DIED, f"{name} {ex.says()}" + (f"; its last words: {words}" if words else "")

