"""data_prep.source: one DATA setting -> a release's BIDS root (synthetic, a folder, or a
release through eegdash), the same windows whichever way, and errors that name the value."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from data_fixtures import clean_release, no_network

from data_prep import challenge1, official, source

USES_FIXTURES = (clean_release, no_network)  # imported for pytest
CCD = ("contrastChangeDetection",)


@pytest.mark.parametrize("value,kind,release,mini", [
    ("synthetic", "synthetic", None, True), (None, "synthetic", None, True),
    ("R5-mini", "eegdash", "R5", True), ("r11_full", "eegdash", "R11", False),
    ("R1 mini", "eegdash", "R1", True), ("/data/EEG2025r5mini", "folder", None, True)])
def test_parse_names_each_form(value, kind, release, mini):
    s = source.parse(value)
    assert (s.kind, s.release, s.mini) == (kind, release, mini)


@pytest.mark.parametrize("value,words", [
    ("R5", ["'R5'", "R5-mini", "R5-full"]), ("R12", ["'R12'", "R1..R11"]),
    ("mini", ["'mini'", "R5-mini", "synthetic"])])
def test_parse_errors_name_the_value_and_the_fix(value, words):
    with pytest.raises(ValueError) as info:
        source.parse(value)
    for w in words:
        assert w in str(info.value)


def test_default_cache_is_hybridnbs_cache_folder(tmp_path):
    from hybridnb import env

    for environ in ({env.CACHE_DIR_ENV: str(tmp_path)}, {"XDG_CACHE_HOME": "/x"}, {}):
        assert source.default_cache(environ) == env.cache_dir(environ)
    assert source.CACHE_ENV == env.CACHE_DIR_ENV


def test_synthetic_goes_under_the_cache(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(source.synthetic, "make_hbn_like",
                        lambda root, **kw: calls.append((Path(root), kw)) or Path(root))
    source.resolve("synthetic", cache=tmp_path, synthetic_kind="small")
    assert calls == [(tmp_path / "synthetic" / "small", source.SYNTHETIC["small"])]
    with pytest.raises(ValueError, match="synthetic_kind='tiny'"):
        source.resolve("synthetic", cache=tmp_path, synthetic_kind="tiny")


def test_a_folder_resolves_to_its_bids_root(clean_release, tmp_path):
    assert source.resolve(str(clean_release), tasks=CCD) == clean_release
    # an eegdash cache folder holding one release: the release inside it
    assert source.resolve(clean_release.parent, tasks=CCD) == clean_release


@pytest.mark.parametrize("make,words", [
    (lambda p: p / "nowhere", ["does not exist"]),
    (lambda p: (p / "a.zip").write_text("x") and p / "a.zip", ["is a file", "unpack"]),
    (lambda p: p, ["not a release's BIDS root", "participants.tsv"])])
def test_bad_folders_are_named(tmp_path, make, words):
    path = make(tmp_path)
    with pytest.raises(OSError) as info:
        source.resolve(str(path), tasks=CCD)
    assert f"DATA={str(path)!r}" in str(info.value)
    for w in words:
        assert w in str(info.value)


def test_a_folder_without_the_tasks_is_refused(clean_release):
    with pytest.raises(FileNotFoundError, match="no EEG recording of the task"):
        source.resolve(str(clean_release), tasks=("symbolSearch",))


@pytest.mark.slow
@pytest.mark.skipif(not official.available(), reason="eegdash is not installed")
@pytest.mark.filterwarnings("ignore")
def test_release_name_reads_the_cache_offline_with_the_same_windows(clean_release, no_network,
                                                                    tmp_path):
    """"R5-mini" through eegdash's local-BIDS mode (no network) gives the same windows as the
    folder itself."""
    cache = tmp_path / "cache"
    folder = source.eegdash_folder(cache, "R5", True)
    shutil.copytree(clean_release, folder)
    root = source.resolve("R5-mini", cache=cache, tasks=CCD, download=False)
    assert root == folder and no_network == []
    via_name = challenge1.make_windows(root, cache_dir=tmp_path / "w1", progress=False)
    via_folder = challenge1.make_windows(str(clean_release), cache_dir=tmp_path / "w2",
                                         progress=False)
    assert len(via_name) == len(via_folder) > 50
    np.testing.assert_array_equal(np.asarray(via_name.X), np.asarray(via_folder.X))
    np.testing.assert_array_equal(via_name.y, via_folder.y)
    with pytest.raises(FileNotFoundError) as info:   # not in the cache, no network asked for
        source.resolve("R5-full", cache=cache, tasks=CCD, download=False)
    assert "DATA='R5-full'" in str(info.value) and "download=True" in str(info.value)


class FakeRecording:
    def __init__(self, path: Path):
        self.filecache = path


class FakeRelease:
    """What resolve() uses of eegdash's dataset: .datasets[i].filecache and download_all()."""

    def __init__(self, folder: Path, n: int, fail: bool = False):
        self.datasets = [FakeRecording(folder / f"sub-{i}" / "eeg" / f"sub-{i}_eeg.bdf")
                         for i in range(n)]
        self.fail = fail

    def download_all(self):
        for r in self.datasets[:2]:
            r.filecache.parent.mkdir(parents=True, exist_ok=True)
            r.filecache.write_bytes(b"x")
        if self.fail:
            raise OSError("connection reset by peer")
        for r in self.datasets[2:]:
            r.filecache.parent.mkdir(parents=True, exist_ok=True)
            r.filecache.write_bytes(b"x")


