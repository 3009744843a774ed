"""The browser test's training cell, executed headless with nbclient (as CI and nbval do).

The same cell runs twice in one kernel: with ``live="auto"`` (a headless kernel -> the text
view) and with ``live="html"`` (display handles). Both must run without errors, in quick mode,
and leave a notebook that reads without a kernel: no widget views, no widget state.
"""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

TRAIN_NB = Path(__file__).parent / "browser" / "train.ipynb"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
PLOTLY_MIME = "application/vnd.plotly.v1+json"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_training_cell_headless_gives_text_and_html(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDNB_QUICK", "1")  # the kernel inherits it, as in CI
    source = nbformat.read(TRAIN_NB, as_version=4)
    setup, train = source.cells[1].source, source.cells[2].source
    assert 'live="widgets"' in train
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(setup),
        nbformat.v4.new_code_cell(train.replace('live="widgets"', 'live="auto"')),
        nbformat.v4.new_code_cell(train.replace('live="widgets"', 'live="html"')),
    ])
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()

    outputs = [o for c in nb.cells for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert not [o for o in outputs if WIDGET_VIEW in o.get("data", {})]
    assert "widgets" not in nb.metadata  # nothing that breaks GitHub's renderer

    assert "frontend: ci" in nb.cells[0].outputs[0].text  # headless kernel recognised

    # live="auto" headless -> text: header (quick mode), a line per epoch, the summary
    text = "".join(o.text for o in nb.cells[1].outputs if o.output_type == "stream"
                   and o.name == "stdout")
    assert not [o for o in nb.cells[1].outputs if o.output_type == "display_data"]
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[0].startswith("hybridnb · SlowLinear") and "quick mode" in lines[0]
    assert any(ln.startswith("! [step 0] quick: quick mode (HYBRIDNB_QUICK)") for ln in lines)
    assert [ln.split(" · ")[0] for ln in lines if ln.startswith("epoch ")] == \
        ["epoch 0/1", "epoch 1/1"]  # counted from 0, as in the history
    assert lines[-1].startswith("Trained SlowLinear") and "Best val_loss" in lines[-1]

    # live="html" -> two display handles, replaced at the end by the static snapshot
    shown = [o for o in nb.cells[2].outputs if o.output_type == "display_data"]
    assert len(shown) == 2
    summary, figure = shown[0].data, shown[1].data
    assert "Trained SlowLinear" in summary["text/html"] and "quick mode" in summary["text/html"]
    assert "<dc:title>hybridnb: loss, learning rate, memory" in figure["image/svg+xml"]
    loss = next(t for t in figure[PLOTLY_MIME]["data"] if t["name"] == "step loss")
    epoch_loss = next(t for t in figure[PLOTLY_MIME]["data"] if t["name"] == "train loss (epoch)")
    val = next(t for t in figure[PLOTLY_MIME]["data"] if t["name"] == "val loss")
    assert len(loss["x"]) > 0 and len(val["y"]) == 2 and len(epoch_loss["y"]) == 2
    size = len(nbformat.writes(nb))
    assert size < 200_000, f"the executed notebook is {size} bytes"
