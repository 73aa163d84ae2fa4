"""The chunk KV store on a Redis Cluster: the Redis store, its keys spread over several nodes.

``redis+cluster://[user:password@]host:port[,host:port...][?option=value...]`` (``rediss+``
for TLS) names the nodes the client first asks for the cluster's layout; any one that answers
is enough. The store is ``RedisKVStore`` with a cluster client: every key carries its scope in
a hash tag (``codekv:{<scope>}:...``), so a scope's entries, LRU record, leases and claims share
one slot, on one node, and the store's transactions and scripts stay inside that slot. What
walks every scope (``stats``, ``evict``, ``gc`` and their SCAN) visits every primary node.

A node that fails - down, timed out, the cluster refusing with CLUSTERDOWN - is a failure like
a single server's: the request goes on as a miss, ``error`` says which node and why, and the
store stays off for ``retry_after_s``. Without replicas a dead node's slots are unserved and the
cluster soon refuses every slot (``cluster-require-full-coverage``), so the whole store is off.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from codekv.stores.redis_store import CLIENT_OPTIONS, RedisKVStore
from codekv.stores.urls import check_cluster_url, cluster_nodes, public_cluster_url


class RedisClusterKVStore(RedisKVStore):
    """A KVStore on a Redis Cluster, shared by every process that names one of its nodes."""

    _check_url = staticmethod(check_cluster_url)
    _public_url = staticmethod(public_cluster_url)

    def _client_factory(self, url: str) -> Callable[[], RedisCluster]:
        """A cluster client asks its first nodes for the layout as it is made: made at first
        use, so that the store opens while the cluster is down."""
        parts = urlsplit(url)
        (host, port), *others = cluster_nodes(url)
        userinfo, at, _ = parts.netloc.rpartition("@")
        first = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        scheme = "rediss" if parts.scheme.startswith("rediss") else "redis"
        first_url = urlunsplit((scheme, f"{userinfo}{at}{first}", "", parts.query, ""))

        def connect() -> RedisCluster:
            # Made, the client asks a node it picks at random for the commands it routes: one
            # try per node given, so that one dead node does not keep the others unused.
            try:
                client = RedisCluster(url=first_url, retry=Retry(NoBackoff(), len(others) + 1),
                                      startup_nodes=[ClusterNode(*n) for n in others],
                                      **CLIENT_OPTIONS)
            except RedisClusterException as error:  # no node answered, or a partial layout
                raise redis.ConnectionError(f"Redis Cluster: {error}") from error
            client.set_retry(Retry(NoBackoff(), 0))  # then one bounded try per command
            return client

        return connect
