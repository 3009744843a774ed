"""The live plots: their data as plain series (``panels``), drawn live with plotly.

Three panels: loss (each step's, and history's ``train_loss`` the Trainer sent at each epoch
end), learning rate, memory; ``panel_image`` draws them for static output. Long runs are
averaged down to ``max_points`` per series: a render costs the same after 100 steps as 100 000.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hybridnb.measure.memory import SERIES

GIB = 1024.0**3
LIVE_POINTS = 600  # per series while training (a panel is ~300 px wide): cheap to resend
SNAPSHOT_POINTS = 2000  # per series in the end snapshot and reports
PANELS = ("loss", "learning rate", "memory (GiB)")
XTITLES = ("step", "step", "seconds")  # each panel's x axis

#: (series key in the sampler, trace label, colour, dash, hidden by default)
MEMORY_TRACES = (
    ("gpu_allocated", "GPU allocated", "#1f77b4", None, False),
    ("gpu_reserved", "GPU reserved", "#17becf", None, False),
    ("gpu_peak", "GPU peak", "#9467bd", "dot", False),
    ("gpu_used", "GPU used (NVML)", "#d62728", None, False),
    ("gpu_total", "GPU total", "#d62728", "dash", True),
    ("mps_current", "MPS allocated", "#1f77b4", None, False),
    ("mps_driver", "MPS driver", "#17becf", None, False),
    ("rss", "process RSS", "#2ca02c", None, False),
    ("ram_used", "system RAM used", "#8c564b", None, False),
    ("ram_total", "system RAM total", "#8c564b", "dash", True),
)
assert all(key in SERIES for key, *_ in MEMORY_TRACES)


@dataclass
class Series:
    """One line (or set of markers) in one panel."""

    key: str
    name: str
    x: list[float]
    y: list[float | None]
    panel: int
    color: str
    mode: str = "lines"
    dash: str | None = None
    hidden: bool = False
    secondary: bool = False
    text: list[str] = field(default_factory=list)


def _clean(values: Sequence[float]) -> list[float | None]:
    """NaN/inf -> None (JSON has no NaN; plotly draws a gap)."""
    return [v if v is not None and math.isfinite(v) else None for v in values]


def downsample(xs: Sequence[float], ys: Sequence[float], max_points: int,
               ) -> tuple[list[float], list[float | None]]:
    """Average consecutive points into at most ``max_points`` buckets (x = the bucket's last x);
    short runs show every logged step."""
    n = len(xs)
    if n <= max_points:
        return list(xs), _clean(ys)
    import numpy as np

    k = math.ceil(n / max_points)
    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    finite = np.isfinite(y)
    starts = np.arange(0, n, k)
    edges = np.append(starts[1:] - 1, n - 1)
    sums = np.add.reduceat(np.where(finite, y, 0.0), starts)
    counts = np.add.reduceat(finite.astype(np.int64), starts)
    means = np.full(len(starts), np.nan)
    np.divide(sums, counts, out=means, where=counts > 0)  # an all-NaN bucket stays a gap
    return x[edges].tolist(), _clean(means.tolist())


def _points(rows: list[dict], key: str) -> tuple[list[int], list[float | None]]:
    """``key`` in each row that has it, as the Trainer sent it; x: the row's global step."""
    rows = [r for r in rows if r.get(key) is not None]
    return [int(r.get("global_step") or 0) for r in rows], _clean([float(r[key]) for r in rows])


def panels(record, max_points: int = SNAPSHOT_POINTS) -> list[Series]:
    """Every series to draw for ``record`` (a RunRecord)."""
    out: list[Series] = []
    x, y = downsample(record.steps, record.losses, max_points)
    out.append(Series("step_loss", "step loss", x, y, 0, "#aec7e8"))
    x, y = _points(record.epoch_ends, "train_loss")  # the Trainer's: history's train_loss
    out.append(Series("train_loss", "train loss (epoch)", x, y, 0, "#1f77b4", "lines+markers"))
    x, y = _points(record.val_rows, "val_loss")  # every validation: epoch ends and val_every
    out.append(Series("val_loss", "val loss", x, y, 0, "#ff7f0e", "lines+markers"))
    x, y = downsample(record.steps, record.lrs, max_points)
    out.append(Series("lr", "learning rate", x, y, 1, "#e377c2"))

    mem = record.memory()
    tx = mem.times
    for key, label, color, dash, hidden in MEMORY_TRACES:
        if key in mem.values:
            mx, my = downsample(tx, [v / GIB for v in mem.values[key]], max_points)
            out.append(Series(key, label, mx, my, 2, color, dash=dash, hidden=hidden))
    if "gpu_util" in mem.values:
        ux, uy = downsample(tx, mem.values["gpu_util"], max_points)
        out.append(Series("gpu_util", "GPU util %", ux, uy, 2, "#7f7f7f", dash="dot",
                          secondary=True))
    t0 = record.sampler.start_time if record.sampler is not None else record.start_time
    ex = [ev.time - t0 for ev in record.events]  # seconds, as the memory panel's x
    top = max((v for s in out if s.panel == 2 and not s.hidden and not s.secondary
               for v in s.y if v is not None), default=0.0)  # events mark the memory panel's top
    out.append(Series("events", "events", ex, [top] * len(ex), 2, "#d62728", mode="markers+text",
                      text=[ev.kind for ev in record.events]))
    return out


#: one x axis per panel; the memory panel's GPU utilisation on a right-hand axis (y4)
_AXES = (("x", "y"), ("x2", "y2"), ("x3", "y3"))
_DOMAINS = ((0.0, 0.28), (0.36, 0.64), (0.72, 1.0))


def _trace(s: Series) -> dict[str, Any]:
    x, y = _AXES[s.panel]
    t: dict[str, Any] = {"type": "scatter", "x": s.x, "y": s.y, "name": s.name, "meta": s.key,
                         "mode": s.mode, "xaxis": x, "yaxis": "y4" if s.secondary else y}
    if "lines" in s.mode:
        t["line"] = {"color": s.color, "dash": s.dash} if s.dash else {"color": s.color}
    if "markers" in s.mode:
        events = s.key == "events"
        t["marker"] = {"color": s.color, "symbol": "x" if events else "circle",
                       "size": 10 if events else 6}
    if s.text:
        t.update(text=s.text, textposition="bottom center", hovertext=s.text)
    if s.hidden:
        t["visible"] = "legendonly"
    return t


def figure_dict(record, max_points: int = SNAPSHOT_POINTS) -> dict[str, Any]:
    """The three panels as plotly JSON, built without plotly (cheap to resend every second)."""
    layout: dict[str, Any] = {
        "height": 320, "margin": {"l": 50, "r": 30, "t": 40, "b": 40},
        "legend": {"orientation": "h", "y": -0.18}, "uirevision": "hybridnb",
        "yaxis2": {"anchor": "x2", "exponentformat": "e"},
        "yaxis4": {"anchor": "x3", "overlaying": "y3", "side": "right", "range": [0, 100],
                   "showgrid": False, "title": {"text": "util %"}},
        "annotations": [{"text": name, "x": sum(d) / 2, "y": 1.0, "xref": "paper",
                         "yref": "paper", "xanchor": "center", "yanchor": "bottom",
                         "showarrow": False, "font": {"size": 14}}
                        for name, d in zip(PANELS, _DOMAINS, strict=True)]}
    for (x, y), title, domain in zip(_AXES, XTITLES, _DOMAINS, strict=True):
        layout["xaxis" + x[1:]] = {"domain": domain, "anchor": y, "title": {"text": title}}
        layout.setdefault("yaxis" + y[1:], {}).update(anchor=x)
    return {"data": [_trace(s) for s in panels(record, max_points)], "layout": layout}


def update_figure(fig, record, max_points: int = LIVE_POINTS) -> None:
    """Push the record's series into a FigureWidget in one batched message, as float numpy
    arrays: sent as binary buffers, ~5x cheaper than lists of Python floats."""
    import numpy as np

    by_key = {t.meta: t for t in fig.data}  # FigureWidget rewrites uids; meta is ours
    with fig.batch_update():
        for s in panels(record, max_points):
            t = by_key.get(s.key)
            if t is None:  # a source that appeared late (e.g. CUDA initialised after start)
                fig.add_trace(_trace(s))
                continue
            old = t.x if t.x is not None else ()
            if len(old) != len(s.x) or (s.x and old[-1] != s.x[-1]) or s.key == "events":
                t.x = np.asarray(s.x, dtype=float)
                t.y = np.asarray(s.y, dtype=float)  # None -> NaN
                if s.text:
                    t.text = t.hovertext = s.text
