"""Reference predictors to score a model against, fitted on the same training subjects.

* :func:`training_mean`: the mean target of the training windows, for every test window;
* ridge regression (:func:`fit_ridge`, penalty chosen by grouped k-fold CV over the subjects it
  is given, never the test subjects: sklearn's ``RidgeCV`` with a subject-grouped ``cv``) on
  simple features (:data:`ROWS` names each one's row):
  :func:`binned_amplitude` (each channel's mean in ``n_bins`` equal time bins: ten 0.2-s bins of
  a 2-s window, the shape of the evoked response), :func:`band_power` (each channel's log power
  in the theta, alpha and beta bands, one Hann-windowed FFT) and :func:`welch_bands` (the
  standard five: each channel's log delta, theta, alpha, beta and gamma power from Welch's
  method, what a reader of an EEG paper fits first);
* :func:`reference_scores`: all of them fitted and scored on one fold in one call;
  :func:`margin`: the best baseline's fold mean minus the model's, with its sd over folds;
* :func:`oracle`: on a synthetic release, the planted signal's best prediction for the same
  windows (from the latents the release records; :mod:`data_prep.planted`).

Features are computed per window (Challenge 2: per 2-s crop, the unit the challenge scores), so a
baseline sees exactly what the model sees and predicts one value per window. Needs scikit-learn.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .environment import usable_cores
from .planted import PLANTED, Planted, oracle_c1, oracle_c2
from .scoring import nrmse

BANDS = {"theta": (4.0, 8.0), "alpha": (8.0, 13.0), "beta": (13.0, 30.0)}
# the standard clinical bands; gamma stops at 45 Hz, below the 50-Hz Nyquist of 100-Hz data
STANDARD_BANDS = {"delta": (1.0, 4.0), "theta": (4.0, 8.0), "alpha": (8.0, 13.0),
                  "beta": (13.0, 30.0), "gamma": (30.0, 45.0)}
ALPHAS = tuple(float(a) for a in np.logspace(-1, 6, 15))
# feature kind -> the row its ridge gets in a fold table
ROWS = {"amplitude": "ridge, amplitude", "bandpower": "ridge, band power",
        "bands": "ridge, 5 bands (Welch)"}
KINDS = tuple(ROWS)
BASELINES = ("training mean", *ROWS.values())   # every reference row but the oracle

__all__ = ["BANDS", "STANDARD_BANDS", "ALPHAS", "ROWS", "KINDS", "BASELINES", "Margin",
           "binned_amplitude", "band_power", "welch_bands", "features", "feature_table", "fit_ridge",
           "training_mean", "reference_scores", "margin", "oracle"]


def binned_amplitude(X: np.ndarray, n_bins: int = 10) -> np.ndarray:
    """(N, C × n_bins): each channel's mean in ``n_bins`` equal time bins (T divisible)."""
    X = np.asarray(X, np.float32)
    n, c, t = X.shape
    if t % n_bins:
        raise ValueError(f"binned_amplitude: {t} samples do not split into {n_bins} equal bins")
    return X.reshape(n, c, n_bins, t // n_bins).mean(axis=3).reshape(n, c * n_bins)


def band_power(X: np.ndarray, sfreq: float = 100.0, bands: dict = BANDS) -> np.ndarray:
    """(N, C × len(bands)): log mean power of each channel in each band (Hann-windowed FFT)."""
    from scipy import fft

    X = np.asarray(X, np.float32)
    t = X.shape[-1]
    # scipy's FFT stays in float32 on every usable core: 7.6x numpy's (float64, one core) on 1024
    # windows, the logs equal to 1e-6
    spec = np.abs(fft.rfft(X * np.hanning(t).astype(np.float32), axis=-1, workers=usable_cores())) ** 2
    f = fft.rfftfreq(t, 1 / sfreq)
    cols = []
    for name, (lo, hi) in bands.items():
        sel = (f >= lo) & (f < hi)
        if not sel.any():
            raise ValueError(f"band_power: band {name} {lo}-{hi} Hz holds no frequency bin of a "
                             f"{t}-sample window at {sfreq} Hz")
        cols.append(np.log(spec[..., sel].mean(axis=-1) + 1e-30))
    return np.stack(cols, axis=-1).reshape(len(X), -1)


def welch_bands(X: np.ndarray, sfreq: float = 100.0, bands: dict = STANDARD_BANDS,
                segment_s: float = 1.0) -> np.ndarray:
    """(N, C × len(bands)): log power of each channel in each band, from Welch's method.

    ``scipy.signal.welch``'s defaults (1-s periodic-Hann segments overlapping by half, three
    per 2-s window, each less its mean; one-sided density), computed here in float32 on every
    core: 5.9x scipy's on 1024 windows, equal to 1e-6 (a test compares the two). The band
    power is the sum of the density over the band's bins ``[lo, hi)`` times the bin width. A
    band above the Nyquist frequency, or one holding no bin, raises ValueError naming it.
    """
    from scipy import fft
    from scipy.signal import get_window

    X = np.asarray(X, np.float32)
    nperseg = min(X.shape[-1], int(round(segment_s * sfreq)))
    win = get_window("hann", nperseg).astype(np.float32)
    step = nperseg - nperseg // 2  # scipy overlaps by nperseg // 2
    segs = np.lib.stride_tricks.sliding_window_view(X, nperseg, axis=-1)[..., ::step, :]
    segs = segs - segs.mean(axis=-1, keepdims=True)
    psd = (np.abs(fft.rfft(segs * win, axis=-1, workers=usable_cores())) ** 2).mean(axis=-2)
    psd /= sfreq * float((win * win).sum())
    psd[..., 1:None if nperseg % 2 else -1] *= 2  # one-sided: DC and Nyquist appear once
    f = fft.rfftfreq(nperseg, 1 / sfreq)
    cols = []
    for name, (lo, hi) in bands.items():
        sel = (f >= lo) & (f < hi)
        if hi > sfreq / 2 or not sel.any():
            raise ValueError(f"welch_bands: band {name} {lo}-{hi} Hz does not fit {nperseg}-"
                             f"sample segments at {sfreq} Hz (Nyquist {sfreq / 2:g} Hz, bins "
                             f"every {f[1] - f[0]:g} Hz)")
        cols.append(np.log(psd[..., sel].sum(axis=-1) * (f[1] - f[0]) + 1e-30))
    return np.stack(cols, axis=-1).reshape(len(X), -1).astype(np.float32)


def features(windows, kind: str, crop: int | None = None, seed: int | None = None,
             scale: float = 1e6, chunk: int = 512) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features, targets, subjects) of every window of ``windows`` (read in chunks).

    ``kind``: "amplitude" (:func:`binned_amplitude`), "bandpower" (:func:`band_power`) or
    "bands" (:func:`welch_bands`).
    ``crop``/``seed``: the 2-s crops of Challenge 2, drawn as ``windows.dataset(crop, seed)``
    draws them (the same seed gives the crops a model is scored on). ``scale``: volts -> µV.
    """
    subjects = windows.metadata["subject"].astype(str).to_numpy()
    table = feature_table(windows, (kind,), crop=crop, seed=seed, scale=scale, chunk=chunk)
    return table[kind], windows.y.astype(float), subjects


def feature_table(windows, kinds=KINDS, crop: int | None = None, seed: int | None = None,
                  scale: float = 1e6, chunk: int = 512) -> dict[str, np.ndarray]:
    """``{kind: (N, F) features}`` as :func:`features` gives them, every window read once for
    all ``kinds`` (the read is a third of the cost of all three kinds)."""
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"features: kind must be one of {KINDS}, got {unknown[0]!r}")
    fns = {"amplitude": binned_amplitude, "bandpower": band_power, "bands": welch_bands}
    ds = windows.dataset(crop=crop, seed=seed, scale=scale)
    parts: dict[str, list] = {k: [] for k in kinds}
    for s in range(0, len(windows), chunk):
        x = ds[list(range(s, min(s + chunk, len(windows))))][0].numpy()
        for k in kinds:
            parts[k].append(fns[k](x))
    return {k: np.concatenate(parts[k]) for k in kinds}


def fit_ridge(F: np.ndarray, y: np.ndarray, groups: np.ndarray, alphas=ALPHAS,
              n_splits: int = 5):
    """Standardised features -> ridge, the penalty chosen by grouped CV (no subject in two
    parts of the search) on the rows given; returns the refitted sklearn Pipeline, with the
    chosen penalty as ``.alpha`` and the CV RMSE per penalty as ``.cv_rmse`` (attributes added
    here). Every penalty is scored from one eigendecomposition of the features' Gram matrix per
    CV part (the ridge path), so a search over
    many penalties costs about one fit per part."""
    from sklearn.linear_model import Ridge
    from sklearn.model_selection import GroupKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    F, y, groups = np.asarray(F, np.float64), np.asarray(y, np.float64), np.asarray(groups)
    n_groups = len(np.unique(groups))
    if n_groups < 2:
        raise ValueError(f"fit_ridge: grouped CV needs at least 2 subjects, got {n_groups}")
    alphas = np.asarray(alphas, np.float64)
    sq_err = np.zeros(len(alphas))
    for tr, te in GroupKFold(n_splits=min(n_splits, n_groups)).split(F, y, groups):
        mu, sd = F[tr].mean(axis=0), F[tr].std(axis=0)
        sd[sd == 0] = 1.0
        a, b = (F[tr] - mu) / sd, (F[te] - mu) / sd
        lam, v = np.linalg.eigh(a.T @ a)               # a'a = V diag(lam) V'
        vty = v.T @ (a.T @ (y[tr] - y[tr].mean()))
        bv = b @ v                                      # held-out rows in that basis
        for j, alpha in enumerate(alphas):
            pred = y[tr].mean() + bv @ (vty / (lam + alpha))
            sq_err[j] += ((pred - y[te]) ** 2).sum()
    best = float(alphas[int(np.argmin(sq_err))])
    model = make_pipeline(StandardScaler(), Ridge(alpha=best)).fit(F, y)
    model.alpha = best
    model.cv_rmse = dict(zip(alphas.tolist(), np.sqrt(sq_err / len(y)).tolist(), strict=True))
    return model


def training_mean(y_train, n: int) -> np.ndarray:
    """The training targets' mean, repeated for ``n`` test windows."""
    return np.full(n, float(np.nanmean(np.asarray(y_train, float))))


