"""A user's plotly figure (its dict) drawn with matplotlib: the image ``live/static.py`` adds.

Translates what plotly's JSON says rather than rendering plotly.js (kaleido would, but needs a
Chrome). Only what the notebooks and the common plotly express calls make: scatter/scattergl
(lines, markers; ``px.line``, ``px.scatter``), bar (grouped, overlaid, stacked, horizontal,
``base=``, text, a colour per bar, error bars; ``px.bar``) and histogram (overlaid ones share their
bins; ``px.histogram``); subplots (``make_subplots``), log axes, ranges and titles,
``add_hline``/``add_vline``, annotations (subplot titles), the title and the legend. Another
trace type is not drawn and the image says so in its corner. hybridnb's own figures (the
panels, the lr_find plot, compare()'s chart) are drawn by matplotlib directly, not through here.
"""

from __future__ import annotations

import base64
import re
from typing import Any

import numpy as np

DPI = 100  # plotly's px = matplotlib's pixels at this dpi
RC = {"font.size": 9, "axes.titlesize": 10}  # plotly's 12 px text at 100 dpi
DEFAULT_SIZE = (700, 450)  # plotly's default figure size in px
DEFAULT_MARGIN = {"l": 80, "r": 80, "t": 100, "b": 80}
PLOTLY_COLORWAY = ("#636efa", "#EF553B", "#00cc96", "#ab63fa", "#FFA15A", "#19d3f3", "#FF6692",
                   "#B6E880", "#FF97FF", "#FECB52")
DASHES = {"solid": "-", "dot": ":", "dash": "--", "longdash": "--", "dashdot": "-.",
          "longdashdot": "-."}
SYMBOLS = {"square": "s", "diamond": "D", "x": "x", "line-ns": "|"}


def _values(v: Any) -> np.ndarray | None:
    """A plotly data array (list, numpy array or plotly's base64 typed array) as numpy: numbers
    as float (None -> NaN), anything else as an object array of strings (categories)."""
    if v is None:
        return None
    if isinstance(v, dict) and "bdata" in v:
        a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        return a.reshape([int(s) for s in str(v["shape"]).split(",")]) if v.get("shape") else a
    a = np.asarray(v)
    if a.dtype.kind in "biufM":  # numbers, and datetime64 (matplotlib draws a time axis)
        return a
    try:
        return np.array([np.nan if e is None else e for e in a.ravel()],
                        dtype=float).reshape(a.shape)
    except (TypeError, ValueError):
        return np.array([str(e) for e in a.ravel()], dtype=object).reshape(a.shape)


def _color(c: Any, default: Any = None):
    """A plotly colour (CSS name, hex, ``rgb()``/``rgba()``) as a matplotlib colour."""
    if not isinstance(c, str):
        return default
    m = re.fullmatch(r"rgba?\(([^)]*)\)", c.replace(" ", ""))
    if m:
        parts = [float(p) for p in m.group(1).split(",")]
        return (*[p / 255 for p in parts[:3]], *parts[3:4])
    from matplotlib.colors import is_color_like

    return c if is_color_like(c) else default


def _text(s: Any) -> str:
    """Plotly's label HTML (<b>, <br>, <sup>) as plain text."""
    if isinstance(s, dict):
        s = s.get("text", "")
    s = re.sub(r"<br\s*/?>", "\n", "" if s is None else str(s), flags=re.I)
    return re.sub(r"<[^>]+>", "", s)


def _axis_name(ref: str, kind: str) -> str:
    """'x2' / 'x2 domain' -> 'xaxis2'."""
    return kind + "axis" + (ref.split()[0] if ref else kind)[1:]


def _pair(t: dict) -> tuple[str, str]:
    return _axis_name(t.get("xaxis", "x"), "x"), _axis_name(t.get("yaxis", "y"), "y")


