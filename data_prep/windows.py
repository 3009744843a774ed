"""``Windows``: every window of a recipe in one contiguous float32 array on disk, plus metadata.

``w.X`` is an (N, C, T) float32 memmap (volts, as the official pipeline gives them), ``w.y`` the
float32 targets, ``w.metadata`` one row per window (subject, task, run, start, target, ...),
``w.problems`` what was repaired, dropped or skipped and why. ``w.dataset()`` is the torch
Dataset for training: batches are fetched whole (sorted indices, one read from the memmap),
Challenge 2's random 2-s crops are slices, and ``device="cuda"`` puts the whole store in GPU
memory so crops and batches are made there. Subsets (``w.subset(idx)``, ``splits.by_subject``)
share the memmap.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from . import environment, store
from .bids import Recording, find_recordings, recordings_from_dataset
from .problems import Problem, summarize


class Windows:
    """Windows of one recipe (see module docstring). Build with challenge1/2.make_windows."""

    def __init__(self, X: np.ndarray, metadata: pd.DataFrame, problems: pd.DataFrame,
                 info: dict | None = None, index: np.ndarray | None = None):
        self._base = X
        self._index = None if index is None else np.asarray(index, np.int64)
        self._meta_all = metadata
        self.problems = problems
        self.info = dict(info or {})

    # --- views -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._base) if self._index is None else len(self._index)

    def __repr__(self) -> str:
        skipped = int((self.problems["level"] == "skipped").sum()) if len(self.problems) else 0
        return (f"Windows({self.info.get('name', '?')}: {len(self)} × {self.shape[1:]} float32, "
                f"{self.metadata['subject'].nunique() if len(self) else 0} subjects, "
                f"{len(self.problems)} problems ({skipped} recordings skipped))")

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self), *self._base.shape[1:])

    @property
    def index(self) -> np.ndarray:
        """Rows of the underlying store that this (sub)set uses."""
        return np.arange(len(self._base)) if self._index is None else self._index

    @property
    def X(self) -> np.ndarray:
        """(N, C, T) float32. The memmap itself for a full set; a subset copies its rows."""
        return self._base if self._index is None else self._base[self._index]

    @property
    def metadata(self) -> pd.DataFrame:
        if self._index is None:
            return self._meta_all
        return self._meta_all.iloc[self._index].reset_index(drop=True)

    @property
    def y(self) -> np.ndarray:
        return self.metadata["target"].to_numpy(np.float32, na_value=np.nan)

    def subset(self, index) -> Windows:
        """Windows at positions ``index`` of this set (a bool mask or integers), same memmap."""
        index = np.asarray(index)
        if index.dtype == bool:
            index = np.flatnonzero(index)
        return Windows(self._base, self._meta_all, self.problems, self.info,
                       self.index[index])

    def report(self) -> str:
        """What was built, and every problem found, as plain text."""
        head = repr(self)
        if self.info.get("cached"):
            head += f"\nloaded from the cache {self.info.get('folder')}"
        return head + "\n" + summarize(self.problems)

    # --- training ----------------------------------------------------------------------------
    def dataset(self, crop: int | None = None, seed: int | None = None, device=None,
                scale: float = 1.0, target=None):
        """A torch Dataset of (x, y) over these windows; see :class:`WindowDataset`.
        ``target``: a :class:`~data_prep.targets.TargetScaling` to standardise ``y`` with."""
        from .loader import WindowDataset
        return WindowDataset(self, crop=crop, seed=seed, device=device, scale=scale,
                             target=target)

    def to_dataset(self):
        """The Dataset a trainer makes of these windows when given them as they are
        (``hn.Trainer.fit(train, val)``): ``dataset(scale=SCALE)``, volts -> µV as the recipes
        train. Crops (Challenge 2) and target scaling are yours to ask with :meth:`dataset`."""
        from .recipes import SCALE
        return self.dataset(scale=SCALE)

    def loader(self, batch_size: int = 128, shuffle: bool = True, crop: int | None = None,
               seed: int | None = None, device=None, scale: float = 1.0, **kwargs):
        """A DataLoader that fetches whole batches (no per-sample collation)."""
        return self.dataset(crop=crop, seed=seed, device=device, scale=scale).loader(
            batch_size=batch_size, shuffle=shuffle, **kwargs)

    def to_tensor(self, device="cpu"):
        """All windows of this set as one torch tensor on ``device`` (copied in chunks)."""
        import torch
        out = torch.empty(self.shape, dtype=torch.float32, device=device)
        idx = self.index
        for s in range(0, len(idx), 2048):
            part = idx[s:s + 2048]
            rows = self._base[part[0]:part[-1] + 1] if _contiguous(part) else self._base[part]
            out[s:s + len(part)] = torch.from_numpy(np.ascontiguousarray(rows)).to(device)
        return out


def _contiguous(idx: np.ndarray) -> bool:
    return len(idx) > 0 and idx[-1] - idx[0] + 1 == len(idx) and bool((np.diff(idx) == 1).all())


def resolve_inputs(root_or_dataset, tasks, subjects=None) -> list[Recording]:
    """A BIDS root (path), an eegdash/braindecode dataset or a list of Recordings -> recordings."""
    if isinstance(root_or_dataset, (str, os.PathLike)):
        recs = find_recordings(root_or_dataset, tasks=tasks, subjects=subjects)
        if not recs:
            raise FileNotFoundError(f"no EEG recordings of task(s) {list(tasks)} under "
                                    f"{root_or_dataset}")
        return recs
    if isinstance(root_or_dataset, (list, tuple)) and all(
            isinstance(r, Recording) for r in root_or_dataset):
        recs = list(root_or_dataset)
    else:
        recs = recordings_from_dataset(root_or_dataset)
    recs = [r for r in recs if r.task in tasks and (not subjects or r.subject in subjects)]
    if not recs:
        raise ValueError(f"the dataset holds no recordings of task(s) {list(tasks)}")
    return recs


def recording_inputs(rec: Recording, events: bool) -> list[Path]:
    """The files of ``rec`` its windows depend on (for the cache key).

    The recording itself, its events.tsv when the recipe reads it, and for recordings opened
    through mne-bids (anything but a BDF) the events.tsv and channels.tsv mne-bids reads too.
    """
    out = [rec.path]
    via_mne = rec.path.suffix.lower() != ".bdf"
    if events or via_mne:
        out.append(rec.events_path)
    if via_mne:
        out.append(rec.events_path.with_name(
            rec.events_path.name.replace("_events.tsv", "_channels.tsv")))
    return out


def default_jobs(n_recordings: int) -> int:
    """Threads for the build. Measured on 2 cores: 2 threads were slower than 1 (C1 ~equal,
    C2 2-4x slower: the writer and the readers fight over memory bandwidth and the GIL), so
    parallel reading starts only from 8 cores."""
    cores = environment.usable_cores()
    if (cores) < 8:
        return 1
    return max(1, min(cores // 2, 8, n_recordings // 8 or 1))


def make(name: str, recordings: list[Recording], recipe: dict, inputs: list[Path],
         work, shape_tail: tuple[int, int], cache_dir=None, cache: bool = True,
         n_jobs: int | None = None, progress: bool | None = None,
         dtypes: dict | None = None, notes: list[Problem] | None = None) -> Windows:
    """Load the store for ``recipe`` from the cache, or build it (shared by both challenges).

    ``cache=False`` builds the windows in memory: nothing is read from or written to any cache
    folder (a stale store is removed by deleting its folder, ``Windows.info["folder"]`` of the
    call that loaded it). A cache folder that cannot be written raises
    :class:`~data_prep.store.CacheUnwritable` naming it. ``notes``: problems found before the
    build (about the release, not one recording), stored with the recordings' own problems.
    """
    in_memory = any(r.raw is not None and getattr(r.raw, "preload", False) for r in recordings)
    if in_memory and cache:
        print("data_prep: recordings already loaded in memory may have been changed there; "
              "not caching these windows", file=sys.stderr)
        cache = False
    key = store.cache_key(recipe, inputs)
    progress = len(recordings) >= 20 if progress is None else progress
    info = {"name": name, "recipe": recipe, "key": key, "dtypes": dtypes or {}}
    jobs = default_jobs(len(recordings)) if n_jobs is None else max(1, n_jobs)
    if not cache:
        X, meta, problems, info = store.collect(recordings, _guarded(work), shape_tail, info,
                                                n_jobs=jobs, progress=progress, notes=notes)
        info.update(cached=False, folder=None)
        return Windows(X, meta, problems, info)
    given = bool(cache_dir)
    cache_dir = Path(cache_dir) if cache_dir else store.default_cache_dir(recordings)
    folder = cache_dir / f"{name}-{key}"
    if (folder / "info.json").exists():
        X, meta, problems, info = store.load(folder)
        info.update(cached=True, folder=str(folder))
        return Windows(X, meta, problems, info)
    try:
        store.build(folder, recordings, _guarded(work), shape_tail, info, n_jobs=jobs,
                    progress=progress, notes=notes)
    except OSError as exc:    # the recordings' own errors are problems (_guarded): this is the disk
        raise store.CacheUnwritable.of(folder, exc, given) from None
    X, meta, problems, info = store.load(folder)
    info.update(cached=False, folder=str(folder))
    return Windows(X, meta, problems, info)


def _guarded(work):
    """Any unexpected error in one recording skips that recording (reported), not the run."""
    def run(rec: Recording) -> store.Chunk:
        try:
            return work(rec)
        except Exception as exc:  # noqa: BLE001 - reported as a problem, never silent
            msg = f"{rec.name}: unexpected {type(exc).__name__}: {exc}"
            return store.Chunk(None, None, [Problem(rec.name, "skipped", "error", msg,
                                                    **rec.ids())])
    return run
