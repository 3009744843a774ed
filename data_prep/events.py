"""Reading, checking and repairing ``*_events.tsv`` before any windowing.

Everything here explains problems in plain words and names the file, so that nothing fails
deep inside braindecode or mne-bids:

* ``n/a`` / ``NaN`` durations (HBN writes ``n/a`` everywhere) are why braindecode raises
  ``ValueError: arange: cannot compute length`` when ``create_windows_from_events`` is left to
  infer the window size (size = duration = 0, stride 0). The recipes here always use explicit
  sizes, so such durations are harmless; a literal ``NaN`` is reported as a note.
* Empty ``duration`` cells make mne-bids fail (``could not convert string to float: ''``):
  the file is read here directly (never edited) and the problem noted as repaired.
* Unsorted onsets are sorted (stable); missing columns and onsets that are missing (``n/a``,
  ``NaN``: pandas reads both as NaN, and eegdash's trial table then silently loses the trials
  around them) or not numbers skip the recording, naming the line; trials whose window starts before or ends after the recording are dropped, each
  with the reason.

The trial table replicates eegdash 0.9.1 ``build_trial_table`` exactly (vectorised).
"""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd

from .participants import to_number
from .problems import Problem

STIMULI = ("left_target", "right_target")
PRESSES = ("left_buttonPress", "right_buttonPress")


class EventsError(ValueError):
    """An events file that cannot be used (the message names the file and the reason).

    ``code`` tags the reason for :class:`~data_prep.problems.Problem` (``bad_events``,
    ``no_trials``, ``too_short``, ``before_start``).
    """

    def __init__(self, message: str, code: str = "bad_events"):
        super().__init__(message)
        self.code = code


# the strings pandas' read_csv turns into NaN by default (eegdash reads events with defaults)
NA_STRINGS = frozenset({"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan",
                        "1.#IND", "1.#QNAN", "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a",
                        "nan", "null"})


def read_events(path: str | Path, problems: list[Problem] | None = None,
                as_frame: bool = True, **ids):
    """Read an events.tsv with eegdash's reading (pandas defaults: ``n/a`` -> NaN), checking it.

    Returns a DataFrame (``as_frame=False``: a dict of numpy arrays, faster, same values;
    cells pandas reads as NaN are NaN here too). Problems (notes and repairs) are appended to
    ``problems`` with ``ids`` (subject, task, run). Raises :class:`EventsError` when the file
    cannot be used at all. Onsets are parsed with Python's ``float`` (correctly rounded; the
    same numbers pandas gives for the millisecond onsets of HBN files).
    """
    path = Path(path)
    problems = [] if problems is None else problems
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise EventsError(f"{path.name}: cannot read the events file ({exc})") from exc
    lines = [ln for ln in lines if ln.strip()]
    if not lines:
        raise EventsError(f"{path.name}: the events file is empty")
    header = lines[0].split("\t")
    missing = [c for c in ("onset", "value") if c not in header]
    if missing:
        raise EventsError(f"{path.name}: missing column(s) {missing} (has {header}); "
                          "the trial table needs 'onset' and 'value'")
    rows = [ln.split("\t") for ln in lines[1:]]
    width = len(header)
    cols = {h: [r[k] if k < len(r) else "" for r in rows] for k, h in enumerate(header)}
    if any(len(r) > width for r in rows):
        raise EventsError(f"{path.name}: some rows have more cells than the header "
                          f"({width} columns); not a valid events.tsv")
    onset = np.empty(len(rows))
    for k, cell in enumerate(cols["onset"]):
        try:
            onset[k] = float(cell)
        except ValueError:
            onset[k] = np.nan
        if not np.isfinite(onset[k]):
            _bad_onset(path, k + 2, cell)
    _check_durations(path, cols.get("duration"), problems, ids)
    ev = {h: (onset if h == "onset" else _column(cols[h])) for h in header}
    if len(onset) > 1 and np.any(np.diff(onset) < 0):
        order = np.argsort(onset, kind="stable")
        ev = {h: v[order] for h, v in ev.items()}
        problems.append(Problem(path.name, "repaired", "unsorted_onsets",
                                f"{path.name}: onsets were not in time order; sorted them "
                                "(stable, as eegdash does; the file is unchanged)", **ids))
    return pd.DataFrame(ev) if as_frame else ev


