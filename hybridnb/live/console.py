"""Plain-text live view for terminals, CI logs and headless notebook runs (nbclient, nbval).

A line at the start, per epoch and per event, and the summary paragraph at the end. On a TTY one
``\\r`` progress line is redrawn; in a log a heartbeat line every ``heartbeat_s`` instead, so a
slow CPU run still shows progress.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import Any, TextIO

from hybridnb.events import Event
from hybridnb.live import summary as text
from hybridnb.live.base import LiveView


class ConsoleView(LiveView):
    name = "text"

    def __init__(self, note: str = "", stream: TextIO | None = None, tty: bool | None = None,
                 heartbeat_s: float = 60.0, **kwargs: Any):
        super().__init__(note, **kwargs)
        self._stream = stream
        self.tty = tty  # None: asked of the stream when the run starts
        self.heartbeat_s = heartbeat_s
        self._partial = 0  # length of the \r line on screen, 0 when none
        self._last_line = time.monotonic()

    @property
    def out(self) -> TextIO:  # sys.stdout as it is now (a notebook or pytest swaps it)
        return self._stream if self._stream is not None else sys.stdout

    def _line(self, line: str) -> None:
        out = self.out
        if self._partial:
            out.write("\r" + " " * self._partial + "\r")
            self._partial = 0
        out.write(line + "\n")
        out.flush()
        self._last_line = time.monotonic()

    def _open(self, run: dict) -> None:
        if self.tty is None:
            isatty = getattr(self.out, "isatty", None)
            self.tty = bool(isatty and not getattr(self.out, "closed", False) and isatty())
        self._line("hybridnb · " + text.header(run, self.note))

    def _draw_progress(self) -> None:
        rec = self.record
        if self.tty:
            frac = rec.fraction()
            width = shutil.get_terminal_size((100, 20)).columns - 1
            bar = ""
            if frac is not None:
                filled = int(round(20 * frac))
                bar = f"[{'#' * filled}{'-' * (20 - filled)}] {100 * frac:3.0f}% "
            line = (bar + text.status(rec))[:width]
            self.out.write("\r" + line.ljust(self._partial))
            self.out.flush()
            self._partial = len(line)
        elif time.monotonic() - self._last_line >= self.heartbeat_s:
            self._line("  " + text.status(rec, memory=True))

    def _draw_epoch_end(self) -> None:
        self._line(text.status(self.record, memory=True))

    def _draw_event(self, ev: Event) -> None:
        self._line(f"! {ev}")

    def _close(self, summary: dict) -> None:
        self._line(text.paragraph(summary, self.record))
