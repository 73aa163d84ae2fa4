"""The chunk KV store: exact round trips, integrity, isolation, atomicity, eviction, gc.

Tests taking ``any_store`` run against both implementations: the local disk store and the
shared store on a real redis-server (tests/conftest.py starts one per session).
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from codekv.kvstore import KVEntry, KVKey, KVStore, LocalKVStore, encode_entry, token_hash

from codekv import kvstore

LAYERS = 3


def make_key(chunk: str = "c1", scope: str = "repo:aaaa") -> KVKey:
    return KVKey(
        scope=scope,
        model="smollm2-135m:bf16:rope1e5",
        tokenizer="tok:1234",
        chunk=chunk,
        token_hash=token_hash([1, 2, 3]),
    )


def make_entry(
    dtype: torch.dtype = torch.float32, seed: int = 0, n_tokens: int = 5, **provenance
) -> KVEntry:
    gen = torch.Generator().manual_seed(seed)
    keys = [torch.randn(3, n_tokens, 8, generator=gen).to(dtype) for _ in range(LAYERS)]
    values = [torch.randn(3, n_tokens, 8, generator=gen).to(dtype) for _ in range(LAYERS)]
    return KVEntry(keys, values, {"path": "a.py", "n_tokens": n_tokens, **provenance})


def entry_path(store: LocalKVStore, key: KVKey) -> Path:
    return store._path(key)


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def assert_same(got: KVEntry, want: KVEntry) -> None:
    assert len(got.keys) == len(want.keys) and len(got.values) == len(want.values)
    for g, w in zip(got.keys + got.values, want.keys + want.values, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g, w)


@pytest.fixture
def store(tmp_path) -> LocalKVStore:
    return LocalKVStore(tmp_path / "kv")


@pytest.fixture(params=["local", "redis"])
def new_store(request, tmp_path):
    """``make(max_bytes=None)`` -> an empty store of the parametrised kind."""

    def make(max_bytes: int | None = None):
        if request.param == "local":
            return LocalKVStore(tmp_path / "kv", max_bytes=max_bytes)
        from codekv.stores.redis_store import RedisKVStore

        return RedisKVStore(request.getfixturevalue("redis_url"), max_bytes=max_bytes)

    return make


@pytest.fixture
def any_store(new_store):
    return new_store()


def read_raw(store, key: KVKey) -> bytes | None:
    """The stored bytes of ``key``'s entry, whichever the store."""
    if isinstance(store, LocalKVStore):
        path = entry_path(store, key)
        return path.read_bytes() if path.exists() else None
    return store._client.get(store._entry_key(key))


