"""Problems found while reading and windowing, collected instead of raised.

A recording-level problem never stops the run: the recording (or the trials concerned) is left
out, and the reason is kept here so it can be shown (``Windows.problems`` / ``Windows.report()``).
Levels: ``note`` (nothing changed), ``repaired`` (fixed in memory, the file is untouched),
``dropped`` (some trials or windows left out), ``skipped`` (the whole recording left out).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import pandas as pd

LEVELS = ("note", "repaired", "dropped", "skipped")
COLUMNS = ["file", "subject", "task", "run", "level", "code", "message"]


@dataclass(frozen=True)
class Problem:
    file: str
    level: str
    code: str
    message: str
    subject: str | None = None
    task: str | None = None
    run: str | None = None

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"Problem level must be one of {LEVELS}, got {self.level!r}")


def to_frame(problems: list[Problem]) -> pd.DataFrame:
    """The problems as a DataFrame with :data:`COLUMNS` (empty but typed when there are none)."""
    return pd.DataFrame([asdict(p) for p in problems], columns=COLUMNS)


def summarize(df: pd.DataFrame) -> str:
    """Plain-text summary, one line per problem, most serious first."""
    if df.empty:
        return "no problems found"
    order = {lvl: i for i, lvl in enumerate(reversed(LEVELS))}
    df = df.sort_values("level", key=lambda s: s.map(order), kind="stable")
    return "\n".join(f"[{r.level}] {r.code}: {r.message}" for r in df.itertuples())
