"""The chunk KV store on a real three-node Redis Cluster: scopes on every node, a node killed.

What it shares with every store is proven by tests/test_stores_contract.py (it runs on the
cluster through the registry); these tests are about the cluster's own shape.
"""

from __future__ import annotations

import time

import pytest
import torch
from fixtures.needs import require
from fixtures.stores import start_cluster

from codekv.stores.entry import KVEntry, KVKey, token_hash

require("redis", "the redis client is not installed (the 'shared' extra)")

from codekv.stores import StoreSpecError, check_spec, open_kv_store  # noqa: E402
from codekv.stores.base import StoreUnavailable  # noqa: E402
from codekv.stores.redis_cluster import RedisClusterKVStore  # noqa: E402


def make_key(chunk: str, scope: str) -> KVKey:
    return KVKey(scope, "model", "tok", chunk, token_hash([1, 2, 3]))


def make_entry(blob: str = "b1") -> KVEntry:
    gen = torch.Generator().manual_seed(0)
    keys = [torch.randn(2, 4, 8, generator=gen) for _ in range(2)]
    values = [torch.randn(2, 4, 8, generator=gen) for _ in range(2)]
    return KVEntry(keys, values, {"blob": blob})


def scope_per_node(cluster) -> dict[int, str]:
    """One scope whose keys live on each node: port -> scope."""
    found = {}
    for n in range(200):
        scope = f"repo:{n}"
        found.setdefault(cluster.node_of(f"codekv:{{{scope}}}:lru").port, scope)
        if len(found) == len(cluster.servers):
            return found
    raise AssertionError("no scope hashed to some node")


def test_scopes_on_every_node_are_found_by_stats_gc_evict_and_delete_scope(redis_cluster,
                                                                         redis_cluster_url):
    store = open_kv_store(redis_cluster_url)
    assert isinstance(store, RedisClusterKVStore)
    scopes = scope_per_node(redis_cluster)
    for scope in scopes.values():
        store.put(make_key("c1", scope), make_entry("b1"))
        store.put(make_key("c2", scope), make_entry("b0"))
    # Each node holds its scope's two entries and LRU record, and nothing else.
    for server in redis_cluster.servers:
        names = sorted(n.decode() for n in server.admin.keys("*"))
        assert len(names) == 3 and all(f"{{{scopes[server.port]}}}" in n for n in names)
    assert store.stats().entries == 6
    assert all(store.stats(scope).entries == 2 for scope in scopes.values())
    assert store.gc(lambda provenance: provenance["blob"] == "b1") == 3  # one per node
    assert store.stats().entries == 3
    assert all(not store.contains(make_key("c2", s)) and store.contains(make_key("c1", s))
               for s in scopes.values())
    # evict orders the entries of every node by their last use, across nodes.
    first, second, third = scopes.values()
    for scope in (second, first, third):
        store.get(make_key("c1", scope))
    size = store.stats().bytes // 3
    assert store.evict(size) == 2
    assert [store.contains(make_key("c1", s)) for s in (first, second, third)] == [
        False, False, True]
    assert store.delete_scope(third) == 1 and store.stats().entries == 0
    assert sum(server.admin.dbsize() for server in redis_cluster.servers) == 0


def test_a_node_killed_mid_use_is_a_miss_with_the_reason(tmp_path):
    cluster = start_cluster(tmp_path / "cluster")
    try:
        store = open_kv_store(cluster.url())
        scopes = scope_per_node(cluster)
        for scope in scopes.values():
            store.put(make_key("c1", scope), make_entry())
        dead, alive = cluster.servers[0], cluster.servers[1]
        dead.process.kill()
        dead.process.wait()
        started = time.monotonic()
        # A scope on a live node is still served; one on the dead node is a miss, with why.
        assert store.get(make_key("c1", scopes[alive.port])) is not None
        assert store.error is None
        assert store.get(make_key("c1", scopes[dead.port])) is None
        assert "ConnectionError" in store.error and f"127.0.0.1:{dead.port}" in store.error
        store.put(make_key("c2", scopes[alive.port]), make_entry())  # no raise: the caller
        assert not store.contains(make_key("c1", scopes[alive.port]))  # off for a while
        assert store.stats().entries == 0
        with pytest.raises(StoreUnavailable):
            store.gc()
        assert time.monotonic() - started < 5
        # A process that opens the store now still reaches the live nodes' scopes.
        fresh = open_kv_store(cluster.url())
        assert fresh.get(make_key("c1", scopes[alive.port])) is not None
        assert fresh.get(make_key("c1", scopes[dead.port])) is None and fresh.error
        # The whole cluster down: the store still opens; a request is a miss, with why.
        cluster.stop()
        down = open_kv_store(cluster.url())
        assert down.get(make_key("c1", scopes[alive.port])) is None
        assert "ConnectionError" in down.error and down.location in down.error
    finally:
        cluster.stop()


def test_cluster_urls():
    url = "redis+cluster://alice:s3cret@127.0.0.1:7000,127.0.0.1:7001,[::1]:7002"
    assert check_spec(url) == [url]
    assert check_spec(f"local,{url}") == ["local", url]
    store = open_kv_store(f"{url}?socket_timeout=1&kv_dtype=float16")
    assert store.location == ("redis+cluster://127.0.0.1:7000,127.0.0.1:7001,[::1]:7002"
                              "?kv_dtype=float16")
    assert "s3cret" not in repr(store) and store.user == "alice"
    assert open_kv_store("rediss+cluster://h").location == "rediss+cluster://h:6379"


@pytest.mark.parametrize(("spec", "expected"), [
    ("redis://u:pw@h:1,g:2/0", "names several hosts"),
    ("redis+cluster://u:pw@h:1,g:x", "bad port"),
    ("redis+cluster://u:pw@h:1,:2", "expected host:port"),
    ("redis+cluster://u:pw@h:1/2", "database 0 only"),
    ("redis+cluster://u:pw@h:1?timeout=1", "unknown option"),
    ("local,redis+cluster://u:pw@", "expected host:port"),
])
def test_bad_cluster_urls_are_errors(spec, expected):
    with pytest.raises(StoreSpecError, match=expected) as error:
        check_spec(spec)
    assert ":pw@" not in str(error.value)