def write_raw(store, key: KVKey, data: bytes) -> None:
    """Plant ``data`` as ``key``'s entry, bypassing the store (damage, copies, forgeries)."""
    if isinstance(store, LocalKVStore):
        path = entry_path(store, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    else:
        store._client.set(store._entry_key(key), data)


def entry_size() -> int:
    """Bytes of one ``make_entry()`` value: a local file and a Redis value are those bytes."""
    return len(encode_entry(make_key(), make_entry()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_round_trip_is_exact(any_store, dtype):
    store = any_store
    key, entry = make_key(), make_entry(dtype)
    store.put(key, entry)
    got = store.get(key)
    assert got is not None
    assert_same(got, entry)
    assert store.contains(key)
    stats = store.stats()
    assert (stats.entries, stats.hits, stats.misses, stats.corrupt) == (1, 1, 0, 0)
    assert stats.bytes == len(read_raw(store, key))


def test_views_into_a_larger_cache_round_trip(any_store):
    store = any_store
    """Callers slice chunk KV out of a request cache; shared storage must not trip safetensors."""
    big = torch.randn(2, 3, 10, 8)  # [k/v, heads, tokens, dim]
    keys, values = [big[0, :, 2:6]] * 2, [big[1, :, 2:6]] * 2
    store.put(make_key(), KVEntry(keys, values, {}))
    got = store.get(make_key())
    assert got is not None
    assert torch.equal(got.keys[1], big[0, :, 2:6]) and torch.equal(got.values[0], big[1, :, 2:6])


def test_miss(any_store):
    store = any_store
    assert store.get(make_key()) is None
    assert not store.contains(make_key())
    stats = store.stats()
    assert (stats.entries, stats.bytes, stats.hits, stats.misses, stats.corrupt) == (0, 0, 0, 1, 0)


def test_provenance_round_trip(any_store):
    store = any_store
    provenance = {
        "repository": "/home/u/proj",
        "path": "src/ü.py",
        "blob": "ab" * 20,
        "chunk": "function parse",
        "model": "smollm2",
        "n_tokens": 5,
        "anchors": [0, 3, 4],
        "created": 1700000000.25,
        "nested": {"ok": True, "none": None},
    }
    key = make_key()
    store.put(key, KVEntry(make_entry().keys, make_entry().values, provenance))
    got = store.get(key)
    assert got is not None and got.provenance == provenance


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

    monkeypatch.setattr(kvstore.os, "replace", boom)
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
    from codekv.kvstore import KVEntry, KVKey, LocalKVStore
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
    running = shard / f".{'0' * 16}.{kvstore._machine()}-{os.getpid()}.abcd1234.tmp"
    running.write_bytes(b"x" * size)
    assert store.evict(size) == 1  # the entry: with the running write, the store held 2x
    assert running.exists() and store.stats().entries == 0
    old_style = shard / f".{'0' * 16}.abcd1234.tmp"  # named before writers were recorded
    old_style.write_bytes(b"x")
    assert store.gc() == 0  # fresh, and whose it is cannot be told
    os.utime(old_style, (1, 1))
    assert store.gc() == 1


@pytest.mark.parametrize("cut", [4, 60, -1])
def test_truncated_file_is_corrupt_and_removed(any_store, cut):
    store = any_store
    key = make_key()
    store.put(key, make_entry())
    raw = read_raw(store, key)
    write_raw(store, key, raw[:cut] if cut > 0 else raw[: len(raw) + cut])
    assert store.get(key) is None
    assert read_raw(store, key) is None
    stats = store.stats()
    assert (stats.corrupt, stats.misses, stats.entries) == (1, 1, 0)


def _flip_tensor_byte(raw: bytes) -> int:
    return len(raw) - 7  # inside the last tensor's data


def _flip_provenance_byte(raw: bytes) -> int:
    return raw.index(b"a.py")  # 'a' -> 'A'-ish: still valid JSON, so only the checksum can tell


@pytest.mark.parametrize("where", [_flip_tensor_byte, _flip_provenance_byte])
def test_flipped_byte_is_corrupt_and_removed(any_store, where):
    store = any_store
    key = make_key()
    store.put(key, make_entry())
    raw = bytearray(read_raw(store, key))
    raw[where(bytes(raw))] ^= 0x20
    write_raw(store, key, bytes(raw))
    assert store.get(key) is None
    assert read_raw(store, key) is None and store.stats().corrupt == 1


def test_entry_copied_under_another_digest_is_never_used(any_store):
    store = any_store
    a, b = make_key("c1"), make_key("c2")
    store.put(a, make_entry())
    write_raw(store, b, read_raw(store, a))
    assert store.get(b) is None
    assert read_raw(store, b) is None and store.stats().corrupt == 1
    assert store.get(a) is not None  # the genuine entry is untouched


def test_scopes_are_isolated(any_store):
    store = any_store
    a = make_key(scope="repo:aaaa")
    b = replace(a, scope="repo:bbbb")
    store.put(a, make_entry())
    assert store.get(b) is None and not store.contains(b)
    # Even a value planted under scope B's name for B's digest is rejected.
    write_raw(store, b, read_raw(store, a))
    assert store.get(b) is None
    assert store.get(a) is not None


def test_lru_eviction_on_put(new_store):
    size = entry_size()
    store = new_store(max_bytes=3 * size + size // 2)
    keys = [make_key(f"c{i}") for i in range(1, 5)]
    for key in keys[:3]:
        store.put(key, make_entry())
    assert store.stats().bytes == 3 * size  # every entry has the same size
    assert store.get(keys[0]) is not None  # c1 is now the most recently used
    store.put(keys[3], make_entry())
    assert [store.contains(k) for k in keys] == [True, False, True, True]
    store.put(make_key("c5"), make_entry())
    assert [store.contains(k) for k in keys] == [True, False, False, True]
    assert store.stats().bytes <= store.max_bytes


def test_evict_returns_removed_count_in_lru_order(any_store):
    store = any_store
    keys = [make_key(f"c{i}") for i in range(4)]
    for key in keys:
        store.put(key, make_entry())
    store.get(keys[1])
    size = len(read_raw(store, keys[0]))
    assert store.evict(2 * size) == 2
    assert [store.contains(k) for k in keys] == [False, True, False, True]
    assert store.evict(0) == 2 and store.stats().entries == 0


def test_entry_larger_than_the_limit_is_not_stored(new_store):
    one_token = len(encode_entry(make_key("c0"), make_entry(n_tokens=1)))
    store = new_store(max_bytes=2 * one_token)
    store.put(make_key("c0"), make_entry(n_tokens=1))
    assert store.contains(make_key("c0"))
    store.put(make_key("c1"), make_entry(n_tokens=100))
    assert not store.contains(make_key("c1")) and store.contains(make_key("c0"))


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


def test_delete_scope(any_store):
    store = any_store
    a1, a2 = make_key("c1", "repo:aaaa"), make_key("c2", "repo:aaaa")
    b1 = make_key("c1", "repo:bbbb")
    for key in (a1, a2, b1):
        store.put(key, make_entry())
    assert store.delete_scope("repo:aaaa") == 2
    assert not store.contains(a1) and not store.contains(a2) and store.get(b1) is not None
    if isinstance(store, LocalKVStore):
        assert not entry_path(store, a1).parent.parent.exists()
    assert store.delete_scope("repo:aaaa") == 0


def test_invalid_entries_are_rejected_on_put(any_store):
    store = any_store
    entry = make_entry()
    with pytest.raises(ValueError):
        store.put(make_key(), KVEntry(entry.keys, entry.values[:-1], {}))
    with pytest.raises(ValueError):
        store.put(make_key(), KVEntry([torch.zeros(3, 4)], [torch.zeros(3, 4)], {}))
    with pytest.raises(TypeError):
        store.put(make_key(), KVEntry(entry.keys, entry.values, {"bad": object()}))
    assert store.stats().entries == 0 and read_raw(store, make_key()) is None


def test_token_hash_is_sha256_of_little_endian_int64():
    ids = [1, 2, 49151, 2**40]
    want = hashlib.sha256(
        b"codekv.tokens.v1\0" + struct.pack("<Q", 4) + struct.pack("<4q", *ids)
    ).hexdigest()
    assert token_hash(ids) == want
    assert token_hash([2, 1]) != token_hash([1, 2])
    assert token_hash([]) != token_hash([0])


def test_digest_covers_every_field_and_the_format_version(monkeypatch):
    key = make_key()
    digests = {key.digest()}
    for name in ("scope", "model", "tokenizer", "chunk", "token_hash"):
        digests.add(replace(key, **{name: getattr(key, name) + "x"}).digest())
    assert len(digests) == 6
    monkeypatch.setattr(kvstore, "FORMAT_VERSION", kvstore.FORMAT_VERSION + ".next")
    assert key.digest() not in digests
    with pytest.raises(TypeError):
        KVKey("s", "m", "t", "c", 5)  # type: ignore[arg-type]


def test_stores_satisfy_the_protocol(any_store):
    assert isinstance(any_store, KVStore)


def test_gc_with_keep_predicate_and_unreadable_entries(any_store):
    store = any_store
    live, gone, junk = make_key("c1"), make_key("c2"), make_key("c3")
    store.put(live, make_entry(path="a.py"))
    store.put(gone, KVEntry(make_entry().keys, make_entry().values, {"path": "gone.py"}))
    write_raw(store, junk, b"not a safetensors value")
    assert store.gc(lambda prov: prov["path"] != "gone.py") == 2  # gone.py and the junk
    assert store.contains(live) and not store.contains(gone) and not store.contains(junk)
    assert store.stats().corrupt == 1
    assert store.gc() == 0 and store.get(live) is not None
