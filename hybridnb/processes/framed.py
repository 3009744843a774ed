"""A command (``python -m MODULE ...``) that talks to its parent in the channel's frames.

The GPU probe, a compare() variant and the spawned worker are modules run as fresh
interpreters: ``start_framed(module, *args)`` (in ``child``, named here too) starts ``python -m
MODULE WIRING *args`` in its own process group with a message pipe (the child's ``Channel``), a
stop flag and, with ``requests=True``, a request pipe the parent writes (``Requests``). WIRING is
one argument naming the inherited descriptors and the parent's pid. This module is the child's
side: the module passes its argv to ``connect()`` (``wiring()`` for the worker, which reads its
job as raw bytes), which dies with the parent (``processes.lifeline``) and returns the channel,
its requests and the remaining arguments. So every child of hybridnb speaks one framing and is
watched by the one loop (``supervise.Watch``).
"""

from __future__ import annotations

from collections.abc import Sequence

from hybridnb import platform
from hybridnb.processes import lifeline
from hybridnb.processes.channel import Channel, Inbox, StopFlag
from hybridnb.processes.child import (  # noqa: F401 - the parent's side, named here too
    NONE,
    Requests,
    child_environment,
    start_framed,
)


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
    """In the child: the channel, the inbox of its requests (None without) and the arguments
    after WIRING (see ``wiring``)."""
    channel, req_fd, rest = wiring(argv)
    return channel, None if req_fd is None else Inbox(req_fd), rest
