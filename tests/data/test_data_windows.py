"""Challenge 1/2 windows, the window store (cache), and the batch-fetching Dataset."""

from __future__ import annotations

import os
import pickle
import random

import mne
import numpy as np
import pandas as pd
import pytest
import torch
from data_fixtures import clean_release, private_release

from data_prep import bids, challenge1, challenge2, splits

USES_FIXTURES = (clean_release, private_release)  # imported for pytest


def _bdf_data(path):
    return mne.io.read_raw_bdf(path, preload=True, verbose="error").get_data()


def test_c1_windows_follow_the_events(clean_release, tmp_path):
    w = challenge1.make_windows(clean_release, cache_dir=tmp_path, progress=False)
    assert w.X.dtype == np.float32 and w.X.shape[1:] == (129, 200) and w.X.flags.c_contiguous
    assert isinstance(w.X, np.memmap) and len(w) == len(w.y) == len(w.metadata)
    md = w.metadata
    for (subject, run), rows in md.groupby(["subject", "run"]):
        rec = next(r for r in bids.find_recordings(clean_release, "contrastChangeDetection",
                                                   subject) if r.run == run)
        ev = pd.read_csv(rec.events_path, sep="\t")
        targets = ev[ev["value"].str.endswith("_target")]
        answered = [(t, ev["onset"][i + 1]) for i, t in targets["onset"].items()
                    if ev["value"][i + 1].endswith("_buttonPress")
                    and ev["feedback"][i + 1] != "non_target"]
        assert len(rows) == len(answered)        # one window per trial with a response
        stim = np.array([a for a, _ in answered])
        np.testing.assert_allclose(rows["stimulus_onset"].to_numpy(float), stim)
        np.testing.assert_allclose(rows["target"].to_numpy(float),
                                   [b - a for a, b in answered], atol=1e-9)
        np.testing.assert_array_equal(rows["i_start_in_trial"], np.round(stim * 100) + 50)
        data = _bdf_data(rec.path)
        for i, s in zip(rows.index, rows["start"], strict=True):
            np.testing.assert_array_equal(w.X[i], data[:, s:s + 200].astype(np.float32))
    assert set(md["correct"].dropna().unique()) <= {0, 1}
    assert str(md["correct"].dtype) == "Int64" and str(md["target"].dtype) == "Float64"
    assert {"subject", "task", "run", "start", "target", "response_type",
            "externalizing"} <= set(md.columns)
    assert w.problems.empty


def test_c1_last_trial_rule_of_older_eegdash(clean_release, tmp_path):
    new = challenge1.make_windows(clean_release, cache_dir=tmp_path, progress=False)
    old = challenge1.make_windows(clean_release, last_trial="drop", cache_dir=tmp_path,
                                  progress=False)
    runs = new.metadata.groupby(["subject", "run"]).size()
    old_runs = old.metadata.groupby(["subject", "run"]).size()
    # eegdash <= 0.4.1 lost the last trial of every run (no following trial start)
    assert ((runs - old_runs) <= 1).all() and (runs - old_runs).sum() >= 1
    assert old.info["key"] != new.info["key"]


def test_c2_windows_targets_and_drops(clean_release, tmp_path):
    w = challenge2.make_windows(clean_release, tasks=("RestingState", "contrastChangeDetection"),
                                cache_dir=tmp_path, progress=False)
    assert w.X.shape[1:] == (129, 400)
    part = bids.participants(clean_release)
    missing = part.index[part["externalizing"].isna()].tolist()
    assert len(missing) == 1 and missing[0] not in set(w.metadata["subject"])
    skipped = w.problems[w.problems["code"] == "nan_target"]
    assert len(skipped) == 4 and (skipped["subject"] == missing[0]).all()
    for rec in bids.find_recordings(clean_release):
        if rec.subject in missing:
            continue
        rows = w.metadata[w.metadata["file"] == rec.name]
        n_times = int(mne.io.read_raw_bdf(rec.path, verbose="error").n_times)
        np.testing.assert_array_equal(rows["start"], np.arange(0, n_times - 399, 200))
        assert (rows["target"] == part.loc[rec.subject, "externalizing"]).all()
    p = challenge2.make_windows(clean_release, tasks="RestingState", target="p_factor",
                                cache_dir=tmp_path, progress=False)
    assert set(p.metadata["task"]) == {"RestingState"}
    np.testing.assert_array_equal(p.y, p.metadata["p_factor"].to_numpy(np.float32))


def test_cache_loads_the_same_windows_again(clean_release, tmp_path):
    first = challenge1.make_windows(clean_release, cache_dir=tmp_path, progress=False)
    again = challenge1.make_windows(clean_release, cache_dir=tmp_path, progress=False)
    assert not first.info["cached"] and again.info["cached"]
    assert again.info["folder"] == first.info["folder"]
    np.testing.assert_array_equal(np.asarray(first.X), np.asarray(again.X))
    pd.testing.assert_frame_equal(first.metadata, again.metadata)
    rebuilt = challenge1.make_windows(clean_release, cache_dir=tmp_path, cache=False,
                                      progress=False)
    assert not rebuilt.info["cached"]
    np.testing.assert_array_equal(np.asarray(first.X), np.asarray(rebuilt.X))


