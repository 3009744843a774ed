"""The live view: renderer choice, throttling, text/HTML/widget renderers and the end snapshot.

Renderers are driven by a fake training loop (the same calls the Trainer makes) with fake
display handles, so every assertion is about what a person would see.
"""

from __future__ import annotations

import io
import json
import time
import xml.etree.ElementTree as ET

import pandas as pd
import pytest

import hybridnb.live as live
from hybridnb import env as runtime
from hybridnb.events import Event
from hybridnb.live import figures
from hybridnb.live.base import LiveView, LiveViewWarning, Throttle, View
from hybridnb.live.console import ConsoleView
from hybridnb.live.html import PLOTLY_MIME, HtmlView
from hybridnb.measure.memory import MemorySampler

RUN = dict(epochs=3, steps_per_epoch=20, batch_size=32, device="cpu", precision="fp32",
           model="TinyNet", n_params=1234, monitor="val_loss", quick=False)
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def fake_sampler(device, pid=None):
    """A real MemorySampler with deterministic host numbers (no thread timing involved)."""
    values = iter(range(1, 10**6))
    return MemorySampler(device, interval=3600,
                         probes=[("host", lambda: {"rss": next(values) * 2.0**20,
                                                   "ram_used": 2.0**30, "ram_total": 2.0**32})])


def drive(view, epochs=3, steps=20, event_at=25, stop_at=None, stopped=None):
    """The Trainer's calls: start, update per step, epoch-end update, event, end."""
    run = dict(RUN, epochs=epochs, steps_per_epoch=steps)
    view.start(run)
    g = 0
    for e in range(epochs):
        for s in range(1, steps + 1):
            g += 1
            view.update(dict(epoch=e, step=s, global_step=g, loss=1.0 / g, lr=1e-3 / (e + 1),
                             samples_per_s=640.0, elapsed_s=0.01 * g))
            if g == event_at:
                view.event(Event("oom_split", "batch 32 split into 2 x 16", step=g, epoch=e))
            if stop_at is not None and g >= stop_at:
                break
        view.update(dict(epoch=e, step=s, global_step=g, epoch_end=True, val_loss=0.5 / (e + 1),
                         val_rmse=0.7, elapsed_s=0.01 * g))
        if stop_at is not None and g >= stop_at:
            break
    hist = pd.DataFrame({"epoch": list(range(e + 1)),  # 0-based, as the Trainer writes it
                         "val_loss": [0.5 / (i + 1) for i in range(e + 1)]})
    view.end(dict(history=hist, best={"monitor": "val_loss", "value": 0.5 / (e + 1), "epoch": e,
                                      "step": g},
                  elapsed_s=0.01 * g, samples_per_s=640.0, peak_memory_bytes=300 * 2**20,
                  events=list(view.record.events) if hasattr(view, "record") else [],
                  device="cpu", precision="fp32", stopped=stopped))
    return g


class FakeHandle:
    def __init__(self, obj):
        self.shown = [obj]

    def update(self, obj, **kwargs):
        self.shown.append(obj)

    @property
    def last(self):
        return self.shown[-1]


class FakeDisplay:
    def __init__(self):
        self.handles: list[FakeHandle] = []

    def __call__(self, obj):
        h = FakeHandle(obj)
        self.handles.append(h)
        return h


# ------------------------------------------------------------------ renderer choice


