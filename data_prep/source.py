"""Where the data come from: one setting, ``DATA``, turned into a release's BIDS root.

``DATA`` is one of

* ``"synthetic"`` (the default): the HBN-like synthetic release, written on first use under
  ``<cache>/synthetic/<kind>/`` and reused afterwards; offline.
* a folder on disk: a release's BIDS root (the folder holding ``participants.tsv`` and the
  ``sub-*`` folders, e.g. an unpacked zip from https://sccn.ucsd.edu/download/eeg2025/), or an
  eegdash cache folder holding exactly one release (``.../EEG2025r5mini``).
* a release name, ``"R1"`` ... ``"R11"`` with ``"-mini"`` (20 subjects, 2.8–3.8 GB) or
  ``"-full"`` (135–533 subjects, 18–46 GB), e.g. ``"R5-mini"``: eegdash downloads the tasks asked
  for into ``<cache>/eegdash/EEG2025r5mini/`` with a progress bar; an interrupted download
  resumes, and a finished one is reused without the network. With no network a download fails
  after one request to eegdash's server (``REACH_TIMEOUT`` at most) with one line,
  :class:`ReleaseUnreachable`, naming the release's zip and the folder option.

:func:`resolve` is the one call the notebooks make. The windows are the same whichever way a
release arrives: the recipes read the same BIDS root. ``<cache>`` is ``$HYBRIDNB_CACHE_DIR``,
else ``$XDG_CACHE_HOME/hybridnb``, else ``~/.cache/hybridnb`` (hybridnb's own cache folder).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import bids, environment, synthetic
from .planted import PLANTED_FOLDS

__all__ = ["CHALLENGE_TASKS", "RELEASES", "SYNTHETIC", "CACHE_ENV", "DATA_ENV", "Source",
           "ReleaseUnreachable", "parse", "resolve", "default_cache", "release_size",
           "estimated_bytes", "eegdash_folder"]

CACHE_ENV = environment.CACHE_ENV  # "HYBRIDNB_CACHE_DIR", hybridnb's cache folder
DATA_ENV = "HYBRIDNB_DATA"         # what a notebook's DATA defaults to (``make demo`` on real data)
RELEASES = tuple(f"R{n}" for n in range(1, 12))
CHALLENGE_TASKS = ("contrastChangeDetection", "RestingState")
RUNS_PER_SUBJECT = {"contrastChangeDetection": 3, "surroundSupp": 2}   # 1 for the other tasks
SYNTHETIC = {   # the synthetic releases the notebooks use, by kind
    "default": {"n_subjects": 20, "size": "realistic", "seed": 0},
    "small": {"n_subjects": 10, "size": "small", "seed": 0},
    "faults": {"n_subjects": 12, "size": "small", "seed": 1, "faults": tuple(synthetic.FAULTS)},
    # the README's tour (examples/tour.py): 20 subjects, the one task it trains on, seconds to write
    "tour": {"n_subjects": 20, "size": "small", "seed": 0, "tasks": ("contrastChangeDetection",)},
    # scores over subject folds (issue 29): many subjects, short recordings (36 CCD trials and one
    # minute of rest each), Challenge 2 learnable from resting crops (planted.PLANTED_FOLDS)
    "folds": {"n_subjects": 150, "mini": False, "size": "small", "seed": 0,
              "planted": PLANTED_FOLDS},
}
DOWNLOADED = Path("code") / "hybridnb_download.json"   # written when a download has finished
EEGDASH_API_ENV = "EEGDASH_API_URL"            # eegdash's own variable for its server
EEGDASH_API = "https://data.eegdash.org"       # eegdash's default (http_api_client.DEFAULT_API_URL)
REACH_TIMEOUT = 3.0   # seconds for the one request that checks the server before a download
ZIPS = "https://sccn.ucsd.edu/download/eeg2025/"
FORMS = ('"synthetic", a release folder on disk (the BIDS root holding participants.tsv and '
         'the sub-* folders), or a release to download: "R1".."R11" followed by "-mini" or '
         '"-full", e.g. "R5-mini"')


class ReleaseUnreachable(ConnectionError):
    """A release could not be downloaded: the message is one line saying what to do (raised
    without the chain of the network library's exceptions, which repeat long URLs)."""


@dataclass(frozen=True)
class Source:
    """What a ``DATA`` value names (nothing read or written yet)."""

    kind: str                   # "synthetic" | "folder" | "eegdash"
    value: str                  # the DATA value as given
    path: Path | None = None    # kind "folder"
    release: str | None = None  # kind "eegdash": "R1".."R11"
    mini: bool = True

    @property
    def name(self) -> str:
        if self.kind == "eegdash":
            return f"{self.release}-{'mini' if self.mini else 'full'}"
        return self.value


def default_cache(environ: dict[str, str] | None = None) -> Path:
    """``$HYBRIDNB_CACHE_DIR``, else ``$XDG_CACHE_HOME/hybridnb``, else ``~/.cache/hybridnb``
    (the same folder as ``hybridnb.env.cache_dir``; data_prep does not import hybridnb)."""
    return environment.cache_folder(environ)


def parse(data: str | os.PathLike | None) -> Source:
    """Read a ``DATA`` value; ValueError naming the value and the accepted forms."""
    if data is None or (isinstance(data, str) and data.strip().lower() in ("", "synthetic")):
        return Source("synthetic", "synthetic")
    if isinstance(data, os.PathLike):
        return Source("folder", os.fspath(data), path=Path(data).expanduser())
    if not isinstance(data, str):
        raise TypeError(f"DATA={data!r}: expected a string or a path, got "
                        f"{type(data).__name__}; use {FORMS}")
    text = data.strip()
    m = re.fullmatch(r"[rR](\d{1,2})(?:[-_ ]?(mini|full))?", text, flags=re.IGNORECASE)
    if m:
        release = f"R{int(m.group(1))}"
        if release not in RELEASES:
            raise ValueError(f"DATA={data!r}: the challenge's releases are R1..R11; use "
                             f"e.g. \"R5-mini\"")
        if m.group(2) is None:
            raise ValueError(
                f"DATA={data!r}: say which copy of {release}: \"{release}-mini\" (20 subjects, "
                f"{_size_text(release, True)}) or \"{release}-full\" (all subjects, "
                f"{_size_text(release, False)})")
        return Source("eegdash", text, release=release, mini=m.group(2).lower() == "mini")
    if re.fullmatch(r"[A-Za-z]+\d*([-_][A-Za-z]+)?", text) and not Path(text).expanduser().exists():
        raise ValueError(f"DATA={data!r} is neither a folder nor a release name; use {FORMS}")
    return Source("folder", text, path=Path(text).expanduser())


def resolve(data: str | os.PathLike | None = "synthetic", *, cache: str | os.PathLike | None = None,
            tasks: tuple[str, ...] | list[str] | str = CHALLENGE_TASKS,
            synthetic_kind: str = "default", download: bool = True,
            progress: bool = True) -> Path:
    """The BIDS root ``data`` names, ready to window (see the module docstring).

    ``cache``: where downloads and the synthetic release go (default :func:`default_cache`).
    ``tasks``: the tasks the caller will window (a download fetches only these; a folder must
    hold at least one of their recordings). ``synthetic_kind``: which synthetic release
    (:data:`SYNTHETIC`: ``"default"``, ``"small"``, ``"faults"``, ``"tour"``, ``"folds"``). ``download=False`` refuses
    the network: a release must already be in the cache. Errors name the value and what to do.
    """
    source = parse(data)
    tasks = (tasks,) if isinstance(tasks, str) else tuple(tasks)
    cache = Path(cache).expanduser() if cache is not None else default_cache()
    if source.kind == "synthetic":
        if synthetic_kind not in SYNTHETIC:
            raise ValueError(f"synthetic_kind={synthetic_kind!r}: use one of {list(SYNTHETIC)}")
        return synthetic.make_hbn_like(cache / "synthetic" / synthetic_kind,
                                       **SYNTHETIC[synthetic_kind])
    if source.kind == "folder":
        return _folder(source, tasks)
    return _eegdash(source, cache, tasks, download, progress)


# ---------------------------------------------------------------- a folder on disk

def _folder(source: Source, tasks: tuple[str, ...]) -> Path:
    path = source.path
    if not path.exists():
        raise FileNotFoundError(f"DATA={source.value!r}: {path.resolve()} does not exist; give "
                                f"the folder of a release on disk, or use {FORMS}")
    if not path.is_dir():
        raise NotADirectoryError(f"DATA={source.value!r}: {path} is a file; give the release's "
                                 f"folder (unpack a zip first)")
    root = path
    if not _is_bids_root(root):   # an eegdash cache folder holding one release?
        inner = [p for p in sorted(root.iterdir()) if p.is_dir() and _is_bids_root(p)]
        if len(inner) != 1:
            found = f"; it holds {len(inner)} releases: {[p.name for p in inner]}" if inner else ""
            raise FileNotFoundError(
                f"DATA={source.value!r}: {path} is not a release's BIDS root (no "
                f"participants.tsv or dataset_description.json next to sub-* folders){found}; "
                f"give the folder that holds participants.tsv and the sub-* folders")
        root = inner[0]
    found = bids.find_recordings(root, tasks=list(tasks))
    if not found:
        raise FileNotFoundError(f"DATA={source.value!r}: no EEG recording of the task(s) "
                                f"{list(tasks)} under {root}; give a challenge release "
                                f"(BDF files in sub-*/eeg/)")
    return root


def _is_bids_root(path: Path) -> bool:
    has_meta = (path / "participants.tsv").exists() or (path / "dataset_description.json").exists()
    return has_meta and any(path.glob("sub-*"))


# ---------------------------------------------------------------- a release through eegdash

def eegdash_folder(cache: str | os.PathLike, release: str, mini: bool) -> Path:
    """Where eegdash (>= 0.5) keeps a release: ``<cache>/eegdash/EEG2025r5mini`` and the like."""
    return Path(cache) / "eegdash" / (f"EEG2025r{release[1:]}" + ("mini" if mini else ""))


def release_size(release: str, mini: bool) -> tuple[int, int, int] | None:
    """(subjects, recordings, bytes) of a whole release (all tasks), from the summary table
    eegdash ships (``eegdash/dataset/dataset_summary.csv``); None when unknown there."""
    try:
        import importlib.resources

        import pandas as pd

        table = importlib.resources.files("eegdash.dataset") / "dataset_summary.csv"
        with table.open() as fh:
            df = pd.read_csv(fh, usecols=["dataset", "n_subjects", "n_records", "size_bytes"])
    except Exception:  # noqa: BLE001 - no summary: the size is unknown
        return None
    row = df[df["dataset"] == f"EEG2025r{release[1:]}" + ("mini" if mini else "")]
    if row.empty:
        return None
    r = row.iloc[0]
    size = int(r["size_bytes"]) if r["size_bytes"] == r["size_bytes"] else 0
    return int(r["n_subjects"]), int(r["n_records"]), size


def estimated_bytes(release: str, mini: bool, tasks) -> int | None:
    """About how many bytes the recordings of ``tasks`` take in a release: its size times their
    share of a subject's recordings (an estimate: recordings differ in length)."""
    size = release_size(release, mini)
    if not size or not size[2]:
        return None
    per_subject = size[1] / size[0]          # ~10-12 recordings per subject
    share = sum(RUNS_PER_SUBJECT.get(t, 1) for t in tasks) / per_subject
    return int(size[2] * min(share, 1.0))


def _size_text(release: str, mini: bool) -> str:
    size = release_size(release, mini)
    if size and size[2]:
        return f"{size[2] / 1e9:.1f} GB for all tasks"
    return "about 3-4 GB for all tasks" if mini else "18-46 GB for all tasks"


def _eegdash(source: Source, cache: Path, tasks: tuple[str, ...], download: bool,
             progress: bool) -> Path:
    folder = eegdash_folder(cache, source.release, source.mini)
    done = _downloaded_tasks(folder)
    placed = folder.is_dir() and not (folder / DOWNLOADED).exists() and _is_bids_root(folder)
    missing = [] if placed else [t for t in tasks if t not in done]
    if missing:
        if not download:
            raise FileNotFoundError(
                f"DATA={source.value!r}: {folder} does not hold the task(s) {missing} yet and "
                f"download=False; run once with download=True (needs the internet), or set "
                f"DATA to a folder that holds the release")
        _download(source, cache, folder, missing, progress)
    n = _check_offline(source, cache, tasks)
    if progress:
        print(f"{source.name}: {n} recordings of {', '.join(tasks)} in {folder}")
    return folder


def _downloaded_tasks(folder: Path) -> set[str]:
    try:
        return set(json.loads((folder / DOWNLOADED).read_text()).get("tasks", []))
    except (OSError, ValueError):
        return set()


def _check_offline(source: Source, cache: Path, tasks: tuple[str, ...]) -> int:
    """eegdash's own offline reading of the release (its local-BIDS mode, no network): the
    number of recordings of ``tasks`` it finds."""
    try:
        ds = bids.load_eegdash(cache / "eegdash", source.release, mini=source.mini,
                               task=list(tasks), download=False)
    except (ImportError, FileNotFoundError):
        raise
    except Exception as exc:  # noqa: BLE001 - eegdash's errors share no base
        raise RuntimeError(f"DATA={source.value!r}: eegdash cannot read the release in "
                           f"{eegdash_folder(cache, source.release, source.mini)} offline "
                           f"({type(exc).__name__}: {exc}); delete that folder and download "
                           f"again") from exc
    n = len(ds.datasets)
    if n == 0:
        raise FileNotFoundError(f"DATA={source.value!r}: eegdash finds no recording of "
                                f"{list(tasks)} in {eegdash_folder(cache, source.release, source.mini)}; "
                                f"delete that folder and download again")
    return n


def _download(source: Source, cache: Path, folder: Path, tasks: list[str],
              progress: bool) -> None:
    """eegdash downloads ``tasks`` of the release into ``folder`` (files already there are
    kept), with one progress bar counting recordings; then the marker file is written."""
    root = cache / "eegdash"
    root.mkdir(parents=True, exist_ok=True)
    zip_name = f"{source.release}{'_mini' if source.mini else ''}_L100_bdf"
    advice = (f"download {zip_name} from {ZIPS} where there is internet, unpack it and set DATA "
              f"to its folder (DATA=\"/path/to/{zip_name}\"), or run again when online "
              f"(finished files are kept)")
    if importlib.util.find_spec("eegdash") is None:
        raise ImportError(f"DATA={source.value!r}: downloading {source.name} needs eegdash: "
                          f"pip install eegdash (the wheel's extra: hybridnb[challenge]); or "
                          f"{advice}")
    server = environment.current().get(EEGDASH_API_ENV) or EEGDASH_API
    why = _unreachable(server)
    if why:   # one request, no retries: eegdash's own client retries for ~30 s before failing
        raise ReleaseUnreachable(f"DATA={source.value!r}: cannot reach eegdash's server "
                                 f"{server} ({why}) to download {source.name}; {advice}")
    # the size table is eegdash's: importing it takes seconds, so after the network check
    need, free = estimated_bytes(source.release, source.mini, tasks), shutil.disk_usage(root).free
    if need and free < need * 1.2:
        raise OSError(f"DATA={source.value!r}: {free / 1e9:.1f} GB free in {root}, but the "
                      f"task(s) {tasks} of {source.name} take about {need / 1e9:.1f} GB "
                      f"(estimate); free space, or pass cache= (or set {CACHE_ENV}) to a "
                      f"folder on a bigger disk")
    try:
        ds = bids.load_eegdash(root, source.release, mini=source.mini, task=list(tasks),
                               download=True)
    except ImportError:
        raise
    except Exception as exc:  # noqa: BLE001 - eegdash's errors share no base
        raise ReleaseUnreachable(f"DATA={source.value!r}: eegdash could not list {source.name} "
                                 f"({_short(exc)}); {advice}") from None
    recordings = list(ds.datasets)
    errors: list[BaseException] = []

    def fetch():
        try:
            ds.download_all()
        except BaseException as exc:  # handed to the main thread
            errors.append(exc)

    worker = threading.Thread(target=fetch, name="eegdash-download", daemon=True)
    t0 = time.perf_counter()
    bar = _bar(len(recordings), f"{source.name} {'+'.join(tasks)}", progress)
    worker.start()
    while worker.is_alive():
        worker.join(0.5)
        have = sum(1 for r in recordings if Path(r.filecache).exists())
        bar.update(have - bar.n)
    bar.close()
    if errors:
        raise ReleaseUnreachable(f"DATA={source.value!r}: downloading {source.name} into "
                                 f"{folder} stopped ({_short(errors[0])}); {advice}") from None
    (folder / DOWNLOADED.parent).mkdir(parents=True, exist_ok=True)
    record = {"release": source.release, "mini": source.mini,
              "tasks": sorted(_downloaded_tasks(folder) | set(tasks)),
              "recordings": len(recordings), "seconds": round(time.perf_counter() - t0, 1)}
    (folder / DOWNLOADED).write_text(json.dumps(record, indent=1))


def _unreachable(url: str, timeout: float = REACH_TIMEOUT) -> str:
    """'' when ``url``'s server answers one HTTP request (any status), else why not, in a few
    words. Bounded by ``timeout`` in all: the request runs on a daemon thread, because a name
    lookup with no network can block longer than any socket timeout."""
    import urllib.error
    import urllib.request

    result: list[str] = []

    def ask() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout)
            result.append("")
        except urllib.error.HTTPError:   # it answered: reachable
            result.append("")
        except Exception as exc:  # noqa: BLE001 - any failure means unreachable
            reason = getattr(exc, "reason", None) or exc
            result.append(_short(reason if isinstance(reason, BaseException)
                                 else OSError(str(reason)), 100))

    thread = threading.Thread(target=ask, name="eegdash-reachable", daemon=True)
    thread.start()
    thread.join(timeout)
    return result[0] if result else f"no answer in {timeout:g} s"


def _short(exc: BaseException, limit: int = 160) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())   # one line
    return text if len(text) <= limit else text[:limit] + " ..."


def _bar(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="recording", disable=not enabled)
