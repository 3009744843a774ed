"""How a supervised child ended, as data: ``Ending`` (the kind), ``Exit`` (what the OS said) and
``ChildOutcome`` (everything the parent kept). Nothing here starts or signals a process.
"""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass
from typing import Any

# what a signal usually means when it ends a training process
SIGNAL_HINTS = {
    "SIGKILL": "sent by the Linux out-of-memory killer when RAM runs out, or by a person",
    "SIGABRT": "an abort in native code, e.g. a CUDA error raised in a C++ thread",
    "SIGSEGV": "a crash in native code: the GPU driver or a C++ extension",
    "SIGBUS": "a crash in native code: the GPU driver or a C++ extension",
}


class Ending(str, enum.Enum):
    """The kind of ending (a ``str`` enum: ``outcome.status == "done"`` works)."""

    DONE = "done"                # the child's function returned (``result``); a command exited 0
    ERROR = "error"              # the child's function raised (``error`` has its traceback)
    DIED = "died"                # a signal, or an exit without a result (non-zero for a command)
    HUNG = "hung"                # silent longer than its silence limit: killed
    TIMEOUT = "timeout"          # still running at its deadline (a bound on the whole run): killed
    INTERRUPTED = "interrupted"  # SIGINT/SIGTERM in the parent, and the child did not finish: killed

    def __str__(self) -> str:
        return self.value


def signal_name(number: int) -> str:
    """"SIGABRT" for 6; "signal N" for a number Python does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass(frozen=True)
class Exit:
    """What the OS says about an ended child."""

    how: str     # "code", "signal" or "unknown" (reaped elsewhere)
    number: int  # the exit code or the signal number

    @classmethod
    def from_returncode(cls, rc: int) -> Exit:
        """From a ``Popen.returncode`` (negative: the signal)."""
        return cls("signal", -rc) if rc < 0 else cls("code", rc)

    @property
    def signal(self) -> str | None:
        return signal_name(self.number) if self.how == "signal" else None

    @property
    def code(self) -> int | None:
        return self.number if self.how == "code" else None

    @property
    def returncode(self) -> int | None:
        """As ``Popen.returncode`` says it: the code, or minus the signal number."""
        return -self.number if self.how == "signal" else self.code

    def says(self) -> str:
        """"killed by SIGABRT" / "exited with code 3" / "ended" (reaped elsewhere)."""
        if self.how == "unknown":
            return "ended"
        return f"killed by {self.signal}" if self.signal else f"exited with code {self.code}"


@dataclass
class ChildOutcome:
    """How a supervised child ended, and what the parent kept from it."""

    status: Ending
    reason: str                    # the status in one sentence
    result: Any = None             # what its function returned (DONE)
    error: dict | None = None      # type, message and traceback of what it raised (ERROR)
    state: Any = None              # the last complete "state" message
    steps: int = 0
    median_step_s: float | None = None
    seconds: float = 0.0
    phase: str | None = None       # the last phase a heartbeat named
    silent_s: float | None = None  # silent that long when killed for silence or at its deadline
    limit_s: float | None = None   # the silence limit then, and the rule that set it
    limit_name: str = ""
    interrupted: bool = False      # SIGINT or SIGTERM reached the parent while supervising
    output_tail: str = ""          # its last lines of stdout/stderr
    last_words: str = ""           # the one line that best says why it died
    pid: int | None = None         # also its process group id

    @property
    def ok(self) -> bool:
        return self.status == Ending.DONE

