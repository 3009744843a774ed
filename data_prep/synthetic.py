"""Write an HBN-like BIDS release (the challenge's BDF layout) with planted, learnable structure.

``make_hbn_like(path)`` writes ``<path>/EEG2025r5mini`` laid out as eegdash 0.9.1 caches a
challenge release: ``dataset_description.json``, ``participants.tsv`` with the real 24 columns,
``task-*_eeg.json``, and per recording a 24-bit BDF (129 channels E1..E128 + Cz, 100 Hz), its
``_events.tsv`` (HBN columns, ``duration`` = ``n/a``), ``_eeg.json`` and ``_channels.tsv``.
What is planted and the best nRMSE it allows: :mod:`data_prep.planted` (``PLANTED``,
``ceilings()``). Broken recordings on request: ``faults=`` (see :data:`FAULTS`).
A summary (parameters, ceilings, where each fault sits) goes to ``code/hybridnb_synthetic.json``;
the planted latents per subject and per trial go to ``code/hybridnb_latents.json``
(:func:`latents`). The summary is also the marker by which ``make_hbn_like`` tells its own releases apart: it never
writes into a folder without it (a real eegdash release has the same name).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from . import environment
from . import synth_events as ev
from .planted import PLANTED, Planted, ceilings
from .synth_faults import FAULTS, assign_faults, write_recording
from .synth_signal import montage_positions

MARKER = Path("code") / "hybridnb_synthetic.json"   # tells make_hbn_like's own releases apart
LATENTS = Path("code") / "hybridnb_latents.json"    # what was planted, per subject and trial
OWN_KINDS = ("eeg.bdf", "events.tsv", "eeg.json", "channels.tsv")

__all__ = ["make_hbn_like", "latents", "summary", "PLANTED", "ceilings", "FAULTS", "R5_MINI", "TASKS", "SIZES"]

R5_MINI = ("NDARAH793FBF NDARAJ689BVN NDARAP785CTE NDARAU708TL8 NDARBE091BGD NDARBE103DHM "
           "NDARBF851NH6 NDARBH228RDW NDARBJ674TVU NDARBM433VER NDARCA740UC8 NDARCU633GCZ "
           "NDARCU736GZ1 NDARCU744XWL NDARDC843HHM NDARDH086ZKK NDARDL305BT8 NDARDU853XZ6 "
           "NDARDV245WJG NDAREC480KFA").split()
TASKS = ("RestingState", "DespicableMe", "DiaryOfAWimpyKid", "FunwithFractals", "ThePresent",
         "contrastChangeDetection", "seqLearning6target", "seqLearning8target", "surroundSupp",
         "symbolSearch")
PARTICIPANT_COLUMNS = [
    "participant_id", "release_number", "sex", "age", "ehq_total", "commercial_use",
    "full_pheno", "p_factor", "attention", "internalizing", "externalizing", "RestingState",
    "DespicableMe", "FunwithFractals", "ThePresent", "DiaryOfAWimpyKid",
    "contrastChangeDetection_1", "contrastChangeDetection_2", "contrastChangeDetection_3",
    "surroundSupp_1", "surroundSupp_2", "seqLearning6target", "seqLearning8target",
    "symbolSearch"]
# recording sizes: "small" for tests and quick notebooks, "realistic" ≈ the real lengths (§3.3)
SIZES = {
    "small": {"ccd_trials": 12, "rest_cycles": 1, "movie_s": 30.0, "surround_trials": 8,
              "symbol_pages": 3, "seq_blocks": 1},
    "realistic": {"ccd_trials": 36, "rest_cycles": 5, "movie_s": 170.0, "surround_trials": 60,
                  "symbol_pages": 20, "seq_blocks": 5},
}
DATASET_DESCRIPTION = {
    "Name": "Healthy Brain Network (HBN) EEG - Release {n} (BDF Converted) — SYNTHETIC "
            "stand-in written by data_prep.synthetic",
    "BIDSVersion": "1.9.0", "HEDVersion": "8.3.0", "DatasetType": "raw",
    "ConversionInfo": {"OriginalFormat": "EEGLAB SET", "ConvertedFormat": "BDF",
                       "ConversionTool": "data_prep.synthetic (edfio)"},
}


def _subject_ids(n: int, release: str, mini: bool, rng: np.random.Generator) -> list[str]:
    if mini:
        ids = list(R5_MINI) if release == "R5" else _eegdash_mini(release)
        if n > len(ids):
            raise ValueError(f"make_hbn_like: n_subjects={n} but a mini release has "
                             f"{len(ids)} subjects; use mini=False for more")
        return ids[:n]
    letters = np.array(list("ABCDEFGHJKLMNPRTUVWXYZ"))
    out: set[str] = set()
    while len(out) < n:
        out.add("NDAR" + "".join(rng.choice(letters, 2)) + "".join(map(str, rng.integers(0, 10, 3)))
                + "".join(rng.choice(np.array(list("ABCDEFGHJKLMNPRTUVWXYZ0123456789")), 3)))
    return sorted(out)


def _eegdash_mini(release: str) -> list[str]:
    try:
        from eegdash.const import SUBJECT_MINI_RELEASE_MAP
    except ImportError as exc:
        raise ValueError(f"make_hbn_like: the mini subject list of release={release!r} is only "
                         "known through eegdash (not installed); use release='R5' or "
                         "mini=False") from exc
    if release not in SUBJECT_MINI_RELEASE_MAP:
        raise ValueError(f"make_hbn_like: unknown release {release!r} (R1..R11)")
    return list(SUBJECT_MINI_RELEASE_MAP[release])


def _participants(ids: list[str], release: str, tasks: tuple[str, ...], rng, missing: int,
                  p: Planted) -> list[dict]:
    rows = []
    no_factors = set(rng.choice(len(ids), size=min(missing, len(ids)), replace=False).tolist())
    for i, sid in enumerate(ids):
        ext = rng.normal(p.externalizing_mean, p.externalizing_sd)
        z = rng.normal(size=3)
        factors = {"p_factor": 0.6 * ext + 0.8 * z[0], "attention": 0.3 * ext + 0.95 * z[1],
                   "internalizing": -0.2 * ext + 0.98 * z[2], "externalizing": ext}
        row = {"participant_id": f"sub-{sid}", "release_number": release,
               "sex": "M" if rng.random() < 0.6 else "F",
               "age": round(float(rng.uniform(5, 21)), 4),
               "ehq_total": round(float(rng.uniform(-100, 100)), 2),
               "commercial_use": "Yes" if rng.random() < 0.8 else "No",
               "full_pheno": "Yes" if rng.random() < 0.5 else "No"}
        for k, v in factors.items():
            row[k] = "n/a" if i in no_factors else round(float(v), 3)
        for col in PARTICIPANT_COLUMNS[11:]:
            task = col.rsplit("_", 1)[0] if col[-2] == "_" else col
            row[col] = "available" if task in tasks else "unavailable"
        rows.append(row)
    return rows


def _timelines(task: str, rng, size: dict, rt_median: float, p: Planted, fault: str | None
               ) -> list[tuple[str | None, object]]:
    """[(run, Timeline)] of one subject's recordings of ``task``."""
    if task == "contrastChangeDetection":
        return [(str(r), ev.ccd_run(rng, r, size["ccd_trials"], rt_median, p,
                                    presses=not (fault == "no_presses" and r == 1),
                                    late_end=(fault == "late_anchor" and r == 1)))
                for r in (1, 2, 3)]
    if task == "RestingState":
        return [(None, ev.resting_state(rng, size["rest_cycles"], p))]
    if task == "surroundSupp":
        return [(str(r), ev.surround_supp(rng, r, size["surround_trials"], p)) for r in (1, 2)]
    if task in ev.MOVIE_CODES:
        return [(None, ev.movie(rng, task, size["movie_s"]))]
    if task == "symbolSearch":
        return [(None, ev.symbol_search(rng, size["symbol_pages"]))]
    if task in ("seqLearning6target", "seqLearning8target"):
        return [(None, ev.seq_learning(rng, 6 if "6" in task else 8, size["seq_blocks"]))]
    raise ValueError(f"make_hbn_like: unknown task {task!r}; known: {', '.join(TASKS)}")


