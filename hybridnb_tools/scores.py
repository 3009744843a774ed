"""The Challenge score table the demo prints at the end: each notebook's status and wall time,
Challenge 1 and 2 nRMSE against the constant predictor and the synthetic data's ceiling, the
overall score, and plain ``C1 nRMSE <v>`` lines that scripts read.

The numbers are the notebooks' own variables, read from each kernel after its last cell
(:data:`TABLE`: the expressions the runner evaluates there); the scores themselves are computed
in the notebooks with :mod:`data_prep.scoring`. In quick mode the table says they mean nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hybridnb_tools.notebooks import NotebookRun

# name in the table -> the expression evaluated in every notebook's kernel after its last cell
# (a name a notebook does not define is simply absent; a later notebook wins on the same name).
# 04 trains Challenge 1 (trainer, spec, c1, ceiling); 05 trains Challenge 2, builds and checks
# the submission (c1 again from the saved model, c2, overall, ceilings, fresh1/fresh2).
TABLE = {
    "detected_device": "str(hw.device)",
    "device": "str(trainer.device)",
    "precision": "trainer.precision.name",
    "c1_nrmse": "c1",
    "c1_ceiling_nrmse": "ceiling",
    "c1_model": "spec.name",
    "c2_nrmse": "c2",
    "c2_model": "f'{c2_spec.name} ({chosen})'",
    "overall": "overall",
    "ceilings": "ceilings",
    "submission_c1": "fresh1",
    "submission_c2": "fresh2",
}
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


def summary(runs: list[NotebookRun], out_dir: Path, total_s: float, quick: bool) -> str:
    """The closing table, with plain ``C1 nRMSE <v>``, ``C2 nRMSE <v>``, ``overall <v>`` lines;
    in quick mode a line under the scores and under the plain lines says they are not
    meaningful."""
    res = merged_values(runs)
    device = res.get("device") or res.get("detected_device") or "-"
    precision = res.get("precision")
    ceilings = res.get("ceilings") or {}
    sub1, sub2 = res.get("submission_c1") or {}, res.get("submission_c2") or {}
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
    lines += [
        "",
        f"{'score (lower is better)':<26} {'value':>8} {'constant':>9} {'ceiling':>9}  model",
        f"{'Challenge 1 nRMSE':<26} {_num(res.get('c1_nrmse')):>8} {_num(1.0):>9} "
        f"{_num(res.get('c1_ceiling_nrmse', ceilings.get('c1'))):>9}  "
        f"{res.get('c1_model', '-')}",
        f"{'Challenge 2 nRMSE':<26} {_num(res.get('c2_nrmse')):>8} {_num(1.0):>9} "
        f"{_num(ceilings.get('c2')):>9}  {res.get('c2_model', '-')}",
        f"{'overall 0.3·C1 + 0.7·C2':<26} {_num(res.get('overall')):>8} {_num(1.0):>9} "
        f"{_num(ceilings.get('overall')):>9}",
    ]
    if quick:
        lines.append(QUICK_NOTE)
    if sub1.get("nrmse") is not None:
        lines.append(f"submission zip loaded in a fresh process: outputs "
                     f"{tuple(sub1.get('output_shape') or ())} on the C1 test "
                     f"windows, C1 nRMSE {_num(sub1.get('nrmse'))}, "
                     f"C2 nRMSE {_num(sub2.get('nrmse'))}")
    lines += [
        "",
        "constant = predicting the test mean (scores exactly 1.0); ceiling = the best nRMSE the "
        "synthetic data's planted signal allows.",
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
