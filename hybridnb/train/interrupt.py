"""Ctrl-C (or a notebook's interrupt button) during training, handled between steps.

The first interrupt only asks the run to stop: the step in progress finishes, the Trainer saves a
checkpoint and returns. A second interrupt while a forward/backward runs stops it at once (the
step is dropped, nothing was updated yet). During the optimizer update interrupts are held back,
so the model is never left half-updated.
"""

from __future__ import annotations

import contextlib
import signal

from hybridnb.train.state import Stop


class GracefulInterrupt:
    """Context manager installing the SIGINT handler (main thread only; elsewhere a
    KeyboardInterrupt arrives as usual and the Trainer handles it)."""

    def __init__(self) -> None:
        self.requested = False
        self._updating = False
        self._previous = None

    def __enter__(self) -> GracefulInterrupt:
        with contextlib.suppress(ValueError):  # not the main thread (or an embedded interpreter)
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None  # a second exit must not put back a handler that is gone

    def _handle(self, signum, frame) -> None:
        if self.requested and not self._updating:
            raise KeyboardInterrupt
        self.requested = True

    @contextlib.contextmanager
    def updating(self):
        """Hold interrupts back while the optimizer updates the weights."""
        self._updating = True
        try:
            yield
        finally:
            self._updating = False


def stop_asked(loop) -> Stop | None:
    """Whether a stop was asked of ``loop``, and how: Ctrl-C (here, or the kernel's when in a
    worker), a callback's ``trainer.should_stop`` (``loop.stop_flag()``) or the Stop button."""
    if loop.interrupt is not None and loop.interrupt.requested:
        return Stop.INTERRUPT
    if loop.stop_flag():
        return Stop.CALLBACK
    if loop.heartbeat.channel is not None:
        return loop.heartbeat.stop_asked()
    return Stop.STOP_BUTTON if loop.progress.view.stop_requested else None


def agreed_stop(asked: Stop | None, strategy) -> Stop | None:
    """The stop asked on any rank, the same on every rank (summed over them)."""
    reasons = (Stop.INTERRUPT, Stop.STOP_BUTTON, Stop.CALLBACK)
    votes = strategy.sum([float(asked is reason) for reason in reasons])
    return next((reason for reason, vote in zip(reasons, votes, strict=True) if vote), None)


# who asked for the stop, in words (a worker hears the kernel's reason too)
STOP_WORDS = {Stop.STOP_BUTTON: "Stop clicked", Stop.INTERRUPT: "interrupted",
              Stop.CALLBACK: "a callback set trainer.should_stop"}