def _bad_onset(path: Path, line: int, cell: str) -> None:
    """Raise the EventsError for an onset that places no event (n/a, NaN, text, inf)."""
    if cell.strip() in NA_STRINGS or cell.strip().lower() == "nan":
        raise EventsError(f"{path.name}: 'onset' is missing in line {line} ({cell!r}): that "
                          "event has no time, so the trials around it cannot be "
                          "built; recording left out (write the onset in seconds, or delete "
                          "the row)", code="missing_onset")
    what = "not a number" if math.isnan(to_number(cell)) else "not a finite number"
    raise EventsError(f"{path.name}: 'onset' is {what} in line {line} ({cell!r}); cannot place "
                      "the events")


def _column(cells: list[str]) -> np.ndarray:
    """A column as pandas would parse it: all numbers -> float64, else objects (NA -> NaN)."""
    try:
        return np.array([np.nan if c in NA_STRINGS else float(c) for c in cells], float)
    except ValueError:
        return np.array([np.nan if c in NA_STRINGS else c for c in cells], object)


def _check_durations(path: Path, cells: list[str] | None, problems, ids) -> None:
    if cells is None:
        problems.append(Problem(path.name, "note", "no_duration_column",
                                f"{path.name}: no 'duration' column (BIDS requires one); "
                                "not needed here, windows have explicit sizes", **ids))
        return
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
    return pd.DataFrame(trial_arrays(events, last_trial))


def trial_arrays(events, last_trial: str = "end_experiment") -> dict[str, np.ndarray]:
    """:func:`build_trial_table` as a dict of arrays (events: a DataFrame or a dict of arrays)."""
    if last_trial not in ("end_experiment", "drop"):
        raise ValueError(f"last_trial must be 'end_experiment' or 'drop', got {last_trial!r}")
    onset = np.asarray(events["onset"])
    if onset.dtype.kind != "f":
        onset = pd.to_numeric(pd.Series(onset), errors="raise").to_numpy(float)
    order = np.argsort(onset, kind="stable")
    onset = onset[order]
    value = np.asarray(events["value"], object)[order]
    starts = onset[value == "contrastTrial_start"]
    stops = np.append(starts[1:], np.nan) if len(starts) else np.zeros(0)
    ends = onset[value == "end_experiment"]
    if last_trial == "end_experiment" and len(starts) and len(ends) and ends[-1] > starts[-1]:
        stops[-1] = ends[-1]
    keep = ~np.isnan(stops)
    starts, stops = starts[keep], stops[keep]
    stim = onset[np.isin(value, STIMULI)]
    press_rows = np.flatnonzero(np.isin(value, PRESSES))
    i = _first_in(stim, starts, stops)
    stim_on = np.where(i >= 0, stim[np.maximum(i, 0)] if len(stim) else np.nan, np.nan)
    lo = np.where(i >= 0, stim_on, starts)
    j = _first_in(onset[press_rows], lo, stops)
    resp_on = np.where(j >= 0, onset[press_rows[np.maximum(j, 0)]] if len(press_rows)
                       else np.nan, np.nan)
    fb = np.asarray(events["feedback"], object)[order] if "feedback" in events else None
    resp_type, correct = [], []
    for jj in j:
        row = press_rows[jj] if jj >= 0 else None
        resp_type.append(value[row] if row is not None else None)
        f = fb[row] if (row is not None and fb is not None) else None
        correct.append(True if f == "smiley_face" else False if f == "sad_face" else None)
    return {
        "trial_start_onset": starts, "trial_stop_onset": stops, "stimulus_onset": stim_on,
        "response_onset": resp_on, "rt_from_stimulus": resp_on - stim_on,
        "rt_from_trialstart": resp_on - starts, "response_type": np.array(resp_type, object),
        "correct": np.array(correct, object),
    }


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