def draw(fd: Any):
    """A ``matplotlib.figure.Figure`` (no pyplot) drawn from a plotly figure or its dict."""
    import matplotlib
    from matplotlib.figure import Figure

    fd = fd if isinstance(fd, dict) else fd.to_dict()
    layout = fd.get("layout") or {}
    colorway = layout.get("colorway") or ((layout.get("template") or {}).get("layout") or
                                          {}).get("colorway") or PLOTLY_COLORWAY
    shown = [t for t in (fd.get("data") or []) if t.get("visible", True) is True]
    traces = [t for t in shown if not (layout.get(_pair(t)[1]) or {}).get("overlaying")]
    pairs = list(dict.fromkeys(_pair(t) for t in traces))  # one Axes per subplot in use
    width = layout.get("width") or max(DEFAULT_SIZE[0], 320 * len({x for x, _ in pairs}))
    height = layout.get("height") or DEFAULT_SIZE[1]
    margin = {**DEFAULT_MARGIN, **{k: v for k, v in (layout.get("margin") or {}).items()
                                   if k in DEFAULT_MARGIN and v is not None}}
    box = (margin["l"] / width, margin["b"] / height, 1 - margin["r"] / width,
           1 - margin["t"] / height)  # the plotting area, in figure fractions

    def paper(x: float, y: float) -> tuple[float, float]:
        return box[0] + x * (box[2] - box[0]), box[1] + y * (box[3] - box[1])

    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI)
        axes = {}
        for xname, yname in pairs or [("xaxis", "yaxis")]:
            (x0, y0), (x1, y1) = (paper(a, b) for a, b in zip(
                (layout.get(xname) or {}).get("domain") or (0, 1),
                (layout.get(yname) or {}).get("domain") or (0, 1), strict=True))
            axes[(xname, yname)] = fig.add_axes([x0, y0, max(x1 - x0, 1e-3),
                                                 max(y1 - y0, 1e-3)])
        groups: dict[tuple[tuple[str, str], str], list[int]] = {}  # side by side per axes
        for i, t in enumerate(traces):
            groups.setdefault((_pair(t), t.get("type", "scatter")), []).append(i)
        skipped = {"secondary y axes"} if len(traces) < len(shown) else set()
        for i, t in enumerate(traces):
            kind = t.get("type", "scatter")
            drawer = _DRAWERS.get(kind)
            if drawer is None:
                skipped.add(f"{kind} traces")
                continue
            group = groups[(_pair(t), kind)]
            drawer(axes[_pair(t)], t, colorway[i % len(colorway)], layout,
                   (group.index(i), len(group), [traces[k] for k in group]))
        for (xname, yname), ax in axes.items():
            _style(ax, layout.get(xname) or {}, layout.get(yname) or {})
        skipped |= _shapes(axes, layout.get("shapes") or [])
        _annotations(fig, axes, layout, paper)
        title = _text(layout.get("title"))
        if title:
            fig.text(box[0], (box[3] + 1) / 2, title, fontsize=13, va="center")
        _legend(fig, axes, traces, layout, box)
        if skipped:
            fig.text(0.99, 0.01, f"not drawn in this image: {', '.join(sorted(skipped))}",
                     fontsize=7, color="#888", ha="right", va="bottom")
    return fig


def _style(ax, xa: dict, ya: dict) -> None:
    for axis, spec, letter in ((ax.xaxis, xa, "x"), (ax.yaxis, ya, "y")):
        if spec.get("type") == "log":
            from matplotlib.ticker import FuncFormatter, NullLocator

            getattr(ax, f"set_{letter}scale")("log")
            # plain "1e-05" labels (mathtext ones are the costliest part), no minor ticks
            axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
            axis.set_minor_locator(NullLocator())
        rng = spec.get("range")
        if rng and None not in rng[:2]:
            lo, hi = (10.0 ** r for r in rng[:2]) if spec.get("type") == "log" else rng[:2]
            getattr(ax, f"set_{letter}lim")(lo, hi)
        getattr(ax, f"set_{letter}label")(_text(spec.get("title")))
        if spec.get("showgrid", True):
            axis.grid(True, color="#dddddd", linewidth=0.8)
    ax.set_axisbelow(True)
    for spine in ax.spines.values():
        spine.set_color("#bbbbbb")
    ax.tick_params(colors="#444444", length=3)


def _label(t: dict) -> str | None:
    return None if t.get("showlegend") is False else _text(t.get("name")) or None


def _xy(t: dict) -> tuple[np.ndarray, np.ndarray]:
    x, y = _values(t.get("x")), _values(t.get("y"))
    if y is None:
        y = np.arange(len(x)) if x is not None and t.get("orientation") == "h" else np.array([])
    return (np.arange(len(y)) if x is None else x), y


