"""Shared helpers for the benchmarks: the machine description, interleaved timing, result files.

Every benchmark measures ratios side by side in one run (A B A B ...), takes the median of
repeats, prints a markdown table and writes it, dated, under ``bench/results/``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    """CPU model, usable cores, RAM, GPU (via NVML, without initialising CUDA), torch version."""
    info = {"python": platform.python_version(), "cores": len(os.sched_getaffinity(0))}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    except OSError:
        info["cpu"] = platform.processor() or "?"
    try:
        import psutil
        info["ram_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    try:
        import torch
        info["torch"] = torch.__version__
    except ImportError:
        info["torch"] = "-"
    info["gpu"] = _gpu_names() or "none"
    return info


def _gpu_names() -> str:
    from hybridnb.hardware import nvml

    return ", ".join(nvml.name(nvml.handle_by_index(i)) or "?"
                     for i in range(nvml.count() or 0))


def interleaved(funcs: dict[str, Callable[[], float | None]], repeats: int = 3
                ) -> dict[str, list[float]]:
    """Run each function once per round, in turn (A B A B ...), ``repeats`` rounds.

    A function returns its own measurement (e.g. seconds for its timed part) or None, in which
    case its wall time is recorded. Returns every measurement per name.
    """
    out: dict[str, list[float]] = {name: [] for name in funcs}
    for _ in range(repeats):
        for name, fn in funcs.items():
            t0 = time.perf_counter()
            value = fn()
            out[name].append(time.perf_counter() - t0 if value is None else float(value))
    return out


def median(values: list[float]) -> float:
    return statistics.median(values)


def spread(values: list[float]) -> str:
    """min–max as text, for the tables."""
    return f"{min(values):.3g}–{max(values):.3g}"


def load_note(at_start: float | None = None) -> str:
    """The machine's load average as a sentence for a result, e.g. to explain a wide spread.

    Pass ``os.getloadavg()[0]`` taken when the benchmark started to report start and end.
    """
    try:
        now = os.getloadavg()[0]
    except OSError:
        return ""
    cores = len(os.sched_getaffinity(0))
    start = f"{at_start:.1f} at the start, " if at_start is not None else ""
    busy = " — other work shared the CPU, so timings are noisy" if max(
        now, at_start or 0) > cores * 0.75 else ""
    return f"Load average (1 min): {start}{now:.1f} at the end, on {cores} cores{busy}."


def markdown_table(rows: list[dict], columns: list[str] | None = None) -> str:
    if not rows:
        return "(no rows)\n"
    columns = columns or list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(c, "")) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def write_result(name: str, title: str, body: str, goals: list[tuple[str, bool | None]] = ()
                 ) -> Path:
    """Print and write ``bench/results/<name>-<date>.md`` (and ``<name>-latest.md``).

    ``goals`` is a list of (goal text, met?) — met None means 'not measured here'.
    """
    m = machine()
    stamp = _dt.datetime.now().strftime("%Y-%m-%d")
    goal_lines = "".join(
        f"- {'MET' if ok else ('not met' if ok is False else 'n/a')}: {text}\n"
        for text, ok in goals)
    text = (f"# {title}\n\n{stamp} · CPU {m.get('cpu')} · {m.get('cores')} usable cores · "
            f"RAM {m.get('ram_gib', '?')} GiB · GPU {m.get('gpu')} · torch {m.get('torch')} · "
            f"python {m.get('python')}\n\n{body}\n"
            + (f"## Goals\n\n{goal_lines}" if goal_lines else ""))
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}-{stamp}.md"
    path.write_text(text)
    (RESULTS / f"{name}-latest.md").write_text(text)
    print(text)
    return path


_PRIMED: set[str] = set()


def prime_bytecode() -> None:
    """Compile this checkout's packages to ``__pycache__`` once, as ``pip install`` does for an
    installed package, so fresh processes time imports, not compiling (this machine sets
    PYTHONDONTWRITEBYTECODE, and an editable install ships no bytecode: measured 0.12 s of
    hybridnb.train.trainer's 0.155 s import was compiling)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root in _PRIMED:
        return
    subprocess.run([sys.executable, "-m", "compileall", "-q", "hybridnb", "data_prep",
                    "hybridnb_tools", "bench"], cwd=root, check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _PRIMED.add(root)


def run_fresh(module: str, args: list[str], mark: str, timeout: float) -> tuple[dict, str]:
    """Run ``python -m module args --t0 <spawn time>`` in a fresh process (its own session,
    killed with its group on timeout) and parse the JSON line it prints after ``mark``.
    Returns (result, output); the result has ``total_s`` (wall clock from spawn) or ``error``.
    The checkout's bytecode is compiled first (``prime_bytecode``)."""
    prime_bytecode()
    t_spawn, t0 = time.time(), time.perf_counter()
    cmd = [sys.executable, "-m", module, *args, "--t0", repr(t_spawn)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return {"error": f"timed out after {timeout:.0f} s"}, out
    wall = time.perf_counter() - t0
    line = next((ln for ln in reversed(out.splitlines()) if ln.startswith(mark)), None)
    if proc.returncode != 0 or line is None:
        tail = [ln for ln in out.splitlines() if ln.strip()][-12:]
        print(f"  {module} {' '.join(args)} failed (exit {proc.returncode}):\n"
              + "\n".join(tail), flush=True)
        return {"error": f"exit {proc.returncode}: {tail[-1][:160] if tail else ''}"}, out
    result = json.loads(line[len(mark):])
    result["total_s"] = wall
    return result, out
