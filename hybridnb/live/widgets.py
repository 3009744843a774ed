"""Widget live view for JupyterLab / Notebook 7 / Colab (ipywidgets 7 or 8): ipywidgets bars + a plotly FigureWidget.

Shown while training: a header (model, device, precision, quick mode), epoch and step bars,
a status line (loss, LR, samples/s, elapsed/remaining, memory), recovery events and a Stop
button; below, one FigureWidget with loss, learning rate and memory panels. Only the main thread
(the training loop, through ``update``) changes widgets; the Stop button's handler, which may run
on a kernel subshell thread, only sets ``stop_requested``.

At the end the two outputs are *replaced* (through their display handles) by the static snapshot
and every widget is closed, so the saved notebook holds no widget views and no widget state.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape
from typing import Any

from hybridnb.events import Event
from hybridnb.live import figures, snapshot
from hybridnb.live import summary as text
from hybridnb.live.base import LiveView
from hybridnb.live.clicks import ClickRoute, route_clicks
from hybridnb.live.throttle import Throttle


def _display_with_handle(obj: Any) -> Any:
    """Show ``obj`` and return its DisplayHandle (``update(bundle, raw=True)`` replaces it)."""
    from IPython.display import display

    return display(obj, display_id=True)


STOP_TOOLTIP = "Stop after the current step (checkpoint and history are kept)"


class WidgetView(LiveView):
    name = "widgets"
    poll_interval = 0.25

    def __init__(self, note: str = "", display: Callable[[Any], Any] | None = None,
                 **kwargs: Any):
        super().__init__(note, **kwargs)
        self._display = display or _display_with_handle
        self.clicks: ClickRoute = ClickRoute()
        self.poller = Throttle(self.poll_interval, budget=0.003, clock=self.clock)
        self._widgets: list[Any] = []
        self._stop_shown = False

    # ------------------------------------------------------------------ build
    def _open(self, run: dict) -> None:
        import ipywidgets as W

        rec = self.record
        spe = rec.steps_per_epoch
        self.header = W.HTML(f"<b>hybridnb</b> · {escape(text.header(run, self.note))}")
        # epochs done (a count); the status line names the epoch counted from 0, as history
        self.epoch_bar = W.IntProgress(value=0, min=0, max=rec.epochs, description="epochs",
                                       layout=W.Layout(width="420px"))
        self.epoch_label = W.Label(f"0/{rec.epochs} done")
        self.step_bar = W.IntProgress(value=0, min=0, max=spe or 1, description="step",
                                      layout=W.Layout(width="420px"))
        self.step_label = W.Label(f"0/{spe}" if spe else "0")
        self.stats = W.HTML("starting…")
        self.events_html = W.HTML("")
        self.stop_button = W.Button(description="Stop", icon="stop", button_style="danger",
                                    tooltip=STOP_TOOLTIP, layout=W.Layout(width="110px"))
        self.stop_button.add_class("hybridnb-stop")
        self.box = W.VBox([
            self.header,
            W.HBox([self.epoch_bar, self.epoch_label]),
            W.HBox([self.step_bar, self.step_label]),
            self.stats,
            self.stop_button,
            self.events_html,
        ])
        self.box.add_class("hybridnb-live")
        self.fig = figures.make_figure(rec, widget=True, max_points=figures.LIVE_POINTS)
        self.plots_box = W.VBox([self.fig], layout=W.Layout(width="100%"))
        self.plots_box.add_class("hybridnb-live-plots")
        self._widgets = [self.plots_box, self.header, self.epoch_bar, self.epoch_label, self.step_bar,
                         self.step_label, self.stats, self.events_html, self.stop_button,
                         *self.box.children[1].children, *self.box.children[2].children,
                         self.box.children[1], self.box.children[2], self.box, self.fig]
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

    # ------------------------------------------------------------------ draw
    def _draw_progress(self) -> None:
        rec = self.record
        spe = rec.steps_per_epoch
        done = rec.epochs_done
        self.epoch_bar.value = min(done, rec.epochs)
        self.epoch_label.value = f"{done}/{rec.epochs} done"
        if spe:
            step = spe if rec.at_epoch_end else min(rec.step, spe)
            if self.step_bar.max != spe:
                self.step_bar.max = spe
            self.step_bar.value = step
            self.step_label.value = f"{step}/{spe}"
        else:
            self.step_label.value = str(rec.step)
        memory = rec.sampler.latest() if rec.sampler is not None else {}
        self.stats.value = escape(text.status(rec, memory))
        if self.stop_requested and not self._stop_shown:
            self._stop_shown = True
            self.stop_button.description = "Stopping…"
            self.stop_button.disabled = True

    def _draw_plots(self) -> None:
        figures.update_figure(self.fig, self.record)

    def _draw_event(self, ev: Event) -> None:
        items = "".join(f"<li>{escape(str(e))}</li>" for e in self.record.events[-10:])
        self.events_html.value = f'<ul style="color:#b00;margin:2px 0">{items}</ul>'

    def _poll(self, now: float) -> None:
        if self.clicks.mode == "ui_poll" and self.poller.due(now):
            started = self.clock()
            self._safe(self.clicks.poll)
            self.poller.done(started)

    # ------------------------------------------------------------------ end
    def _close(self, summary: dict) -> None:
        if summary.get("stopped"):
            self.epoch_bar.bar_style = "warning"
            self.step_bar.bar_style = "warning"
        else:
            self.epoch_bar.bar_style = "success"
        self._draw_progress()
        self._draw_plots()
        self.panel.update(snapshot.summary_bundle(self.record, summary, self.note), raw=True)
        self.figure.update(snapshot.figure_bundle(self.record), raw=True)

    def _release(self) -> None:
        for w in self._widgets:
            try:
                w.close()
            except Exception:
                pass
        self._widgets = []
        self.clicks.close()
