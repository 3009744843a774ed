"""Challenge 1 windows: the starter kit's recipe on contrastChangeDetection runs.

Exactly as eegdash 0.9.1 + braindecode 1.8.1 with the starter kit's arguments (reference §1.1):
trial table from events.tsv (``build_trial_table``), trials with a target and a response, one
window per trial anchored at the target: samples ``[target + 50, target + 250)`` = 0.5–2.5 s
after it, 200 samples; target = ``rt_from_stimulus`` (s). The metadata carries the starter kit's
extra columns. Unlike the official pipeline, a bad recording does not stop the run: it is left
out (or its bad trials are) and the reason is in ``Windows.problems``.
"""

from __future__ import annotations

import numpy as np

from . import participants
from . import windows as _w
from .bids import Recording
from .events import EventsError, c1_trials, read_events
from .problems import Problem
from .signal import Unusable, open_checked
from .store import Chunk

TASK = "contrastChangeDetection"
N_CHANS = 129
EXTRAS = ("target", "rt_from_stimulus", "rt_from_trialstart", "stimulus_onset",
          "response_onset", "correct", "response_type")
DESCRIPTION = ("age", "sex", "p_factor", "attention", "internalizing", "externalizing")
RECIPE_VERSION = 1


def make_windows(root_or_dataset, shift_after_stim: float = 0.5, window_len: float = 2.0,
                 sfreq: float = 100.0, target: str = "rt_from_stimulus",
                 last_trial: str = "end_experiment", subjects=None,
                 drop_bad_windows: bool = True, cache_dir=None, cache: bool = True,
                 n_jobs: int | None = None, progress: bool | None = None) -> _w.Windows:
    """Challenge 1 windows (N, 129, 200) of a BIDS root, an eegdash dataset or Recordings.

    ``last_trial="drop"`` reproduces eegdash <= 0.4.1 (the competition cluster's 0.3.8), which
    dropped the last trial of every run. ``drop_bad_windows`` leaves out windows with lost
    samples (non-finite, or all channels flat >= 0.5 s). Cached in ``cache_dir`` (default:
    ``$HYBRIDNB_CACHE_DIR``, else next to the release, else ``~/.cache/hybridnb``): a second
    identical call loads the stored windows (see :mod:`data_prep.store`); ``cache=False``
    builds them in memory and writes nothing.
    """
    if target not in ("rt_from_stimulus", "rt_from_trialstart"):
        raise ValueError(f"target must be 'rt_from_stimulus' or 'rt_from_trialstart', "
                         f"got {target!r}")
    recs = _w.resolve_inputs(root_or_dataset, (TASK,), subjects)
    start = int(shift_after_stim * sfreq)
    stop = int((shift_after_stim + window_len) * sfreq)
    size = int(window_len * sfreq)
    recipe = {"challenge": 1, "v": RECIPE_VERSION, "start": start, "stop": stop, "size": size,
              "sfreq": sfreq, "target": target, "last_trial": last_trial,
              "drop_bad": drop_bad_windows}

    def work(rec: Recording) -> Chunk:
        return _recording_windows(rec, start, stop, size, sfreq, target, last_trial,
                                  drop_bad_windows)

    inputs = [p for r in recs for p in _w.recording_inputs(r, events=True)]
    return _w.make("challenge1", recs, recipe, inputs + participants.paths_of(recs), work,
                   (N_CHANS, size), cache_dir=cache_dir, cache=cache, n_jobs=n_jobs,
                   progress=progress, dtypes=DTYPES,
                   notes=_demographics_notes(recs) + participants.duplicate_notes(recs, DESCRIPTION))


def _demographics_notes(recs: list[Recording]) -> list[Problem]:
    """One note per participants.tsv that could not give demographics (file missing, ...)."""
    notes = []
    for gap in participants.gaps(recs, DESCRIPTION):
        cols = [c for c in DESCRIPTION if any(c not in r.description for r in gap.recordings)]
        notes.append(Problem(
            str(gap.path), "note", "no_participants" if gap.whole_file else "not_in_participants",
            f"{gap.path}: {gap.what}, so the windows of {len(gap.recordings)} recording(s) have "
            f"no {', '.join(cols)} columns (demographics); {participants.RESTORE} to get them"))
    return notes


def _recording_windows(rec: Recording, start: int, stop: int, size: int, sfreq: float,
                       target: str, last_trial: str, drop_bad: bool) -> Chunk:
    problems: list[Problem] = []
    ids = rec.ids()
    name = rec.name

    def skip(code: str, msg: str) -> Chunk:
        problems.append(Problem(name, "skipped", code, msg, **ids))
        return Chunk(None, None, problems)

    try:
        src = open_checked(rec, sfreq=sfreq, n_chans=N_CHANS)
    except Unusable as exc:
        return skip(exc.code, exc.message)
    try:
        if not rec.events_path.exists():
            return skip("no_events", f"{name}: no events file {rec.events_path.name}")
        try:
            events = read_events(rec.events_path, problems, as_frame=False, **ids)
            trials = c1_trials(events, src.n_times, sfreq, rec.events_path.name, problems,
                               start_offset=start, stop_offset=stop, last_trial=last_trial,
                               **ids)
        except EventsError as exc:
            return skip(exc.code, str(exc))
        X, bad = src.windows(trials["i_start_in_trial"], size, check=drop_bad)
    finally:
        src.close()
    meta = _metadata(rec, trials, target, size)
    if bad.any():
        at = ", ".join(f"{s / sfreq:g}" for s in meta["i_start_in_trial"][bad])
        problems.append(Problem(name, "dropped", "lost_samples", (
            f"{name}: {int(bad.sum())} window(s) starting at {at} s hold lost samples "
            "(NaN, or every channel flat for >= 0.5 s: a dropout); dropped"), **ids))
        X, meta = X[~bad], {k: v[~bad] for k, v in meta.items()}
    return Chunk(X, meta, problems)


def _metadata(rec: Recording, trials: dict, target: str, size: int) -> dict:
    """Per-window metadata columns (plain arrays; one DataFrame is made for the whole store)."""
    n = len(trials["anchor"])
    start = trials["i_start_in_trial"].astype(np.int64)
    meta = {"subject": rec.subject, "task": rec.task, "run": rec.run, "session": rec.session,
            "file": rec.name, "i_window_in_trial": np.zeros(n, np.int64),
            "i_start_in_trial": start, "i_stop_in_trial": trials["i_stop_in_trial"],
            "start": start, "stop": start + size, "target": trials[target]}
    for k in EXTRAS[1:]:
        meta[k] = trials[k]
    meta["correct"] = np.array([np.nan if c is None else float(bool(c))
                                for c in trials["correct"]])
    for k in DESCRIPTION:
        if k in rec.description:
            meta[k] = rec.description[k]
    return {k: (np.full(n, v, dtype=object if isinstance(v, str) or v is None else None)
                if np.ndim(v) == 0 else v) for k, v in meta.items()}


DTYPES = {"target": "Float64", "rt_from_stimulus": "Float64", "rt_from_trialstart": "Float64",
          "stimulus_onset": "Float64", "response_onset": "Float64", "correct": "Int64",
          "response_type": "string"}
