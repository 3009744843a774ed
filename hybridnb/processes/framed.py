"""The child's side of a framed command (``python -m MODULE WIRING ...``, ``start_framed``):
the GPU probe, a compare() variant, the spawned worker. WIRING names its message pipe, stop
flag, request pipe and lifeline: every child speaks one framing, dies with its parent and is
watched by the one loop.
"""

from __future__ import annotations

from collections.abc import Sequence

from hybridnb import platform
from hybridnb.processes import lifeline
from hybridnb.processes.channel import Channel, Inbox, StopFlag
from hybridnb.processes.child import NONE


def connect(argv: Sequence[str], death_signal: int = platform.KILL
            ) -> tuple[Channel, Inbox | None, list[str]]:
    """In the child: the channel, the inbox of its requests (None without) and the arguments
    after WIRING; ``death_signal`` when its parent dies (``lifeline.hold``)."""
    if not argv or argv[0].count(",") != 3:
        raise SystemExit("this module is started by hybridnb (processes.child.start_framed), "
                         "not by hand")
    msg_fd, stop_fd, req_fd, parent = argv[0].split(",")
    lifeline.hold(parent, death_signal)
    channel = Channel(int(msg_fd), StopFlag(fd=int(stop_fd)))
    return channel, None if req_fd == NONE else Inbox(int(req_fd)), list(argv[1:])
