"""Run one notebook headless with nbclient: the executed copy (free of widget state), an HTML
copy that draws plotly figures, and the values of named expressions read from the kernel once the
last cell has run (the notebook itself records nothing for the runner).

nbclient and nbconvert come with the ``demo`` extra (``pip install -e '.[demo]'``; ``make setup``
installs it); they are imported when a notebook is run, so importing this module needs neither.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
JSON_MIME = "application/json"
# the checkout this runner belongs to: first on the kernel's PYTHONPATH, so a notebook imports
# this checkout's hybridnb, data_prep and hybridnb_tools (as the JupyterLab runner does)
CHECKOUT = Path(__file__).resolve().parents[1]


@dataclass
class NotebookRun:
    """One executed notebook: where its files are, how long it took, the values read from its
    kernel afterwards (``values``: name -> plain JSON value; a name whose expression failed,
    e.g. a variable the notebook never defined, is absent)."""

    name: str
    ipynb: Path
    html: Path | None = None
    seconds: float = 0.0
    ok: bool = False
    error: str | None = None
    values: dict = field(default_factory=dict)


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
                     env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
                     read: Mapping[str, str] | None = None, cell_timeout: float = 900.0,
                     html: bool = True, progress=print) -> NotebookRun:
    """Execute one notebook headless into ``out_dir`` (``<name>.ipynb`` + ``<name>.html``).

    The kernel runs in ``cwd`` (default: the notebook's own folder, as in JupyterLab) with
    ``env`` added to this process's environment and this checkout first on ``PYTHONPATH``. No
    cell may raise, whatever its tags (JupyterLab's Run All stops at the first error too): a
    failing cell stops that notebook, the partly executed copy is still written, and the error
    is kept. After the last cell that ran (unless the kernel died or a cell timed out), each
    expression of ``read`` (name -> Python expression, e.g. ``{"c1": "c1"}``) is evaluated in
    the kernel's namespace by a cell that is not stored in the notebook; the plain values land
    in ``NotebookRun.values``.
    """
    nbformat, nbclient = _need("nbformat"), _need("nbclient")
    exceptions = _need("nbclient.exceptions")

    path, out_dir = Path(path), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    run = NotebookRun(name=path.stem, ipynb=out_dir / path.name)
    kernel_env = {**os.environ, **(env or {})}
    kernel_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(CHECKOUT), kernel_env.get("PYTHONPATH", "")) if p)

    nb = nbformat.read(path, as_version=4)
    n_code = sum(c.cell_type == "code" for c in nb.cells)
    workdir = Path(cwd) if cwd is not None else path.parent
    # shutdown "immediate": once the cells ran and the values were read, the kernel is killed
    # with its process group; a graceful exit spends 2-3 s per notebook tearing down torch, mne
    # and braindecode (5 notebooks: about 12 s of `make demo` on 2 cores)
    client = nbclient.NotebookClient(nb, timeout=cell_timeout, kernel_name="python3",
                                     store_widget_state=False, allow_errors=False,
                                     force_raise_errors=True,   # a raises-exception tag too
                                     shutdown_kernel="immediate",
                                     resources={"metadata": {"path": str(workdir.resolve())}})
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
    gone = (exceptions.CellTimeoutError, exceptions.DeadKernelError)
    with client.setup_kernel(env=kernel_env):
        try:
            client.execute(cleanup_kc=False)
            run.ok = True
        except exceptions.CellExecutionError as exc:
            run.error = _first_line_of_error(exc)
        except gone as exc:
            run.error = _first_line_of_error(exc)
            read = None   # the kernel is busy or gone: nothing to read
        finally:
            run.seconds = time.perf_counter() - t0
        if read:
            try:
                run.values = read_values(client, read, timeout=cell_timeout)
            except (exceptions.CellExecutionError, *gone) as exc:
                run.error = (f"{run.error}; " if run.error else "") + \
                    f"reading the kernel's variables failed: {_first_line_of_error(exc)}"
    strip_widget_state(nb)
    nbformat.write(nb, run.ipynb)
    if html:
        run.html = write_html(nb, out_dir / f"{path.stem}.html")
    return run


def read_values(client, read: Mapping[str, str], timeout: float = 120.0) -> dict:
    """Evaluate ``read``'s expressions in the kernel of ``client`` (an nbclient client whose
    kernel is still up) and return their plain values. The reading cell is appended to the
    notebook for the call and removed again, so the written notebook never holds it."""
    from nbformat.v4 import new_code_cell

    source = (inspect.getsource(_report_values)
              + f"\n{_report_values.__name__}({dict(read)!r})\ndel {_report_values.__name__}\n")
    cell = new_code_cell(source)
    client.nb.cells.append(cell)
    index = len(client.nb.cells) - 1
    old_timeout = client.timeout
    client.timeout = timeout
    try:
        client.execute_cell(cell, index, store_history=False)
    finally:
        client.timeout = old_timeout
        del client.nb.cells[index]
    for out in cell.get("outputs", []):
        data = out.get("data") or {}
        if JSON_MIME in data:
            return dict(data[JSON_MIME])
    return {}


def _report_values(exprs):
    """Runs in the kernel (its source is sent there): each expression of ``exprs`` evaluated in
    the user's namespace, as plain JSON values (numpy and torch values and pandas objects turned
    into Python ones, NaN/inf into None, sets sorted, anything else its ``str``), displayed as
    one ``application/json`` output. An expression that raises is left out."""
    import math

    from IPython import get_ipython
    from IPython.display import display

    def plain(v):
        if hasattr(v, "to_dict") and callable(v.to_dict):   # pandas
            v = v.to_dict()
        elif hasattr(v, "tolist") and callable(v.tolist):   # numpy, torch
            v = v.tolist()
        if isinstance(v, float):
            return v if math.isfinite(v) else None
        if isinstance(v, (str, int, bool)) or v is None:
            return v
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, (set, frozenset)):
            return sorted((plain(x) for x in v), key=str)
        return str(v)

    namespace = get_ipython().user_ns
    values = {}
    for name, expr in exprs.items():
        try:
            values[name] = plain(eval(expr, namespace))
        except Exception:
            pass
    display({"application/json": values}, raw=True)


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
    optional: importing the demo or this module needs none)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"running notebooks needs {module} ({exc}); install the demo extra: "
                          "pip install -e '.[demo]' (make setup does)") from exc
