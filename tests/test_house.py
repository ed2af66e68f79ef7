"""The house rules our docs promise (docs/architecture.md, "House rules"), checked on
every run: no function over 60 lines and no module over 400 in specllama/, bench/ and
harness/, nothing there imports test code, and tests use what they test by its public
names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted([*ROOT.glob("specllama/**/*.py"), *ROOT.glob("bench/**/*.py"),
                  *ROOT.glob("harness/**/*.py")])
TESTS = sorted(ROOT.glob("tests/**/*.py"))
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 400


def long_functions(source: str, limit: int) -> list[tuple[str, int]]:
    """(name, lines) of each function or method longer than `limit`, decorators aside."""
    return [(node.name, node.end_lineno - node.lineno + 1)
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno is not None and node.end_lineno - node.lineno + 1 > limit]


def test_the_rule_catches_a_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    assert long_functions(f"def f():\n{body}\n", MAX_FUNCTION_LINES) == [("f", 62)]
    assert long_functions("def g():\n    return 1\n", MAX_FUNCTION_LINES) == []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_functions_and_modules_stay_short(path: Path):
    source = path.read_text(encoding="utf-8")
    assert long_functions(source, MAX_FUNCTION_LINES) == []
    assert len(source.splitlines()) <= MAX_MODULE_LINES


def test_the_product_and_the_benches_import_no_test_code():
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not [n for n in names if n == "tests" or n.startswith("tests.")], path


def private_imports(source: str, ours: set[str]) -> list[str]:
    """`module.name` of each underscored name imported from our own code: the product,
    the benches, the harness or another test module (a library's are its business)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] in ours:
            found += [f"{node.module}.{a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_the_private_import_rule_catches_one():
    assert private_imports("from bench.x import _f, g\nfrom numpy import _y\n",
                           {"bench"}) == ["bench.x._f"]


def test_tests_import_no_private_names():
    ours = {"specllama", "bench", "harness", *(p.stem for p in TESTS)}
    found = {str(p.relative_to(ROOT)): private_imports(p.read_text(encoding="utf-8"), ours)
             for p in TESTS}
    assert {path: names for path, names in found.items() if names} == {}
