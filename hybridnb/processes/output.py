"""What a child process prints (a training rank, an isolated worker, a compare() variant):
decoded as it arrives, UTF-8 characters split across reads included, its last lines kept for an
error message, and the one line that best says why it died (``LastWords``)."""

from __future__ import annotations

import codecs
import collections

PARTIAL_CAP = 2000  # characters of an unfinished line kept (a progress bar without newlines)


class OutputLines:
    """The text of one stream, its completed lines kept in ``lines`` (a bounded deque the
    streams of one child share) and fed to ``last_words``."""

    def __init__(self, lines: collections.deque, last_words: LastWords) -> None:
        self._decode = codecs.getincrementaldecoder("utf-8")("replace").decode
        self.lines, self.last_words = lines, last_words
        self.partial = ""

    def feed(self, data: bytes) -> str:
        """Decode ``data`` (a line redrawn with carriage returns counts by its last state)."""
        text = self._decode(data)
        parts = (self.partial + text).split("\n")
        self.partial = parts.pop()[-PARTIAL_CAP:]
        for line in parts:
            line = line.rsplit("\r", 1)[-1]
            self.lines.append(line)
            self.last_words.feed(line)
        return text


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
