"""Files written whole or not at all, read without running code, and what a failed write means:
the layer under ``train.checkpoint`` and ``saving``. A failed write is an ``OSError``, or a
``RuntimeError`` from torch's zip writer, which drops the errno (``unexpected pos ...``);
``is_write_failure`` tells those from every other RuntimeError (a bug stays a bug).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import IO

import torch

# the format tag of train.checkpoint's files (here so that saving.py recognises a checkpoint)
CHECKPOINT_FORMAT = "hybridnb-checkpoint-1"

# errnos a full or failing disk gives; their texts appear inside torch's own write errors
_DISK_ERRNOS = tuple(getattr(errno, name) for name in
                     ("ENOSPC", "EDQUOT", "EROFS", "EIO", "EFBIG", "ENOLINK", "ESTALE")
                     if hasattr(errno, name))
_TORCH_WRITE = re.compile(
    r"unexpected pos \d+(?: vs \d+)?|file write failed|PytorchStreamWriter failed writing[^.]*|"
    + "|".join(re.escape(os.strerror(code)) for code in _DISK_ERRNOS), re.IGNORECASE)
# torch's weights-only unpickler refusing a pickled global (a class or function: code)
_REFUSED_GLOBAL = re.compile(r"Unsupported global: GLOBAL (\S+)")


class WriteError(OSError):
    """A file the user asked for could not be written; the message names the file and the
    cause, and no partial file is left in its place."""


def is_write_failure(exc: BaseException) -> bool:
    """True for an error a write raises when storage fails (an ``OSError`` or torch's writer's)."""
    if isinstance(exc, OSError):
        return True
    return isinstance(exc, RuntimeError) and _TORCH_WRITE.search(str(exc)) is not None


def describe(exc: BaseException, path: str | os.PathLike | None = None) -> str:
    """``ENOSPC: No space left on device``; for torch's writer, its words and the free space."""
    if isinstance(exc, OSError):
        code = errno.errorcode.get(exc.errno, "") if exc.errno is not None else ""
        text = exc.strerror or str(exc) or type(exc).__name__
        return f"{code}: {text}" if code else f"{type(exc).__name__}: {text}"
    match = _TORCH_WRITE.search(str(exc))
    words = match.group(0) if match else (str(exc).strip().splitlines() or [""])[0][:160]
    free = ""
    with contextlib.suppress(OSError, TypeError):  # TypeError: no path
        free = f", {shutil.disk_usage(Path(path).parent).free / 2**20:,.1f} MB free there"
    return f"torch's writer stopped: {words}; the disk is full or failing{free}"


def atomic_write(path: str | os.PathLike, write: Callable[[IO], None], *, text: bool = False,
                 keep_previous: bool = False) -> Path:
    """``write(f)`` to a temporary file, fsynced, renamed over ``path``: a crash leaves the old
    file or the new one, whole. ``keep_previous``: the old one kept as ``<stem>.prev<suffix>``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w" if text else "wb", newline="" if text else None) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if keep_previous and path.exists():
            keep_copy(path, path.with_name(f"{path.stem}.prev{path.suffix}"))
        os.replace(tmp, path)
        with contextlib.suppress(OSError):  # the rename made durable (some file systems refuse)
            fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def keep_copy(src: Path, dst: Path) -> None:
    """Make ``dst`` a copy of ``src`` (a hard link, else a copy); a failure leaves ``dst`` be."""
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    try:
        # a stale tmp (a kill between link and replace; a restarted container reuses the pid)
        # may be a hard link to src itself, onto which copy2 fails with SameFileError
        tmp.unlink(missing_ok=True)
        try:
            os.link(src, tmp)
        except OSError:  # no hard links there
            shutil.copy2(src, tmp)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def read_safely(path: str | os.PathLike, what: str, unreadable: str,
                missing: type[Exception], bad: type[Exception], pickled_advice: str) -> object:
    """``torch.load(path, weights_only=True)`` on the CPU; a missing file raises ``missing``, an
    unreadable one ``bad`` (with ``pickled_advice`` for pickled code, else ``unreadable``)."""
    path = Path(path)
    if not path.is_file():
        raise missing(f"{what} {path} does not exist")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # zip reader, unpickler and EOF errors
        if refused := _REFUSED_GLOBAL.search(str(exc)):
            raise bad(f"{what} {path} holds pickled objects ({refused.group(1).rstrip('.,')}), "
                      "which weights_only loading refuses because loading them would run "
                      f"their code: {pickled_advice}") from None
        # torch's own text advises weights_only=False (running pickled code): never repeat it
        raise bad(f"{path} {unreadable} ({path.stat().st_size} bytes; "
                  f"{type(exc).__name__})") from None