def reference_scores(feats: dict[str, np.ndarray], y, subjects, fit, test,
                     n_splits: int = 5) -> dict[str, float]:
    """nRMSE on the ``test`` rows of every baseline of :data:`BASELINES`, each fitted on the
    ``fit`` rows only (the training mean, and a ridge per feature kind of ``features``, its
    penalty chosen by CV grouped by ``subjects`` within those rows).

    ``feats``: ``{kind: (N, F) array}`` over the same N windows as ``y`` and ``subjects``
    (e.g. ``feature_table(w)``); ``fit``/``test``: boolean masks or indices
    of those windows. Kinds missing from ``feats`` are left out of the result.
    """
    y, subjects = np.asarray(y, float), np.asarray(subjects)
    out = {"training mean": nrmse(y[test], training_mean(y[fit], len(y[test])))}
    for kind, row in ROWS.items():
        if kind in feats:
            F = np.asarray(feats[kind])
            ridge = fit_ridge(F[fit], y[fit], subjects[fit], n_splits=n_splits)
            out[row] = nrmse(y[test], ridge.predict(F[test]))
    return out


@dataclass(frozen=True)
class Margin:
    """How far a model is below the best baseline: ``best - model`` per fold (positive: the
    model is better), its mean and sd over folds (ddof 1), and which baseline was best (the
    lowest fold mean)."""

    best: str
    per_fold: tuple[float, ...]
    mean: float
    sd: float

    def __str__(self) -> str:
        word = "below" if self.mean > 0 else "above"
        return (f"margin = {self.best} − model = {self.mean:+.3f} ± {self.sd:.3f} over "
                f"{len(self.per_fold)} folds (the model is {abs(self.mean):.3f} {word} the best "
                f"baseline; {self.mean / self.sd if self.sd > 0 else float('inf'):+.1f} fold sd)")


