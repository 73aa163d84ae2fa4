"""The local store's own guarantees: its layout, permissions, atomic writes, and the temporary
files of writers killed or still running. What every store guarantees is in
tests/test_stores_contract.py."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fixtures.stores import make_entry, make_key

from codekv.stores import local
from codekv.stores.entry import KVEntry, KVKey
from codekv.stores.local import LocalKVStore


def entry_path(store: LocalKVStore, key: KVKey) -> Path:
    return store._path(key)


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


@pytest.fixture
def store(tmp_path) -> LocalKVStore:
    return LocalKVStore(tmp_path / "kv")


def test_layout_and_permissions(store):
    key = make_key()
    store.put(key, make_entry())
    digest = key.digest()
    scope_dir = hashlib.sha256(key.scope.encode()).hexdigest()[:16]
    path = store.root / scope_dir / digest[:2] / f"{digest}.safetensors"
    assert files_under(store.root) == [path]
    for directory in (store.root, path.parent.parent, path.parent):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_failed_replace_leaves_nothing_visible(store, monkeypatch):
    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(local.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        store.put(make_key(), make_entry())
    monkeypatch.undo()
    assert store.get(make_key()) is None
    assert files_under(store.root) == []  # the temporary file was removed on the way out


# A writer that stops between writing its temporary file and renaming it: exits (as if
# killed) with ``--exit``, else waits there until it is killed.
STOPPED_WRITER = textwrap.dedent(
    """
    import os, sys, time, torch
    from codekv.stores.entry import KVEntry, KVKey
    from codekv.stores.local import LocalKVStore
    def stop(*args, **kwargs):
        if "--exit" in sys.argv:
            os._exit(17)
        print("written", flush=True)
        time.sleep(600)
    os.replace = stop
    key = KVKey("repo:aaaa", "m", "t", "c1", "h")
    store = LocalKVStore(sys.argv[1])
    store.put(key, KVEntry([torch.ones(1, 200, 4)], [torch.zeros(1, 200, 4)], {}))
    """
)


def test_crash_before_replace_leaves_only_a_temp_file_that_gc_removes(store):
    """A writer killed between write and rename: no entry appears; its temporary file is an
    orphan (its writer is gone) that gc removes at once and counts."""
    proc = subprocess.run([sys.executable, "-c", STOPPED_WRITER, str(store.root), "--exit"],
                          timeout=60)
    assert proc.returncode == 17
    key = KVKey("repo:aaaa", "m", "t", "c1", "h")
    leftovers = files_under(store.root)
    assert len(leftovers) == 1 and leftovers[0].name.endswith(".tmp")
    assert store.get(key) is None and not store.contains(key)
    assert (store.stats().entries, store.stats().orphans) == (0, 1)
    assert store.gc() == 1
    assert list(store.root.iterdir()) == []  # empty directories go too


def test_a_running_writer_keeps_its_temp_file_until_it_is_killed(store):
    writer = subprocess.Popen([sys.executable, "-c", STOPPED_WRITER, str(store.root)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "written\n"
        (temporary,) = files_under(store.root)
        assert store.gc() == 0 and store.stats().orphans == 0
        assert store.evict(0) == 0 and temporary.exists()
    finally:
        writer.kill()
        writer.wait()
    assert store.stats().orphans == 1
    assert store.evict(1 << 30) == 1 and not temporary.exists()


def test_size_limit_counts_temp_files_of_running_writers(store, monkeypatch):
    """Eviction makes room for what writers are writing now; orphans go first."""
    key = make_key()
    store.put(key, make_entry())
    size = store.stats().bytes
    shard = entry_path(store, key).parent
    running = shard / f".{'0' * 16}.{local._machine()}-{os.getpid()}.abcd1234.tmp"
    running.write_bytes(b"x" * size)
    assert store.evict(size) == 1  # the entry: with the running write, the store held 2x
    assert running.exists() and store.stats().entries == 0
    old_style = shard / f".{'0' * 16}.abcd1234.tmp"  # named before writers were recorded
    old_style.write_bytes(b"x")
    assert store.gc() == 0  # fresh, and whose it is cannot be told
    os.utime(old_style, (1, 1))
    assert store.gc() == 1


def test_gc_with_keep_predicate_and_leftovers(store):
    live, gone = make_key("c1"), make_key("c2")
    store.put(live, make_entry(path="a.py"))
    store.put(gone, KVEntry(make_entry().keys, make_entry().values, {"path": "gone.py"}))
    junk = entry_path(store, live).parent / ("f" * 64 + ".safetensors")
    junk.write_bytes(b"not a safetensors file")
    stray = entry_path(store, live).parent / ".abc.tmp"
    stray.write_bytes(b"half")
    os.utime(stray, (1, 1))
    removed = store.gc(lambda prov: prov["path"] != "gone.py")
    assert removed == 3  # gone.py, the junk entry, the stray temp file
    assert store.contains(live) and not store.contains(gone)
    assert not junk.exists() and not stray.exists()
    assert store.stats().corrupt == 1
    assert store.gc() == 0 and store.get(live) is not None
