"""The main job: run the five notebooks headless and print what they found.

``python -m hybridnb_tools.demo`` (``make demo``) executes ``notebooks/0*.ipynb`` in order with nbclient into
``runs/<timestamp>/`` (the executed notebook, without stored widget state, and an HTML copy), then
prints a closing table: device, Challenge 1 and 2 nRMSE, the overall score, the baselines, the wall
time of each notebook and where everything is.

The notebooks report their numbers through :func:`record`, which writes a small JSON file named by
the ``HYBRIDNB_RESULTS`` environment variable (and does nothing when it is unset, e.g. in
JupyterLab). This module never imports ``data_prep``: the notebooks do the EEG work.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hybridnb.env import HEADLESS_ENV, SMOKE_ENV
from hybridnb.env import smoke as runtime_smoke

RESULTS_ENV = "HYBRIDNB_RESULTS"
RUN_DIR_ENV = "HYBRIDNB_RUN_DIR"
PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


# --------------------------------------------------------------------------------------------
# What a notebook calls
# --------------------------------------------------------------------------------------------

def record(**values: Any) -> None:
    """Add ``values`` to this notebook's results file (``$HYBRIDNB_RESULTS``), if one was asked
    for (the demo does; elsewhere this does nothing). Numbers are stored as plain floats/ints."""
    clean = {k: _plain(v) for k, v in values.items()}
    path = os.environ.get(RESULTS_ENV)
    if not path:
        return
    path = Path(path)
    current = json.loads(path.read_text()) if path.exists() else {}
    current.update(clean)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(current, indent=1, sort_keys=True))
    os.replace(tmp, path)


def run_dir(default: str | os.PathLike = "runs") -> Path:
    """Where a notebook should leave checkpoints and files: ``$HYBRIDNB_RUN_DIR`` under the demo
    (so they sit next to the executed notebooks), else ``default``."""
    return Path(os.environ.get(RUN_DIR_ENV) or default)


def _plain(v: Any) -> Any:
    if hasattr(v, "item") and callable(v.item) and getattr(v, "ndim", 0) == 0:
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return str(v)


# --------------------------------------------------------------------------------------------
# Running notebooks
# --------------------------------------------------------------------------------------------

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
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    path, out_dir = Path(path), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    run = NotebookRun(name=path.stem, ipynb=out_dir / path.name)
    results_path = out_dir / f"{path.stem}.results.json"
    results_path.unlink(missing_ok=True)
    kernel_env = {**os.environ, **(env or {}), RESULTS_ENV: str(results_path.resolve())}

    nb = nbformat.read(path, as_version=4)
    n_code = sum(c.cell_type == "code" for c in nb.cells)
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3",
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
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:
        run.error = _first_line_of_error(exc)
    finally:
        run.seconds = time.perf_counter() - t0
    strip_widget_state(nb)
    nbformat.write(nb, run.ipynb)
    if html:
        run.html = write_html(nb, out_dir / f"{path.stem}.html")
    if results_path.exists():
        run.results = json.loads(results_path.read_text())
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

    from nbconvert import HTMLExporter

    nb = copy.deepcopy(nb)
    script = _plotly_js_next_to(path.parent)
    first = True
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data") or {}
            if PLOTLY_MIME in data and "text/html" not in data:
                data["text/html"] = _plotly_div(data[PLOTLY_MIME], script if first else False)
                first = False
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
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


# --------------------------------------------------------------------------------------------
# The closing table
# --------------------------------------------------------------------------------------------

def merged_results(runs: list[NotebookRun]) -> dict:
    """Every notebook's recorded values in one dict (later notebooks win on the same key)."""
    out: dict = {}
    for r in runs:
        out.update(r.results)
    return out


def _num(v: Any, digits: int = 3) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return f"{v:.{digits}f}"
    return "-" if v is None else str(v)


