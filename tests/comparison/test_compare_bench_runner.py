"""The benchmark runner (`make bench`): a hung benchmark is stopped with everything it started,
and results/README.md lists the latest result of every benchmark with its goals."""

from __future__ import annotations

import importlib.util
import stat
import time
from pathlib import Path

# bench/ is a folder of scripts, not an installed package: load the runner from its file.
_spec = importlib.util.spec_from_file_location(
    "bench_runner", Path(__file__).resolve().parents[2] / "bench" / "__main__.py")
runner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runner)


def test_a_hung_benchmark_is_stopped_with_its_children(tmp_path, monkeypatch):
    pids = tmp_path / "pids"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nsleep 60 &\necho $! > {pids}\necho started\nsleep 60\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(runner.sys, "executable", str(fake))
    t0 = time.perf_counter()
    result = runner.run_one("hang", timeout=1.0)
    assert time.perf_counter() - t0 < 15
    assert result["status"].startswith("timeout")
    assert result["tail"] == ["started"]
    grandchild = int(pids.read_text())
    deadline = time.monotonic() + 3
    while _running(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(grandchild), "the benchmark's own child process survived the timeout"


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan waits for init to reap it, which can take a while)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_index_lists_latest_results_goals_and_the_last_run(tmp_path, monkeypatch):
    results = tmp_path / "results"
    results.mkdir()
    (tmp_path / "bench_speed.py").write_text(
        '"""How fast the thing is,\nmeasured twice.\n\nDetails nobody reads."""\n')
    (results / "speed-latest.md").write_text(
        "# Speed\n\n2031-01-02 · CPU x\n\nbody\n## Goals\n\n- MET: fast enough\n"
        "- not met: faster than light\n- n/a: GPU busy (no GPU)\n")
    (results / "speed-2031-01-02.md").write_text("# old copy\n")
    monkeypatch.setattr(runner, "BENCH", tmp_path)
    monkeypatch.setattr(runner, "RESULTS", results)

    path = runner.write_index([{"name": "speed", "status": "ok", "seconds": 12.3, "tail": []},
                               {"name": "broken", "status": "failed (exit 1)", "seconds": 4,
                                "tail": []}], 16.3)
    text = path.read_text()
    assert path == results / "README.md"
    row = next(ln for ln in text.splitlines() if ln.startswith("| speed |"))
    assert "[speed-latest.md](speed-latest.md)" in row and "2031-01-02" in row
    assert "1 MET · 1 not met · 1 n/a" in row
    assert "How fast the thing is, measured twice." in row and "nobody" not in row
    assert "- **speed** — not met: faster than light" in text
    assert "| broken | failed (exit 1) | 4 |" in text and "broken in 16 s" in text
    assert "old copy" not in text

    # a later partial run updates its benchmark and keeps the others' last status
    text = runner.write_index([{"name": "speed", "status": "timeout after 300 s",
                                "seconds": 300, "tail": []}], 300).read_text()
    assert "| speed | timeout after 300 s | 300 |" in text
    assert "| broken | failed (exit 1) | 4 |" in text
