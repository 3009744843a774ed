"""Subject-wise splits: no subject's windows in two splits.

``by_subject(w, val=0.1, test=0.1, seed=0)`` shuffles the subjects with the seed and cuts them
by count; ``exclude="startkit"`` first removes the 9 subjects the starter kit drops (startkit
PR #10). ``startkit_split`` reproduces the starter kit's exact split (sklearn
``train_test_split`` with ``check_random_state(2025)`` then ``(2026)``).
``subject_folds(w, k=5, val=0.15, seed=0)`` cuts the subjects into k folds for a score over
subjects: every subject is a test subject exactly once, and each fold draws its validation
subjects (for every choice: learning rate, epochs, penalty, which model) from its other subjects.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

STARTKIT_EXCLUDED = ("NDARWV769JM7", "NDARME789TD2", "NDARUA442ZVF", "NDARJP304NK1",
                     "NDARTY128YLU", "NDARDW550GU6", "NDARLD243KRE", "NDARUJ292JXV",
                     "NDARBA381JGH")


def _subjects(windows, exclude) -> np.ndarray:
    subj = windows.metadata["subject"].astype(str).to_numpy()
    if exclude is None:
        drop = set()
    elif isinstance(exclude, str):
        if exclude != "startkit":
            raise ValueError(f"exclude must be None, 'startkit' or a list of subject ids, "
                             f"got {exclude!r}")
        drop = set(STARTKIT_EXCLUDED)
    else:
        drop = set(exclude)
    return subj, drop


def by_subject(windows, val: float = 0.1, test: float = 0.1, seed: int = 0, exclude=None):
    """(train, val, test) subsets of ``windows`` with disjoint subjects.

    ``val``/``test``: fractions of the subjects (rounded, at least one subject each when the
    fraction is > 0 and there are subjects to spare) or whole numbers of subjects.
    """
    subj, drop = _subjects(windows, exclude)
    subjects = np.array(sorted(set(subj) - drop))
    if len(subjects) < 1 + (val > 0) + (test > 0):
        raise ValueError(f"by_subject: {len(subjects)} subject(s) cannot make train/val/test "
                         f"splits (val={val}, test={test})")
    rng = np.random.default_rng(seed)
    subjects = subjects[rng.permutation(len(subjects))]
    n_test, n_val = _count(test, len(subjects)), _count(val, len(subjects))
    if n_test + n_val >= len(subjects):
        raise ValueError(f"by_subject: val={val} and test={test} leave no training subject "
                         f"out of {len(subjects)}")
    test_s, val_s = subjects[:n_test], subjects[n_test:n_test + n_val]
    train_s = subjects[n_test + n_val:]
    return tuple(windows.subset(np.isin(subj, s)) for s in (train_s, val_s, test_s))


class Fold(NamedTuple):
    """One fold of :func:`subject_folds`: windows of disjoint subject sets."""

    train: object   # Windows
    val: object
    test: object


def fold_subjects(subjects, k: int = 5, val: float = 0.15, seed: int = 0
                  ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """k (train, val, test) subject-id arrays: each subject is in exactly one test part.

    The subjects (sorted, then shuffled with ``seed``) are cut into k test parts whose sizes
    differ by at most one; ``val`` (a fraction of the other subjects, or a whole count) of the
    rest is drawn per fold with its own generator, so changing k or val never reshuffles the
    test parts of another seed. Use the same ``subjects`` list for Challenge 1 and 2 windows to
    get the same folds for both.
    """
    subjects = np.array(sorted({str(s) for s in subjects}))
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 2:
        raise ValueError(f"subject_folds: k must be a whole number >= 2, got {k!r}")
    if len(subjects) < k:
        raise ValueError(f"subject_folds: k={k} folds need at least {k} subjects, "
                         f"got {len(subjects)}")
    order = subjects[np.random.default_rng(seed).permutation(len(subjects))]
    out = []
    for i, test_s in enumerate(np.array_split(order, k)):
        rest = np.setdiff1d(order, test_s)          # sorted: the draw below is reproducible
        n_val = _count(val, len(rest))
        if n_val >= len(rest):
            raise ValueError(f"subject_folds: val={val} leaves no training subject out of "
                             f"{len(rest)} in fold {i}")
        rest = rest[np.random.default_rng([seed, i]).permutation(len(rest))]
        out.append((np.sort(rest[n_val:]), np.sort(rest[:n_val]), np.sort(test_s)))
    return out


def subject_folds(windows, k: int = 5, val: float = 0.15, seed: int = 0, exclude=None,
                  subjects=None) -> list[Fold]:
    """k :class:`Fold` (train, val, test) of ``windows``; every subject is tested once.

    ``subjects``: the subject ids to fold (default: those of ``windows``, less ``exclude``);
    pass one list to fold Challenge 1 and Challenge 2 windows of a release alike (a subject
    without windows here simply has none in its parts). See :func:`fold_subjects`.
    """
    subj, drop = _subjects(windows, exclude)
    pool = sorted(set(subj) if subjects is None else {str(s) for s in subjects})
    pool = [s for s in pool if s not in drop]
    return [Fold(*(windows.subset(np.isin(subj, part)) for part in parts))
            for parts in fold_subjects(pool, k, val, seed)]


def at_most(windows, n: int | None, seed: int = 0):
    """A subset of ``windows`` with at most ``n`` windows per subject (drawn with ``seed``,
    kept in store order): fewer windows per subject rather than fewer subjects, to bound
    training time. ``n=None``: every window (``windows`` itself)."""
    if n is None:
        return windows
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"at_most: n must be a whole number >= 1 or None, got {n!r}")
    subj = windows.metadata["subject"].astype(str).to_numpy()
    rng = np.random.default_rng(seed)
    keep = [rng.choice(idx, size=min(n, len(idx)), replace=False)
            for _, idx in sorted(_groups(subj).items())]
    return windows.subset(np.sort(np.concatenate(keep)) if keep else np.zeros(0, np.int64))


def _groups(labels: np.ndarray) -> dict[str, np.ndarray]:
    order = np.argsort(labels, kind="stable")
    uniq, first = np.unique(labels[order], return_index=True)
    return dict(zip(uniq, np.split(order, first[1:]), strict=True))


def startkit_split(windows, exclude="startkit"):
    """The starter kit's split, exactly as challenge_1.py writes it.

    sklearn ``train_test_split(subjects, test_size=0.2, random_state=check_random_state(2025))``
    then ``train_test_split(rest, test_size=0.1, random_state=check_random_state(2026))`` on the
    subjects in window order — so "valid" gets most of the 20 % and "test" few (sklearn rounds
    the test share up). Returns (train, valid, test).
    """
    from sklearn.model_selection import train_test_split
    from sklearn.utils import check_random_state

    subj, drop = _subjects(windows, exclude)
    subjects = [s for s in dict.fromkeys(subj) if s not in drop]
    train_s, rest = train_test_split(subjects, test_size=0.2, shuffle=True,
                                     random_state=check_random_state(2025))
    val_s, test_s = train_test_split(rest, test_size=0.1, shuffle=True,
                                     random_state=check_random_state(2026))
    return tuple(windows.subset(np.isin(subj, s)) for s in (train_s, val_s, test_s))


def _count(frac, n: int) -> int:
    if isinstance(frac, (int, np.integer)) and not isinstance(frac, bool) and frac >= 1:
        return int(frac)
    if not 0 <= frac < 1:
        raise ValueError(f"split fractions must be in [0, 1) or whole counts, got {frac}")
    return max(1, int(round(frac * n))) if frac > 0 else 0
