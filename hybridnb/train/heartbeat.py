"""An isolated worker's link to the kernel: heartbeats naming the phase (a worker lost while
silent is named by the last one), every bus event forwarded as it is, the states it keeps, and
the kernel's stop request with its reason. In the kernel (no channel) every call does nothing.
A longer silence (grace) is asked for only where something needs it (compiling, CUDA starting).
"""

from __future__ import annotations

from hybridnb.env import FIRST_STEP_GRACE_ENV, seconds_from_env
from hybridnb.train.bus import Ended, Started, StateKept, StepEnded
from hybridnb.train.state import Stop

EVENT = "event"  # the channel kind of a forwarded bus event (the kernel emits it again)
FIRST_STEP_GRACE_S = 600.0  # compiling or starting CUDA (unless $HYBRIDNB_FIRST_STEP_GRACE says)


class Heartbeat:
    """The channel to the kernel (None: not in a worker) and the phase announced last."""

    def __init__(self, bus, channel) -> None:
        self.bus, self.channel = bus, channel
        self.phase: str | None = None

    def beat(self, phase: str, grace: float | None = None) -> None:
        """Alive, in ``phase`` (``grace``: seconds of silence allowed until the next step)."""
        if self.channel is not None:
            self.channel.heartbeat(phase=phase, grace=grace)
            self.phase = phase

    def before_step(self, first: bool) -> None:
        """A heartbeat only when the phase changes (a step's completion restarts the clock)."""
        phase = "first step" if first else "step"
        if self.phase != phase:
            self.beat(phase)

    def hear(self, event) -> None:
        """In a worker: every event to the kernel as it is, a kept state as a "state" message."""
        if self.channel is None:
            return
        if isinstance(event, StateKept):
            self.channel.state(event.state)  # saved.state_dict: CPU copies already
            return
        if isinstance(event, StepEnded):
            self.channel.step_done()
        self.channel.send(EVENT, event)
        if isinstance(event, (Started, Ended)) or self.phase == "first step":
            self.channel.flush()  # the view starts, shows the first step and ends at once

    def grace(self, what: str, *, compiling: bool, device_type: str) -> float | None:
        """The longer silence ``what`` needs, said once; None where nothing needs one."""
        why = (["compiling"] if compiling else []) + (
            ["the CUDA context starts"] if device_type == "cuda" else [])
        if self.channel is None or not why:
            return None
        seconds = seconds_from_env(FIRST_STEP_GRACE_ENV, FIRST_STEP_GRACE_S)
        self.bus.note("grace", f"allowing {seconds:.0f} s of silence for {what}: {' and '.join(why)}")
        return seconds

    def stop_asked(self) -> Stop | None:
        """The kernel's stop request and its reason (Ctrl-C, a callback or the Stop button)."""
        reason = self.channel.stop_reason() if self.channel is not None else None
        if reason is None:
            return None
        return Stop(reason) if reason in (Stop.INTERRUPT, Stop.CALLBACK) else Stop.STOP_BUTTON