def _scatter(ax, t: dict, color: str, layout: dict, slot) -> None:
    x, y = _xy(t)
    mode = t.get("mode") or ("lines+markers" if len(y) < 20 else "lines")
    line, marker = t.get("line") or {}, t.get("marker") or {}
    lcolor = _color(line.get("color"), color)
    if "lines" in mode:
        ax.plot(x, y, color=lcolor, linestyle=DASHES.get(line.get("dash") or "solid", "--"),
                linewidth=(line.get("width") or 2) * 0.75, alpha=t.get("opacity"),
                label=_label(t))
    if "markers" in mode:  # plotly's size: a diameter in px; matplotlib's: an area in pt^2
        size = marker.get("size") if isinstance(marker.get("size"), (int, float)) else 6
        ax.scatter(x, y, s=(size * 0.75) ** 2, color=_color(marker.get("color"), lcolor),
                   marker=SYMBOLS.get(str(marker.get("symbol")).split("-open")[0], "o"),
                   alpha=marker.get("opacity", t.get("opacity")), zorder=3,
                   label=None if "lines" in mode else _label(t))


def _positions(ax, cats: np.ndarray, axis: str) -> np.ndarray:
    """Categories -> 0, 1, 2 ... shared by every bar trace on ``ax`` (in first-seen order)."""
    order = ax.__dict__.setdefault(f"_hybridnb_{axis}_categories", [])
    order.extend(c for c in dict.fromkeys(cats) if c not in order)
    getattr(ax, f"set_{axis}ticks")(range(len(order)), order)
    return np.array([order.index(c) for c in cats], dtype=float)


def _bar(ax, t: dict, color: str, layout: dict, slot) -> None:
    x, y = _xy(t)
    horizontal = t.get("orientation") == "h"
    cats, vals = (y, x) if horizontal else (x, y)
    if not len(vals):
        return
    vals = vals.astype(float)
    pos = (_positions(ax, cats, "y" if horizontal else "x") if cats.dtype == object
           else cats.astype(float))
    mode = layout.get("barmode") or "group"
    k, n = slot[:2] if mode == "group" else (0, 1)
    step = float(np.min(np.diff(np.unique(pos)))) if len(np.unique(pos)) > 1 else 1.0
    width = 0.8 * step / n
    pos = pos - 0.4 * step + width * (k + 0.5)
    bottom = None
    if t.get("base") is not None:  # bars that start elsewhere than 0 (a timeline)
        bottom = np.broadcast_to(_values(t["base"]).astype(float), pos.shape)
    elif mode in ("stack", "relative"):
        stacks = ax.__dict__.setdefault("_hybridnb_stack", {})
        bottom = np.zeros(len(pos))
        for i, (p, v) in enumerate(zip(pos, vals, strict=True)):
            bottom[i] = stacks.get(p, 0.0)  # px puts one bar per row: rows stack too
            stacks[p] = bottom[i] + v
    mc = (t.get("marker") or {}).get("color")  # one colour, or one a bar
    c = [_color(v, color) for v in mc] if isinstance(mc, (list, tuple, np.ndarray)) \
        and len(mc) == len(pos) else _color(mc, color)
    kw = {"color": c, "label": _label(t), "alpha": t.get("opacity")}
    err = t.get("error_y") or {}
    plus, minus = _values(err.get("array")), _values(err.get("arrayminus"))
    if (plus is not None or minus is not None) and err.get("visible", True) and not horizontal:
        none = np.zeros(len(pos))  # plotly: symmetric unless an arrayminus is given
        up = plus if plus is not None else none
        down = up if err.get("symmetric", minus is None) else (minus if minus is not None else none)
        kw["yerr"] = np.vstack([down, up]).astype(float)
    bars = (ax.barh if horizontal else ax.bar)(pos, vals, width, bottom, **kw)
    text, where = t.get("text"), t.get("textposition") or "auto"
    if text is not None and where != "none":
        labels = [_text(v) for v in text] if not isinstance(text, str) else [text] * len(pos)
        ax.bar_label(bars, labels=labels[:len(pos)], fontsize=7,
                     label_type="center" if where in ("inside", "auto") else "edge")


