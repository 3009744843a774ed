"""The widget live view in a real JupyterLab page, driven by headless Chromium.

Starts JupyterLab (127.0.0.1, no token, a free port, a temp root), opens tests/live/browser/train.ipynb
(a tiny model trained with ``Trainer(live="widgets")``), runs all cells and checks from the DOM:
the progress bar reached 100 %, the live plotly loss trace grew while training, and
at the end the live widgets were replaced by the static snapshot whose loss trace has one point
per logged step and whose memory plot has data; a user's figure shown after
``hybridnb.static_figures()`` (which adds an image for exports to the same output) is drawn by
plotly, not shown as a picture. Then tests/browser/stop.ipynb, whose steps run in
an isolated worker process (``isolate=True``): the kernel's live plots update from the worker's
messages, and clicking Stop ends training early with a checkpoint on disk. Screenshots are saved in
the test's tmp folder.

Chromium is Debian's (``make setup`` installs it when missing); the test installs nothing and
skips, saying why, only when no Chromium can be found.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from hybridnb_tools.lab import CHROMIUM_FLAGS, chromium, jupyterlab, open_and_run_all

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

HERE = Path(__file__).parent / "browser"
# Records what the live widgets showed while training: the fullest progress bar and the longest
# loss/memory traces of the live FigureWidget (inside a widget-view output), on every DOM change.
OBSERVER = """() => {
  const s = window.__hnb = {maxPct: 0, liveLoss: 0, liveMem: 0, scans: 0};
  const scan = () => {
    s.scans += 1;
    for (const bar of document.querySelectorAll('.hybridnb-live .hybridnb-bar')) {
      const w = parseFloat(bar.style.width || '0');
      if (w > s.maxPct) s.maxPct = w;
    }
    for (const gd of document.querySelectorAll('.js-plotly-plot')) {
      if (!gd.closest('.hybridnb-live-plots') || !gd.data) continue;  // the live FigureWidget
      for (const t of gd.data) {
        const n = (t.y || []).filter(v => v !== null && v !== undefined).length;
        if (t.name === 'step loss' && n > s.liveLoss) s.liveLoss = n;
        if (t.name === 'process RSS' && n > s.liveMem) s.liveMem = n;
      }
    }
  };
  new MutationObserver(scan).observe(document.body, {subtree: true, childList: true,
    attributes: true, attributeFilter: ['style', 'class', 'd']});
}"""

# The user's figure of train.ipynb's last cell, drawn by plotly (not an <img>)
USER_FIGURE = "gd => ((gd.layout || {}).title || {}).text === 'user figure'"
# The static snapshot left in the notebook at the end (rendered by JupyterLab's plotly renderer).
SNAPSHOT = """() => {
  const USER_FIGURE = """ + USER_FIGURE + """;
  const out = {plots: [], widgets: document.querySelectorAll('.jupyter-widgets').length,
    bars: document.querySelectorAll('.hybridnb-live .hybridnb-bar').length,
    summary: [...document.querySelectorAll('.hybridnb-summary')].map(e => e.innerText)};
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    if (gd.closest('.hybridnb-live-plots') || USER_FIGURE(gd)) continue;
    out.plots.push(Object.fromEntries((gd.data || []).map(
      t => [t.name, (t.y || []).filter(v => v !== null && v !== undefined).length])));
  }
  return out;
}"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server in a temp root holding copies of tests/browser/*.ipynb."""
    path = chromium()
    if path is None:
        pytest.skip("no Chromium found (/usr/bin/chromium); `make setup` installs Debian's "
                    "chromium when run as root")
    pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    pytest.importorskip("jupyterlab", reason="jupyterlab is not installed")
    root = tmp_path_factory.mktemp("lab")
    for nb in HERE.glob("*.ipynb"):
        shutil.copy(nb, root / nb.name)
    # both kernels boot while Chromium starts
    with jupyterlab(root, start_kernels=("train.ipynb", "stop.ipynb")) as url:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=path, args=CHROMIUM_FLAGS)
            yield {"url": url, "root": root, "browser": browser}
            browser.close()


def _open_and_run_all(lab, name: str):
    return open_and_run_all(lab["browser"], lab["url"], name, observer=OBSERVER)


