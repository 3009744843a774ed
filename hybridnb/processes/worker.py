"""A spawned child: ``python -m hybridnb.processes.worker PAYLOAD_FD MESSAGES_FD STOP_FD PARENT
DEATH_SIGNAL [SPAWNED_AT PRELOAD]`` (started by ``child.start_spawn`` or ``child.prestart_spawn``;
not a command for people).

It imports the PRELOAD modules (comma-separated; prestarted workers: ``import torch`` while the
parent is still preparing the job), says it is ready, reads the cloudpickled ``(fn, args,
kwargs)`` from PAYLOAD_FD (``channel.shared_file``: a memfd, or an unlinked temporary file where
there is none; a pipe the parent writes when the job is ready for a prestarted worker), runs
``fn(channel, *args, **kwargs)`` with a ``Channel`` on MESSAGES_FD and the stop flag on STOP_FD,
sends the return value ("done") or the exception with its traceback ("error"), and leaves with
``os._exit`` (no
interpreter teardown: with torch loaded it costs about a second). Its process group is its own
(Popen's new session); it dies with PARENT ("PID" or "PID:LIFELINE_FD": ``processes.lifeline``,
``PR_SET_PDEATHSIG`` on Linux, a lifeline pipe elsewhere); faulthandler prints the
Python stack of a segfault or abort on stderr. Threads are left as torch sets them (the
machine's cores): a fresh interpreter has no broken OpenMP pool to avoid.

``run`` and ``prepare`` are shared with the forked child (``child.start_fork``).
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from hybridnb import platform
from hybridnb.processes import lifeline
from hybridnb.processes.channel import DONE, Channel, StopFlag

# When this worker was started (the parent's time.monotonic(), one clock for both processes),
# ready (its imports done) and given its job: what ``startup()`` returns
_STARTUP: dict[str, float] = {}


def startup() -> dict[str, float]:
    """In a spawned worker: ``spawned_at`` (when the parent started it), ``ready_at`` (its
    imports done) and ``job_at`` (its job read), on ``time.monotonic()``'s clock; empty
    elsewhere."""
    return dict(_STARTUP)


def prepare() -> None:
    """Signals as a plain Python process has them, and faulthandler on stderr."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if platform.HANGUP is not None:  # a forked child inherits the parent's Watch handler
        signal.signal(platform.HANGUP, signal.SIG_DFL)
    faulthandler.enable(file=sys.stderr)  # a segfault or abort prints the Python stack


def run(msg_fd: int, stop: StopFlag, fn: Callable[..., Any], args: tuple, kwargs: dict,
        channel: Channel | None = None) -> int:
    """Run ``fn(channel, *args, **kwargs)``; send its result or its error; the exit code.
    A new channel says "ready" first (``channel``: one that already did)."""
    if channel is None:
        channel = Channel(msg_fd, stop)
        channel.ready()
    try:
        result = fn(channel, *args, **kwargs)
        if not channel.finished:
            try:
                channel.send(DONE, result)
            except Exception as exc:  # noqa: BLE001 - any pickling failure: named
                raise TypeError(f"the result ({type(result).__name__}) cannot be sent to the "
                                f"parent ({type(exc).__name__}: {exc}); return plain values "
                                "(numbers, dicts, CPU tensors)") from exc
        return 0
    except BaseException as exc:  # reported to the parent, whatever it was
        if not channel.finished:
            channel.send_error(exc)
        else:
            with contextlib.suppress(BaseException):  # the pipe is gone: print what we can
                import traceback

                traceback.print_exc()
        return 1


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        data = os.read(fd, 1 << 20)
        if not data:
            break
        chunks.append(data)
    os.close(fd)
    return b"".join(chunks)


def main(argv: list[str] | None = None) -> None:
    """The spawned child's life; never returns."""
    code = 70
    try:
        argv = list(argv or sys.argv[1:])
        payload_fd, msg_fd, stop_fd, death = (int(argv[i]) for i in (0, 1, 2, 4))
        parent = argv[3]
        # run as __main__: the times go where ``startup()``'s importers look
        times = importlib.import_module("hybridnb.processes.worker")._STARTUP
        if len(argv) > 5:
            times["spawned_at"] = float(argv[5])
        preload = [m for m in (argv[6] if len(argv) > 6 else "").split(",") if m]
        lifeline.hold(parent, death)
        prepare()
        sys.stdin = open(os.devnull)
        stop = StopFlag.attach(stop_fd)
        channel = Channel(msg_fd, stop)
        try:
            for module in preload:  # while the parent prepares the job
                importlib.import_module(module)
            if preload:
                times["ready_at"] = time.monotonic()
                channel.ready()
            from hybridnb.processes.payload import unpack

            fn, args, kwargs = unpack(_read_all(payload_fd))
        except BaseException as exc:  # say it through the channel: the parent shows it
            channel.send_error(exc)
            code = 1
            return
        times["job_at"] = time.monotonic()
        if not preload:
            times["ready_at"] = times["job_at"]
            channel.ready()
        code = run(msg_fd, stop, fn, args, kwargs, channel=channel)
    finally:
        with contextlib.suppress(BaseException):  # exiting anyway
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    main()
