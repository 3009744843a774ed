"""Planted faults: each is found and named, and no fault costs the other recordings' windows."""

from __future__ import annotations

import hashlib
import warnings

import numpy as np
import pytest
from data_fixtures import ALL_FAULTS, faulty_release

from data_prep import bids, challenge1, challenge2, events, synthetic
from data_prep.signal import Source

USES_FIXTURES = (faulty_release,)  # imported for pytest
pytestmark = pytest.mark.slow      # the faulty release takes ~5-8 s to write on 2 cores

# fault -> (problem code, level) in the Challenge 1 windows
C1_EXPECTED = {
    "nan_durations": ("nan_durations", "note"),
    "empty_durations": ("empty_durations", "repaired"),
    "no_feedback": ("no_feedback", "note"),
    "six_channels": ("wrong_channel_count", "skipped"),
    "no_presses": ("no_trials", "skipped"),
    "nan_stretch": ("lost_samples", "dropped"),
    "truncated_bdf": ("truncated_bdf", "skipped"),
    "unsorted_onsets": ("unsorted_onsets", "repaired"),
    "late_anchor": ("late_anchor", "dropped"),
}


def _where(root) -> dict[str, str]:
    """fault -> file stem (sub-..._task-..._run-...) it was planted in."""
    out = {}
    for f in synthetic.summary(root)["faults"]:
        run = f"_run-{f['run']}" if f["run"] else ""
        out[f["fault"]] = f"sub-{f['subject']}_task-{f['task']}{run}"
    return out


@pytest.fixture
def c1(faulty_release, tmp_path_factory):
    return challenge1.make_windows(faulty_release, cache_dir=tmp_path_factory.mktemp("c1"),
                                   progress=False)


def test_each_c1_fault_is_named_with_its_file(faulty_release, c1):
    where = _where(faulty_release)
    assert set(where) == set(ALL_FAULTS)
    probs = c1.problems
    for fault, (code, level) in C1_EXPECTED.items():
        hit = probs[(probs["code"] == code) & probs["file"].str.contains(where[fault])]
        assert len(hit) == 1, (fault, probs[["file", "code"]])
        assert hit["level"].iloc[0] == level
        assert where[fault] in hit["message"].iloc[0]
    assert len(probs) == len(C1_EXPECTED)            # nothing reported for clean recordings
    msgs = dict(zip(probs["code"], probs["message"], strict=True))
    assert "arange: cannot compute length" in msgs["nan_durations"]
    assert "could not convert string to float: ''" in msgs["empty_durations"]
    assert "trial_stop_offset_samples" in msgs["late_anchor"]
    assert "truncated" in msgs["truncated_bdf"] and "6 channels" in msgs["wrong_channel_count"]
    assert "0 button presses" in msgs["no_trials"]
    assert "[skipped] truncated_bdf" in c1.report()


def test_each_c2_fault_is_named(faulty_release, tmp_path):
    w = challenge2.make_windows(faulty_release, tasks=("RestingState", "contrastChangeDetection"),
                                cache_dir=tmp_path, progress=False)
    where = _where(faulty_release)
    probs = w.problems
    for fault, code in [("short_recording", "too_short"), ("six_channels", "wrong_channel_count"),
                        ("truncated_bdf", "truncated_bdf"), ("nan_stretch", "lost_samples")]:
        hit = probs[(probs["code"] == code) & probs["file"].str.contains(where[fault])]
        assert len(hit) == 1, (fault, probs[["file", "code"]])
    assert "300 samples" in probs.loc[probs["code"] == "too_short", "message"].iloc[0]
    assert not w.metadata["file"].str.contains(where["six_channels"]).any()


def test_faults_do_not_cost_other_recordings_windows(faulty_release, c1, tmp_path):
    """The windows of the clean recordings are exactly those they give on their own."""
    where = _where(faulty_release)
    bad_files = {where[f] for f in ("six_channels", "no_presses", "truncated_bdf")}
    recs = bids.find_recordings(faulty_release, "contrastChangeDetection")
    good = [r for r in recs if not any(r.name.startswith(b) for b in bad_files)]
    alone = challenge1.make_windows(good, cache_dir=tmp_path, progress=False)
    assert len(alone) == len(c1) and len(c1) > 100
    np.testing.assert_array_equal(np.asarray(alone.X), np.asarray(c1.X))
    np.testing.assert_array_equal(alone.y, c1.y)
    # the repaired files keep their trials; the late-anchor run keeps all but its last trial
    md = c1.metadata
    for fault in ("empty_durations", "unsorted_onsets", "nan_durations", "no_feedback"):
        assert (md["file"].str.startswith(where[fault])).sum() >= 3
    assert md.loc[md["file"].str.startswith(where["no_feedback"]), "correct"].isna().all()


