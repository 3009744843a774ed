"""Bad input gets a clear answer (issue 15): each case side by side with the answer it must get.

One parametrized test per group; each group starts with its table of
``(case id, input / setup, expected answer)``. A case fails when the answer is missing, vague
(no file or value named), or when good data around the bad input is lost or overwritten.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from data_fixtures import CLEAN, clean_release, private_release

from data_prep import bids, challenge1, challenge2, synthetic
from data_prep.bdf import read_header

USES_FIXTURES = (clean_release, private_release)  # imported for pytest


def _digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.md5(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _problems(w, code: str):
    return w.problems[w.problems["code"] == code]


# ==============================================================================================
# data_prep
# ==============================================================================================

# --- synthetic.make_hbn_like over an existing release folder (item 12) ------------------------
# The marker code/hybridnb_synthetic.json tells make_hbn_like's own releases apart. A folder it
# did not write is never written into, with or without overwrite=True (it may be a real eegdash
# cache: nothing the user has is overwritten); its own release is replaced, stale files removed,
# files the user added kept.
SMALL = dict(tasks=("RestingState",), rest_cycles=1, n_jobs=1)
SYNTHETIC_CASES = [
    # (case id, what <root>/EEG2025r5mini holds before, kwargs of the call, expected answer)
    ("foreign_release_refused", "foreign", dict(n_subjects=2),
     {"raises": (FileExistsError, r"EEG2025r5mini.* not written by .*make_hbn_like.*"
                                  r"(other|different) root")}),
    ("foreign_release_refused_with_overwrite", "foreign", dict(n_subjects=2, overwrite=True),
     {"raises": (FileExistsError, r"EEG2025r5mini.*overwrite=True only replaces")}),
    ("own_release_replaced_with_overwrite", "own:2", dict(n_subjects=2, overwrite=True),
     {"subjects": 2, "rewritten": True}),
    ("own_release_other_parameters_no_stale_subjects", "own:3", dict(n_subjects=2),
     {"subjects": 2, "rewritten": True, "says": "replacing the synthetic release"}),
    ("own_release_written_only_partly_is_rewritten", "partial:2", dict(n_subjects=2),
     {"subjects": 2, "rewritten": True, "says": "only partly"}),
    ("own_release_kept_on_a_bad_argument", "own:2", dict(n_subjects=21),
     {"raises": (ValueError, r"n_subjects=21 but a mini release has 20")}),
    ("own_release_same_parameters_reused", "own:2", dict(n_subjects=2),
     {"subjects": 2, "rewritten": False}),
    ("empty_folder_is_written", "empty", dict(n_subjects=2),
     {"subjects": 2, "rewritten": True}),
]


def _existing(root: Path, what: str) -> Path:
    ds = root / "EEG2025r5mini"
    if what == "empty":
        ds.mkdir(parents=True)
    elif what == "foreign":               # a real eegdash cache, as far as anyone can tell
        eeg = ds / "sub-NDARAH793FBF" / "eeg"
        eeg.mkdir(parents=True)
        (ds / "participants.tsv").write_text("participant_id\tage\nsub-NDARAH793FBF\t9.1\n")
        (ds / "README").write_text("Healthy Brain Network, release 5 (real)\n")
        (eeg / "sub-NDARAH793FBF_task-RestingState_eeg.bdf").write_bytes(b"real data" * 100)
    else:               # "own:<n>" / "partial:<n>": written by make_hbn_like, plus a user file
        synthetic.make_hbn_like(root, n_subjects=int(what.split(":")[1]), **SMALL)
        (ds / "derivatives").mkdir()
        (ds / "derivatives" / "my_notes.txt").write_text("mine")
        if what.startswith("partial"):    # as a write killed half-way leaves it
            marker = ds / "code" / "hybridnb_synthetic.json"
            params = json.loads(marker.read_text())["params"]
            marker.write_text(json.dumps({"params": params, "complete": False}))
            next(ds.glob("sub-*/eeg/*.bdf")).unlink()
    return ds


@pytest.mark.parametrize("case,before,kwargs,expected", SYNTHETIC_CASES,
                         ids=[c[0] for c in SYNTHETIC_CASES])
def test_make_hbn_like_over_an_existing_folder(tmp_path, capsys, case, before, kwargs,
                                               expected):
    ds = _existing(tmp_path, before)
    old = _digest(ds)
    capsys.readouterr()
    if "raises" in expected:
        exc, pattern = expected["raises"]
        with pytest.raises(exc, match=pattern) as info:
            synthetic.make_hbn_like(tmp_path, **SMALL, **kwargs)
        if before == "foreign":
            assert str(ds) in str(info.value)
        assert _digest(ds) == old                         # nothing written into it or removed
        return
    out = synthetic.make_hbn_like(tmp_path, **SMALL, **kwargs)
    assert out == ds
    said = capsys.readouterr().err
    if "says" in expected:                              # replacing its own release: said once
        assert said.count(expected["says"]) == 1, said
    new = _digest(ds)
    bdfs = sorted(ds.glob("sub-*/eeg/*.bdf"))
    assert len(bdfs) == expected["subjects"]            # no stale subject from a bigger release
    assert len(bids.participants(ds)) == expected["subjects"]
    assert len(bids.find_recordings(ds)) == expected["subjects"]
    assert (new != old) == expected["rewritten"]
    if before != "empty":
        assert new["derivatives/my_notes.txt"] == old["derivatives/my_notes.txt"]


# --- participants.tsv (item 13) -----------------------------------------------------------------
def _empty(text: str) -> str:
    return ""


def _header_only(text: str) -> str:
    return text.splitlines()[0] + "\n"


def _trailing_tab(text: str) -> str:
    return "".join(line + "\t\n" for line in text.splitlines())


def _trailing_tab_rows_only(text: str) -> str:   # pandas takes the ids as the index: "R5" ids
    head, *rows = text.splitlines()
    return head + "\n" + "".join(line + "\t\n" for line in rows)


def _trailing_spaces_crlf(text: str) -> str:
    return "".join(line + "  \r\n" for line in text.splitlines())


PARTICIPANTS_CASES = [
    # (case id, participants.tsv made from the clean one (None: deleted), challenge, expected)
    ("empty_file", _empty, 1,
     {"raises": (bids.ParticipantsError, r"participants\.tsv: the file is empty.*restore")}),
    ("header_only_c1_note_once", _header_only, 1,
     {"note": ("no_participants", r"participants\.tsv: no rows.*age.*sex.*restore"),
      "same_windows": True, "demographics": False}),
    ("missing_c1_note_once", None, 1,
     {"note": ("no_participants", r"participants\.tsv: missing.*age.*sex.*restore"),
      "same_windows": True, "demographics": False}),
    ("header_only_c2", _header_only, 2,
     {"raises": (bids.ParticipantsError,
                 r"participants\.tsv: no rows.*'externalizing'.*restore")}),
    ("missing_c2", None, 2,
     {"raises": (bids.ParticipantsError, r"participants\.tsv: missing.*'externalizing'.*restore")}),
    ("trailing_tab_rows_only_c1", _trailing_tab_rows_only, 1,
     {"same_windows": True, "demographics": True}),
    ("trailing_tab_c2", _trailing_tab, 2, {"same_windows": True}),
    ("trailing_tab_rows_only_c2", _trailing_tab_rows_only, 2, {"same_windows": True}),
    ("trailing_spaces_crlf_c2", _trailing_spaces_crlf, 2, {"same_windows": True}),
]


def _windows(challenge: int, root, cache_dir):
    make = challenge1.make_windows if challenge == 1 else challenge2.make_windows
    return make(root, cache_dir=cache_dir, progress=False)


@pytest.mark.parametrize("case,edit,challenge,expected", PARTICIPANTS_CASES,
                         ids=[c[0] for c in PARTICIPANTS_CASES])
def test_participants_tsv(clean_release, private_release, tmp_path, case, edit, challenge,
                          expected):
    path = private_release / "participants.tsv"
    if edit is None:
        path.unlink()
    else:
        path.write_text(edit(path.read_text()))
    if "raises" in expected:
        exc, pattern = expected["raises"]
        with pytest.raises(exc, match=pattern) as info:
            _windows(challenge, private_release, tmp_path / "c")
        assert str(path) in str(info.value)
        return
    w = _windows(challenge, private_release, tmp_path / "c")
    ref = _windows(challenge, clean_release, tmp_path / "ref")
    if expected.get("same_windows"):
        assert list(w.metadata["subject"]) == list(ref.metadata["subject"])
        np.testing.assert_array_equal(w.y, ref.y)
        np.testing.assert_array_equal(np.asarray(w.X), np.asarray(ref.X))
    if "note" in expected:
        code, pattern = expected["note"]
        hit = _problems(w, code)
        assert len(hit) == 1, w.problems                     # once, not once per recording
        assert hit["level"].iloc[0] == "note"
        assert re.search(pattern, hit["message"].iloc[0]), hit["message"].iloc[0]
        assert str(path) in hit["message"].iloc[0]
    else:                                   # the same answer as the untouched release
        assert list(w.problems["message"]) == list(ref.problems["message"]), w.problems
    if "demographics" in expected:
        cols = ("age", "sex", "externalizing")
        if expected["demographics"]:
            for c in cols:
                assert list(w.metadata[c].astype(str)) == list(ref.metadata[c].astype(str))
        else:
            assert not any(c in w.metadata.columns for c in cols)
    if challenge == 2 or expected.get("demographics"):
        part = bids.participants(private_release)
        assert list(part.index) == list(synthetic.R5_MINI[:CLEAN["n_subjects"]])
        assert set(part["release_number"]) == {"R5"}


# --- one recording's trials and length (items 14, 15) -----------------------------------------
def _shift_onsets(rec, seconds: float = -8.0) -> None:
    lines = rec.events_path.read_text().splitlines()
    out = [lines[0]]
    for line in lines[1:]:
        cells = line.split("\t")
        cells[0] = f"{float(cells[0]) + seconds:.3f}"
        out.append("\t".join(cells))
    rec.events_path.write_text("\n".join(out) + "\n")


def _shorten_bdf(rec, seconds: int) -> None:
    """Cut the BDF to its first ``seconds`` (a valid, shorter file: header and data agree)."""
    h = read_header(rec.path)
    records = int(seconds * h.sfreq) // h.samples_per_record
    with open(rec.path, "r+b") as f:
        f.seek(236)
        f.write(f"{records:<8d}".encode())
        f.truncate(h.header_bytes + records * h.record_bytes)


RECORDING_CASES = [
    # (case id, change to the first CCD run, expected problem (code, level, message), windows lost)
    ("one_window_before_the_start", _shift_onsets,
     ("before_start", "dropped", r"1 trial\(s\) with the target at -1\.262 s.*0\.5–2\.5 s after "
                                 r"it starts before the recording"), 1),
    ("too_short_for_any_trial", lambda rec: _shorten_bdf(rec, 3),
     ("too_short", "skipped", r"3 s \(300 samples\) long.*0\.5–2\.5 s after .*target.*"
                              r"first target at 6\.738 s.*924 samples \(9\.24 s\)"), "all"),
    ("too_short_for_its_first_window", lambda rec: _shorten_bdf(rec, 8),
     ("too_short", "skipped", r"8 s \(800 samples\) long.*0\.5–2\.5 s after .*target.*"
                              r"first target at 6\.738 s.*924 samples \(9\.24 s\)"), "all"),
]


@pytest.mark.parametrize("case,change,problem,lost", RECORDING_CASES,
                         ids=[c[0] for c in RECORDING_CASES])
def test_one_recording_with_bad_trials(clean_release, private_release, tmp_path, case, change,
                                       problem, lost):
    rec = bids.find_recordings(private_release, "contrastChangeDetection")[0]
    change(rec)
    w = challenge1.make_windows(private_release, cache_dir=tmp_path / "c", progress=False)
    ref = challenge1.make_windows(clean_release, cache_dir=tmp_path / "ref", progress=False)
    code, level, pattern = problem
    hit = _problems(w, code)
    assert len(hit) == 1 and len(w.problems) == 1, w.problems
    stem = rec.name[: -len("_eeg.bdf")]                   # names the recording's files
    assert hit["level"].iloc[0] == level and hit["file"].iloc[0].startswith(stem)
    assert re.search(pattern, hit["message"].iloc[0]), hit["message"].iloc[0]
    assert hit["message"].iloc[0].startswith(stem)
    mine, theirs = w.metadata["file"] == rec.name, ref.metadata["file"] == rec.name
    n_ref = int(theirs.sum())
    assert int(mine.sum()) == (0 if lost == "all" else n_ref - lost)
    # every other recording keeps exactly its windows
    np.testing.assert_array_equal(np.asarray(w.X)[~mine.to_numpy()],
                                  np.asarray(ref.X)[~theirs.to_numpy()])
    if lost != "all":      # the kept trials of this recording: its later ones, 8 s earlier
        kept, orig = w.metadata[mine], ref.metadata[theirs].iloc[lost:]
        np.testing.assert_array_equal(kept["target"], orig["target"])
        np.testing.assert_array_equal(kept["start"], orig["start"] - 800)


# --- the window cache (item 16) ---------------------------------------------------------------
def _same_size_edit(path: Path, old: str, new: str) -> None:
    """Replace ``old`` by ``new`` (same length) once, then put the old mtime back."""
    assert len(old) == len(new)
    st = path.stat()
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size


def _edit_events(root: Path) -> tuple[str, Path]:
    rec = bids.find_recordings(root, "contrastChangeDetection")[0]
    _same_size_edit(rec.events_path, "7.859\tn/a\tright_buttonPress",
                    "7.959\tn/a\tright_buttonPress")          # first response 0.1 s later
    return rec.name, rec.events_path


def _edit_participants(root: Path) -> tuple[str, Path]:
    path = root / "participants.tsv"
    rows = path.read_text().splitlines()
    header = rows[0].split("\t")
    k = header.index("externalizing")
    cells = rows[1].split("\t")
    value = cells[k]
    flipped = value[1:] + "0" if value.startswith("-") else "-" + value[:-1]
    _same_size_edit(path, "\t".join(cells), "\t".join(cells[:k] + [flipped] + cells[k + 1:]))
    return cells[0][4:], path


CACHE_CASES = [
    # (case id, same-size edit with the mtime restored, challenge, expected change)
    ("events_tsv_edit", _edit_events, 1, "the first response 0.1 s later"),
    ("participants_tsv_edit", _edit_participants, 2, "the first subject's target changes"),
]


@pytest.mark.parametrize("case,edit,challenge,expected", CACHE_CASES,
                         ids=[c[0] for c in CACHE_CASES])
def test_cache_sees_same_size_edits_of_text_files(private_release, tmp_path, case, edit,
                                                  challenge, expected):
    before = _windows(challenge, private_release, tmp_path)
    who, _ = edit(private_release)
    after = _windows(challenge, private_release, tmp_path)
    assert not after.info["cached"] and after.info["key"] != before.info["key"]
    diff = after.y.astype(float) - before.y.astype(float)
    if challenge == 1:
        mine = (after.metadata["file"] == who).to_numpy()
        assert np.isclose(diff, 0.1, atol=1e-5).sum() == 1 and np.isclose(diff[~mine], 0).all()
    else:
        mine = (after.metadata["subject"] == who).to_numpy()
        assert mine.any() and not np.isclose(diff[mine], 0).any()
        assert np.isclose(diff[~mine], 0).all()
    # and unchanged inputs still load from the cache
    assert _windows(challenge, private_release, tmp_path).info["cached"]
