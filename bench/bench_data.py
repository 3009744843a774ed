"""data_prep vs the official eegdash + braindecode pipeline, side by side on one synthetic release.

Part 1, window preparation (open the release -> windows ready), interleaved A B C ... per round:
  * Challenge 1: data_prep (store built, no cache) / data_prep (second call, from the cache) /
    official as the starter kit writes it (eegdash offline, annotate + anchors, windows; the
    signal is not loaded) / official with ``raw.load_data()`` first.
  * Challenge 2: data_prep / cache / official (filter + fixed-length windows; lazy) / official
    with the signal loaded.
Part 2, DataLoader throughput (batch 128, shuffled, workers 0, one torch thread; whole epochs,
the first included, at least 30 batches), same DataLoader for every dataset:
  * C1: the store (``w.loader()``, and a plain ``DataLoader(w.dataset(), batch_size=128)``) /
    braindecode windows as the starter kit writes them (BDF re-read per item) / braindecode with
    the signal loaded.
  * C2 with 2-s crops: the store (crops by slicing) / the starter kit's ``DatasetWrapper`` over
    lazy and over loaded braindecode windows.
Ratios are per round (A/B in the same round), medians over rounds. Needs eegdash.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path

from bench.common import interleaved, markdown_table, median, spread, write_result

N_SUBJECTS = 12
ROUNDS = 3
BATCH = 128


@contextlib.contextmanager
def quiet():
    """Silence eegdash's banner/log lines and library warnings while timing."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        level = logging.root.manager.disable
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(level)


def _prep_rows(root: Path, cache: Path) -> tuple[list[dict], dict]:
    from data_prep import challenge1, challenge2, official

    tasks2 = ["RestingState", "contrastChangeDetection"]
    state = {}

    def ours(fn, **kw):
        def run():
            with quiet():
                fn(root, cache_dir=cache, cache=False, progress=False, **kw)
        return run

    def ours_cached(fn, **kw):
        def run():
            with quiet():
                fn(root, cache_dir=cache, progress=False, **kw)
        return run

    def off_c1(load):
        def run():
            with quiet():
                ds = official.load_recordings(root, "contrastChangeDetection", load=load)
                state[f"c1_{load}"] = official.c1_windows(ds)
        return run

    def off_c2(load):
        def run():
            with quiet():
                ds = official.load_recordings(root, tasks2, load=load)
                state[f"c2_{load}"] = official.c2_windows(ds)
        return run

    with quiet():   # warm imports and the cache entries used by the cached variants
        challenge1.make_windows(root, cache_dir=cache, progress=False)
        challenge2.make_windows(root, tasks=tasks2, cache_dir=cache, progress=False)
    t = interleaved({
        "c1 data_prep": ours(challenge1.make_windows),
        "c1 data_prep cached": ours_cached(challenge1.make_windows),
        "c1 official (as written)": off_c1(False),
        "c1 official + load_data": off_c1(True),
        "c2 data_prep": ours(challenge2.make_windows, tasks=tasks2),
        "c2 data_prep cached": ours_cached(challenge2.make_windows, tasks=tasks2),
        "c2 official (as written)": off_c2(False),
        "c2 official + load_data": off_c2(True),
    }, repeats=ROUNDS)
    rows = []
    for ch in ("c1", "c2"):
        ref = t[f"{ch} official (as written)"]
        for name in [k for k in t if k.startswith(ch)]:
            ratio = [a / b for a, b in zip(t[name], ref, strict=True)]
            rows.append({"variant": name, "median s": median(t[name]),
                         "range s": spread(t[name]), "× official": median(ratio)})
    return rows, state


def _epoch_rate(make_loader, min_batches: int = 30) -> float:
    """Windows/s over whole epochs (first included) until at least ``min_batches`` batches."""
    loader = make_loader()
    n, batches, t0 = 0, 0, time.perf_counter()
    while batches < min_batches:
        for batch in loader:
            n += len(batch[0])
            batches += 1
    return n / (time.perf_counter() - t0)


