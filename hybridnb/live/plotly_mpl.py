"""A plotly figure (its dict) drawn with matplotlib: the static image of ``live/static.py``.

Translates what plotly's JSON says rather than rendering plotly.js (kaleido needs a Chrome):
scatter/scattergl (lines, markers, text, dash, fill, colour scales), bar (grouped, stacked,
horizontal, ``base=``, text), histogram (overlaid ones share their bins), box (one per
category), heatmap, subplots (``layout.*axis*.domain``) and secondary y axes (``overlaying``),
log and date axes, ranges and titles, line and rectangle shapes (``add_hline``/``add_vline``/
``add_vrect``; data coordinates widen the axes as plotly's autorange does), annotations
(subplot titles), the title and the legend. A trace of another type is not drawn and the
image says so in its corner. Made with ``matplotlib.figure.Figure``, never pyplot.
"""

from __future__ import annotations

import base64
import re
from typing import Any

import numpy as np

DPI = 100  # plotly's px = matplotlib's pixels at this dpi
DEFAULT_SIZE = (700, 450)  # plotly's default figure size in px
DEFAULT_MARGIN = {"l": 80, "r": 80, "t": 100, "b": 80}
PLOTLY_COLORWAY = ("#636efa", "#EF553B", "#00cc96", "#ab63fa", "#FFA15A", "#19d3f3", "#FF6692",
                   "#B6E880", "#FF97FF", "#FECB52")
DASHES = {"solid": "-", "dot": ":", "dash": "--", "longdash": "--", "dashdot": "-.",
          "longdashdot": "-."}
SYMBOLS = {"circle": "o", "square": "s", "diamond": "D", "cross": "P", "x": "x",
           "triangle-up": "^", "triangle-down": "v", "triangle-left": "<", "triangle-right": ">",
           "star": "*", "pentagon": "p", "hexagon": "h", "star-triangle-up": "^", "line-ns": "|",
           "line-ew": "_", "y-up": "1", "y-down": "2"}
