"""Scores over subject folds (issue 29): the deep recipe beside baselines and the planted oracle.

    python -m bench.bench_scores                 # the fold table on the "folds" release
    python -m bench.bench_scores --select        # the recipe choice, on the development release

The "folds" synthetic release (``source.SYNTHETIC["folds"]``: 150 subjects, planted effect in
``data_prep.planted``) is cut into k subject folds (``splits.subject_folds``); every subject is a
test subject once. In each fold, for Challenge 1 (response time) and Challenge 2
(externalizing, one 2-s crop per 4-s resting window, the crops drawn with seed 42 as notebook 05
scores them):

* the deep recipe (:data:`RECIPES`): a braindecode model trained with ``hybridnb.Trainer``
  (Huber loss on standardised targets, EMA 0.99) on at most ``cap`` windows per training
  subject, the fold's validation subjects for the validation loss (``early_stopping``: its
  patience in epochs, None: all epochs, as in the selection runs); ``zero_readout``: the last layer
  starts at zero, i.e. the model starts by predicting the training mean;
* the training mean, and ridge regressions (``data_prep.baselines``) on time-binned amplitude
  and on log band power, the penalty chosen by grouped CV on the fold's training + validation
  subjects;
* the oracle: the planted signal's best prediction for the same test windows.

Nothing here looks at a test score to choose anything. The recipe itself was chosen with
``--select``: candidates scored on the validation subjects of a *development release* (the same
generator, seed 1: other subjects than the reported release), so the reported subjects took no
part in the choice. The table (mean ± sd over folds) goes to ``bench/results/scores-<date>.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from bench.common import markdown_table, write_result

SCALE = 1e6          # volts -> µV
EVAL_SEED = 42       # the crops Challenge 2 is scored on (as notebook 05)
SHALLOW = {"final_conv_length": "auto", "n_filters_time": 20, "n_filters_spat": 20}
WHOLE_CROP = {**SHALLOW, "pool_time_length": 176, "pool_time_stride": 1}   # one power per crop
# an evoked-response (ERP) reading of ShallowFBCSPNet: no square/log, mean over 0.2-s bins
ERP = {**SHALLOW, "pool_time_length": 20, "pool_time_stride": 20, "conv_nonlin": "identity",
       "activation_pool_nonlin": "identity"}
RECIPES = {
    1: {"model": "ShallowFBCSPNet", "kwargs": ERP, "lr": 3e-3, "epochs": 8, "batch": 64,
        "cap": 20, "zero_readout": False, "early_stopping": None},
    2: {"model": "ShallowFBCSPNet", "kwargs": WHOLE_CROP, "lr": 3e-3, "epochs": 8, "batch": 64,
        "cap": 20, "zero_readout": True, "early_stopping": None},
}
# what --select compares (on the development release's validation subjects only)
CANDIDATES = {
    1: [RECIPES[1], {**RECIPES[1], "lr": 1e-2}, {**RECIPES[1], "kwargs": SHALLOW},
        {**RECIPES[1], "model": "EEGNet", "kwargs": {}, "epochs": 6}],
    2: [RECIPES[2], {**RECIPES[2], "zero_readout": False},
        {**RECIPES[2], "kwargs": SHALLOW, "epochs": 6, "zero_readout": False}],
}
ROWS = ["deep", "training mean", "ridge, amplitude", "ridge, band power", "oracle"]


def _windows(root: Path, challenge: int, cache_dir: Path | None):
    from data_prep import challenge1, challenge2

    if challenge == 1:
        return challenge1.make_windows(root, cache_dir=cache_dir, progress=False)
    return challenge2.make_windows(root, tasks=("RestingState",), cache_dir=cache_dir,
                                   progress=False)


def train_deep(recipe: dict, fold, challenge: int, seed: int = 0):
    """Fit the recipe on the fold's training subjects (validation subjects: early stopping and
    the validation loss); returns (predictions on the test windows, seconds, trainer)."""
    import torch
    from braindecode import models

    import hybridnb as hn
    from data_prep import splits, targets

    crop = 200 if challenge == 2 else None
    train = splits.at_most(fold.train, recipe["cap"], seed=seed)
    scaling = targets.TargetScaling.fit(train.y)
    torch.manual_seed(seed)
    kwargs = {k: torch.nn.Identity if v == "identity" else v
              for k, v in recipe["kwargs"].items()}
    model = getattr(models, recipe["model"])(n_chans=129, n_outputs=1, n_times=200, **kwargs)
    if recipe.get("zero_readout"):       # start by predicting the training mean
        last = [m for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
        torch.nn.init.zeros_(last[-1].weight)
        torch.nn.init.zeros_(last[-1].bias)
    t0 = time.perf_counter()
    trainer = hn.Trainer(model, loss="huber", lr=recipe["lr"], epochs=recipe["epochs"],
                         batch_size=recipe["batch"], ema=0.99,
                         early_stopping=recipe["early_stopping"], seed=seed,
                         live=False, verbose=False)
    trainer.fit(train.dataset(crop=crop, seed=seed, scale=SCALE, target=scaling),
                fold.val.dataset(crop=crop, seed=EVAL_SEED, scale=SCALE, target=scaling))
    scaling.fold_into(trainer.model)
    pred = trainer.predict(fold.test.dataset(crop=crop, seed=EVAL_SEED, scale=SCALE))
    return np.asarray(pred, float).reshape(-1), time.perf_counter() - t0, trainer


def baseline_scores(fold, challenge: int) -> dict[str, float]:
    """Training mean and the two ridges, fitted on training + validation subjects."""
    from data_prep import baselines, scoring

    crop = 200 if challenge == 2 else None
    y_fit = np.concatenate([fold.train.y, fold.val.y])
    out = {"training mean": scoring.nrmse(fold.test.y,
                                          baselines.training_mean(y_fit, len(fold.test)))}
    for kind, row in (("amplitude", "ridge, amplitude"), ("bandpower", "ridge, band power")):
        parts = [baselines.features(p, kind, crop=crop, seed=s)
                 for p, s in ((fold.train, 0), (fold.val, 0), (fold.test, EVAL_SEED))]
        F = np.concatenate([parts[0][0], parts[1][0]])
        groups = np.concatenate([parts[0][2], parts[1][2]])
        model = baselines.fit_ridge(F, y_fit, groups)
        out[row] = scoring.nrmse(parts[2][1], model.predict(parts[2][0]))
    return out


def fold_table(root: Path, k: int, seed: int, cache_dir: Path | None, challenges=(1, 2),
               folds_only: list[int] | None = None) -> tuple[dict, dict]:
    """{challenge: {row: [score per fold]}}, {challenge: [deep fit seconds per fold]}."""
    from data_prep import baselines, scoring, splits, synthetic
    from data_prep.planted import Planted

    planted = Planted(**synthetic.summary(root)["params"]["planted"])
    w = {c: _windows(root, c, cache_dir) for c in challenges}
    subjects = sorted(set(w[challenges[0]].metadata["subject"].astype(str)))
    scores = {c: {r: [] for r in ROWS} for c in challenges}
    times = {c: [] for c in challenges}
    for c in challenges:
        for i, fold in enumerate(splits.subject_folds(w[c], k, seed=seed, subjects=subjects)):
            if folds_only is not None and i not in folds_only:
                continue
            t0 = time.perf_counter()
            pred, fit_s, _ = train_deep(RECIPES[c], fold, c, seed=seed)
            scores[c]["deep"].append(scoring.nrmse(fold.test.y, pred))
            times[c].append(fit_s)
            for row, v in baseline_scores(fold, c).items():
                scores[c][row].append(v)
            scores[c]["oracle"].append(scoring.nrmse(
                fold.test.y, baselines.oracle(fold.test, root, c, planted)))
            print(f"C{c} fold {i}: " + ", ".join(f"{r} {v[-1]:.3f}" for r, v in
                                                  scores[c].items())
                  + f" | {fold.test.metadata['subject'].nunique()} test subjects, deep fit "
                  f"{fit_s:.1f} s, fold {time.perf_counter() - t0:.1f} s", flush=True)
    return scores, times


def select(root: Path, cache_dir: Path | None, seed: int = 0) -> list[dict]:
    """Each candidate's validation nRMSE on fold 0 of the development release."""
    from data_prep import scoring, splits

    rows = []
    for c, cands in CANDIDATES.items():
        fold = splits.subject_folds(_windows(root, c, cache_dir), 5, seed=seed)[0]
        val_fold = fold._replace(test=fold.val)      # score the validation subjects
        for r in cands:
            pred, fit_s, trainer = train_deep(r, val_fold, c, seed=seed)
            rows.append({"challenge": c, "model": r["model"], "kwargs": r["kwargs"],
                         "lr": r["lr"], "epochs run": len(trainer.history),
                         "val nRMSE": scoring.nrmse(fold.val.y, pred), "fit s": fit_s})
            print(rows[-1], flush=True)
    return rows


