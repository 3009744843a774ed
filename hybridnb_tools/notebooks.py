"""Run one notebook headless with nbclient: the executed copy (free of widget state) and an
HTML copy that draws plotly figures.

nbclient and nbconvert come with the ``demo`` extra (``pip install -e '.[demo]'``; ``make setup``
installs it); they are imported when a notebook is run, so importing this module needs neither.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from hybridnb.env import RESULTS_ENV
from hybridnb_tools.results import read_results

PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


@dataclass
class NotebookRun:
    """One executed notebook: where its files are, how long it took, what it recorded."""

    name: str
    ipynb: Path
    html: Path | None = None
    seconds: float = 0.0
    ok: bool = False
    error: str | None = None
    results: dict = field(default_factory=dict)


def find_notebooks(folder: str | os.PathLike) -> list[Path]:
    """The numbered notebooks (``01_*.ipynb`` ...) in ``folder``, in order."""
    folder = Path(folder)
    found = sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb") if p.is_file())
    if not found:
        raise FileNotFoundError(f"no numbered notebooks (01_*.ipynb ...) in {folder}")
    return found


def strip_widget_state(nb) -> None:
    """Drop stored widget state (plotly's FigureWidget would carry ~5 MB of JavaScript) and the
    widget views themselves: without their state they would show a stale first frame (a
    progress bar at 0 %), so the text the notebook printed is what remains."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        if "outputs" in cell:
            cell.outputs = [o for o in cell.outputs if WIDGET_MIME not in (o.get("data") or {})]


def execute_notebook(path: str | os.PathLike, out_dir: str | os.PathLike, *,
                     env: dict[str, str] | None = None, cell_timeout: float = 900.0,
                     html: bool = True, progress=print) -> NotebookRun:
    """Execute one notebook headless into ``out_dir`` (``<name>.ipynb`` + ``<name>.html``).

    The kernel runs in the notebook's own folder with ``env`` added to this process's
    environment, plus ``HYBRIDNB_RESULTS`` pointing at ``out_dir/<name>.results.json``. A failing
    cell stops that notebook; the partly executed copy is still written, and the error is kept.
    """
    nbformat, nbclient = _need("nbformat"), _need("nbclient")
    exceptions = _need("nbclient.exceptions")
    errors = (exceptions.CellExecutionError, exceptions.CellTimeoutError,
              exceptions.DeadKernelError)

    path, out_dir = Path(path), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    run = NotebookRun(name=path.stem, ipynb=out_dir / path.name)
    results_path = out_dir / f"{path.stem}.results.json"
    results_path.unlink(missing_ok=True)
    kernel_env = {**os.environ, **(env or {}), RESULTS_ENV: str(results_path.resolve())}

    nb = nbformat.read(path, as_version=4)
    n_code = sum(c.cell_type == "code" for c in nb.cells)
    client = nbclient.NotebookClient(nb, timeout=cell_timeout, kernel_name="python3",
                            store_widget_state=False, allow_errors=False,
                            resources={"metadata": {"path": str(path.parent.resolve())}})
    started = {}

    def on_start(cell, cell_index):
        started["t"] = time.perf_counter()

    def on_done(cell, cell_index, execute_reply):
        dt = time.perf_counter() - started.get("t", time.perf_counter())
        if dt > 15 and progress:
            first = (cell.source.strip().splitlines() or [""])[0][:60]
            count = sum(c.cell_type == "code" for c in nb.cells[: cell_index + 1])
            progress(f"    {path.stem}: cell {count}/{n_code} took {dt:.0f} s  ({first})")

    client.on_cell_start = on_start
    client.on_cell_executed = on_done
    t0 = time.perf_counter()
    try:
        client.execute(env=kernel_env)
        run.ok = True
    except errors as exc:
        run.error = _first_line_of_error(exc)
    finally:
        run.seconds = time.perf_counter() - t0
    strip_widget_state(nb)
    nbformat.write(nb, run.ipynb)
    if html:
        run.html = write_html(nb, out_dir / f"{path.stem}.html")
    run.results = read_results(results_path)
    return run


def _first_line_of_error(exc: BaseException) -> str:
    """``ExceptionName: message`` of the failing cell (nbclient keeps both on the error)."""
    ename, evalue = getattr(exc, "ename", None), getattr(exc, "evalue", None)
    if ename:
        first = (str(evalue or "").strip().splitlines() or [""])[0]
        return f"{ename}: {first}"[:300]
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]


def write_html(nb, path: Path) -> Path:
    """HTML copy of an executed notebook. Plotly figures (stored as their JSON mimetype, which
    nbconvert does not draw) become static divs using one ``plotly.min.js`` next to the file."""
    import copy

    exporter = _need("nbconvert").HTMLExporter(template_name="lab")

    nb = copy.deepcopy(nb)
    script = _plotly_js_next_to(path.parent)
    first = True
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data") or {}
            if PLOTLY_MIME in data and "text/html" not in data:
                data["text/html"] = _plotly_div(data[PLOTLY_MIME], script if first else False)
                first = False
    body, _ = exporter.from_notebook_node(nb)
    path.write_text(body, encoding="utf-8")
    return path


def _plotly_js_next_to(folder: Path) -> str | bool:
    """Copy plotly.min.js into ``folder`` once; return the relative script path (or False)."""
    try:
        import plotly
    except ImportError:
        return False
    src = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    dst = folder / "plotly.min.js"
    if src.exists() and not dst.exists():
        shutil.copyfile(src, dst)
    return "plotly.min.js" if dst.exists() else False


def _plotly_div(fig: dict, include: str | bool) -> str:
    import plotly.io as pio

    return pio.to_html(fig, include_plotlyjs=include, full_html=False, validate=False)



def _need(module: str):
    """Import ``module``, or say which extra installs it (the notebook runner's libraries are
    optional: a notebook that only calls :func:`~hybridnb_tools.results.record` needs none)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"running notebooks needs {module} ({exc}); install the demo extra: "
                          "pip install -e '.[demo]' (make setup does)") from exc