MAX_TEXT_LABELS = 200
RC = {"font.size": 9, "axes.titlesize": 10}  # plotly's 12 px text at 100 dpi
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}([ T]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?$")


def _values(v: Any) -> np.ndarray | None:
    """A plotly data array (list, numpy array or plotly's base64 typed array) as numpy; strings
    stay an object array (categories), None becomes NaN in numbers."""
    if v is None:
        return None
    if isinstance(v, dict) and "bdata" in v:
        a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        if v.get("shape"):
            a = a.reshape([int(s) for s in str(v["shape"]).split(",")])
        return a
    a = np.asarray(v)
    if a.dtype == object:
        try:
            return np.array([np.nan if e is None else e for e in a.ravel()],
                            dtype=float).reshape(a.shape)
        except (TypeError, ValueError):
            strings = [str(e) for e in a.ravel()]
            if strings and all(_DATE.match(e) for e in strings):
                try:  # ISO dates and times (plotly's JSON of datetime columns): a time axis
                    return np.array([e.replace(" ", "T") for e in strings],
                                    dtype="datetime64[ns]").reshape(a.shape)
                except ValueError:
                    pass
            return np.array(strings, dtype=object).reshape(a.shape)
    if a.dtype.kind in "US":
        return a.astype(object)
    return a


def _color(c: Any, default: str | None = None):
    """A plotly colour (CSS name, hex, ``rgb()``/``rgba()``) as a matplotlib colour."""
    if c is None or isinstance(c, (list, tuple, np.ndarray, dict)):
        return default
    s = str(c).strip()
    m = re.fullmatch(r"rgba?\(([^)]*)\)", s.replace(" ", ""))
    if m:
        parts = [float(p) for p in m.group(1).split(",")]
        rgb = [p / 255 for p in parts[:3]]
        return (*rgb, parts[3]) if len(parts) > 3 else tuple(rgb)
    from matplotlib.colors import is_color_like

    return s if is_color_like(s) else default


def _text(s: Any) -> str:
    """Plotly's label HTML (<b>, <br>, <sup>) as plain text."""
    if s is None:
        return ""
    if isinstance(s, dict):
        s = s.get("text", "")
    s = re.sub(r"<br\s*/?>", "\n", str(s), flags=re.I)
    return re.sub(r"<[^>]+>", "", s)


def _get(d: dict | None, *path, default=None):
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return default
        d = d[key]
    return d


def _axis_name(ref: str, kind: str) -> str:
    """'x2' / 'x2 domain' -> 'xaxis2'."""
    ref = ref.split()[0] if ref else kind
    return kind + "axis" + ref[1:]


class _Layout:
    """Where plotly puts its axes, in matplotlib figure fractions."""

    def __init__(self, layout: dict, template: dict, width: float, height: float):
        self.layout, self.template = layout, template
        margin = {**DEFAULT_MARGIN, **{k: v for k, v in (layout.get("margin") or {}).items()
                                       if k in DEFAULT_MARGIN and v is not None}}
        self.left = margin["l"] / width
        self.right = 1 - margin["r"] / width
        self.bottom = margin["b"] / height
        self.top = 1 - margin["t"] / height

    def axis(self, name: str) -> dict:
        return self.layout.get(name) or {}

    def paper(self, x: float, y: float) -> tuple[float, float]:
        return (self.left + x * (self.right - self.left),
                self.bottom + y * (self.top - self.bottom))

    def rect(self, xname: str, yname: str) -> list[float]:
        x0, x1 = self.axis(xname).get("domain") or (0, 1)
        y0, y1 = self.axis(yname).get("domain") or (0, 1)
        (fx0, fy0), (fx1, fy1) = self.paper(x0, y0), self.paper(x1, y1)
        return [fx0, fy0, max(fx1 - fx0, 1e-3), max(fy1 - fy0, 1e-3)]


def draw(fd: dict):
    """A ``matplotlib.figure.Figure`` (no pyplot) drawn from a plotly figure dict."""
    import matplotlib
    from matplotlib.figure import Figure

    layout = fd.get("layout") or {}
    template = _get(layout, "template", "layout", default={}) or {}
    traces = [t for t in (fd.get("data") or []) if t.get("visible", True) is True]
    xnames = {_axis_name(t.get("xaxis", "x"), "x") for t in traces}
    width = layout.get("width") or max(DEFAULT_SIZE[0], 320 * len(xnames))
    height = layout.get("height") or DEFAULT_SIZE[1]
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI)
        fig.patch.set_facecolor(_color(layout.get("paper_bgcolor"), "white"))
        geo = _Layout(layout, template, width, height)
        axes = _make_axes(fig, geo, traces)
        colorway = layout.get("colorway") or template.get("colorway") or PLOTLY_COLORWAY
        skipped: list[str] = []
        groups: dict[tuple[int, str], list[int]] = {}  # side-by-side slots per axes
        for i, t in enumerate(traces):
            ax = axes[(_axis_name(t.get("xaxis", "x"), "x"), _axis_name(t.get("yaxis", "y"), "y"))]
            groups.setdefault((id(ax), _GROUP.get(t.get("type", "scatter"), "")), []).append(i)
        _shared_bins(axes, traces)
        for i, t in enumerate(traces):
            key = (_axis_name(t.get("xaxis", "x"), "x"), _axis_name(t.get("yaxis", "y"), "y"))
            color = colorway[i % len(colorway)]
            kind = t.get("type", "scatter")
            drawer = _DRAWERS.get(kind)
            if drawer is None:
                skipped.append(kind)
                continue
            group = groups[(id(axes[key]), _GROUP.get(kind, ""))]
            drawer(axes[key], t, color, layout, (group.index(i), len(group)))
        for (xname, yname), ax in axes.items():
            _style_axes(ax, geo.axis(xname), geo.axis(yname), template, overlay=
                        bool(geo.axis(yname).get("overlaying")))
        _shapes(fig, geo, axes, layout.get("shapes") or [])
        _annotations(fig, geo, axes, layout.get("annotations") or [])
        title = _text(_get(layout, "title", "text") or (layout.get("title")
                                                         if isinstance(layout.get("title"), str)
                                                         else ""))
        if title:
            fig.text(geo.left, min(1.0, geo.top + (1 - geo.top) * 0.55), title, fontsize=13,
                     va="center", ha="left")
        _legend(fig, geo, axes, traces, layout)
        if skipped:
            fig.text(0.99, 0.01, "not drawn in this image: " + ", ".join(sorted(set(skipped)))
                     + " traces", fontsize=7, color="#888", ha="right", va="bottom")
    return fig


