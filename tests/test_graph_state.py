"""An index updated after a change stores the same graph and statistics as one built afresh,
and the update re-resolves only the files the change can reach."""

from __future__ import annotations

import random

import pytest

import codekv.defuse.state as state
from codekv.index import Index
from codekv.tokens import CounterSpec

BYTES = CounterSpec("bytes")

BASE = {
    "pkg/__init__.py": "from .core import *\n",
    "pkg/core.py": (
        "LIMIT = 3\n\n\ndef helper(x):\n    return x + LIMIT\n\n\n"
        "class Box:\n    def grow(self):\n        return helper(1)\n"
    ),
    "pkg/util.py": "def shared(x):\n    return x\n\n\ndef only_util():\n    return shared(2)\n",
    "app.py": (
        "from pkg.core import helper as h\nfrom pkg import Box\n\n\n"
        "def run(x):\n    b = Box()\n    return h(x) + only_util() + shared(x) + unique_far()\n"
    ),
    "far.py": "def unique_far():\n    return 42\n\n\ndef shared(y):\n    return y\n",
    "copy_a.py": "def twin():\n    return unique_far()\n",
    "copy_b.py": "def twin():\n    return unique_far()\n",
    "lonely.py": "def lonely():\n    return len([])\n",
}

# Edits that move resolution between scopes: a unique name becomes ambiguous and back, an
# imported definition moves, a file starts or stops defining a name others fall back to, a
# file's blob becomes identical to another file's.
EDITS = [
    {"far.py": "def unique_far():\n    return 43\n"},  # same names, new chunk ids
    {"far.py": "def other():\n    return 1\n"},  # unique_far and shared disappear
    {"lonely.py": "def unique_far():\n    return 0\n\n\ndef len(x):\n    return 0\n"},
    {"pkg/core.py": "def helper(x):\n    return x\n\n\nclass Box:\n    pass\n"},
    {"pkg/core.py": "LIMIT = 4\n\n\ndef helpers(x):\n    return x\n"},
    {"copy_b.py": "def twin():\n    return 2\n"},
    {"copy_b.py": "def twin():\n    return unique_far()\n"},
    {"lonely.py": "def lonely():\n    return len([])\n"},
    {"app.py": "from pkg.util import *\n\n\ndef run():\n    return only_util() + twin()\n"},
    {"pkg/util.py": "def shared(x):\n    return helper(x)\n"},
    {"copy_a.py": "def twin():\n    return unique_far()\n\n\nclass Box:\n    pass\n"},
]


def graph_of(index: Index):
    summary = index.update(workers=1)
    stats, uses = index.store.graph_cache(index.repo_id, index._snapshot_key(index.files()))
    fields = ("chunks", "anchors", "graph_nodes", "graph_edges", "syntax_errors", "decode_errors")
    return {f: getattr(summary, f) for f in fields}, uses


def fresh_graph(git_repo, tmp_path, run: int):
    index = Index(git_repo.root, store=tmp_path / f"fresh-{run}", counter=BYTES)
    try:
        return graph_of(index)
    finally:
        index.close()


@pytest.fixture
def updates(monkeypatch):
    """Counts full builds and the files each update re-resolved."""
    seen = {"full": 0, "resolved": []}
    full, resolve_file = state.GraphState._full, state.resolve_file

    def counted_full(self):
        seen["full"] += 1
        return full(self)

    def counted_resolve(path, *args):
        seen["resolved"].append(path)
        return resolve_file(path, *args)

    monkeypatch.setattr(state.GraphState, "_full", counted_full)
    monkeypatch.setattr(state, "resolve_file", counted_resolve)
    return seen