@pytest.mark.parametrize("live_arg, front, env, missing, expected", [
    ("auto", "jupyter", {"JPY_SESSION_NAME": "/nb.ipynb"}, "", "widgets"),
    ("auto", "jupyter", {"JPY_SESSION_NAME": "/nb.ipynb"}, "anywidget", "html"),
    ("auto", "jupyter", {}, "", "html"),  # a kernel no jupyter-server session started
    ("auto", "vscode", {}, "", "html"),
    ("auto", "ci", {}, "", "text"),
    ("auto", "terminal", {}, "", "text"),
    ("auto", "ipython", {}, "", "text"),
    ("widgets", "ci", {}, "", "widgets"),
    ("widgets", "terminal", {}, "", "text"),
    ("widgets", "jupyter", {}, "anywidget", "html"),
    ("html", "ci", {}, "", "html"),
    ("html", "terminal", {}, "", "text"),
    ("text", "jupyter", {"JPY_SESSION_NAME": "x"}, "", "text"),
    (False, "jupyter", {}, "", "none"),
    (None, "jupyter", {}, "", "none"),
])
def test_renderer_choice_per_environment(monkeypatch, live_arg, front, env, missing, expected):
    monkeypatch.setattr(live, "_widgets_missing", lambda: missing)
    name, note = live.choose_renderer(live_arg, front=front, environ=env)
    assert name == expected
    fell_back = (live_arg in ("widgets", "html") and name != live_arg) or missing and \
        name == "html" or (live_arg == "auto" and front == "jupyter" and name == "html")
    assert bool(note) == bool(fell_back), note  # a fallback always says so, once
    if missing and name == "html":
        assert "anywidget" in note and "pip install" in note


def test_colab_enables_its_widget_manager_or_says_why(monkeypatch):
    monkeypatch.setattr(live, "_widgets_missing", lambda: "")
    monkeypatch.setattr(live, "_colab_widgets_blocker", lambda: "")  # ipywidgets 7, as Colab's
    monkeypatch.setattr(live, "_enable_colab_widgets", lambda: "")
    assert live.choose_renderer("auto", front="colab", environ={}) == ("widgets", "")
    monkeypatch.setattr(live, "_enable_colab_widgets", lambda: "no manager (ImportError)")
    name, note = live.choose_renderer("auto", front="colab", environ={})
    assert name == "html" and "no manager" in note


def test_bad_live_argument_names_the_value():
    with pytest.raises(ValueError, match="live='plots'"):
        live.make_view("plots")


def test_make_view_returns_the_chosen_renderer(monkeypatch):
    monkeypatch.setattr(live, "choose_renderer", lambda live_arg: ("text", ""))
    assert isinstance(live.make_view("auto"), ConsoleView)
    monkeypatch.setattr(live, "choose_renderer", lambda live_arg: ("html", ""))
    assert isinstance(live.make_view("auto"), HtmlView)
    monkeypatch.undo()
    view = live.make_view(False)
    assert type(view) is View and view.stop_requested is False
    view.start(RUN)
    view.update({"epoch": 0, "step": 1, "global_step": 1, "loss": 1.0})
    view.event(Event("x", "y"))
    view.end({})  # the no-op view has every method and draws nothing


def test_frontend_tells_a_lab_session_from_a_headless_runner(monkeypatch):
    monkeypatch.setattr(runtime, "_in_kernel", lambda: True)
    monkeypatch.setattr(runtime, "_parent_command", lambda env: "python -m nbclient run")
    assert runtime.frontend({"JPY_SESSION_NAME": "/home/me/a.ipynb"}) == "jupyter"
    assert runtime.frontend({}) == "ci"
    monkeypatch.setattr(runtime, "_parent_command", lambda env: "/usr/bin/python3 my_gui.py")
    assert runtime.frontend({}) == "jupyter"
    assert runtime.frontend({"VSCODE_PID": "12"}) == "vscode"
    assert runtime.frontend({"COLAB_RELEASE_TAG": "r1"}) == "colab"
    assert runtime.frontend({"CI": "true", "JPY_SESSION_NAME": "x"}) == "ci"
    monkeypatch.setattr(runtime, "_in_kernel", lambda: False)
    assert runtime.frontend({}) in ("terminal", "ipython")


# ------------------------------------------------------------------ throttling