def _histogram(ax, t: dict, color: str, layout: dict, slot) -> None:
    horizontal = t.get("y") is not None and t.get("x") is None
    vals = _values(t.get("y") if horizontal else t.get("x"))
    if vals is None or not len(vals):
        return
    kw = {"color": _color((t.get("marker") or {}).get("color"), color), "label": _label(t),
          "alpha": t.get("opacity") or (0.75 if slot[1] > 1 else None)}
    if vals.dtype == object:  # counts of categories
        cats, counts = np.unique(vals, return_counts=True)
        (ax.barh if horizontal else ax.bar)(_positions(ax, cats, "y" if horizontal else "x"),
                                            counts, 0.8, **kw)
        return
    nbins = t.get("nbinsy" if horizontal else "nbinsx")
    numeric = [v.astype(float) for v in (_values(o.get("y" if horizontal else "x"))
                                         for o in slot[2]) if v is not None and v.dtype != object]
    both = np.concatenate(numeric)  # one set of edges for the panel: overlaid bars line up
    bins = np.histogram_bin_edges(both[np.isfinite(both)], bins=nbins or "auto")
    ax.hist(vals[np.isfinite(vals)], bins=bins, edgecolor="white", linewidth=0.5,
            density=t.get("histnorm") in ("probability density", "density"),
            orientation="horizontal" if horizontal else "vertical", **kw)


_DRAWERS = {"scatter": _scatter, "scattergl": _scatter, "bar": _bar, "histogram": _histogram}


def _ref_axes(axes: dict, xref: str, yref: str):
    """The Axes a shape or annotation refers to (its x and y reference)."""
    xname, yname = _axis_name(xref, "x"), _axis_name(yref, "y")
    return axes.get((xname, yname)) or next(
        (ax for (x, y), ax in axes.items() if y == yname or x == xname), next(iter(axes.values())))


def _transform(ax, xref: str, yref: str):
    from matplotlib.transforms import blended_transform_factory

    return blended_transform_factory(*(ax.transData if "domain" not in ref and ref != "paper"
                                       else ax.transAxes for ref in (xref, yref)))


def _shapes(axes: dict, shapes: list[dict]) -> set[str]:
    """``add_hline``/``add_vline`` (lines across a panel: one end in data, one in domain
    coordinates; plotly's autorange takes in a line's data coordinates, so does this); returns
    the kinds of the other shapes, not drawn."""
    skipped = set()
    for sh in shapes:
        coords = [sh.get(k) for k in ("x0", "x1", "y0", "y1")]
        if sh.get("type", "line") != "line" or any(not isinstance(c, (int, float))
                                                   for c in coords):
            skipped.add(f"{sh.get('type', 'line')} shapes")
            continue
        xref, yref = str(sh.get("xref", "x")), str(sh.get("yref", "y"))
        ax = _ref_axes(axes, xref, yref)
        line = sh.get("line") or {}
        ax.plot(coords[:2], coords[2:], transform=_transform(ax, xref, yref), zorder=4,
                color=_color(line.get("color"), "#444444"),
                linestyle=DASHES.get(line.get("dash") or "solid", "--"),
                linewidth=(line.get("width") or 2) * 0.75,
                scalex="domain" not in xref and xref != "paper",
                scaley="domain" not in yref and yref != "paper")
    return skipped


def _annotations(fig, axes: dict, layout: dict, paper) -> None:
    for note in layout.get("annotations") or []:
        text, x, y = _text(note.get("text")), note.get("x"), note.get("y")
        if not text or not isinstance(x, (int, float)) or not isinstance(y, (int, float)):
            continue
        xref, yref = str(note.get("xref", "x")), str(note.get("yref", "y"))
        kw = {"ha": note.get("xanchor") if note.get("xanchor") in ("left", "right") else "center",
              "va": note.get("yanchor") if note.get("yanchor") in ("top", "bottom") else "center",
              "fontsize": ((note.get("font") or {}).get("size") or 12) * 0.75}
        if xref == "paper" and yref == "paper":  # subplot titles
            fig.text(*paper(x, y), text, **kw)
            continue
        ax = _ref_axes(axes, xref, yref)
        if "domain" not in xref and ax.get_xscale() == "log":
            x = 10.0 ** x
        if "domain" not in yref and ax.get_yscale() == "log":
            y = 10.0 ** y
        # clipped to its panel: one placed off the axes would stretch the whole image
        ax.text(x, y, text, transform=_transform(ax, xref, yref), clip_on=True, **kw)


def _legend(fig, axes: dict, traces: list[dict], layout: dict, box) -> None:
    entries: dict[str, Any] = {}  # matplotlib leaves out the unlabelled ("_child0") already
    for ax in axes.values():
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    shown = layout.get("showlegend")
    if not entries or shown is False or (shown is None and sum(
            t.get("showlegend") is not False for t in traces) < 2):
        return
    title = _text((layout.get("legend") or {}).get("title")) or None
    fig.legend(list(entries.values()), list(entries), loc="upper left", frameon=False,
               fontsize=8, title=title, bbox_to_anchor=(box[2] + 0.01, box[3]), alignment="left")