def margin(per_fold, model: str = "deep", baselines=BASELINES) -> Margin:
    """The margin between ``model`` and the best of ``baselines`` over folds.

    ``per_fold``: nRMSE per fold, as ``{row: [score per fold]}`` or a DataFrame with one row per
    fold and one column per predictor (the notebooks' ``per_fold``), or one row per predictor
    and ``fold i`` columns (a fold table). The best baseline is the one with the lowest fold
    mean; the margin is paired fold by fold, so its sd is that of the differences.
    """
    import pandas as pd

    if isinstance(per_fold, pd.DataFrame):
        folds = [c for c in per_fold.columns if str(c).startswith("fold ")]
        table = per_fold[folds].T if folds else per_fold
        per_fold = {str(c): table[c].astype(float).tolist() for c in table.columns}
    if model not in per_fold:
        raise KeyError(f"margin: no {model!r} scores among {list(per_fold)}")
    have = [b for b in baselines if b in per_fold]
    if not have:
        raise KeyError(f"margin: none of the baselines {list(baselines)} among "
                       f"{list(per_fold)}")
    best = min(have, key=lambda b: float(np.mean(per_fold[b])))
    diff = np.asarray(per_fold[best], float) - np.asarray(per_fold[model], float)
    sd = float(np.std(diff, ddof=1)) if len(diff) > 1 else 0.0
    return Margin(best, tuple(float(d) for d in diff), float(diff.mean()), sd)


