"""Scores over subjects (issue 29): subject folds, per-subject caps, baselines, the oracle."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from data_fixtures import clean_release

from data_prep import baselines, challenge1, challenge2, scoring, splits, synthetic
from data_prep.planted import PLANTED, PLANTED_FOLDS, ceilings, oracle_c2
from data_prep.windows import Windows

USES_FIXTURES = (clean_release,)  # imported for pytest


def _windows(subjects: list[str], per_subject: int = 3) -> Windows:
    subj = np.repeat(subjects, per_subject)
    meta = pd.DataFrame({"subject": subj, "target": np.arange(len(subj), dtype=float)})
    X = np.zeros((len(subj), 2, 4), np.float32)
    return Windows(X, meta, pd.DataFrame(columns=["level"]))


def _subjects_of(w: Windows) -> set[str]:
    return set(w.metadata["subject"].astype(str))


def test_every_subject_is_tested_exactly_once_and_no_subject_sits_in_two_parts():
    subjects = [f"S{i:02d}" for i in range(23)]
    w = _windows(subjects)
    folds = splits.subject_folds(w, k=5, val=0.2, seed=3)
    assert len(folds) == 5
    tested = [s for f in folds for s in _subjects_of(f.test)]
    assert sorted(tested) == subjects                      # each once
    for f in folds:
        tr, va, te = (_subjects_of(p) for p in f)
        assert not (tr & va or tr & te or va & te)
        assert tr | va | te == set(subjects)
        assert len(te) in (4, 5) and len(va) == round(0.2 * (23 - len(te)))
        assert len(f.train) + len(f.val) + len(f.test) == len(w)
    again = splits.subject_folds(w, k=5, val=0.2, seed=3)
    assert [_subjects_of(f.test) for f in again] == [_subjects_of(f.test) for f in folds]
    other = splits.subject_folds(w, k=5, val=0.2, seed=4)
    assert [_subjects_of(f.test) for f in other] != [_subjects_of(f.test) for f in folds]


def test_one_subject_list_folds_two_window_sets_alike():
    subjects = [f"S{i:02d}" for i in range(12)]
    c1 = _windows(subjects)
    c2 = _windows(subjects[1:], per_subject=2)         # a subject without windows here
    f1 = splits.subject_folds(c1, k=3, seed=0, subjects=subjects)
    f2 = splits.subject_folds(c2, k=3, seed=0, subjects=subjects)
    for a, b in zip(f1, f2, strict=True):
        assert _subjects_of(b.test) == _subjects_of(a.test) - {"S00"}
        assert _subjects_of(b.train) == _subjects_of(a.train) - {"S00"}


def test_subject_folds_refuse_impossible_requests():
    w = _windows(["A", "B", "C"])
    with pytest.raises(ValueError, match="k=4 folds need at least 4 subjects"):
        splits.subject_folds(w, k=4)
    with pytest.raises(ValueError, match="k must be"):
        splits.subject_folds(w, k=1)
    with pytest.raises(ValueError, match="leaves no training subject"):
        splits.subject_folds(w, k=3, val=2)


def test_at_most_caps_windows_per_subject_and_keeps_every_subject():
    w = _windows(["A", "B", "C"], per_subject=5).subset(np.arange(13))   # C has 3 windows
    capped = splits.at_most(w, 4, seed=1)
    counts = capped.metadata["subject"].value_counts().to_dict()
    assert counts == {"A": 4, "B": 4, "C": 3}
    assert (np.diff(capped.index) > 0).all()               # store order kept
    assert len(splits.at_most(w, 4, seed=1)) == len(capped)
    every = splits.at_most(w, None)                        # no cap: every window
    assert len(every) == 13 and (every.index == w.index).all()
    with pytest.raises(ValueError, match="at_most: n must be a whole number >= 1 or None"):
        splits.at_most(w, 0)


def test_binned_amplitude_and_band_power_read_what_is_in_the_signal():
    t = np.arange(200) / 100.0
    X = np.zeros((2, 3, 200), np.float32)
    X[0, 1, 100:120] = 5.0                                   # a step in bin 5 of channel 1
    X[1, 2] = np.sin(2 * np.pi * 10 * t)                     # 10 Hz on channel 2
    amp = baselines.binned_amplitude(X).reshape(2, 3, 10)
    assert amp[0, 1, 5] == pytest.approx(5.0) and np.count_nonzero(amp[0]) == 1
    bp = baselines.band_power(X + 1e-3).reshape(2, 3, len(baselines.BANDS))
    assert list(baselines.BANDS)[int(np.argmax(bp[1, 2]))] == "alpha"
    with pytest.raises(ValueError, match="equal bins"):
        baselines.binned_amplitude(X[..., :199])


def test_ridge_penalty_matches_a_grouped_grid_search():
    """The ridge path picks the penalty sklearn's GridSearchCV(GroupKFold) picks, and predicts
    as a ridge refitted with it on every row."""
    from sklearn.linear_model import Ridge
    from sklearn.model_selection import GridSearchCV, GroupKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(20), 10)
    F = rng.normal(size=(200, 30)) + rng.normal(size=(20, 30))[groups]
    y = F[:, :3] @ np.array([1.0, -0.5, 0.2]) + rng.normal(0, 2.0, 200)
    model = baselines.fit_ridge(F, y, groups)
    ref = GridSearchCV(make_pipeline(StandardScaler(), Ridge()),
                       {"ridge__alpha": list(baselines.ALPHAS)}, cv=GroupKFold(5),
                       scoring="neg_root_mean_squared_error").fit(F, y, groups=groups)
    assert model.alpha == ref.best_params_["ridge__alpha"]
    np.testing.assert_allclose(model.predict(F), ref.predict(F), rtol=1e-6, atol=1e-8)
    with pytest.raises(ValueError, match="at least 2 subjects"):
        baselines.fit_ridge(F[:10], y[:10], groups[:10])


def test_the_oracle_reads_each_windows_planted_latents(clean_release):
    subj, trials = synthetic.latents(clean_release)
    assert len(subj) == 4 and {"rt_median", "log_alpha"} <= set(subj.columns)
    w1 = challenge1.make_windows(clean_release, progress=False)
    pred = baselines.oracle(w1, clean_release, 1, PLANTED)
    assert pred.shape == (len(w1),) and np.isfinite(pred).all()
    # the latencies are the response time plus jitter: the oracle is far better than the mean
    assert scoring.nrmse(w1.y, pred) < 0.45
    w2 = challenge2.make_windows(clean_release, tasks=("RestingState",), progress=False)
    pred2 = baselines.oracle(w2, clean_release, 2, PLANTED)
    by_subject = dict(zip(subj["subject"], oracle_c2(subj["log_alpha"], PLANTED), strict=True))
    assert pred2 == pytest.approx(w2.metadata["subject"].map(by_subject).to_numpy(float))
    assert len(set(pred2)) == w2.metadata["subject"].nunique()       # one value per subject


def test_latents_missing_says_how_to_get_them(tmp_path):
    with pytest.raises(FileNotFoundError, match="overwrite=True"):
        synthetic.latents(tmp_path)


def test_the_folds_release_plants_a_learnable_challenge2():
    assert ceilings(PLANTED_FOLDS)["c2"] < ceilings(PLANTED)["c2"] - 0.2
    assert ceilings(PLANTED_FOLDS)["c1"] == ceilings(PLANTED)["c1"]


def test_welch_bands_match_mne_welch_and_find_each_band():
    """The standard five bands, checked against MNE's own Welch estimate (another
    implementation), and each band's sine lands in that band."""
    from mne.time_frequency import psd_array_welch

    t = np.arange(200) / 100.0
    rng = np.random.default_rng(1)
    X = rng.normal(0, 0.1, (1, 5, 200))
    for ch, hz in enumerate((2.0, 6.0, 10.0, 20.0, 40.0)):          # one per band
        X[0, ch] += np.sin(2 * np.pi * hz * t)
    F = baselines.welch_bands(X).reshape(5, 5)
    assert [int(np.argmax(F[ch])) for ch in range(5)] == [0, 1, 2, 3, 4]
    psd, f = psd_array_welch(X, 100.0, fmin=0, fmax=50, n_fft=100, n_per_seg=100,
                             n_overlap=50, window="hann", verbose="error")
    for k, (lo, hi) in enumerate(baselines.STANDARD_BANDS.values()):
        sel = (f >= lo) & (f < hi)
        want = np.log(psd[0][:, sel].sum(axis=-1) * (f[1] - f[0]))
        np.testing.assert_allclose(F[:, k], want, rtol=1e-4)
    with pytest.raises(ValueError, match=r"band beta 13.0-30.0 Hz does not fit .*Nyquist 25 Hz"):
        baselines.welch_bands(X[..., :100], sfreq=50.0)


