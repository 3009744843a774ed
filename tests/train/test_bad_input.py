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
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch
from data_fixtures import CLEAN, clean_release, private_release
from torch import nn

from data_prep import bids, challenge1, challenge2, synthetic
from data_prep.bdf import read_header
from hybridnb.train import checkpoint
from hybridnb.train.trainer import Trainer

USES_FIXTURES = (clean_release, private_release)  # imported for pytest


def _digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.md5(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _age(folder: Path) -> None:
    """Date every file back to 1970, so a file written again shows in its mtime."""
    for p in folder.rglob("*"):
        if p.is_file():
            os.utime(p, ns=(0, 0))


def _written_again(folder: Path) -> bool:
    return any(p.stat().st_mtime_ns > 0 for p in folder.glob("sub-*/eeg/*.bdf"))


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
    ("own_release_without_latents_is_rewritten", "nolatents:2", dict(n_subjects=2),
     {"subjects": 2, "rewritten": True, "says": "before the planted latents"}),
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
    else:   # "own:<n>" / "partial:<n>" / "nolatents:<n>": written by make_hbn_like, + a user file
        synthetic.make_hbn_like(root, n_subjects=int(what.split(":")[1]), **SMALL)
        (ds / "derivatives").mkdir()
        (ds / "derivatives" / "my_notes.txt").write_text("mine")
        if what.startswith("nolatents"):  # as a release written by an older data_prep
            (ds / "code" / "hybridnb_latents.json").unlink()
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
    _age(ds)
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
    # written again, judged by the files' mtimes: a rewrite with the same parameters writes the
    # same bytes (only the marker's "seconds" may differ, and not always)
    assert _written_again(ds) == expected["rewritten"]
    if not expected["rewritten"]:
        assert new == old
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


# ==============================================================================================
# training
# ==============================================================================================
# Small runs on the CPU: 200 samples of 8 features, batches of 32 (the last one holds 8, so a
# mean over steps and a mean over samples differ), an MLP with one output.
torch.set_num_threads(1)
N, D, BATCH = 200, 8, 32
SECONDS = 30.0  # bad data returns from fit well within this, even on a 2-core CI machine


def _xy(n: int = N, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D, generator=g)
    return x, torch.sin(x @ torch.linspace(-1, 1, D))


def _mlp(outputs: int = 1) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, 16), nn.Tanh(), nn.Linear(16, outputs))