def _wait_for(path: Path, page, seconds: float) -> dict:
    deadline = time.time() + seconds
    while not path.exists():
        errors = page.query_selector_all('[data-mime-type="application/vnd.jupyter.stderr"]')
        tracebacks = [e.inner_text() for e in errors if "Traceback" in e.inner_text()]
        assert not tracebacks, tracebacks[0]
        assert time.time() < deadline, f"{path.name} was not written in {seconds} s"
        page.wait_for_timeout(200)
    return json.loads(path.read_text())


def test_widgets_train_and_stop_in_jupyterlab(lab, tmp_path):
    train = _open_and_run_all(lab, "train.ipynb")
    stop = _open_and_run_all(lab, "stop.ipynb")  # the second notebook trains meanwhile

    # 1. train.ipynb runs to the end: bars full, then the static snapshot replaces the widgets.
    result = _wait_for(lab["root"] / "result-train.json", train, 120)
    train.wait_for_selector(".hybridnb-summary", timeout=30_000)
    train.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')].some("
                            "gd => !gd.closest('.hybridnb-live-plots') && gd.data)",
                            timeout=30_000)
    live = train.evaluate("() => window.__hnb")
    snap = train.evaluate(SNAPSHOT)
    train.screenshot(path=str(tmp_path / "lab-train.png"), full_page=True)
    print("screenshots in", tmp_path)

    assert "frontend: jupyter" in train.inner_text(".jp-Notebook")  # a real Lab session
    assert result["epochs"] == 3 and result["steps"] == 3 * 16
    assert live["maxPct"] == pytest.approx(100.0)  # a progress bar reached 100 %
    assert snap["widgets"] == 0 and snap["bars"] == 0  # live widgets replaced ...
    assert len(snap["plots"]) == 1  # ... by one static figure:
    plot = snap["plots"][0]
    assert plot["step loss"] == result["steps"]  # one loss point per logged step
    assert plot["val loss"] == 3
    assert plot["process RSS"] >= 2  # and the memory plot has data
    assert len(snap["summary"]) == 1 and "Trained SlowLinear" in snap["summary"][0]
    assert "Best val_loss" in snap["summary"][0]
    # the user's figure: plotly draws it at once (an image/png beside the JSON would be shown
    # instead, and drawn only when the mouse enters it)
    train.wait_for_function(f"() => [...document.querySelectorAll('.js-plotly-plot')].some("
                            f"{USER_FIGURE})", timeout=30_000)
    assert train.locator(".jp-RenderedPlotly img.plot-img[src^='data:']").count() == 0
    train.screenshot(path=str(tmp_path / "lab-train-user-figure.png"), full_page=True)

    # 2. stop.ipynb (50 epochs): the live FigureWidget draws loss and memory while it trains;
    #    clicking Stop ends it after the current step with a checkpoint on disk.
    stop.wait_for_function("() => window.__hnb.liveLoss >= 5 && window.__hnb.liveMem >= 1",
                           timeout=90_000)
    stop.screenshot(path=str(tmp_path / "lab-stop-live.png"))
    stop.locator(".hybridnb-live-plots").screenshot(path=str(tmp_path / "lab-live-plots.png"))
    clicked = time.time()
    stop.click(".hybridnb-stop:not([disabled])")
    result = _wait_for(lab["root"] / "result-stop.json", stop, 60)
    took = time.time() - clicked
    stop.wait_for_selector(".hybridnb-summary", timeout=30_000)
    summary = stop.inner_text(".hybridnb-summary")
    stop.screenshot(path=str(tmp_path / "lab-stop.png"), full_page=True)

    assert "stop_button" in result["events"]
    assert "isolate" in result["events"]  # it trained in the worker, drawn by the kernel
    assert result["epochs"] < result["planned_epochs"] and result["steps"] < 50 * 16
    assert took < 30  # after the current step, not at the end of 50 epochs
    assert "last.pt" in result["files"]
    assert (lab["root"] / "ckpt-stop" / "last.pt").stat().st_size > 0  # checkpoint on disk
    assert "Stopped with the Stop button" in summary
