"""The store contract: what every chunk KV store guarantees, run on every registered store.

The stores are those ``codekv.stores.STORES`` registers (each once), the local store, and the
local store in front of each registered one (``local,<url>``): a new store is tested here by
its registry line alone. Redis runs on a real redis-server, the Redis Cluster store on a real
three-node cluster (tests/fixtures/stores.py starts each once per session); a store these tests know
nothing of gets ``<scheme>://<a fresh directory>``.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from fixtures.stores import LAYERS, make_entry, make_key

from codekv.stores import STORES, store_class
from codekv.stores.base import KVStore
from codekv.stores.entry import KVEntry, KVKey, encode_entry
from codekv.stores.local import LocalKVStore
from codekv.stores.tiered import TieredKVStore


def registered() -> list[str]:
    """Each registered store once, by its first scheme."""
    seen, schemes = set(), []
    for scheme, kind in STORES.items():
        if kind not in seen:
            seen.add(kind)
            schemes.append(scheme)
    return schemes


SINGLE = ["local", *registered()]
ALL = [*SINGLE, *(f"local,{scheme}" for scheme in registered())]
# Test URLs of the stores that need a server; any other gets a directory of its own.
TEST_URLS = {"redis": lambda request, tmp_path: request.getfixturevalue("redis_url"),
             "redis+cluster": lambda request, tmp_path: request.getfixturevalue(
                 "redis_cluster_url")}


def open_store(kind: str, request, tmp_path: Path, max_bytes: int | None = None) -> KVStore:
    if kind == "local":
        return LocalKVStore(tmp_path / "kv", max_bytes=max_bytes)
    local, _, scheme = kind.rpartition(",")
    url = TEST_URLS.get(scheme, lambda _, tmp: f"{scheme}://{tmp / scheme}")(request, tmp_path)
    shared = store_class(url)(url, max_bytes=max_bytes)
    return TieredKVStore(LocalKVStore(tmp_path / "kv"), shared) if local else shared


@pytest.fixture(params=ALL)
def any_store(request, tmp_path) -> KVStore:
    """An empty store of each kind."""
    return open_store(request.param, request, tmp_path)


@pytest.fixture(params=SINGLE)
def new_store(request, tmp_path):
    """``make(max_bytes=None)`` -> an empty store of each kind that keeps one LRU order (a
    tiered store keeps two: its tiers evict apart)."""
    return lambda max_bytes=None: open_store(request.param, request, tmp_path, max_bytes)


@pytest.fixture(params=[kind for kind in ("local", "redis", "redis+cluster") if kind in SINGLE])
def raw_store(request, tmp_path) -> KVStore:
    """A store whose stored bytes the tests can read and damage (``read_raw``, ``write_raw``)."""
    return open_store(request.param, request, tmp_path)


def assert_same(got: KVEntry, want: KVEntry) -> None:
    assert len(got.keys) == len(want.keys) and len(got.values) == len(want.values)
    for g, w in zip(got.keys + got.values, want.keys + want.values, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g, w)


def read_raw(store, key: KVKey) -> bytes | None:
    """The stored bytes of ``key``'s entry."""
    if isinstance(store, LocalKVStore):
        path = store._path(key)
        return path.read_bytes() if path.exists() else None
    return store._client.get(store._entry_key(key))


def write_raw(store, key: KVKey, data: bytes) -> None:
    """Plant ``data`` as ``key``'s entry, bypassing the store (damage, copies, forgeries)."""
    if isinstance(store, LocalKVStore):
        path = store._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    else:
        store._client.set(store._entry_key(key), data)


def entry_size() -> int:
    """Bytes of one ``make_entry()`` value: a local file and a Redis value are those bytes."""
    return len(encode_entry(make_key(), make_entry()))


def test_every_kind_is_a_kv_store(any_store):
    assert isinstance(any_store, KVStore)
    assert any_store.error is None and any_store.location


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
    assert stats.bytes == len(encode_entry(key, entry))  # a value is the encoded bytes


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


@pytest.mark.parametrize("cut", [4, 60, -1])
def test_truncated_file_is_corrupt_and_removed(raw_store, cut):
    store = raw_store
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
def test_flipped_byte_is_corrupt_and_removed(raw_store, where):
    store = raw_store
    key = make_key()
    store.put(key, make_entry())
    raw = bytearray(read_raw(store, key))
    raw[where(bytes(raw))] ^= 0x20
    write_raw(store, key, bytes(raw))
    assert store.get(key) is None
    assert read_raw(store, key) is None and store.stats().corrupt == 1


def test_entry_copied_under_another_digest_is_never_used(raw_store):
    store = raw_store
    a, b = make_key("c1"), make_key("c2")
    store.put(a, make_entry())
    write_raw(store, b, read_raw(store, a))
    assert store.get(b) is None
    assert read_raw(store, b) is None and store.stats().corrupt == 1
    assert store.get(a) is not None  # the genuine entry is untouched


def test_scopes_are_isolated(raw_store):
    store = raw_store
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


def test_evict_returns_removed_count_in_lru_order(new_store):
    store = new_store()
    keys = [make_key(f"c{i}") for i in range(4)]
    for key in keys:
        store.put(key, make_entry())
    store.get(keys[1])
    size = entry_size()
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


