"""Where codekv writes: its own directories and files owner-only; directories the user names
keep their mode (with a warning when others may read them)."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest
import torch

from codekv import paths
from codekv.index import Index
from codekv.stores import default_kv_store
from codekv.stores.entry import KVEntry, KVKey
from codekv.tokens import CounterSpec

BYTES = CounterSpec("bytes")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _modes_under(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): _mode(p) for p in sorted(root.rglob("*"))}


@pytest.fixture(autouse=True)
def forget_warnings(monkeypatch):
    monkeypatch.setattr(paths, "_warned", set())


def test_a_missing_home_is_created_owner_only_level_by_level(tmp_path, monkeypatch):
    monkeypatch.setenv("CODEKV_HOME", str(tmp_path / "a" / "b" / "home"))
    home = paths.home()
    assert home == tmp_path / "a" / "b" / "home"
    assert [_mode(p) for p in (home.parent.parent, home.parent, home)] == [0o700] * 3


def test_an_existing_home_keeps_its_mode_with_a_warning(tmp_path, monkeypatch, caplog):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    monkeypatch.setenv("CODEKV_HOME", str(shared))
    with caplog.at_level(logging.WARNING, logger="codekv"):
        assert paths.home() == shared
        paths.home()
    assert _mode(shared) == 0o755
    (record,) = caplog.records  # once per process, not per call
    assert "CODEKV_HOME" in record.getMessage() and "0755" in record.getMessage()


def test_an_existing_private_home_is_quiet(tmp_path, monkeypatch, caplog):
    (tmp_path / "home").mkdir(mode=0o700)
    monkeypatch.setenv("CODEKV_HOME", str(tmp_path / "home"))
    with caplog.at_level(logging.WARNING, logger="codekv"):
        paths.home()
    assert caplog.records == []


def test_home_that_is_a_file_is_a_clear_error(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("CODEKV_HOME", str(tmp_path / "file"))
    with pytest.raises(paths.UnusableDirectoryError, match="CODEKV_HOME=.*is not a directory"):
        paths.home()


def test_store_directory_keeps_its_mode_and_codekv_files_in_it_are_owner_only(
    git_repo, tmp_path, caplog
):
    """Everything codekv makes in a user's 0755 directory is 0700 / 0600: the index database,
    the lock directory and its lock files, the chunk KV store."""
    git_repo.commit({"a.py": "def f():\n    return 1\n"})
    store = tmp_path / "store"
    store.mkdir()
    store.chmod(0o755)
    with caplog.at_level(logging.WARNING, logger="codekv"):
        index = Index(git_repo.root, store=store, counter=BYTES)
        index.update(workers=1)
        index.close()
    assert "store=" in caplog.text
    kv = default_kv_store(store)
    key = KVKey("repo:x", "m", "t", "c", "h")
    kv.put(key, KVEntry([torch.zeros(1, 2, 4)], [torch.zeros(1, 2, 4)], {}))
    assert _mode(store) == 0o755
    modes = _modes_under(store)
    assert {"index.sqlite", "locks", "kv"} <= set(modes)
    assert any(name.startswith("locks/") and name.endswith(".lock") for name in modes)
    wrong = {
        name: oct(mode) for name, mode in modes.items()
        if mode != (0o700 if (store / name).is_dir() else 0o600)
    }
    assert wrong == {}


def test_private_dir_leaves_an_existing_directory_alone(tmp_path):
    existing = tmp_path / "mine"
    existing.mkdir()
    existing.chmod(0o750)
    assert paths.private_dir(existing) == existing
    assert _mode(existing) == 0o750
    with pytest.raises(paths.UnusableDirectoryError, match="not a directory"):
        (tmp_path / "f").write_text("")
        paths.private_dir(tmp_path / "f" / "sub")


def test_private_file_is_owner_only_whatever_the_umask(tmp_path):
    previous = os.umask(0o022)
    try:
        paths.private_file(tmp_path / "record.json", b"{}")
    finally:
        os.umask(previous)
    assert _mode(tmp_path / "record.json") == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]
