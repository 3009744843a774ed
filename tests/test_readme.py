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
import torch

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
PYTHON = list(dict.fromkeys(  # a command the README gives twice runs once
    c for c in COMMANDS if split(c)[1][:3] in (["python", "-m", "hybridnb"],)))
PIP = [c for c in COMMANDS if split(c)[1][:2] in (["pip", "install"], [".venv/bin/pip", "install"])]
VENV = [c for c in COMMANDS if split(c)[1][:3] == ["python", "-m", "venv"]]
GPU = [c for c in COMMANDS if split(c)[1] == ["nvidia-smi"]]


def test_the_readme_has_the_commands_this_test_knows():
    assert {"make demo", "make test", "make lab", "make bench", "make wheel"} <= set(MAKE)
    assert "python -m hybridnb compare --model eegnex" in PYTHON
    unknown = [c for c in COMMANDS if c not in MAKE + PYTHON + PIP + VENV + GPU]
    assert unknown == [], f"README commands this test neither runs nor checks: {unknown}"


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _wheel_name() -> str:
    import hybridnb

    project = _pyproject()
    assert project["dynamic"] == ["version"]   # written once: hybridnb.__version__
    return f"dist/{project['name']}-{hybridnb.__version__}-py3-none-any.whl"


@pytest.mark.parametrize("command", PIP)
def test_pip_commands_install_what_exists(command):
    """Every pip line installs the Makefile's torch pair, this clone, or the wheel `make wheel`
    writes, with extras pyproject defines, from PyPI or PyTorch's own index: no package index
    or repository that does not exist, no ``hybridnb`` by name from an index."""
    _, argv = split(command)
    pair = re.search(r"^TORCH_PAIR\s*:=\s*(.+)$", (ROOT / "Makefile").read_text(), re.M)[1].split()
    extras = set(_pyproject()["optional-dependencies"])
    words = argv[2:]
    if "--index-url" in words:
        i = words.index("--index-url")
        assert re.fullmatch(r"https://download\.pytorch\.org/whl/cu1\d\d", words[i + 1]), command
        assert words[:i] + words[i + 2:] == pair, command   # only the pinned pair from there
        return
    if words == pair:
        return
    if words[:1] == ["-e"]:
        words = words[1:]
    assert len(words) == 1, command
    target, _, extra = words[0].partition("[")
    assert target in (".", _wheel_name()), f"{command}: installs {target!r}, not this clone or its wheel"
    for name in filter(None, extra.rstrip("]").split(",")):
        assert name in extras, f"{command}: no extra {name!r} in pyproject"


def test_the_readme_names_no_index_or_repository_that_does_not_exist():
    assert "github.com/hybridnb" not in README
    assert not re.search(r"pip install[^\n`]*['\" ]hybridnb\[", README)  # as if it were on PyPI
    assert "make wheel" in README and _wheel_name() in README
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^wheel:", makefile, re.M) and "--wheel-dir dist" in makefile


def test_venv_and_gpu_commands_are_the_ordinary_ones():
    assert VENV == ["python -m venv .venv"]
    assert GPU == ["nvidia-smi"]   # not run: this machine may have no driver


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
    environ = dict(os.environ)
    environ.update(env, HYBRIDNB_DEVICE="cpu", HYBRIDNB_QUICK="1",
                   HYBRIDNB_CACHE_DIR=str(tmp_path))
    run = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, env=environ,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (command, run.stdout[-2000:], run.stderr[-2000:])
    if "compare" in argv:
        assert re.search(r"^\s*fp32\s+ok\b", run.stdout, flags=re.M), run.stdout
    elif "detect" in argv and "--json" in argv:
        assert '"device": "cpu"' in run.stdout
    elif "detect" in argv:
        assert re.search(r"\bcpu\b", run.stdout), run.stdout
    else:
        assert "detect" in run.stdout and "compare" in run.stdout


# ------------------------------------------------------------------ the schedule example


def _python_block(section: str) -> str:
    body = README.split(f"## {section}", 1)[1]
    return body.split("```python", 1)[1].split("```", 1)[0]


class Split:
    """Stands in for data_prep's Windows after the tour: ``.dataset(scale=...)`` is a Dataset."""

    def __init__(self, x, y):
        self.x, self.y = x / 1e6, y           # stored in volts, as data_prep stores windows

    def dataset(self, scale: float = 1.0):
        from torch.utils.data import TensorDataset

        return TensorDataset(self.x * scale, self.y)