def test_delete_scope(any_store):
    store = any_store
    a1, a2 = make_key("c1", "repo:aaaa"), make_key("c2", "repo:aaaa")
    b1 = make_key("c1", "repo:bbbb")
    for key in (a1, a2, b1):
        store.put(key, make_entry())
    assert store.delete_scope("repo:aaaa") == 2
    assert not store.contains(a1) and not store.contains(a2) and store.get(b1) is not None
    if isinstance(store, LocalKVStore):
        assert not store._path(a1).parent.parent.exists()
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
    assert store.stats().entries == 0 and not store.contains(make_key())


def test_gc_with_keep_predicate_and_unreadable_entries(raw_store):
    store = raw_store
    live, gone, junk = make_key("c1"), make_key("c2"), make_key("c3")
    store.put(live, make_entry(path="a.py"))
    store.put(gone, KVEntry(make_entry().keys, make_entry().values, {"path": "gone.py"}))
    write_raw(store, junk, b"not a safetensors value")
    assert store.gc(lambda prov: prov["path"] != "gone.py") == 2  # gone.py and the junk
    assert store.contains(live) and not store.contains(gone) and not store.contains(junk)
    assert store.stats().corrupt == 1
    assert store.gc() == 0 and store.get(live) is not None


def _poisoned(kind: str) -> KVEntry:
    """An entry a writer of the scope could put, checksum and all, that no reader may use."""
    entry = make_entry()
    if kind == "nan":
        entry.keys[1][0, 2, 3] = float("nan")
    elif kind == "inf":
        entry.values[0][2, 0, 0] = float("-inf")
    elif kind == "layer of another shape":
        entry.keys[2] = torch.randn(3, 4, 8)
        entry.values[2] = torch.randn(3, 4, 8)
    elif kind == "values of other tokens":
        entry.values = [torch.randn(3, 6, 8) for _ in range(LAYERS)]
    elif kind == "mixed dtypes":
        entry.values[1] = entry.values[1].half()
    return entry


@pytest.mark.parametrize("poison", ["nan", "inf", "layer of another shape",
                                    "values of other tokens", "mixed dtypes"])
def test_a_poisoned_entry_is_never_returned_and_is_deleted(any_store, poison):
    """A valid checksum proves only that the bytes are the writer's: the reader checks the
    values too (finite, one layout, one dtype) and treats a failure like a damaged entry."""
    store = any_store
    key = make_key()
    store.put(key, _poisoned(poison))
    assert store.contains(key)
    assert store.get(key) is None
    assert not store.contains(key)  # deleted: the next writer's good entry can take its place
    assert store.corrupt >= 1 and store.stats().corrupt == store.corrupt
    store.put(key, make_entry())
    assert_same(store.get(key), make_entry())


def test_reject_deletes_an_entry_its_reader_found_unusable(any_store):
    store = any_store
    key, other = make_key("c1"), make_key("c2")
    store.put(key, make_entry())
    store.put(other, make_entry())
    store.reject(key)
    assert not store.contains(key) and store.get(key) is None
    assert store.get(other) is not None  # nothing else goes
    assert store.corrupt >= 1 and store.stats().corrupt == store.corrupt


def test_claims_are_per_scope_and_renewed(any_store):
    store = any_store
    assert store.claims("repo:aaaa") == {}
    store.claim("repo:aaaa", "home-a")
    store.claim("repo:bbbb", "home-b")
    first = store.claims("repo:aaaa")
    assert set(first) == {"home-a"} and set(store.claims("repo:bbbb")) == {"home-b"}
    assert abs(first["home-a"] - time.time()) < 60
    time.sleep(0.02)
    store.claim("repo:aaaa", "home-a")
    assert store.claims("repo:aaaa")["home-a"] > first["home-a"]
    assert store.stats().entries == 0  # a claim is not an entry
    store.delete_scope("repo:aaaa")
    assert store.claims("repo:aaaa") == {} and set(store.claims("repo:bbbb")) == {"home-b"}


def test_collect_keeps_what_another_holder_claimed(any_store):
    """One home's view of what is live is not another's: while another holder's claim on the
    scope is within the retention window, only leftovers go."""
    store = any_store
    live, stale = make_key("c1"), make_key("c2")
    store.put(live, make_entry(blob="b1"))
    store.put(stale, make_entry(blob="b0"))
    other_scope = make_key("c2", scope="repo:bbbb")
    store.put(other_scope, make_entry(blob="b0"))

    def keep(provenance):
        return provenance["blob"] == "b1"

    store.claim("repo:aaaa", "home-a")
    assert store.collect("repo:aaaa", keep, "home-b") == (0, ["home-a"])
    assert store.contains(live) and store.contains(stale)
    assert set(store.claims("repo:aaaa")) == {"home-a", "home-b"}  # b's own claim recorded
    # home-a's claim is older than the window: b's view decides.
    assert store.collect("repo:aaaa", keep, "home-b", retention_s=0.0) == (1, [])
    assert store.contains(live) and not store.contains(stale)
    assert store.contains(other_scope)  # another scope is not collected


def test_stats_and_gc_of_one_scope(any_store):
    store = any_store
    for chunk in ("c1", "c2"):
        store.put(make_key(chunk, "repo:aaaa"), make_entry())
    store.put(make_key("c1", "repo:bbbb"), make_entry())
    assert (store.stats("repo:aaaa").entries, store.stats("repo:bbbb").entries) == (2, 1)
    assert store.stats().entries == 3
    assert store.stats("repo:aaaa").bytes == 2 * entry_size()
    assert store.gc(lambda provenance: False, scope="repo:bbbb") == 1
    assert (store.stats("repo:aaaa").entries, store.stats().entries) == (2, 2)
