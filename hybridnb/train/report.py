"""trainer.report(folder): what a run leaves behind for people who were not watching.

history.csv (one row per epoch), steps.csv (one row per optimizer step), events.csv, figures as
interactive HTML (plotly) and as PNG when a static backend works (plotly's kaleido, else
matplotlib), and summary.txt (device, precision, time, speed, peak memory, best metric, events).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pandas as pd


def write_report(trainer, folder) -> Path:
    """Write the report files into ``folder`` (created); returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    summary = trainer.summary()
    hist, steps = trainer.history, trainer.steps
    hist.to_csv(folder / "history.csv", index=False)
    steps.to_csv(folder / "steps.csv", index=False)
    events = pd.DataFrame([e.to_dict() for e in trainer.events],
                          columns=["kind", "message", "step", "epoch", "time"])
    events.to_csv(folder / "events.csv", index=False)
    figure_notes = _figures(hist, steps, trainer.events, folder)
    (folder / "summary.txt").write_text(summary_text(summary, figure_notes))
    return folder


def summary_text(summary: dict, notes: list[str] = ()) -> str:
    """A few plain lines about the run."""
    best = summary["best"]
    peak = summary["peak_memory_bytes"]
    sps = summary["samples_per_s"]
    lines = [
        f"device: {summary['device']}   precision: {summary['precision']}",
        f"time: {summary['elapsed_s']:.1f} s   throughput: "
        f"{'n/a' if sps != sps else f'{sps:.1f} samples/s'}",
        f"peak memory: {'n/a' if peak is None else f'{peak / 2**20:.0f} MiB'}",
        "best: " + (f"{best['monitor']} = {best['value']:.4g} (epoch {best['epoch']}, step "
                    f"{best['step']})" if best.get("value") is not None else "no validation"),
        f"epochs completed: {len(summary['history'])}"
        + (f"   stopped: {summary['stopped']}" if summary.get("stopped") else ""),
        f"events: {len(summary['events'])}",
    ]
    lines += [f"  {ev}" for ev in summary["events"]]
    lines += list(notes)
    return "\n".join(lines) + "\n"


def _figures(hist: pd.DataFrame, steps: pd.DataFrame, events, folder: Path) -> list[str]:
    """loss.html (+ loss.png) and lr.html (+ lr.png); returns notes about what was skipped."""
    notes = []
    series = {
        "loss": [("train loss (step)", steps["global_step"], steps["loss"]),
                 ("train loss (epoch)", hist["step"], hist["train_loss"]),
                 ("val loss", hist["step"], hist["val_loss"])],
        "lr": [("learning rate", steps["global_step"], steps["lr"])],
    }
    try:
        import plotly.graph_objects as go
    except ImportError:
        return ["figures skipped: plotly is not installed (pip install plotly)"]
    png_backend = None
    for name, traces in series.items():
        fig = go.Figure()
        for label, x, y in traces:
            if len(y) and not all(v != v for v in y):
                fig.add_trace(go.Scatter(x=list(x), y=list(y), name=label,
                                         mode="lines+markers" if len(y) < 50 else "lines"))
        if name == "loss":
            for ev in events:
                fig.add_vline(x=ev.step, line_dash="dot", line_color="gray",
                              annotation_text=ev.kind, annotation_font_size=9)
        fig.update_layout(title=name, xaxis_title="optimizer step", template="plotly_white")
        fig.write_html(folder / f"{name}.html", include_plotlyjs="cdn")
        png_backend = _png(fig, traces, folder / f"{name}.png", name, png_backend)
    if png_backend is None:
        notes.append("PNG figures skipped: no static image backend (kaleido or matplotlib)")
    return notes


def _png(fig, traces, path: Path, title: str, backend: str | None) -> str | None:
    """Write a PNG with kaleido when installed, else matplotlib (without pyplot, so a notebook's
    plotting backend is left alone); returns the backend that worked (or None)."""
    if backend in (None, "kaleido") and importlib.util.find_spec("kaleido") is not None:
        try:
            fig.write_image(path)
            return "kaleido"
        except Exception:
            pass
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    f = Figure(figsize=(7, 3.5))
    ax = f.subplots()
    for label, x, y in traces:
        if any(not (isinstance(v, float) and math.isnan(v)) for v in y):
            ax.plot(list(x), list(y), label=label, marker="o" if len(y) < 50 else None)
    ax.set_xlabel("optimizer step")
    ax.set_title(title)
    if ax.lines:
        ax.legend()
    f.tight_layout()
    f.savefig(path, dpi=100)
    return "matplotlib"