class _NanOutput(nn.Module):
    """A model whose output is NaN whatever the data (a broken custom layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, 1)

    def forward(self, x):
        return self.lin(x) * float("nan")


class _Renamed(nn.Sequential):
    """The same parameter names as _mlp(), another class."""


def _trainer(model=None, **kw) -> Trainer:
    kw = {"device": "cpu", "batch_size": BATCH, "epochs": 2, "lr": 1e-2, "seed": 0,
          "live": False, "verbose": False, **kw}
    return Trainer(model if model is not None else _mlp(), **kw)


def _kinds(tr: Trainer, kind: str) -> list:
    return [e for e in tr.events if e.kind == kind]


# --- bad data and arguments met during fit (items 1-5) ----------------------------------------
def _nan_y_every_10th(x, y):
    y[::10] = float("nan")


def _nan_x_every_10th(x, y):
    x[::10, 3] = float("nan")


def _inf_y_every_10th(x, y):
    y[::10] = float("inf")


def _nan_y_once(x, y):
    y[5] = float("nan")


FIT_CASES = [
    # (case id, change to the training data, Trainer kwargs, expected answer)
    ("nan_in_targets_every_batch", _nan_y_every_10th, {},
     {"raises": (ValueError, r"training data holds non-finite values.*epoch 0, step \d+.*"
                             r"y: NaN \d+ of 32 values.*Remove or impute"), "restores": 0}),
    ("nan_in_inputs_every_batch", _nan_x_every_10th, {},
     {"raises": (ValueError, r"non-finite values.*epoch 0, step \d+.*x: NaN \d+ of \d+ values"),
      "restores": 0}),
    ("inf_in_targets_every_batch", _inf_y_every_10th, {},
     {"raises": (ValueError, r"non-finite values.*y: Inf \d+ of 32 values"), "restores": 0}),
    ("nan_in_one_batch_is_skipped", _nan_y_once, {},
     {"events": {"nonfinite_batch": 2, "restore": 0, "nonfinite_loss": 0}, "lr_kept": True}),
    ("nan_from_the_model_bounded_restores", None, {"model": _NanOutput()},
     {"raises": (FloatingPointError, r"non-finite or spiking after 3 restores to step 0 "
                                     r"\(epoch 0\).*model output"), "restores": 3}),
    ("targets_n2_for_output_n1", lambda x, y: torch.stack([y, y], 1), {},
     {"raises": (ValueError, r"output has shape \(32, 1\) but the targets have shape \(32, 2\)"),
      "steps": 0}),
    ("targets_n_for_output_n2", None, {"model": _mlp(outputs=2)},
     {"raises": (ValueError, r"output has shape \(32, 2\) but the targets have shape \(32,\)"),
      "steps": 0}),
    ("float64_numpy_arrays", "float64", {},
     {"events": {"dtype": 1}, "finite_history": True}),
    ("monitor_that_does_not_exist", None, {"monitor": "val_acc", "early_stopping": 2},
     {"raises": (ValueError, r"monitor='val_acc' is not a validation metric.*'val_loss'.*"
                             r"'val_rmse'"), "steps": 7}),
    ("nan_in_validation_targets", "val_nan", {"early_stopping": 5},
     {"events": {"nonfinite_targets": 1}, "says": r"10 validation samples have non-finite "
                                                 r"targets", "finite_history": True,
      "best_pt": True}),
]


@pytest.mark.timeout(120)  # the old code looped forever on NaN data: fail, never hang
@pytest.mark.parametrize("case,change,kwargs,expected", FIT_CASES, ids=[c[0] for c in FIT_CASES])
def test_fit_with_bad_data(tmp_path, case, change, kwargs, expected):
    (x, y), val = _xy(), _xy(64, seed=1)
    if change == "float64":                      # numpy's default dtype, for train and val
        train = (x.double().numpy(), y.double().numpy())
        val = (val[0].double().numpy(), val[1].double().numpy())
    elif change == "val_nan":
        val[1][::7] = float("nan")                       # 10 of 64 validation targets
        train = (x, y)
    else:
        out = change(x, y) if callable(change) else None
        train = (x, out if out is not None else y)
    tr = _trainer(checkpoint_dir=tmp_path / "ck", **kwargs)
    started = time.perf_counter()
    if "raises" in expected:
        exc, pattern = expected["raises"]
        with pytest.raises(exc, match=pattern):
            tr.fit(train, val)
    else:
        tr.fit(train, val)
    assert time.perf_counter() - started < SECONDS        # returns, never hangs
    if "restores" in expected:                             # bounded, at the same place
        assert len(_kinds(tr, "restore")) == expected["restores"], [e.kind for e in tr.events]
    if "steps" in expected:                                # where it stopped
        assert len(tr.steps) == expected["steps"]
    for kind, count in expected.get("events", {}).items():
        assert len(_kinds(tr, kind)) == count, [str(e) for e in tr.events]
    if "says" in expected:
        assert any(re.search(expected["says"], e.message) for e in tr.events), tr.events
    if expected.get("lr_kept"):                            # bad data is not the model's fault
        assert tr.state.lr_scale == 1.0
        assert any("y: NaN 1 of 32 values" in e.message for e in _kinds(tr, "nonfinite_batch"))
    if expected.get("finite_history"):
        cols = ["train_loss", "val_loss", "val_rmse", "val_r2"]
        assert np.isfinite(tr.history[cols].to_numpy()).all(), tr.history[cols]
        assert np.isfinite(tr.evaluate(val)["rmse"])      # evaluate takes the same data
        assert tr.predict(val[0]).dtype == np.float32
    if expected.get("best_pt"):                            # best weights are still kept
        assert (tmp_path / "ck" / checkpoint.BEST).is_file()
        assert tr.state.best.value is not None


# --- the Trainer's arguments, checked when it is built (items 6, 8, 11) -----------------------
def _dead_pid() -> int:
    """The id of a process that has ended."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _lock(folder: Path) -> None:
    """Make ``folder`` unwritable, for root too (chattr +i); skip where that is impossible."""
    folder.chmod(0o555)
    probe = folder / ".probe"
    try:
        probe.write_bytes(b"")
    except OSError:
        return
    probe.unlink()
    if shutil.which("chattr") and subprocess.run(["chattr", "+i", str(folder)],
                                                 capture_output=True).returncode == 0:
        return
    pytest.skip("cannot make a folder read-only here (root without chattr)")