def test_welch_bands_equal_scipys_welch_for_odd_and_even_segments():
    """The float32 Welch is scipy.signal.welch's defaults, to float rounding."""
    from scipy.signal import welch

    X = np.random.default_rng(2).normal(0, 5, (3, 4, 200)).astype(np.float32)
    for sfreq in (100.0, 99.0):  # 100- and 99-sample segments (a Nyquist bin or none)
        bands = {"low": (1.0, 9.0), "high": (9.0, 40.0)}
        f, psd = welch(X.astype(np.float64), fs=sfreq, nperseg=int(round(sfreq)), axis=-1)
        want = np.stack([np.log(psd[..., (f >= lo) & (f < hi)].sum(axis=-1) * (f[1] - f[0]))
                         for lo, hi in bands.values()], axis=-1).reshape(3, -1)
        np.testing.assert_allclose(baselines.welch_bands(X, sfreq, bands), want, atol=1e-5)


def test_feature_table_reads_once_what_features_gives_kind_by_kind(clean_release):
    w = challenge1.make_windows(clean_release)
    table = baselines.feature_table(w, chunk=7)
    for kind in baselines.KINDS:
        np.testing.assert_array_equal(table[kind], baselines.features(w, kind)[0])
    with pytest.raises(ValueError, match="kind must be one of"):
        baselines.feature_table(w, ("bands", "spectra"))


