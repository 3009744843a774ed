"""participants.tsv: read it robustly, and say once what a release's file cannot give.

* :func:`read_table` reads the tab-separated file with pandas' ``read_csv(sep="\\t",
  index_col=False)``, pandas' documented answer to a delimiter at the end of each line: without
  ``index_col=False`` a trailing tab on the data rows makes pandas take the first column as the
  index and shift every column silently (subject ids become ``R5``). Cells are kept as text and
  stripped (trailing blanks, ``\\r\\n`` line ends). An empty file raises
  :class:`ParticipantsError` naming the file instead of pandas' ``EmptyDataError``.
* :func:`gaps` finds, once per BIDS root, why recordings got no participants.tsv values
  (file missing, no rows, a column or a subject's row absent); the recipes turn that into one
  note (Challenge 1: demographics) or one error (Challenge 2: the target), not one message per
  recording.
* :func:`collapse` gives each subject one row: a subject listed twice with identical rows keeps
  one, and a column whose rows disagree is left empty (``n/a``) for that subject, since which
  value is right cannot be told. :func:`duplicate_notes` says so once per file, naming the
  subject and both values; Challenge 2 leaves out a subject whose target disagrees, with that
  reason (not "missing").
"""

from __future__ import annotations

import hashlib
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

FACTORS = ("p_factor", "attention", "internalizing", "externalizing")
NUMERIC = ("age", "ehq_total", *FACTORS)   # compared (and later read) as numbers
MISSING = "n/a"                            # how HBN writes an empty cell
RESTORE = ("restore the release's participants.tsv (eegdash downloads it with the release, "
           "next to the sub-* folders)")


class ParticipantsError(ValueError):
    """A participants.tsv that cannot be used (the message names the file and what to do)."""


def read_table(path: str | os.PathLike) -> pd.DataFrame:
    """The rows of ``path`` as stripped strings, one column per header cell (see the module
    docstring); missing cells are empty strings.

    Raises :class:`ParticipantsError` naming the file when it is empty, not UTF-8 text, has no
    ``participant_id`` column, or has a row with more cells than the header names.
    """
    path = Path(path)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", pd.errors.ParserWarning)  # longer rows: see below
            df = pd.read_csv(path, sep="\t", index_col=False, dtype=str, keep_default_na=False,
                             encoding="utf-8-sig", skip_blank_lines=True)
    except pd.errors.EmptyDataError as exc:
        raise ParticipantsError(f"{path}: the file is empty (not even the header line "
                                f"'participant_id<TAB>...'); {RESTORE}") from exc
    except UnicodeDecodeError as exc:
        raise ParticipantsError(f"{path}: not a UTF-8 text file ({exc}); {RESTORE}") from exc
    except pd.errors.ParserError as exc:
        raise ParticipantsError(f"{path}: cannot be read as a tab-separated table "
                                f"({str(exc).strip()}); {RESTORE}") from exc
    if caught:  # pandas dropped cells past the header's width: fine when they are empty
        _no_extra_cells(path, len(df.columns))
    df.columns = [str(c).strip() for c in df.columns]
    df = df.loc[:, [not c.startswith("Unnamed:") for c in df.columns]]  # a trailing tab's column
    if "participant_id" not in df.columns:
        raise ParticipantsError(f"{path}: no 'participant_id' column (has {list(df.columns)}); "
                                f"the file must be tab-separated with that column; {RESTORE}")
    df = df.apply(lambda col: col.str.strip())
    return df[df.ne("").any(axis=1)].reset_index(drop=True).astype(str)


def _no_extra_cells(path: Path, width: int) -> None:
    """ParticipantsError naming the first line with more non-empty cells than ``width``."""
    lines = path.read_text(encoding="utf-8-sig").splitlines()
    for k, line in enumerate(lines, start=1):
        cells = [c.strip() for c in line.split("\t")]
        while cells and not cells[-1]:
            cells.pop()
        if len(cells) > width:
            raise ParticipantsError(f"{path}: line {k} has {len(cells)} cells but the header "
                                    f"names {width} columns; fix that line or {RESTORE}")


@dataclass(frozen=True)
class Duplicate:
    """A subject listed on more than one row of participants.tsv."""

    subject: str                               # without ``sub-``
    rows: int                                  # how many rows list it
    conflicts: dict = field(default_factory=dict)   # column -> its different values, as written

    def describe(self, columns=None) -> str:
        """``age 5.9 vs 11.0; externalizing -0.071 vs 9.99`` (``columns``: only these)."""
        return "; ".join(f"{c} {' vs '.join(v)}" for c, v in self.conflicts.items()
                         if columns is None or c in columns)


def _same(a: str, b: str, numeric: bool) -> bool:
    if a == b:
        return True
    if numeric:
        x, y = to_number(a), to_number(b)
        return x == y or (x != x and y != y)      # equal numbers, or both missing
    return False


def to_number(value) -> float:
    """A cell -> float (``n/a``, empty, None and non-numbers -> NaN)."""
    if value is None:
        return math.nan
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value).strip())
    except ValueError:
        return math.nan


_READ: dict[tuple, tuple[pd.DataFrame, list[Duplicate]]] = {}


