"""Writing one synthetic recording (BDF + sidecars), and the deliberately broken ones.

Each fault is planted in exactly one recording (a different subject each, counted from the
last subject), so tests and the windowing-fixes notebook can check that it is found, named, and
that the other recordings still give their windows.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .bdf import write_bdf
from .synth_signal import SFREQ, Timeline, montage_positions, simulate

FAULTS = {
    "nan_durations": "contrastChangeDetection run-1: the duration column holds the literal 'NaN' "
                     "(harmless to mne-bids; braindecode's inferred window size becomes 0 and "
                     "fails with 'arange: cannot compute length')",
    "empty_durations": "contrastChangeDetection run-1: empty duration cells (mne-bids fails: "
                       "\"could not convert string to float: ''\")",
    "no_feedback": "contrastChangeDetection run-1: no 'feedback' column (correct unknown; "
                   "eegdash <= 0.4.1 raised KeyError)",
    "six_channels": "contrastChangeDetection run-1: only 6 channels (like the 6-channel R7 files)",
    "short_recording": "RestingState: 3 s long (< 4 s, no 4-s window fits)",
    "no_presses": "contrastChangeDetection run-1: no button presses (no trial has a response)",
    "nan_stretch": "contrastChangeDetection run-1: 2 s of lost samples across all channels inside "
                   "the third answered trial's window (BDF cannot store NaN: written as flat zeros)",
    "truncated_bdf": "contrastChangeDetection run-1: the BDF is cut to 60 % of its bytes",
    "unsorted_onsets": "contrastChangeDetection run-1: two events.tsv rows swapped (onsets not "
                       "sorted)",
    "late_anchor": "contrastChangeDetection run-1: the recording ends 1 s after the last target, "
                   "too early for that trial's 0.5–2.5 s window (braindecode: "
                   "'\"trial_stop_offset_samples\" too large')",
}
_TASK_OF = {f: ("RestingState" if f == "short_recording" else "contrastChangeDetection")
            for f in FAULTS}


def assign_faults(faults, n_subjects: int, tasks) -> dict[tuple[int, str, str | None], str]:
    """{(subject index, task, run): fault name}, one recording per fault, distinct subjects."""
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        raise ValueError(f"make_hbn_like: unknown fault(s) {unknown}; known: {', '.join(FAULTS)}")
    if len(set(faults)) > n_subjects:
        raise ValueError(f"make_hbn_like: {len(set(faults))} faults need at least as many "
                         f"subjects, n_subjects={n_subjects}")
    out = {}
    for k, f in enumerate(dict.fromkeys(faults)):
        task = _TASK_OF[f]
        if task not in tasks:
            raise ValueError(f"make_hbn_like: fault {f!r} needs task {task!r} in tasks={tasks}")
        out[(n_subjects - 1 - k, task, "1" if task == "contrastChangeDetection" else None)] = f
    return out


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3f}".rstrip("0").rstrip(".") or "0"
    return str(v)


def _events_text(rows: list[dict], fault: str | None) -> str:
    cols = list(dict.fromkeys(k for r in rows for k in r))
    if fault == "no_feedback":
        cols = [c for c in cols if c != "feedback"]
    if fault == "unsorted_onsets" and len(rows) > 4:
        rows = list(rows)
        rows[2], rows[3] = rows[3], rows[2]
    lines = ["\t".join(cols)]
    for r in rows:
        cells = [_fmt(r.get(c, "n/a")) for c in cols]
        if fault == "nan_durations":
            cells[1] = "NaN"
        elif fault == "empty_durations":
            cells[1] = ""
        lines.append("\t".join(cells))
    return "\n".join(lines) + "\n"


def write_recording(root: Path, sid: str, task: str, run: str | None, tl: Timeline,
                    rng: np.random.Generator, alpha_uv: float, alpha_hz: float,
                    fault: str | None, beta_uv: float = 12.0) -> Path:
    """Write the BDF, events.tsv, eeg.json and channels.tsv of one recording; returns the BDF."""
    eeg_dir = root / f"sub-{sid}" / "eeg"
    eeg_dir.mkdir(parents=True, exist_ok=True)
    stem = f"sub-{sid}_task-{task}" + (f"_run-{run}" if run else "")
    if fault == "short_recording":
        tl = Timeline(n_seconds=3, rows=tl.rows[:2])
    data = simulate(tl, rng, alpha_uv, alpha_hz, beta_uv=beta_uv)
    names = list(montage_positions()[0])
    if fault == "nan_stretch":
        answered = [r["onset"] for r, nxt in zip(tl.rows[:-1], tl.rows[1:], strict=True)
                    if r["value"].endswith("_target") and nxt["value"].endswith("_buttonPress")]
        t0 = answered[min(2, len(answered) - 1)] + 0.8
        data[:, int(t0 * SFREQ): int((t0 + 2.0) * SFREQ)] = 0.0
    if fault == "six_channels":
        keep = [0, 10, 35, 61, 74, 128]
        data, names = data[keep], [names[k] for k in keep]
    bdf = write_bdf(eeg_dir / f"{stem}_eeg.bdf", data, names, SFREQ)
    if fault == "truncated_bdf":
        size = bdf.stat().st_size
        with open(bdf, "r+b") as f:
            f.truncate(int(size * 0.6))
    (eeg_dir / f"{stem}_events.tsv").write_text(_events_text(tl.rows, fault))
    side = {"TaskName": task, "SamplingFrequency": SFREQ, "PowerLineFrequency": 60,
            "EEGReference": "Cz", "EEGChannelCount": len(names), "EOGChannelCount": 0,
            "ECGChannelCount": 0, "EMGChannelCount": 0, "MiscChannelCount": 0,
            "TriggerChannelCount": 0, "RecordingType": "continuous",
            "RecordingDuration": float(tl.n_seconds), "SoftwareFilters": "n/a",
            "InstitutionName": "Child Mind Institute", "Manufacturer": "Magtism EGI",
            "ManufacturersModelName": "128-channel GSN 200 v.2.1"}
    (eeg_dir / f"{stem}_eeg.json").write_text(json.dumps(side, indent=2))
    chan = ["name\ttype\tunits"] + [f"{n}\tEEG\tuV" for n in names]
    (eeg_dir / f"{stem}_channels.tsv").write_text("\n".join(chan) + "\n")
    return bdf
