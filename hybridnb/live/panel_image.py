"""The live plots' three panels (``figures.panels``) drawn with matplotlib (never pyplot), not
translated from plotly: the end snapshot's image and ``trainer.report()``'s ``figures.png``."""

from __future__ import annotations

import math

from hybridnb.live.figures import PANELS, SNAPSHOT_POINTS, XTITLES, panels
from hybridnb.live.static import RC


def draw(record, max_points: int = SNAPSHOT_POINTS):
    """A ``matplotlib.figure.Figure`` of the record's loss, learning-rate and memory panels."""
    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(9.6, 3.6), dpi=100, layout="constrained")
        fig.set_label("hybridnb: loss, learning rate, memory")  # the SVG's title
        axes = fig.subplots(1, 3)
        util = None
        for s in panels(record, max_points):
            ax = axes[s.panel]
            if s.hidden or not s.x:
                continue
            y = [math.nan if v is None else v for v in s.y]
            if s.key == "events":
                for x, label in zip(s.x, s.text, strict=True):
                    ax.axvline(x, color=s.color, linestyle=":", linewidth=1)
                    ax.annotate(label, (x, 1), xycoords=("data", "axes fraction"),
                                xytext=(2, -2), textcoords="offset points", va="top",
                                fontsize=7, color=s.color)
                continue
            if s.secondary:
                util = util or ax.twinx()
                ax = util
            ax.plot(s.x, y, color=s.color, linestyle="--" if s.dash else "-", linewidth=1.2,
                    marker="o" if "markers" in s.mode else None, markersize=3, label=s.name)
        for ax, title, xlabel in zip(axes, PANELS, XTITLES, strict=True):
            ax.set_title(title)
            ax.set_xlabel(xlabel)
            ax.grid(color="#e5e5e5", linewidth=0.8)
            handles = [h for a in (ax, util) if a is not None and (a is ax or ax is axes[2])
                       for h in a.get_legend_handles_labels()[0]]
            if handles:
                ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.2),
                          ncol=2, frameon=False, fontsize=7)
            else:
                ax.text(0.5, 0.5, "no data yet", transform=ax.transAxes, ha="center",
                        color="#888888")
        axes[1].ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
        if util is not None:
            util.set_ylim(0, 100)
            util.set_ylabel("util %")
    return fig

