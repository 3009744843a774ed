"""Figures that stay interactive and survive saving and export (issues 28, 35): a static image
beside the plotly JSON, in the same output.

A notebook output holding only ``application/vnd.plotly.v1+json`` is dropped by nbconvert's
HTML export and by a code host's preview. User figures get an SVG after ``hn.static_figures()``;
the library's figures (``LRFindResult.plot()``, the live view's end-of-run figure) carry one
without it (``trainer.report()`` writes a PNG file). The image is SVG, never PNG, beside the
JSON: JupyterLab's plotly renderer shows an ``image/png`` instead of drawing the plot (the
browser test checks the plots are drawn). The notebook test executes a notebook with nbclient,
exports it with nbconvert and finds an image for every figure.
"""

from __future__ import annotations

import base64
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pio = pytest.importorskip("plotly.io")
px = pytest.importorskip("plotly.express")
go = pytest.importorskip("plotly.graph_objects")

from hybridnb.live import plotly_mpl, static  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PLOTLY_MIME = "application/vnd.plotly.v1+json"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SVG = "image/svg+xml"


@pytest.fixture
def kernel_renderer():
    """plotly's default renderer as in a Jupyter kernel, put back afterwards."""
    before = pio.renderers.default
    pio.renderers.default = "plotly_mimetype"
    yield
    pio.renderers.default = before


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    assert data.startswith(PNG_MAGIC)
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def svg_size(svg: str) -> tuple[float, float]:
    """(width, height) in plotly's px of a matplotlib SVG (its size is in pt, 72 per inch, drawn
    at 100 dpi)."""
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    w, h = re.search(r'<svg[^>]*width="([\d.]+)pt" height="([\d.]+)pt"', svg).groups()
    return float(w) * 100 / 72, float(h) * 100 / 72


def tiny_trainer(**kwargs):
    import torch
    from torch import nn

    import hybridnb as hn

    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = x @ torch.linspace(-1, 1, 8).unsqueeze(1)
    tr = hn.Trainer(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)), batch_size=32,
                    live=False, isolate=False, **kwargs)
    return tr, (x, y)


# ------------------------------------------------------------------ the setup line


def test_importing_hybridnb_changes_no_plotly_setting_nor_pyplot():
    code = ("import plotly.io as pio; before = pio.renderers.default; import hybridnb as hn; "
            "hn.Trainer; import hybridnb.live.static; import hybridnb.train.lr_find; "
            "print(pio.renderers.default == before, 'hybridnb_image' in pio.renderers); "
            "import sys, plotly.express as px; hybridnb.live.static.to_png(px.line(y=[1, 2])); "
            "print('matplotlib.pyplot' in sys.modules)")  # a notebook's pyplot state untouched
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=120, check=True).stdout.split()
    assert out == ["True", "False", "False"]


def test_static_figures_puts_an_image_beside_every_user_figure_and_undoes(kernel_renderer):
    import hybridnb as hn

    fig = px.scatter(x=[1, 2, 3], y=[3, 1, 2], width=600, height=400)
    assert set(fig._repr_mimebundle_()) == {PLOTLY_MIME}  # what nbconvert drops
    assert hn.static_figures() == "plotly_mimetype+hybridnb_image"
    assert hn.static_figures() == "plotly_mimetype+hybridnb_image"  # idempotent
    bundle = fig._repr_mimebundle_()
    # no image/png: JupyterLab's plotly renderer would show it instead of drawing the plot
    assert set(bundle) == {PLOTLY_MIME, SVG}
    width, height = svg_size(bundle[SVG])
    assert 400 <= width <= 620 and 250 <= height <= 420  # the figure's size, margins trimmed
    assert fig._repr_mimebundle_()[SVG] == bundle[SVG]  # the same figure, the same bytes
    assert hn.static_figures(False) == "plotly_mimetype"
    assert set(fig._repr_mimebundle_()) == {PLOTLY_MIME}


