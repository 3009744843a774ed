"""The Challenge score table the demo prints at the end: each notebook's status and wall time,
Challenge 1 and 2 nRMSE against the constant predictor and the synthetic data's ceiling, the
overall score, and plain ``C1 nRMSE <v>`` lines that scripts read.

The numbers come from what the notebooks recorded (:func:`hybridnb_tools.results.record`); the
scores themselves are computed in the notebooks with :mod:`data_prep.scoring`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hybridnb_tools.notebooks import NotebookRun


def merged_results(runs: list[NotebookRun]) -> dict:
    """Every notebook's recorded values in one dict (later notebooks win on the same key)."""
    out: dict = {}
    for r in runs:
        out.update(r.results)
    return out


def _num(v: Any, digits: int = 3) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return f"{v:.{digits}f}"
    return "-" if v is None else str(v)


def summary(runs: list[NotebookRun], out_dir: Path, total_s: float, quick: bool) -> str:
    """The closing table, with plain ``C1 nRMSE <v>``, ``C2 nRMSE <v>``, ``overall <v>`` lines."""
    res = merged_results(runs)
    device = res.get("device", "-")
    precision = res.get("precision")
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
        f"{'Challenge 1 nRMSE':<26} {_num(res.get('c1_nrmse')):>8} "
        f"{_num(res.get('c1_constant_nrmse', 1.0)):>9} {_num(res.get('c1_ceiling_nrmse')):>9}  "
        f"{res.get('c1_model', '-')}",
        f"{'Challenge 2 nRMSE':<26} {_num(res.get('c2_nrmse')):>8} "
        f"{_num(res.get('c2_constant_nrmse', 1.0)):>9} {_num(res.get('c2_ceiling_nrmse')):>9}  "
        f"{res.get('c2_model', '-')}",
        f"{'overall 0.3·C1 + 0.7·C2':<26} {_num(res.get('overall')):>8} {_num(1.0):>9} "
        f"{_num(res.get('overall_ceiling')):>9}",
    ]
    if res.get("submission_nrmse") is not None:
        lines.append(f"submission zip loaded in a fresh process: outputs "
                     f"{tuple(res.get('submission_output_shape') or ())} on the C1 test "
                     f"windows, C1 nRMSE {_num(res.get('submission_nrmse'))}, "
                     f"C2 nRMSE {_num(res.get('submission_c2_nrmse'))}")
    lines += [
        "",
        "constant = predicting the test mean (scores exactly 1.0); ceiling = the best nRMSE the "
        "synthetic data's planted signal allows.",
        "",
        f"device {device}",
        f"C1 nRMSE {_num(res.get('c1_nrmse'), 4)}",
        f"C2 nRMSE {_num(res.get('c2_nrmse'), 4)}",
        f"overall {_num(res.get('overall'), 4)}",
        f"wall time {total_s:.1f} s",
        f"outputs in {out_dir}/ (executed notebooks, HTML, *.results.json, checkpoints, "
        f"submission.zip)",
    ]
    return "\n".join(lines)