def _write_subject(root: Path, i: int, part: dict, tasks, size, seed, p: Planted,
                   faults: dict[tuple[int, str, str | None], str]) -> int:
    rng = np.random.default_rng([seed, i])
    rt_median = p.rt_median * float(np.exp(rng.normal(0, p.rt_subject_sd)))
    ext = part["externalizing"]
    ext = p.externalizing_mean if ext == "n/a" else float(ext)
    alpha_uv = p.alpha_uv * float(np.exp(p.alpha_beta * ext + rng.normal(0, p.alpha_subject_sd)))
    alpha_hz = float(rng.uniform(8.5, 11.5))
    sid = part["participant_id"][4:]
    n, trials = 0, []
    for task in tasks:
        first_run = "1" if task in ("contrastChangeDetection", "surroundSupp") else None
        fault = faults.get((i, task, first_run))
        for run, tl in _timelines(task, rng, size, rt_median, p, fault):
            rec_rng = np.random.default_rng([seed, i, TASKS.index(task), int(run or 0)])
            write_recording(root, sid, task, run, tl, rec_rng, alpha_uv, alpha_hz,
                            faults.get((i, task, run)), beta_uv=p.beta_uv)
            if task == "contrastChangeDetection":
                trials += [{"subject": sid, "run": run, **t} for t in _ccd_latents(tl, p)]
            n += 1
    latents = {"subject": sid, "rt_median": round(rt_median, 6),
               "log_alpha": round(float(np.log(alpha_uv / p.alpha_uv)), 6)}
    return n, latents, trials