def collapsed(path: str | os.PathLike) -> tuple[pd.DataFrame, list[Duplicate]]:
    """``collapse(read_table(path))``, parsed once per content of the file (the recordings'
    descriptions, the duplicate notes and the gaps all ask for it). Keyed on the bytes, not the
    time stamp: an edit of the same size within the clock's resolution is still seen."""
    key = (str(path), hashlib.sha1(Path(path).read_bytes()).hexdigest())
    if key not in _READ:
        _READ.clear()
        _READ[key] = collapse(read_table(path))
    table, dups = _READ[key]
    return table.copy(), dups


def collapse(table: pd.DataFrame) -> tuple[pd.DataFrame, list[Duplicate]]:
    """``table`` (from :func:`read_table`) with one row per subject, and what was merged.

    A subject's rows that agree on every column (numbers compared as numbers for the columns
    of :data:`NUMERIC`: ``5.90`` = ``5.9``, ``n/a`` = empty) become one row; a column on which they
    disagree is set to ``n/a`` for that subject and listed in :attr:`Duplicate.conflicts` with
    each different value as written. The first row's position is kept.
    """
    ids = table["participant_id"].str.replace("^sub-", "", regex=True)
    repeated = ids[ids.duplicated(keep=False)]
    if repeated.empty:
        return table, []
    out, found, drop = table.copy(), [], []
    for subject, idx in repeated.groupby(repeated, sort=False).groups.items():
        idx = list(idx)
        conflicts = {}
        for col in table.columns:
            if col == "participant_id":
                continue
            values = list(dict.fromkeys(table.loc[idx, col]))
            distinct = [v for k, v in enumerate(values)
                        if not any(_same(v, w, col in NUMERIC) for w in values[:k])]
            if len(distinct) > 1:
                conflicts[col] = tuple(v if v else "(empty)" for v in distinct)
                out.loc[idx[0], col] = MISSING
        found.append(Duplicate(str(subject), len(idx), conflicts))
        drop += idx[1:]
    return out.drop(index=drop).reset_index(drop=True), found


def duplicate_notes(recs, carried=(), target: str | None = None) -> list:
    """:class:`~data_prep.problems.Problem` notes for each participants.tsv that lists a subject
    of ``recs`` more than once: identical rows (one kept), and per subject the columns whose rows
    disagree, each with its values; those of ``carried`` (the columns the windows' metadata
    takes) are left empty for that subject. ``target`` (Challenge 2's column) is left out of
    the note: every recording of such a subject is skipped with that reason."""
    from .problems import Problem

    subjects = {r.subject for r in recs}
    notes = []
    for path in paths_of(recs):
        if not path.exists():
            continue
        dups = [d for d in collapsed(path)[1] if d.subject in subjects]
        same = [d for d in dups if not d.conflicts]
        if same:
            notes.append(Problem(str(path), "note", "duplicate_participant", (
                f"{path}: subject(s) {', '.join(f'{d.subject} ({d.rows} rows)' for d in same)} "
                "listed more than once with identical rows; one row kept")))
        for d in dups:
            other = [c for c in d.conflicts if c != target]
            used = [c for c in other if c in carried]
            if other:
                notes.append(Problem(str(path), "note", "conflicting_participant", (
                    f"{path}: subject {d.subject} is listed on {d.rows} rows that disagree: "
                    f"{d.describe(other)}; " + (
                        f"which is right cannot be told, so its windows have no value (n/a) "
                        f"for {', '.join(used)}; " if used else
                        "none of these columns reaches the windows; ")
                    + "keep one row per subject in the file"), subject=d.subject))
    return notes


def path_of(rec) -> Path | None:
    """The participants.tsv of the BIDS root holding ``rec`` (None outside a BIDS layout)."""
    for parent in rec.path.parents:
        if parent.name.startswith("sub-"):
            return parent.parent / "participants.tsv"
    return None


def paths_of(recs) -> list[Path]:
    """The participants.tsv of every BIDS root the recordings come from, sorted."""
    return sorted({p for p in map(path_of, recs) if p is not None})


@dataclass
class Gap:
    """Why some recordings of one root have no values for some participants.tsv columns."""

    path: Path
    what: str                 # "missing", "no rows", "no column(s) [...]", "no row for ..."
    whole_file: bool          # True: no subject of this root can get the columns
    recordings: list = field(default_factory=list)


def gaps(recs, columns) -> list[Gap]:
    """Gaps for the recordings whose description lacks any of ``columns``, one per root/reason.

    Recordings described elsewhere (eegdash datasets, hand-made Recordings with descriptions)
    are not looked at.
    """
    wanting: dict[Path, list] = {}
    for rec in recs:
        path = path_of(rec)
        if path is not None and any(c not in rec.description for c in columns):
            wanting.setdefault(path, []).append(rec)
    out = []
    for path, group in sorted(wanting.items()):
        if not path.exists():
            out.append(Gap(path, "missing", True, group))
            continue
        table = collapsed(path)[0]
        if table.empty:
            out.append(Gap(path, "no rows (only the header line)", True, group))
            continue
        absent = [c for c in columns if c not in table.columns]
        if absent:
            out.append(Gap(path, f"no column(s) {absent} (has {list(table.columns)})", True,
                           group))
        ids = set(table["participant_id"].str.replace("^sub-", "", regex=True))
        unlisted = [r for r in group if r.subject not in ids]
        if unlisted:
            subs = sorted({r.subject for r in unlisted})
            out.append(Gap(path, f"no row for subject(s) {', '.join(subs)}", False, unlisted))
    return out
