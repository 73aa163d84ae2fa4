"""The test tree's layout: test modules share helpers through tests/fixtures/, never by
importing each other or conftest (a test module run alone, or renamed, must not break
another)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of its code (top-level names)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: a sibling module
                found.update(f".{alias.name}" for alias in node.names)
                if node.module:
                    found.add(f".{node.module.split('.')[0]}")
            elif node.module:
                found.add(node.module.split(".")[0])
    return found


def test_no_test_module_imports_another_or_conftest():
    offenders = {}
    for path in sorted(TESTS.glob("test_*.py")) + sorted((TESTS / "fixtures").glob("*.py")):
        bad = sorted(m for m in imported_modules(path)
                     if m.lstrip(".").startswith("test_") or m.lstrip(".") == "conftest")
        if bad:
            offenders[str(path.relative_to(TESTS))] = bad
    assert offenders == {}


def test_the_check_sees_such_an_import(tmp_path):
    """The check above reads imports inside functions and relative ones too."""
    module = tmp_path / "test_sample.py"
    module.write_text("import os\nfrom .test_other import x\n\n\ndef test_a():\n"
                      "    from test_compose import A\n    from conftest import covering\n")
    assert {".test_other", "test_compose", "conftest", "os"} <= imported_modules(module)


def test_conftest_holds_options_and_hooks_only():
    """Fixtures live in tests/fixtures/ modules, each registered in ``pytest_plugins``."""
    tree = ast.parse((TESTS / "conftest.py").read_text())
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    assert functions and all(f.name.startswith("pytest_") for f in functions)
    [plugins] = [node.value for node in tree.body if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", None) == "pytest_plugins" for t in node.targets)]
    registered = {element.value for element in plugins.elts}
    with_fixtures = {f"fixtures.{path.stem}" for path in (TESTS / "fixtures").glob("*.py")
                     if "@pytest.fixture" in path.read_text()}
    assert registered == with_fixtures
