"""Parity with the official eegdash + braindecode pipeline, and the traps found when running it.

Skipped (with the reason) when eegdash, the ``challenge`` extra, is not installed.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from data_fixtures import clean_release, no_network

from data_prep import bids, challenge1, challenge2, official

USES_FIXTURES = (clean_release, no_network)  # imported for pytest

pytestmark = [
    pytest.mark.skipif(not official.available(),
                       reason="eegdash (pip install 'hybridnb[challenge]') is not installed; "
                              "the official pipeline cannot run"),
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore"),
]


def _official_meta(win) -> pd.DataFrame:
    return pd.concat([d.metadata.assign(subject=d.description["subject"],
                                        run=str(d.description["run"]))
                      for d in win.datasets], ignore_index=True)


def test_c1_identical_to_the_official_pipeline(clean_release, no_network, tmp_path):
    ds = official.load_recordings(clean_release, "contrastChangeDetection", loader="eegdash")
    win = official.c1_windows(ds)
    ours = challenge1.make_windows(clean_release, cache_dir=tmp_path, progress=False)
    ref = _official_meta(win)
    md = ours.metadata
    assert len(ref) == len(ours) > 50
    assert list(ref["subject"]) == list(md["subject"]) and list(ref["run"]) == list(md["run"])
    for col in ("i_window_in_trial", "i_start_in_trial", "i_stop_in_trial"):
        np.testing.assert_array_equal(ref[col].to_numpy(), md[col].to_numpy())
    for col in ("target", "rt_from_stimulus", "rt_from_trialstart", "stimulus_onset",
                "response_onset"):
        np.testing.assert_array_equal(ref[col].to_numpy(float), md[col].to_numpy(float))
    pd.testing.assert_series_equal(ref["correct"], md["correct"], check_names=False)
    pd.testing.assert_series_equal(ref["response_type"], md["response_type"],
                                   check_names=False)
    X = np.stack([win[i][0] for i in range(len(win))])
    np.testing.assert_array_equal(X, np.asarray(ours.X))          # bit for bit
    y = np.concatenate([d.y for d in win.datasets]).reshape(-1)
    np.testing.assert_array_equal(y.astype(np.float32), ours.y)
    _, _, inds = win[0]
    assert list(inds) == [0, md["start"][0], md["stop"][0]]
    # the same windows when data_prep is handed eegdash's dataset instead of the folder
    lazy = bids.load_eegdash(clean_release.parent, task="contrastChangeDetection")
    via = challenge1.make_windows(lazy, cache_dir=tmp_path / "via", progress=False)
    order = np.lexsort((via.metadata["start"], via.metadata["file"]))
    mine = np.lexsort((md["start"], md["file"]))
    np.testing.assert_array_equal(np.asarray(via.X)[order], np.asarray(ours.X)[mine])
    np.testing.assert_array_equal(via.y[order], ours.y[mine])


def test_c2_windows_targets_and_crops_identical(clean_release, no_network, tmp_path):
    ds = official.load_recordings(clean_release, ["RestingState", "contrastChangeDetection"],
                                  loader="eegdash")
    win = official.c2_windows(ds)
    ours = challenge2.make_windows(clean_release, tasks=("RestingState",
                                                         "contrastChangeDetection"),
                                   cache_dir=tmp_path, progress=False)
    ref = pd.concat([d.metadata.assign(file=d.raw.filenames[0].name) for d in win.datasets],
                    ignore_index=True)
    # eegdash orders recordings its own way: compare per file
    md = ours.metadata
    assert sorted(set(ref["file"])) == sorted(set(md["file"])) and len(ref) == len(md)
    crops = official.c2_crops(win, seed=42)
    ds_ours = ours.dataset(crop=200, seed=42)
    offset = 0
    for d, wrapped in zip(win.datasets, crops.datasets, strict=True):
        name = d.raw.filenames[0].name
        rows = np.flatnonzero(md["file"].to_numpy() == name)
        np.testing.assert_array_equal(d.metadata["i_start_in_trial"].to_numpy(),
                                      md["start"].to_numpy()[rows])
        target = float(d.description["externalizing"])
        assert (md["target"].to_numpy()[rows] == target).all()
        # sequential evaluation, seed 42: the same crops as local scoring's DatasetWrapper
        xs, ys = ds_ours[rows[:6].tolist()]
        for k in range(6):
            Xr, yr, (iw, i0, i1) = wrapped[k]
            off = i0 - d.metadata["i_start_in_trial"].iloc[k]
            assert torch.equal(xs[k], torch.from_numpy(np.asarray(Xr)))
            assert float(ys[k]) == np.float32(yr) and i1 - i0 == 200 and 0 <= off <= 200
        np.testing.assert_array_equal(d[3][0], np.asarray(ours.X[rows[3]]))
        offset += len(d)
    assert offset == len(ours)


def test_trap_preload_true_does_not_load_the_signal(clean_release):
    """braindecode 1.8.1 ignores preload=True: load_data() must run first (official.py does)."""
    ds = official.load_recordings(clean_release, "contrastChangeDetection", loader="mne_bids",
                                  load=False)
    win = official.c1_windows(ds, preload=True)
    assert not any(d.raw.preload for d in win.datasets)     # the starter kit as written
    loaded = official.load_recordings(clean_release, "contrastChangeDetection",
                                      loader="mne_bids", load=True)
    assert all(d.raw.preload for d in loaded.datasets)


def test_trap_basedataset_is_now_rawdataset():
    import braindecode.datasets as bdd

    cls = official.raw_dataset_class()
    assert cls.__name__ in ("RawDataset", "BaseDataset")
    if hasattr(bdd, "RawDataset"):
        assert cls is bdd.RawDataset
        with pytest.raises(ImportError):
            exec("from braindecode.datasets import BaseDataset")   # the starter kit's import


def test_trap_offline_needs_download_false(clean_release, no_network, monkeypatch):
    """load_eegdash never touches the network; eegdash's default (download=True) tries to,
    backing off ~30 s (2+4+8+16 s of retries) before it fails."""
    import time

    from eegdash import EEGChallengeDataset

    ds = bids.load_eegdash(clean_release.parent, task="RestingState")
    assert len(ds.datasets) == 4 and no_network == []
    waits = []
    monkeypatch.setattr(time, "sleep", waits.append)      # skip the back-off, but record it
    with pytest.raises(Exception):                    # noqa: B017 - any network failure
        EEGChallengeDataset(release="R5", cache_dir=clean_release.parent.resolve(),
                            mini=True, task="RestingState")
    assert no_network, "eegdash with download=True should have tried the network"
    assert sum(waits) >= 20


def test_trap_relative_cache_dir_gives_nan_targets(clean_release, monkeypatch, no_network):
    """eegdash with a relative cache_dir silently loses participants.tsv; ours resolves it."""
    from eegdash import EEGChallengeDataset

    monkeypatch.chdir(clean_release.parent.parent)
    rel = clean_release.parent.name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw_ds = EEGChallengeDataset(release="R5", cache_dir=rel, mini=True, task="RestingState",
                                     download=False,
                                     description_fields=["subject", "externalizing"])
    ours = bids.recordings_from_dataset(bids.load_eegdash(rel, task="RestingState"))
    part = bids.participants(clean_release)
    good = [r for r in ours if not np.isnan(part.loc[r.subject, "externalizing"])]
    assert len(good) == 3
    assert all(r.description["externalizing"] == part.loc[r.subject, "externalizing"]
               for r in good)
    raw_vals = [bids.to_number(d.description.get("externalizing")) for d in raw_ds.datasets]
    if not all(np.isnan(raw_vals)):
        pytest.skip("this eegdash version resolves relative cache_dir itself (trap fixed)")
