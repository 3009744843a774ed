"""Finding and reading HBN-style BIDS recordings: a local root (mne-bids) or eegdash.

* :func:`find_recordings` lists the recordings of a BIDS root (BIDS entities parsed by mne-bids)
  with their participants.tsv description, numbers converted from strings.
* :func:`read_raw` opens one recording as an MNE Raw with its events as annotations; when the
  events file has empty cells (mne-bids would fail with ``could not convert string to float:
  ''``) the events are read here and the user's file is left untouched.
* :func:`load_eegdash` opens a release through eegdash's ``EEGChallengeDataset`` offline
  (``download=False``: otherwise it waits ~30 s for the network and then fails) with an
  *absolute*, symlink-free ``cache_dir`` (a relative one silently gives NaN ages and targets).
  :func:`recordings_from_dataset` turns such a dataset (or any braindecode concat dataset of
  raws) into recordings, converting eegdash's string descriptions to numbers.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from .participants import FACTORS, NUMERIC, RESTORE, collapsed, to_number
from .participants import ParticipantsError as ParticipantsError  # re-exported

EXTENSIONS = (".bdf", ".set", ".edf", ".vhdr", ".fif")


@dataclass
class Recording:
    """One EEG recording: where its files are and who/what it is."""

    path: Path
    subject: str
    task: str
    run: str | None = None
    session: str | None = None
    description: dict = field(default_factory=dict)
    raw: object | None = None     # an already opened mne Raw (eegdash / braindecode input)
    # participants.tsv columns on which the subject's rows disagree -> their values (the
    # description holds NaN / "n/a" there; :func:`data_prep.participants.collapse`)
    conflicts: dict = field(default_factory=dict)

    @property
    def events_path(self) -> Path:
        stem = self.path.name[: self.path.name.rindex("_")]
        return self.path.with_name(f"{stem}_events.tsv")

    @property
    def name(self) -> str:
        return self.path.name

    def ids(self) -> dict:
        return {"subject": self.subject, "task": self.task, "run": self.run}


def participants(root: str | os.PathLike) -> pd.DataFrame:
    """participants.tsv indexed by subject id without ``sub-``; numeric columns as floats.

    Read by :func:`data_prep.participants.read_table` (robust to trailing tabs and blanks;
    :class:`ParticipantsError` naming the file when it is empty or malformed). Values are parsed
    with Python's ``float`` from the text (exactly the numbers the file holds; what eegdash
    offline users get after ``float()``). A subject listed twice gets one row
    (:func:`data_prep.participants.collapse`); ``df.attrs["duplicates"]`` lists what was merged.
    """
    path = Path(root) / "participants.tsv"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no participants.tsv in the BIDS root {root}; "
                                f"{RESTORE}")
    df, dups = collapsed(path)
    df.index = df["participant_id"].str.replace("^sub-", "", regex=True)
    df.index.name = "subject"
    for col in NUMERIC:
        if col in df.columns:
            df[col] = df[col].map(to_number).astype(float)
    df.attrs["duplicates"] = dups
    return df


def find_recordings(root: str | os.PathLike, tasks=None, subjects=None,
                    extensions=EXTENSIONS) -> list[Recording]:
    """The EEG recordings under a BIDS ``root``, sorted by subject, task, run.

    ``tasks``/``subjects``: optional filters (a name or a list). Each recording's description
    holds its participants.tsv row (numbers as floats) plus subject, task, run, session.
    """
    from mne_bids import get_entities_from_fname

    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"BIDS root {root} does not exist or is not a folder")
    tasks = [tasks] if isinstance(tasks, str) else tasks
    subjects = [subjects] if isinstance(subjects, str) else subjects
    try:
        part = participants(root)
    except FileNotFoundError:     # the recipes report it once (participants.gaps)
        part = pd.DataFrame()
    conflicts = {d.subject: d.conflicts for d in part.attrs.get("duplicates", [])}
    out = []
    for path in root.glob("sub-*/**/eeg/sub-*_eeg.*"):
        if path.suffix not in extensions:
            continue
        ent = get_entities_from_fname(path.name, on_error="ignore")
        sub, task = ent.get("subject"), ent.get("task")
        if not sub or not task:
            continue
        if (tasks and task not in tasks) or (subjects and sub not in subjects):
            continue
        desc = part.loc[sub].to_dict() if sub in part.index else {}
        desc.update(subject=sub, task=task, run=ent.get("run"), session=ent.get("session"))
        out.append(Recording(path=path, subject=sub, task=task, run=ent.get("run"),
                             session=ent.get("session"), description=desc,
                             conflicts=dict(conflicts.get(sub, {}))))
    out.sort(key=lambda r: (r.subject, r.task, r.run or "", r.session or ""))
    return out


def read_raw(rec: Recording | str | os.PathLike, preload: bool = False):
    """The recording as an MNE Raw with its events.tsv as annotations (mne-bids reading).

    An events file with empty cells is read here instead (mne-bids would fail); the returned
    Raw's annotations then come from :func:`data_prep.events.read_events`.
    """
    import mne
    from mne_bids import get_bids_path_from_fname, read_raw_bids

    from .events import read_events

    path = Path(rec.path if isinstance(rec, Recording) else rec)
    events_path = path.with_name(path.name[: path.name.rindex("_")] + "_events.tsv")
    problems: list = []
    events = read_events(events_path, problems) if events_path.exists() else None
    if not any(p.code == "empty_durations" for p in problems):
        raw = read_raw_bids(get_bids_path_from_fname(path), verbose="error")
    else:
        raw = mne.io.read_raw(path, verbose="error")
        dur = pd.to_numeric(events.get("duration"), errors="coerce").fillna(0.0) \
            if "duration" in events.columns else 0.0
        raw.set_annotations(mne.Annotations(
            events["onset"].to_numpy(float), dur, events["value"].astype(str).to_numpy(),
            orig_time=raw.info["meas_date"]))
    if preload:
        raw.load_data()
    return raw


def cache_root(cache_dir: str | os.PathLike) -> Path:
    """``cache_dir`` made absolute with symlinks resolved (eegdash needs that, see module doc)."""
    path = Path(cache_dir).expanduser().resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"eegdash cache_dir {cache_dir!r} ({path}) is not a folder")
    return path


def load_eegdash(cache_dir: str | os.PathLike, release: str = "R5", mini: bool = True,
                 task: str | list[str] = "contrastChangeDetection", download: bool = False,
                 description_fields=("subject", "session", "run", "task", "age", "sex",
                                     *FACTORS), **kwargs):
    """eegdash's EEGChallengeDataset over a local copy (``download=False`` by default).

    ``cache_dir`` is resolved to an absolute real path first. Raises ImportError with the
    install hint when eegdash is missing.
    """
    try:
        from eegdash import EEGChallengeDataset
    except ImportError as exc:
        raise ImportError("eegdash is not installed: pip install 'hybridnb[challenge]' "
                          "(or pip install eegdash)") from exc
    root = cache_root(cache_dir)
    folder = root / (f"EEG2025r{release[1:]}" + ("mini" if mini else ""))
    if not download and not folder.is_dir():
        raise FileNotFoundError(f"{folder} does not exist: eegdash {'' if mini else 'non-'}mini "
                                f"release {release} offline expects it inside cache_dir")
    return EEGChallengeDataset(release=release, cache_dir=root, mini=mini, task=task,
                               download=download, description_fields=list(description_fields),
                               **kwargs)


def recordings_from_dataset(dataset) -> list[Recording]:
    """Recordings of an eegdash / braindecode concat dataset; descriptions as numbers."""
    out = []
    for d in getattr(dataset, "datasets", [dataset]):
        raw = getattr(d, "raw", None)
        if raw is None:
            raise TypeError(f"expected datasets of continuous recordings (with .raw), got "
                            f"{type(d).__name__}; pass the dataset before windowing")
        desc = dict(d.description) if d.description is not None else {}
        for k in NUMERIC:
            if k in desc:
                desc[k] = to_number(desc[k])
        fn = raw.filenames[0] if raw.filenames and raw.filenames[0] else None
        path = Path(fn) if fn else Path(f"{desc.get('subject', 'x')}_in-memory_eeg.fif")
        out.append(Recording(path=path, subject=str(desc.get("subject")),
                             task=str(desc.get("task")), run=_entity(desc.get("run")),
                             session=_entity(desc.get("session")), description=desc, raw=raw))
    return out


def _entity(value) -> str | None:
    """A BIDS entity from a description value: None for missing (None, '', NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
        return None
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
