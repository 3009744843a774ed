"""A warm worker: one spare prestarted worker per preload tuple, kept for the next request
(``child.prestart_spawn`` takes it: the second isolated fit finds torch imported); the next
spare starts once a job is over (no start-up takes CPU from a job). A spare is handed out only
while it runs and only for the same request (preload, environment, ``sys.path``, working
directory, interpreter); else it is closed. It never outlives this process (lifeline, atexit).
``HYBRIDNB_WARM_WORKER=0`` turns spares off.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from hybridnb.env import current, warm_worker

Spare = Any  # a ``child.PrestartedWorker`` (not imported: child imports this module)

_lock = threading.Lock()
_spares: dict[tuple[str, ...], tuple[tuple, Spare]] = {}


def key_of(preload: tuple[str, ...]) -> tuple:
    """What a spare must have been started with to serve this request."""
    return (preload, tuple(sorted(current().items())), tuple(sys.path), os.getcwd(),
            sys.executable)


def take(key: tuple) -> Spare | None:
    """The running spare started for ``key``, now the caller's (a dead or stale one: closed)."""
    with _lock:
        entry = _spares.pop(key[0], None)
    if entry is None:
        return None
    spare_key, spare = entry
    if spare_key != key or spare.child.poll() is not None:
        spare.close()
        return None
    return spare


def replenish(key: tuple, start: Callable[[], Spare]) -> None:
    """Start the spare for ``key`` unless a running one is there (spares on)."""
    if warm_worker():
        spare = take(key) or start()  # a running one is kept, a stale one closed
        with _lock:
            old = _spares.get(key[0])
            _spares[key[0]] = (key, spare)
        if old is not None and old[1] is not spare:  # another thread's, meanwhile
            old[1].close()


def waiting() -> list[Spare]:
    with _lock:
        return [spare for _, spare in _spares.values()]


def close_all() -> None:
    """Kill and reap every spare (at interpreter exit, and for tests)."""
    with _lock:
        entries = list(_spares.values())
        _spares.clear()
    for _, spare in entries:
        with contextlib.suppress(KeyboardInterrupt):  # a Ctrl-C held in one close: close them all
            spare.close()


atexit.register(close_all)
