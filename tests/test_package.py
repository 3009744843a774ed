"""Package-level promises: cheap import, no GPU touched at import, one-way dependencies."""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _modules(package: str) -> list[str]:
    # with the prefix, sub-packages are imported as package.sub, never as a top-level name that
    # a tests/ folder of the same name (tests/speedups) would shadow
    path = ROOT / package
    found = pkgutil.walk_packages([str(path)], prefix=f"{package}.")
    return [m.name for m in found if not m.name[len(package) + 1:].startswith("_")
            and m.name != f"{package}.__main__"]


def test_import_hybridnb_is_lazy_and_does_not_import_torch():
    out = _run("import sys, hybridnb; print('torch' in sys.modules)")
    assert out == "False"


def test_importing_every_module_leaves_cuda_uninitialised():
    mods = _modules("hybridnb")
    code = ("import importlib, torch\n"
            f"for m in {mods!r}:\n    importlib.import_module(m)\n"
            "print(torch.cuda.is_initialized())")
    assert _run(code) == "False"


def test_data_prep_never_imports_hybridnb():
    mods = _modules("data_prep")
    code = ("import importlib, sys\n"
            f"for m in {mods!r}:\n    importlib.import_module(m)\n"
            "print(sorted(k for k in sys.modules if k.split('.')[0] == 'hybridnb'))")
    assert _run(code) == "[]"


def test_hybridnb_never_imports_data_prep():
    mods = _modules("hybridnb")
    code = ("import importlib, sys\n"
            f"for m in {mods!r}:\n    importlib.import_module(m)\n"
            "print(sorted(k for k in sys.modules if k.split('.')[0] == 'data_prep'))")
    assert _run(code) == "[]"


def test_public_names_resolve():
    import hybridnb as hn

    for name in ("detect", "Trainer", "compare", "launch", "quick", "frontend"):
        assert callable(getattr(hn, name)), name


# ------------------------------------------------------------------ every import is declared

OWN = {"hybridnb", "data_prep", "hybridnb_tools"}
# imported, but provided by something other than a pip dependency of this package
NOT_FROM_PYPI = {
    "google": "google.colab: Colab's runtime provides it (hybridnb/live, only on Colab)",
    "submission": "the user's submission.py, imported by data_prep/submission_check.py in the "
                  "unpacked submission's folder",
}
# an import name that is not its distribution's name, for a module not installed here
DISTRIBUTION_OF = {"sklearn": "scikit-learn", "IPython": "ipython", "pynvml": "nvidia-ml-py",
                   "mne_bids": "mne-bids", "jupyter_ui_poll": "jupyter-ui-poll"}


def _top_level_imports(source: str) -> set[str]:
    import ast

    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _imports_by_module() -> dict[str, set[str]]:
    """Top-level module -> where it is imported: the three packages, examples/ and the
    notebooks' code cells (magics turned into Python as IPython runs them)."""
    import json

    from IPython.core.inputtransformer2 import TransformerManager

    found: dict[str, set[str]] = {}
    files = [p for d in (*OWN, "examples") for p in sorted((ROOT / d).rglob("*.py"))]
    for path in files:
        for name in _top_level_imports(path.read_text()):
            found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    cells = TransformerManager()
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
            if cell["cell_type"] == "code":
                source = cells.transform_cell("".join(cell["source"]))
                for name in _top_level_imports(source):
                    found.setdefault(name, set()).add(f"{nb.name} cell {i}")
    return found


def _declared() -> dict[str, str]:
    """Normalised distribution name -> where pyproject declares it (dependencies or an extra)."""
    import re

    from packaging.requirements import Requirement

    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"dependencies": project["dependencies"], **{
        f"extra {k}": v for k, v in project["optional-dependencies"].items()}}
    return {re.sub(r"[-_.]+", "-", Requirement(r).name).lower(): where
            for where, reqs in groups.items() for r in reqs}


