"""A command (``python -m MODULE ...``) that talks to its parent in the channel's frames.

The GPU probe, a compare() variant and the spawned worker run as fresh interpreters started by
``start_framed``: their own process group, a message pipe (the child's ``Channel``), a stop flag
and, with ``requests=True``, a request pipe the parent writes (``Requests``), all named by one
WIRING argument that ``connect``/``wiring`` take apart in the child. So every child of hybridnb
speaks one framing, dies with its parent and is watched by the one loop (``supervise.Watch``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from hybridnb import platform
from hybridnb.env import environment
from hybridnb.processes import lifeline
from hybridnb.processes.channel import (
    Channel,
    FrameReader,
    Inbox,
    StopFlag,
    encode,
    widen_pipe,
    write_all,
)
from hybridnb.processes.child import Child, close_fds, new_pipe, start_command

NONE = "-"  # no request pipe, in WIRING


def child_environment() -> dict[str, str]:
    """This process's environment, with hybridnb's folder and ``sys.path`` on ``PYTHONPATH`` (a
    notebook may have added them to sys.path only), and unbuffered output."""
    environ = environment()
    package_root = str(Path(__file__).resolve().parents[2])
    environ["PYTHONPATH"] = os.pathsep.join(
        [package_root] + [p for p in sys.path if p] + [environ.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    environ["PYTHONUNBUFFERED"] = "1"
    return environ



class Requests:
    """The parent's end of a child's request pipe."""

    def __init__(self, fd: int) -> None:
        self.fd: int | None = fd

    def send(self, kind: str, payload=None) -> None:
        """Write one request (blocks while the pipe is full; OSError once the child is gone)."""
        if self.fd is None:
            raise BrokenPipeError("the request pipe is closed")
        write_all(self.fd, encode(kind, payload)[0])

    def close(self) -> None:
        if self.fd is not None:
            close_fds([self.fd])
            self.fd = None


def start_framed(module: str, *args: str, environ: dict[str, str] | None = None,
                 requests: bool = False, merge_output: bool = False
                 ) -> tuple[Child, Requests | None]:
    """Start ``python -m module WIRING *args``; the ``Child`` has ``messages`` and ``stop`` like
    a spawned one. ``environ``: its whole environment (default ``child_environment()``)."""
    made: list[int] = []
    stop: StopFlag | None = None
    try:
        msg_r, msg_w = new_pipe(made)
        widen_pipe(msg_w)
        req_r, req_w = new_pipe(made) if requests else (None, None)
        stop = StopFlag(shareable=True)
        fds = ",".join(str(x) for x in (msg_w, stop.fd, NONE if req_r is None else req_r,
                                        lifeline.wiring()))
        child = start_command([sys.executable, "-m", module, fds, *args],
                              env=child_environment() if environ is None else environ,
                              merge_output=merge_output,
                              pass_fds=[fd for fd in (msg_w, stop.fd, req_r, lifeline.read_end())
                                        if fd is not None])
    except BaseException:  # cleanup, then re-raised
        close_fds(made)
        if stop is not None:
            stop.close()
        raise
    close_fds([fd for fd in (msg_w, req_r) if fd is not None])
    child.messages, child.stop = FrameReader(msg_r), stop
    return child, (Requests(req_w) if req_w is not None else None)


def wiring(argv: Sequence[str], death_signal: int = platform.KILL
           ) -> tuple[Channel, int | None, list[str]]:
    """In the child: the channel, the request pipe's descriptor (None without requests) and
    the arguments after WIRING. It gets ``death_signal`` when its parent dies, and exits at
    once if the parent is already gone."""
    if not argv or argv[0].count(",") != 3:
        raise SystemExit("this module is started by hybridnb (processes.framed.start_framed), "
                         "not by hand")
    msg_fd, stop_fd, req_fd, parent = argv[0].split(",")
    lifeline.hold(parent, death_signal)
    channel = Channel(int(msg_fd), StopFlag(fd=int(stop_fd)))
    return channel, None if req_fd == NONE else int(req_fd), list(argv[1:])


def connect(argv: Sequence[str]) -> tuple[Channel, Inbox | None, list[str]]:
    """In the child: as ``wiring``, with the inbox of its requests (None without)."""
    channel, req_fd, rest = wiring(argv)
    return channel, None if req_fd is None else Inbox(req_fd), rest
