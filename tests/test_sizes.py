"""The house limits on size (docs/design.md §4): no module over 450 lines, no function over
60 lines of code, its docstring aside. A module that would pass the limit is split along a
seam into a new one; a function, into helpers."""

from __future__ import annotations

import ast

import pytest
from paths import ROOT

PACKAGE = ROOT / "src" / "adaptrack"
MODULES = sorted(PACKAGE.rglob("*.py"))
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60


def _name(path):
    return path.relative_to(PACKAGE).as_posix()


def _code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The lines from ``def`` to the function's end, its docstring aside."""
    lines = (node.end_lineno or node.lineno) - node.lineno + 1
    first = node.body[0]
    if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        lines -= (first.end_lineno or first.lineno) - first.lineno + 1
    return lines


def test_the_measures_see_something():
    assert len(MODULES) > 50
    tree = ast.parse("def f():\n    '''Doc\n    string.'''\n    x = 1\n    return x\n")
    function = tree.body[0]
    assert isinstance(function, ast.FunctionDef) and _code_lines(function) == 3


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_module_over_450_lines(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, f"{_name(path)} has {lines} lines: split it"


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_function_over_60_lines_of_code(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    long = [f"{node.name} (line {node.lineno}: {_code_lines(node)})"
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and _code_lines(node) > MAX_FUNCTION_LINES]
    assert not long, f"{_name(path)}: functions over {MAX_FUNCTION_LINES} lines: {long}"
