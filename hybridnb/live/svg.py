"""The three panels drawn as one static SVG: no JavaScript, no kernel, no network.

Used for the HTML renderer's live plots (VS Code, unknown frontends) and for the end-of-run
snapshot, which must read the same on GitHub, in nbviewer and in an exported HTML file.
Hand-written rather than drawn by ``live/static.py``'s matplotlib translation (which makes the
SVG of every other figure): it is one to two orders of magnitude cheaper for these panels, and
the HTML view redraws them about once a second (bench/results/figures-latest.md).
"""

from __future__ import annotations

import math
from html import escape

from hybridnb.live.figures import PANELS, Series

PANEL_W, PANEL_H = 300, 200
PAD_L, PAD_R, PAD_T, PAD_B = 52, 12, 24, 30
LEGEND_LINE = 14
MAX_SVG_POINTS = 400


def _ticks(lo: float, hi: float) -> list[float]:
    if hi <= lo:
        return [lo]
    return [lo, (lo + hi) / 2, hi]


def _label(v: float, span: float = 0.0) -> str:
    if abs(v) <= span * 1e-3:  # 1.5e-04 on a 0..1.3 axis reads as 0
        return "0"
    a = abs(v)
    if a != 0 and (a < 1e-2 or a >= 1e4):
        return f"{v:.1e}"
    return f"{v:.3g}"


def _thin(xs: list[float], ys: list[float | None]) -> tuple[list[float], list[float | None]]:
    if len(xs) <= MAX_SVG_POINTS:
        return xs, ys
    step = math.ceil(len(xs) / MAX_SVG_POINTS)
    idx = list(range(0, len(xs), step))
    if idx[-1] != len(xs) - 1:
        idx.append(len(xs) - 1)
    return [xs[i] for i in idx], [ys[i] for i in idx]


def _panel(series: list[Series], title: str, ox: float) -> list[str]:
    shown = [s for s in series if not s.hidden and not s.secondary]
    xs = [x for s in shown for x in s.x]
    ys = [y for s in shown for y in s.y if y is not None]
    out = [f'<text x="{ox + PAD_L}" y="15" font-size="12" font-weight="bold">{escape(title)}</text>']
    x0, y0 = ox + PAD_L, PAD_T
    w, h = PANEL_W - PAD_L - PAD_R, PANEL_H - PAD_T - PAD_B
    out.append(f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#ccc"/>')
    if not xs or not ys:
        out.append(f'<text x="{x0 + w / 2}" y="{y0 + h / 2}" font-size="11" fill="#888" '
                   f'text-anchor="middle">no data yet</text>')
        return out
    xlo, xhi = min(xs), max(xs)
    ylo, yhi = min(ys), max(ys)
    if yhi == ylo:
        ylo, yhi = ylo - (abs(ylo) * 0.1 or 1), yhi + (abs(yhi) * 0.1 or 1)
    if xhi == xlo:
        xlo, xhi = xlo - 1, xhi + 1

    def px(x: float) -> float:
        return x0 + (x - xlo) / (xhi - xlo) * w

    def py(y: float) -> float:
        return y0 + h - (y - ylo) / (yhi - ylo) * h

    for t in _ticks(ylo, yhi):
        out.append(f'<text x="{x0 - 4}" y="{py(t) + 4:.1f}" font-size="10" '
                   f'text-anchor="end">{_label(t, yhi - ylo)}</text>')
    for t in _ticks(xlo, xhi):
        out.append(f'<text x="{px(t):.1f}" y="{y0 + h + 13}" font-size="10" '
                   f'text-anchor="middle">{_label(t, xhi - xlo)}</text>')
    for s in shown:
        sx, sy = _thin(s.x, s.y)
        dash = ' stroke-dasharray="3,3"' if s.dash else ""
        if "lines" in s.mode:
            run: list[str] = []
            for x, y in zip(sx, sy, strict=True):
                if y is None:
                    if len(run) > 1:
                        out.append(_polyline(run, s.color, dash))
                    run = []
                else:
                    run.append(f"{px(x):.1f},{py(y):.1f}")
            if len(run) > 1:
                out.append(_polyline(run, s.color, dash))
            elif len(run) == 1:
                cx, cy = run[0].split(",")
                out.append(f'<circle cx="{cx}" cy="{cy}" r="2" fill="{s.color}"/>')
        if "markers" in s.mode:
            for i, (x, y) in enumerate(zip(sx, sy, strict=True)):
                if y is None:
                    continue
                if s.key == "events":
                    label = escape(s.text[i]) if i < len(s.text) else ""
                    out.append(f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{y0}" '
                               f'y2="{y0 + h}" stroke="{s.color}" stroke-dasharray="2,2"/>'
                               f'<text x="{px(x) + 2:.1f}" y="{y0 + 10}" font-size="9" '
                               f'fill="{s.color}">{label}</text>')
                else:
                    out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" '
                               f'fill="{s.color}"/>')
    legend = [s for s in shown if s.key != "events" and s.y]
    for i, s in enumerate(legend):
        ly = PANEL_H + 4 + i * LEGEND_LINE
        out.append(f'<line x1="{x0}" x2="{x0 + 16}" y1="{ly}" y2="{ly}" stroke="{s.color}" '
                   f'stroke-width="2"/><text x="{x0 + 20}" y="{ly + 4}" font-size="10">'
                   f'{escape(s.name)}</text>')
    return out


def _polyline(points: list[str], color: str, dash: str) -> str:
    return (f'<polyline points="{" ".join(points)}" fill="none" stroke="{color}" '
            f'stroke-width="1.5"{dash}/>')


def render(series: list[Series], title: str = "") -> str:
    """One SVG with the loss, learning-rate and memory panels side by side."""
    n_legend = max((sum(1 for s in series if s.panel == p and not s.hidden and not s.secondary
                        and s.key != "events" and s.y) for p in range(3)), default=0)
    height = PANEL_H + 8 + n_legend * LEGEND_LINE
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{3 * PANEL_W}" '
             f'height="{height}" viewBox="0 0 {3 * PANEL_W} {height}" '
             f'font-family="sans-serif" role="img">']
    if title:
        parts.append(f"<title>{escape(title)}</title>")
    parts.append(f'<rect width="{3 * PANEL_W}" height="{height}" fill="white"/>')
    for p, name in enumerate(PANELS):
        parts.extend(_panel([s for s in series if s.panel == p], name, p * PANEL_W))
    parts.append("</svg>")
    return "".join(parts)
