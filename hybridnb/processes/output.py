"""The one line of what a child process printed (a training rank, an isolated worker, a compare()
variant) that best says why it died."""

from __future__ import annotations


class LastWords:
    """The line that best says why a child died: the last one naming an error before
    faulthandler's stack dump (a C++ ``what():``, a CUDA message), else the last line."""

    def __init__(self) -> None:
        self.last = self.error = ""
        self._in_dump = False

    def feed(self, line: str) -> None:
        line = line.strip()
        if line.startswith("Fatal Python error"):
            self._in_dump = True
            self.last = self.last or line
        elif line and not self._in_dump and not line.startswith("frame #"):
            self.last = line
            if "error" in line.lower():
                self.error = line

    def best(self, limit: int = 240) -> str:
        return (self.error or self.last)[:limit]
