"""Reading, checking and repairing ``*_events.tsv`` before any windowing.

Everything here explains problems in plain words and names the file, so that nothing fails
deep inside braindecode or mne-bids:

* ``n/a`` / ``NaN`` durations (HBN writes ``n/a`` everywhere) are why braindecode raises
  ``ValueError: arange: cannot compute length`` when ``create_windows_from_events`` is left to
  infer the window size (size = duration = 0, stride 0). The recipes here always use explicit
  sizes, so such durations are harmless; a literal ``NaN`` is reported as a note.
* Empty ``duration`` cells make mne-bids fail (``could not convert string to float: ''``):
  the file is read here directly (never edited) and the problem noted as repaired.
* Unsorted onsets are sorted (stable), missing columns and unparsable onsets skip the
  recording, trials too close to the end of the recording are dropped, each with the reason.

The trial table replicates eegdash 0.9.1 ``build_trial_table`` exactly (vectorised).
"""

from __future__ import annotations

import io
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd

from .problems import Problem

STIMULI = ("left_target", "right_target")
PRESSES = ("left_buttonPress", "right_buttonPress")


class EventsError(ValueError):
    """An events file that cannot be used (the message names the file and the reason)."""


def read_events(path: str | Path, problems: list[Problem] | None = None, **ids
                ) -> pd.DataFrame:
    """Read an events.tsv as eegdash does (pandas defaults: ``n/a`` -> NaN), checking it.

    Problems (notes and repairs) are appended to ``problems``; ``ids`` (subject, task, run) are
    copied into them. Raises :class:`EventsError` when the file cannot be used at all.
    """
    path = Path(path)
    problems = [] if problems is None else problems
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise EventsError(f"{path.name}: cannot read the events file ({exc})") from exc
    try:
        df = pd.read_csv(io.StringIO(text), sep="\t")
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise EventsError(f"{path.name}: not a readable tab-separated events file ({exc})") from exc
    missing = [c for c in ("onset", "value") if c not in df.columns]
    if missing:
        raise EventsError(f"{path.name}: missing column(s) {missing} (has {list(df.columns)}); "
                          "the trial table needs 'onset' and 'value'")
    onset = pd.to_numeric(df["onset"], errors="coerce")
    bad = df.index[onset.isna()].tolist()
    if bad:
        raise EventsError(f"{path.name}: 'onset' is not a number in row(s) "
                          f"{[b + 2 for b in bad[:5]]} (line numbers); cannot place the events")
    df["onset"] = onset.astype(float)
    _check_durations(path, text, df, problems, ids)
    if not df["onset"].is_monotonic_increasing:
        df = df.sort_values("onset", kind="mergesort").reset_index(drop=True)
        problems.append(Problem(path.name, "repaired", "unsorted_onsets",
                                f"{path.name}: onsets were not in time order; sorted them "
                                "(stable, as eegdash does; the file is unchanged)", **ids))
    return df


def _check_durations(path: Path, text: str, df: pd.DataFrame, problems, ids) -> None:
    if "duration" not in df.columns:
        problems.append(Problem(path.name, "note", "no_duration_column",
                                f"{path.name}: no 'duration' column (BIDS requires one); "
                                "not needed here, windows have explicit sizes", **ids))
        return
    lines = text.splitlines()
    col = lines[0].split("\t").index("duration")
    cells = [ln.split("\t")[col] if col < len(ln.split("\t")) else "" for ln in lines[1:] if ln]
    empty = sum(c.strip() == "" for c in cells)
    nan = sum(c.strip().lower() == "nan" for c in cells)
    if empty:
        problems.append(Problem(
            path.name, "repaired", "empty_durations",
            f"{path.name}: {empty} empty 'duration' cell(s). mne-bids' read_raw_bids fails on "
            "these with \"could not convert string to float: ''\"; read the file directly "
            "instead (empty = n/a = 0 s), the file itself is unchanged", **ids))
    if nan:
        problems.append(Problem(
            path.name, "note", "nan_durations",
            f"{path.name}: {nan} 'duration' cell(s) are NaN. Harmless here (explicit 2-s "
            "windows), but braindecode's create_windows_from_events without "
            "window_size_samples infers size 0 from them and fails with 'arange: cannot "
            "compute length'", **ids))


