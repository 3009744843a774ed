"""The Challenge score table the demo prints at the end: each notebook's status and wall time,
Challenge 1 and 2 nRMSE as the mean ± sd over subject folds beside the best baseline and the
planted oracle (mean over the same folds), the margin to the best baseline with its sd over the
folds (paired fold by fold: :func:`data_prep.baselines.margin`), the overall score, the submission checked in a fresh
process, and plain ``C1 nRMSE <v>`` lines that scripts read.

The numbers are the notebooks' own variables, read from each kernel after its last cell
(:data:`TABLE`: the expressions the runner evaluates there); the scores themselves are computed
in the notebooks with :mod:`data_prep.scoring` and :mod:`data_prep.baselines`. In quick mode the
table says they mean nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from data_prep.baselines import BASELINES, Margin, margin
from hybridnb_tools.notebooks import NotebookRun

# name in the table -> the expression evaluated in every notebook's kernel after its last cell
# (a name a notebook does not define is simply absent; a later notebook wins on the same name).
# 04 scores Challenge 1 over subject folds (trainer, fold_table, c1, c1_sd, model_name); 05
# Challenge 2 (fold_table2, c2, c2_sd, spec2), the overall score from both fold means, and the
# submission of fold 0's models checked in a fresh process (fresh1/fresh2 against
# c1_submitted/c2_submitted, those models' scores in the notebook).
TABLE = {
    "detected_device": "str(hw.device)",
    "device": "str(trainer.device)",
    "precision": "trainer.precision.name",
    "folds": "K",
    "c1_nrmse": "c1",
    "c1_sd": "c1_sd",
    "c1_table": "fold_table.to_dict('index')",   # mean, sd and the 'fold i' columns
    "c1_model": "model_name",
    "c2_nrmse": "c2",
    "c2_sd": "c2_sd",
    "c2_table": "fold_table2.to_dict('index')",
    "c2_model": "spec2.name",
    "overall": "overall",
    "submitted_c1": "c1_submitted",
    "submitted_c2": "c2_submitted",
    "submission_c1": "fresh1",
    "submission_c2": "fresh2",
}
# the reference predictors of the notebooks' fold tables: data_prep.baselines.BASELINES
QUICK_NOTE = ("quick mode: a few steps on a tiny release, so these scores are not meaningful "
              "(run without --quick / HYBRIDNB_QUICK for real ones)")


def merged_values(runs: list[NotebookRun]) -> dict:
    """Every notebook's values read for the table, in one dict (later notebooks win)."""
    out: dict = {}
    for r in runs:
        out.update(r.values)
    return out


def _num(v: Any, digits: int = 3) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return f"{v:.{digits}f}"
    return "-" if v is None else str(v)


def _mean(table: dict, row: str) -> float | None:
    return (table.get(row) or {}).get("mean")


def best_baseline(table: dict) -> tuple[str | None, float | None]:
    """(name, fold mean) of the baseline with the lowest fold mean in a notebook's table
    (``{predictor: {"mean": .., "sd": ..}}``), or (None, None) when it holds none."""
    found = [(m, row) for row in BASELINES if (m := _mean(table, row)) is not None]
    if not found:
        return None, None
    m, row = min(found)
    return row, m


def fold_margin(table: dict, model: str = "deep") -> Margin | None:
    """The best baseline minus ``model``, fold by fold, from a notebook's fold table
    (``{predictor: {"mean", "sd", "fold 0", "fold 1", ...}}``); None when the table has no
    per-fold scores for the model or any baseline."""
    per_fold = {}
    for row, cells in table.items():
        folds = sorted((int(k.split()[1]), v) for k, v in (cells or {}).items()
                       if isinstance(k, str) and k.startswith("fold ") and v is not None)
        if folds:
            per_fold[row] = [v for _, v in folds]
    if model not in per_fold or not any(b in per_fold for b in BASELINES):
        return None
    return margin(per_fold, model=model)


def _margin_text(m: Margin | None) -> str:
    return "-" if m is None else f"{m.mean:+.3f} ± {m.sd:.3f}"


def _weighted(c1: float | None, c2: float | None) -> float | None:
    return None if c1 is None or c2 is None else 0.3 * c1 + 0.7 * c2