def _shared_bins(axes: dict, traces: list[dict]) -> None:
    """One set of bin edges per panel for its numeric histograms (plotly bins overlaid
    histograms alike, so their bars line up)."""
    found: dict[int, tuple[Any, list[np.ndarray], Any]] = {}
    for t in traces:
        if t.get("type") != "histogram":
            continue
        horizontal = t.get("y") is not None and t.get("x") is None
        vals = _values(t.get("y") if horizontal else t.get("x"))
        if vals is None or vals.dtype == object or not len(vals):
            continue
        ax = axes[(_axis_name(t.get("xaxis", "x"), "x"), _axis_name(t.get("yaxis", "y"), "y"))]
        _, chunks, nbins = found.setdefault(id(ax), (ax, [], None))
        vals = vals.astype(float)
        chunks.append(vals[np.isfinite(vals)])
        nbins = nbins or t.get("nbinsy" if horizontal else "nbinsx")
        found[id(ax)] = (ax, chunks, nbins)
    for ax, chunks, nbins in found.values():
        if len(chunks) > 1:
            ax.__dict__["_hybridnb_bins"] = np.histogram_bin_edges(np.concatenate(chunks),
                                                                   bins=nbins or "auto")


def _make_axes(fig, geo: _Layout, traces: list[dict]) -> dict[tuple[str, str], Any]:
    """One matplotlib Axes per (x axis, y axis) pair in use; overlaying y axes become twins."""
    pairs: list[tuple[str, str]] = []
    for t in traces:
        pair = (_axis_name(t.get("xaxis", "x"), "x"), _axis_name(t.get("yaxis", "y"), "y"))
        if pair not in pairs:
            pairs.append(pair)
    for name in sorted(k for k in geo.layout if re.fullmatch(r"yaxis\d*", k)):
        anchor = geo.axis(name).get("anchor") or "x"
        pair = (_axis_name(anchor if anchor.startswith("x") else "x", "x"), name)
        if pair not in pairs and not geo.axis(name).get("overlaying"):
            pairs.append(pair)  # an empty subplot still shows its frame and title
    if not pairs:
        pairs = [("xaxis", "yaxis")]
    axes: dict[tuple[str, str], Any] = {}
    for xname, yname in sorted(pairs, key=lambda p: bool(geo.axis(p[1]).get("overlaying"))):
        base = geo.axis(yname).get("overlaying")
        host = next((ax for (x, y), ax in axes.items() if y == _axis_name(base, "y")), None) \
            if base else None
        if host is not None:
            ax = host.twinx()
        else:
            ax = fig.add_axes(geo.rect(xname, yname))
        axes[(xname, yname)] = ax
    return axes