def test_every_imported_third_party_package_is_declared():
    import importlib.metadata
    import re

    declared = _declared()
    installed = importlib.metadata.packages_distributions()
    missing = {}
    for name, where in sorted(_imports_by_module().items()):
        if name in sys.stdlib_module_names or name in OWN or name in NOT_FROM_PYPI:
            continue
        dists = installed.get(name) or [DISTRIBUTION_OF.get(name, name)]
        if not any(re.sub(r"[-_.]+", "-", d).lower() in declared for d in dists):
            missing[name] = (dists, sorted(where)[:3])
    assert missing == {}, f"imported but not declared in pyproject.toml: {missing}"


def test_the_walk_sees_the_imports_it_must_check():
    found = _imports_by_module()
    assert {"torch", "sklearn", "IPython", "plotly"} <= set(found)   # packages and notebooks
    assert any(".ipynb cell" in w for w in found["plotly"])
    assert _declared()["scikit-learn"] == "dependencies"


# ------------------------------------------------------------------ the wheel (README "Install")


def test_the_wheel_installs_and_runs_outside_the_clone(tmp_path):
    """What `make wheel` builds holds the three packages and the model entry points; installed
    into a folder of its own it imports and runs from anywhere (not from the clone)."""
    import importlib.metadata
    import re
    import zipfile

    try:   # pyproject's build backend already here: build offline, else pip fetches it
        local = int(importlib.metadata.version("setuptools").split(".")[0]) >= 77
    except importlib.metadata.PackageNotFoundError:
        local = False
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                            *(["--no-build-isolation"] if local else []),
                            "--wheel-dir", str(tmp_path / "dist"), str(ROOT)],
                           capture_output=True, text=True, timeout=600, cwd=tmp_path)
    if build.returncode and re.search(r"(?i)network|connection|resolve|index", build.stderr):
        pytest.skip(f"building needs setuptools from the package index: {build.stderr[-300:]}")
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("hybridnb-*-py3-none-any.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if n.endswith(".py")} == {
        "hybridnb", "data_prep", "hybridnb_tools"}
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    requires = zipfile.ZipFile(wheel).read(meta).decode()
    assert "Requires-Dist: ipywidgets>=7.6" in requires      # Colab's ipywidgets 7 is kept
    import hybridnb

    assert f"\nVersion: {hybridnb.__version__}\n" in requires   # the one version, read from the package
    assert "License-Expression: BSD-3-Clause" in requires
    licence = next(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))
    assert "BSD 3-Clause License" in zipfile.ZipFile(wheel).read(licence).decode()
    points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "eegnex = hybridnb_tools.models:eegnex" in zipfile.ZipFile(wheel).read(points).decode()

    site = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                              "--no-index", "--target", str(site), str(wheel)],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HYBRIDNB_QUICK")}
    env.update(PYTHONPATH=str(site), HYBRIDNB_DEVICE="cpu", HYBRIDNB_CACHE_DIR=str(tmp_path))
    code = ("import hybridnb, data_prep.source, hybridnb_tools, sys; "
            "print(hybridnb.__file__); print(hybridnb.detect().device)")
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    where, device = run.stdout.split()[-2:]
    assert Path(where).is_relative_to(site) and device == "cpu"


# declared, and needed, but never imported by name here
IMPORTED_BY_OTHERS = {"anywidget": "plotly's FigureWidget (the live view's plots) is an anywidget"}


def test_every_declared_dependency_is_imported():
    """Dependencies chosen, not accumulated: each runtime dependency in pyproject is imported by
    the packages, examples/ or the notebooks (or says who needs it)."""
    import importlib.metadata
    import re

    from packaging.requirements import Requirement

    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    modules: dict[str, set[str]] = {}
    for module, dists in importlib.metadata.packages_distributions().items():
        for dist in dists:
            modules.setdefault(re.sub(r"[-_.]+", "-", dist).lower(), set()).add(module)
    imported = set(_imports_by_module())
    unused = []
    for req in project["dependencies"]:
        name = re.sub(r"[-_.]+", "-", Requirement(req).name).lower()
        if name not in IMPORTED_BY_OTHERS and not modules.get(name, {name}) & imported:
            unused.append(name)
    assert unused == [], f"declared in pyproject.toml but never imported: {unused}"
