"""The main job (``make demo``): run the numbered notebooks headless, in order, into
``runs/<timestamp>/`` and print the Challenge score table.

This runner does not write data itself: the notebooks do, through ``data_prep.source.resolve``
and their ``DATA`` setting. By default they write the HBN-like synthetic release under
``$HYBRIDNB_CACHE_DIR/synthetic/`` (``~/.cache/hybridnb/synthetic/``; reused afterwards);
``HYBRIDNB_DATA=R5-mini`` (or a release folder) runs them on real data (README, "Train on the
real data"). Each kernel runs in the run folder, so a notebook's ``runs/`` (checkpoints, the
saved model, submission.zip) lands in ``<run folder>/runs/``, beside the executed copies (kept
without stored widget state, with an HTML copy). The notebooks record nothing for this runner:
the score table is read from each kernel's variables after its last cell
(:data:`hybridnb_tools.scores.TABLE`). The parts: :mod:`hybridnb_tools.notebooks` (one notebook
run, the values read back), :mod:`hybridnb_tools.scores` (the table).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from hybridnb.env import HEADLESS_ENV, QUICK_ENV
from hybridnb.env import quick as runtime_quick
from hybridnb_tools.notebooks import NotebookRun, execute_notebook, find_notebooks
from hybridnb_tools.scores import TABLE, merged_values, summary

__all__ = ["NotebookRun", "run_demo", "main"]

DESCRIPTION = ("Run the numbered notebooks (notebooks/0*.ipynb) headless, in order, into "
               "runs/<timestamp>/ and print the Challenge score table. The notebooks write the "
               "synthetic release on first use (under ~/.cache/hybridnb/synthetic/, or "
               "$HYBRIDNB_CACHE_DIR/synthetic/) and reuse it afterwards; HYBRIDNB_DATA=R5-mini "
               "(or a release folder) runs them on real data instead. In the run folder this "
               "runner writes the executed notebooks, their HTML copies and results.json; the "
               "kernels run there, so the notebooks leave their checkpoints and submission.zip "
               "in its runs/ folder.")


def run_demo(notebooks: list[Path], out_dir: Path, *, quick: bool = False,
             read: Mapping[str, Mapping[str, str]] | None = None, cell_timeout: float = 900.0,
             html: bool = True, progress=print) -> list[NotebookRun]:
    """Execute ``notebooks`` in order into ``out_dir`` (each kernel working there, so the
    notebooks share ``out_dir/runs/``); every notebook runs even if one fails. From each kernel
    the score table's values (:data:`~hybridnb_tools.scores.TABLE`) are read after its last
    cell, plus ``read[<notebook name>]`` (name -> expression) where given."""
    env = {HEADLESS_ENV: "1"}
    if quick:
        env[QUICK_ENV] = "1"
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = []
    for path in notebooks:
        progress(f"[{len(runs) + 1}/{len(notebooks)}] {path.name} ...")
        wanted = {**TABLE, **((read or {}).get(path.stem) or {})}
        run = execute_notebook(path, out_dir, env=env, cwd=out_dir, read=wanted,
                               cell_timeout=cell_timeout, html=html, progress=progress)
        progress(f"    {'done' if run.ok else 'FAILED'} in {run.seconds:.1f} s"
                 + (f": {run.error}" if run.error else ""))
        runs.append(run)
    (out_dir / "results.json").write_text(json.dumps(
        {"notebooks": {r.name: {"ok": r.ok, "seconds": round(r.seconds, 2), "error": r.error,
                                "values": r.values} for r in runs},
         "table": merged_values(runs)}, indent=1, sort_keys=True))
    return runs


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
    parser.add_argument("--quick", action="store_true",
                        help="quick mode (HYBRIDNB_QUICK=1), as the tests run them")
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
    quick = bool(args.quick or runtime_quick())
    print(f"hybridnb demo: {len(notebooks)} notebooks from {folder} -> {out_dir}/"
          f"{' (quick mode)' if quick else ''}", flush=True)
    t0 = time.perf_counter()
    runs = run_demo(notebooks, out_dir, quick=quick, cell_timeout=args.cell_timeout,
                    html=not args.no_html, progress=lambda s: print(s, flush=True))
    print(summary(runs, out_dir, time.perf_counter() - t0, quick), flush=True)
    return 0 if all(r.ok for r in runs) else 1


def main(argv: list[str] | None = None) -> int:
    """``python -m hybridnb_tools.demo``: run the five notebooks headless (``make demo``)."""
    parser = argparse.ArgumentParser(prog="python -m hybridnb_tools.demo",
                                     description=DESCRIPTION)
    cli_args(parser)
    return cli(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