def _style_axes(ax, xa: dict, ya: dict, template: dict, overlay: bool = False) -> None:
    tx, ty = template.get("xaxis") or {}, template.get("yaxis") or {}
    for axis, spec, tspec, letter in ((ax.xaxis, xa, tx, "x"), (ax.yaxis, ya, ty, "y")):
        if overlay and letter == "x":
            continue
        if spec.get("type") == "log":
            from matplotlib.ticker import FuncFormatter, NullLocator

            (ax.set_xscale if letter == "x" else ax.set_yscale)("log")
            # plain "1e-05" labels: the default draws them with mathtext, the costliest part
            axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
            axis.set_minor_locator(NullLocator())  # plotly draws no minor ticks either
        rng = spec.get("range")
        if rng and None not in rng[:2]:
            lo, hi = rng[0], rng[1]
            if spec.get("type") == "log":
                lo, hi = 10.0 ** lo, 10.0 ** hi
            (ax.set_xlim if letter == "x" else ax.set_ylim)(lo, hi)
        if spec.get("autorange") == "reversed":
            (ax.invert_xaxis if letter == "x" else ax.invert_yaxis)()
        label = _text(_get(spec, "title", "text") or "")
        if label:
            (ax.set_xlabel if letter == "x" else ax.set_ylabel)(label)
        if spec.get("visible") is False or spec.get("showticklabels") is False:
            axis.set_ticklabels([])
        grid = spec.get("showgrid", tspec.get("showgrid", True))
        if grid and not overlay:
            axis.grid(True, color=_color(spec.get("gridcolor") or tspec.get("gridcolor"),
                                         "#dddddd"), linewidth=0.8)
    if not overlay:
        ax.set_facecolor(_color(template.get("plot_bgcolor"), "white"))
        ax.set_axisbelow(True)
    for spine in ax.spines.values():
        spine.set_color("#bbbbbb")
    ax.tick_params(colors="#444444", length=3)


def _legend_label(t: dict) -> str | None:
    if t.get("showlegend") is False:
        return None
    name = _text(t.get("name"))
    return name or None


def _xy(t: dict) -> tuple[np.ndarray, np.ndarray]:
    y = _values(t.get("y"))
    x = _values(t.get("x"))
    if y is None and x is not None and t.get("orientation") == "h":
        y = np.arange(len(x))
    if y is None:
        y = np.array([])
    if x is None:
        x0, dx = t.get("x0", 0), t.get("dx", 1)
        x = x0 + dx * np.arange(len(y))
    return x, y


def _scatter(ax, t: dict, color: str, layout: dict, slot: tuple[int, int]) -> None:
    x, y = _xy(t)
    if not len(y):
        return
    mode = t.get("mode") or ("lines+markers" if len(y) < 20 else "lines")
    line, marker = t.get("line") or {}, t.get("marker") or {}
    lcolor = _color(line.get("color"), color)
    mcolor = marker.get("color")
    label = _legend_label(t)
    alpha = t.get("opacity")
    drawn = False
    if "lines" in mode:
        style = "steps-post" if line.get("shape") == "hv" else "default"
        ax.plot(x, y, color=lcolor, linestyle=DASHES.get(line.get("dash") or "solid", "--"),
                linewidth=(line.get("width") or 2) * 0.75, drawstyle=style, alpha=alpha,
                label=label)
        drawn = True
        if t.get("fill") in ("tozeroy", "tonexty"):
            ax.fill_between(x, y, 0, color=_color(t.get("fillcolor"), lcolor), alpha=0.3)
    if "markers" in mode:
        values = _values(mcolor) if isinstance(mcolor, (list, tuple, np.ndarray, dict)) else None
        size = marker.get("size")
        sizes = _values(size) if isinstance(size, (list, tuple, np.ndarray, dict)) else None
        # plotly's size is a diameter in px; matplotlib's s an area in points^2 (1 px = 0.75 pt)
        if sizes is not None and sizes.dtype.kind in "fiu":
            s = (np.nan_to_num(sizes.astype(float), nan=6.0) * 0.75) ** 2
        else:
            s = ((size or 6) * 0.75) ** 2
        kw: dict[str, Any] = {"s": s, "marker": SYMBOLS.get(str(marker.get("symbol") or
                                                               "circle").split("-open")[0],
                                                           "o"),
                              "alpha": marker.get("opacity", alpha), "zorder": 3}
        if values is not None and values.dtype.kind in "fiu":
            kw.update(c=values, cmap="viridis")
        else:
            kw["color"] = _color(mcolor, lcolor if "lines" in mode else color)
        ax.scatter(x, y, label=None if drawn else label, **kw)
    if x.dtype.kind == "M":  # a time axis: short date labels, as plotly's
        from matplotlib.dates import AutoDateLocator, ConciseDateFormatter

        locator = AutoDateLocator()
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))
    if "text" in mode and t.get("text") is not None:
        texts = t["text"] if isinstance(t["text"], (list, tuple, np.ndarray)) else \
            [t["text"]] * len(y)
        for xi, yi, s in list(zip(x, y, texts, strict=False))[:MAX_TEXT_LABELS]:
            ax.annotate(_text(s), (xi, yi), fontsize=7, ha="center", va="top",
                        textcoords="offset points", xytext=(0, -4), color=lcolor)


