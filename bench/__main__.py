"""Run every benchmark (``bench/bench_*.py``), each in a fresh process with a time limit, then
rewrite ``bench/results/README.md``: the latest result of each benchmark, one line on what it means.

    .venv/bin/python -m bench                  # all of them (what `make bench` runs)
    .venv/bin/python -m bench compare peers    # only these
    .venv/bin/python -m bench --timeout 120    # seconds per benchmark (default 360)

A fresh process per benchmark keeps one benchmark's imports, threads and allocator state out of
the next one's numbers, and lets a hung benchmark be stopped without losing the others.
"""

from __future__ import annotations

import argparse
import ast
import collections
import datetime as _dt
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
DEFAULT_TIMEOUT = 360.0


# benchmarks whose result files are named otherwise than the module: module name -> file stem
RESULT_STEMS = {"cpu_speedups": "cpu-speedups"}


def discover() -> list[str]:
    """Benchmark names: ``bench/bench_<name>.py`` -> ``<name>``, sorted."""
    return sorted(p.stem[len("bench_"):] for p in BENCH.glob("bench_*.py"))


def result_stem(name: str) -> str:
    """The stem of a benchmark's result files (``results/<stem>-latest.md``)."""
    return RESULT_STEMS.get(name, name)


def bench_name(stem: str) -> str:
    """The benchmark that writes ``results/<stem>-latest.md``."""
    return next((n for n, s in RESULT_STEMS.items() if s == stem), stem)


