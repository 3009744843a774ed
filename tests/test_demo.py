"""The main job's machinery (`python -m hybridnb_tools.demo`): notebooks run in order in the run
folder, the score table read from each kernel's variables, a failing notebook reported, executed
copies free of widget state, HTML that draws plotly, quick-mode scores labelled."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from hybridnb_tools import notebooks, scores

ROOT = Path(__file__).resolve().parents[1]


def _notebook(path: Path, *cells: str, tags: dict[int, list[str]] | None = None) -> Path:
    nb = new_notebook(cells=[new_code_cell(c) for c in cells])
    for i, t in (tags or {}).items():
        nb.cells[i].metadata["tags"] = t
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)
    return path


TABLE1 = {"deep": {"mean": 0.61234, "sd": 0.02}, "training mean": {"mean": 1.002, "sd": 0.001},
          "ridge, amplitude": {"mean": 0.373, "sd": 0.003},
          "ridge, band power": {"mean": 0.773, "sd": 0.014}, "oracle": {"mean": 0.183, "sd": 0.004}}


def _runs(tmp_path):
    return [notebooks.NotebookRun("04_x", tmp_path / "a.ipynb", seconds=12.5, ok=True,
                                  values={"device": "cpu", "c1_nrmse": 0.61234, "c1_sd": 0.02,
                                          "c1_table": TABLE1, "c1_model": "Shallow",
                                          "folds": 3}),
            notebooks.NotebookRun("05_y", tmp_path / "b.ipynb", seconds=3.0, ok=False,
                                  error="ValueError: boom",
                                  values={"c2_nrmse": 0.99, "overall": 0.876})]


def test_summary_has_the_plain_lines_scripts_read(tmp_path):
    text = scores.summary(_runs(tmp_path), tmp_path, 15.5, quick=False)
    lines = text.splitlines()
    for expected in ("C1 nRMSE 0.6123", "C2 nRMSE 0.9900", "overall 0.8760", "device cpu"):
        assert expected in lines
    assert any(ln.startswith("05_y") and "FAILED" in ln for ln in lines)
    assert "    ValueError: boom" in lines
    assert any("over 3 subject folds" in ln for ln in lines)
    # the fold mean ± sd beside the best baseline (by fold mean) and the oracle's fold mean
    c1 = next(ln for ln in lines if ln.startswith("Challenge 1"))
    assert "0.612 ± 0.020" in c1 and "0.373 (ridge, amplitude)" in c1 and "0.183" in c1
    assert scores.best_baseline(TABLE1) == ("ridge, amplitude", 0.373)
    assert scores.best_baseline({"deep": {"mean": 0.5}}) == (None, None)
    assert "not meaningful" not in text and "quick" not in text


def test_quick_mode_summary_says_the_scores_are_not_meaningful(tmp_path):
    lines = scores.summary(_runs(tmp_path), tmp_path, 15.5, quick=True).splitlines()
    assert "C1 nRMSE 0.6123" in lines, "the plain lines stay as scripts read them"
    below_table = next(i for i, ln in enumerate(lines) if ln.startswith("overall 0.3")) + 1
    for at in (below_table, lines.index("overall 0.8760") + 1):   # under both score blocks
        assert "not meaningful" in lines[at] and "quick mode" in lines[at], lines[at]


@pytest.mark.slow
def test_demo_runs_every_notebook_reads_the_kernels_and_reports_a_failure(tmp_path):
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    _notebook(nbs / "01_first.ipynb",
              "import os\nfrom pathlib import Path\nc1 = 0.5\n"
              "print('cwd', os.getcwd())\nprint('env', os.environ.get('HYBRIDNB_HEADLESS'), "
              "os.environ.get('HYBRIDNB_QUICK'))\n"
              "Path('runs').mkdir(exist_ok=True)\n(Path('runs') / 'made_by_01.txt').write_text('x')",
              "import ipywidgets\nipywidgets.IntSlider(3)",
              "import plotly.graph_objects as go\ngo.Figure(go.Bar(x=[1, 2], y=[3, 4]))")
    _notebook(nbs / "02_broken.ipynb",
              "c2 = 0.9",
              "raise RuntimeError('this cell is broken')",
              "overall = 0.1")
    _notebook(nbs / "03_tagged.ipynb", "raise ValueError('tagged, and still an error')",
              "overall = 0.2", tags={0: ["raises-exception"]})
    _notebook(nbs / "04_after.ipynb", "overall = 0.78")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "hybridnb_tools.demo", "--notebooks", str(nbs),
                           "--out", str(out), "--quick"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "C1 nRMSE 0.5000" in lines
    assert "C2 nRMSE 0.9000" in lines, "values defined before the failing cell are read"
    assert "overall 0.7800" in lines, "the notebook after a failed one must still run"
    assert any(ln.startswith("02_broken") and "FAILED" in ln for ln in lines)
    assert any(ln.startswith("03_tagged") and "FAILED" in ln for ln in lines)
    assert any("RuntimeError: this cell is broken" in ln for ln in lines)
    assert any("not meaningful" in ln for ln in lines), "quick mode's scores are labelled"

    results = json.loads((out / "results.json").read_text())
    assert results["notebooks"]["01_first"]["ok"] is True
    assert results["notebooks"]["01_first"]["values"] == {"c1_nrmse": 0.5}
    assert results["notebooks"]["02_broken"]["ok"] is False
    assert results["table"]["overall"] == 0.78

    executed = nbformat.read(out / "01_first.ipynb", as_version=4)
    printed = executed.cells[0].outputs[0]["text"].splitlines()
    assert printed == [f"cwd {out.resolve()}", "env 1 1"], "kernels run in the run folder"
    assert (out / "runs" / "made_by_01.txt").exists(), "a notebook's runs/ lands in the run folder"
    assert len(executed.cells) == 3, "the cell that read the variables is not stored"
    assert "widgets" not in executed.metadata
    assert executed.cells[1].outputs == [], "widget views are dropped with their state"
    partial = nbformat.read(out / "02_broken.ipynb", as_version=4)
    assert partial.cells[1].outputs[0]["ename"] == "RuntimeError"
    assert partial.cells[2].outputs == [], "nothing runs after the broken cell"

    html = (out / "01_first.html").read_text()
    assert 'src="plotly.min.js"' in html and "Plotly.newPlot" in html
    assert (out / "plotly.min.js").stat().st_size > 1_000_000


def test_find_notebooks_names_the_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        notebooks.find_notebooks(tmp_path)
    (tmp_path / "02_b.ipynb").write_text("{}")
    (tmp_path / "01_a.ipynb").write_text("{}")
    (tmp_path / "scratch.ipynb").write_text("{}")
    assert [p.name for p in notebooks.find_notebooks(tmp_path)] == ["01_a.ipynb", "02_b.ipynb"]


def test_a_missing_runner_library_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "nbclient", None)   # import nbclient -> ImportError
    nb = _notebook(tmp_path / "01_x.ipynb", "1")
    with pytest.raises(ImportError, match=r"needs nbclient.*pip install -e '\.\[demo\]'"):
        notebooks.execute_notebook(nb, tmp_path / "out")


def test_the_demo_extra_holds_the_runner_libraries_and_make_setup_installs_it():
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    demo_reqs = " ".join(extras["demo"])
    for lib in ("nbclient", "nbconvert", "nbformat", "ipykernel"):
        assert lib in demo_reqs, (lib, extras["demo"])
    setup_lines = [ln for ln in (ROOT / "Makefile").read_text().splitlines()
                   if "pip install" in ln.replace("$(PIP) install", "pip install") and "-e" in ln]
    assert any("demo" in ln for ln in setup_lines), setup_lines


def test_help_says_the_notebooks_write_the_synthetic_release_and_they_do():
    """The help's claim, checked against the code: the runner never writes the release, and every
    notebook that does writes it under the cache folder the help names."""
    proc = subprocess.run([sys.executable, "-m", "hybridnb_tools.demo", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    text = " ".join(proc.stdout.split())
    assert proc.returncode == 0
    assert "The notebooks write the synthetic release on first use" in text
    assert "~/.cache/hybridnb/synthetic/" in text
    tools = "".join(p.read_text() for p in (ROOT / "hybridnb_tools").glob("*.py"))
    assert "make_hbn_like" not in tools
    assert "import synthetic" not in tools and "data_prep.synthetic" not in tools
    from data_prep import source

    assert source.default_cache({"HOME": "/h"}).parts[-2:] == (".cache", "hybridnb")
    assert "synthetic" in source.resolve.__code__.co_consts          # <cache>/synthetic/<kind>
    writers = []
    for path in sorted((ROOT / "notebooks").glob("0*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code" and "source.resolve(DATA" in cell.source:
                writers.append(path.name)
    assert writers, "no notebook writes the synthetic release any more: fix the demo's help"
