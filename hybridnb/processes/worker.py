"""A spawned child: ``python -m hybridnb.processes.worker WIRING DEATH_SIGNAL SPAWNED_AT PRELOAD``
(started by ``child.start_spawn`` or ``child.prestart_spawn`` through ``framed``; not a command
for people).

It imports the PRELOAD modules (comma-separated: ``import torch`` while the parent is still
preparing the job), says it is ready, reads the cloudpickled ``(fn, args, kwargs)`` from its
request pipe, runs ``fn(channel, *args, **kwargs)``, sends the return value ("done") or the
exception with its traceback ("error"), and leaves with ``os._exit`` (no interpreter teardown:
with torch loaded it costs about a second). It gets DEATH_SIGNAL when its parent dies
(``processes.lifeline``); faulthandler prints the Python stack of a segfault or abort on
stderr. Threads are left as torch sets them: a fresh interpreter has no broken OpenMP pool.

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
from hybridnb.processes.channel import DONE, Channel
from hybridnb.processes.framed import wiring

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


def run(fn: Callable[..., Any], args: tuple, kwargs: dict, channel: Channel) -> int:
    """Run ``fn(channel, *args, **kwargs)``; send its result or its error; the exit code."""
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
    while data := os.read(fd, 1 << 20):
        chunks.append(data)
    os.close(fd)
    return b"".join(chunks)


def main(argv: list[str] | None = None) -> None:
    """The spawned child's life; never returns."""
    code = 70
    try:
        argv = list(argv or sys.argv[1:])
        death = int(argv[1]) if len(argv) > 1 else platform.KILL
        channel, job_fd, rest = wiring(argv, death)
        # run as __main__: the times go where ``startup()``'s importers look
        times = importlib.import_module("hybridnb.processes.worker")._STARTUP
        times["spawned_at"] = float(rest[1])
        preload = [m for m in rest[2].split(",") if m]
        prepare()
        sys.stdin = open(os.devnull)
        try:
            for module in preload:  # while the parent prepares the job
                importlib.import_module(module)
            if preload:
                times["ready_at"] = time.monotonic()
                channel.ready()
            from hybridnb.processes.payload import unpack

            fn, args, kwargs = unpack(_read_all(job_fd))
        except BaseException as exc:  # say it through the channel: the parent shows it
            channel.send_error(exc)
            code = 1
            return
        times["job_at"] = time.monotonic()
        if not preload:
            times["ready_at"] = times["job_at"]
            channel.ready()
        code = run(fn, args, kwargs, channel)
    finally:
        with contextlib.suppress(BaseException):  # exiting anyway
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    main()
