"""Static images for plotly figures (issue 28): what the PNG beside a figure's plotly JSON costs.

Each figure a notebook shows is drawn a second time, with matplotlib, by
``hybridnb.live.static.to_png`` (no kaleido: it needs a Chrome that Colab and offline machines
lack). Measured per figure, warm (matplotlib imported), median of repeats: a user ``px.scatter``,
``LRFindResult.plot()`` and the end-of-run figure (three panels, a long run's 2000 points per
series, drawn with matplotlib directly: ``live/panel_image.py``); beside it the plotly JSON the
HTML live view resends about once a second, and the first figure in a fresh process
(matplotlib's import included).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import load_note, markdown_table, median, spread, write_result

ROOT = Path(__file__).resolve().parents[1]
REPEATS = 7
GOAL_S = 0.5  # a figure's PNG may not make a cell feel slower than plotly's own output


def user_figure():
    import plotly.express as px

    rng = np.random.default_rng(0)
    return px.scatter(x=rng.normal(size=150), y=rng.normal(size=150),
                      color=np.repeat(["a", "b", "c"], 50), title="user scatter")


def lr_figure():
    from hybridnb.train.lr_find import LRFindResult

    lrs = np.logspace(-7, 0, 100)
    losses = 1 / (1 + lrs * 1e4) + 1 + (lrs > 0.1) * 5
    raw = losses + np.random.default_rng(0).normal(scale=0.05, size=100)
    return LRFindResult(lrs, losses, raw, 1e-4).plot()


def long_run_record(steps: int = 20_000, epochs: int = 20):
    from hybridnb.events import EpochRow, StepRow
    from hybridnb.live.record import RunRecord

    per = steps // epochs
    rec = RunRecord({"epochs": epochs, "steps_per_epoch": per, "device": "cpu",
                     "precision": "fp32", "model": "Bench", "monitor": "val_loss",
                     "n_params": 1000})
    rng = np.random.default_rng(0)
    for g in range(1, steps + 1):
        rec.add(StepRow(global_step=g, epoch=(g - 1) // per, loss=float(1 / g ** 0.3 +
                        rng.normal(scale=0.05)), lr=1e-3 * (1 - g / steps), step=(g - 1) % per + 1))
        if g % per == 0:
            rec.add(EpochRow({"train_loss": 1 / g ** 0.3, "val_loss": 1.1 / g ** 0.3,
                              "step": g, "epoch": g // per - 1}, global_step=g, epoch_end=True))
    return rec


def warm_costs() -> list[dict]:
    import json

    from hybridnb.live import figures, panel_image, static

    rec = long_run_record()
    cases = {"user px.scatter (3 traces, 150 points)": lambda f=user_figure(): static.to_png(f),
             "LRFindResult.plot() (100 steps)": lambda f=lr_figure(): static.save(f._draw(), "png"),
             "end-of-run figure, PNG (matplotlib)":
                 lambda: static.save(panel_image.draw(rec), "png"),
             "end-of-run figure, SVG (matplotlib, the snapshot's image)":
                 lambda: static.save(panel_image.draw(rec), "svg"),
             "live plots, plotly JSON (the HTML view, every ~1 s)":
                 lambda: json.dumps(figures.figure_dict(rec, figures.LIVE_POINTS)).encode()}
    rows = []
    for name, fn in cases.items():
        fn()  # warm-up: imports, font cache
        times = []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t0)
        rows.append({"figure": name, "median (ms)": median(times) * 1e3,
                     "min–max (ms)": spread([t * 1e3 for t in times]),
                     "size (KiB)": len(out) / 1024})
    return rows


def cold_first_figure() -> float:
    """Seconds for the first PNG in a fresh process (plotly already imported, as in a kernel
    that made the figure)."""
    code = ("import time, plotly.express as px; f = px.line(y=[1, 3, 2]); "
            "from hybridnb.live import static; t = time.perf_counter(); static.to_png(f); "
            "print(time.perf_counter() - t)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runs = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 env=env, cwd=ROOT, check=True, timeout=300).stdout)
            for _ in range(3)]
    return median(runs)


def main() -> None:
    load0 = os.getloadavg()[0]
    rows = warm_costs()
    cold = cold_first_figure()
    by = {r["figure"]: r["median (ms)"] for r in rows}
    live_json = by["live plots, plotly JSON (the HTML view, every ~1 s)"]
    goals = [(f"{r['figure']}: <= {GOAL_S * 1e3:.0f} ms (measured {r['median (ms)']:.0f} ms)",
              r["median (ms)"] <= GOAL_S * 1e3) for r in rows]
    body = (f"### Per figure, warm, median of {REPEATS}\n\n{markdown_table(rows)}\n"
            f"First PNG in a fresh process (matplotlib imported by it): {cold * 1e3:.0f} ms "
            "(median of 3 processes).\n\n"
            f"The HTML live view resends the plots as plotly JSON ({live_json:.1f} ms each); "
            f"matplotlib draws them once, at the end. {load_note(load0)}\n")
    write_result("figures", "Static images beside plotly figures: cost per figure", body, goals)


if __name__ == "__main__":
    main()
