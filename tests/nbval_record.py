"""A pytest plugin for `make test`: nbval runs the notebooks once, and tests/test_notebooks.py
checks that same run instead of executing all five again.

``python -m pytest -p tests.nbval_record --nbval-lax --nbval-current-env notebooks tests``:
nbval executes each notebook cell by cell (a cell that raises fails its test item); this plugin
starts those kernels in quick mode (``HYBRIDNB_QUICK=1``, as the project's runner does: the
unit tests of the same session keep the normal mode), keeps each cell's outputs, and after a
notebook's last cell reads the variables tests/test_notebooks.py asks for (its ``READ``) from
the still-running kernel, with the runner's own reader. The executed copies land in a session
folder; ``recorded(config)`` gives them to test_notebooks.py's ``executed`` fixture as the
runner's ``NotebookRun`` records. Without this plugin (or when a notebook was not run by
nbval) the fixture executes the notebooks itself.
"""

from __future__ import annotations

import inspect
import os
import time
from pathlib import Path

import pytest

from hybridnb.env import HEADLESS_ENV, QUICK_ENV

_KEY = pytest.StashKey[dict]()
_FOLDER = pytest.StashKey[Path]()


NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def pytest_ignore_collect(collection_path, config):
    """nbval runs the tutorials only: tests/live/browser/*.ipynb are the browser test's pages
    (one trains until its Stop button is clicked)."""
    if collection_path.suffix == ".ipynb" and collection_path.resolve().parent != NOTEBOOKS:
        return True
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist (``make test`` runs two workers) each test file goes whole to one
    worker, and the notebooks go there together with tests/test_notebooks.py: a notebook's
    cells share its kernel, and those checks read the runs that worker recorded. (xdist's own
    ``xdist_group`` mark does not group under pytest 9, which no longer reads ``_nodeid``.)"""
    from xdist.scheduler import LoadFileScheduling

    class NotebooksTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "notebooks" if path.endswith((".ipynb", "test_notebooks.py")) else path

    return NotebooksTogether(config, log)


def pytest_unconfigure(config):
    if _FOLDER in config.stash:
        import shutil

        shutil.rmtree(config.stash[_FOLDER], ignore_errors=True)


def recorded(config) -> dict:
    """name -> hybridnb_tools.notebooks.NotebookRun of the notebooks nbval ran in this session."""
    return {name: r["run"] for name, r in config.stash.get(_KEY, {}).items() if r["done"]}


def _is_cell(item) -> bool:
    return type(item).__name__ == "IPyNbCell" and hasattr(item.parent, "nb")


def _state(item) -> dict:
    """The notebook's record while it runs: its run, a copy of its cells for the outputs."""
    runs = item.config.stash.setdefault(_KEY, {})
    name = Path(str(item.parent.fspath)).stem
    if name not in runs:
        import copy
        import tempfile

        from hybridnb_tools.notebooks import NotebookRun

        if _FOLDER not in item.config.stash:   # removed when the session ends
            item.config.stash[_FOLDER] = Path(tempfile.mkdtemp(prefix="nbval-notebooks-"))
        folder = item.config.stash[_FOLDER]
        run = NotebookRun(name=name, ipynb=folder / f"{name}.ipynb", ok=True)
        runs[name] = {"run": run, "nb": copy.deepcopy(item.parent.nb), "done": False,
                      "t0": time.perf_counter()}
    return runs[name]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """The notebook's kernel starts in its first cell's setup: in quick mode, headless."""
    if not _is_cell(item):
        yield
        return
    _state(item)
    saved = {k: os.environ.get(k) for k in (QUICK_ENV, HEADLESS_ENV)}
    os.environ.update({QUICK_ENV: "1", HEADLESS_ENV: "1"})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if not _is_cell(item) or call.when != "call":
        return
    state = _state(item)
    run = state["run"]
    index = next(i for i, c in enumerate(item.parent.nb.cells) if c is item.cell)
    cell = state["nb"].cells[index]
    cell.outputs = list(item.test_outputs or [])
    state["count"] = cell.execution_count = state.get("count", 0) + 1
    report = outcome.get_result()
    if report.failed and run.ok:
        run.ok = False
        run.error = str(report.longrepr).strip().splitlines()[-1][:500]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a notebook's last cell, while its kernel still runs: read the variables, write the
    executed copy."""
    if _is_cell(item) and (nextitem is None or nextitem.parent is not item.parent):
        import nbformat

        from hybridnb_tools.scores import TABLE

        from .notebook_read import READ

        state = _state(item)
        run = state["run"]
        run.seconds = time.perf_counter() - state["t0"]
        if item.parent.kernel is not None and item.parent.kernel.is_alive():
            run.values = _read(item.parent, {**TABLE, **READ.get(run.name, {})})
        nbformat.write(state["nb"], run.ipynb)
        state["done"] = True
    yield


def _read(nbfile, wanted: dict) -> dict:
    """The runner's reader (hybridnb_tools.notebooks._report_values) run in nbval's kernel."""
    from hybridnb_tools import notebooks

    source = (inspect.getsource(notebooks._report_values)
              + f"\n_report_values({dict(wanted)!r})\ndel _report_values\n")
    kernel = nbfile.kernel
    msg_id = kernel.execute_cell_input(source, allow_stdin=False)
    kernel.await_reply(msg_id, timeout=300)
    values = {}
    while True:
        msg = nbfile.get_kernel_message(timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        content = msg["content"]
        if msg["msg_type"] == "display_data" and notebooks.JSON_MIME in content["data"]:
            values = dict(content["data"][notebooks.JSON_MIME])
        if msg["msg_type"] == "status" and content["execution_state"] == "idle":
            return values
