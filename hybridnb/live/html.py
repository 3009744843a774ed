"""HTML live view through display handles: VS Code, unknown frontends, no anywidget.

Two outputs, created once and updated in place: the progress panel (plain HTML) and the plots
as plotly JSON (no widget support needed). At the end both are replaced by the static snapshot:
the plotly JSON, and the same panels as SVG (``panel_image``) for GitHub, nbviewer and
``nbconvert --to html``, so a saved notebook reads the same without a kernel or JavaScript.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from html import escape
from typing import Any

from hybridnb.live import summary as text
from hybridnb.live.base import LiveView
from hybridnb.live.figures import LIVE_POINTS, figure_dict

PLOTLY_MIME = "application/vnd.plotly.v1+json"


def progress_html(record, note: str = "") -> str:
    """The progress panel (the HTML and widget views): the header, the epoch and step bars, the
    status line and the latest events."""
    rec, spe = record, record.steps_per_epoch
    rows = [f"<div><b>hybridnb</b> · {escape(text.header(rec.run, note))}</div>",
            # epochs done (a count); the status line's "epoch 1/2" is an index, from 0
            _bar("epochs", rec.epochs_done, rec.epochs, " done"),
            _bar("step", spe if rec.at_epoch_end and spe else rec.step, spe),
            f'<div style="margin-top:2px">{escape(text.status(rec, memory=True))}</div>',
            _events(rec.events[-10:], ' style="color:#b00;margin:2px 0"')]
    return ('<div class="hybridnb-live" style="font-family:sans-serif;font-size:13px;'
            'line-height:1.4">' + "".join(rows) + "</div>")


def _events(events: list, style: str = "") -> str:
    items = "".join(f"<li>{escape(str(ev))}</li>" for ev in events)
    return f"<ul{style}>{items}</ul>" if items else ""


def _bar(label: str, value: int, total: int | None, suffix: str = "") -> str:
    pct = 100.0 * value / total if total else 0.0
    shown = (f"{value}/{total}" if total else f"{value}") + suffix
    return (f'<div style="display:flex;align-items:center;gap:6px">'
            f'<span style="width:3.5em">{label}</span>'
            f'<span style="display:inline-block;width:240px;height:10px;background:#eee;'
            f'border-radius:3px"><span class="hybridnb-bar" data-value="{value}" '
            f'data-max="{total or 0}" style="display:block;height:10px;width:{pct:.1f}%;'
            f'background:#1f77b4;border-radius:3px"></span></span>'
            f'<span>{shown}</span></div>')


def plots_bundle(record) -> dict[str, Any]:
    """The live plots for the HTML view: plotly JSON (JupyterLab, VS Code: bundled plotly.js),
    and for frontends without plotly's renderer (Colab) the same JSON drawn by plotly.js from
    its CDN, as plotly's own ``"cdn"`` HTML does (``plotly.io.to_html`` costs ~20x more)."""
    from plotly.offline import get_plotlyjs_version

    fig = figure_dict(record, max_points=LIVE_POINTS)
    data = json.dumps(fig).replace("</", "<\\/")  # no "</script>" inside the script
    html = (f'<script src="https://cdn.plot.ly/plotly-{get_plotlyjs_version()}.min.js"></script>'
            f'<div class="hybridnb-plots" style="height:{fig["layout"]["height"]}px"></div>'
            "<script>(function(){var d=document.currentScript.previousElementSibling,"
            f"f={data};Plotly.newPlot(d,f.data,f.layout,{{responsive:true}})}})()</script>")
    return {PLOTLY_MIME: fig, "text/html": html, "text/plain": "hybridnb plots"}


def show(obj: Any) -> Any:
    """Show ``obj`` (a raw mimebundle or a widget) and return its DisplayHandle."""
    from IPython.display import display

    return display(obj, raw=isinstance(obj, dict), display_id=True)


class HtmlView(LiveView):
    name = "html"

    def __init__(self, note: str = "", display: Callable[[Any], Any] | None = None,
                 **kwargs: Any):
        super().__init__(note, **kwargs)
        self._display = display or show

    def _panel_bundle(self) -> dict[str, str]:
        html = progress_html(self.record, self.note)
        return {"text/html": html, "text/plain": "hybridnb: training…"}

    def _open(self, run: dict) -> None:
        self.panel = self._display(self._panel_bundle())
        self.figure = self._display(plots_bundle(self.record))

    def _draw_progress(self) -> None:
        self.panel.update(self._panel_bundle(), raw=True)

    def _draw_plots(self) -> None:
        self.figure.update(plots_bundle(self.record), raw=True)

    def _close(self, summary: dict) -> None:
        from hybridnb.live import panel_image
        from hybridnb.live.static import save

        rec, head = self.record, text.header(self.record.run, self.note)
        para, events = text.paragraph(summary, rec), summary.get("events")
        html = ('<div class="hybridnb-summary" style="font-family:sans-serif;font-size:13px">'
                f"<div><b>hybridnb</b> · {escape(head)}</div><p>{escape(para)}</p>"
                + _events(rec.events if events is None else events) + "</div>")
        self.panel.update({"text/html": html, "text/plain": f"hybridnb · {head}\n{para}"}, raw=True)
        svg = save(panel_image.draw(rec), "svg").decode("utf-8")  # titled; same record, same bytes
        self.figure.update({PLOTLY_MIME: figure_dict(rec), "image/svg+xml": svg,
                            "text/plain": "hybridnb figure: loss, learning rate and memory"},
                           raw=True)