def test_on_colab_the_image_goes_beside_plotlys_html(kernel_renderer):
    import hybridnb as hn

    pio.renderers.default = "colab"  # what plotly picks on Colab: text/html with plotly.js
    assert hn.static_figures() == "colab+hybridnb_image"
    bundle = px.line(y=[1, 2])._repr_mimebundle_()
    assert set(bundle) == {"text/html", SVG}  # Colab draws the html; an export, the image
    hn.static_figures(False)


@pytest.mark.parametrize("default", ["", "browser"])
def test_static_figures_leaves_a_script_default_alone(default):
    before = pio.renderers.default
    try:
        pio.renderers.default = default
        assert static.static_figures() == default  # no notebook output to add an image to
    finally:
        pio.renderers.default = before


def test_a_figure_that_cannot_be_drawn_is_still_shown_and_said(kernel_renderer, monkeypatch):
    import hybridnb as hn

    hn.static_figures()
    try:
        def broken(fig):
            raise RuntimeError("no fonts")

        monkeypatch.setattr(static, "translate", broken)
        with pytest.warns(UserWarning, match="no fonts"):
            bundle = px.line(y=[1, 2])._repr_mimebundle_()
        assert set(bundle) == {PLOTLY_MIME}  # the interactive output, unharmed
    finally:
        hn.static_figures(False)


# ------------------------------------------------------------------ library figures


def test_lr_find_plot_carries_an_image_without_the_setup_line(kernel_renderer, monkeypatch):
    tr, data = tiny_trainer(epochs=1)
    found = tr.lr_find(data, num_steps=20)
    fig = found.plot()
    assert isinstance(fig, go.Figure)  # every plotly method still works
    copy = pickle.loads(pickle.dumps(fig))  # saved with joblib, pickle
    assert type(copy) is type(fig)
    bundle = fig._repr_mimebundle_()
    assert set(bundle) == {PLOTLY_MIME, SVG}
    assert svg_size(bundle[SVG])[0] > 300
    assert copy._repr_mimebundle_()[SVG] == bundle[SVG]  # its drawing went along
    drawn = fig._draw()  # drawn from the sweep, not translated from the plotly figure
    ax = drawn.axes[0]
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "learning rate"
    assert {"loss per step", "smoothed loss"} <= {t.get_text() for t in ax.get_legend().texts}
    shown = []  # .show() and static_figures() hand plotly's image renderer the same drawing
    monkeypatch.setattr("IPython.display.display", lambda obj, raw=False: shown.append(obj))
    fig.show()
    with_setup = static.static_figures()
    try:
        assert shown[0][SVG] == bundle[SVG] == fig._repr_mimebundle_()[SVG]
    finally:
        static.static_figures(False)
    assert with_setup == "plotly_mimetype+hybridnb_image"
    edited = copy.update_layout(title="again")  # an edit shows in the saved image: translated
    assert type(edited) is type(fig)
    assert edited._repr_mimebundle_()[SVG] == static.image_bundle(edited)[SVG] != bundle[SVG]


def test_report_png_is_the_live_figure(tmp_path):
    tr, data = tiny_trainer(epochs=2)
    tr.fit(data)
    folder = tr.report(tmp_path / "report")
    width, height = png_size((folder / "figures.png").read_bytes())
    assert width > 2 * height  # the three panels side by side
    assert "skipped" not in (folder / "summary.txt").read_text()


def test_the_panels_have_their_own_matplotlib_drawing():
    """hybridnb's panels are drawn twice, never translated: plotly live, matplotlib static."""
    from hybridnb.events import StepRow
    from hybridnb.live import panel_image
    from hybridnb.live.record import RunRecord

    record = RunRecord({"epochs": 1, "steps_per_epoch": 3})
    for g in (1, 2, 3):
        record.add(StepRow(global_step=g, epoch=0, step=g, loss=1.0 / g, lr=1e-3))
    drawn = panel_image.draw(record)  # what trainer.report()'s figures.png is
    assert [ax.get_title() for ax in drawn.axes] == ["loss", "learning rate", "memory (GiB)"]
    assert list(drawn.axes[0].lines[0].get_ydata()) == [1.0, 0.5, 1 / 3]
    assert "<dc:title>hybridnb: loss, learning rate, memory" in static.save(drawn, "svg").decode()


