"""HTML live view through display handles: VS Code, unknown frontends, no anywidget.

Two outputs are created once (``display(..., display_id=True)``) and then updated in place: the
progress panel (every ~0.2 s, plain HTML) and the plots as plotly JSON (every ~1 s, adaptive;
drawn by the frontend's plotly renderer, no widget support needed). At the end both are replaced
by the static snapshot (the widget view ends the same way).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hybridnb.live import snapshot
from hybridnb.live.base import LiveView


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
        self.panel = None
        self.figure = None

    def _panel_bundle(self) -> dict[str, str]:
        html = snapshot.progress_html(self.record, self.note)
        return {"text/html": html, "text/plain": "hybridnb: training…"}

    def _open(self, run: dict) -> None:
        self.panel = self._display(self._panel_bundle())
        self.figure = self._display(snapshot.plots_bundle(self.record))

    def _draw_progress(self) -> None:
        self.panel.update(self._panel_bundle(), raw=True)

    def _draw_plots(self) -> None:
        self.figure.update(snapshot.plots_bundle(self.record), raw=True)

    def _close(self, summary: dict) -> None:
        self.panel.update(snapshot.summary_bundle(self.record, summary, self.note), raw=True)
        self.figure.update(snapshot.figure_bundle(self.record), raw=True)