class CountingView(LiveView):
    name = "counting"

    def __init__(self, clock, draw_cost=0.0):
        super().__init__(sampler_factory=None, clock=clock)
        self.progress = self.plotted = self.epoch_ends = self.events = 0
        self._cost = draw_cost
        self._clock = clock

    def _draw_progress(self):
        self.progress += 1
        self._clock.now += self._cost

    def _draw_plots(self):
        self.plotted += 1
        self._clock.now += self._cost

    def _draw_epoch_end(self):
        self.epoch_ends += 1

    def _draw_event(self, ev):
        self.events += 1


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_many_updates_in_one_second_render_a_handful():
    clock = FakeClock()
    view = CountingView(clock)
    view.start(RUN)
    for g in range(1, 1001):  # 1000 steps in 1 s of (fake) time
        clock.now += 0.001
        view.update(dict(epoch=0, step=g, global_step=g, loss=1.0))
    assert len(view.record.steps) == 1000  # every step recorded ...
    assert 4 <= view.progress <= 6  # ... bars drawn every 0.2 s
    assert 1 <= view.plotted <= 2  # plots every 1 s
    view.update(dict(epoch=0, step=1000, global_step=1000, epoch_end=True, val_loss=0.3))
    assert view.epoch_ends == 1  # the epoch end is always drawn
    view.event(Event("oom_split", "x"))
    assert view.events == 1  # and events at once


def test_real_clock_throttling_keeps_renders_few_and_updates_cheap():
    drawn = {"bars": 0, "plots": 0}

    class Counting(ConsoleView):
        def _draw_progress(self):
            drawn["bars"] += 1
            super()._draw_progress()

        def _draw_plots(self):
            drawn["plots"] += 1

    view = Counting(stream=io.StringIO(), tty=True, sampler_factory=None)
    view.start(RUN)
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < 1.0:
        n += 1
        view.update(dict(epoch=0, step=n, global_step=n, loss=1.0, lr=1e-3))
    assert n > 1000
    assert drawn["bars"] <= 7, drawn
    assert drawn["plots"] <= 2


def test_throttle_adapts_to_render_cost():
    clock = FakeClock()
    view = CountingView(clock, draw_cost=0.02)  # a 20 ms plot update
    view.start(RUN)
    for g in range(1, 10001):
        clock.now += 0.001
        view.update(dict(epoch=0, step=g, global_step=g, loss=1.0))
    # 10 s of training: at 1 s per plot that would be 10 renders; at a 0.3 % budget
    # a 20 ms render may happen every 6.7 s at most.
    assert view.plotted <= 2
    assert view.plots.interval == pytest.approx(0.02 / view.plots.budget)
    assert Throttle(0.2).interval == 0.2


# ------------------------------------------------------------------ text renderer


def test_text_renderer_prints_a_line_per_epoch_events_at_once_and_a_summary():
    out = io.StringIO()
    view = ConsoleView(stream=out, tty=False, sampler_factory=fake_sampler)
    drive(view, event_at=25)
    text = out.getvalue()
    lines = text.splitlines()
    assert "\r" not in text  # no carriage returns in logs
    assert lines[0].startswith("hybridnb · TinyNet · 1.2 k params · cpu · fp32 · batch 32")
    epoch_lines = [ln for ln in lines if ln.startswith("epoch ")]
    assert [ln.split(" · ")[0] for ln in epoch_lines] == ["epoch 0/2", "epoch 1/2", "epoch 2/2"]
    assert "step 20/20" in epoch_lines[0] and "val_loss 0.5 " in epoch_lines[0] + " "
    assert "val_loss 0.1667" in epoch_lines[2] and "RSS" in epoch_lines[0]
    ev = lines.index("! [step 25] oom_split: batch 32 split into 2 x 16")
    assert lines.index(epoch_lines[0]) < ev < lines.index(epoch_lines[1])  # shown at once
    summary = lines[-1]
    assert summary.startswith("Trained TinyNet (1.2 k parameters) for 3 of 3 epochs (60 steps)")
    assert "Best val_loss 0.1667 at epoch 2, step 60 (epochs count from 0" in summary
    assert "Peak memory 300 MiB" in summary and "1 × oom_split" in summary