# ------------------------------------------------------------------ the translation


def test_translation_draws_subplots_log_axes_shapes_titles_and_legend():
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("left", "right"),
                        specs=[[{}, {"secondary_y": True}]])
    fig.add_scatter(x=[1, 2, 3], y=[1, 10, 100], name="a", row=1, col=1)
    fig.add_scatter(x=[1, 2, 3], y=[3, 2, 1], name="b", row=1, col=2)
    fig.add_scatter(x=[1, 2, 3], y=[50, 60, 70], name="c", row=1, col=2, secondary_y=True)
    fig.add_hline(y=5, line_color="crimson", row=1, col=1)
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_layout(title="two panels")
    drawn = plotly_mpl.draw(fig)
    left, right = drawn.axes
    assert left.get_yscale() == "log" and right.get_yscale() == "linear"
    assert right.get_position().x0 > left.get_position().x1  # side by side, as plotly's domains
    texts = {t.get_text() for t in drawn.texts}
    assert {"left", "right", "two panels"} <= texts
    assert [t.get_text() for t in drawn.legends[0].texts] == ["a", "b"]
    # a right-hand axis is no notebook's nor plotly express's: said, not drawn over the left
    assert any("secondary y axes" in t for t in texts)
    hline = [ln for ln in left.lines if list(ln.get_ydata()) == [5.0, 5.0]]
    assert hline and list(hline[0].get_xdata()) == [0.0, 1.0]  # across the panel


def test_shapes_widen_the_axes_as_in_plotly_and_stray_labels_stay_inside():
    fig = px.line(y=[2.0, 3.0], height=300, width=500)
    fig.add_hline(y=1.0)  # below the data: plotly's autorange takes it in
    fig.add_annotation(x=0, y=100.0, text="far away", showarrow=False)
    ax = plotly_mpl.draw(fig).axes[0]
    assert ax.get_ylim()[0] <= 1.0 <= ax.get_ylim()[1] < 100
    assert png_size(static.to_png(fig))[1] <= 300  # the stray label does not stretch the image


def test_translation_draws_histogram_bar_and_says_what_it_skips():
    rng = np.random.default_rng(0)
    hist = plotly_mpl.draw(px.histogram(x=rng.normal(size=500), nbins=20))
    assert len(hist.axes[0].patches) == 20
    bars = plotly_mpl.draw(px.bar(x=["a", "b", "c"], y=[1, 3, 2]))
    assert [p.get_height() for p in bars.axes[0].patches] == [1, 3, 2]
    assert [t.get_text() for t in bars.axes[0].get_xticklabels()] == ["a", "b", "c"]
    stacked = plotly_mpl.draw(px.bar(x=[1, 2, 3, 4], y=["a", "a", "b", "b"],
                                          orientation="h"))  # px: one bar per row, stacked
    assert sorted(p.get_x() + p.get_width() for p in stacked.axes[0].patches) == [1, 3, 3, 7]
    grouped = plotly_mpl.draw(go.Figure([go.Bar(x=["a", "b"], y=[1, 2], name="one"),
                                              go.Bar(x=["a", "b"], y=[3, 4], name="two")]))
    left_one, _, left_two, _ = sorted(grouped.axes[0].patches, key=lambda p: p.get_height())
    assert left_one.get_x() < left_two.get_x()  # side by side, not on top of each other
    coloured = plotly_mpl.draw(go.Figure(go.Bar(
        y=[5, 5], marker_color=["red", "blue"],
        error_y={"symmetric": False, "array": [1, 1], "arrayminus": [4, 4]})))
    assert [p.get_facecolor()[:3] for p in coloured.axes[0].patches] == [(1, 0, 0), (0, 0, 1)]
    whisker = coloured.axes[0].collections[0].get_segments()[0][:, 1]  # one bar's error bar
    assert sorted(whisker.tolist()) == [1, 6]  # 4 below, 1 above
    upper = plotly_mpl.draw(go.Figure(go.Bar(y=[5], error_y={"symmetric": False, "array": [1]})))
    assert sorted(upper.axes[0].collections[0].get_segments()[0][:, 1].tolist()) == [5, 6]
    for fig, kind in ((px.box(y=np.arange(10.0)), "box"), (px.imshow(np.eye(3)), "heatmap"),
                      (go.Figure(go.Pie(values=[1, 2])), "pie"),
                      (px.line(y=[1, 2]).add_vrect(x0=0, x1=0.5), "rect shapes")):
        drawn = plotly_mpl.draw(fig)  # a trace the translation does not cover:
        assert any(kind in t.get_text() for t in drawn.texts)  # said, not silently blank