def summary(runs: list[NotebookRun], out_dir: Path, total_s: float, quick: bool) -> str:
    """The closing table, with plain ``C1 nRMSE <v>``, ``C2 nRMSE <v>``, ``overall <v>`` lines
    (the fold means); in quick mode a line under the scores and under the plain lines says they
    are not meaningful."""
    res = merged_values(runs)
    device = res.get("device") or res.get("detected_device") or "-"
    precision = res.get("precision")
    sub1, sub2 = res.get("submission_c1") or {}, res.get("submission_c2") or {}
    t1, t2 = res.get("c1_table") or {}, res.get("c2_table") or {}
    (b1, b1v), (b2, b2v) = best_baseline(t1), best_baseline(t2)
    o1, o2 = _mean(t1, "oracle"), _mean(t2, "oracle")
    m1, m2 = fold_margin(t1), fold_margin(t2)
    k = res.get("folds")
    lines = [
        "",
        f"hybridnb demo · {'quick (HYBRIDNB_QUICK=1)' if quick else 'default'} mode · "
        f"device {device}{f' ({precision})' if precision else ''}",
        "",
        f"{'notebook':<32} {'status':<8} {'wall':>8}",
    ]
    for r in runs:
        status = "ok" if r.ok else "FAILED"
        lines.append(f"{r.name:<32} {status:<8} {r.seconds:>6.1f} s")
        if r.error:
            lines.append(f"    {r.error}")
    lines.append(f"{'total':<32} {'':<8} {total_s:>6.1f} s")

    def deep(mean, sd):
        return _num(mean) + (f" ± {_num(sd)}" if sd is not None else "")

    def base(v, name):
        return _num(v) + (f" ({name})" if name else "")

    lines += [
        "",
        f"nRMSE over {k if k is not None else '-'} subject folds, mean (lower is better; the "
        "constant predictor scores 1.0)",
        f"{'':<24} {'model ± sd':>15}  {'best baseline':<36} {'margin ± sd':>15} "
        f"{'oracle':>7}  model",
        f"{'Challenge 1':<24} {deep(res.get('c1_nrmse'), res.get('c1_sd')):>15}  "
        f"{base(b1v, b1):<36} {_margin_text(m1):>15} {_num(o1):>7}  {res.get('c1_model', '-')}",
        f"{'Challenge 2':<24} {deep(res.get('c2_nrmse'), res.get('c2_sd')):>15}  "
        f"{base(b2v, b2):<36} {_margin_text(m2):>15} {_num(o2):>7}  {res.get('c2_model', '-')}",
        f"{'overall 0.3·C1 + 0.7·C2':<24} {_num(res.get('overall')):>15}  "
        f"{_num(_weighted(b1v, b2v)):<36} {'':>15} {_num(_weighted(o1, o2)):>7}",
    ]
    if quick:
        lines.append(QUICK_NOTE)
    if sub1.get("nrmse") is not None or sub2.get("nrmse") is not None:
        lines.append(f"submission zip (fold 0's models) loaded in a fresh process: outputs "
                     f"{tuple(sub1.get('output_shape') or ())} on the C1 test windows; "
                     f"C1 nRMSE {_num(sub1.get('nrmse'))} (notebook "
                     f"{_num(res.get('submitted_c1'))}), C2 nRMSE {_num(sub2.get('nrmse'))} "
                     f"(notebook {_num(res.get('submitted_c2'))}) on fold 0's test subjects")
    lines += [
        "",
        "best baseline = the lowest fold mean of the training mean and ridge regressions on "
        "time-binned amplitude, theta/alpha/beta power and the five standard bands (Welch), "
        "fitted on the same subjects; margin = best baseline − model, fold by fold, mean ± sd "
        "(positive: the model is better); oracle = the synthetic data's planted signal read "
        "exactly, on the same test subjects.",
        "",
        f"device {device}",
        f"C1 nRMSE {_num(res.get('c1_nrmse'), 4)}",
        f"C2 nRMSE {_num(res.get('c2_nrmse'), 4)}",
        f"overall {_num(res.get('overall'), 4)}",
    ]
    if quick:
        lines.append(QUICK_NOTE)
    lines += [
        f"wall time {total_s:.1f} s",
        f"outputs in {out_dir}/ (executed notebooks, HTML, results.json; the notebooks' "
        f"checkpoints and submission.zip in {out_dir}/runs/)",
    ]
    return "\n".join(lines)
