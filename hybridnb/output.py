"""What a child process prints (a training rank, an isolated worker): decoded as it arrives,
UTF-8 characters split across reads included, and its last lines kept for an error message."""

from __future__ import annotations

import codecs
import collections

PARTIAL_CAP = 2000  # characters of an unfinished line kept (a progress bar without newlines)


class OutputLines:
    """The text of one stream. ``lines`` (a bounded deque) may be shared between streams."""

    def __init__(self, lines: collections.deque | None = None, maxlen: int = 120) -> None:
        self._decode = codecs.getincrementaldecoder("utf-8")("replace").decode
        self.lines = lines if lines is not None else collections.deque(maxlen=maxlen)
        self.partial = ""

    def feed(self, data: bytes) -> tuple[str, list[str]]:
        """Decode ``data``: the text, and the lines it completed (a line rewritten with
        carriage returns, like a progress bar, counts by its last state)."""
        text = self._decode(data)
        parts = (self.partial + text).split("\n")
        self.partial = parts.pop()[-PARTIAL_CAP:]
        done = [part.rsplit("\r", 1)[-1] for part in parts]
        self.lines.extend(done)
        return text, done

    def text(self) -> str:
        """The kept lines and the unfinished one."""
        return "".join(line + "\n" for line in self.lines) + self.partial
