"""How a supervised child ended, as data: ``Ending`` (the kind), ``Exit`` (what the OS said) and
``ChildOutcome`` (everything the parent kept: result or error, last state, the phase it was in, how
long it had been silent, its last output). Nothing here starts or signals a process.
"""

from __future__ import annotations

import enum
import os
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
    """The kind of ending. A ``str`` enum, so ``outcome.status == "done"`` keeps working."""

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
    """What the OS says about an ended child: ``how`` is "code", "signal" or "unknown" (reaped
    elsewhere), ``number`` the exit code or the signal number."""

    how: str
    number: int

    @classmethod
    def from_status(cls, status: int) -> Exit:
        """From ``os.waitpid``'s status word."""
        if os.WIFSIGNALED(status):
            return cls("signal", os.WTERMSIG(status))
        return cls("code", os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1)

    @classmethod
    def from_returncode(cls, rc: int | None) -> Exit | None:
        """From a ``Popen.returncode`` (negative: the signal)."""
        if rc is None:
            return None
        return cls("signal", -rc) if rc < 0 else cls("code", rc)

    @property
    def returncode(self) -> int | None:
        """As ``Popen.returncode`` would say it: the code, or minus the signal number."""
        if self.how == "signal":
            return -self.number
        return self.number if self.how == "code" else None

    @property
    def signal(self) -> str | None:
        """"SIGKILL" when a signal ended it, else None."""
        return signal_name(self.number) if self.how == "signal" else None

    @property
    def code(self) -> int | None:
        return self.number if self.how == "code" else None

    def __str__(self) -> str:
        if self.how == "signal":
            return f"signal {signal_name(self.number)}"
        return f"code {self.number}" if self.how == "code" else "unknown"

    def says(self) -> str:
        """"killed by SIGABRT" / "exited with code 3" / "ended (reaped elsewhere)"."""
        if self.how == "signal":
            return f"killed by {signal_name(self.number)}"
        return f"exited with code {self.number}" if self.how == "code" else "ended"


@dataclass
class ChildOutcome:
    """How a supervised child ended, and what the parent kept from it.

    ``status``: an ``Ending``. ``reason``: the same in one sentence. ``result``: what the child's
    function returned (DONE). ``error``: type, message and ``traceback`` of what it raised
    (ERROR). ``state``: the last complete "state" message (None if none came), sent after
    ``state_steps`` completed steps. ``phase``: the last phase a heartbeat named (None if none
    did); ``silent_s``: seconds since its last message when it was killed for silence or at its
    deadline; ``limit_s``/``limit_name``: the silence limit that applied then and the rule that
    set it. ``exit``: "code 0", "signal SIGABRT", or "not reaped ..." (stuck in a driver);
    ``signal``/``exit_code``: the same as facts. ``output_tail``: its last lines of
    stdout/stderr; ``last_words``: the one line that best says why it died.
    """

    status: Ending
    reason: str
    result: Any = None
    error: dict | None = None
    state: Any = None
    state_steps: int | None = None
    steps: int = 0
    median_step_s: float | None = None
    seconds: float = 0.0
    phase: str | None = None
    silent_s: float | None = None
    limit_s: float | None = None
    limit_name: str = ""
    exit: str = ""
    signal: str | None = None
    exit_code: int | None = None
    interrupted: bool = False      # SIGINT or SIGTERM reached the parent while supervising
    stop_sent: bool = False        # the child was asked to stop (an interrupt or should_stop)
    bytes_received: int = 0
    output_tail: str = ""
    last_words: str = ""
    pid: int | None = None         # also its process group id

    @property
    def ok(self) -> bool:
        return self.status == Ending.DONE

    @property
    def traceback(self) -> str:
        return (self.error or {}).get("traceback", "")