def run_one(name: str, timeout: float) -> dict:
    """Run ``python -m bench.bench_<name>`` in its own process group; stream its output."""
    cmd = [sys.executable, "-m", f"bench.bench_{name}"]
    print(f"\n=== bench {name}: {' '.join(cmd[1:])} (limit {timeout:.0f} s) ===", flush=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started, t0 = time.time(), time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True)
    tail: collections.deque[str] = collections.deque(maxlen=25)
    reader = threading.Thread(target=_pump, args=(proc.stdout, tail), daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _stop_group(proc)
    except KeyboardInterrupt:
        _stop_group(proc)
        raise
    reader.join(timeout=5)
    seconds = time.perf_counter() - t0
    result = BENCH / "results" / f"{result_stem(name)}-latest.md"
    wrote = result.exists() and result.stat().st_mtime >= started - 1
    if timed_out:
        status = f"timeout after {timeout:.0f} s"
    elif proc.returncode != 0:
        status = f"failed (exit {proc.returncode})"
    elif not wrote:
        status = f"ran, but wrote no results/{result_stem(name)}-latest.md"
    else:
        status = "ok"
    print(f"=== bench {name}: {status} in {seconds:.0f} s ===", flush=True)
    return {"name": name, "status": status, "seconds": seconds, "tail": list(tail)}


def _pump(stream, tail) -> None:
    for line in stream:
        sys.stdout.write(line)
        sys.stdout.flush()
        tail.append(line.rstrip("\n"))


def _stop_group(proc: subprocess.Popen) -> None:
    """Stop the benchmark and the processes it started (its own session): TERM, then KILL."""
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def describe(name: str) -> str:
    """The benchmark's own summary: the first paragraph of its module docstring, on one line."""
    path = BENCH / f"bench_{name}.py"
    try:
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    except (OSError, SyntaxError):
        doc = ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def _summary(path: Path) -> dict:
    """Title, date and goal verdicts of one result file (as written by common.write_result)."""
    text = path.read_text(errors="replace")
    title = next((ln[2:].strip() for ln in text.splitlines() if ln.startswith("# ")), path.stem)
    date = re.search(r"\b(\d{4}-\d{2}-\d{2})\b", text)
    goals = re.findall(r"^- (MET|not met|n/a): (.*)$", text, flags=re.M)
    return {"title": title, "date": date.group(1) if date else "?", "goals": goals}


def write_index(this_run: list[dict], total_s: float | None) -> Path:
    """Rewrite results/README.md from every ``*-latest.md`` there (and this run's statuses)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    latest = sorted(RESULTS.glob("*-latest.md"))
    lines = [
        "# Benchmark results",
        "",
        "Written by `make bench` (`.venv/bin/python -m bench`). Each link is the latest run of "
        "one benchmark; dated copies sit beside it. Ratios are measured side by side in one run "
        "(interleaved A B A B, median of repeats); each file names the machine it ran on.",
        "",
        "| benchmark | latest | date | goals | what it tells you |",
        "|---|---|---|---|---|",
    ]
    goal_lines = []
    for path in latest:
        name = path.name[: -len("-latest.md")]
        info = _summary(path)
        counts = collections.Counter(v for v, _ in info["goals"])
        verdict = " · ".join(f"{counts[k]} {k}" for k in ("MET", "not met", "n/a") if counts[k])
        meaning = describe(bench_name(name)) or info["title"]
        lines.append(f"| {name} | [{path.name}]({path.name}) | {info['date']} | "
                     f"{verdict or '–'} | {meaning} |")
        goal_lines += [f"- **{name}** — {v}: {text}" for v, text in info["goals"]]
    if not latest:
        lines.append("| – | no results yet | | | |")
    if goal_lines:
        lines += ["", "## Goals, as of each latest result", "", *goal_lines]
    runs = _remember_runs(this_run, total_s)
    if runs["benchmarks"]:
        lines += ["", "## Last runs", "", "| benchmark | status | seconds | when |",
                  "|---|---|---|---|"]
        lines += [f"| {name} | {r['status']} | {r['seconds']:.0f} | {r['when']} |"
                  for name, r in sorted(runs["benchmarks"].items())]
        last = runs.get("last_invocation")
        if last:
            lines += ["", f"Last `python -m bench` invocation ({last['when']}): "
                      f"{', '.join(last['names'])} in {last['total_s']:.0f} s "
                      f"({last['total_s'] / 60:.1f} min)."]
    path = RESULTS / "README.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _remember_runs(this_run: list[dict], total_s: float | None) -> dict:
    """Each benchmark's last status and time, kept in results/runs.json across partial runs."""
    store = RESULTS / "runs.json"
    try:
        runs = json.loads(store.read_text())
    except (OSError, ValueError):
        runs = {}
    runs.setdefault("benchmarks", {})
    when = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    for r in this_run:
        runs["benchmarks"][r["name"]] = {"status": r["status"], "seconds": round(r["seconds"], 1),
                                         "when": when}
    if this_run and total_s is not None:
        runs["last_invocation"] = {"when": when, "names": [r["name"] for r in this_run],
                                   "total_s": round(total_s, 1)}
    store.write_text(json.dumps(runs, indent=1) + "\n")
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help="seconds per benchmark before it is stopped")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--index-only", action="store_true",
                        help="only rewrite results/README.md from the existing results")
    args = parser.parse_args(argv)
    names = discover()
    if args.list:
        for name in names:
            print(f"{name:12s} {describe(name)}")
        return 0
    if args.index_only:
        print(write_index([], None))
        return 0
    unknown = [n for n in args.names if n not in names]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; there are {names}")
    chosen = args.names or names
    t0 = time.perf_counter()
    done = []
    for name in chosen:
        done.append(run_one(name, args.timeout))
    total = time.perf_counter() - t0
    index = write_index(done, total)
    print(f"\n=== {len(done)} benchmarks in {total:.0f} s ({total / 60:.1f} min); "
          f"index: {index.relative_to(ROOT)} ===")
    failed = [r for r in done if r["status"] != "ok"]
    for r in done:
        print(f"  {r['name']:12s} {r['status']:40s} {r['seconds']:6.0f} s")
    for r in failed:
        print(f"\n--- {r['name']}: {r['status']}; last lines of its output:")
        print("\n".join(r["tail"][-12:]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