def _positions(ax, cats: np.ndarray, axis: str = "x") -> np.ndarray:
    """Categories (strings) -> 0, 1, 2 ... shared by every bar or box trace on ``ax``."""
    order = ax.__dict__.setdefault(f"_hybridnb_{axis}_categories", [])
    for c in cats:
        if c not in order:
            order.append(c)
    (ax.set_xticks if axis == "x" else ax.set_yticks)(range(len(order)), order)
    index = {c: k for k, c in enumerate(order)}
    return np.array([index[c] for c in cats], dtype=float)


def _bar(ax, t: dict, color: str, layout: dict, slot: tuple[int, int]) -> None:
    x, y = _xy(t)
    horizontal = t.get("orientation") == "h"
    cats, vals = (y, x) if horizontal else (x, y)
    if not len(vals):
        return
    pos = (_positions(ax, cats, "y" if horizontal else "x") if cats.dtype == object
           else cats.astype(float))
    mode = layout.get("barmode") or "group"
    k, n = slot if mode == "group" else (0, 1)
    step = float(np.min(np.diff(np.unique(pos)))) if len(np.unique(pos)) > 1 else 1.0
    width = 0.8 * step / n
    pos = pos - 0.4 * step + width * (k + 0.5)
    bottom = None
    base = t.get("base")
    if base is not None:  # bars that start elsewhere than 0 (a timeline, a waterfall)
        b = _values(base) if isinstance(base, (list, tuple, np.ndarray, dict)) else \
            np.full(len(pos), float(base))
        bottom = b.astype(float)
    elif mode in ("stack", "relative"):
        stacks = ax.__dict__.setdefault("_hybridnb_stack", {})
        bottom = np.zeros(len(pos))
        for k_, (p, v) in enumerate(zip(pos, vals.astype(float), strict=True)):
            bottom[k_] = stacks.get(p, 0.0)  # px puts one bar per row: rows stack too
            stacks[p] = bottom[k_] + v
    mc = _get(t, "marker", "color")
    if isinstance(mc, (list, tuple, np.ndarray)) and len(mc) == len(pos):
        c = [_color(v, color) for v in mc]
    else:
        c = _color(mc, color)
    kw = {"color": c, "label": _legend_label(t), "alpha": t.get("opacity")}
    if horizontal:
        bars = ax.barh(pos, vals.astype(float), height=width, left=bottom, **kw)
    else:
        bars = ax.bar(pos, vals.astype(float), width=width, bottom=bottom, **kw)
    text, where = t.get("text"), t.get("textposition") or "auto"
    if text is not None and where != "none":
        labels = [_text(v) for v in text] if isinstance(text, (list, tuple, np.ndarray)) \
            else [_text(text)] * len(pos)
        ax.bar_label(bars, labels=labels[:len(pos)], fontsize=7,
                     label_type="center" if where in ("inside", "auto") else "edge")


def _histogram(ax, t: dict, color: str, layout: dict, slot: tuple[int, int]) -> None:
    horizontal = t.get("y") is not None and t.get("x") is None
    vals = _values(t.get("y") if horizontal else t.get("x"))
    if vals is None or not len(vals):
        return
    c = _color(_get(t, "marker", "color"), color)
    alpha = t.get("opacity") or (0.75 if slot[1] > 1 else None)
    label = _legend_label(t)
    if vals.dtype == object:
        cats, counts = np.unique(vals.astype(str), return_counts=True)
        pos = _positions(ax, cats.astype(object), "y" if horizontal else "x")
        (ax.barh if horizontal else ax.bar)(pos, counts, 0.8, color=c, alpha=alpha, label=label)
        return
    vals = vals[np.isfinite(vals.astype(float))]
    bins = ax.__dict__.get("_hybridnb_bins")  # shared by the panel's histograms, as plotly's
    if bins is None:
        bins = t.get("nbinsy" if horizontal else "nbinsx") or "auto"
    density = t.get("histnorm") in ("probability density", "density")
    ax.hist(vals, bins=bins, color=c, alpha=alpha, label=label, density=density,
            orientation="horizontal" if horizontal else "vertical", edgecolor="white",
            linewidth=0.5)