class TinyNet(torch.nn.Module):
    """No arguments, defined at module level: ``hn.load(path)`` can import and rebuild it."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                       torch.nn.Linear(16, 1))

    def forward(self, x):
        return self.net(x)


def test_the_schedule_example_runs_as_written_and_one_cycle_reaches_its_last_step(
        tmp_path, monkeypatch):
    """The README's Trainer example, unchanged, on a small model and data it does not define
    (``model``, ``train``, ``val``): the OneCycleLR sized by ``total_steps`` takes every step to
    its floor, and ``hn.load(path)`` rebuilds the model without being given one."""
    import contextlib
    import io

    pytest.importorskip("tensorboard")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HYBRIDNB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HYBRIDNB_DEVICE", "cpu")
    monkeypatch.delenv("HYBRIDNB_QUICK", raising=False)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(384, 8, generator=g)
    y = torch.sin(x @ torch.linspace(-1, 1, 8)).unsqueeze(1)
    torch.manual_seed(0)
    model = TinyNet()
    names = {"model": model, "train": Split(x[:320], y[:320]), "val": Split(x[320:], y[320:])}
    code = _python_block("Logs, callbacks, schedules, saved models")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), names)
    trainer = names["trainer"]
    steps = trainer.steps
    assert trainer.stopped is None and len(trainer.history) == 20   # the budget did not stop it
    assert len(steps) == trainer.total_steps > 20          # every planned step was taken
    assert str(trainer.total_steps) in out.getvalue().splitlines()  # what the print showed
    floor = 1e-2 / 25 / 1e4          # OneCycleLR from max_lr=1e-2 with its default divisors
    assert steps["lr"].iloc[-1] == pytest.approx(floor, rel=1e-6)   # annealed: its last step
    assert max(steps["lr"]) == pytest.approx(1e-2, rel=0.05)
    assert (tmp_path / "runs" / "c1" / "history.csv").exists()
    loaded = names["model"]
    assert type(loaded) is TinyNet and loaded is not model and not loaded.training
    for a, b in zip(loaded.state_dict().values(), trainer.model.state_dict().values(),
                    strict=True):
        assert torch.equal(a, b)


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_python_block_runs_as_written_in_order(tmp_path, tour_cache):
    """What a reader does: paste each ``python`` block, top to bottom, into one session (quick
    mode: the Trainer caps epochs and steps; on the CPU, in a fresh folder; the cache is the
    one tests/test_tour.py uses, so the tour's release is written once)."""
    blocks = python_blocks(README)
    assert len(blocks) >= 3
    script = tmp_path / "readme.py"
    script.write_text("\n\n".join(f"# README block {i}\n{b}" for i, b in enumerate(blocks)))
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HYBRIDNB_")}
    environ.update(HYBRIDNB_QUICK="1", HYBRIDNB_DEVICE="cpu", HYBRIDNB_WARM_WORKER="0",
                   HYBRIDNB_CACHE_DIR=str(tour_cache),
                   PYTHONPATH=os.pathsep.join([str(ROOT), environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=environ,
                         capture_output=True, text=True, timeout=540)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "test nRMSE" in run.stdout and (tmp_path / "runs" / "c1" / "model.pt").exists()


# ------------------------------------------------------------------ the README agrees with itself


def test_one_cpu_speedup_figure_quoted_from_its_source():
    figures = set(re.findall(r"(\d+(?:\.\d+)?)× a stock hand-written loop", README))
    assert len(figures) == 1, figures
    source = (ROOT / "bench" / "results" / "cpu-speedups-latest.md").read_text()
    measured = re.search(r"hn\.Trainer with its defaults >= 2x the stock hand-written loop, "
                         r"whole runs \(measured (\d+\.\d+)x\)", source)
    assert measured and figures == {measured[1]}, (figures, measured)
    assert "bench/results/cpu-speedups-latest.md" in README


def test_the_notebooks_the_readme_says_read_data_are_those_that_do():
    import json

    reading = []
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        code = "".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"]
                       if c["cell_type"] == "code")
        if re.search(r"^DATA = ", code, flags=re.M):
            reading.append(nb.name[:2])
    said = re.search(r"Notebooks (\d\d), (\d\d) and (\d\d) read one setting, `DATA`", README)
    assert said and list(said.groups()) == reading, (reading, said)


def test_quick_mode_has_one_name():
    assert "HYBRIDNB_QUICK=1" in README
    assert not re.search(r"SMOKE|smoke|small mode", README)