# ------------------------------------------------------------------ a notebook, end to end

NOTEBOOK = [
    "import hybridnb as hn\nimport plotly.express as px\nhn.static_figures()",
    'fig = px.scatter(x=[1, 2, 3], y=[3, 1, 2], title="user scatter")\nfig',
    "hn.static_figures(False)  # the library's figures carry the image without the line",
    "import torch\nfrom torch import nn\ntorch.manual_seed(0)\nx = torch.randn(256, 8)\n"
    "y = x.sum(1, keepdim=True)\n"
    "trainer = hn.Trainer(nn.Linear(8, 1), epochs=2, batch_size=32, live='html')\n"
    "found = trainer.lr_find((x, y), num_steps=20)\nfound.plot()",
    "trainer.fit((x, y), val=(x[:64], y[:64]))",
]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_executed_notebook_exported_to_html_shows_every_figure(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nbconvert = pytest.importorskip("nbconvert")
    monkeypatch.setenv("HYBRIDNB_QUICK", "1")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the kernel imports this checkout's hybridnb
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in NOTEBOOK])
    nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]

    def figures(cell):
        return [o.data for o in cell.outputs if PLOTLY_MIME in o.get("data", {})]

    user, = figures(nb.cells[1])
    sweep, lr = figures(nb.cells[3])  # the sweep's own live view (a fit's), then its plot
    end, = figures(nb.cells[4])  # the live view's end-of-run figure
    for data in (user, sweep, lr, end):
        assert not any(k.startswith("image/") and k != SVG for k in data)  # no PNG: see above
    assert svg_size(user[SVG])[0] > 300 and svg_size(lr[SVG])[0] > 300
    assert svg_size(end[SVG])[0] > 2 * svg_size(end[SVG])[1]  # three panels side by side

    # saved and read back, as a code host reads it
    path = tmp_path / "figures.ipynb"
    nbformat.write(nb, path)
    saved = nbformat.read(path, as_version=4)
    assert [[k for k in d if k.startswith("image/")] for c in saved.cells
            for d in figures(c)] == [[SVG]] * 4

    html, _ = nbconvert.HTMLExporter().from_notebook_node(saved)
    svgs = [base64.b64decode(s).decode() for s in re.findall(
        r'<img[^>]*src="data:image/svg\+xml;base64,([A-Za-z0-9+/=\n]+)"', html)]
    assert svgs[:3] == [user[SVG], sweep[SVG], lr[SVG]]   # an <img> for each figure, in order
    assert len(svgs) == 4 and svgs[3] == end[SVG]   # the end-of-run figure
    assert "<dc:title>hybridnb: loss, learning rate, memory</dc:title>" in svgs[3]
