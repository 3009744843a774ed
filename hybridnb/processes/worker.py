"""A spawned child: ``python -m hybridnb.processes.worker WIRING DEATH_SIGNAL SPAWNED_AT
PRELOAD`` (``child.start_spawn``/``prestart_spawn``). It imports PRELOAD while the parent
prepares the job, says "ready", reads the ``payload`` from its request pipe, runs it as a forked
child does and leaves with ``os._exit`` (a teardown with torch loaded costs about a second).
Threads stay as torch sets them (no inherited OpenMP pool).
"""

from __future__ import annotations

import importlib
import sys
import time

from hybridnb import platform
from hybridnb.processes.channel import READY
from hybridnb.processes.child import leave, prepare, run
from hybridnb.processes.framed import connect

_STARTUP: dict[str, float] = {}


def startup() -> dict[str, float]:
    """In a spawned worker: ``spawned_at``, ``ready_at`` (imports done) and ``job_at`` (job read),
    on ``time.monotonic()``'s clock (one for both processes); empty elsewhere."""
    return dict(_STARTUP)


def main() -> None:
    """The spawned child's life; never returns."""
    code = 70
    try:
        argv = sys.argv[1:]
        death = int(argv[1]) if len(argv) > 1 else platform.KILL
        channel, inbox, rest = connect(argv, death)
        # run as __main__: the times go where ``startup()``'s importers look
        times = importlib.import_module("hybridnb.processes.worker")._STARTUP
        times["spawned_at"] = float(rest[1])
        preload = [m for m in rest[2].split(",") if m]
        prepare()
        code = 1  # until its job has run
        try:
            for module in preload:  # while the parent prepares the job
                importlib.import_module(module)
            if preload:
                times["ready_at"] = time.monotonic()
                channel.send(READY)
            from hybridnb.processes.payload import unpack

            job = inbox.get()
            if job is None:  # the parent went first: nobody to work for or tell
                return
            fn, args, kwargs = unpack(job.payload)
        except BaseException as exc:  # say it through the channel: the parent shows it
            channel.send_error(exc)
            return
        times["job_at"] = time.monotonic()
        if not preload:
            times["ready_at"] = times["job_at"]
            channel.send(READY)
        code = run(fn, args, kwargs, channel)
    finally:
        leave(code)


if __name__ == "__main__":
    main()