def _unlock(folder: Path) -> None:
    if shutil.which("chattr"):
        subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
    folder.chmod(0o755)


def _existing_file(tmp: Path) -> Path:
    path = tmp / "runs"
    path.write_text("my notes")
    return path


def _read_only(tmp: Path) -> Path:
    folder = tmp / "runs"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    _lock(folder)
    return folder


def _missing_under_read_only(tmp: Path) -> Path:
    _read_only(tmp)
    return tmp / "runs" / "c1"


def _stale_temp_files(tmp: Path) -> Path:
    folder = tmp / "runs"
    folder.mkdir()
    dead = _dead_pid()
    for name in (f".last.pt.tmp-{dead}", f".last.prev.pt.tmp-{dead}", f".best.pt.tmp-{dead}",
                 f".write-test-{dead}",                          # ours, from a killed process
                 f".last.pt.tmp-{os.getpid()}",                  # a live process is writing
                 ".notes.tmp-abc", f".my.tmp-{dead}", "last.pt.tmp-1", "keep.txt"):  # the user's
        (folder / name).write_text("x")
    return folder


BUILD_CASES = [
    # (case id, Trainer kwargs (a callable makes the folder), expected answer)
    ("device_nonsense", {"device": "nonsense"},
     {"raises": (ValueError, r"device='nonsense' is not a device: use 'auto', 'cpu'")}),
    ("device_cuda_without_cuda", {"device": "cuda"},
     {"raises": (ValueError, r"device='cuda': this machine has no usable CUDA GPU.*"
                             r"device='auto'"), "no_cuda": True}),
    ("device_cuda_index_without_cuda", {"device": "cuda:1"},
     {"raises": (ValueError, r"device='cuda:1': .*no usable CUDA GPU"), "no_cuda": True}),
    ("checkpoint_dir_is_a_file", {"checkpoint_dir": _existing_file},
     {"raises": (ValueError, r"checkpoint_dir='.*runs' is an existing file, not a folder")}),
    ("checkpoint_dir_read_only", {"checkpoint_dir": _read_only},
     {"raises": (ValueError, r"checkpoint_dir='.*runs' cannot be written.*Error")}),
    ("checkpoint_dir_under_a_read_only_folder", {"checkpoint_dir": _missing_under_read_only},
     {"raises": (ValueError, r"checkpoint_dir='.*runs/c1' cannot be written")}),
    ("stale_temp_files_of_dead_processes", {"checkpoint_dir": _stale_temp_files},
     {"left": [f".last.pt.tmp-{os.getpid()}", ".my.tmp-{dead}", ".notes.tmp-abc",
               "keep.txt", "last.pt.tmp-1"]}),
]


@pytest.mark.parametrize("case,kwargs,expected", BUILD_CASES, ids=[c[0] for c in BUILD_CASES])
def test_trainer_arguments_checked_when_built(tmp_path, case, kwargs, expected):
    if expected.get("no_cuda") and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    kwargs = {k: v(tmp_path) if callable(v) else v for k, v in kwargs.items()}
    where = kwargs.get("checkpoint_dir")
    top = tmp_path / "runs"
    before = _digest(top) if top.is_dir() else (top.read_text() if top.exists() else None)
    try:
        if "raises" in expected:
            exc, pattern = expected["raises"]
            with pytest.raises(exc, match=pattern):
                _trainer(**kwargs)
        else:
            _trainer(**kwargs)
    finally:
        if top.is_dir():
            _unlock(top)
    if "left" in expected:                     # only our temporary files of dead processes go
        dead = next(p.name.rsplit("-", 1)[1] for p in where.glob(".my.tmp-*"))
        assert sorted(p.name for p in where.iterdir()) == sorted(
            n.replace("{dead}", dead) for n in expected["left"])
    elif top.is_dir():                         # nothing the user had is touched
        assert _digest(top) == before
        assert not (top / "c1").exists()
    elif before is not None:
        assert top.read_text() == before