def _box(ax, t: dict, color: str, layout: dict, slot: tuple[int, int]) -> None:
    horizontal = t.get("orientation") == "h"
    vals = _values(t.get("x") if horizontal else t.get("y"))
    if vals is None or not len(vals):
        return
    vals = vals.astype(float)
    cats = _values(t.get("y") if horizontal else t.get("x"))
    if cats is None or cats.dtype != object or len(cats) != len(vals):
        cats = np.array([_text(t.get("name")) or f"trace {slot[0]}"] * len(vals), dtype=object)
    names = list(dict.fromkeys(cats))  # px.box: one trace, a box per category
    pos = _positions(ax, np.array(names, dtype=object), axis="y" if horizontal else "x")
    n = slot[1]
    pos = pos - 0.4 + 0.8 / n * (slot[0] + 0.5)
    data = [vals[(cats == c) & np.isfinite(vals)] for c in names]
    kw: dict[str, Any] = {}
    if horizontal:  # matplotlib >= 3.10 names it orientation=; vert= is deprecated there
        import matplotlib

        newer = tuple(int(p) for p in matplotlib.__version__.split(".")[:2]) >= (3, 10)
        kw = {"orientation": "horizontal"} if newer else {"vert": False}
    box = ax.boxplot(data, positions=pos, widths=0.6 / n, patch_artist=True,
                     manage_ticks=False, **kw)
    for patch in box["boxes"]:
        patch.set_facecolor(_color(_get(t, "marker", "color"), color))
        patch.set_alpha(0.6)
        patch.set_label(None)
    box["boxes"][0].set_label(_legend_label(t))


def _heatmap(ax, t: dict, color: str, layout: dict, slot: tuple[int, int]) -> None:
    z = _values(t.get("z"))
    if z is None or z.ndim != 2:
        return
    z = z.astype(float)
    x, y = _values(t.get("x")), _values(t.get("y"))
    x = np.arange(z.shape[1]) if x is None or x.dtype == object else x.astype(float)
    y = np.arange(z.shape[0]) if y is None or y.dtype == object else y.astype(float)
    mesh = ax.pcolormesh(x, y, z, shading="nearest", cmap="viridis")
    ax.figure.colorbar(mesh, ax=ax, fraction=0.05, pad=0.02)


_GROUP = {"bar": "bars", "histogram": "bars", "box": "boxes"}
_DRAWERS = {"scatter": _scatter, "scattergl": _scatter, "bar": _bar, "histogram": _histogram,
            "box": _box, "heatmap": _heatmap}


def _ref_axes(axes: dict, xref: str, yref: str):
    """The matplotlib Axes a shape or annotation refers to (its x and y reference)."""
    xname, yname = _axis_name(xref or "x", "x"), _axis_name(yref or "y", "y")
    for (x, y), ax in axes.items():
        if y == yname and (x == xname or xref == "paper"):
            return ax
    for (x, _y), ax in axes.items():
        if x == xname:
            return ax
    return next(iter(axes.values()))


def _is_data(ref: str) -> bool:
    """A shape or annotation coordinate in data units (not 'x domain' or 'paper')."""
    return "domain" not in ref and ref != "paper"


def _transform(ax, xref: str, yref: str):
    from matplotlib.transforms import blended_transform_factory

    xt = ax.transAxes if ("domain" in xref or xref == "paper") else ax.transData
    yt = ax.transAxes if ("domain" in yref or yref == "paper") else ax.transData
    return blended_transform_factory(xt, yt)


