"""A warm worker: one spare prestarted worker per preload tuple, kept for the next request.

``child.prestart_spawn`` takes the spare when there is one (``take``) instead of starting an
interpreter, and once a worker's job is over (``PrestartedWorker.start_next``) the next spare is
started (``replenish``): the second isolated fit in a kernel finds a worker that has imported
torch already, and no spare's start-up takes CPU from a running job. A spare is handed out only
while it runs and only when it was started for the same request (preload, worker variables,
death signal, output plumbing, and the same environment, ``sys.path``, working directory and
interpreter as now); else it is closed. One still importing is handed out too: it is ahead.

A spare never outlives this process: it dies with it (``processes.lifeline``), sees EOF on its
job pipe, and is killed at interpreter exit (atexit). ``HYBRIDNB_WARM_WORKER=0`` turns spares
off (each costs the memory of an idle interpreter with torch loaded). Linux's PR_SET_PDEATHSIG
fires when the *thread* that started a child ends: a spare killed that way is found dead and
replaced.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from hybridnb.env import environment, warm_worker

Key = tuple
Spare = Any  # a ``child.PrestartedWorker`` (not imported: child imports this module)

_lock = threading.Lock()
_spares: dict[tuple[str, ...], tuple[Key, Spare]] = {}


def key_of(preload: tuple[str, ...], env: dict[str, str] | None, death_signal: int,
           merge_output: bool) -> Key:
    """What a spare must have been started with to serve this request."""
    return (preload, None if env is None else tuple(sorted(env.items())), int(death_signal),
            bool(merge_output), tuple(sorted(environment().items())), tuple(sys.path),
            os.getcwd(), sys.executable)


def take(key: Key) -> Spare | None:
    """The running spare started for ``key``, now the caller's; None when there is none (a
    dead or stale spare is closed)."""
    with _lock:
        entry = _spares.pop(key[0], None)
    if entry is None:
        return None
    spare_key, spare = entry
    if spare_key != key or spare.child.poll() is not None:
        spare.close()
        return None
    return spare


def replenish(key: Key, start: Callable[[], Spare]) -> None:
    """Start the spare for ``key`` unless a running one is there (spares on)."""
    if not warm_worker():
        return
    with _lock:
        entry = _spares.get(key[0])
    if entry is not None:
        if entry[0] == key and entry[1].child.poll() is None:
            return
        discard(key[0])
    spare = start()
    with _lock:
        old = _spares.pop(key[0], None)
        _spares[key[0]] = (key, spare)
    if old is not None:
        old[1].close()


def discard(preload: tuple[str, ...]) -> None:
    """Close the spare kept for ``preload``, if any."""
    with _lock:
        entry = _spares.pop(preload, None)
    if entry is not None:
        entry[1].close()


def waiting() -> list[Spare]:
    """The spares kept now."""
    with _lock:
        return [spare for _, spare in _spares.values()]


def close_all() -> None:
    """Kill and reap every spare (at interpreter exit, and for tests)."""
    with _lock:
        entries = list(_spares.values())
        _spares.clear()
    for _, spare in entries:
        spare.close()


atexit.register(close_all)
