"""The notebooks as files: what is committed, and what makes the notebook run fail.

Executing them is the second command of ``make test``
(``HYBRIDNB_SMOKE=1 pytest --nbval-lax notebooks``); these tests keep that run meaningful:
no outputs are committed, the deterministic answers are checked by assertions in the cells
(so no reference output has to be stored), nothing is skipped or allowed to fail silently, and a
broken cell fails the run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
EXPECTED = ["01_gpu_validation", "02_eeg_windowing_fixes", "03_amp_compile_comparison",
            "04_challenge1_training", "05_challenge2_training"]
CHECK = "# Checked:"  # a cell that asserts a deterministic answer
REPO_URL = "https://github.com/hybridnb/hybridnb"
INSTALL = '%pip install -q "hybridnb @ git+https://github.com/hybridnb/hybridnb"'
# The one cell allowed to raise: braindecode's error, reproduced on purpose.
EXPECTED_RAISES = {"02_eeg_windowing_fixes": "create_windows_from_events"}


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
    checked = [c for _, c in _code(nb) if c.source.startswith(CHECK)]
    assert checked and all("assert " in c.source for c in checked), \
        "every notebook checks at least one deterministic answer with an assertion"


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
def test_colab_badge_opens_this_notebook(path):
    first = _read(path).cells[0]
    assert first.cell_type == "markdown"
    url = ("https://colab.research.google.com/github/hybridnb/hybridnb/blob/main/notebooks/"
           f"{path.name}")
    assert f"]({url})" in first.source and "colab-badge.svg" in first.source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_install_cell_pip_installs_only_on_colab(path):
    """The first code cell, as IPython runs it, calls %pip only when COLAB_RELEASE_TAG is set."""
    from IPython.core.inputtransformer2 import TransformerManager

    _, cell = _code(_read(path))[0]
    assert INSTALL in cell.source
    python = TransformerManager().transform_cell(cell.source)

    def run(environ: dict) -> list:
        calls = []

        class Shell:
            def run_line_magic(self, name, line, *a):
                calls.append((name, line))

        with mock.patch.dict(os.environ, environ, clear=True):
            exec(compile(python, path.name, "exec"), {"get_ipython": Shell})
        return calls

    assert run({"HOME": "/tmp"}) == []
    assert run({"HOME": "/tmp", "COLAB_RELEASE_TAG": "release-colab_20250101"}) == [
        ("pip", 'install -q "hybridnb @ git+https://github.com/hybridnb/hybridnb"')]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_nothing_is_skipped_or_allowed_to_fail_silently(path):
    nb = _read(path)
    raising = []
    for i, cell in _code(nb):
        tags = set(cell.metadata.get("tags", []))
        assert not {"skip-execution", "nbval-skip", "nbval-ignore-output"} & tags, (i, tags)
        for marker in ("NBVAL_SKIP", "NBVAL_IGNORE_OUTPUT", "NBVAL_RAISES_EXCEPTION"):
            assert marker not in cell.source, (i, marker)
        if "raises-exception" in tags:
            raising.append(cell.source)
    expected = EXPECTED_RAISES.get(path.stem)
    assert len(raising) == (1 if expected else 0)
    if expected:
        assert expected in raising[0]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_small_mode_is_read_through_the_package(path):
    """Cells ask hybridnb.smoke() (or nothing); only the package reads HYBRIDNB_SMOKE."""
    for _, cell in _code(_read(path)):
        assert "HYBRIDNB_SMOKE" not in cell.source.replace("`HYBRIDNB_SMOKE=1`", "")


@pytest.mark.slow
def test_a_broken_cell_fails_the_notebook_run(tmp_path):
    """nbval as make test runs it: a tagged expected error passes, a broken cell fails, and a
    checked answer that changed fails."""
    nb = new_notebook(cells=[new_code_cell("x = 1"),
                             new_code_cell("raise ValueError('expected')"),
                             new_code_cell("1 / 0"),
                             new_code_cell(f"{CHECK}\nprint(x + 1)\nassert x + 1 == 2"),
                             new_code_cell(f"{CHECK}\nassert x + 1 == 3, 'answer changed'")])
    nb.cells[1].metadata["tags"] = ["raises-exception"]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    path = tmp_path / "broken.ipynb"
    nbformat.write(nb, path)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
         "--nbval-current-env", str(path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=180,
        env={**os.environ, "HYBRIDNB_SMOKE": "1"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "2 failed, 3 passed" in out, out
    assert "ZeroDivisionError" in out and "answer changed" in out