def _ccd_latents(tl, p: Planted) -> list[dict]:
    """Per answered trial of a CCD timeline: the target onset (s) and the planted latencies
    after it (CPP peak, motor bump centre), read back from the bumps ``ccd_run`` planted (a
    CPP ramp, then the full-size motor bump of the same trial)."""
    out = []
    bumps = tl.bumps
    for j, b in enumerate(bumps):
        if b[0] != "ramp":
            continue
        target = b[1] - p.cpp_start
        motor = next(m for m in bumps[j + 1:] if m[0] == "gauss" and m[3] == p.motor_uv)
        out.append({"target_onset": round(target, 3), "cpp_peak": round(b[2] - target, 6),
                    "motor_latency": round(motor[1] - target, 6)})
    return out


def make_hbn_like(root: str | os.PathLike, n_subjects: int = 20, release: str = "R5",
                  mini: bool = True,
                  tasks: tuple[str, ...] = ("contrastChangeDetection", "RestingState"),
                  seed: int = 0, faults: tuple[str, ...] = (), size: str = "small",
                  missing_factors: int = 1, n_jobs: int | None = None,
                  planted: Planted = PLANTED, overwrite: bool = False,
                  progress: bool | None = None, **size_overrides) -> Path:
    """Write the synthetic release under ``root``; returns ``<root>/EEG2025r5mini`` (or ...r5).

    ``size`` "small" (default: 12 CCD trials a run, one resting cycle; seconds to write) or
    "realistic" (≈ real recording lengths); single lengths can be overridden, e.g.
    ``ccd_trials=24``. ``faults``: names from :data:`FAULTS`, each planted in one recording of a
    different subject, counted from the last subject. Deterministic for a given seed.
    ``n_jobs``: worker processes (default: up to one per core, one per 4 subjects); ``progress``: a bar
    (default for realistic sizes or more than 20 subjects).

    An existing folder: a release this function wrote (its marker ``code/hybridnb_synthetic.json``
    is there) is reused when the parameters match, else replaced (its old files removed, with a
    note; ``overwrite=True`` always replaces it); files added to it by hand are kept. Any other
    non-empty folder (a real eegdash release has the same name) raises FileExistsError and is
    never written into, with ``overwrite=True`` too.
    """
    if not (release.startswith("R") and release[1:].isdigit()):
        raise ValueError(f"make_hbn_like: release must look like 'R5', got {release!r}")
    if size not in SIZES:
        raise ValueError(f"make_hbn_like: size must be one of {list(SIZES)}, got {size!r}")
    unknown = set(size_overrides) - set(SIZES["small"])
    if unknown:
        raise TypeError(f"make_hbn_like: unknown arguments {sorted(unknown)}")
    bad = [t for t in tasks if t not in TASKS]
    if bad:
        raise ValueError(f"make_hbn_like: unknown task(s) {bad}; known: {', '.join(TASKS)}")
    sizes = {**SIZES[size], **size_overrides}
    ds_dir = Path(root) / (f"EEG2025r{release[1:]}" + ("mini" if mini else ""))
    params = {"n_subjects": n_subjects, "release": release, "mini": mini, "tasks": list(tasks),
              "seed": seed, "faults": list(faults), "sizes": sizes,
              "missing_factors": missing_factors, "planted": planted.to_dict()}
    t0 = time.perf_counter()
    rng = np.random.default_rng([seed, 10**6])
    ids = _subject_ids(n_subjects, release, mini, rng)       # argument errors before any change
    parts = _participants(ids, release, tuple(tasks), rng, missing_factors, planted)
    placed = assign_faults(faults, n_subjects, tasks)
    summary_path = ds_dir / MARKER
    if _claim(ds_dir, params, overwrite) == "reuse":
        return ds_dir
    summary_path.parent.mkdir(parents=True, exist_ok=True)
    summary_path.write_text(json.dumps({"params": params, "complete": False}, indent=1))
    _write_root_files(ds_dir, release, tasks, parts)
    montage_positions()  # warm the cache before forking workers
    jobs = _n_jobs(n_jobs, n_subjects)
    args = [(ds_dir, i, parts[i], tasks, sizes, seed, planted, placed) for i in range(n_subjects)]
    if jobs == 1:
        done = (_write_subject(*a) for a in args)
    else:
        from joblib import Parallel, delayed
        done = Parallel(n_jobs=jobs, return_as="generator")(
            delayed(_write_subject)(*a) for a in args)
    if progress if progress is not None else (size == "realistic" or n_subjects > 20):
        from tqdm.auto import tqdm
        done = tqdm(done, total=n_subjects, desc="writing subjects", unit="subj", leave=False)
    done = list(done)
    n_rec = sum(d[0] for d in done)
    _write_latents(ds_dir, [d[1] for d in done], [t for d in done for t in d[2]])
    summary = {"params": params, "complete": True, "ceilings": ceilings(planted),
               "n_recordings": n_rec,
               "faults": [{"fault": f, "subject": ids[i], "task": t, "run": r,
                           "what": FAULTS[f]} for (i, t, r), f in placed.items()],
               "seconds": round(time.perf_counter() - t0, 2)}
    summary_path.write_text(json.dumps(summary, indent=1))
    return ds_dir