def _mean_sd(v: list[float]) -> str:
    return f"{np.mean(v):.3f} ± {np.std(v, ddof=1) if len(v) > 1 else 0:.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=5, help="subject folds (default 5)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", default=None, help="where the release goes (default: "
                    "hybridnb's cache, as the notebooks)")
    ap.add_argument("--folds", type=int, nargs="*", help="only these folds (a quick look)")
    ap.add_argument("--select", action="store_true",
                    help="compare the candidate recipes on the development release instead")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    from data_prep import source, synthetic
    from data_prep.planted import PLANTED_FOLDS

    cache = Path(args.cache) if args.cache else source.default_cache()
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    if args.select:
        params = {**source.SYNTHETIC["folds"], "seed": 1, "planted": PLANTED_FOLDS}
        root = synthetic.make_hbn_like(cache / "synthetic" / "folds-dev", **params)
        rows = select(root, None, seed=args.seed)
        print(markdown_table(rows))
        return 0
    t_rel = time.perf_counter()
    root = source.resolve("synthetic", cache=cache, synthetic_kind="folds")
    t_rel = time.perf_counter() - t_rel
    scores, times = fold_table(root, args.k, args.seed, None, folds_only=args.folds)
    wall = time.perf_counter() - t0
    table = []
    for c in scores:
        for row, v in scores[c].items():
            table.append({"challenge": f"C{c}", "predictor": row, "mean ± sd": _mean_sd(v),
                          **{f"fold {i}": f"{x:.3f}" for i, x in enumerate(v)}})
    load1 = os.getloadavg()[0]
    recipe_lines = "\n".join(f"- C{c}: {r}" for c, r in RECIPES.items())
    cmd = "python -m bench.bench_scores " + " ".join(sys.argv[1:] if argv is None else argv)
    body = (f"Command: `{cmd.strip()}` · release `{root}` (synthetic kind \"folds\"; "
            f"{'reused' if t_rel < 5 else f'written in {t_rel:.0f} s'}) · k = {args.k} "
            f"subject folds, seed {args.seed}\n\nRecipes:\n{recipe_lines}\n\n"
            + markdown_table(table)
            + "\nDeep fit per fold (s): " + "; ".join(
                f"C{c} " + ", ".join(f"{t:.0f}" for t in ts) for c, ts in times.items())
            + f"\n\nWall time, everything: {wall:.0f} s. Load average (1 min): {load0:.1f} at "
              f"the start, {load1:.1f} at the end, on {len(os.sched_getaffinity(0))} cores "
              "(a shared machine: other work ran beside this).\n")
    best = {c: min(np.mean(scores[c][r]) for r in ROWS[1:4]) for c in scores}
    deep = {c: float(np.mean(scores[c]["deep"])) for c in scores}
    goals = []
    if 1 in scores:
        goals.append((f"C1 fold mean ≤ 0.40 and below the best baseline ({deep[1]:.3f} vs "
                      f"{best[1]:.3f})", bool(deep[1] <= 0.40 and deep[1] < best[1])))
    if 2 in scores:
        goals.append((f"C2 fold mean ≤ 0.85 and below the best baseline ({deep[2]:.3f} vs "
                      f"{best[2]:.3f})", bool(deep[2] <= 0.85 and deep[2] < best[2])))
    write_result("scores", "Scores over subject folds (issue 29)", body, goals)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
