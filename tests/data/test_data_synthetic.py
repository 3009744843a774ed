"""The synthetic HBN-like release: layout, readability by mne-bids / eegdash, planted signal."""

from __future__ import annotations

import hashlib
import json
import time

import numpy as np
import pandas as pd
import pytest
from data_fixtures import clean_release, no_network

from data_prep import bids, official, synthetic
from data_prep.bdf import read_header
from data_prep.planted import PLANTED, ceilings

USES_FIXTURES = (clean_release, no_network)  # imported for pytest


def test_release_layout_matches_the_challenge_files(clean_release):
    root = clean_release
    assert root.name == "EEG2025r5mini"
    desc = json.loads((root / "dataset_description.json").read_text())
    assert desc["BIDSVersion"] == "1.9.0"
    part = pd.read_csv(root / "participants.tsv", sep="\t", dtype=str, keep_default_na=False)
    assert list(part.columns) == synthetic.PARTICIPANT_COLUMNS and len(part.columns) == 24
    assert list(part["participant_id"]) == [f"sub-{s}" for s in synthetic.R5_MINI[:4]]
    assert (part[["p_factor", "externalizing"]] == "n/a").all(axis=1).sum() == 1
    for task in ("contrastChangeDetection", "RestingState"):
        side = json.loads((root / f"task-{task}_eeg.json").read_text())
        assert side["SamplingFrequency"] == 100 and side["EEGReference"] == "Cz"
    sub = synthetic.R5_MINI[0]
    eeg = root / f"sub-{sub}" / "eeg"
    names = sorted(p.name for p in eeg.iterdir())
    assert f"sub-{sub}_task-contrastChangeDetection_run-3_eeg.bdf" in names
    assert f"sub-{sub}_task-RestingState_events.tsv" in names
    ev = pd.read_csv(eeg / f"sub-{sub}_task-contrastChangeDetection_run-1_events.tsv",
                     sep="\t", dtype=str, keep_default_na=False)
    assert list(ev.columns) == ["onset", "duration", "value", "event_code", "feedback"]
    assert (ev["duration"] == "n/a").all()
    assert ev["value"].iloc[-1] == "end_experiment"
    assert set(ev["feedback"]) <= {"n/a", "smiley_face", "sad_face", "non_target"}
    onsets = ev["onset"].astype(float)
    assert onsets.is_monotonic_increasing
    # 24-bit BDF, 129 channels in GSN-HydroCel-129 order, whole seconds
    bdf = eeg / f"sub-{sub}_task-contrastChangeDetection_run-1_eeg.bdf"
    h = read_header(bdf)
    assert h.ch_names[:2] == ["E1", "E2"] and h.ch_names[-1] == "Cz" and h.n_channels == 129
    assert h.sfreq == 100 and h.samples_per_record == 100
    assert bdf.stat().st_size == h.header_bytes + h.n_records * 129 * 100 * 3
    assert onsets.iloc[-1] + 0.5 < h.n_times / 100


def test_mne_bids_reads_the_release_with_the_same_values(clean_release):
    import mne
    from mne_bids import get_bids_path_from_fname, read_raw_bids

    recs = bids.find_recordings(clean_release)
    assert len(recs) == 4 * 4
    for rec in recs[:4]:
        raw = read_raw_bids(get_bids_path_from_fname(rec.path), verbose="error")
        assert raw.info["sfreq"] == 100 and len(raw.ch_names) == 129
        events = pd.read_csv(rec.events_path, sep="\t")
        assert len(raw.annotations) == len(events)
        assert list(raw.annotations.description) == list(events["value"])
        assert not any(d.startswith("BAD") for d in raw.annotations.description)
        data = mne.io.read_raw_bdf(rec.path, preload=True, verbose="error").get_data()
        ours = bids.read_raw(rec).get_data()
        np.testing.assert_array_equal(data, ours)
        cz = data[raw.ch_names.index("Cz")]
        assert cz.std() < 0.01 * data.std()          # the reference channel is near flat
        assert 3e-6 < data.std() < 60e-6             # tens of µV


