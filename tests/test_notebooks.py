"""The notebooks: what is committed, and what they compute when run.

The notebooks are tutorials: no assertions, mocks, test tooling or internal imports in view, and
no cell exists for a harness. :func:`executed` runs all five top to bottom in quick mode
(``HYBRIDNB_QUICK=1``, in order: 05 reuses 04's model) with the demo's runner (nbclient, no
cell allowed to raise, whatever its tags), once per session; after each notebook's last cell the
runner reads the variables named in :data:`READ` from its kernel, and the tests below assert on
those values and on the executed notebooks' outputs.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from pathlib import Path
from unittest import mock

import nbformat
import numpy as np
import pytest
from nbformat.v4 import new_code_cell, new_notebook
from notebook_read import READ  # shared with tests/nbval_record.py

from data_prep import baselines
from hybridnb_tools.demo import run_demo
from hybridnb_tools.notebooks import execute_notebook

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
EXPECTED = ["01_gpu_validation", "02_eeg_windowing_fixes", "03_amp_compile_comparison",
            "04_challenge1_training", "05_challenge2_training"]
DATA_NOTEBOOKS = ["02_eeg_windowing_fixes", "04_challenge1_training", "05_challenge2_training"]
# What a tutorial does not show: test scaffolding and the package's insides
NOT_IN_VIEW = ("assert ", "mock", "TODO", "# Checked", "from hybridnb.", "import hybridnb.",
               "HYBRIDNB_CACHE\"", "HYBRIDNB_CACHE'", "hybridnb_tools.results", "record(",
               "run_dir(", "sys.last_value", "HYBRIDNB_RUN_DIR", "HYBRIDNB_RESULTS")



def _read(path: Path):
    return nbformat.read(path, as_version=4)


def _code(nb):
    return [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]


def stored_output_problems(nb) -> list[str]:
    """What a pre-commit hook would refuse: outputs or execution counts in any cell, and stored
    widget state."""
    found = []
    if "widgets" in nb.metadata:
        found.append("stored widget state in the notebook metadata")
    for i, cell in _code(nb):
        if cell.outputs or cell.execution_count is not None:
            found.append(f"cell {i}: holds outputs / an execution count; strip them")
    return found


def _ids(paths):
    return [p.stem for p in paths]


def test_the_five_notebooks_exist_and_the_readme_table_lists_them():
    assert [p.stem for p in NOTEBOOKS] == EXPECTED
    readme = (ROOT / "README.md").read_text()
    for p in NOTEBOOKS:
        assert f"`notebooks/{p.name}`" in readme, f"README's notebook table lacks {p.name}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_committed_notebook_holds_no_outputs(path):
    nb = _read(path)
    nbformat.validate(nb)
    assert stored_output_problems(nb) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_no_test_scaffolding_or_internal_imports_in_view(path):
    nb = _read(path)
    for i, cell in _code(nb):
        for word in NOT_IN_VIEW:
            assert word not in cell.source, (path.name, i, word)
    for i, cell in enumerate(nb.cells):   # no cell exists for make demo or the tests
        assert "make demo" not in cell.source and "recorded for" not in cell.source, (path.name, i)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_every_code_cell_follows_a_sentence_of_markdown(path):
    """Each step is explained: no two code cells in a row (after the set-up cells)."""
    cells = _read(path).cells
    code_idx = [i for i, c in enumerate(cells) if c.cell_type == "code"]
    set_up = code_idx[:2]                 # settings/install, imports
    runs = [i for i in code_idx[2:] if cells[i - 1].cell_type == "code"
            and i - 1 not in set_up]
    assert runs == [], f"{path.name}: code cells {runs} follow a code cell; explain each step"


@pytest.mark.parametrize("name", DATA_NOTEBOOKS)
def test_data_is_one_setting_in_the_first_code_cell(name):
    nb = _read(ROOT / "notebooks" / f"{name}.ipynb")
    first = _code(nb)[0][1].source
    assert 'DATA = os.environ.get("HYBRIDNB_DATA", "synthetic")' in first
    later = "".join(c.source for _, c in _code(nb)[1:])
    assert "source.resolve(DATA" in later and "DATA =" not in later


def test_the_output_check_catches_an_executed_cell():
    nb = _read(NOTEBOOKS[0])
    i, cell = _code(nb)[1]
    cell.execution_count = 3
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="hello\n")]
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {}}
    problems = stored_output_problems(nb)
    assert f"cell {i}: holds outputs / an execution count; strip them" in problems
    assert "stored widget state in the notebook metadata" in problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_no_link_to_a_repository_that_does_not_exist(path):
    """hybridnb is on no index and github.com/hybridnb/hybridnb does not exist: the notebook
    says how to get it onto Colab instead (the wheel, README "On Colab")."""
    nb = _read(path)
    assert nb.cells[0].cell_type == "markdown" and "On Colab" in nb.cells[0].source
    for i, cell in enumerate(nb.cells):
        assert "github.com/hybridnb" not in cell.source and "git+" not in cell.source, i


WHEEL_FILE = "/content/hybridnb-0.1.0-py3-none-any.whl"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_install_cell_pip_installs_the_uploaded_wheel_only_on_colab(path):
    """The first code cell, as IPython runs it: %pip only on Colab (COLAB_RELEASE_TAG) and only
    when hybridnb is not importable; it installs the newest uploaded wheel (with eegdash's
    extra when DATA names a release to download), or says which file to upload."""
    from IPython.core.inputtransformer2 import TransformerManager
    from IPython.utils.text import DollarFormatter

    _, cell = _code(_read(path))[0]
    python = TransformerManager().transform_cell(cell.source)
    reads_data = path.stem in DATA_NOTEBOOKS

    def run(environ: dict, installed: bool = False, wheels=(WHEEL_FILE,)) -> list:
        calls, ns = [], {}

        class Shell:   # IPython expands {expr} in a magic's line as its var_expand does
            def run_line_magic(self, name, line, *a):
                calls.append((name, DollarFormatter().vformat(line, [], ns)))

        ns["get_ipython"] = Shell
        with mock.patch.dict(os.environ, environ, clear=True), \
                mock.patch("importlib.util.find_spec", return_value=object() if installed else None), \
                mock.patch("glob.glob", return_value=list(wheels)):
            exec(compile(python, path.name, "exec"), ns)
        return calls

    colab = {"HOME": "/tmp", "COLAB_RELEASE_TAG": "release-colab_20250101"}
    assert run({"HOME": "/tmp"}) == []
    assert run(colab, installed=True) == []
    assert run(colab) == [("pip", f'install -q "{WHEEL_FILE}"')]
    if reads_data:   # eegdash comes along only for a release name ("R5-mini"), not a folder
        assert run({**colab, "HYBRIDNB_DATA": "R5-mini"}) == [
            ("pip", f'install -q "{WHEEL_FILE}[challenge]"')]
        for data in ("/data/EEG2025r5mini", "release-copy", "synthetic"):
            assert run({**colab, "HYBRIDNB_DATA": data}) == [
                ("pip", f'install -q "{WHEEL_FILE}"')], data
    with pytest.raises(FileNotFoundError, match=r"WHEEL='/content/hybridnb-\*\.whl'.*make wheel"):
        run(colab, wheels=())


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_nothing_is_skipped_or_allowed_to_fail(path):
    """Run All in JupyterLab stops at the first error, tagged or not: no cell may raise, so no
    cell carries raises-exception (an error shown on purpose is caught in its cell)."""
    for i, cell in _code(_read(path)):
        tags = set(cell.metadata.get("tags", []))
        assert not {"skip-execution", "nbval-skip", "nbval-ignore-output",
                    "raises-exception"} & tags, (i, tags)
        for marker in ("NBVAL_SKIP", "NBVAL_IGNORE_OUTPUT", "NBVAL_RAISES_EXCEPTION"):
            assert marker not in cell.source, (i, marker)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_quick_mode_is_read_through_the_package(path):
    """Cells ask hybridnb.quick() (or nothing); only the package reads HYBRIDNB_QUICK."""
    for _, cell in _code(_read(path)):
        assert "HYBRIDNB_QUICK" not in cell.source.replace("`HYBRIDNB_QUICK=1`", "")


@pytest.mark.slow
def test_a_raising_cell_fails_the_run_even_when_tagged_and_values_are_still_read(tmp_path):
    """The runner the tests use: any raising cell stops the run and is named (a raises-exception
    tag does not excuse it: JupyterLab's Run All would stop there too); the kernel's variables
    are read afterwards by a cell the written notebook does not hold."""
    nb = new_notebook(cells=[new_code_cell("x = 1\nimport numpy as np\narr = np.float32(2.5)"),
                             new_code_cell("raise ValueError('tagged')"),
                             new_code_cell("y = 2")])
    nb.cells[1].metadata["tags"] = ["raises-exception"]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    path = tmp_path / "broken.ipynb"
    nbformat.write(nb, path)
    run = execute_notebook(path, tmp_path / "out", html=False, progress=None,
                           read={"x": "x", "arr": "arr", "y": "y", "nan": "float('nan')",
                                 "shape": "(3, 1)", "s": "{'b', 'a'}"})
    assert not run.ok and run.error.startswith("ValueError: tagged")
    assert run.values == {"x": 1, "arr": 2.5, "nan": None, "shape": [3, 1], "s": ["a", "b"]}
    written = nbformat.read(run.ipynb, as_version=4)
    assert [c.source for c in written.cells] == [c.source for c in nb.cells]
    assert written.cells[2].outputs == [], "nothing runs after the raising cell"


# ---------------------------------------------------------------- the notebooks, run

@pytest.fixture(scope="module")
def executed(tmp_path_factory, pytestconfig):
    """All five notebooks run top to bottom in quick mode, once: {name: NotebookRun}. Where nbval
    ran them in this session (`make test`: tests/nbval_record.py), that run is the one checked;
    otherwise the demo's runner executes them here."""
    if pytestconfig.pluginmanager.hasplugin("tests.nbval_record"):
        from tests.nbval_record import recorded

        runs = recorded(pytestconfig)
        if set(runs) == set(EXPECTED):
            return runs
    out = tmp_path_factory.mktemp("notebooks")
    old = os.environ.pop("HYBRIDNB_DATA", None)   # the default: the synthetic release
    try:
        runs = run_demo(NOTEBOOKS, out, quick=True, read=READ, html=False,
                        progress=lambda line: None)
    finally:
        if old is not None:
            os.environ["HYBRIDNB_DATA"] = old
    return {r.name: r for r in runs}


def _values(executed, name) -> dict:
    run = executed[name]
    assert run.ok, f"{name} failed: {run.error}"
    missing = set(READ[name]) - set(run.values)
    assert not missing, f"{name}: no variable for {sorted(missing)}"
    return run.values


def _outputs_text(cell) -> str:
    """What a code cell showed: streams, plain-text results and plotly figures' titles."""
    parts = []
    for out in cell.get("outputs", []):
        parts.append(out.get("text", ""))
        data = out.get("data") or {}
        parts.append(data.get("text/plain", ""))
        if "application/vnd.plotly.v1+json" in data:
            parts.append(json.dumps(data["application/vnd.plotly.v1+json"].get("layout", {}),
                                    ensure_ascii=False))
    return "\n".join(parts)


@pytest.mark.parametrize("name", EXPECTED)
@pytest.mark.slow
@pytest.mark.notebooks
def test_the_notebook_runs_top_to_bottom_with_no_cell_raising(executed, name):
    run = executed[name]
    assert run.ok, run.error
    written = nbformat.read(run.ipynb, as_version=4)
    committed = _read(ROOT / "notebooks" / f"{name}.ipynb")
    assert [c.source for c in written.cells] == [c.source for c in committed.cells]
    for i, cell in _code(written):
        assert cell.execution_count is not None, (name, i)
        assert not [o for o in cell.outputs if o.output_type == "error"], (name, i)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_the_imports_cell_keeps_every_figure_as_an_image_too(path):
    imports = _code(_read(path))[1][1].source
    assert "import hybridnb as hn" in imports
    assert "\nhn.static_figures()" in imports


@pytest.mark.parametrize("name", EXPECTED)
@pytest.mark.slow
@pytest.mark.notebooks
def test_every_figure_shown_carries_an_image_and_stays_interactive(executed, name):
    """A saved notebook, its HTML export and a code host's preview show each plotly figure (its
    SVG); JupyterLab draws it with plotly, which it would not with an image/png beside it
    (tests/live/test_browser.py)."""
    written = nbformat.read(executed[name].ipynb, as_version=4)
    figures = [(i, o.data) for i, c in _code(written) for o in c.outputs
               if "application/vnd.plotly.v1+json" in (o.get("data") or {})]
    assert figures, f"{name} shows no figure"
    for i, data in figures:
        assert "image/svg+xml" in data and "image/png" not in data, (name, i)


@pytest.mark.parametrize("name", ["04_challenge1_training", "05_challenge2_training"])
@pytest.mark.slow
@pytest.mark.notebooks
def test_plain_nbconvert_html_of_an_executed_notebook_shows_every_figure(executed, name):
    """`jupyter nbconvert --to html` (no plotly JavaScript) draws each figure as its image."""
    from nbconvert import HTMLExporter

    written = nbformat.read(executed[name].ipynb, as_version=4)
    figures = sum("application/vnd.plotly.v1+json" in (o.get("data") or {})
                  for _, c in _code(written) for o in c.outputs)
    body, _ = HTMLExporter().from_notebook_node(written)
    assert figures >= 3, name
    assert len(re.findall(r'<img[^>]*src="data:image/svg\+xml;base64,', body)) >= figures


@pytest.mark.parametrize("name", ["04_challenge1_training", "05_challenge2_training"])
@pytest.mark.slow
@pytest.mark.notebooks
def test_quick_mode_scores_say_they_are_not_meaningful(executed, name):
    """Wherever a quick-mode run shows an nRMSE value (outside the training cells, whose lines
    the Trainer prints), the same output says it is not meaningful."""
    written = nbformat.read(executed[name].ipynb, as_version=4)
    shown = 0
    for i, cell in _code(written):
        text = _outputs_text(cell)
        if ".fit(" in cell.source or not re.search(r"nRMSE\D{0,40}\d\.\d", text):
            continue
        shown += 1
        assert "not meaningful" in text, (name, i, text[:300])
    assert shown >= 2, f"{name}: no score found in the outputs"


@pytest.mark.slow
@pytest.mark.notebooks
def test_01_simulated_gpus_and_the_fallbacks(executed):
    v = _values(executed, "01_gpu_validation")
    assert v["verdicts"] == {
        "healthy": ["passed", None], "hangs in matmul": ["hung", "matmul"],
        "crashes on first tensor": ["crashed", "tensor"],
        "wrong matmul": ["wrong result", "matmul"]}
    assert v["fallback_device"] == "cpu"
    assert v["fallback_reason"].startswith("no GPU can be trusted")
    assert (v["forced_device"], v["forced_precision"]) == ("cpu", "fp32")
    assert "HYBRIDNB_DEVICE=cpu" in v["forced_reason"]


@pytest.mark.slow
@pytest.mark.notebooks
def test_02_the_error_shown_its_fixes_and_every_planted_fault_reported(executed):
    v = _values(executed, "02_eeg_windowing_fixes")
    written = nbformat.read(executed["02_eeg_windowing_fixes"].ipynb, as_version=4)
    naive = [c for _, c in _code(written)
             if 'create_windows_from_events(ds, mapping={"contrastTrial_start": 0})' in c.source]
    assert len(naive) == 1
    assert _outputs_text(naive[0]).strip().startswith(
        "ValueError: arange: cannot compute length"), "the naive call's error, caught and shown"
    assert v["same"] is True and v["after_target"] is True
    expected = {"nan_durations": "note", "empty_durations": "repaired", "no_feedback": "note",
                "six_channels": "skipped", "short_recording": "skipped",
                "no_presses": "skipped", "nan_stretch": "dropped", "truncated_bdf": "skipped",
                "unsorted_onsets": "repaired", "late_anchor": "dropped"}
    assert sorted(v["planted"]) == sorted(expected) == sorted(v["levels"])
    for fault, level in expected.items():
        assert level in v["levels"][fault], (fault, v["levels"][fault])


@pytest.mark.slow
@pytest.mark.notebooks
def test_03_fp32_runs_and_every_other_variant_says_why_not(executed):
    v = _values(executed, "03_amp_compile_comparison")
    assert v["status"]["fp32"] == "ok"
    assert set(v["why_not"]) == {k for k, s in v["status"].items() if s != "ok"}
    assert all(str(note).strip() for note in v["why_not"].values())
    if v["hw_device"] == "cpu":
        assert v["status"]["fp16"] == "skipped"
        assert v["status"]["fp32+speedups"] == "ok"  # the CPU's rules apply to EEGNeX
    assert v["exact"] == {"fp32+speedups": True, "fp32+channels_last": True,
                          "fp32+rewrite": True}  # outputs and gradients of the first step


ROWS = ["deep", *baselines.BASELINES, "oracle"]  # the model, every baseline, the oracle


def _check_folds(folds: dict, subjects: list[str], k: int) -> None:
    """No subject in two parts of a fold; every subject a test subject exactly once."""
    assert len(folds) == k
    tested = []
    for i, parts in folds.items():
        train, val, test = (set(parts[n]) for n in ("train", "val", "test"))
        assert train and val and test, (i, {n: len(p) for n, p in parts.items()})
        assert not (train & val or train & test or val & test), i
        assert train | val | test == set(subjects), i
        tested += parts["test"]
    assert sorted(tested) == sorted(subjects), "every subject is tested exactly once"


def _check_table(v: dict) -> None:
    """The fold table: the model, the baselines and the oracle, finite on every fold; the
    mean and sd are those of the per-fold scores."""
    assert set(v["table"]) == set(ROWS), sorted(v["table"])
    assert len(v["per_fold"]) == v["k"]
    for row in ROWS:
        scores = [f[row] for f in v["per_fold"].values()]
        assert all(0 < s < float("inf") for s in scores), (row, scores)
        assert abs(v["table"][row]["mean"] - np.mean(scores)) < 1e-9, row
        assert abs(v["table"][row]["sd"] - np.std(scores, ddof=1)) < 1e-9, row


@pytest.mark.slow
@pytest.mark.notebooks
def test_04_windows_folds_and_the_fold_table(executed):
    v = _values(executed, "04_challenge1_training")
    assert v["window_shape"] == [129, 200] and v["window_dtype"] == "float32"
    assert v["after_target"] is True
    assert v["k"] == 2   # quick mode
    _check_folds(v["folds"], v["subjects"], v["k"])
    assert v["shared"] == [] and v["tested_once"] is True
    # quick mode trains a few steps with EMA 0.99: the weights are still near their start, so
    # no score bound holds there (bench/results/scores-*: default mode)
    _check_table(v)
    assert v["c1"] == v["table"]["deep"]["mean"] and v["c1_sd"] == v["table"]["deep"]["sd"]
    assert v["model"].startswith("ShallowFBCSPNet")
    assert v["recipe"] == "ShallowFBCSPNet" and v["conv_nonlin"] == "torch.nn.ELU"
    assert 0.3 < v["target_mean"] < 2.4 and 0 < v["target_std"] < 1.0  # seconds


@pytest.mark.slow
@pytest.mark.notebooks
def test_05_folds_scores_and_the_submission_checked_in_a_fresh_process(executed):
    v = _values(executed, "05_challenge2_training")
    v1 = _values(executed, "04_challenge1_training")
    fresh1, fresh2 = v["fresh1"], v["fresh2"]
    assert v["window_shape"] == [129, 400] and v["crop_shape"] == [129, 200]
    assert v["one_target"] is True
    _check_folds(v["folds"], v["subjects2"], v["k"])
    for i, parts in v["folds"].items():   # notebook 04's folds: a subject is tested in both
        assert set(parts["test"]) <= set(v1["folds"][i]["test"]), i
    _check_table(v)
    assert v["c2"] == v["table"]["deep"]["mean"] and v["c2_sd"] == v["table"]["deep"]["sd"]
    # the overall score from both fold means, C1's as notebook 04 scored it
    assert abs(v["c1"] - v1["c1"]) < 1e-9
    assert abs(v["overall"] - (0.3 * v["c1"] + 0.7 * v["c2"])) < 1e-4   # rounded to 4 places
    # the zip holds fold 0's models; a fresh process scores them as the notebook did, on fold
    # 0's test subjects, one output per window
    assert v["c2_submitted"] == v["per_fold"]["0"]["deep"]
    # Challenge 1's model in the zip is notebook 04's fold 0 model, read back from its file
    assert v["c1_from"] == "runs/c1_fold0.pt"
    assert abs(v["c1_submitted"] - v1["per_fold"]["0"]["deep"]) < 1e-4
    assert all(s[1] == 1 for r in (fresh1, fresh2) for s in r["batch_shapes"])
    assert fresh1["output_shape"][1] == 1
    assert abs(fresh1["nrmse"] - v["c1_submitted"]) < 1e-4
    assert abs(fresh2["nrmse"] - v["c2_submitted"]) < 1e-4
    with zipfile.ZipFile(v["zip_path"]) as zf:
        assert sorted(zf.namelist()) == ["submission.py", "weights_challenge_1.pt",
                                         "weights_challenge_2.pt"]
