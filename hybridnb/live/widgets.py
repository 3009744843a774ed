"""Widget live view for JupyterLab / Notebook 7 / Colab (ipywidgets 7 or 8): the HTML view's
progress panel with a Stop button, then one plotly FigureWidget. At the end both outputs are
replaced by the static snapshot and every widget is closed: the saved notebook holds no widget
state. Only the training thread changes widgets; the Stop handler only sets ``stop_requested``.

A kernel executing a cell does not read its shell channel, so a click on Stop would wait until
the training cell ends. Two ways around it, tried in this order:

1. **Kernel subshells** (ipykernel >= 7): the button's comm routes its messages to a private
   subshell thread, which runs the click handler while the main thread trains.
2. **jupyter-ui-poll** (ipykernel 6, ``do_one_iteration``): the training loop pumps pending
   messages between steps (throttled). jupyter-ui-poll 1.1 silently does nothing on ipykernel
   7.4, which is why subshells come first.

Where neither exists the button is disabled and says to interrupt the kernel instead (the
Trainer treats an interrupt exactly like Stop).
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from hybridnb.live import figures
from hybridnb.live.base import Throttle
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
        import plotly.graph_objects as go

        self.progress = W.HTML(progress_html(self.record, self.note))
        self.stop_button = W.Button(
            description="Stop", icon="stop", button_style="danger", layout=W.Layout(width="110px"),
            tooltip="Stop after the current step (checkpoint and history are kept)")
        self.stop_button.add_class("hybridnb-stop")
        self.box = W.VBox([self.progress, self.stop_button])
        fig = figures.figure_dict(self.record, figures.LIVE_POINTS)
        # a widget sizes itself once, often before its output area is laid out: a fixed width
        fig["layout"].update(template="plotly_white", width=960)
        self.fig = go.FigureWidget(fig)
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

    def _release(self) -> None:
        for w in self._widgets:
            with contextlib.suppress(Exception):  # broad: a comm already gone; the run is over
                w.close()
        self._widgets = []
        self.clicks.close()


class ClickRoute:
    """How clicks reach Python; ``mode`` is ``"subshell"``, ``"ui_poll"`` or ``"none"``."""

    def __init__(self, mode: str = "none", note: str = ""):
        self.mode, self.note = mode, note

    def poll(self) -> None:
        """Deliver pending clicks now (the ui_poll route; the view calls it between steps)."""
        from jupyter_ui_poll import ui_events

        with ui_events() as ui_poll:
            ui_poll(20)

    def close(self) -> None:
        """Release the subshell; safe to call twice."""


class SubshellRoute(ClickRoute):
    def __init__(self, kernel: Any, widget: Any, timeout: float = 5.0):
        super().__init__("subshell")
        if not hasattr(widget.comm, "_reply_subshell_for"):
            raise RuntimeError("this ipykernel's comms cannot be routed to a subshell")
        self._manager = kernel.shell_channel_thread.manager
        self._loop = self._manager._shell_channel_io_loop
        self._timeout = timeout
        sid = self.subshell_id = self._on_channel_thread(self._manager._create_subshell)
        widget.comm._reply_subshell_for = lambda data, default: sid  # clicks go to our subshell

    def _on_channel_thread(self, fn, *args):
        """Run ``fn`` on the kernel's shell-channel thread (where subshells are managed)."""
        future: Future = Future()

        def call():
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # broad: re-raised by result(), on the caller's thread
                future.set_exception(exc)

        self._loop.add_callback(call)
        try:
            return future.result(self._timeout)
        except FutureTimeout:
            raise TimeoutError(f"the kernel's shell-channel thread did not answer in "
                               f"{self._timeout} s") from None

    def close(self) -> None:
        sid, self.subshell_id = self.subshell_id, None
        if sid is not None:
            with contextlib.suppress(Exception):  # broad: the kernel is shutting down
                self._on_channel_thread(self._manager._delete_subshell, sid)


def route_clicks(widget: Any, kernel: Any | None = None) -> ClickRoute:
    """Choose how ``widget``'s clicks reach Python during a busy cell (see module doc)."""
    if kernel is None:
        from IPython import get_ipython

        kernel = getattr(get_ipython(), "kernel", None)
    if kernel is None:
        return ClickRoute("none", "no running kernel delivers clicks: interrupt (Ctrl-C / ■) to stop; "
                          "the checkpoint and history are kept")
    reason = ""
    if getattr(kernel, "shell_channel_thread", None) is not None:
        try:
            return SubshellRoute(kernel, widget)
        except Exception as exc:  # broad: ipykernel internals; the fallback says why
            reason = f"kernel subshell unavailable ({type(exc).__name__}: {exc}); "
    if hasattr(kernel, "do_one_iteration"):  # jupyter-ui-poll: a dependency of hybridnb
        return ClickRoute("ui_poll", reason.rstrip("; "))
    return ClickRoute("none", reason + "this kernel cannot deliver clicks while it trains: interrupt "
                      "the kernel (■) to stop; the checkpoint and history are kept")
