"""participants.tsv: read it robustly, and say once what a release's file cannot give.

* :func:`read_table` parses the tab-separated text itself: cells are stripped, and empty cells at
  the end of a line (a trailing tab, ``\\r\\n`` line ends, trailing blanks) are ignored. pandas
  would take a trailing tab on every row as "the first column is the index" and shift every
  column silently (subject ids become ``R5``). An empty file raises :class:`ParticipantsError`
  naming the file instead of pandas' ``EmptyDataError``.
* :func:`gaps` finds, once per BIDS root, why recordings got no participants.tsv values
  (file missing, no rows, a column or a subject's row absent); the recipes turn that into one
  note (Challenge 1: demographics) or one error (Challenge 2: the target), not one message per
  recording.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

RESTORE = ("restore the release's participants.tsv (eegdash downloads it with the release, "
           "next to the sub-* folders)")


class ParticipantsError(ValueError):
    """A participants.tsv that cannot be used (the message names the file and what to do)."""


def _cells(line: str) -> list[str]:
    cells = [c.strip() for c in line.split("\t")]
    while cells and cells[-1] == "":
        cells.pop()
    return cells


def read_table(path: str | os.PathLike) -> pd.DataFrame:
    """The rows of ``path`` as strings (one column per header cell); see the module docstring.

    Short rows are padded with empty cells (read as missing); a row with more non-empty cells
    than the header raises :class:`ParticipantsError`, as does an empty file or one without a
    ``participant_id`` column.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ParticipantsError(f"{path}: not a UTF-8 text file ({exc}); {RESTORE}") from exc
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ParticipantsError(f"{path}: the file is empty (not even the header line "
                                f"'participant_id<TAB>...'); {RESTORE}")
    header = _cells(lines[0])
    if "participant_id" not in header:
        raise ParticipantsError(f"{path}: no 'participant_id' column (has {header}); the file "
                                f"must be tab-separated with that column; {RESTORE}")
    rows = []
    for k, line in enumerate(lines[1:], start=2):
        cells = _cells(line)
        if len(cells) > len(header):
            raise ParticipantsError(f"{path}: line {k} has {len(cells)} cells but the header "
                                    f"names {len(header)} columns; fix that line or {RESTORE}")
        rows.append(cells + [""] * (len(header) - len(cells)))
    return pd.DataFrame(rows, columns=header, dtype=object).astype(str)


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
        table = read_table(path)
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