def oracle(windows, root: str | os.PathLike, challenge: int,
           planted: Planted = PLANTED) -> np.ndarray:
    """The planted signal's best prediction for each window of a synthetic release ``root``.

    Challenge 1: the posterior-mean RT of each window's trial given its exact planted latencies
    (:func:`~data_prep.planted.oracle_c1`); Challenge 2: the posterior-mean externalizing of the
    window's subject given its exact alpha gain (:func:`~data_prep.planted.oracle_c2`).
    ``planted``: the parameters the release was written with (``synthetic.summary(root)``).
    """
    import pandas as pd

    from .synthetic import latents

    subj_lat, trial_lat = latents(root)
    meta = windows.metadata
    if challenge == 2:
        by_subject = dict(zip(subj_lat["subject"].astype(str),
                              oracle_c2(subj_lat["log_alpha"].to_numpy(), planted), strict=True))
        subjects = meta["subject"].astype(str)
        missing = sorted(set(subjects) - set(by_subject))
        if missing:
            raise KeyError(f"oracle: subjects {missing[:3]} have no latents in {root}")
        return subjects.map(by_subject).to_numpy(float)
    if challenge != 1:
        raise ValueError(f"oracle: challenge must be 1 or 2, got {challenge!r}")
    key = ["subject", "run", "onset_ms"]
    trials = trial_lat.assign(subject=trial_lat["subject"].astype(str),
                              run=trial_lat["run"].astype(str),
                              onset_ms=np.round(trial_lat["target_onset"] * 1000).astype(int))
    trials["pred"] = oracle_c1(trials["cpp_peak"], trials["motor_latency"], planted)
    wins = pd.DataFrame({"subject": meta["subject"].astype(str).to_numpy(),
                         "run": meta["run"].astype(str).to_numpy(),
                         "onset_ms": np.round(meta["stimulus_onset"].to_numpy(float) * 1000)
                         .astype(int)})
    out = wins.merge(trials[key + ["pred"]], on=key, how="left")
    if out["pred"].isna().any():
        raise KeyError(f"oracle: {int(out['pred'].isna().sum())} window(s) match no planted "
                       f"trial in {root}")
    return out["pred"].to_numpy(float)
