"""Every environment variable is read in one place (issue 27, item 10): ``hybridnb/env.py`` for
hybridnb; data_prep (which never imports hybridnb) may have its own single env module. Writes
(``os.environ[k] = v``, ``setdefault``, ``update``, ``pop``: defaults for a child) are allowed
anywhere. The scan is of the source (ast), so a read inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV_MODULES = {"hybridnb/env.py", "data_prep/environment.py"}
WRITES = {"setdefault", "update", "pop", "clear", "__setitem__", "__delitem__"}


def env_reads(source: str, filename: str = "<src>") -> list[int]:
    """Line numbers where ``source`` reads the environment (os.environ / os.getenv /
    ``from os import environ``), writes left out."""
    tree = ast.parse(source, filename)
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os" and any(
                a.name in ("environ", "getenv", "environb", "getenvb") for a in node.names):
            lines.append(node.lineno)
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "os" and node.attr in ("environ", "getenv", "environb")):
            continue
        up = parent.get(node)
        if isinstance(up, ast.Subscript) and isinstance(up.ctx, (ast.Store, ast.Del)):
            continue  # os.environ[k] = v
        if isinstance(up, ast.Attribute) and up.attr in WRITES:
            continue  # os.environ.setdefault(...)
        lines.append(node.lineno)
    return sorted(lines)


def test_the_scan_tells_reads_from_writes():
    src = ("import os\nos.environ['A'] = '1'\nos.environ.setdefault('B', '2')\n"
           "x = os.environ.get('C')\ny = os.getenv('D')\ndel os.environ['A']\n"
           "def f(env=None):\n    return os.environ if env is None else env\n")
    assert env_reads(src) == [4, 5, 8]


def test_no_module_but_env_py_reads_the_environment():
    found = {}
    for folder in ("hybridnb", "data_prep"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in ENV_MODULES:
                continue
            lines = env_reads(path.read_text(), rel)
            if lines:
                found[rel] = lines
    assert not found, ("read the environment through hybridnb/env.py (add an accessor there): "
                       + "; ".join(f"{f} line {', '.join(map(str, ls))}"
                                   for f, ls in found.items()))