def test_every_renderer_shows_the_train_loss_the_trainer_sends():
    """One number everywhere: the view computes no loss of its own. Steps of 32 samples (loss
    1.0) and 8 samples (loss 4.0): the Trainer's sample-weighted mean is 1.6, the mean of the
    two step losses 2.5 — only 1.6 may appear, and epochs are counted from 0 as in history."""
    from hybridnb.live import summary as text

    out = io.StringIO()
    view = ConsoleView(stream=out, tty=False, sampler_factory=None)
    view.start(dict(RUN, epochs=2, steps_per_epoch=2))
    view.update(dict(epoch=0, step=1, global_step=1, loss=1.0, train_loss=1.0))
    view.update(dict(epoch=0, step=2, global_step=2, loss=4.0, train_loss=1.6))
    assert text.status(view.record).startswith("epoch 0/1 · step 2/2 · train_loss 1.6 ")
    view.update(dict(epoch=0, step=2, global_step=2, loss=1.6, train_loss=1.6, epoch_end=True,
                     val_loss=0.5))
    line = out.getvalue().splitlines()[-1]
    assert line.startswith("epoch 0/1 · step 2/2 · train_loss 1.6 · val_loss 0.5 ")
    assert "2.5" not in line
    series = {s.name: s for s in figures.panels(view.record)}
    assert series["train loss (epoch)"].x == [2] and series["train loss (epoch)"].y == [1.6]
    assert series["step loss"].y == [1.0, 4.0]
    view.end(dict(history=pd.DataFrame({"epoch": [0], "step": [2], "val_loss": [0.5]}),
                  best={"monitor": "val_loss", "value": 0.5, "epoch": 0, "step": 2},
                  elapsed_s=1.0, events=[], device="cpu", precision="fp32"))
    assert "Best val_loss 0.5 at epoch 0, step 2 (epochs count from 0" in \
        out.getvalue().splitlines()[-1]


def test_text_renderer_quick_mode_stop_and_tty_progress():
    out = io.StringIO()
    view = ConsoleView(stream=out, tty=True, sampler_factory=None)
    view.start(dict(RUN, quick=True))
    assert "quick mode" in out.getvalue().splitlines()[0]
    view.update(dict(epoch=0, step=1, global_step=1, loss=0.5, lr=1e-3))
    assert "\r" in out.getvalue()  # a redrawn progress line on a TTY
    view.update(dict(epoch=0, step=1, global_step=1, epoch_end=True))
    view.end(dict(elapsed_s=1.0, stopped="stop_button", events=[], device="cpu",
                  precision="fp32"))
    last = out.getvalue().splitlines()[-1]
    assert "Stopped with the Stop button" in last and "after step 1" in last
    assert "No val_loss was recorded" in last and "Quick mode" in last


def test_text_heartbeat_shows_progress_in_a_slow_epoch():
    out = io.StringIO()
    view = ConsoleView(stream=out, tty=False, heartbeat_s=0.0, sampler_factory=None)
    view.start(RUN)
    view.update(dict(epoch=0, step=3, global_step=3, loss=0.5))
    assert out.getvalue().splitlines()[-1].startswith("  epoch 0/2 · step 3/20")


# ------------------------------------------------------------------ HTML renderer + snapshot