def build_trial_table(events: pd.DataFrame, last_trial: str = "end_experiment"
                      ) -> pd.DataFrame:
    """The contrast-change trial table, as eegdash 0.9.1 ``build_trial_table`` computes it.

    ``last_trial="end_experiment"`` (eegdash >= 0.5.0): the last trial ends at the last
    ``end_experiment`` row if that is later; ``"drop"`` (eegdash <= 0.4.1, the competition
    cluster's 0.3.8): the last trial of every run is dropped.
    """
    if last_trial not in ("end_experiment", "drop"):
        raise ValueError(f"last_trial must be 'end_experiment' or 'drop', got {last_trial!r}")
    ev = events.copy()
    ev["onset"] = pd.to_numeric(ev["onset"], errors="raise")
    ev = ev.sort_values("onset", kind="mergesort").reset_index(drop=True)
    value = ev["value"]
    onset = ev["onset"].to_numpy(float)
    starts = onset[value.eq("contrastTrial_start").to_numpy()]
    stops = np.append(starts[1:], np.nan)
    ends = onset[value.eq("end_experiment").to_numpy()]
    if last_trial == "end_experiment" and len(starts) and len(ends) and ends[-1] > starts[-1]:
        stops[-1] = ends[-1]
    keep = ~np.isnan(stops)
    starts, stops = starts[keep], stops[keep]
    stim = onset[value.isin(STIMULI).to_numpy()]
    press_rows = np.flatnonzero(value.isin(PRESSES).to_numpy())
    i = _first_in(stim, starts, stops)
    stim_on = np.where(i >= 0, stim[np.maximum(i, 0)] if len(stim) else np.nan, np.nan)
    lo = np.where(i >= 0, stim_on, starts)
    j = _first_in(onset[press_rows], lo, stops)
    resp_on = np.where(j >= 0, onset[press_rows[np.maximum(j, 0)]] if len(press_rows)
                       else np.nan, np.nan)
    fb = ev["feedback"] if "feedback" in ev.columns else None
    resp_type, correct = [], []
    for jj in j:
        row = press_rows[jj] if jj >= 0 else None
        resp_type.append(value.iloc[row] if row is not None else None)
        f = fb.iloc[row] if (row is not None and fb is not None) else None
        correct.append(True if f == "smiley_face" else False if f == "sad_face" else None)
    return pd.DataFrame({
        "trial_start_onset": starts, "trial_stop_onset": stops, "stimulus_onset": stim_on,
        "response_onset": resp_on, "rt_from_stimulus": resp_on - stim_on,
        "rt_from_trialstart": resp_on - starts, "response_type": resp_type,
        "correct": correct,
    })


def _first_in(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per (lo, hi): index of the first of the sorted ``values`` in [lo, hi), or -1."""
    i = np.searchsorted(values, lo, "left")
    ok = i < len(values)
    ok[ok] = values[i[ok]] < hi[ok]
    return np.where(ok, i, -1)


def onset_to_sample(onset: np.ndarray, sfreq: float) -> np.ndarray:
    """Sample index of each onset (s), exactly as MNE turns annotation onsets into events.

    MNE stores onsets through ``timedelta`` (microsecond resolution) when it crops annotations
    to the recording, then rounds ``onset * sfreq`` (``raw.time_as_index(use_rounding=True)``).
    """
    us = np.array([timedelta(seconds=float(o)) / timedelta(microseconds=1) for o in onset])
    return np.round((us / 1e6) * sfreq).astype(int)


def c1_trials(events: pd.DataFrame, n_times: int, sfreq: float, file: str,
              problems: list[Problem], start_offset: int = 50, stop_offset: int = 250,
              last_trial: str = "end_experiment", **ids) -> pd.DataFrame:
    """Trials usable for Challenge 1 (a target and a response) with their window samples.

    Adds ``anchor`` (the target's sample), ``i_start_in_trial``/``i_stop_in_trial`` (window).
    Trials whose window runs past the end are dropped with a note (braindecode would stop the
    whole run: ``"trial_stop_offset_samples" too large``). Raises :class:`EventsError` when the
    recording has no usable trial (the message says why).
    """
    if "feedback" not in events.columns:
        problems.append(Problem(file, "note", "no_feedback",
                                f"{file}: no 'feedback' column, so 'correct' is unknown (NA) for "
                                "every trial (eegdash <= 0.4.1 raised KeyError here)", **ids))
    table = build_trial_table(events, last_trial=last_trial)
    n_all = len(table)
    table = table[table["stimulus_onset"].notna() & table["response_onset"].notna()]
    if table.empty:
        n_press = int(events["value"].isin(PRESSES).sum())
        n_stim = int(events["value"].isin(STIMULI).sum())
        raise EventsError(f"{file}: no trial with both a target and a response ({n_all} trials, "
                          f"{n_stim} targets, {n_press} button presses); nothing to window")
    last_s = (n_times - 1) / sfreq
    # as MNE crops annotations to the data: trial starts / targets after the last sample vanish
    table = table[(table["trial_start_onset"] <= last_s) & (table["stimulus_onset"] <= last_s)]
    anchor = onset_to_sample(table["stimulus_onset"].to_numpy(), sfreq)
    fits = anchor + stop_offset <= n_times
    if not fits.all():
        late = table["stimulus_onset"].to_numpy()[~fits]
        problems.append(Problem(
            file, "dropped", "late_anchor",
            f"{file}: {len(late)} trial(s) with the target at {', '.join(f'{t:g}' for t in late)}"
            f" s: the window {start_offset / sfreq:g}–{stop_offset / sfreq:g} s after it runs "
            f"past the end of the recording ({n_times / sfreq:g} s); dropped those trials "
            "(braindecode would stop the whole run with '\"trial_stop_offset_samples\" too "
            "large')", **ids))
    table = table.assign(anchor=anchor, i_start_in_trial=anchor + start_offset,
                         i_stop_in_trial=anchor + stop_offset)[fits]
    if table.empty:
        raise EventsError(f"{file}: every trial's window runs past the end of the recording")
    return table.reset_index(drop=True)