def _write_latents(ds_dir: Path, subjects: list[dict], trials: list[dict]) -> None:
    """``code/hybridnb_latents.json``: what was planted per subject and per CCD trial, so the
    planted signal's best prediction (:func:`data_prep.planted.oracle_c1` / ``oracle_c2``) can
    be scored on any subset of subjects."""
    cols = lambda rows, keys: {k: [r[k] for r in rows] for k in keys}   # noqa: E731
    data = {"subjects": cols(subjects, ("subject", "rt_median", "log_alpha")),
            "trials": cols(trials, ("subject", "run", "target_onset", "cpp_peak",
                                    "motor_latency"))}
    (ds_dir / LATENTS).write_text(json.dumps(data))


def latents(ds_dir: str | os.PathLike):
    """(subjects, trials) DataFrames of the planted latents of a synthetic release.

    ``subjects``: subject, rt_median (s), log_alpha (log of the subject's alpha amplitude over
    ``PLANTED.alpha_uv``); ``trials``: subject, run, target_onset (s), cpp_peak and
    motor_latency (s after the target). FileNotFoundError for a release written before the
    latents were recorded (write it again with ``overwrite=True``) or a real one.
    """
    import pandas as pd

    path = Path(ds_dir) / LATENTS
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: {ds_dir} is not a synthetic release, or it was written before "
            "make_hbn_like recorded the planted latents; write it again with "
            "make_hbn_like(..., overwrite=True)")
    data = json.loads(path.read_text())
    return pd.DataFrame(data["subjects"]), pd.DataFrame(data["trials"])


