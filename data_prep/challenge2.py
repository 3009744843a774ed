"""Challenge 2 windows: fixed 4-s windows, 2-s stride, subject-level target, random 2-s crops.

As the starter kit / local scoring (reference §2.2): recordings with a missing target, fewer
than 400 samples or not 129 channels are left out (and reported here, with the reason);
``create_fixed_length_windows(window_size_samples=400, window_stride_samples=200,
drop_last_window=True)``; the 2-s crops are drawn when the windows are read
(``windows.dataset(crop=200, seed=...)``), one ``random.Random(seed)`` per recording as the
starter kit's ``DatasetWrapper`` does.
"""

from __future__ import annotations

import math

import numpy as np

from . import participants
from . import windows as _w
from .bids import Recording
from .challenge1 import DESCRIPTION
from .participants import ParticipantsError, to_number
from .problems import Problem
from .signal import Unusable, open_checked
from .store import Chunk

N_CHANS = 129
TARGETS = ("externalizing", "p_factor", "attention", "internalizing")
CROP = 200
RECIPE_VERSION = 1


def make_windows(root_or_dataset, tasks=("RestingState",), target: str = "externalizing",
                 window_s: float = 4.0, stride_s: float = 2.0, sfreq: float = 100.0,
                 subjects=None, drop_bad_windows: bool = True, cache_dir=None,
                 cache: bool = True, n_jobs: int | None = None,
                 progress: bool | None = None) -> _w.Windows:
    """Challenge 2 windows (N, 129, 400) of ``tasks``; train on ``.dataset(crop=200)``.

    ``target``: a participants.tsv column (externalizing, the final challenge target; p_factor
    as in the September starter kit; attention; internalizing; or any numeric column).
    ``cache_dir``/``cache`` as in :func:`data_prep.challenge1.make_windows`.
    """
    tasks = (tasks,) if isinstance(tasks, str) else tuple(tasks)
    recs = _w.resolve_inputs(root_or_dataset, tasks, subjects)
    size, stride = int(window_s * sfreq), int(stride_s * sfreq)
    if stride <= 0 or size <= 0:
        raise ValueError(f"window_s and stride_s must be positive, got {window_s}, {stride_s}")
    recipe = {"challenge": 2, "v": RECIPE_VERSION, "tasks": list(tasks), "target": target,
              "size": size, "stride": stride, "sfreq": sfreq, "drop_bad": drop_bad_windows}

    def work(rec: Recording) -> Chunk:
        return _recording_windows(rec, target, size, stride, sfreq, drop_bad_windows)

    _check_targets(recs, target)
    inputs = [p for r in recs for p in _w.recording_inputs(r, events=False)]
    inputs += participants.paths_of(recs)
    return _w.make("challenge2", recs, recipe, inputs, work, (N_CHANS, size),
                   cache_dir=cache_dir, cache=cache, n_jobs=n_jobs, progress=progress,
                   notes=participants.duplicate_notes(recs, DESCRIPTION, target))


def _check_targets(recs: list[Recording], target: str) -> None:
    """Raise once, naming the file, when a participants.tsv cannot give any subject the target."""
    for gap in participants.gaps(recs, (target,)):
        if gap.whole_file:
            raise ParticipantsError(
                f"{gap.path}: {gap.what}; Challenge 2's target '{target}' comes from it, so "
                f"none of the {len(gap.recordings)} recording(s) under {gap.path.parent} has "
                f"one; {participants.RESTORE}")


def window_starts(n_times: int, size: int, stride: int) -> np.ndarray:
    """braindecode's fixed-length starts with drop_last_window=True."""
    return np.arange(0, n_times - size + 1, stride, dtype=np.int64) if n_times >= size else \
        np.zeros(0, np.int64)


def _recording_windows(rec: Recording, target: str, size: int, stride: int, sfreq: float,
                       drop_bad: bool) -> Chunk:
    problems: list[Problem] = []
    ids, name = rec.ids(), rec.name

    def skip(code: str, msg: str) -> Chunk:
        problems.append(Problem(name, "skipped", code, msg, **ids))
        return Chunk(None, None, problems)

    y = to_number(rec.description.get(target))
    if target in rec.conflicts:
        return skip("conflicting_target", (
            f"{name}: participants.tsv lists subject {rec.subject} on several rows with different "
            f"{target} ({' vs '.join(rec.conflicts[target])}); which is right cannot be told, so "
            "the recording is left out; keep one row per subject in participants.tsv"))
    if target not in rec.description:
        return skip("no_target", f"{name}: subject {rec.subject} has no '{target}' in "
                                 "participants.tsv; recording left out")
    if math.isnan(y):
        return skip("nan_target", f"{name}: subject {rec.subject}'s {target} is missing (n/a) "
                                  "in participants.tsv; recording left out")
    try:
        src = open_checked(rec, sfreq=sfreq, n_chans=N_CHANS, min_samples=size)
    except Unusable as exc:
        return skip(exc.code, exc.message)
    try:
        starts = window_starts(src.n_times, size, stride)
        X, bad = src.windows(starts, size, check=drop_bad)
    finally:
        src.close()
    n = len(starts)
    meta = {"subject": rec.subject, "task": rec.task, "run": rec.run, "session": rec.session,
            "file": name, "i_window_in_trial": np.arange(n, dtype=np.int64),
            "i_start_in_trial": starts, "i_stop_in_trial": starts + size,
            "start": starts, "stop": starts + size, "target": np.full(n, y)}
    for k in DESCRIPTION:
        if k in rec.description:
            meta[k] = rec.description[k]
    meta = {k: (np.full(n, v, dtype=object if isinstance(v, str) or v is None else None)
                if np.ndim(v) == 0 else v) for k, v in meta.items()}
    if bad.any():
        problems.append(Problem(name, "dropped", "lost_samples", (
            f"{name}: {int(bad.sum())} of {n} windows hold lost samples (NaN, or every "
            "channel flat for >= 0.5 s: a dropout); dropped"), **ids))
        X, meta = X[~bad], {k: v[~bad] for k, v in meta.items()}
    return Chunk(X, meta, problems)
