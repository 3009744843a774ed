"""No import cycles inside hybridnb, function-level imports included.

Every module of the package (found with pkgutil) is parsed with ast; every ``import`` and
``from ... import`` anywhere in it counts: at module level, inside functions and methods, and
under ``if TYPE_CHECKING:`` (a cycle hidden there is still two modules that each need the other).
``from hybridnb.x import y`` is an edge to ``hybridnb.x.y`` when that is a module, else to
``hybridnb.x``. The implicit import of a parent package is not an edge (Python handles it). A
cycle fails the test with the modules named in order.
"""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "hybridnb"


def modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> source file (without importing any of it)."""
    found = {PACKAGE: ROOT / PACKAGE / "__init__.py"}

    def walk(path: Path, prefix: str) -> None:
        for info in pkgutil.iter_modules([str(path)]):
            name = f"{prefix}.{info.name}"
            if info.ispkg:
                found[name] = path / info.name / "__init__.py"
                walk(path / info.name, name)
            else:
                found[name] = path / f"{info.name}.py"

    walk(ROOT / PACKAGE, PACKAGE)
    return found


def imports_of(name: str, source: Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports, anywhere in its source."""
    is_pkg = source.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        if isinstance(node, ast.Import):
            out.update(_closest(a.name, known) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(name, is_pkg, node.module, node.level)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in known else _closest(base, known))
    out.discard(None)
    return {m for m in out if m != name}


def _absolute(name: str, is_pkg: bool, module: str | None, level: int) -> str:
    if level == 0:
        return module or ""
    parts = name.split(".") if is_pkg else name.split(".")[:-1]
    parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([module] if module else []))


def _closest(dotted: str, known: set[str]) -> str | None:
    """The module ``dotted`` names, or its nearest enclosing package of ours (None: not ours)."""
    parts = dotted.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each as one cycle path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(_path_through(sorted(component), edges))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _path_through(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """The shortest cycle through the component's first module: a -> b -> ... -> a."""
    members, start = set(component), component[0]
    parent: dict[str, str] = {start: start}
    frontier = [start]
    while frontier:  # breadth-first, until an edge leads back to the start
        nxt = []
        for v in frontier:
            for w in sorted(edges[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return path[::-1] + [start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    return component


def test_the_walk_sees_every_module_and_function_level_imports():
    edges = graph()
    assert {"hybridnb.cli", "hybridnb.hardware.detect", "hybridnb.hardware.probe.child",
            "hybridnb.train.trainer"} <= set(edges)
    # a function-level import is an edge (precision asks the hardware rules inside a function)
    assert "hybridnb.hardware.rules" in edges["hybridnb.train.precision"]
    # `from hybridnb.hardware import probe` is an edge to the package, `... import views` to
    # the module
    assert {"hybridnb.hardware.probe", "hybridnb.hardware.views"} <= \
        edges["hybridnb.hardware.detect"]


def test_the_cycle_finder_names_a_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_in_hybridnb():
    found = cycles(graph())
    if found:
        pytest.fail("import cycles (function-level imports count):\n"
                    + "\n".join("  " + " -> ".join(c) for c in found))


def packages(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded into hybridnb's sub-packages and top-level modules
    (``hybridnb.train.trainer`` -> ``hybridnb.train``); edges inside one unit are dropped, and so
    is the root package (its lazy public names import every part; no part imports it for more
    than ``__version__``)."""
    def unit(name: str) -> str:
        return ".".join(name.split(".")[:2])

    out: dict[str, set[str]] = {}
    for name, targets in edges.items():
        if unit(name) == PACKAGE:
            continue
        out.setdefault(unit(name), set()).update(
            unit(t) for t in targets if unit(t) not in (unit(name), PACKAGE))
    return out


def test_packages_fold_modules_into_their_sub_package():
    folded = packages({"hybridnb.train.a": {"hybridnb.train.b", "hybridnb.strategies.c"},
                       "hybridnb.strategies.c": {"hybridnb.files", "hybridnb"},
                       "hybridnb": {"hybridnb.train.a"}})
    assert folded == {"hybridnb.train": {"hybridnb.strategies"},
                      "hybridnb.strategies": {"hybridnb.files"}}


def test_no_import_cycles_between_hybridnb_sub_packages():
    """train <-> strategies and train <-> saving were such cycles (issue 27): a lower layer
    (strategies, saving) must not reach up into train, even inside a function."""
    found = cycles(packages(graph()))
    if found:
        pytest.fail("import cycles between sub-packages (function-level imports count):\n"
                    + "\n".join("  " + " -> ".join(c) for c in found))
