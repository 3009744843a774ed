"""Checkpoint files: atomic writes (``files.atomic_write``), safe loads, and the fallback to the
previous good file.

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts, so it loads with
``torch.load(weights_only=True)`` (no pickled code runs on load). Before ``last.pt`` is replaced
the old one is kept as ``last.prev.pt``, which ``read`` uses when ``last.pt`` is damaged.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import torch

from hybridnb.failures import first_line
from hybridnb.files import CHECKPOINT_FORMAT as FORMAT
from hybridnb.files import atomic_write, describe, is_write_failure, read_safely
from hybridnb.train.bus import StateKept
from hybridnb.train.run_lock import RunLock
from hybridnb.train.storage import StorageGuard

LAST, PREVIOUS, BEST = "last.pt", "last.prev.pt", "best.pt"
# the temporary names ``save`` (files.atomic_write, files.keep_copy) and ``check_dir`` write
# (".last.pt.tmp-<pid>")
_OUR_TEMP = re.compile(r"\.(?:(?:last|last\.prev|best)\.pt\.tmp|write-test)-(?P<pid>\d+)")


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be used (missing, truncated, corrupt or not ours)."""


def save(state: dict, path: str | os.PathLike, keep_previous: bool = False) -> Path:
    """``torch.save`` through ``files.atomic_write`` with the format tag ``load`` checks
    (``keep_previous``: the old ``last.pt`` first becomes ``last.prev.pt``)."""
    record = {"format": FORMAT, **state}
    return atomic_write(path, lambda f: torch.save(record, f), keep_previous=keep_previous)


_PICKLED_ADVICE = ("a hybridnb checkpoint holds only tensors and plain data, so this file was "
                   "written some other way; resume from a folder fit(checkpoint_dir=...) wrote, "
                   "or, only if you trust the file, load it yourself with torch.load(path, "
                   "weights_only=False)")


def load(path: str | os.PathLike) -> dict:
    """Read a checkpoint with ``weights_only=True``; a bad file raises ``CheckpointError`` naming it."""
    state = read_safely(path, "checkpoint", "is unreadable (truncated or corrupt)",
                        CheckpointError, CheckpointError, _PICKLED_ADVICE)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} is not a hybridnb checkpoint "
                              f"(format {state.get('format') if isinstance(state, dict) else '?'})")
    return state


def read(path: str | os.PathLike, model) -> tuple[dict, Path, list[str]]:
    """A 'last' checkpoint to resume from: a file (its ``.prev`` copy when it is damaged) or a
    folder's ``last.pt`` (else ``last.prev.pt``), checked to fit ``model`` (``check_fits``).
    Returns (state, the file used, why each file before it was skipped)."""
    path = Path(path)
    first = path / LAST if path.is_dir() else path
    candidates = [first, first.with_name(f"{first.stem}.prev{first.suffix}")]
    if path.is_dir() and not any(c.exists() for c in candidates):
        raise CheckpointError(f"no checkpoint to resume from in {path} (looked for {LAST}, "
                              f"{PREVIOUS})")
    problems: list[str] = []
    for candidate in candidates:
        if candidate.exists() or candidate is path:  # a file given that is missing: said
            try:
                state = load(candidate)
            except CheckpointError as exc:
                problems.append(str(exc))
                continue
            check_fits(state, candidate, model)
            return state, candidate, problems
    best = first.parent / BEST
    advice = "start afresh without resume (or move the folder away)"
    with contextlib.suppress(CheckpointError):  # missing or unreadable: no best.pt to offer
        load(best)
        advice = (f"{best} holds the best weights (trainer.model.load_state_dict(torch.load("
                  f"'{best}', weights_only=True)['model'])), or start afresh without resume")
    raise CheckpointError("; ".join(problems) + f". To go on: {advice}")


def check_fits(state: dict, path: Path, model) -> None:
    """Raise ``CheckpointError`` naming ``path`` when ``state`` was not saved from a model like
    ``model`` (class name, parameter names, shapes)."""
    saved = state.get("config", {}).get("model")
    if saved is not None and saved != type(model).__name__:
        raise CheckpointError(f"checkpoint {path} was saved from a model of class {saved}, this "
                              f"model is a {type(model).__name__}: resume with the model class "
                              "it was trained with (or start afresh without resume)")
    mine, theirs = model.state_dict(), state.get("model", {})
    for key in list(mine) + [k for k in theirs if k not in mine]:
        there, here = (tuple(getattr(d[key], "shape", ())) if key in d else None  # extra_state
                       for d in (theirs, mine))
        why = ("is missing from the checkpoint" if there is None else
               "is in the checkpoint but not in the model" if here is None else
               f"has shape {there} there and {here} here" if there != here else None)
        if why:
            raise CheckpointError(f"checkpoint {path} does not fit this model: {key!r} {why}")


def check_dir(folder: str | os.PathLike | None, name: str = "checkpoint_dir") -> Path | None:
    """Check ``checkpoint_dir`` (or ``log_dir``, ``name``) before any training: a folder (created
    if missing) this process can write into. Temporary files a killed write left
    (``.last.pt.tmp-<pid>`` of a process that is gone) are removed; nothing else is touched."""
    if folder is None:
        return None
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{name}={str(folder)!r} is an existing file, not a folder: "
                         "pass a folder path")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"{name}={str(folder)!r} cannot be written "
                         f"({type(exc).__name__}: {exc.strerror or exc}): pass a folder you "
                         "can write into") from None
    for tmp in folder.iterdir():
        ours = _OUR_TEMP.fullmatch(tmp.name)
        pid = int(ours.group("pid")) if ours else os.getpid()
        if pid != os.getpid() and tmp.is_file() and not psutil.pid_exists(pid):
            with contextlib.suppress(OSError):
                tmp.unlink()
    return folder