# --- checkpoints met during fit and resume (items 8, 9, 10) -----------------------------------
def _train_into(folder: Path) -> None:
    """A finished short run: last.pt, last.prev.pt and best.pt in ``folder``."""
    _trainer(checkpoint_dir=folder).fit(_xy(), _xy(64, seed=1))


def _garbage(folder: Path, best: bool) -> None:
    (folder / checkpoint.LAST).write_bytes(b"not a checkpoint " * 8)
    (folder / checkpoint.PREVIOUS).write_bytes(b"PK\x03\x04 cut short")
    if not best:
        (folder / checkpoint.BEST).unlink()


RESUME_CASES = [
    # (case id, change to a finished run's folder ("lock": an empty folder made read-only once
    #  the Trainer is built), model and resume= of the new run, expected answer)
    ("another_model_class_same_names", None, (lambda: _Renamed(*_mlp()), True),
     {"raises": (checkpoint.CheckpointError, r"last\.pt was saved from a model of class "
                                             r"Sequential, this model is a _Renamed")}),
    ("other_layer_sizes", None, (lambda: nn.Sequential(nn.Linear(D, 17), nn.Tanh(),
                                                       nn.Linear(17, 1)), True),
     {"raises": (checkpoint.CheckpointError, r"last\.pt does not fit this model: '0\.weight' "
                                             r"has shape \(16, 8\) there and \(17, 8\) here")}),
    ("garbage_last_and_prev_best_offered", lambda f: _garbage(f, best=True), (_mlp, True),
     {"raises": (checkpoint.CheckpointError, r"last\.pt is unreadable.*last\.prev\.pt is "
                                             r"unreadable.*best\.pt holds the best weights.*"
                                             r"weights_only=True.*or start afresh")}),
    ("garbage_last_and_prev_no_best", lambda f: _garbage(f, best=False), (_mlp, True),
     {"raises": (checkpoint.CheckpointError, r"last\.pt is unreadable.*last\.prev\.pt is "
                                             r"unreadable.*start afresh without resume")}),
    ("garbage_file_given_as_resume_path", lambda f: _garbage(f, best=True), (_mlp, "last.pt"),
     {"raises": (checkpoint.CheckpointError, r"last\.pt is unreadable.*last\.prev\.pt is "
                                             r"unreadable.*best\.pt holds the best weights")}),
]
# A folder that turns read-only during fit no longer ends the run (issue 21): the run continues
# from memory, said once: tests/train/test_misuse.py::test_a_folder_turning_read_only_mid_run_*


@pytest.mark.parametrize("case,change,new_run,expected", RESUME_CASES,
                         ids=[c[0] for c in RESUME_CASES])
def test_checkpoint_problems_during_fit(tmp_path, capfd, case, change, new_run, expected):
    folder = tmp_path / "runs"
    if change == "lock":                     # a fresh run: no earlier checkpoints to set aside
        folder.mkdir()
    else:
        _train_into(folder)
    (folder / "notes.txt").write_text("mine")
    if callable(change):
        change(folder)
    before = _digest(folder)
    make_model, resume = new_run
    resume = folder / resume if isinstance(resume, str) else resume
    tr = _trainer(make_model(), checkpoint_dir=folder, epochs=3)
    if change == "lock":
        _lock(folder)
    capfd.readouterr()
    exc, pattern = expected["raises"]
    try:
        with pytest.raises(exc, match=pattern) as info:
            tr.fit(_xy(), _xy(64, seed=1), resume=resume)
    finally:
        _unlock(folder)
    message = str(info.value)
    assert "weights_only=False" not in message and "weights_only set to False" not in message
    if exc is checkpoint.CheckpointError:      # names the file(s)
        assert str(folder) in message
    if "stderr" in expected:                   # the original error, and the failed save said
        assert re.search(expected["stderr"], capfd.readouterr().err)
        assert info.value.__context__ is None
        assert "_save_crash" not in "".join(traceback.format_tb(info.value.__traceback__))
    assert _digest(folder) == before           # nothing overwritten or lost


