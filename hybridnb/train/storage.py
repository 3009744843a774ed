"""Writes that fail mid-run (a full disk, a folder turned read-only, a lost network mount).

A checkpoint or log write that raises ``OSError`` does not end the run: the state stays in memory
(the Trainer's last good snapshot, the logger's pending rows), the file on disk stays the last
good one (writes are atomic or append-only), and the failure is said once as a ``storage`` event
naming the file and the error. Every later write is retried; the first one that works again is
said too, so the events tell exactly which writes were missed.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path


def describe(exc: OSError) -> str:
    """``ENOSPC: No space left on device`` (the errno's name, then the text)."""
    code = errno.errorcode.get(exc.errno, "") if exc.errno is not None else ""
    text = exc.strerror or str(exc) or type(exc).__name__
    return f"{code}: {text}" if code else f"{type(exc).__name__}: {text}"


class StorageGuard:
    """Says a failing write once per file, and its recovery once (``say(kind, message)``)."""

    def __init__(self, say: Callable[[str, str], None] | None = None) -> None:
        self.say = say or (lambda kind, message: None)
        self.failing: dict[Path, int] = {}  # file -> writes missed so far

    def failed(self, path: Path, exc: OSError, kept: str | Callable[[], str]) -> None:
        """A write of ``path`` raised ``exc``; ``kept``: what stays (the file on disk, memory),
        or a function saying it (called only when the failure is said)."""
        path = Path(path)
        missed = self.failing.get(path, 0)
        self.failing[path] = missed + 1
        if missed == 0:
            kept = kept() if callable(kept) else kept
            self.say("storage", f"writing {path} failed ({describe(exc)}); the run continues: "
                     f"{kept}. Every later write is retried (said when one works again)")

    def worked(self, path: Path) -> None:
        missed = self.failing.pop(Path(path), 0)
        if missed:
            self.say("storage", f"writing {path} works again ({missed} write"
                     f"{'s' if missed > 1 else ''} missed before)")
