"""What this operating system can do for hybridnb's child processes: asked here, nowhere else.

Linux, macOS and Windows differ in the facilities a supervised child needs (``FACILITIES``;
Windows has none of them: the probe, isolation and compare() run in process). A missing one is
a ``Facility`` whose ``why`` says what hybridnb does instead, never an exception. The facts are
read from the running interpreter, so a test takes a facility away (``tests/platform_sim``)
without a flag in hybridnb. ``say``/``say_once``: the fallbacks' notices.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass

# the signal that ends a process without a chance to answer (Windows: TerminateProcess,
# which Python's os.kill uses for any signal but CTRL_C/CTRL_BREAK)
KILL: int = int(getattr(signal, "SIGKILL", signal.SIGTERM))
# the terminal closed (POSIX only); None where there is none
HANGUP: int | None = getattr(signal, "SIGHUP", None)


@dataclass(frozen=True)
class Facility:
    """One facility: ``available``, and ``why`` (one sentence) when it is not."""

    name: str
    available: bool
    why: str = ""

    def __bool__(self) -> bool:
        return self.available


def _has(name: str, ok: bool, why: str) -> Facility:
    return Facility(name, bool(ok), "" if ok else why)


def _os_has(name: str, why: str, *attrs: str):
    """The facility that is there when ``os`` has every one of ``attrs`` (asked once)."""
    return functools.cache(lambda: _has(name, all(hasattr(os, a) for a in attrs), why))


# anonymous memory files (Linux): a spawned child's stop flag lives in one
memfd = _os_has("memfd", "os.memfd_create is Linux-only: the stop flag uses an unlinked "
                "temporary file instead", "memfd_create")
# os.waitid(WNOWAIT): see that a child ended without reaping it (Linux; macOS from Python 3.13),
# so its process group cannot be reused before it is killed
wait_without_reaping = _os_has("waitid", "os.waitid is missing: an ended child is reaped as "
                               "soon as it is seen", "waitid", "WNOWAIT")
# os.pidfd_open (Linux 5.3): a descriptor that wakes select() when a child exits
pidfd = _os_has("pidfd", "os.pidfd_open is Linux-only: a child's exit is seen within 50 ms by "
                "polling", "pidfd_open")


@functools.cache
def parent_death_signal() -> Facility:
    """``prctl(PR_SET_PDEATHSIG)`` (Linux): a child gets a signal when its parent dies."""
    found = False
    if sys.platform.startswith("linux"):
        with contextlib.suppress(ImportError, OSError, TypeError):
            import ctypes

            found = hasattr(ctypes.CDLL(None, use_errno=True), "prctl")
    return _has("PR_SET_PDEATHSIG", found,
                "PR_SET_PDEATHSIG is Linux-only: a child notices its parent's death through a "
                "lifeline pipe instead (it ends itself when the pipe's other end closes)")


def set_parent_death_signal(death_signal: int) -> None:
    """Ask the kernel to send ``death_signal`` to this process when its parent dies (where
    ``parent_death_signal()``; the lifeline pipe covers the rest)."""
    if parent_death_signal():
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(death_signal))  # found by the test above


@functools.cache
def fork() -> Facility:
    """``os.fork`` and multiprocessing's "fork" start method (POSIX)."""
    import multiprocessing

    return _has("fork", hasattr(os, "fork") and "fork" in multiprocessing.get_all_start_methods(),
                "this platform cannot fork: children start as fresh interpreters (spawn)")


@functools.cache
def proc() -> Facility:
    """Linux's /proc: this process's mapped memory, the machine's available memory, CPU flags."""
    return _has("/proc", os.path.exists("/proc/self/status") and os.path.exists("/proc/meminfo"),
                "there is no /proc here: the memory cap of a speed-up trial is off and the "
                "CPU's name comes from the platform module")


@functools.cache
def child_pipes() -> Facility:
    """What every supervised child of hybridnb needs: descriptors passed to a child (Popen's
    ``pass_fds``) and ``select`` on pipes (POSIX; Windows has neither)."""
    return _has("child pipes", os.name == "posix",
                "Windows cannot pass pipes to a child process nor wait on them with select(), "
                "which hybridnb's supervised children need")


def proc_path(*parts: str) -> str | None:
    """A path under /proc (``proc_path("cpuinfo")``), or None where there is no /proc."""
    return os.path.join("/proc", *parts) if proc() else None


@dataclass(frozen=True)
class SharedMemory:
    """The shared-memory folder (Linux's /dev/shm) and its size and free bytes; ``path`` None
    where there is none (macOS, Windows) or it cannot be read."""

    path: str | None
    total: int | None = None
    free: int | None = None


def shared_memory(path: str = "/dev/shm") -> SharedMemory:
    """The size and free space of ``path`` now (not cached: it fills and empties). Docker's
    default is 64 MB (``docker run --shm-size``)."""
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):  # no such folder (macOS); no os.statvfs (Windows)
        return SharedMemory(None)
    return SharedMemory(path, st.f_frsize * st.f_blocks, st.f_frsize * st.f_bavail)


_said: set[str] = set()
_hearers: list = []  # innermost last: who hears the notices instead of stderr


@contextlib.contextmanager
def notices_to(hear) -> Iterator[None]:
    """Within: the notices below (``say``, ``say_once``) go to ``hear(sentence)`` instead of
    stderr (a Trainer's isolated fit: its bus, so they reach its view and events)."""
    _hearers.append(hear)
    try:
        yield
    finally:
        _hearers.remove(hear)


def say(sentence: str) -> None:
    """A one-line notice: to whoever hears them here (``notices_to``), else on stderr."""
    if _hearers:
        _hearers[-1](sentence)
    else:
        print(f"hybridnb: {sentence}", file=sys.stderr)


def say_once(sentence: str, key: str | None = None) -> None:
    """A fallback that changes what the user gets, said once per process (``say``); ``key``:
    one kind of fallback, said once whatever its sentence."""
    key = key or sentence
    if key not in _said:
        _said.add(key)
        say(sentence)


FACILITIES = (memfd, parent_death_signal, fork, wait_without_reaping, pidfd, proc, child_pipes)


def missing() -> list[Facility]:
    """The facilities this OS lacks, each with its sentence."""
    return [f for f in (probe() for probe in FACILITIES) if not f]
