"""Shared fixtures: isolated codekv homes and git repositories built with pygit2."""

from __future__ import annotations

from pathlib import Path

import pygit2
import pytest

from codekv.analysis import Analyzer
from codekv.tokens import CounterSpec

SIGNATURE = pygit2.Signature("test", "test@localhost", 0, 0)
BYTES = CounterSpec("bytes")


@pytest.fixture(autouse=True)
def codekv_home(tmp_path, monkeypatch) -> Path:
    """Every test gets its own codekv home: nothing leaks between tests or into ~/.cache."""
    home = tmp_path / "codekv-home"
    monkeypatch.setenv("CODEKV_HOME", str(home))
    return home


class GitRepo:
    """A throwaway git repository; ``commit`` writes files and commits them."""

    def __init__(self, root: Path):
        self.root = root
        self.repo = pygit2.init_repository(str(root), initial_head="main")

    def write(self, files: dict[str, str | bytes | None]) -> None:
        for path, content in files.items():
            target = self.root / path
            if content is None:
                target.unlink()
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, str):
                content = content.encode()
            target.write_bytes(content)

    def commit(self, files: dict[str, str | bytes | None], message: str = "commit") -> str:
        self.write(files)
        index = self.repo.index
        index.add_all()
        for path, content in files.items():
            if content is None:
                index.remove(path)
        index.write()
        tree = index.write_tree()
        parents = [] if self.repo.head_is_unborn else [self.repo.head.target]
        return str(self.repo.create_commit("HEAD", SIGNATURE, SIGNATURE, message, tree, parents))


@pytest.fixture
def git_repo(tmp_path) -> GitRepo:
    return GitRepo(tmp_path / "repo")


@pytest.fixture
def analyze():
    """Analyse source text of a language with byte counting, so fixtures are tokenizer-free."""

    def run(language: str, source: str | bytes, budget: int = 512):
        if isinstance(source, str):
            source = source.encode()
        return Analyzer(BYTES, budget).analyze("0" * 40, language, source)

    return run