def test_each_edit_updates_to_what_a_fresh_build_gives(git_repo, tmp_path, updates):
    git_repo.commit(BASE)
    index = Index(git_repo.root, store=tmp_path / "store", counter=BYTES)
    assert graph_of(index) == fresh_graph(git_repo, tmp_path, 0)
    assert updates["full"] == 2  # this index's first build, and the fresh one
    for run, edit in enumerate(EDITS, 1):
        git_repo.write(edit)
        updates["resolved"].clear()
        assert graph_of(index) == fresh_graph(git_repo, tmp_path, run), edit
        assert updates["full"] == 2 + run  # one per fresh build: the updates were incremental
        assert 1 <= len(updates["resolved"]) < len(BASE), updates["resolved"]
    index.close()


def test_what_an_edit_reaches(git_repo, tmp_path, updates):
    git_repo.commit(BASE)
    index = Index(git_repo.root, store=tmp_path / "store", counter=BYTES)
    index.update(workers=1)
    # New chunk ids for helper: core itself, app (imports helper), pkg/__init__ (a wildcard
    # import of core); util and far neither import core nor fall back to its names.
    git_repo.write({"pkg/core.py": BASE["pkg/core.py"] + "\n"})
    updates["resolved"].clear()
    index.update(workers=1)
    assert sorted(updates["resolved"]) == ["app.py", "pkg/__init__.py", "pkg/core.py"]
    # unique_far gets a new chunk id: the files that found it through the repository-wide
    # lookup are resolved again, no others.
    git_repo.write({"far.py": BASE["far.py"] + "\n"})
    updates["resolved"].clear()
    index.update(workers=1)
    assert sorted(updates["resolved"]) == ["app.py", "copy_a.py", "copy_b.py", "far.py"]
    # A comment-only change in a file nobody depends on touches that file only.
    git_repo.write({"lonely.py": "# note\n" + BASE["lonely.py"]})
    updates["resolved"].clear()
    index.update(workers=1)
    assert updates["resolved"] == ["lonely.py"]
    index.close()


def test_new_or_removed_paths_rebuild(git_repo, tmp_path, updates):
    git_repo.commit(BASE)
    index = Index(git_repo.root, store=tmp_path / "store", counter=BYTES)
    index.update(workers=1)
    git_repo.write({"extra.py": "def unique_far():\n    return 1\n"})
    assert graph_of(index) == fresh_graph(git_repo, tmp_path, 1)
    assert updates["full"] == 3  # the first build, the update (paths changed), the fresh one
    index.close()


def test_random_edits(git_repo, tmp_path):
    rng = random.Random(7)
    git_repo.commit(BASE)
    index = Index(git_repo.root, store=tmp_path / "store", counter=BYTES)
    index.update(workers=1)
    variants = {}
    for edit in EDITS:
        for path, text in edit.items():
            variants.setdefault(path, [BASE[path]]).append(text)
    for run in range(1, 9):
        picked = rng.sample(sorted(variants), rng.randint(1, 3))
        git_repo.write({path: rng.choice(variants[path]) for path in picked})
        assert graph_of(index) == fresh_graph(git_repo, tmp_path, run), picked
    index.close()


def test_module_resolution_reads_paths_only():
    """Updates keep other files' imports as they were: that holds while ModuleResolver
    answers from the set of paths alone (it gets no file contents here)."""
    from codekv.defuse.graph import ModuleResolver

    paths = ["pkg/__init__.py", "pkg/core.py", "web/app.ts", "web/util.ts", "src/lib.rs",
             "src/a.rs", "go/store/store.go", "inc/x.h", "inc/x.c", "java/a/b/C.java"]
    modules = ModuleResolver(dict.fromkeys(paths))
    assert modules.resolve("app.py", "python", "pkg.core") == ["pkg/core.py"]
    assert modules.resolve("web/app.ts", "typescript", "./util") == ["web/util.ts"]
    assert modules.resolve("src/lib.rs", "rust", "crate::a") == ["src/a.rs"]
    assert modules.resolve("main.go", "go", "example.com/go/store") == ["go/store/store.go"]
    assert modules.resolve("main.c", "c", '"inc/x.h"') == ["inc/x.h", "inc/x.c"]
    assert modules.resolve("Main.java", "java", "a.b") == ["java/a/b/C.java"]
