"""The evaluation's repositories: real code committed as it is installed."""

from __future__ import annotations

from pathlib import Path

import pygit2
import pytest

import codekv
from codekv.eval.repos import package_repo


def test_package_repo_commits_the_package_source_without_tests(tmp_path):
    dest = package_repo("codekv", tmp_path / "codekv-src")
    repo = pygit2.Repository(str(dest))
    tree = repo.head.peel(pygit2.Commit).tree
    committed = set()

    def walk(tree, prefix=""):
        for entry in tree:
            if entry.type_str == "tree":
                walk(repo[entry.id], f"{prefix}{entry.name}/")
            else:
                committed.add(prefix + entry.name)

    walk(tree)
    root = Path(codekv.__file__).parent
    expected = {f"codekv/{p.relative_to(root).as_posix()}" for p in root.rglob("*.py")
                if "__pycache__" not in p.parts}
    assert committed == expected
    assert (dest / "codekv" / "compose.py").read_bytes() == (root / "compose.py").read_bytes()
    assert package_repo("codekv", dest) == dest  # made once, then reused
    assert not (tmp_path / "codekv-src.partial").exists()


def test_package_repo_refuses_what_is_not_an_installed_package(tmp_path):
    with pytest.raises(ValueError, match="not an installed package"):
        package_repo("no_such_package_here", tmp_path / "x")
    with pytest.raises(ValueError, match="not an installed package"):
        package_repo("json.decoder", tmp_path / "y")  # a module, not a package
