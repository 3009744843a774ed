"""Ctrl-C (or a notebook's interrupt button) during training, handled between steps.

The first interrupt only asks the run to stop: the step in progress finishes, the Trainer saves a
checkpoint and returns. A second interrupt while a forward/backward runs stops it at once (the
step is dropped, nothing was updated yet). During the optimizer update interrupts are held back,
so the model is never left half-updated.
"""

from __future__ import annotations

import contextlib
import signal
import threading


class GracefulInterrupt:
    """Context manager installing the SIGINT handler (main thread only; elsewhere a
    KeyboardInterrupt arrives as usual and the Trainer handles it)."""

    def __init__(self) -> None:
        self.requested = False
        self._updating = False
        self._previous = None

    def __enter__(self) -> GracefulInterrupt:
        if threading.current_thread() is threading.main_thread():
            try:
                self._previous = signal.signal(signal.SIGINT, self._handle)
            except ValueError:  # e.g. an embedded interpreter refusing handlers
                self._previous = None
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

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