@pytest.mark.skipif(not official.available(), reason="eegdash (challenge extra) not installed")
def test_eegdash_reads_the_release_offline(clean_release, no_network):
    ds = bids.load_eegdash(clean_release.parent, task=["contrastChangeDetection",
                                                       "RestingState"])
    assert len(ds.datasets) == 16
    recs = bids.recordings_from_dataset(ds)
    part = bids.participants(clean_release)
    for rec in recs:
        want = part.loc[rec.subject, "externalizing"]
        got = rec.description["externalizing"]
        assert (np.isnan(want) and np.isnan(got)) or got == want
        assert isinstance(rec.description["age"], float) and not np.isnan(rec.description["age"])
    raw = ds.datasets[0].raw
    assert raw.info["sfreq"] == 100 and len(raw.ch_names) == 129
    assert no_network == []


def test_generation_is_deterministic_and_reused(tmp_path):
    kw = dict(n_subjects=1, tasks=("RestingState",), rest_cycles=1, seed=11, n_jobs=1)
    a = synthetic.make_hbn_like(tmp_path / "a", **kw)
    b = synthetic.make_hbn_like(tmp_path / "b", **kw)

    def digest(root):
        return {p.relative_to(root).as_posix(): hashlib.md5(p.read_bytes()).hexdigest()
                for p in sorted(root.rglob("*")) if p.is_file() and p.parent.name != "code"}

    assert digest(a) == digest(b)
    bdf = next(a.rglob("*.bdf"))
    mtime = bdf.stat().st_mtime_ns
    t0 = time.perf_counter()
    assert synthetic.make_hbn_like(tmp_path / "a", **kw) == a      # same parameters: reused
    assert time.perf_counter() - t0 < 1.0 and bdf.stat().st_mtime_ns == mtime
    c = synthetic.make_hbn_like(tmp_path / "c", **{**kw, "seed": 12})
    assert digest(a) != digest(c)


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="n_subjects=21"):
        synthetic.make_hbn_like(tmp_path, n_subjects=21)
    with pytest.raises(ValueError, match="unknown fault"):
        synthetic.make_hbn_like(tmp_path, n_subjects=2, faults=("gremlins",))
    with pytest.raises(ValueError, match="unknown task"):
        synthetic.make_hbn_like(tmp_path, n_subjects=2, tasks=("Tetris",))
    with pytest.raises(ValueError, match="needs task 'RestingState'"):
        synthetic.make_hbn_like(tmp_path, n_subjects=2, tasks=("contrastChangeDetection",),
                                faults=("short_recording",))


def test_ceilings_are_documented_and_sensible(clean_release):
    c = ceilings()
    assert 0.05 < c["c1"] < 0.5 < c["c2"] < 1.0
    assert c["overall"] == pytest.approx(0.3 * c["c1"] + 0.7 * c["c2"], abs=1e-4)
    summ = synthetic.summary(clean_release)
    assert summ["ceilings"] == c and summ["params"]["planted"] == PLANTED.to_dict()
    # weaker planted latents -> worse best achievable score
    from dataclasses import replace
    assert ceilings(replace(PLANTED, motor_jitter=0.3, cpp_jitter=0.3))["c1"] > c["c1"]
    assert ceilings(replace(PLANTED, alpha_beta=0.5))["c2"] < c["c2"]


def test_planted_response_time_is_learnable(clean_release):
    """Ridge on the planted components' time courses beats the mean on held-out subjects.

    The spatial filter projects out the background sources' scalp maps (what a CNN's spatial
    layer learns from data) and pools the parietal and motor maps.
    """
    from sklearn.linear_model import Ridge

    from data_prep import challenge1
    from data_prep.scoring import nrmse
    from data_prep.synth_signal import _background_mixing, _maps

    w = challenge1.make_windows(clean_release, progress=False)
    B = _background_mixing()
    null = np.eye(129) - B @ np.linalg.pinv(B)
    maps = np.stack([_maps()[k] for k in ("parietal", "left_motor", "right_motor")]) @ null
    maps /= np.abs(maps).sum(axis=1, keepdims=True)
    X = np.einsum("kc,nct->nkt", maps, np.asarray(w.X) * 1e6)
    F = X.reshape(len(X), 3, 20, 10).mean(-1).reshape(len(X), -1)
    y = w.y.astype(float)
    subj = w.metadata["subject"].to_numpy()
    pred = np.empty_like(y)
    for s in np.unique(subj):                       # leave one subject out
        test = subj == s
        pred[test] = Ridge(alpha=10.0).fit(F[~test], y[~test]).predict(F[test])
    assert len(y) > 60
    assert nrmse(y, pred) < 0.7