def _claim(ds_dir: Path, params: dict, overwrite: bool) -> str:
    """"reuse" (own complete release, same parameters) or "write" (after clearing an own one).

    Raises FileExistsError for a non-empty folder without the marker: it may be a real eegdash
    release, and nothing is ever written into it (``overwrite=True`` included).
    """
    marker = ds_dir / MARKER
    if marker.is_file():
        try:
            old = json.loads(marker.read_text())
        except ValueError:
            old = {}
        complete = old.get("complete", "n_recordings" in old)   # older summaries: no flag
        latents = (ds_dir / LATENTS).is_file()   # releases written before the latents: stale
        if not overwrite and complete and latents and old.get("params") == params:
            return "reuse"
        if not overwrite:
            why = ("only partly" if not complete else "with other parameters"
                   if old.get("params") != params else "before the planted latents were kept")
            print(f"data_prep: replacing the synthetic release {ds_dir} (it was written {why})",
                  file=sys.stderr)
        _remove_own_files(ds_dir)
        return "write"
    if ds_dir.exists() and (not ds_dir.is_dir() or any(ds_dir.iterdir())):
        raise FileExistsError(
            f"make_hbn_like: {ds_dir} exists and was not written by data_prep.synthetic."
            f"make_hbn_like (no {MARKER.as_posix()} in it); it may be a real eegdash release, so "
            "nothing is written into it. Pass another root (e.g. make_hbn_like('data/synthetic'))"
            " or move that folder away"
            + ("; overwrite=True only replaces releases make_hbn_like wrote itself"
               if overwrite else ""))
    return "write"


def _remove_own_files(ds_dir: Path) -> None:
    """Delete the files make_hbn_like writes (by their names), keeping anything else there."""
    names = ["dataset_description.json", "participants.tsv", "README", "task-*_eeg.json",
             MARKER.as_posix(), LATENTS.as_posix(), *(f"sub-*/eeg/sub-*_task-*_{kind}" for kind in OWN_KINDS)]
    for pattern in names:
        for path in ds_dir.glob(pattern):
            if path.is_file():
                path.unlink()
    for folder in [*ds_dir.glob("sub-*/eeg"), *ds_dir.glob("sub-*"), ds_dir / "code"]:
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def _n_jobs(n_jobs: int | None, n_subjects: int) -> int:
    if n_jobs is not None:
        return max(1, n_jobs)
    cores = environment.usable_cores()
    return max(1, min(cores, n_subjects // 4))


def summary(ds_dir: str | os.PathLike) -> dict:
    """The generator's summary of a synthetic release (parameters, ceilings, faults)."""
    return json.loads((Path(ds_dir) / MARKER).read_text())


def _write_root_files(ds_dir: Path, release: str, tasks, parts: list[dict]) -> None:
    desc = dict(DATASET_DESCRIPTION, Name=DATASET_DESCRIPTION["Name"].format(n=release[1:]))
    (ds_dir / "dataset_description.json").write_text(json.dumps(desc, indent=2))
    lines = ["\t".join(PARTICIPANT_COLUMNS)]
    lines += ["\t".join(str(r[c]) for c in PARTICIPANT_COLUMNS) for r in parts]
    (ds_dir / "participants.tsv").write_text("\n".join(lines) + "\n")
    for task in tasks:
        side = {"TaskName": task, "SamplingFrequency": 100, "PowerLineFrequency": 60,
                "EEGReference": "Cz", "RecordingType": "continuous", "SoftwareFilters": "n/a",
                "InstitutionName": "Child Mind Institute", "Manufacturer": "Magtism EGI",
                "ManufacturersModelName": "128-channel GSN 200 v.2.1",
                "TaskDescription": f"{task} (synthetic)", "Instructions": "n/a"}
        (ds_dir / f"task-{task}_eeg.json").write_text(json.dumps(side, indent=2))
    readme = ("Synthetic HBN-like EEG release written by data_prep.synthetic. NOT real data.\n"
              "See code/hybridnb_synthetic.json for what is planted.\n")
    (ds_dir / "README").write_text(readme)
