"""A child dies with its parent: ``PR_SET_PDEATHSIG`` on Linux, elsewhere a lifeline pipe whose
write end the parent never writes: each child inherits the read end, and when the OS closes the
write end (the parent died, however) the child's watcher thread delivers the death signal to its
own process. A forked child must ``after_fork()``, or it would keep its own lifeline open.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

from hybridnb import platform

_lock = threading.Lock()
_pipe: tuple[int, int] | None = None
_owner: int | None = None  # the pid that made _pipe (a forked child makes its own)


def read_end() -> int | None:
    """This process's lifeline's read end; None where the kernel's parent-death signal works."""
    global _pipe, _owner
    if platform.parent_death_signal():
        return None
    with _lock:
        if _pipe is None or _owner != os.getpid():
            _pipe, _owner = os.pipe(), os.getpid()  # both ends close-on-exec; pass_fds opens one
        return _pipe[0]


def wiring() -> str:
    """What the child needs, for its argv: "PID", or "PID:FD" with the lifeline's read end."""
    fd = read_end()
    return str(os.getpid()) if fd is None else f"{os.getpid()}:{fd}"


def after_fork() -> None:
    """In a forked child: close the parent's write end (the read end stays, for ``hold``);
    this process makes its own pipe for its children."""
    global _pipe, _owner
    if _pipe is not None and _owner != os.getpid():
        with contextlib.suppress(OSError):
            os.close(_pipe[1])
        _pipe, _owner = None, None


def hold(wiring_text: str, death_signal: int = platform.KILL) -> None:
    """In the child: get ``death_signal`` when the parent in ``wiring_text`` dies; exit at once
    (code 1) if it is already gone."""
    pid_text, _, fd_text = str(wiring_text).partition(":")
    parent = int(pid_text)
    platform.set_parent_death_signal(death_signal)
    if fd_text:
        threading.Thread(target=_watch, args=(int(fd_text), death_signal), daemon=True,
                         name="hybridnb-lifeline").start()
    if os.getppid() != parent:  # the parent died before the death signal could be set
        os._exit(1)


def _watch(fd: int, death_signal: int) -> None:
    """Block on the lifeline until the parent's end closes, then deliver the death signal."""
    with contextlib.suppress(OSError):
        while os.read(fd, 1):
            pass
    with contextlib.suppress(OSError, ValueError):
        signal.raise_signal(death_signal)  # SIGINT: its handler runs in the main thread
    if death_signal != signal.SIGINT:
        os._exit(1)  # a signal that did not end this process