def _shapes(fig, geo: _Layout, axes: dict, shapes: list[dict]) -> None:
    from matplotlib.patches import Rectangle

    for sh in shapes:
        if sh.get("visible") is False or sh.get("type", "line") not in ("line", "rect"):
            continue
        xref, yref = str(sh.get("xref", "x")), str(sh.get("yref", "y"))
        ax = _ref_axes(axes, xref, yref)
        tr = _transform(ax, xref, yref)
        coords = [sh.get(k) for k in ("x0", "x1", "y0", "y1")]
        if any(c is None or isinstance(c, str) for c in coords):
            continue
        x0, x1, y0, y1 = (float(c) for c in coords)
        line = sh.get("line") or {}
        color = _color(line.get("color"), "#444444")
        style = DASHES.get(line.get("dash") or "solid", "--")
        width = (line.get("width") or 2) * 0.75
        if sh.get("type", "line") == "line":
            # plotly's autorange takes in a shape's data coordinates, not its domain ones
            ax.plot([x0, x1], [y0, y1], transform=tr, color=color, linestyle=style,
                    linewidth=width, scalex=_is_data(xref), scaley=_is_data(yref), zorder=4)
        else:
            ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, transform=tr,
                                   facecolor=_color(sh.get("fillcolor"), "#888888"),
                                   alpha=sh.get("opacity", 0.3), edgecolor="none", zorder=1))
            if _is_data(xref):
                ax.update_datalim([(x0, 0), (x1, 0)], updatey=False)
            if _is_data(yref):
                ax.update_datalim([(0, y0), (0, y1)], updatex=False)
            ax.autoscale_view()


def _annotations(fig, geo: _Layout, axes: dict, notes: list[dict]) -> None:
    va = {"top": "top", "bottom": "bottom", "middle": "center"}
    ha = {"left": "left", "right": "right", "center": "center"}
    for note in notes:
        text = _text(note.get("text"))
        x, y = note.get("x"), note.get("y")
        if not text or x is None or y is None or isinstance(x, str) or isinstance(y, str):
            continue
        xref, yref = str(note.get("xref", "x")), str(note.get("yref", "y"))
        kw = {"ha": ha.get(note.get("xanchor") or "center", "center"),
              "va": va.get(note.get("yanchor") or "middle", "center"),
              "fontsize": (_get(note, "font", "size") or 12) * 0.75}
        if xref == "paper" and yref == "paper":
            fx, fy = geo.paper(float(x), float(y))
            fig.text(fx, fy, text, **kw)
        else:
            ax = _ref_axes(axes, xref, yref)
            xa = geo.axis(_axis_name(xref, "x"))
            ya = geo.axis(_axis_name(yref, "y"))
            xv = 10.0 ** x if xa.get("type") == "log" and "domain" not in xref else x
            yv = 10.0 ** y if ya.get("type") == "log" and "domain" not in yref else y
            # clipped to its panel: one placed off the axes would stretch the whole image
            ax.text(xv, yv, text, transform=_transform(ax, xref, yref), clip_on=True, **kw)


def _legend(fig, geo: _Layout, axes: dict, traces: list[dict], layout: dict) -> None:
    handles, labels = [], []
    for ax in axes.values():
        h, lab = ax.get_legend_handles_labels()
        for hh, ll in zip(h, lab, strict=True):
            if ll and not ll.startswith("_") and ll not in labels:
                handles.append(hh)
                labels.append(ll)
    shown = layout.get("showlegend")
    if not handles or shown is False or (shown is None and len(
            [t for t in traces if t.get("showlegend") is not False]) < 2):
        return
    spec = layout.get("legend") or {}
    title = _text(_get(spec, "title", "text")) or None  # px: the colour column's name
    if spec.get("orientation") == "h":
        y = spec.get("y", -0.1)
        _, fy = geo.paper(0.5, float(y if isinstance(y, (int, float)) else -0.1))
        fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, min(fy, geo.bottom)),
                   ncol=min(len(labels), 5), frameon=False, fontsize=8, title=title)
    else:
        fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(geo.right + 0.01, geo.top),
                   frameon=False, fontsize=8, title=title, alignment="left")
