"""How the modules import each other: no cycles, and nothing loads torch to read a name."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
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


@pytest.mark.parametrize("module", ["codekv.gate", "codekv.backends.engines", "codekv.schema",
                                    "codekv.request", "codekv.serve.shift",
                                    "codekv.eval.workloads", "codekv.models", "codekv.cli"])
def test_names_are_read_without_torch(module):
    """Engine and workload names, a request's vocabulary, the gate, the shift baseline's
    statuses, the task generators and the command line load no model runtime."""
    assert not {m for m in imported_by(module) if m == "torch" or m.startswith("torch.")}


def _top(module: str) -> str:
    return module.split(".")[0]


def test_only_the_evaluation_and_the_command_line_import_the_evaluation():
    """The runtime (composition, the gate, the server, the engines, the stores) never imports
    the research package: what it needs of the evidence is in ``codekv.schema``."""
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert "codekv.eval.command" in graph["codekv.cli"]  # the finder sees a lazy import
    outside = {name: sorted(i for i in imports if i == "codekv.eval"
                            or i.startswith("codekv.eval."))
               for name, imports in graph.items()
               if not (name == "codekv.eval" or name.startswith("codekv.eval."))
               and name != "codekv.cli"}
    assert {name: found for name, found in outside.items() if found} == {}


def test_the_engine_registry_loads_no_runtime_parser_or_git():
    """Reading engine names loads neither a model runtime, the index's parsers nor git (the
    package's own ``__init__`` loads its names lazily)."""
    loaded = {_top(m) for m in imported_by("codekv.backends.engines")}
    assert not loaded & {"torch", "tree_sitter", "pygit2", "sqlite3"}
    assert "tree_sitter" in {_top(m) for m in imported_by("codekv.index")}  # it can tell


# The modules a codekv module may import when a request's vocabulary, the runtime schema or
# the engine registry is imported (in the style of click's tests/test_imports.py): the
# standard library's few, nothing else.
LIGHT = ("codekv.request", "codekv.schema", "codekv.backends.engines")
ALLOWED_IMPORTS = {"__future__", "collections.abc", "dataclasses", "enum", "importlib",
                   "pathlib", "typing"}
TRACK_IMPORTS = """
import builtins, importlib, json, sys
found = set()
real = builtins.__import__
def tracking(name, globals=None, locals=None, fromlist=(), level=0):
    if globals and str(globals.get("__name__", "")).startswith("codekv") and level == 0:
        found.add(name)
    return real(name, globals, locals, fromlist, level)
builtins.__import__ = tracking
for module in sys.argv[1:]:
    importlib.import_module(module)
print(json.dumps(sorted(found)))
"""


def imports_made(*modules: str) -> set[str]:
    """What codekv's modules import (absolutely) while ``modules`` load, in a fresh process."""
    out = subprocess.run([sys.executable, "-c", TRACK_IMPORTS, *modules], capture_output=True,
                         text=True, check=True)
    return set(json.loads(out.stdout))


def test_the_import_tracker_sees_a_third_party_import():
    assert "xxhash" in imports_made("codekv.chunk_cache")


@pytest.mark.parametrize("module", LIGHT)
def test_light_imports(module):
    found = {name for name in imports_made(module) if _top(name) != "codekv"}
    assert found <= ALLOWED_IMPORTS, found - ALLOWED_IMPORTS
