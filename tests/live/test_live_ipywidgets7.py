"""The live view on Colab's widget stack: ipywidgets 7 (what Colab ships), or an honest HTML view.

The widget renderer runs against a real ipywidgets 7 in a second environment: `make setup`
installs ipywidgets 7.7.1 (Colab's version) with ``pip install --target .venv/ipywidgets7``, and
a subprocess puts that folder first on its PYTHONPATH. Colab itself is simulated the way the
kernel sees it: ``COLAB_RELEASE_TAG`` in the environment and a ``google.colab.output`` module
whose ``enable_custom_widget_manager`` is recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hybridnb.live as live

ROOT = Path(__file__).resolve().parents[2]
IPYWIDGETS7 = ROOT / ".venv" / "ipywidgets7"

SCRIPT = textwrap.dedent('''
    import json, re, sys, types

    calls = []
    colab = types.ModuleType("google.colab")
    colab.output = types.SimpleNamespace(enable_custom_widget_manager=lambda: calls.append(1))
    google = types.ModuleType("google")
    google.colab = colab
    sys.modules.update({"google": google, "google.colab": colab})

    import ipywidgets
    import hybridnb.live as live
    from hybridnb.live.widgets import WidgetView

    name, note = live.choose_renderer("auto")          # the frontend from the environment
    shown = []

    class Handle:
        def __init__(self, obj):
            self.objs = [obj]
        def update(self, obj, **kw):
            self.objs.append(obj)

    def display(obj):
        shown.append(Handle(obj))
        return shown[-1]

    view = WidgetView(note, display=display)
    view.start(dict(epochs=2, steps_per_epoch=5, batch_size=8, device="cpu", precision="fp32",
                    model="Tiny", n_params=10, monitor="val_loss", quick=False))
    g = 0
    for e in range(2):
        for s in range(1, 6):
            g += 1
            view.update(dict(epoch=e, step=s, global_step=g, loss=1.0 / g, lr=1e-3))
        view.update(dict(epoch=e, step=5, global_step=g, epoch_end=True, val_loss=0.5 / (e + 1)))
    bars = [[int(v) for v in m] for m in re.findall(r'data-value="(\\d+)" data-max="(\\d+)"',
                                                    view.progress.value)]
    points = len(next(t for t in view.fig.data if t.name == "step loss").x)
    widgets = list(view._widgets)
    view.end(dict(elapsed_s=1.0, events=[], device="cpu", precision="fp32",
                  peak_memory_bytes=None))
    print(json.dumps(dict(
        ipywidgets=ipywidgets.__version__, ipywidgets_file=ipywidgets.__file__,
        renderer=name, note=note, manager_enabled=len(calls), bars=bars, points=points,
        shown=[type(h.objs[0]).__name__ for h in shown],
        final=[sorted(h.objs[-1]) for h in shown],
        closed=all(getattr(w, "comm", None) is None for w in widgets))))
''')


@pytest.mark.skipif(not (IPYWIDGETS7 / "ipywidgets").is_dir(),
                    reason=f"ipywidgets 7 is not installed in {IPYWIDGETS7} (make setup puts "
                           "it there; it needs PyPI once)")
def test_widget_view_draws_with_colabs_ipywidgets_7():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JPY_", "VSCODE"))}
    env.update(PYTHONPATH=os.pathsep.join([str(IPYWIDGETS7), str(ROOT)]),
               COLAB_RELEASE_TAG="release-colab-test", HYBRIDNB_QUICK="")
    env.pop("HYBRIDNB_HEADLESS", None)
    run = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["ipywidgets"].startswith("7."), out
    assert Path(out["ipywidgets_file"]).is_relative_to(IPYWIDGETS7)
    assert (out["renderer"], out["note"], out["manager_enabled"]) == ("widgets", "", 1)
    assert out["bars"] == [[2, 2], [5, 5]] and out["points"] == 10  # epochs and steps, full
    assert out["shown"] == ["VBox", "VBox"]          # the panel and the plots, as widgets
    # at the end both are replaced by static output (no widget state left in the notebook)
    widget_mime = "application/vnd.jupyter.widget-view+json"
    assert all(widget_mime not in final and "text/plain" in final for final in out["final"])
    assert out["closed"]


def test_colab_with_ipywidgets_8_falls_back_to_html_and_says_why(monkeypatch):
    monkeypatch.setattr(live, "_widgets_missing", lambda: "")
    monkeypatch.setattr(live, "_ipywidgets_versions", lambda: (None, "8.1.9"))
    enabled = []
    monkeypatch.setattr(live, "_enable_colab_widgets", lambda: enabled.append(1) or "")
    name, note = live.choose_renderer("auto", front="colab", environ={})
    assert name == "html"
    assert "8.1.9" in note and "ipywidgets<8" in note and "live='widgets'" in note
    assert enabled == []                              # no manager turned on for nothing
    # asked for explicitly, widgets are tried (the manager enabled)
    assert live.choose_renderer("widgets", front="colab", environ={}) == ("widgets", "")
    assert enabled == [1]


def test_colab_upgraded_without_restart_falls_back_to_html_and_says_restart(monkeypatch):
    monkeypatch.setattr(live, "_widgets_missing", lambda: "")
    monkeypatch.setattr(live, "_enable_colab_widgets", lambda: "")
    monkeypatch.setattr(live, "_ipywidgets_versions", lambda: ("7.7.1", "8.1.9"))
    name, note = live.choose_renderer("auto", front="colab", environ={})
    assert name == "html" and "7.7.1" in note and "8.1.9" in note and "Restart" in note
    monkeypatch.setattr(live, "_ipywidgets_versions", lambda: ("7.7.1", "7.7.1"))
    assert live.choose_renderer("auto", front="colab", environ={}) == ("widgets", "")


def test_the_versions_are_read_from_the_process_and_the_disk():
    import importlib.metadata

    import ipywidgets

    assert live._ipywidgets_versions() == (ipywidgets.__version__,
                                           importlib.metadata.version("ipywidgets"))
