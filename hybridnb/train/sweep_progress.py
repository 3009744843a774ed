"""lr_find's progress in text: a line as the sweep starts (the device and the speedups it runs
with), one after its first step, then about every tenth of the sweep (and at least every
``every_s`` seconds), and one at its end; on a terminal (a TTY) one line redrawn instead.

Where it goes follows the fit's view settings: ``live`` set (a view): stdout, which a notebook
shows under the cell; ``live=False`` with ``verbose=True``: stderr, as the fit's notes; with
``verbose=False`` too: nothing.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from hybridnb.live import fmt


class SweepProgress:
    """Progress lines of one lr_find sweep of at most ``total`` steps."""

    def __init__(self, live, verbose: bool, total: int, stream: TextIO | None = None,
                 every_s: float = 10.0) -> None:
        self.total, self.every_s = total, every_s
        self.stream = stream if stream is not None else (
            sys.stdout if live not in (False, None) else sys.stderr if verbose else None)
        self.every = max(1, total // 10)
        self.started = self.last = time.perf_counter()
        self.lines: list[str] = []  # what was shown (the tests read it)
        self._partial = 0

    @property
    def tty(self) -> bool:
        try:
            return bool(self.stream.isatty())
        except (AttributeError, ValueError):
            return False

    def say(self, text: str) -> None:
        """A whole line (the start, the end)."""
        self._write("lr_find: " + text, final=True)

    def step(self, i: int, lr: float, loss: float) -> None:
        """Step ``i`` (from 1) done at ``lr`` with the smoothed ``loss``."""
        now = time.perf_counter()
        if not (i == 1 or i % self.every == 0 or now - self.last >= self.every_s or self.tty):
            return
        self.last = now
        elapsed = now - self.started
        left = elapsed / i * (self.total - i)
        self._write(f"lr_find: step {i}/{self.total} · lr {fmt.lr(lr)} · loss "
                    f"{fmt.number(loss)} · {fmt.duration(elapsed)} elapsed · "
                    f"~{fmt.duration(left)} left (at most)", final=False)

    def _write(self, line: str, final: bool) -> None:
        self.lines.append(line)
        out = self.stream
        if out is None:
            return
        if self.tty and not final:
            out.write("\r" + line.ljust(self._partial))
            self._partial = len(line)
        else:
            if self._partial:
                out.write("\n")
                self._partial = 0
            out.write(line + "\n")
        out.flush()
