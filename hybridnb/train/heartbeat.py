"""An isolated worker's link to the kernel: heartbeats naming the phase, step completions, the
stop request, and the grace a slow phase asks for. In the kernel (no channel) every call does
nothing, so the loop calls it unconditionally.

The kernel's silence clock restarts at every heartbeat and step; a worker lost while silent is
named by the last phase it announced. A grace is asked for only where something needs it
(compiling, the CUDA context starting) and is said once, as a "grace" note; elsewhere the step
timeout applies from the first message on. The job's ``hooks`` (tests: fault injection) are told
each phase the worker enters.
"""

from __future__ import annotations

from hybridnb.train import isolate, recovery
from hybridnb.train.bus import StateKept, StepEnded
from hybridnb.train.state import Stop
from hybridnb.train.worker_fit import Hooks


class Heartbeat:
    """The channel to the kernel (None: not in a worker), the job's hooks and the phase."""

    def __init__(self, channel=None, hooks: Hooks | None = None) -> None:
        self.channel = channel
        self.hooks = hooks if hooks is not None else Hooks()
        self.phase: str | None = None

    @property
    def in_worker(self) -> bool:
        return self.channel is not None

    def beat(self, phase: str, grace: float | None = None) -> None:
        """Alive, in ``phase`` (``grace``: seconds of silence allowed until the next step)."""
        if self.channel is not None:
            self.channel.heartbeat(phase=phase, grace=grace)
            self.phase = phase
            self.hooks.enter(phase)

    def before_step(self, first: bool) -> None:
        """The phase is "first step" or "step" (a heartbeat only when it changes: the step's own
        completion restarts the clock)."""
        if self.channel is None:
            return
        phase = "first step" if first else "step"
        if self.phase != phase:
            self.channel.heartbeat(phase=phase)
            self.phase = phase
        self.hooks.enter(phase)

    def hear(self, event) -> None:
        """A listener on the fit's bus (in a worker): each step restarts the kernel's clock and
        each state kept goes to the kernel, which applies it."""
        if self.channel is None:
            return
        if isinstance(event, StepEnded):
            self.channel.step_done()
        elif isinstance(event, StateKept):
            self.channel.state(recovery.to_cpu(event.state))

    def step_done(self) -> None:
        if self.channel is not None:
            self.channel.step_done()

    def grace(self, what: str, *, compiling: bool, device_type: str, note) -> float | None:
        """The longer silence ``what`` needs, said once through ``note(kind, message)``; None
        where nothing needs one (not in a worker, nothing to compile, no CUDA to start)."""
        if self.channel is None:
            return None
        why = (["compiling"] if compiling else []) + (
            ["the CUDA context starts"] if device_type == "cuda" else [])
        if not why:
            return None
        seconds = isolate.first_step_grace_s()
        note("grace", f"allowing {seconds:.0f} s of silence for {what}: {' and '.join(why)}")
        return seconds

    def stop_asked(self) -> Stop | None:
        """The kernel's stop request: Ctrl-C or the Stop button. The channel carries one flag
        for both; its ``stop_reason()`` (where the channel has one) tells them apart, else the
        flag reads as the button."""
        if self.channel is None or not self.channel.stop_requested():
            return None
        reason = getattr(self.channel, "stop_reason", None)
        return Stop.INTERRUPT if callable(reason) and reason() == "interrupt" \
            else Stop.STOP_BUTTON
