"""Building the window store once and finding it again: cache keys, parallel build, atomic write.

A store is a folder ``<cache_dir>/<name>-<key>/`` with ``X.f32`` (all windows, one contiguous
float32 array (N, C, T), read back as a memmap), ``meta.pkl`` (metadata and problems) and
``info.json``. The key hashes the recipe and every input file: the text files (events.tsv,
participants.tsv, channels.tsv) by content, the recordings (BDF) by path, size and mtime — so
editing a file or changing an argument builds a new store; a second identical call only maps the
file. A BDF rewritten with the same size and mtime is not noticed (delete the store's folder, or
pass ``cache=False`` to build the windows afresh in memory).
The folder is written under a temporary name and renamed when complete, so an interrupted build
never looks finished. A folder that cannot be written (read-only, full, a file in the way) raises
:class:`CacheUnwritable`: one line naming the folder and the ways out (``cache_dir=``,
``$HYBRIDNB_CACHE_DIR``, ``cache=False``). :func:`collect` builds the same windows in memory
(``cache=False``: no disk at all).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from . import environment
from .bids import Recording
from .problems import Problem, to_frame

STORE_VERSION = 1
HASHED = (".tsv", ".json")
CACHE_ENV = environment.CACHE_ENV  # "HYBRIDNB_CACHE_DIR"


class CacheUnwritable(OSError):
    """The window store cannot be written where it was to go; the message is one line naming
    the folder, the operating system's reason and what to do. ``errno`` is the OS's."""

    def __init__(self, message: str, errno: int | None = None):
        super().__init__(message)
        self.errno = errno

    @classmethod
    def of(cls, folder: Path, exc: OSError, given: bool) -> CacheUnwritable:
        """The error for ``exc`` raised while writing the store ``folder``; ``given``: the
        folder came from ``cache_dir=`` (so $HYBRIDNB_CACHE_DIR does not apply)."""
        reason = exc.strerror or str(exc) or type(exc).__name__
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(folder) else ""
        fix = ("pass another cache_dir=" if given else
               f"pass cache_dir= or set {CACHE_ENV} to")
        return cls(f"data_prep: cannot write the window cache in {folder.parent}: {reason}"
                   f"{where}; {fix} a writable folder with room for the windows, or pass "
                   "cache=False to keep them in memory (nothing written)", exc.errno)


@dataclass
class Chunk:
    """What one recording contributes: its windows, their metadata, and its problems."""

    X: np.ndarray | None
    meta: dict[str, np.ndarray] | None    # column -> one value per window
    problems: list[Problem] = field(default_factory=list)


def default_cache_dir(recordings: list[Recording], environ: dict | None = None) -> Path:
    """``$HYBRIDNB_CACHE_DIR`` when set; else ``.hybridnb_cache`` next to the dataset folder
    when that folder is writable; else hybridnb's cache folder (``$XDG_CACHE_HOME/hybridnb``
    or ``~/.cache/hybridnb``), said once on stderr."""
    env = environment.current() if environ is None else environ
    if env.get(CACHE_ENV):
        return environment.cache_folder(env)
    for rec in recordings:
        for parent in rec.path.parents:
            if parent.name.startswith("sub-"):
                cand = parent.parent.parent / ".hybridnb_cache"
                if os.access(parent.parent.parent, os.W_OK):
                    return cand
                break
    fallback = environment.cache_folder(env)
    print(f"data_prep: the dataset folder is not writable; caching windows in {fallback} "
          f"(cache_dir= or {CACHE_ENV} choose another folder)", file=sys.stderr)
    return fallback


def file_stamp(path: Path) -> list:
    """What the cache key knows of one input: text sidecars by content, recordings by stat.

    Text files (:data:`HASHED`: events.tsv, participants.tsv, channels.tsv, JSON sidecars) are
    small and hand-edited, so they are keyed by a hash of their bytes: an edit is seen even when
    it keeps the size and the modification time. Recordings (BDF, ...) are keyed by size and
    mtime (ns) only: hashing gigabytes on every call would cost more than the build; an edit
    that keeps both is not seen (``cache=False`` builds afresh, in memory).
    """
    try:
        st = path.stat()
        if path.suffix.lower() in HASHED:
            return [str(path.resolve()), "sha256", hashlib.sha256(path.read_bytes()).hexdigest()]
        return [str(path.resolve()), st.st_size, st.st_mtime_ns]
    except OSError:
        return [str(path), None, None]


def cache_key(recipe: dict, inputs: Iterable[Path]) -> str:
    blob = json.dumps({"v": STORE_VERSION, "recipe": recipe,
                       "inputs": [file_stamp(Path(p)) for p in inputs]}, sort_keys=True,
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def load(folder: Path) -> tuple[np.memmap, pd.DataFrame, pd.DataFrame, dict]:
    info = json.loads((folder / "info.json").read_text())
    meta = pd.read_pickle(folder / "meta.pkl")
    shape = tuple(info["shape"])
    X = np.memmap(folder / "X.f32", np.float32, "r", shape=shape) if shape[0] else \
        np.zeros(shape, np.float32)
    return X, meta["metadata"], meta["problems"], info


def build(folder: Path, recordings: list[Recording], work: Callable[[Recording], Chunk],
          shape_tail: tuple[int, int], info: dict, n_jobs: int = 1, progress: bool = True,
          notes: list[Problem] | None = None) -> Path:
    """Run ``work`` on every recording (in order, ``n_jobs`` threads) and write the store.

    ``notes``: problems found before the build; stored first, before the recordings' own.
    """
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f".tmp-{folder.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    t0 = time.perf_counter()
    try:
        with open(tmp / "X.f32", "wb") as fx:
            def write(X: np.ndarray) -> None:
                fx.write(memoryview(np.ascontiguousarray(X, np.float32)).cast("B"))
            metas, problems, n = _gather(recordings, work, n_jobs, progress, info["name"],
                                         notes, write)
        meta = _frame(metas, info.get("dtypes", {}))
        pd.to_pickle({"metadata": meta, "problems": to_frame(problems)}, tmp / "meta.pkl")
        info = dict(info, shape=[n, *shape_tail], n_recordings=len(recordings),
                    build_seconds=round(time.perf_counter() - t0, 3))
        (tmp / "info.json").write_text(json.dumps(info, indent=1, default=str))
        if folder.exists():          # someone else finished the same store first
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, folder)
    except BaseException:  # cleanup, then re-raised
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def collect(recordings: list[Recording], work: Callable[[Recording], Chunk],
            shape_tail: tuple[int, int], info: dict, n_jobs: int = 1, progress: bool = True,
            notes: list[Problem] | None = None
            ) -> tuple[np.ndarray, pd.DataFrame, pd.DataFrame, dict]:
    """:func:`build` in memory: the same windows, metadata and problems, nothing written (the
    windows are held twice, briefly, while they are joined into one array)."""
    t0 = time.perf_counter()
    parts: list[np.ndarray] = []
    metas, problems, n = _gather(recordings, work, n_jobs, progress, info["name"], notes,
                                 lambda X: parts.append(np.asarray(X, np.float32)))
    X = np.concatenate(parts) if parts else np.zeros((0, *shape_tail), np.float32)
    info = dict(info, shape=[n, *shape_tail], n_recordings=len(recordings),
                build_seconds=round(time.perf_counter() - t0, 3))
    return X, _frame(metas, info.get("dtypes", {})), to_frame(problems), info


def _gather(recordings, work, n_jobs, progress, label, notes, write):
    """Run ``work`` on every recording, hand each chunk's windows to ``write`` in order;
    returns (metadata dicts, problems, number of windows)."""
    metas, problems, n = [], list(notes or []), 0
    for rec_id, chunk in enumerate(_run(work, recordings, n_jobs, progress, label)):
        problems += chunk.problems
        if chunk.X is None or not len(chunk.X):
            continue
        write(chunk.X)
        chunk.meta["recording"] = np.full(len(chunk.X), rec_id, np.int64)
        metas.append(chunk.meta)
        n += len(chunk.X)
    return metas, problems, n


def _run(work, recordings, n_jobs, progress, label):
    if n_jobs > 1 and len(recordings) > 1:
        from joblib import Parallel, delayed
        results = Parallel(n_jobs=n_jobs, prefer="threads", return_as="generator")(
            delayed(work)(r) for r in recordings)
    else:
        results = (work(r) for r in recordings)
    if progress:
        try:
            from tqdm.auto import tqdm
            results = tqdm(results, total=len(recordings), desc=f"{label} windows",
                           unit="rec", leave=False)
        except ImportError:
            pass
    yield from results


def _frame(metas: list[dict], dtypes: dict) -> pd.DataFrame:
    """One DataFrame from the per-recording column dicts (dtypes applied once)."""
    if not metas:
        return pd.DataFrame(columns=["subject", "task", "run", "start", "target", "recording"])
    cols = list(dict.fromkeys(k for m in metas for k in m))
    data = {}
    for c in cols:
        parts = [m[c] if c in m else np.full(len(m["recording"]), None, object) for m in metas]
        data[c] = np.concatenate(parts)
    df = pd.DataFrame(data)
    for c, dt in dtypes.items():
        if c in df.columns:
            df[c] = df[c].astype(dt)
    return df
