"""Data as it comes (issue 33): a release's files corrupted the way a user's are, and a cache
folder the operating system refuses; each is named, with the true reason and a way out."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from data_fixtures import private_release

from data_prep import bids, challenge1, challenge2, store

USES_FIXTURES = (private_release,)  # imported for pytest
ROOT = Path(__file__).resolve().parents[2]


def _rows(root: Path) -> tuple[list[str], list[list[str]]]:
    lines = (root / "participants.tsv").read_text().splitlines()
    return lines[0].split("\t"), [ln.split("\t") for ln in lines[1:]]


def _write_rows(root: Path, header: list[str], rows: list[list[str]]) -> None:
    text = "\n".join("\t".join(r) for r in [header, *rows]) + "\n"
    (root / "participants.tsv").write_text(text)


def test_a_subject_listed_twice_keeps_one_row_or_says_which_values_disagree(private_release,
                                                                            tmp_path):
    root = private_release
    header, rows = _rows(root)
    col = {c: k for k, c in enumerate(header)}
    known = [r for r in rows if r[col["externalizing"]] != "n/a"]
    same, clash = known[0], known[1]
    other = list(clash)
    other[col["externalizing"]], other[col["age"]] = "9.99", "11.0"
    _write_rows(root, header, [*rows, list(same), other])      # the file as a user edits it
    sid_same, sid_clash = same[0][4:], clash[0][4:]

    c1 = challenge1.make_windows(root, cache_dir=tmp_path, progress=False)
    md = c1.metadata.drop_duplicates("subject").set_index("subject")
    assert md.loc[sid_same, "externalizing"] == float(same[col["externalizing"]])
    assert md.loc[sid_same, "age"] == float(same[col["age"]])
    assert np.isnan(md.loc[sid_clash, "age"]) and np.isnan(md.loc[sid_clash, "externalizing"])
    notes = c1.problems.set_index("code")["message"]
    assert sid_same in notes["duplicate_participant"] and "one row kept" in \
        notes["duplicate_participant"]
    clash_note = notes["conflicting_participant"]
    for text in (sid_clash, f"externalizing {clash[col['externalizing']]} vs 9.99",
                 f"age {clash[col['age']]} vs 11.0", "n/a"):
        assert text in clash_note, clash_note
    assert len(c1) > 0 and {sid_same, sid_clash} <= set(md.index)   # C1 keeps both subjects

    c2 = challenge2.make_windows(root, cache_dir=tmp_path, progress=False)
    kept = c2.metadata.drop_duplicates("subject").set_index("subject")
    assert kept.loc[sid_same, "target"] == pytest.approx(float(same[col["externalizing"]]))
    assert sid_clash not in kept.index
    probs = c2.problems
    skipped = probs[(probs["subject"] == sid_clash) & (probs["level"] == "skipped")]
    assert set(skipped["code"]) == {"conflicting_target"} and len(skipped) > 0
    assert f"({clash[col['externalizing']]} vs 9.99)" in skipped["message"].iloc[0]
    assert not c2.problems["message"].str.contains(f"{sid_clash}'s externalizing is missing").any()
    assert not c2.problems["message"].str.contains(f"{sid_same}'s externalizing").any()
    # the release note about the clash leaves the target out (each recording says it) but
    # keeps the disagreeing age
    note = c2.problems.loc[c2.problems["code"] == "conflicting_participant", "message"].iloc[0]
    assert "age" in note and "externalizing" not in note


@pytest.mark.parametrize("cell", ["NaN", "n/a"])
def test_an_onset_written_nan_is_missing_like_na_and_reported(private_release, tmp_path, cell):
    rec = bids.find_recordings(private_release, "contrastChangeDetection")[0]
    lines = rec.events_path.read_text().splitlines()
    row = next(i for i, ln in enumerate(lines) if "_buttonPress" in ln)
    cells = lines[row].split("\t")
    cells[0] = cell
    lines[row] = "\t".join(cells)
    rec.events_path.write_text("\n".join(lines) + "\n")
    w = challenge1.make_windows([rec, *bids.find_recordings(private_release,
                                                            "contrastChangeDetection")[1:2]],
                                cache_dir=tmp_path, progress=False)
    hit = w.problems[w.problems["file"] == rec.name]
    assert list(hit["code"]) == ["missing_onset"] and list(hit["level"]) == ["skipped"]
    assert f"line {row + 1} ({cell!r})" in hit["message"].iloc[0]
    assert "no problems found" not in w.report() and rec.name not in set(w.metadata["file"])


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and exc.__cause__ is None and exc.__suppress_context__
    return text


def test_a_cache_folder_the_os_refuses_is_named_in_one_line(private_release, tmp_path,
                                                            monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    given = blocker / "cache"                 # a file where a folder is expected: ENOTDIR
    with pytest.raises(store.CacheUnwritable) as err:
        challenge1.make_windows(private_release, cache_dir=given, progress=False)
    text = _one_line(err.value)
    assert str(given) in text and "cache_dir=" in text and "cache=False" in text
    assert isinstance(err.value, OSError) and err.value.errno is not None
    monkeypatch.setenv("HYBRIDNB_CACHE_DIR", str(given))   # the default folder, from the variable
    with pytest.raises(store.CacheUnwritable) as err:
        challenge2.make_windows(private_release, progress=False)
    assert "HYBRIDNB_CACHE_DIR" in _one_line(err.value) and str(given) in str(err.value)
    w = challenge1.make_windows(private_release, cache_dir=given, cache=False, progress=False)
    assert len(w) > 0 and w.info["folder"] is None and blocker.read_text() == "not a folder"


@pytest.mark.skipif(os.name == "nt" or (hasattr(os, "geteuid") and os.geteuid() == 0),
                    reason="permissions do not stop root (or need POSIX modes)")
def test_a_read_only_release_and_home_name_the_folder(private_release, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.delenv("HYBRIDNB_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(home))
    folders = [private_release.parent, home]
    for f in folders:
        f.chmod(0o555)
    try:
        with pytest.raises(store.CacheUnwritable) as err:
            challenge1.make_windows(private_release, progress=False)
    finally:
        for f in folders:
            f.chmod(0o755)
    text = _one_line(err.value)
    assert str(home / ".cache" / "hybridnb") in text and "HYBRIDNB_CACHE_DIR" in text


@pytest.mark.skipif(os.name == "nt", reason="RLIMIT_FSIZE is POSIX")
def test_a_full_disk_mid_build_names_the_folder_and_cache_false_writes_nothing(private_release,
                                                                              tmp_path):
    """The file-size limit makes the operating system refuse writes past 1 MB (EFBIG) in a
    child, as a full disk refuses them (ENOSPC); with the limit at 0, cache=False still works."""
    cache = tmp_path / "windows"
    script = textwrap.dedent(f"""
        import resource, signal
        from data_prep import challenge1, store
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)      # an error, not a killed process
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
        w = challenge1.make_windows({str(private_release)!r}, cache_dir={str(cache)!r},
                                    cache=False, progress=False)
        print("in memory", len(w), w.info["folder"])
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))
        try:
            challenge1.make_windows({str(private_release)!r}, cache_dir={str(cache)!r},
                                    progress=False)
        except store.CacheUnwritable as exc:
            print("refused", exc)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("in memory ") and lines[0].endswith(" None")
    assert int(lines[0].split()[2]) > 0
    refused = next(ln for ln in lines if ln.startswith("refused "))
    assert f"cannot write the window cache in {cache}:" in refused
    assert "File too large" in refused and "cache_dir=" in refused
    assert list(cache.iterdir()) == []          # no half-written store left behind