def set_aside(folder: Path | None, patterns: tuple[str, ...] = (),
              checkpoints: bool = True) -> Path | None:
    """A fresh run into a folder that holds an earlier run's checkpoints (and the files matching
    ``patterns``: its logs; ``checkpoints=False``: those only): move them into
    ``earlier-<time>/`` inside it (nothing is overwritten); returns that folder, or None."""
    if folder is None:
        return None
    found = [folder / n for n in (LAST, PREVIOUS, BEST)
             if checkpoints and (folder / n).exists()]
    found += sorted({p for pattern in patterns for p in folder.glob(pattern) if p.is_file()})
    if not found:
        return None
    stamp = time.strftime("earlier-%Y%m%d-%H%M%S")
    target, k = folder / stamp, 1
    while target.exists():
        target, k = folder / f"{stamp}.{k}", k + 1
    try:
        target.mkdir()
        for path in found:
            os.replace(path, target / path.name)
    except OSError as exc:
        what = "checkpoints" if checkpoints else "logs"
        raise ValueError(f"{'checkpoint_dir' if checkpoints else 'log_dir'}={str(folder)!r} "
                         f"holds an earlier run's {what} and they cannot be moved aside "
                         f"({type(exc).__name__}: {exc.strerror or exc}): pass another folder, "
                         "or fit(..., resume=True) to continue that run") from None
    return target


class Checkpoints:
    """A run's last good state: kept in memory for recovery, said on the run's ``bus`` as
    ``StateKept`` (an isolated worker sends it to the kernel), and written as ``last.pt`` /
    ``best.pt`` into ``folder`` (rank 0 only; ``folder=None`` keeps it in memory only)."""

    def __init__(self, folder: Path | None, is_main: bool, bus,
                 log_patterns: tuple[str, ...] = ()) -> None:
        self.folder, self.is_main, self.bus = folder, is_main, bus
        self.snapshot: dict | None = None
        self.storage = StorageGuard(bus)
        self.log_patterns = log_patterns  # the logs in this folder, set aside with a fresh run

    def keep(self, state: dict, write: bool = False) -> None:
        """``state`` (a ``Trainer.state_dict()``) is the last good state from now on; ``write``:
        written as ``last.pt`` too (the old one becomes ``last.prev.pt``)."""
        self.snapshot = state
        self.bus.emit(StateKept(state["position"]["global_step"], state))
        if write and self.folder is not None and self.is_main:
            self._write(state, LAST)

    def save_best(self, record: dict) -> None:
        if self.folder is not None and self.is_main:
            self._write({"kind": "best", **record}, BEST)

    def _write(self, state: dict, name: str) -> None:
        """A failed write does not end the run (``storage.StorageGuard``)."""
        path = self.folder / name
        try:
            save(state, path, keep_previous=name == LAST)
        except Exception as exc:  # narrowed by is_write_failure (torch's writer error too)
            if not is_write_failure(exc):
                raise
            self.storage.failed(path, exc, lambda: (
                f"the last good {name} on disk (step {_step_of(path)}) is intact and the "
                "current state is kept in memory" if path.exists() else
                "the state is kept in memory only"))
            return
        self.storage.worked(path)

    def claimed(self) -> contextlib.ExitStack:
        """A fit holds ``folder`` for its whole length (rank 0): another live run there is
        refused before its first step, a dead process's lock taken over and said (run_lock.py)."""
        held = contextlib.ExitStack()
        if self.folder is not None and self.is_main:
            lock = RunLock(self.folder)
            lock.acquire(self.bus)
            held.callback(lock.release)
        return held

    def set_aside(self) -> Path | None:
        """A fresh run: an earlier run's files move aside (``set_aside``)."""
        return set_aside(self.folder, self.log_patterns) if self.is_main else None

    def has_last(self) -> bool:
        return self.folder is not None and any((self.folder / n).exists()
                                               for n in (LAST, PREVIOUS))

    def save_crash(self, file_ready: Callable[[dict], bool]) -> None:
        """An unexpected error: keep the last good state on disk so the run can resume, and say
        where it is ("failed": a failing save is said too, and never hides the error)."""
        snapshot, last = self.snapshot, self.folder / LAST  # a fit with a checkpoint_dir
        if snapshot is None or not self.is_main:
            return
        resume = "fit(..., resume=True) continues from there"
        if not file_ready(snapshot):  # DeepSpeed: partitions not gathered
            said = f"; the last checkpoint written (in {self.folder}) is kept: {resume}"
        else:
            try:
                save(snapshot, last, keep_previous=True)
                said = (f"; the last good state (step {snapshot['position']['global_step']}) "
                        f"is in {last}; {resume}")
            except Exception as exc:  # noqa: BLE001 - said; the original error follows
                cause = describe(exc, last) if is_write_failure(exc) else \
                    f"{type(exc).__name__}: {first_line(exc)}"
                kept = (f"the {LAST} on disk (step {_step_of(last)}) is intact"
                        if last.exists() else "no checkpoint is on disk")
                said = (f", and saving the last good state into {last} failed too ({cause}); "
                        f"{kept}; the original error follows")
        self.bus.note("failed", "training failed" + said)


def _step_of(path: Path) -> str:
    """The global step a checkpoint on disk holds ('?' when it cannot be read)."""
    with contextlib.suppress(CheckpointError):
        state = load(path)
        return str(state.get("global_step", state.get("position", {}).get("global_step", "?")))
    return "?"