# --- the live view and the history give one number, one epoch convention (item 7) -------------
class _Handle:
    """Display handle of a notebook output: keeps what was shown last."""

    def __init__(self, bundle: dict) -> None:
        self.last = bundle

    def update(self, bundle: dict, **_) -> None:
        self.last = bundle


def _text_view(monkeypatch) -> dict:
    return {"live": "text"}


def _html_view(monkeypatch) -> dict:
    import hybridnb.env
    import hybridnb.live.html as html

    shown = []
    monkeypatch.setattr(hybridnb.env, "frontend", lambda: "vscode")
    monkeypatch.setattr(html, "show", lambda b: shown.append(_Handle(b)) or shown[-1])
    return {"live": "html", "_shown": shown}


def _epoch_lines(out: str) -> list[tuple[int, str]]:
    """(epoch, train loss) of each epoch line the text view printed."""
    found = re.findall(r"^epoch (\d+)/\d+ · step \d+/\d+ · train_loss (\S+)", out, re.M)
    return [(int(e), loss) for e, loss in found]


LIVE_CASES = [
    # (case id, renderer, Trainer kwargs, expected: what must equal the history)
    ("text_line_per_epoch", _text_view, {}, {"epoch_lines": True, "summary": True}),
    ("text_with_grad_accum", _text_view, {"grad_accum": 3}, {"epoch_lines": True,
                                                             "summary": True}),
    ("html_snapshot", _html_view, {}, {"figure": True, "summary": True}),
]


@pytest.mark.parametrize("case,renderer,kwargs,expected", LIVE_CASES,
                         ids=[c[0] for c in LIVE_CASES])
def test_live_view_shows_the_history_numbers(monkeypatch, capsys, case, renderer, kwargs,
                                             expected):
    from hybridnb.live.summary import number

    view = renderer(monkeypatch)
    shown = view.pop("_shown", None)
    val = _xy(64, seed=1)
    val[1][:] = torch.linspace(1.0, -1.0, 64)           # best epoch is not the last one
    tr = _trainer(epochs=3, lr=5e-2, **view, **kwargs)
    capsys.readouterr()
    tr.fit(_xy(), val)
    out = capsys.readouterr().out
    hist = tr.history
    sample_mean = [number(v) for v in hist["train_loss"]]
    if expected.get("epoch_lines"):
        assert _epoch_lines(out) == list(zip(hist["epoch"].tolist(), sample_mean, strict=True))
    best = hist.loc[hist["val_loss"].idxmin()]
    said = (f"Best val_loss {number(best['val_loss'])} at epoch {int(best['epoch'])}, "
            f"step {int(best['step'])} (epochs count from 0")
    if expected.get("figure"):
        summary, figure = shown[0].last, shown[1].last
        trace = next(t for t in figure["application/vnd.plotly.v1+json"]["data"]
                     if t["name"] == "train loss (epoch)")
        assert trace["y"] == pytest.approx(hist["train_loss"].tolist(), rel=1e-12)
        assert trace["x"] == hist["step"].tolist()
        out = summary["text/plain"]
    if expected.get("summary"):
        assert said in out, out


class _NoMeta(torch.Tensor):
    """A tensor subclass that refuses to be made on the meta device (an exotic user input)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if str(kwargs.get("device")) == "meta":
            raise RuntimeError("this input cannot live on the meta device")
        return super().__torch_function__(func, types, args, kwargs)


def test_an_input_that_cannot_go_to_meta_is_left_to_the_first_step():
    """The output check before fit is best effort: an input it cannot copy to the meta device
    must not stop a fit that would train."""
    from hybridnb.train.losses import make_loss
    from hybridnb.train.preflight import check_outputs

    x = torch.randn(8).as_subclass(_NoMeta)
    with pytest.raises(RuntimeError, match="meta"):
        torch.empty_like(x, device="meta")
    assert check_outputs(nn.Linear(8, 1), make_loss("mse"), (x, torch.tensor(1.0)),
                         torch.float32, 4) is None
