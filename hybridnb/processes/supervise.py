"""The one watch loop for every child of hybridnb (``Watch``; ``supervise``: one child), under
one interrupt policy; nothing is left running when a ``Watch`` closes, whatever raised.

A silence limit bounds *silence*, not a phase: every "step_done" or "heartbeat" restarts the
clock. Interrupts: the handlers for SIGINT, SIGTERM and SIGHUP are in place before any child
starts. The first asks every child to stop (its stop flag says "interrupt"): it finishes its step
and sends its state and result, or is killed after its ``stop_grace``. A second kills every
child. Once they are gone, SIGTERM (or SIGHUP) is delivered again as handled before the watch;
SIGINT too, unless ``keep_interrupt=True``.
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
from typing import Any

from hybridnb import platform
from hybridnb.processes import channel
from hybridnb.processes.channel import Message
from hybridnb.processes.child import REAP_S, Child
from hybridnb.processes.ended import SIGNAL_HINTS, ChildOutcome, Ending, signal_name

STOP_GRACE_S = 30.0     # after an interrupt: time to finish the step and send the result
EXIT_GRACE_S = 10.0     # after "done"/"error": time for the child to exit by itself
# the signals the policy answers: an interrupt, and those that end a process by default
# (SIGTERM: a service manager, ``kill``; SIGHUP, where there is one: the terminal closed)
SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, platform.HANGUP) if s is not None)


@dataclass
class ChildProgress:
    """What the child has said so far; a silence policy reads it."""

    steps: int = 0
    step_seconds: collections.deque = field(default_factory=lambda: collections.deque(maxlen=201))
    phase: str | None = None
    grace: float | None = None            # from the last heartbeat, until the next message
    last_message: float = 0.0             # time.monotonic() of the last step or heartbeat
    last_step: float = 0.0
    started: bool = False                 # it sent something ("ready" or more)

    @property
    def median_step_s(self) -> float | None:
        return statistics.median(self.step_seconds) if self.step_seconds else None


SilenceLimit = Callable[[ChildProgress], tuple[float, str]]


def supervise(start: Callable[[], Child], *, poll: float = 0.1,
              should_stop: Callable[[], bool] | None = None, **limits: Any) -> ChildOutcome:
    """Start one child with ``start()`` and watch it until it ends, an interrupt answered by
    the outcome (``keep_interrupt``). ``limits``: ``Watched``'s keywords."""
    with Watch(poll=poll, should_stop=should_stop, keep_interrupt=True) as watch:
        watched = watch.start(start, **limits)
        watch.run()
    return watched.outcome