def test_an_unexpected_error_skips_only_that_recording(faulty_release, monkeypatch, tmp_path):
    recs = bids.find_recordings(faulty_release, "contrastChangeDetection")[:4]
    victim = recs[1].name
    original = Source.windows

    def broken(self, starts, length, **kw):
        if self.rec.name == victim:
            raise MemoryError("simulated allocation failure")
        return original(self, starts, length, **kw)

    monkeypatch.setattr(Source, "windows", broken)
    w = challenge1.make_windows(recs, cache_dir=tmp_path, progress=False, n_jobs=2)
    err = w.problems[w.problems["code"] == "error"]
    assert list(err["file"]) == [victim] and "MemoryError" in err["message"].iloc[0]
    assert set(w.metadata["file"]) == {r.name for r in recs} - {victim}


def test_events_errors_name_the_file(tmp_path):
    p = tmp_path / "sub-X_task-contrastChangeDetection_run-1_events.tsv"
    p.write_text("onset\tduration\ttrial_type\n1.0\tn/a\tgo\n")
    with pytest.raises(events.EventsError, match=r"sub-X_task.*missing column\(s\) \['value'\]"):
        events.read_events(p)
    p.write_text("onset\tduration\tvalue\n1.0\tn/a\tgo\nsoon\tn/a\tstop\n")
    with pytest.raises(events.EventsError, match=r"events.tsv: 'onset' is not a number in line 3"):
        events.read_events(p)
    p.write_text("onset\tduration\tvalue\n")
    problems = []
    df = events.read_events(p, problems)
    with pytest.raises(events.EventsError, match="no trial with both a target and a response"):
        events.c1_trials(df, 1000, 100.0, p.name, problems)


def test_empty_durations_read_without_touching_the_file(faulty_release):
    """Trap: mne-bids fails on empty duration cells; data_prep reads them, file unchanged."""
    from mne_bids import get_bids_path_from_fname, read_raw_bids

    stem = _where(faulty_release)["empty_durations"]
    rec = next(r for r in bids.find_recordings(faulty_release) if r.name.startswith(stem))
    before = hashlib.md5(rec.events_path.read_bytes()).hexdigest()
    with pytest.raises(ValueError, match="could not convert string to float: ''"):
        read_raw_bids(get_bids_path_from_fname(rec.path), verbose="error")
    raw = bids.read_raw(rec)
    ev = events.read_events(rec.events_path)
    assert list(raw.annotations.description) == list(ev["value"])
    np.testing.assert_allclose(raw.annotations.onset, ev["onset"])
    assert hashlib.md5(rec.events_path.read_bytes()).hexdigest() == before


def test_nan_durations_reproduce_the_arange_error_and_are_avoided(faulty_release, tmp_path):
    """Trap: braindecode infers window size 0 from n/a/NaN durations -> 'arange' error."""
    from braindecode.datasets import BaseConcatDataset
    from braindecode.preprocessing import create_windows_from_events

    from data_prep.official import raw_dataset_class

    stem = _where(faulty_release)["nan_durations"]
    rec = next(r for r in bids.find_recordings(faulty_release) if r.name.startswith(stem))
    raw = bids.read_raw(rec)
    assert np.all(raw.annotations.duration == 0)          # NaN / n/a became 0 in MNE
    ds = BaseConcatDataset([raw_dataset_class()(raw, description={"subject": rec.subject})])
    with warnings.catch_warnings(), pytest.raises(ValueError, match="arange: cannot compute"):
        warnings.simplefilter("ignore")
        create_windows_from_events(ds, mapping={"contrastTrial_start": 0},
                                   trial_start_offset_samples=0, trial_stop_offset_samples=0,
                                   preload=True)
    w = challenge1.make_windows([rec], cache_dir=tmp_path, progress=False)
    assert len(w) >= 3 and list(w.problems["code"]) == ["nan_durations"]
