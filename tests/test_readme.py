"""Every shell command in the README runs as written.

The fenced ``bash`` blocks are read line by line (comments dropped). The cheap commands run
(``python -m hybridnb ... --help``, ``detect``, ``compare`` in quick mode, on the CPU, with the
test's own cache); the expensive ones are checked for what they need: a ``make`` target exists
in the Makefile. A command of a kind this test does not know fails it, so a new README command
gets a check.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def bash_commands(text: str) -> list[str]:
    """The commands of the ```bash blocks, one per line, comments and blank lines dropped."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
            if line:
                out.append(line)
    return out


def split(command: str) -> tuple[dict[str, str], list[str]]:
    """Leading VAR=value assignments, then the argv."""
    words = shlex.split(command)
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        k, _, v = words.pop(0).partition("=")
        env[k] = v
    return env, words


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {m for line in text.splitlines()
            for m in re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", line)}


COMMANDS = bash_commands(README)
MAKE = [c for c in COMMANDS if split(c)[1][:1] == ["make"]]
PYTHON = [c for c in COMMANDS if split(c)[1][:3] in (["python", "-m", "hybridnb"],)]


def test_the_readme_has_the_commands_this_test_knows():
    assert {"make demo", "make test", "make lab", "make bench"} <= set(MAKE)
    assert "python -m hybridnb compare --model eegnex" in PYTHON
    unknown = [c for c in COMMANDS if c not in MAKE and c not in PYTHON]
    assert unknown == [], f"README commands this test neither runs nor checks: {unknown}"


def test_the_readme_is_ordered_commands_tour_real_data():
    heads = [h for h in re.findall(r"^## (.+)$", README, flags=re.M)]
    order = [heads.index(h) for h in ("Two commands", "A short tour", "Train on the real data")]
    assert order == sorted(order), heads


@pytest.mark.parametrize("command", MAKE)
def test_make_commands_name_real_targets(command):
    env, argv = split(command)
    assert set(argv[1:]) <= make_targets(), (command, sorted(make_targets()))
    for var in env:
        assert var.startswith("HYBRIDNB_"), command


@pytest.mark.parametrize("command", PYTHON)
def test_hybridnb_commands_run_as_written(command, tmp_path):
    """Run on the CPU in quick mode (compare: one fp32 step), the cache the test's own."""
    env, argv = split(command)
    environ = {k: v for k, v in os.environ.items() if k != "HYBRIDNB_PROBE_SIMULATE"}
    environ.update(env, HYBRIDNB_DEVICE="cpu", HYBRIDNB_QUICK="1",
                   HYBRIDNB_CACHE_DIR=str(tmp_path))
    run = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, env=environ,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (command, run.stdout[-2000:], run.stderr[-2000:])
    if "compare" in argv:
        assert re.search(r"^\s*fp32\s+ok\b", run.stdout, flags=re.M), run.stdout
    elif "detect" in argv and "--json" in argv:
        assert '"device": "cpu"' in run.stdout
    else:
        assert "detect" in run.stdout and "compare" in run.stdout