class Watched:
    """One child under a ``Watch``: what it said, its limits, and (once ``ended``) its
    ``outcome``. ``child`` stays readable after it ended (``exit``, ``tail``)."""

    def __init__(self, child: Child, *, name: str = "the worker",
                 on_message: Callable[[Message], None] | None = None,
                 silence: SilenceLimit | float | None = None, deadline: float | None = None,
                 stop_grace: float = STOP_GRACE_S, forward_output: bool = True,
                 start_grace: float | None = None, stop_signal: int | None = None,
                 reap_s: float = REAP_S) -> None:
        """``name``: how reasons call it. ``silence``: seconds of silence allowed, or a function
        of ``ChildProgress`` returning (seconds, the rule's name), or None (no limit).
        ``deadline``: seconds the whole run may take. ``stop_grace``: after an interrupt, the
        time it has to stop (0: killed at once). ``forward_output``: copy its output into this
        process's (else only its tail is kept). ``start_grace``: silence allowed before its
        first message (``import torch``), when longer than the limit. ``stop_signal``: also
        sent at an interrupt. ``reap_s``: after SIGKILL, how long to wait for it to go."""
        self.child, self.name, self.on_message, self.silence = child, name, on_message, silence
        self.stop_grace, self.start_grace = stop_grace, start_grace
        self.forward_output, self.stop_signal, self.reap_s = forward_output, stop_signal, reap_s
        self.progress = ChildProgress()
        self.queue: collections.deque[Message] = collections.deque()
        self.state = self.result = self.error = None
        self.got_done = False
        self.stop_reason: str | None = None
        self.finished_at: float | None = None
        self.stop_deadline: float | None = None
        self.stop_wait = 0.0
        self.signal: int | None = None     # the first signal that reached the parent
        self.t0 = self.progress.last_message = self.progress.last_step = time.monotonic()
        self.arm(deadline)
        self.cause: str | None = None
        self.outcome: ChildOutcome | None = None

    @property
    def ended(self) -> bool:
        return self.cause is not None

    def arm(self, seconds: float | None) -> None:
        """Bound the time from now until it ends (None: no bound), e.g. before each request."""
        self.deadline_s = seconds
        self.deadline_at = None if seconds is None else time.monotonic() + seconds

    def note(self, m: Message) -> None:
        now = time.monotonic()
        p = self.progress
        p.started = True
        info = m.payload if isinstance(m.payload, dict) else {}
        if m.kind == channel.STEP_DONE:
            p.steps += 1
            at = info.get("at", now)  # one clock for both
            if p.steps > 1:  # the first one includes start-up
                p.step_seconds.append(at - p.last_step)
            p.last_step, p.last_message, p.grace = at, now, None
        elif m.kind == channel.HEARTBEAT:
            p.last_message = now
            p.grace = float(info["grace"]) if info.get("grace") else None
            if info.get("phase"):
                p.phase = str(info["phase"])
        elif m.kind == channel.STATE:
            self.state = m.payload
        elif m.kind == channel.DONE:
            self.result, self.got_done, self.finished_at = m.payload, True, now
        elif m.kind == channel.ERROR:
            self.error, self.finished_at = m.payload, now  # ``Channel.send_error``'s dict
        else:
            p.last_message = now  # any other message is a sign of life too

    def limit(self) -> tuple[float, str]:
        """Seconds of silence allowed now, and the name of the rule that set them."""
        if self.silence is None:
            limit, name = float("inf"), ""
        elif callable(self.silence):
            limit, name = self.silence(self.progress)
        else:
            limit, name = float(self.silence), "silence_limit"
        grace = self.progress.grace
        if grace is not None and grace > limit:
            limit, name = grace, "the grace the worker asked for"
        if not self.progress.started and (self.start_grace or 0) > limit:
            limit, name = self.start_grace, "start_grace"
        return limit, name

    def limits(self) -> list[tuple[float, str]]:
        """When each of its limits runs out (time.monotonic()), and the cause it gives."""
        if self.finished_at is not None:
            return [(self.finished_at + EXIT_GRACE_S, "finished")]
        limits = [(self.stop_deadline, "stop_timeout"), (self.deadline_at, "deadline"),
                  (self.progress.last_message + self.limit()[0], "silent")]
        return [(at, cause) for at, cause in limits if at is not None]

    def make_outcome(self, now: float) -> ChildOutcome:
        child, p, cause, who = self.child, self.progress, self.cause, self.name
        ex, reader = child.exit, child.messages
        out = ChildOutcome(status=Ending.DIED, reason="", result=self.result, error=self.error,
                           state=self.state, steps=p.steps, median_step_s=p.median_step_s,
                           seconds=now - self.t0, phase=p.phase, interrupted=self.signal is not None,
                           pid=child.pid, output_tail=child.output_text(),
                           last_words=child.last_words.best())
        steps = f"after {p.steps} step{'s' if p.steps != 1 else ''}"
        in_phase = f" in phase '{p.phase}'" if p.phase else ""
        if self.got_done:
            out.status, out.reason = Ending.DONE, f"{who} finished {steps}"
        elif self.error is not None:
            first = (str(self.error.get("message", "")).strip().splitlines() or [""])[0][:200]
            out.status = Ending.ERROR
            out.reason = f"{who} raised {self.error.get('type', '?')} {steps}{in_phase}: {first}"
        elif cause == "silent":
            out.limit_s, out.limit_name = self.limit()
            out.status, out.silent_s = Ending.HUNG, now - p.last_message
            out.reason = (f"{who} was silent for {_secs(out.silent_s)}{in_phase} "
                          f"({out.limit_name}={_secs(out.limit_s)}): no step completed; "
                          f"killed {steps}")
        elif cause == "deadline":
            out.status, out.limit_s, out.limit_name = Ending.TIMEOUT, self.deadline_s, "deadline"
            out.silent_s = now - p.last_message
            out.reason = (f"{who} was still running at its deadline of {_secs(self.deadline_s)}"
                          f"{in_phase} (silent for {_secs(out.silent_s)}); killed {steps}")
        elif cause == "interrupted":
            out.status = Ending.INTERRUPTED
            out.reason = f"interrupted twice: {who} was killed {steps}{in_phase}"
        elif cause == "stop_timeout":
            out.status = Ending.INTERRUPTED
            by = "Ctrl-C" if self.signal in (None, signal.SIGINT) else signal_name(self.signal)
            out.reason = (f"interrupted: {who} had not stopped {_secs(self.stop_wait)} after "
                          f"{by} and was killed {steps}{in_phase}")
        elif cause == "closed":
            out.status = Ending.INTERRUPTED if self.signal is not None else Ending.DIED
            out.reason = f"{who} was still running when its watch closed; killed {steps}"
        else:  # it exited without "done" or "error"
            if ex is not None and ex.how == "signal":
                hint = SIGNAL_HINTS.get(ex.signal or "")
                out.reason = (f"{who} was killed by {ex.signal} {steps}{in_phase}"
                              + (f" ({hint})" if hint else ""))
            else:
                how = ex.says() if ex is not None else "ended"
                out.reason = f"{who} {how} {steps}{in_phase} without sending a result"
            if out.last_words:
                out.reason += f"; its last output: {out.last_words[:200]}"
        if reader is not None and reader.partial and out.status != Ending.DONE:
            out.reason += "; a message it was sending was cut off"
        if child.not_reaped:
            out.reason += f"; {child.not_reaped}"
        return out