def test_cache_is_invalidated_by_input_and_recipe_changes(private_release, tmp_path):
    root = private_release
    base = challenge1.make_windows(root, cache_dir=tmp_path, progress=False)
    # recipe change -> a different store
    shifted = challenge1.make_windows(root, shift_after_stim=0.4, cache_dir=tmp_path,
                                      progress=False)
    assert shifted.info["key"] != base.info["key"] and not shifted.info["cached"]
    np.testing.assert_array_equal(shifted.metadata["start"], base.metadata["start"] - 10)
    # an edited events file -> rebuilt, and the edit is seen
    rec = bids.find_recordings(root, "contrastChangeDetection")[0]
    lines = rec.events_path.read_text().splitlines()
    press = next(i for i, ln in enumerate(lines) if "_buttonPress" in ln and "face" in ln)
    cells = lines[press].split("\t")
    cells[0] = f"{float(cells[0]) + 0.1:.3f}"
    lines[press] = "\t".join(cells)
    rec.events_path.write_text("\n".join(lines) + "\n")
    edited = challenge1.make_windows(root, cache_dir=tmp_path, progress=False)
    assert edited.info["key"] != base.info["key"] and not edited.info["cached"]
    diff = edited.y.astype(float) - base.y.astype(float)
    assert np.isclose(diff, 0.1, atol=1e-5).sum() == 1 and np.isclose(diff, 0).sum() == len(diff) - 1
    # participants.tsv feeds the C2 target: editing it rebuilds C2
    c2 = challenge2.make_windows(root, cache_dir=tmp_path, progress=False)
    text = (root / "participants.tsv").read_text()
    st = os.stat(root / "participants.tsv")
    (root / "participants.tsv").write_text(text.replace("\tR5\t", "\tR5 \t", 1))
    os.utime(root / "participants.tsv", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert challenge2.make_windows(root, cache_dir=tmp_path, progress=False).info["key"] \
        != c2.info["key"]


def test_dataset_fetches_whole_batches_like_single_items(clean_release, tmp_path):
    w = challenge1.make_windows(clean_release, cache_dir=tmp_path, progress=False)
    ds = w.dataset()
    idx = [7, 2, 30, 2, 11]
    items = [ds[i] for i in idx]
    batch = ds.__getitems__(idx)
    for (x1, y1), (x2, y2) in zip(items, batch, strict=True):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    X, y = ds[idx]
    assert X.shape == (5, 129, 200) and torch.equal(X[2], torch.from_numpy(w.X[30]))
    assert torch.equal(y, torch.from_numpy(w.y[idx]))
    # a plain DataLoader uses __getitems__ + default collate; ds.loader() skips collation
    g = torch.Generator().manual_seed(0)
    plain = list(torch.utils.data.DataLoader(ds, batch_size=16, shuffle=False))
    fast = list(ds.loader(batch_size=16, shuffle=False, generator=g))
    assert len(plain) == len(fast) == -(-len(w) // 16)
    for (a, ya), (b, yb) in zip(plain, fast, strict=True):
        assert torch.equal(a, b) and torch.equal(ya, yb) and ya.shape == (len(a),)
    seen = torch.cat([yb for _, yb in ds.loader(batch_size=16, generator=g)])
    assert sorted(seen.tolist()) == sorted(w.y.tolist())       # shuffled: each item once
    scaled = w.dataset(scale=1e6)[3][0]
    torch.testing.assert_close(scaled, ds[3][0] * 1e6)


def test_crops_follow_the_starter_kit_convention(clean_release, tmp_path):
    w = challenge2.make_windows(clean_release, cache_dir=tmp_path, progress=False)
    ds = w.dataset(crop=200, seed=42)
    rec = w.metadata["recording"].to_numpy()
    order = list(range(len(w)))
    X, _ = ds[order[:40]]
    rngs = {}
    for i in order[:40]:                  # what DatasetWrapper draws, item by item, seed 42
        r = rngs.setdefault(rec[i], random.Random(42))
        off = r.randint(0, 200)
        assert torch.equal(X[i], torch.from_numpy(np.asarray(w.X[i][:, off:off + 200])))
    # the same crops when the whole store sits on a device (here the CPU)
    dev = w.dataset(crop=200, seed=42, device="cpu")
    Xd, yd = dev[order[:40]]
    assert torch.equal(Xd, X) and yd.device.type == "cpu"
    with pytest.raises(ValueError, match="crop must be in 1..400"):
        w.dataset(crop=500)


def test_subsets_share_the_store_and_pickle_small(clean_release, tmp_path):
    w = challenge1.make_windows(clean_release, cache_dir=tmp_path, progress=False)
    train, val, test = splits.by_subject(w, val=1, test=1, seed=0)
    assert train._base is w._base and len(train) + len(val) + len(test) == len(w)
    np.testing.assert_array_equal(test.X, w.X[test.index])
    ds = train.dataset()
    blob = pickle.dumps(ds)                 # what a spawn-started loader worker receives
    assert len(blob) < 200_000 < w.X.nbytes
    back = pickle.loads(blob)
    assert torch.equal(back[5][0], ds[5][0])
    assert torch.equal(train.to_tensor()[5], ds[5][0])


def test_lost_sample_checks_agree_on_blocks_and_windows():
    from data_prep.signal import bad_spans, bad_windows

    rng = np.random.default_rng(1)
    block = rng.normal(size=(5, 3000)).astype(np.float32)
    block[:, 500:549] = 0.0          # 49 flat samples: not a dropout
    block[:, 1000:1050] = 0.0        # 50 flat samples: a dropout
    block[:, 2001:2300] = 7.0        # a long one
    block[2, 2700] = np.nan
    starts = np.arange(0, 3000 - 200 + 1, 37)
    windows = np.stack([block[:, s:s + 200] for s in starts])
    expected = bad_windows(windows)
    np.testing.assert_array_equal(bad_spans(block, starts, 200), expected)
    assert expected.any() and not expected.all()
    hits = set(starts[expected])
    assert not any(330 <= s <= 500 for s in hits)               # the 49-sample run is fine
    assert any(s <= 1000 and s + 200 >= 1050 for s in hits)
    assert any(s <= 2700 < s + 200 for s in hits)