def test_html_renderer_updates_two_handles_and_ends_with_a_static_snapshot():
    disp = FakeDisplay()
    view = HtmlView(display=disp, sampler_factory=fake_sampler)
    steps = drive(view, event_at=25)
    panel, plots = disp.handles
    assert len(disp.handles) == 2  # created once, then updated in place
    # throttled: 60 fast steps render far fewer panels than steps (+ 3 epoch ends, 1 event)
    assert 4 <= len(panel.shown) <= 12
    live_panel = panel.shown[-2]["text/html"]
    assert 'data-value="3" data-max="3"' in live_panel  # epoch bar full before the snapshot
    assert "oom_split" in live_panel
    live_plots = plots.shown[-2]  # plotly JSON for JupyterLab/VS Code, plotly's HTML for Colab
    live_loss = next(t for t in live_plots[PLOTLY_MIME]["data"] if t["name"] == "step loss")
    assert 20 <= len(live_loss["x"]) <= steps and "cdn.plot.ly" in live_plots["text/html"]

    summary = panel.last
    assert set(summary) == {"text/html", "text/plain"}
    assert "Best val_loss 0.1667 at epoch 2, step 60" in summary["text/html"]
    assert "Peak memory 300 MiB" in summary["text/plain"]

    fig = plots.last
    assert WIDGET_VIEW not in fig and "text/html" not in fig  # nothing needing JS or a kernel
    image = ET.fromstring(fig["image/svg+xml"])  # well-formed SVG, drawn with matplotlib
    assert "hybridnb: loss, learning rate, memory" in "".join(image.itertext())
    traces = {t["name"]: t for t in fig[PLOTLY_MIME]["data"]}
    assert len(traces["step loss"]["x"]) == steps == 60
    assert traces["val loss"]["y"] == pytest.approx([0.5, 0.25, 0.5 / 3])
    assert len(traces["process RSS"]["y"]) >= 2 and traces["process RSS"]["y"][0] > 0
    assert traces["events"]["text"] == ["oom_split"]
    json.dumps(fig[PLOTLY_MIME], allow_nan=False)  # strict JSON: NaN would break frontends


def test_nonfinite_losses_become_gaps_not_invalid_json():
    disp = FakeDisplay()
    view = HtmlView(display=disp, sampler_factory=None)
    view.start(RUN)
    for g, loss in enumerate([1.0, float("nan"), float("inf"), 0.5], start=1):
        view.update(dict(epoch=0, step=g, global_step=g, loss=loss, lr=1e-3))
    view.end(dict(elapsed_s=1.0, events=[], device="cpu", precision="fp32"))
    fig = disp.handles[1].last
    y = next(t["y"] for t in fig[PLOTLY_MIME]["data"] if t["name"] == "step loss")
    assert y == [1.0, None, None, 0.5]
    json.dumps(fig[PLOTLY_MIME], allow_nan=False)


def test_long_runs_are_averaged_down_for_plots():
    xs = list(range(1, 10001))
    ys = [float(x % 2) for x in xs]  # alternating 0/1: bucket means are 0.5
    dx, dy = figures.downsample(xs, ys, 1000)
    assert len(dx) <= 1000 and dx[-1] == 10000
    assert all(abs(v - 0.5) < 1e-9 for v in dy)
    ys[0:10] = [float("nan")] * 10  # a bucket with no finite loss stays a gap
    ys[10:20] = [float("nan")] * 9 + [3.0]  # one finite value: the bucket is that value
    _, gy = figures.downsample(xs, ys, 1000)
    assert gy[0] is None and gy[1] == 3.0 and gy[2] == 0.5
    sx, sy = figures.downsample(xs[:50], ys[:50], 2000)
    assert sx == xs[:50] and sy[20:] == ys[20:50]  # short runs: every point


def test_a_broken_display_never_stops_training(capsys):
    def broken(obj):
        raise RuntimeError("comm closed")

    view = HtmlView(display=broken, sampler_factory=None)
    with pytest.warns(LiveViewWarning, match=r"html live view failed \(RuntimeError: comm") as said:
        drive(view, epochs=1, steps=5)
    assert len(said) == 1  # said once, however many draws fail
    assert "Trained TinyNet" in capsys.readouterr().out  # the summary still reaches the person


