"""Writes that fail mid-run (a full disk, a folder turned read-only, a lost network mount).

Such a failure does not end the run: the state stays in memory, the file on disk stays the last
good one (writes are atomic or append-only), and the failure is said once as a ``storage`` note
naming the file and the error; every later write is retried and the first that works is said
too. Only ``hybridnb.files.is_write_failure`` errors count; any other exception is raised.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hybridnb.files import describe
from hybridnb.train.bus import Bus


class StorageGuard:
    """Says a failing write once per file, and its recovery once, as ``storage`` notes on
    ``bus`` (set later by an owner that gets its bus later)."""

    def __init__(self, bus: Bus | None = None) -> None:
        self.bus = bus
        self.failing: dict[Path, int] = {}  # file -> writes missed so far

    def say(self, message: str) -> None:
        if self.bus is not None:
            self.bus.note("storage", message)

    def failed(self, path: Path, exc: BaseException, kept: str | Callable[[], str]) -> None:
        """A write of ``path`` raised ``exc``; ``kept``: what stays (the file on disk, memory), or
        a function saying it (called only when the failure is said)."""
        missed = self.failing.get(path, 0)
        self.failing[path] = missed + 1
        if missed == 0:
            kept = kept() if callable(kept) else kept
            self.say(f"writing {path} failed ({describe(exc, path)}); the run "
                     f"continues: {kept}. Every later write is retried (said when one works "
                     "again)")

    def worked(self, path: Path) -> None:
        missed = self.failing.pop(path, 0)
        if missed:
            self.say(f"writing {path} works again ({missed} write"
                     f"{'s' if missed > 1 else ''} missed before)")