class Watch:
    """Children watched by one loop under the module's interrupt policy, from ``__enter__`` to
    ``__exit__`` (which ends every child still there). ``should_stop`` (a Stop button), asked
    every ``poll`` seconds: true sets the stop flags' reason to "stop" (or the word it returns).
    ``interrupt_note``: said at the first interrupt."""

    def __init__(self, *, poll: float = 0.1, should_stop: Callable[[], bool] | None = None,
                 keep_interrupt: bool = False, interrupt_note: str | None = None) -> None:
        self.poll, self.should_stop, self.keep_interrupt = poll, should_stop, keep_interrupt
        self.interrupt_note = interrupt_note
        self.children: list[Watched] = []
        self.signals: list[int] = []       # the signals that reached this process, in order
        self._previous: dict[int, Any] = {}
        self._announced = self._stop_asked = self._delivered = False

    def __enter__(self) -> Watch:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                with contextlib.suppress(ValueError):  # a subinterpreter refuses handlers
                    self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, kind, value, tb) -> None:
        try:
            self.close(deliver=kind is None)  # after an error: no more calls into the caller
        finally:
            for sig, previous in self._previous.items():
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
            self._previous = {}
            if self.signals and not self._delivered:
                self._delivered = True
                ending = [sig for sig in self.signals if sig != signal.SIGINT]
                if ending:
                    signal.raise_signal(ending[0])
                elif not self.keep_interrupt:  # (signals reach a watch in the main thread only)
                    signal.raise_signal(signal.SIGINT)

    def _on_signal(self, signum, frame) -> None:
        self.signals.append(signum)

    def start(self, start: Callable[[], Child], **limits: Any) -> Watched:
        """Start a child with ``start()`` and watch it under ``limits`` (``Watched``'s)."""
        child = start()
        try:
            watched = Watched(child, **limits)
        except BaseException:  # a bad argument: the child must not outlive it
            child.close()
            raise
        self.children.append(watched)
        return watched

    def live(self) -> list[Watched]:
        return [w for w in self.children if not w.ended]

    def run(self, until: Callable[[], bool] | None = None) -> None:
        """Watch every child until all have ended or ``until()`` is true."""
        while True:
            live = self.live()
            if not live or (until is not None and until() and not self.signals):
                break
            now = time.monotonic()
            wait = max(0.0, min([self.poll] + [at - now for w in live for at, _ in w.limits()]))
            try:
                fds = [fd for w in live for fd in w.child.wait_fds()]  # none: a plain sleep
                ready = set(select.select(fds, [], [], wait)[0])
                for w in live:
                    self._read(w, ready)
            except KeyboardInterrupt:  # no handler of ours (it could not be installed)
                self.signals.append(signal.SIGINT)
            self._ask_stop()
            now = time.monotonic()
            for w in live:
                if w.child.poll() is not None:
                    self._read(w, w.child.wait_fds())  # what it wrote before it ended
                    self._end(w, "exited")
                elif len(self.signals) >= 2:
                    self._end(w, "interrupted")
                else:  # the first limit it has passed, if any
                    cause = next((cause for at, cause in w.limits() if now >= at), None)
                    if cause is not None:
                        self._end(w, cause)
        if self.signals and not self.live() and (set(self.signals) - {signal.SIGINT}
                                                 or not self.keep_interrupt):
            self.__exit__(None, None, None)

    def end(self, watched: Watched, deliver: bool = True) -> ChildOutcome:
        """End one child now (killed with its group if still running): its outcome. What it
        sent last goes to its ``on_message`` (``deliver``); if that raises, it ends anyway."""
        if not watched.ended:
            try:
                self._read(watched, watched.child.wait_fds(), deliver)
            finally:
                self._end(watched, "exited" if watched.child.poll() is not None else "closed")
        return watched.outcome

    def close(self, deliver: bool = True) -> None:
        """End every child still running, every one whatever raises."""
        failed: BaseException | None = None
        for w in self.children:
            try:
                self.end(w, deliver)
            except BaseException as exc:  # the others are ended first
                failed = failed or exc
        if failed is not None:
            raise failed

    def _read(self, w: Watched, ready, deliver: bool = True) -> None:
        child = w.child
        reader = child.messages
        if reader is not None and reader.fd in ready and not reader.eof:
            w.queue.extend(reader.read())
        for fd in list(child.output_fds):
            if fd in ready:
                got = child.read_output(fd)
                if got is not None and w.forward_output and got[1]:
                    out = sys.stdout if got[0] == 1 else sys.stderr
                    out.write(got[1])
                    out.flush()
        while w.queue:
            message = w.queue.popleft()
            w.note(message)
            if deliver and w.on_message is not None:
                w.on_message(message)

    def _end(self, w: Watched, cause: str) -> None:
        w.cause = cause
        try:
            w.child.kill_group(w.reap_s)
        finally:
            ended_at = time.monotonic()  # before close: a stuck child's reap is not its time
            w.child.close()  # (its reader keeps what it counted)
            w.outcome = w.make_outcome(ended_at)

    def _ask_stop(self) -> None:
        reason = channel.INTERRUPT if self.signals else None
        if reason is None and self.should_stop is not None and not self._stop_asked:
            asked = self.should_stop()  # True, or the reason as a word ("callback")
            reason = (asked if isinstance(asked, str) else channel.STOP) if asked else None
        if reason is None:
            return
        self._stop_asked = True
        now = time.monotonic()
        for w in self.live():
            if w.stop_reason != reason and w.stop_reason != channel.INTERRUPT:
                w.stop_reason = reason
                if w.child.stop is not None:
                    w.child.stop.set(reason)
                if reason == channel.INTERRUPT and w.stop_signal is not None:
                    w.child.send_signal(w.stop_signal)
            if reason == channel.INTERRUPT:
                w.signal = w.signal or self.signals[0]
                if w.stop_deadline is None and w.finished_at is None:
                    median = w.progress.median_step_s or 0.0
                    w.stop_wait = max(w.stop_grace, 3 * median) if w.stop_grace > 0 else 0.0
                    w.stop_deadline = now + w.stop_wait
        waiting = [w.name for w in self.live() if w.stop_wait > 0]
        if reason == channel.INTERRUPT and not self._announced and (waiting or self.interrupt_note):
            self._announced = True
            one = len(waiting) == 1
            platform.say(self.interrupt_note or (
                f"interrupt: {', '.join(waiting)} {'stops' if one else 'stop'} after the current "
                f"step and {'sends its' if one else 'send their'} state (interrupt again to kill "
                f"{'it' if one else 'them'})"))


def _secs(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
