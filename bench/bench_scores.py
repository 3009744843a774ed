"""Scores over subject folds (issue 29): the deep recipe beside baselines and the planted oracle.

    python -m bench.bench_scores                 # the fold table on the "folds" release
    python -m bench.bench_scores --select        # the recipe choice, on the development release
    python -m bench.bench_scores --baselines-only --deep C1=0.331,0.302,... --deep C2=...
                                   # baselines and oracle only (minutes), the margin against
                                   # deep scores an earlier full run recorded

The "folds" synthetic release (``source.SYNTHETIC["folds"]``: 150 subjects, planted effect in
``data_prep.planted``) is cut into k subject folds (``splits.subject_folds``); every subject is a
test subject once. In each fold, for Challenge 1 (response time) and Challenge 2
(externalizing, one 2-s crop per 4-s resting window, the crops drawn with seed 42 as notebook 05
scores them):

* the deep recipe (``data_prep.recipes.RECIPES``: the model, loss, learning rate, epochs)
  trained with ``hybridnb.Trainer`` on standardised targets, on every window of the fold's
  training subjects (``CAP`` None), the fold's validation subjects for the validation loss only
  (``EARLY_STOPPING`` None: every epoch, as in the selection);
* the training mean, and ridge regressions (``data_prep.baselines``) on time-binned amplitude
  (ten 0.2-s bins), on log theta/alpha/beta power (one FFT) and on the standard five log band
  powers (delta to gamma, Welch), the penalty chosen by CV grouped by subject on the fold's
  training + validation subjects;
* the oracle: the planted signal's best prediction for the same test windows;
* the margin: the best baseline (lowest fold mean) minus deep, fold by fold, mean ± sd
  (``data_prep.baselines.margin``); positive means deep is better.

Nothing here looks at a test score to choose anything. The recipe itself was chosen with
``--select``: the candidates of :func:`_candidates`, scored on held-out subjects of a
*development release* (the same generator, seed 1: other subjects than the reported release),
so the reported subjects took no part in the choice. The fold table (mean ± sd over folds)
goes to ``bench/results/scores-<date>.md``, the selection to ``scores-select-<date>.md``.
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
from data_prep.baselines import BASELINES

EVAL_SEED = 42       # the crops Challenge 2 is scored on (as notebook 05)
CAP = None           # windows per training subject: None = every window
EARLY_STOPPING = None  # patience in epochs; None: every epoch of the recipe, as in the selection


def _candidates() -> dict[int, list[tuple[str, object]]]:
    """What --select compares, by challenge: (label, recipe)."""
    from data_prep.recipes import C1, C2

    def bins(n: int) -> dict:   # mean over n-sample bins (0.01 s each)
        return {"pool_time_length": n, "pool_time_stride": n}

    return {
        1: [("ELU, 0.1-s bins, MSE", C1.but(spec_kwargs=bins(10))),
            ("ELU, 0.1-s bins, Huber", C1.but(loss="huber", spec_kwargs=bins(10))),
            ("ELU, 0.05-s bins, MSE", C1.but(spec_kwargs=bins(5))),
            ("ELU, 0.2-s bins, MSE", C1.but(spec_kwargs=bins(20))),
            ("linear (no ELU), 0.2-s bins, Huber: last round's recipe",
             C1.but(loss="huber", spec_kwargs={"conv_nonlin": "torch.nn.Identity", **bins(20)})),
            ("Deep4Net (braindecode defaults), lr 1e-3", C1.but(
                model="Deep4Net", lr=1e-3, spec_kwargs={"final_conv_length": "auto"}))],
        2: [("whole-crop pooling, read-out at zero, MSE", C2),
            ("the same, Huber", C2.but(loss="huber")),
            ("the same, 40 + 40 filters", C2.but(spec_kwargs={"n_filters_time": 40,
                                                             "n_filters_spat": 40})),
            ("standard ShallowFBCSPNet (pool 75/15), Huber", C2.but(
                loss="huber", zero_readout=False,
                spec_kwargs={"final_conv_length": "auto", "n_filters_time": 20,
                             "n_filters_spat": 20}, model="ShallowFBCSPNet"))],
    }


ROWS = ["deep", *BASELINES, "oracle"]


def _windows(root: Path, challenge: int, cache_dir: Path | None):
    from data_prep import challenge1, challenge2

    if challenge == 1:
        return challenge1.make_windows(root, cache_dir=cache_dir, progress=False)
    return challenge2.make_windows(root, tasks=("RestingState",), cache_dir=cache_dir,
                                   progress=False)


def train_deep(recipe, fold, challenge: int, seed: int = 0, cap: int | None = CAP,
               early_stopping: int | None = EARLY_STOPPING):
    """Fit ``recipe`` (:class:`data_prep.recipes.Recipe`) on the fold's training subjects (the
    validation subjects give the validation loss); returns (predictions on the test windows,
    seconds, trainer)."""
    import hybridnb as hn
    from data_prep import splits, targets
    from data_prep.recipes import CROP, SCALE

    crop = CROP if challenge == 2 else None
    train = splits.at_most(fold.train, cap, seed=seed)
    scaling = targets.TargetScaling.fit(train.y)
    t0 = time.perf_counter()
    trainer = hn.Trainer(recipe.build(seed), **recipe.trainer_kwargs(),
                         early_stopping=early_stopping, seed=seed, live=False, verbose=False)
    trainer.fit(train.dataset(crop=crop, seed=seed, scale=SCALE, target=scaling),
                fold.val.dataset(crop=crop, seed=EVAL_SEED, scale=SCALE, target=scaling))
    scaling.fold_into(trainer.model)
    pred = trainer.predict(fold.test.dataset(crop=crop, seed=EVAL_SEED, scale=SCALE))
    return np.asarray(pred, float).reshape(-1), time.perf_counter() - t0, trainer


def baseline_scores(fold, challenge: int, with_val: bool = True) -> dict[str, float]:
    """Every baseline of ``data_prep.baselines.BASELINES`` (the training mean and the ridges),
    fitted on the training (+ validation, ``with_val``) subjects, scored on the fold's test
    windows."""
    from data_prep import baselines, scoring
    from data_prep.recipes import CROP

    crop = CROP if challenge == 2 else None
    fit = [(fold.train, 0)] + ([(fold.val, 0)] if with_val else [])
    y_fit = np.concatenate([p.y for p, _ in fit])
    out = {"training mean": scoring.nrmse(fold.test.y,
                                          baselines.training_mean(y_fit, len(fold.test)))}
    for kind, row in baselines.ROWS.items():
        parts = [baselines.features(p, kind, crop=crop, seed=s)
                 for p, s in fit + [(fold.test, EVAL_SEED)]]
        F = np.concatenate([f for f, _, _ in parts[:-1]])
        groups = np.concatenate([g for _, _, g in parts[:-1]])
        model = baselines.fit_ridge(F, y_fit, groups)
        out[row] = scoring.nrmse(parts[-1][1], model.predict(parts[-1][0]))
    return out


def fold_table(root: Path, k: int, seed: int, cache_dir: Path | None, challenges=(1, 2),
               folds_only: list[int] | None = None, deep: bool = True) -> tuple[dict, dict]:
    """{challenge: {row: [score per fold]}}, {challenge: [deep fit seconds per fold]}
    (``deep=False``: no deep fit, no "deep" row)."""
    from data_prep import baselines, scoring, splits, synthetic
    from data_prep.planted import Planted
    from data_prep.recipes import RECIPES

    planted = Planted(**synthetic.summary(root)["params"]["planted"])
    w = {c: _windows(root, c, cache_dir) for c in challenges}
    subjects = sorted(set(w[challenges[0]].metadata["subject"].astype(str)))
    scores = {c: {r: [] for r in ROWS if deep or r != "deep"} for c in challenges}
    times = {c: [] for c in challenges}
    for c in challenges:
        for i, fold in enumerate(splits.subject_folds(w[c], k, seed=seed, subjects=subjects)):
            if folds_only is not None and i not in folds_only:
                continue
            t0, fit_s = time.perf_counter(), 0.0
            if deep:
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
    """Each candidate's nRMSE on the selection subjects of the development release: fold 0's
    validation and test subjects (k = 5; the release is never reported, so its "test"
    subjects are just more held-out subjects), beside the ridge baselines fitted on fold 0's
    training + validation subjects and scored on the same windows."""
    from data_prep import scoring, splits
    from data_prep.recipes import RECIPES

    rows = []
    for c, cands in _candidates().items():
        w = _windows(root, c, cache_dir)
        fold = splits.subject_folds(w, 5, seed=seed)[0]
        subj = w.metadata["subject"].astype(str).to_numpy()
        held = set(fold.val.metadata["subject"].astype(str)) | set(
            fold.test.metadata["subject"].astype(str))
        sel = fold._replace(test=w.subset(np.isin(subj, sorted(held))))
        for label, r in cands:
            pred, fit_s, trainer = train_deep(r, sel, c, seed=seed)
            rows.append({"challenge": f"C{c}", "candidate": label,
                         "selection nRMSE": f"{scoring.nrmse(sel.test.y, pred):.3f}",
                         "epochs": len(trainer.history), "fit s": f"{fit_s:.0f}",
                         "data_prep.recipes": "this one" if r == RECIPES[c] else ""})
            print(rows[-1], flush=True)
        for row, v in baseline_scores(sel, c, with_val=False).items():
            rows.append({"challenge": f"C{c}", "candidate": f"(baseline) {row}",
                         "selection nRMSE": f"{v:.3f}", "epochs": "", "fit s": "",
                         "data_prep.recipes": ""})
        print(rows[-len(BASELINES):], flush=True)
    return rows


def _given_deep(items: list[str]) -> dict[int, list[float]]:
    """``["C1=0.331,0.302", ...]`` -> {1: [0.331, 0.302], ...}; SystemExit naming a bad one."""
    out = {}
    for item in items:
        name, _, values = item.partition("=")
        try:
            c = int(name.strip().upper().removeprefix("C"))
            out[c] = [float(v) for v in values.split(",")]
        except ValueError:
            raise SystemExit(f"--deep {item!r}: expected C1=0.331,0.302,... (one score per "
                             "fold)") from None
        if c not in (1, 2):
            raise SystemExit(f"--deep {item!r}: the challenge is C1 or C2")
    return out


def margin_table(scores: dict, margins: dict) -> str:
    """The margin section: per challenge, best baseline − deep per fold, mean ± sd, and how
    many fold sds that is."""
    rows = []
    for c, m in margins.items():
        rows.append({"challenge": f"C{c}", "best baseline (lowest fold mean)": m.best,
                     "margin = best baseline − deep, mean ± sd": f"{m.mean:+.3f} ± {m.sd:.3f}",
                     "in fold sds": f"{m.mean / m.sd:+.1f}" if m.sd > 0 else "-",
                     "folds deep is below it": f"{sum(d > 0 for d in m.per_fold)} of "
                                               f"{len(m.per_fold)}",
                     **{f"fold {i}": f"{d:+.3f}" for i, d in enumerate(m.per_fold)}})
    return ("Margin (paired by fold; positive: deep is better):\n\n" + markdown_table(rows))


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
    ap.add_argument("--baselines-only", action="store_true",
                    help="no deep fit: the baselines and the oracle only (minutes, not ~13 min "
                    "on 2 quiet cores); written to scores-baselines-<date>.md")
    ap.add_argument("--deep", action="append", default=[], metavar="C1=0.331,0.302,...",
                    help="with --baselines-only: the deep scores per fold an earlier full run "
                    "of the same release and folds recorded, for the margin (said as such)")
    args = ap.parse_args(argv)
    given = _given_deep(args.deep) if args.deep else {}
    if given and not args.baselines_only:
        ap.error("--deep goes with --baselines-only (a full run measures deep itself)")
    warnings.filterwarnings("ignore")
    from data_prep import source, synthetic
    from data_prep.planted import PLANTED_FOLDS

    cache = Path(args.cache) if args.cache else source.default_cache()
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    if args.select:
        params = {**source.SYNTHETIC["folds"], "seed": 1, "planted": PLANTED_FOLDS}
        root = synthetic.make_hbn_like(cache / "synthetic" / "folds-dev", **params)
        rows = select(root, None, seed=args.seed)
        write_result("scores-select", "Recipe selection on the development release (issue 29)",
                     f"Command: `python -m bench.bench_scores --select` · release `{root}` "
                     "(the \"folds\" generator, seed 1: none of its subjects is reported) · "
                     "fold 0 of k = 5: trained on its training subjects (every window), scored "
                     "on its validation + test subjects; baselines fitted on the training "
                     f"subjects only\n\n{markdown_table(rows)}\nWall time: "
                     f"{time.perf_counter() - t0:.0f} s; load average (1 min) {load0:.1f} at "
                     f"the start, {os.getloadavg()[0]:.1f} at the end.\n")
        return 0
    t_rel = time.perf_counter()
    root = source.resolve("synthetic", cache=cache, synthetic_kind="folds")
    t_rel = time.perf_counter() - t_rel
    scores, times = fold_table(root, args.k, args.seed, None, folds_only=args.folds,
                               deep=not args.baselines_only)
    for c, v in given.items():
        if c in scores:
            if len(v) != len(scores[c]["oracle"]):
                raise SystemExit(f"--deep C{c}: {len(v)} scores for "
                                 f"{len(scores[c]['oracle'])} folds")
            scores[c] = {"deep": v, **scores[c]}
    wall = time.perf_counter() - t0
    table = []
    for c in scores:
        for row, v in scores[c].items():
            table.append({"challenge": f"C{c}", "predictor": row, "mean ± sd": _mean_sd(v),
                          **{f"fold {i}": f"{x:.3f}" for i, x in enumerate(v)}})
    load1 = os.getloadavg()[0]
    from data_prep.recipes import RECIPES

    recipe_lines = "\n".join(f"- C{c}: {r.describe()}" for c, r in RECIPES.items())
    cmd = "python -m bench.bench_scores " + " ".join(sys.argv[1:] if argv is None else argv)
    body = (f"Command: `{cmd.strip()}` · release `{root}` (synthetic kind \"folds\"; "
            f"{'reused' if t_rel < 5 else f'written in {t_rel:.0f} s'}) · k = {args.k} "
            f"subject folds, seed {args.seed}, every window of each training subject"
            f"\n\nRecipes (`data_prep.recipes`):\n{recipe_lines}\n\n"
            + markdown_table(table)
            + ("\nDeep fit per fold (s): " + "; ".join(
                f"C{c} " + ", ".join(f"{t:.0f}" for t in ts) for c, ts in times.items())
               if not args.baselines_only else
               "\nNo deep fit in this run (--baselines-only)" + (
                   ": the deep row is the per-fold scores given with --deep, as an earlier "
                   "full run of the same release, folds and recipes recorded them, not "
                   "measured here" if given else ""))
            + f"\n\nWall time, everything: {wall:.0f} s. Load average (1 min): {load0:.1f} at "
              f"the start, {load1:.1f} at the end, on {len(os.sched_getaffinity(0))} cores "
              "(a shared machine: other work ran beside this).\n")
    from data_prep.baselines import margin

    have = [c for c in scores if "deep" in scores[c]]
    margins = {c: margin(scores[c]) for c in have}
    if margins:
        body += "\n" + margin_table(scores, margins)
    if args.baselines_only:
        write_result("scores-baselines", "Baselines over subject folds (issue 34)", body)
        return 0
    deep = {c: float(np.mean(scores[c]["deep"])) for c in scores}
    goals = []
    for c, limit in ((1, 0.40), (2, 0.85)):
        if c in scores:
            m = margins[c]
            goals.append((f"C{c} fold mean ≤ {limit:.2f} and below the best baseline "
                          f"({deep[c]:.3f} vs {m.best} "
                          f"{float(np.mean(scores[c][m.best])):.3f}; margin {m.mean:+.3f} ± "
                          f"{m.sd:.3f})", bool(deep[c] <= limit and m.mean > 0)))
    write_result("scores", "Scores over subject folds (issue 29)", body, goals)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
