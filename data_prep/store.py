"""Building the window store once and finding it again: cache keys, parallel build, atomic write.

A store is a folder ``<cache_dir>/<name>-<key>/`` with ``X.f32`` (all windows, one contiguous
float32 array (N, C, T), read back as a memmap), ``meta.pkl`` (metadata and problems) and
``info.json``. The key hashes the recipe and every input file: the text files (events.tsv,
participants.tsv, channels.tsv) by content, the recordings (BDF) by path, size and mtime — so
editing a file or changing an argument builds a new store; a second identical call only maps the
file. A BDF rewritten with the same size and mtime is not noticed (``cache=False`` rebuilds).
The folder is written under a temporary name and renamed when complete, so an interrupted build
never looks finished.
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

from .bids import Recording
from .problems import Problem, to_frame

STORE_VERSION = 1
HASHED = (".tsv", ".json")


@dataclass
class Chunk:
    """What one recording contributes: its windows, their metadata, and its problems."""

    X: np.ndarray | None
    meta: dict[str, np.ndarray] | None    # column -> one value per window
    problems: list[Problem] = field(default_factory=list)


def default_cache_dir(recordings: list[Recording]) -> Path:
    """``.hybridnb_cache`` next to the dataset folder (falls back to ~/.cache/hybridnb)."""
    for rec in recordings:
        for parent in rec.path.parents:
            if parent.name.startswith("sub-"):
                cand = parent.parent.parent / ".hybridnb_cache"
                if os.access(parent.parent.parent, os.W_OK):
                    return cand
                break
    fallback = Path.home() / ".cache" / "hybridnb"
    print(f"data_prep: the dataset folder is not writable; caching windows in {fallback}",
          file=sys.stderr)
    return fallback


def file_stamp(path: Path) -> list:
    """What the cache key knows of one input: text sidecars by content, recordings by stat.

    Text files (:data:`HASHED`: events.tsv, participants.tsv, channels.tsv, JSON sidecars) are
    small and hand-edited, so they are keyed by a hash of their bytes: an edit is seen even when
    it keeps the size and the modification time. Recordings (BDF, ...) are keyed by size and
    mtime (ns) only: hashing gigabytes on every call would cost more than the build; an edit
    that keeps both is not seen (``cache=False`` rebuilds).
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
    metas, problems, n = [], list(notes or []), 0
    try:
        with open(tmp / "X.f32", "wb") as fx:
            for rec_id, chunk in enumerate(_run(work, recordings, n_jobs, progress, info["name"])):
                problems += chunk.problems
                if chunk.X is None or not len(chunk.X):
                    continue
                fx.write(memoryview(np.ascontiguousarray(chunk.X, np.float32)).cast("B"))
                chunk.meta["recording"] = np.full(len(chunk.X), rec_id, np.int64)
                metas.append(chunk.meta)
                n += len(chunk.X)
        meta = _frame(metas, info.get("dtypes", {}))
        pd.to_pickle({"metadata": meta, "problems": to_frame(problems)}, tmp / "meta.pkl")
        info = dict(info, shape=[n, *shape_tail], n_recordings=len(recordings),
                    build_seconds=round(time.perf_counter() - t0, 3))
        (tmp / "info.json").write_text(json.dumps(info, indent=1, default=str))
        if folder.exists():          # someone else finished the same store first
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


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
