"""How the modules import each other: no cycles, and nothing loads torch to read a name."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest
from fixtures.checks import imported_by

import codekv

PACKAGE = Path(codekv.__file__).parent


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["codekv", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The codekv modules ``name`` imports anywhere in its text (type-checking ones too):
    ``from codekv import paths`` imports ``codekv.paths``, not the package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            submodules = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
            targets = submodules if len(submodules) == len(node.names) else [base, *submodules]
        else:
            continue
        found |= {target for target in targets if target in modules and target != name}
    return found


def import_cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected groups of more than one module."""
    digraph = nx.DiGraph([(module, other) for module, others in graph.items() for other in others])
    return [group for group in nx.strongly_connected_components(digraph) if len(group) > 1]


def test_the_cycle_finder_finds_a_cycle_through_three_modules():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [{"a", "b", "c"}]


def test_no_module_imports_one_that_imports_it_back():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert graph["codekv.index"] >= {"codekv.address", "codekv.grammars"}  # it reads imports
    assert import_cycles(graph) == []


@pytest.mark.parametrize("module", ["codekv.gate", "codekv.backends.engines",
                                    "codekv.eval.registry", "codekv.models", "codekv.cli"])
def test_names_are_read_without_torch(module):
    """Engine and workload names, the gate and the command line load no model runtime."""
    assert not {m for m in imported_by(module) if m == "torch" or m.startswith("torch.")}
