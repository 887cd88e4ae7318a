"""The package's import structure (docs/design.md §4): no import circle, layers that
import only the layers below them, and no private name (one leading underscore) imported
from another module: what another module needs is public.

Every ``import`` counts, at module level or inside a function (a lazy import is a circle
all the same once both modules are loaded), except those under ``if TYPE_CHECKING:``,
which never run. No module re-exports names lazily through a module ``__getattr__``
(PEP 562): nothing is released, so a moved name is imported from where it lives.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from paths import ROOT

SRC = ROOT / "src"
PACKAGE = "adaptrack"

# Higher imports lower; layers of one rank do not import each other (docs/design.md §4).
RANKS = {
    "__main__": 10,
    "cli": 9,
    "serve": 8, "demo": 8,
    "eval": 7,
    "generate": 6, "scoring": 6,
    "call": 5,
    "options": 4, "results": 4,
    "sampling": 3, "testing": 3,
    "constraints": 2, "lm": 2,
    "tokenization": 1, "limits": 1,
    "cache": 0, "errors": 0, "flags": 0,
}


def _modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the package: dotted name → (file, whether it is a package)."""
    out = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(node: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """The import statements under ``node``, leaving out those that never run."""
    found: list[ast.Import | ast.ImportFrom] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            found.append(child)
        elif isinstance(child, ast.If) and _is_type_checking(child):
            continue
        else:
            found.extend(_import_nodes(child))
    return found


def _imports(name: str) -> set[str]:
    """The package's modules that module ``name`` imports (its own parent packages aside:
    Python loads them before the module in any case)."""
    path, is_package = MODULES[name]
    here = name if is_package else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            parts = here.split(".")
            base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
        submodules = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
        targets.update(submodules)
        if len(submodules) < len(node.names):
            targets.add(base)
    return {t for t in targets
            if t in MODULES and t != name and not name.startswith(t + ".")}


GRAPH = {name: _imports(name) for name in MODULES}


def _layer(name: str) -> str:
    return name.split(".")[1]


def _cycle() -> list[str] | None:
    """One import circle as a path that returns to its start, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(GRAPH):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_graph_sees_the_imports():
    # A parser that found nothing would pass every check below.
    assert "adaptrack.constraints.base" in GRAPH["adaptrack.constraints.stop"]
    assert "adaptrack.eval.raypool" in GRAPH["adaptrack.eval.pools"]  # inside a function
    assert "adaptrack.lm.shared_attention" in GRAPH["adaptrack.lm.hf"]  # from . import x
    assert "adaptrack.constraints.anything" not in GRAPH["adaptrack.constraints.base"]


def test_no_import_circle():
    cycle = _cycle()
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_every_module_has_a_layer():
    missing = sorted({_layer(n) for n in MODULES if n != PACKAGE} - set(RANKS))
    assert not missing, f"give these a rank in RANKS (docs/design.md §4): {missing}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n != PACKAGE))
def test_layers_import_only_layers_below(name):
    # The package's __init__ is the public surface: it imports from every layer.
    upward = sorted(t for t in GRAPH[name] if t != PACKAGE and _layer(t) != _layer(name)
                    and RANKS[_layer(t)] >= RANKS[_layer(name)])
    assert not upward, f"{name} imports a layer not below its own: {upward}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_getattr_shim(name):
    tree = ast.parse(MODULES[name][0].read_text(encoding="utf-8"))
    shims = [node.lineno for node in tree.body
             if isinstance(node, ast.FunctionDef) and node.name == "__getattr__"]
    assert not shims, f"{name} re-exports names through a module __getattr__ (line {shims})"


def _private_imports(name: str, text: str | None = None) -> dict[str, set[str]]:
    """The private names (one leading underscore) that module ``name`` (its file, or
    ``text``) imports from another of the package's modules, by that module."""
    path, is_package = MODULES.get(name, (None, False))
    here = name if is_package else name.rpartition(".")[0]
    found: dict[str, set[str]] = {}
    source = text if text is not None else path.read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = node.module or ""
        if node.level:
            parts = here.split(".")
            base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
        private = {a.name for a in node.names
                   if a.name.startswith("_") and not a.name.startswith("__")}
        if base.startswith(PACKAGE) and private:
            found.setdefault(base, set()).update(private)
    return found


def test_the_private_import_check_sees_them():
    text = "from ..call import PreparedCall, _fit_prompt\nfrom .errors import __all__\n"
    assert _private_imports("adaptrack.serve.preprocess", text) == {
        "adaptrack.call": {"_fit_prompt"}}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_private_name_imported_across_modules(name):
    # A name another module needs is part of its module's interface: public, or moved.
    extra = {source: sorted(names) for source, names in _private_imports(name).items()}
    assert not extra, f"{name} imports private names: {extra}"
