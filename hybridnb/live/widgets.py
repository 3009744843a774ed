"""Widget live view for JupyterLab / Notebook 7 / Colab (ipywidgets 7 or 8): the HTML view's
progress panel (``html.progress_html``) with a Stop button below it, then one plotly
FigureWidget with the loss, learning rate and memory panels.

Only the main thread (the training loop, through ``update``) changes widgets; the Stop button's
handler, which may run on a kernel subshell thread, only sets ``stop_requested``.

At the end the two outputs are *replaced* (through their display handles) by the static snapshot
and every widget is closed, so the saved notebook holds no widget views and no widget state.
"""

from __future__ import annotations

import contextlib
from typing import Any

from hybridnb.live import figures, panel_image
from hybridnb.live.base import Throttle
from hybridnb.live.clicks import ClickRoute, route_clicks
from hybridnb.live.html import HtmlView, progress_html


class WidgetView(HtmlView):
    name = "widgets"

    def __init__(self, note: str = "", **kwargs: Any):
        super().__init__(note, **kwargs)
        self.clicks: ClickRoute = ClickRoute()
        self.poller = Throttle(0.25, budget=0.003, clock=self.clock)
        self._widgets: list[Any] = []

    def _open(self, run: dict) -> None:
        import ipywidgets as W

        self.progress = W.HTML(progress_html(self.record, self.note))
        self.stop_button = W.Button(
            description="Stop", icon="stop", button_style="danger", layout=W.Layout(width="110px"),
            tooltip="Stop after the current step (checkpoint and history are kept)")
        self.stop_button.add_class("hybridnb-stop")
        self.box = W.VBox([self.progress, self.stop_button])
        self.fig = panel_image.make_figure(self.record, widget=True, max_points=figures.LIVE_POINTS)
        self.plots_box = W.VBox([self.fig], layout=W.Layout(width="100%"))
        self.plots_box.add_class("hybridnb-live-plots")
        self._widgets = [self.progress, self.stop_button, self.box, self.fig, self.plots_box]
        self.panel = self._display(self.box)
        self.figure = self._display(self.plots_box)
        self.stop_button.on_click(self._on_stop)
        self.clicks = route_clicks(self.stop_button)
        if self.clicks.mode == "none":
            self.stop_button.disabled = True
            self.stop_button.tooltip = self.clicks.note

    def _on_stop(self, _button: Any = None) -> None:
        # May run on a kernel subshell thread: set the flag only, never touch widgets here.
        self.stop_requested = True

    def _draw_progress(self) -> None:
        self.progress.value = progress_html(self.record, self.note)
        if self.stop_requested and self.stop_button.description != "Stopping…":
            self.stop_button.description = "Stopping…"
            self.stop_button.disabled = True

    def _draw_plots(self) -> None:
        figures.update_figure(self.fig, self.record)

    def _poll(self, now: float) -> None:
        if self.clicks.mode == "ui_poll" and self.poller.due(now):
            started = self.clock()
            self._safe(self.clicks.poll)
            self.poller.done(started)

    def _close(self, summary: dict) -> None:
        self._draw_epoch_end()
        super()._close(summary)

    def _release(self) -> None:
        for w in self._widgets:
            with contextlib.suppress(Exception):  # broad: a comm already gone; the run is over
                w.close()
        self._widgets = []
        self.clicks.close()