def summary(runs: list[NotebookRun], out_dir: Path, total_s: float, smoke: bool) -> str:
    """The closing table, with plain ``C1 nRMSE <v>``, ``C2 nRMSE <v>``, ``overall <v>`` lines."""
    res = merged_results(runs)
    device = res.get("device", "-")
    precision = res.get("precision")
    lines = [
        "",
        f"hybridnb demo · {'small (HYBRIDNB_SMOKE=1)' if smoke else 'default'} mode · "
        f"device {device}{f' ({precision})' if precision else ''}",
        "",
        f"{'notebook':<32} {'status':<8} {'wall':>8}",
    ]
    for r in runs:
        status = "ok" if r.ok else "FAILED"
        lines.append(f"{r.name:<32} {status:<8} {r.seconds:>6.1f} s")
        if r.error:
            lines.append(f"    {r.error}")
    lines.append(f"{'total':<32} {'':<8} {total_s:>6.1f} s")
    lines += [
        "",
        f"{'score (lower is better)':<26} {'value':>8} {'constant':>9} {'ceiling':>9}  model",
        f"{'Challenge 1 nRMSE':<26} {_num(res.get('c1_nrmse')):>8} "
        f"{_num(res.get('c1_constant_nrmse', 1.0)):>9} {_num(res.get('c1_ceiling_nrmse')):>9}  "
        f"{res.get('c1_model', '-')}",
        f"{'Challenge 2 nRMSE':<26} {_num(res.get('c2_nrmse')):>8} "
        f"{_num(res.get('c2_constant_nrmse', 1.0)):>9} {_num(res.get('c2_ceiling_nrmse')):>9}  "
        f"{res.get('c2_model', '-')}",
        f"{'overall 0.3·C1 + 0.7·C2':<26} {_num(res.get('overall')):>8} {_num(1.0):>9} "
        f"{_num(res.get('overall_ceiling')):>9}",
    ]
    if res.get("submission_nrmse") is not None:
        lines.append(f"submission zip loaded in a fresh process: outputs "
                     f"{tuple(res.get('submission_output_shape') or ())} on the C1 test "
                     f"windows, C1 nRMSE {_num(res.get('submission_nrmse'))}, "
                     f"C2 nRMSE {_num(res.get('submission_c2_nrmse'))}")
    lines += [
        "",
        "constant = predicting the test mean (scores exactly 1.0); ceiling = the best nRMSE the "
        "synthetic data's planted signal allows.",
        "",
        f"device {device}",
        f"C1 nRMSE {_num(res.get('c1_nrmse'), 4)}",
        f"C2 nRMSE {_num(res.get('c2_nrmse'), 4)}",
        f"overall {_num(res.get('overall'), 4)}",
        f"wall time {total_s:.1f} s",
        f"outputs in {out_dir}/ (executed notebooks, HTML, *.results.json, checkpoints, "
        f"submission.zip)",
    ]
    return "\n".join(lines)


def run_demo(notebooks: list[Path], out_dir: Path, *, smoke: bool = False,
             cell_timeout: float = 900.0, html: bool = True, progress=print) -> list[NotebookRun]:
    """Execute ``notebooks`` in order into ``out_dir``; every notebook runs even if one fails."""
    env = {HEADLESS_ENV: "1", RUN_DIR_ENV: str(out_dir.resolve())}
    if smoke:
        env[SMOKE_ENV] = "1"
    runs = []
    for path in notebooks:
        progress(f"[{len(runs) + 1}/{len(notebooks)}] {path.name} ...")
        run = execute_notebook(path, out_dir, env=env, cell_timeout=cell_timeout, html=html,
                               progress=progress)
        progress(f"    {'done' if run.ok else 'FAILED'} in {run.seconds:.1f} s"
                 + (f": {run.error}" if run.error else ""))
        runs.append(run)
    (out_dir / "results.json").write_text(json.dumps(
        {"notebooks": {r.name: {"ok": r.ok, "seconds": round(r.seconds, 2), "error": r.error}
                       for r in runs},
         "results": merged_results(runs)}, indent=1, sort_keys=True))
    return runs


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------

def _default_notebooks() -> Path:
    here = Path.cwd() / "notebooks"
    return here if here.is_dir() else Path(__file__).resolve().parents[1] / "notebooks"


def cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--notebooks", type=Path, default=None,
                        help="folder with 01_*.ipynb ... (default: ./notebooks)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: runs/<timestamp>)")
    parser.add_argument("--only", nargs="*", default=None, metavar="NN",
                        help="run only these notebooks, by number (e.g. --only 01 04)")
    parser.add_argument("--smoke", action="store_true",
                        help="small mode (HYBRIDNB_SMOKE=1), as the tests run them")
    parser.add_argument("--cell-timeout", type=float, default=900.0,
                        help="seconds one cell may run (default 900)")
    parser.add_argument("--no-html", action="store_true", help="skip the HTML copies")


def cli(args: argparse.Namespace) -> int:
    folder = args.notebooks or _default_notebooks()
    notebooks = find_notebooks(folder)
    if args.only:
        wanted = {n.zfill(2) for n in args.only}
        notebooks = [p for p in notebooks if p.name[:2] in wanted]
        if not notebooks:
            print(f"--only {' '.join(args.only)} matches no notebook in {folder}", file=sys.stderr)
            return 2
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = args.out or Path("runs") / stamp
    smoke = bool(args.smoke or runtime_smoke())
    print(f"hybridnb demo: {len(notebooks)} notebooks from {folder} -> {out_dir}/"
          f"{' (small mode)' if smoke else ''}", flush=True)
    t0 = time.perf_counter()
    runs = run_demo(notebooks, out_dir, smoke=smoke, cell_timeout=args.cell_timeout,
                    html=not args.no_html, progress=lambda s: print(s, flush=True))
    print(summary(runs, out_dir, time.perf_counter() - t0, smoke), flush=True)
    return 0 if all(r.ok for r in runs) else 1


def main(argv: list[str] | None = None) -> int:
    """``python -m hybridnb_tools.demo``: run the five notebooks headless (``make demo``)."""
    parser = argparse.ArgumentParser(prog="python -m hybridnb_tools.demo",
                                     description=__doc__.splitlines()[0])
    cli_args(parser)
    return cli(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
