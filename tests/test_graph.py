"""The def-use graph over an indexed repository: imports link across files, a same-file
definition wins, and a name defined in two unimported places is left ambiguous, not guessed."""

import pytest
from fixtures.repos import distinct_chunk_ids

from codekv.defuse.graph import ModuleResolver, build_graph
from codekv.index import Index
from codekv.tokens import CounterSpec

FILES = {
    "util.py": "def helper(x):\n    return x + 1\n\n\ndef shared():\n    return 0\n",
    "other.py": "def shared():\n    return 1\n",
    "app.py": "from util import helper\n\n\ndef run(x):\n    return helper(x)\n",
    "local.py": "def helper(x):\n    return x\n\n\ndef main():\n    return helper(1)\n",
    "user.py": "def use():\n    return shared()\n",
    "pkg/__init__.py": "",
    "pkg/deep.py": "from ..util import helper\n",
    "pkg/tools.py": "def tool():\n    return 1\n",
    "cli.py": "from pkg.tools import tool as t\n\n\ndef go():\n    return t()\n",
    "lone.py": "def lonely():\n    return 1\n",
    "caller.py": "def call_lonely():\n    return lonely()\n",
}


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    from fixtures.repos import GitRepo

    git_repo = GitRepo(tmp_path_factory.mktemp("graph") / "repo")
    git_repo.commit(FILES)
    index = Index(git_repo.root, store=git_repo.root.parent / "store", counter=CounterSpec("bytes"))
    index.summary = index.update(workers=1)
    yield index
    index.close()


def _one(index, path, qualname):
    (chunk,) = index.find(path, qualname)
    return chunk


def _names(chunks):
    return [f"{c.path}::{c.qualname}" for c in chunks]


def test_import_links_across_files(index):
    run = _one(index, "app.py", "run")
    helper = _one(index, "util.py", "helper")
    assert _names(index.depends_on(run)) == ["util.py::helper"]
    assert _names(index.used_by(helper)) == ["app.py::run"]
    (use,) = index.uses(run)
    assert (use.name, use.kind, use.target) == ("helper", "call", helper.id)
    source = FILES["app.py"].encode()
    assert source[use.start_byte : use.end_byte] == b"helper"


def test_aliased_import_from_package(index):
    go = _one(index, "cli.py", "go")
    assert _names(index.depends_on(go)) == ["pkg/tools.py::tool"]


def test_same_file_definition_wins(index):
    """``helper`` is defined in util.py too, but local.py's own one is the one it calls."""
    main = _one(index, "local.py", "main")
    assert _names(index.depends_on(main)) == ["local.py::helper"]
    assert _names(index.used_by(_one(index, "local.py", "helper"))) == ["local.py::main"]


def test_ambiguous_name_is_not_linked(index):
    use = _one(index, "user.py", "use")
    assert index.depends_on(use) == []
    assert index.graph.ambiguous[use.id] == {"shared"}
    for path in ("util.py", "other.py"):
        assert index.used_by(_one(index, path, "shared")) == []


def test_unique_name_links_without_import(index):
    call = _one(index, "caller.py", "call_lonely")
    assert _names(index.depends_on(call)) == ["lone.py::lonely"]


def test_summary_counts_the_graph(index):
    """Edges: run->helper, go->tool, main->helper(local), call_lonely->lonely. Every chunk is
    a node; no use anchor is added for the ambiguous ``shared``."""
    assert index.summary.graph_edges == 4
    assert index.summary.graph_nodes == len(index.chunks())
    assert index.summary.anchors["use"] == 4


def test_anchors_include_uses(index):
    run = _one(index, "app.py", "run")
    kinds = [(a.kind, a.name) for a in index.anchors(run)]
    assert ("use", "helper") in kinds and ("call", "helper") in kinds and ("def", "run") in kinds


def test_use_anchors_carry_the_chunk_they_resolve_to(index):
    """The definition a use resolves to rides on its anchor; static anchors have none."""
    run, helper = _one(index, "app.py", "run"), _one(index, "util.py", "helper")
    targets = {(a.kind, a.name): a.target for a in index.anchors(run)}
    assert targets[("use", "helper")] == helper.id
    assert targets[("call", "helper")] is None and targets[("def", "run")] is None


def test_relative_imports_resolve_from_the_importer():
    resolver = ModuleResolver(dict.fromkeys(FILES))
    assert resolver.resolve("pkg/deep.py", "python", "..util") == ["util.py"]
    assert resolver.resolve("pkg/deep.py", "python", ".tools") == ["pkg/tools.py"]
    assert resolver.resolve("pkg/deep.py", "python", ".") == ["pkg/__init__.py"]
    assert resolver.resolve("app.py", "python", "pkg.tools") == ["pkg/tools.py"]
    assert resolver.resolve("app.py", "python", "nowhere") == []


def test_wildcard_import_prefers_the_imported_module(analyze):
    """``from util import *`` picks util's ``shared`` over other.py's: not ambiguous."""
    files = {
        "util.py": analyze("python", FILES["util.py"]),
        "other.py": analyze("python", FILES["other.py"]),
        "star.py": analyze("python", "from util import *\n\n\ndef f():\n    return shared()\n"),
    }
    # The fixture gives every blob the same hash: make chunk ids distinct per file.
    for path, analysis in files.items():
        distinct_chunk_ids(analysis, path)
    graph = build_graph(files)
    (f_chunk,) = [c for c in files["star.py"].chunks if c.qualname == "f"]
    (target,) = [c for c in files["util.py"].chunks if c.qualname == "shared"]
    assert graph.depends_on(f_chunk.id) == [target.id]
    assert graph.ambiguous == {}
