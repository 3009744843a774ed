"""The README's short tour (examples/tour.py): the README quotes the script, and the script runs,
learns (test nRMSE clearly below the constant predictor's 1.0) and overwrites no earlier run."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOUR = ROOT / "examples" / "tour.py"


def _between(text: str, begin: str, end: str) -> str:
    lines = text.splitlines()
    i = next(n for n, ln in enumerate(lines) if ln.strip() == begin)
    j = next(n for n, ln in enumerate(lines) if n > i and ln.strip() == end)
    return textwrap.dedent("\n".join(lines[i + 1:j])).strip()


def test_the_readme_quotes_the_tour_script():
    script = _between(TOUR.read_text(), "# tour: begin", "# tour: end")
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## A short tour", 1)[1]
    block = section.split("```python", 1)[1].split("```", 1)[0].strip()
    assert script in block, "README's tour differs from examples/tour.py: copy it over"


@pytest.mark.slow
def test_the_tour_learns_and_leaves_earlier_runs_alone(tmp_path, tour_cache):
    earlier = {tmp_path / "runs" / "c1" / "last.pt": b"an earlier run",
               tmp_path / "runs" / "tour-20250101-000000-000000" / "best.pt": b"another one"}
    for path, data in earlier.items():
        path.parent.mkdir(parents=True)
        path.write_bytes(data)
    proc = subprocess.run([sys.executable, str(TOUR), "--seed", "0", "--cache",
                           str(tour_cache), "--runs", str(tmp_path / "runs")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    found = re.search(r"test nRMSE (\d+\.\d+) on (\d+) windows", proc.stdout)
    assert found, proc.stdout[-2000:]
    assert float(found[1]) < 0.8, f"the tour no longer learns: {found[0]}"
    for path, data in earlier.items():
        assert path.read_bytes() == data, f"{path} was overwritten"
    fresh = [p for p in (tmp_path / "runs").iterdir() if p.name.startswith("tour-")
             and p.name != "tour-20250101-000000-000000"]
    assert len(fresh) == 1 and any(fresh[0].glob("*.pt")), fresh
