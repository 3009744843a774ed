"""One live run per checkpoint folder: a lock file naming its holder, held with the OS's lock.

Two fits writing one folder would overwrite each other's ``last.pt`` and logs. So a fit takes the
OS's exclusive lock (``fcntl.flock``; ``msvcrt.locking`` on Windows) on ``.hybridnb-run.lock``
there before its first step and writes who holds it. The OS drops the lock when the holder's
process ends, however it ends, so the lock, not the text, says whether a run is live: taken, the
fit is refused (``RunLockError``); free and empty, the last run ended cleanly; free and naming a
holder, a dead run's stale lock, said once and taken over. The file stays between runs (emptied
on release): deleting it would let a third process lock a fresh file while a second holds the old.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path

try:  # POSIX
    import fcntl

    _HELD = BlockingIOError  # what locking a file another process holds raises
except ImportError:  # Windows
    import msvcrt

    fcntl, _HELD = None, OSError

LOCK_NAME = ".hybridnb-run.lock"
_WINDOWS_BYTE = 1 << 20  # msvcrt locks a byte range: one far past the text, which stays readable


class RunLockError(RuntimeError):
    """Another live run holds this checkpoint folder."""


def _read(fd: int) -> str:
    """The holder the file names ('' when empty), as ``RunLock.acquire`` wrote it."""
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 4096).decode("utf-8", "replace").strip()[:200]


class RunLock:
    """The claim of one fit on ``folder``: ``acquire()`` before the first step, ``release()``
    when the fit ends (also when it fails)."""

    def __init__(self, folder: str | os.PathLike, what: str = "checkpoint_dir") -> None:
        self.folder, self.what = Path(folder), what
        self.path = self.folder / LOCK_NAME
        self.fd: int | None = None

    def acquire(self, bus) -> None:
        """Take the folder for this run. Raises ``RunLockError`` while another live run holds
        it; a dead process's lock taken over is noted on ``bus`` ("run_lock")."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o644)
        except OSError as exc:
            raise RunLockError(f"{self.what}={str(self.folder)!r}: its run lock {self.path} "
                               f"cannot be opened ({type(exc).__name__}: "
                               f"{exc.strerror or exc}): pass a folder you can write into"
                               ) from None
        try:
            try:  # the OS's exclusive lock, without waiting
                if fcntl is None:
                    os.lseek(fd, _WINDOWS_BYTE, os.SEEK_SET)
                    msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
                else:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except _HELD:
                raise RunLockError(
                    f"{self.what}={str(self.folder)!r} is in use by a live run "
                    f"({_read(fd) or 'another process'}; lock file {self.path}): two runs in "
                    "one folder would overwrite each other's checkpoints and logs. Pass another "
                    f"{self.what}=, or wait for that run to end (or stop it) and fit again"
                ) from None
            holder = _read(fd)
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, (f"pid {os.getpid()} on host {socket.gethostname()}, started "
                          f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}").encode())
            os.fsync(fd)
        except BaseException:  # cleanup, then re-raised
            os.close(fd)
            raise
        self.fd = fd
        if holder:
            bus.note("run_lock", f"{self.folder} was locked by a run that is gone ({holder}; "
                     "its process ended without releasing it): a stale lock, taken over by "
                     "this run")

    def release(self) -> None:
        """The run is over: the file is emptied ("free and empty": the run ended cleanly) and
        the OS lock dropped (by closing, too, when the folder was removed or is failing)."""
        fd, self.fd = self.fd, None  # a second release must not close a reused descriptor
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
            else:
                os.lseek(fd, _WINDOWS_BYTE, os.SEEK_SET)
                msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        os.close(fd)