def test_reference_scores_fit_on_the_fit_rows_only():
    rng = np.random.default_rng(0)
    subjects = np.repeat([f"S{i}" for i in range(12)], 20)
    feats = {"bands": rng.normal(size=(240, 6))}
    y = feats["bands"][:, 0] + rng.normal(0, 0.5, 240)
    fit, test = np.isin(subjects, [f"S{i}" for i in range(9)]), subjects >= "S9"
    got = baselines.reference_scores(feats, y, subjects, fit, test, n_splits=3)
    assert set(got) == {"training mean", "ridge, 5 bands (Welch)"}
    ridge = baselines.fit_ridge(feats["bands"][fit], y[fit], subjects[fit], n_splits=3)
    assert got["ridge, 5 bands (Welch)"] == pytest.approx(
        scoring.nrmse(y[test], ridge.predict(feats["bands"][test])))
    assert got["ridge, 5 bands (Welch)"] < 0.7 < got["training mean"]
    y2 = y.copy()
    y2[test] += 100.0                          # the test targets never reach the fit
    moved = baselines.reference_scores(feats, y2, subjects, fit, test, n_splits=3)
    assert moved["training mean"] != got["training mean"]    # scored against the new y ...
    fit_again = baselines.fit_ridge(feats["bands"][fit], y2[fit], subjects[fit], n_splits=3)
    np.testing.assert_array_equal(fit_again.predict(feats["bands"]),
                                  ridge.predict(feats["bands"]))   # ... fitted as before


def test_margin_is_paired_by_fold_against_the_best_baseline():
    per_fold = {"deep": [0.30, 0.35, 0.31], "training mean": [1.0, 1.0, 1.0],
                "ridge, amplitude": [0.33, 0.36, 0.35],   # best by mean (0.3467)
                "ridge, 5 bands (Welch)": [0.34, 0.37, 0.34], "oracle": [0.1, 0.1, 0.1]}
    m = baselines.margin(per_fold)
    assert m.best == "ridge, amplitude"
    np.testing.assert_allclose(m.per_fold, [0.03, 0.01, 0.04], atol=1e-12)
    assert m.mean == pytest.approx(0.08 / 3)
    assert m.sd == pytest.approx(np.std([0.03, 0.01, 0.04], ddof=1))
    assert "+0.027 ± 0.015" in str(m) and "ridge, amplitude" in str(m)
    # the notebooks' layouts: one row per fold, or a fold table with "fold i" columns
    frame = pd.DataFrame(per_fold)
    assert baselines.margin(frame) == m
    table = frame.T.rename(columns=lambda i: f"fold {i}").assign(mean=frame.mean())
    assert baselines.margin(table) == m
    worse = baselines.margin({**per_fold, "deep": [0.40, 0.41, 0.39]})
    assert worse.mean < 0 and "above the best baseline" in str(worse)
    with pytest.raises(KeyError, match="no 'deep' scores"):
        baselines.margin({"ridge, amplitude": [0.3]})


def test_the_demo_table_shows_the_margin_with_its_fold_sd(tmp_path):
    from hybridnb_tools import notebooks, scores

    def table(deep, ridge):
        rows = {"deep": deep, "ridge, amplitude": ridge, "training mean": [1.0, 1.0, 1.0]}
        return {r: {"mean": float(np.mean(v)), "sd": float(np.std(v, ddof=1)),
                    **{f"fold {i}": x for i, x in enumerate(v)}} for r, v in rows.items()}

    t1 = table([0.30, 0.35, 0.31], [0.33, 0.36, 0.35])
    run = notebooks.NotebookRun("04_x", tmp_path / "a.ipynb", seconds=1.0, ok=True,
                                values={"c1_nrmse": 0.32, "c1_sd": 0.026, "c1_table": t1,
                                        "folds": 3})
    line = next(ln for ln in scores.summary([run], tmp_path, 1.0, quick=False).splitlines()
                if ln.startswith("Challenge 1"))
    assert "+0.027 ± 0.015" in line and "0.347 (ridge, amplitude)" in line
    assert scores.fold_margin({"deep": {"mean": 0.3, "sd": 0.0}}) is None   # no fold columns