def test_a_failed_end_snapshot_still_prints_the_summary(capsys):
    disp = FakeDisplay()
    view = HtmlView(display=disp, sampler_factory=None)
    view.start(RUN)
    view.update(dict(epoch=0, step=1, global_step=1, loss=1.0, lr=1e-3))

    def gone(obj, **kwargs):
        raise RuntimeError("comm closed")

    for handle in disp.handles:
        handle.update = gone
    with pytest.warns(LiveViewWarning, match="comm closed"):
        view.end(dict(elapsed_s=1.0, events=[], device="cpu", precision="fp32"))
    assert "Trained TinyNet" in capsys.readouterr().out


# ------------------------------------------------------------------ widget renderer (no kernel)


def test_widget_renderer_bars_plots_stop_and_cleanup():
    pytest.importorskip("anywidget")
    from hybridnb.live.widgets import WidgetView

    disp = FakeDisplay()
    view = WidgetView(display=disp, sampler_factory=fake_sampler)
    view.start(RUN)
    assert view.clicks.mode == "none" and view.stop_button.disabled  # no kernel: says why
    assert "interrupt" in view.stop_button.tooltip
    for g in range(1, 21):
        view.update(dict(epoch=0, step=g, global_step=g, loss=1.0 / g, lr=1e-3))
    view.update(dict(epoch=0, step=20, global_step=20, epoch_end=True, val_loss=0.4))
    assert 'data-value="20" data-max="20"' in view.progress.value  # drawn at every epoch end
    assert 'data-value="1" data-max="3"' in view.progress.value  # epochs done
    loss = next(t for t in view.fig.data if t.name == "step loss")
    assert len(loss.x) == 20
    assert len(next(t for t in view.fig.data if t.name == "process RSS").y) >= 1

    view._on_stop()  # what a click does (on whatever thread delivers it)
    assert view.stop_requested
    view.bars.force()
    view.update(dict(epoch=1, step=1, global_step=21, loss=0.1, lr=1e-3))
    assert view.stop_button.description == "Stopping…" and view.stop_button.disabled
    widgets = list(view._widgets)
    view.end(dict(elapsed_s=2.0, stopped="stop_button", events=[], device="cpu",
                  precision="fp32", peak_memory_bytes=None))
    panel, plots = disp.handles
    assert "Stopped with the Stop button" in panel.last["text/plain"]
    assert PLOTLY_MIME in plots.last and WIDGET_VIEW not in plots.last
    assert all(w.comm is None for w in widgets)  # every widget closed: no state left behind


# ------------------------------------------------------------------ Stop-click routes


def test_click_route_is_chosen_by_what_the_kernel_supports():
    from types import SimpleNamespace

    from hybridnb.live.widgets import route_clicks

    button = SimpleNamespace(comm=SimpleNamespace())
    old = SimpleNamespace(shell_channel_thread=None, do_one_iteration=lambda: None)  # ipykernel 6
    assert route_clicks(button, kernel=old).mode == "ui_poll"
    broken = SimpleNamespace(shell_channel_thread=SimpleNamespace(), do_one_iteration=None)
    route = route_clicks(button, kernel=broken)  # subshells advertised but unusable
    assert route.mode == "ui_poll" and "subshell unavailable" in route.note
    bare = SimpleNamespace(shell_channel_thread=None)
    route = route_clicks(button, kernel=bare)
    assert route.mode == "none" and "interrupt the kernel" in route.note


def test_ui_polling_is_throttled_between_steps():
    pytest.importorskip("anywidget")
    from hybridnb.live.widgets import ClickRoute, WidgetView

    class CountingRoute(ClickRoute):
        polls = 0

        def poll(self):
            CountingRoute.polls += 1

    clock = FakeClock()
    view = WidgetView(display=FakeDisplay(), sampler_factory=None, clock=clock)
    view.start(RUN)
    view.clicks = CountingRoute("ui_poll")
    for g in range(1, 1001):
        clock.now += 0.001
        view.update(dict(epoch=0, step=g % 20 + 1, global_step=g, loss=1.0))
    assert 3 <= CountingRoute.polls <= 5  # every ~0.25 s, not every step
    view.end(dict(elapsed_s=1.0, events=[], device="cpu", precision="fp32"))