def c1_trials(events, n_times: int, sfreq: float, file: str, problems: list[Problem],
              start_offset: int = 50, stop_offset: int = 250,
              last_trial: str = "end_experiment", **ids) -> dict[str, np.ndarray]:
    """Trials usable for Challenge 1 (a target and a response) with their window samples.

    Returns the trial arrays (:func:`trial_arrays`) plus ``anchor`` (the target's sample) and
    ``i_start_in_trial``/``i_stop_in_trial`` (the window). Trials whose window runs past the end,
    or starts before the recording (shifted onsets), are dropped with a note each kind
    (braindecode would stop the whole run: ``"trial_stop_offset_samples" too large``, or fail
    reading negative samples). Raises :class:`EventsError` when no trial is usable; the message
    says why (for a recording too short for any window: its length and the length needed).
    """
    if "feedback" not in events:
        problems.append(Problem(file, "note", "no_feedback",
                                f"{file}: no 'feedback' column, so 'correct' is unknown (NA) for "
                                "every trial (eegdash <= 0.4.1 raised KeyError here)", **ids))
    t = trial_arrays(events, last_trial=last_trial)
    n_all = len(t["trial_start_onset"])
    last_s = (n_times - 1) / sfreq
    ok = ~np.isnan(t["stimulus_onset"]) & ~np.isnan(t["response_onset"])
    if not ok.any():
        value = np.asarray(events["value"], object)
        raise EventsError(f"{file}: no trial with both a target and a response ({n_all} trials, "
                          f"{int(np.isin(value, STIMULI).sum())} targets, "
                          f"{int(np.isin(value, PRESSES).sum())} button presses); "
                          "nothing to window", code="no_trials")
    answered = t["stimulus_onset"][ok]
    # as MNE crops annotations to the data: trial starts / targets after the last sample vanish
    ok &= (t["trial_start_onset"] <= last_s) & (t["stimulus_onset"] <= last_s)
    t = {k: v[ok] for k, v in t.items()}
    anchor = onset_to_sample(t["stimulus_onset"], sfreq)
    early = anchor + start_offset < 0
    late = anchor + stop_offset > n_times
    fits = ~early & ~late
    span = f"{start_offset / sfreq:g}–{stop_offset / sfreq:g} s"
    if not fits.any():
        raise _nothing_fits(file, answered, n_times, sfreq, start_offset, stop_offset, span)
    at = t["stimulus_onset"]
    if early.any():
        problems.append(_dropped(file, "before_start", at[early], span, (
            "starts before the recording begins (0 s); dropped those trials (are the "
            "events.tsv onsets shifted?)"), ids))
    if late.any():
        problems.append(_dropped(file, "late_anchor", at[late], span, (
            f"runs past the end of the recording ({n_times / sfreq:g} s); dropped those trials "
            "(braindecode would stop the whole run with '\"trial_stop_offset_samples\" too "
            "large')"), ids))
    t = {k: v[fits] for k, v in t.items()}
    anchor = anchor[fits]
    t.update(anchor=anchor, i_start_in_trial=anchor + start_offset,
             i_stop_in_trial=anchor + stop_offset)
    return t


def _dropped(file: str, code: str, targets: np.ndarray, span: str, why: str, ids: dict
             ) -> Problem:
    return Problem(file, "dropped", code,
                   f"{file}: {len(targets)} trial(s) with the target at "
                   f"{', '.join(f'{x:g}' for x in targets)} s: the window {span} after it {why}",
                   **ids)


def _nothing_fits(file: str, answered: np.ndarray, n_times: int, sfreq: float,
                  start_offset: int, stop_offset: int, span: str) -> EventsError:
    """The error for a recording where no answered trial's window lies inside the data.

    ``answered``: the targets (s) of the trials with a response, before any was dropped.
    """
    anchor = onset_to_sample(answered, sfreq)
    after_zero = anchor + start_offset >= 0
    if not after_zero.any():
        return EventsError(
            f"{file}: every trial's window ({span} after its target) starts before the "
            f"recording begins (the latest target at {answered.max():g} s); are the "
            "events.tsv onsets shifted? Recording left out", code="before_start")
    k = int(np.argmin(np.where(after_zero, answered, np.inf)))
    need = int(anchor[k]) + stop_offset
    return EventsError(
        f"{file}: the recording is {n_times / sfreq:g} s ({n_times} samples) long, too short "
        f"for any Challenge 1 window: each window is {span} after a trial's target, and the "
        f"first target at {answered[k]:g} s needs {need} samples ({need / sfreq:g} s); "
        "recording left out", code="too_short")
