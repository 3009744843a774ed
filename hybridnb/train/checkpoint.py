"""Checkpoint files: atomic writes, safe loads, and the fallback to the previous good file.

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts, so it loads with
``torch.load(weights_only=True)`` (no pickled code runs on load). Writes go to a temporary file
in the same folder, are flushed and fsynced, then renamed over the old file: a crash or SIGKILL at
any moment leaves either the old or the new file, never half of one. Before ``last.pt`` is
replaced the old one is kept as ``last.prev.pt``, which ``load_latest`` uses when ``last.pt`` is
damaged.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import torch

FORMAT = "hybridnb-checkpoint-1"
LAST, PREVIOUS, BEST = "last.pt", "last.prev.pt", "best.pt"


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be used (missing, truncated, corrupt or not ours)."""


def save(state: dict, path: str | os.PathLike, keep_previous: bool = False) -> Path:
    """Write ``state`` to ``path`` atomically; with ``keep_previous`` the old file becomes
    ``<stem>.prev.pt`` first (``last.pt`` -> ``last.prev.pt``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save({"format": FORMAT, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        if keep_previous and path.exists():
            _keep_copy(path, path.with_name(f"{path.stem}.prev{path.suffix}"))
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return path


def load(path: str | os.PathLike) -> dict:
    """Read a checkpoint with ``weights_only=True``; a bad file raises ``CheckpointError`` naming it."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # zip reader, unpickler and EOF errors all mean the same here
        raise CheckpointError(
            f"checkpoint {path} is unreadable (truncated or corrupt, {path.stat().st_size} "
            f"bytes): {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} is not a hybridnb checkpoint "
                              f"(format {state.get('format') if isinstance(state, dict) else '?'})")
    return state


def load_latest(folder: str | os.PathLike) -> tuple[dict, Path, list[str]]:
    """The newest readable 'last' checkpoint in ``folder``: ``last.pt``, else ``last.prev.pt``.

    Returns (state, path, problems) where ``problems`` names each file that was skipped and why.
    Raises ``CheckpointError`` when none can be read (or none exists).
    """
    folder = Path(folder)
    problems: list[str] = []
    for name in (LAST, PREVIOUS):
        path = folder / name
        if not path.exists():
            continue
        try:
            return load(path), path, problems
        except CheckpointError as exc:
            problems.append(str(exc))
    if problems:
        raise CheckpointError("no usable checkpoint in " + str(folder) + ": " + "; ".join(problems))
    raise CheckpointError(f"no checkpoint to resume from in {folder} (looked for {LAST}, "
                          f"{PREVIOUS})")


def _keep_copy(src: Path, dst: Path) -> None:
    """Make ``dst`` a copy of ``src`` while ``src`` stays in place (hard link, else a copy)."""
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copy2(src, tmp)
    os.replace(tmp, dst)


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
