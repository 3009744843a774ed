"""Package-level promises: cheap import, no GPU touched at import, one-way dependencies."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

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