def test_download_counts_recordings_writes_its_marker_and_is_reused(monkeypatch, tmp_path, server_reached):
    folder = source.eegdash_folder(tmp_path, "R3", True)
    calls = []

    def load(cache_dir, release, mini=True, task=None, download=False, **kw):
        calls.append((Path(cache_dir), release, mini, tuple(task), download))
        return FakeRelease(folder, 5)

    monkeypatch.setattr(source.bids, "load_eegdash", load)
    assert source.resolve("R3-mini", cache=tmp_path, tasks=CCD, progress=False) == folder
    assert calls == [(tmp_path / "eegdash", "R3", True, CCD, True),
                     (tmp_path / "eegdash", "R3", True, CCD, False)]   # then the offline check
    marker = json.loads((folder / source.DOWNLOADED).read_text())
    assert marker["tasks"] == list(CCD) and marker["recordings"] == 5
    calls.clear()
    source.resolve("R3-mini", cache=tmp_path, tasks=CCD, progress=False)
    assert [c[-1] for c in calls] == [False]                            # no second download
    calls.clear()
    source.resolve("R3-mini", cache=tmp_path, tasks=("RestingState", *CCD), progress=False)
    assert [c[3] for c in calls if c[-1]] == [("RestingState",)]       # only what is missing
    assert json.loads((folder / source.DOWNLOADED).read_text())["tasks"] == [
        "RestingState", *CCD]


def test_a_failed_download_says_what_to_do_and_writes_no_marker(monkeypatch, tmp_path, server_reached):
    folder = source.eegdash_folder(tmp_path, "R2", False)
    monkeypatch.setattr(source.bids, "load_eegdash",
                        lambda *a, **k: FakeRelease(folder, 4, fail=True))
    monkeypatch.setattr(source, "estimated_bytes", lambda *a: None)
    with pytest.raises(ConnectionError) as info:
        source.resolve("R2-full", cache=tmp_path, tasks=CCD, progress=False)
    text = str(info.value)
    assert "DATA='R2-full'" in text and "connection reset by peer" in text
    assert "R2_L100_bdf" in text and source.ZIPS in text
    assert not (folder / source.DOWNLOADED).exists()


def test_download_refuses_a_disk_too_small(monkeypatch, tmp_path, server_reached):
    monkeypatch.setattr(source, "estimated_bytes", lambda *a: 10**15)   # a petabyte
    monkeypatch.setattr(source.bids, "load_eegdash",
                        lambda *a, **k: pytest.fail("nothing may be downloaded"))
    with pytest.raises(OSError) as info:
        source.resolve("R5-full", cache=tmp_path, tasks=CCD, progress=False)
    assert "DATA='R5-full'" in str(info.value) and "GB free" in str(info.value)
    assert source.CACHE_ENV in str(info.value)


def test_estimated_sizes_come_from_eegdashs_table():
    pytest.importorskip("eegdash")
    subjects, recordings, size = source.release_size("R5", mini=True)
    assert (subjects, recordings) == (20, 240) and 3e9 < size < 4e9
    full = source.release_size("R5", mini=False)
    assert full[:2] == (330, 3326) and 44e9 < full[2] < 50e9
    ccd = source.estimated_bytes("R5", True, CCD)
    assert 0.2 * size < ccd < 0.4 * size


# ---------------------------------------------------------------- offline: fails fast, one line


@pytest.fixture
def server_reached(monkeypatch):
    """The tests above fake eegdash's loader: let the check of its server pass without asking."""
    monkeypatch.setattr(source, "_unreachable", lambda url, timeout=None: "")


@pytest.fixture
def mute_server(monkeypatch):
    """eegdash's server replaced by a local socket that counts connections and answers none:
    ``hang=False`` closes each at once (a refusal), ``hang=True`` keeps it open in silence."""
    import socket
    import threading

    def start(hang: bool):
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        accepted, held = [], []

        def serve():
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                accepted.append(1)
                held.append(conn) if hang else conn.close()

        threading.Thread(target=serve, daemon=True).start()
        monkeypatch.setenv(source.EEGDASH_API_ENV,
                           f"http://127.0.0.1:{listener.getsockname()[1]}")
        monkeypatch.delenv("http_proxy", raising=False)
        monkeypatch.delenv("HTTP_PROXY", raising=False)
        return accepted

    return start


@pytest.mark.skipif(not official.available(), reason="eegdash is not installed")
@pytest.mark.parametrize("hang", [False, True], ids=["refused", "silent"])
def test_a_release_with_no_server_fails_at_once_in_one_line(mute_server, tmp_path, hang):
    import time

    accepted = mute_server(hang)
    t0 = time.perf_counter()
    with pytest.raises(source.ReleaseUnreachable) as info:
        source.resolve("R5-mini", cache=tmp_path, tasks=CCD, progress=False)
    elapsed = time.perf_counter() - t0
    assert accepted == [1]          # one request: eegdash's client (5 retries, ~30 s) never ran
    assert elapsed < source.REACH_TIMEOUT + 10, elapsed   # generous: the check's bound + load
    text = str(info.value)
    assert "\n" not in text and info.value.__cause__ is None and info.value.__context__ is None
    assert "DATA='R5-mini'" in text and "R5_mini_L100_bdf" in text and source.ZIPS in text
    assert "set DATA to its folder" in text
    folder = source.eegdash_folder(tmp_path, "R5", True)
    assert not (folder / source.DOWNLOADED).exists()


def test_the_server_checked_is_eegdashs_own_default():
    client = pytest.importorskip("eegdash.http_api_client")
    assert client.DEFAULT_API_URL == source.EEGDASH_API