def _loader_rows(root: Path, cache: Path, state: dict) -> list[dict]:
    import torch
    from torch.utils.data import DataLoader

    from data_prep import challenge1, challenge2, official

    torch.set_num_threads(1)
    tasks2 = ["RestingState", "contrastChangeDetection"]
    with quiet():
        w1 = challenge1.make_windows(root, cache_dir=cache, progress=False)
        w2 = challenge2.make_windows(root, tasks=tasks2, cache_dir=cache, progress=False)
    lazy1, loaded1 = state["c1_False"], state["c1_True"]
    lazy2 = official.c2_crops(state["c2_False"], seed=0)
    loaded2 = official.c2_crops(state["c2_True"], seed=0)
    g = torch.Generator().manual_seed(0)

    def rate(make):
        def run():
            with quiet():
                return _epoch_rate(make)      # interleaved records the returned rate
        return run

    t = interleaved({
        "c1 store, w.loader()": rate(lambda: w1.loader(BATCH, generator=g)),
        "c1 store, DataLoader(w.dataset())": rate(
            lambda: DataLoader(w1.dataset(), batch_size=BATCH, shuffle=True, generator=g)),
        "c1 starter kit as written (BDF per item)": rate(
            lambda: DataLoader(lazy1, batch_size=BATCH, shuffle=True, generator=g)),
        "c1 braindecode, signal loaded": rate(
            lambda: DataLoader(loaded1, batch_size=BATCH, shuffle=True, generator=g)),
        "c2 store + crops, w.loader(crop=200)": rate(
            lambda: w2.loader(BATCH, crop=200, seed=0, generator=g)),
        "c2 starter kit as written (BDF per item)": rate(
            lambda: DataLoader(lazy2, batch_size=BATCH, shuffle=True, generator=g)),
        "c2 braindecode, signal loaded": rate(
            lambda: DataLoader(loaded2, batch_size=BATCH, shuffle=True, generator=g)),
    }, repeats=ROUNDS)
    rows = []
    for ch in ("c1", "c2"):
        kit = t[f"{ch} starter kit as written (BDF per item)"]
        loaded = t[f"{ch} braindecode, signal loaded"]
        for name in [k for k in t if k.startswith(ch)]:
            rates = t[name]
            rows.append({
                "dataset": name, "windows/s": median(rates), "range": spread(rates),
                "× starter kit": median([a / b for a, b in zip(t[name], kit, strict=True)]),
                "× loaded braindecode": median([a / b for a, b in
                                                zip(t[name], loaded, strict=True)])})
    return rows, w1, w2


def main() -> None:
    from data_prep import official, synthetic

    if not official.available():
        write_result("data", "data_prep vs the official pipeline",
                     "eegdash is not installed (pip install 'hybridnb[challenge]'); the official "
                     "pipeline cannot run here, nothing measured.\n", [])
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench_data_"))
    try:
        t0 = time.perf_counter()
        root = synthetic.make_hbn_like(tmp, n_subjects=N_SUBJECTS, seed=0)
        gen_s = time.perf_counter() - t0
        cache = tmp / "cache"
        prep, state = _prep_rows(root, cache)
        loader, w1, w2 = _loader_rows(root, cache, state)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    by = {r["variant"]: r for r in prep}
    lo = {r["dataset"]: r for r in loader}
    body = (
        f"Synthetic mini release: {N_SUBJECTS} subjects (R5 mini ids), 3 CCD runs of 12 trials "
        f"+ 1 resting state each ({N_SUBJECTS * 4} BDF recordings), written in {gen_s:.1f} s. "
        f"C1 store: {len(w1)} windows (129, 200); C2 store: {len(w2)} windows (129, 400). "
        f"{ROUNDS} interleaved rounds; cores: {len(os.sched_getaffinity(0))}.\n\n"
        "### Window preparation (open the release -> windows ready)\n\n"
        + markdown_table(prep) +
        "\n'as written' = the starter kit's calls (signal not loaded; every later read goes "
        "back to the BDF); '+ load_data' = the fix for braindecode 1.8.1 ignoring preload=True."
        "\n\n### DataLoader throughput (batch 128, shuffle, workers 0, 1 torch thread)\n\n"
        + markdown_table(loader))
    goals = [
        ("C1 preparation ≤ 0.5× the official pipeline",
         by["c1 data_prep"]["× official"] <= 0.5),
        ("C1 cached load ≤ 0.05× the official pipeline",
         by["c1 data_prep cached"]["× official"] <= 0.05),
        ("C2 preparation ≤ 0.5× the official pipeline (as written: lazy, reads nothing)",
         by["c2 data_prep"]["× official"] <= 0.5),
        ("C2 cached load ≤ 0.05× the official pipeline",
         by["c2 data_prep cached"]["× official"] <= 0.05),
        ("C1 store ≥ 10× the starter kit's path",
         lo["c1 store, w.loader()"]["× starter kit"] >= 10),
        ("C1 store ≥ 5× braindecode with the signal loaded",
         lo["c1 store, w.loader()"]["× loaded braindecode"] >= 5),
        ("C2 store + crops ≥ 10× the starter kit's path",
         lo["c2 store + crops, w.loader(crop=200)"]["× starter kit"] >= 10),
        ("C2 store + crops ≥ 5× braindecode with the signal loaded",
         lo["c2 store + crops, w.loader(crop=200)"]["× loaded braindecode"] >= 5),
    ]
    write_result("data", "data_prep vs the official eegdash + braindecode pipeline", body, goals)


if __name__ == "__main__":
    main()
