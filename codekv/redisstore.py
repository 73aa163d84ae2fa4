"""The chunk KV store on Redis: one cache for a team's agents on many machines.

Keys, one prefix per scope, the scope in a hash tag so that a scope's keys share one Redis
Cluster slot and one ACL key pattern (``~codekv:{<scope>}:*``)::

    codekv:{<scope>}:e:<digest>       an entry: the local store's file, byte for byte
                                      (safetensors, key fields, provenance, xxh3-128 checksum)
    codekv:{<scope>}:lru              sorted set: digest -> last access, for ``evict``
    codekv:{<scope>}:lease:<digest>   a short lease: one process computes a missing chunk

A scope made of other characters than ``[A-Za-z0-9._:-]`` (or longer than 128) is named by its
sha256 (``#<hex>``), which no plain scope can spell. An entry is one ``SET NX`` of one value,
so it appears whole or not at all and is never overwritten; every read is verified like a local
file, and a damaged or wrong-key value is deleted (only while it still holds the same bytes)
and reported as a miss, so the caller recomputes.

Failures - the server unreachable, a timeout, a connection killed mid-request, an ACL refusal -
never raise out of ``get``, ``put`` or ``contains``: the store answers a miss, records why in
``error`` and stays off for ``retry_after_s``, so that a request pays one bounded timeout, not
one per chunk. Server-side, ``maxmemory`` with ``maxmemory-policy allkeys-lru`` bounds the
store; ``max_bytes`` and ``evict`` are the client-side equivalent of the local store's bound.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import redis
import torch
from redis.backoff import NoBackoff
from redis.exceptions import NoPermissionError, RedisError
from redis.retry import Retry

from codekv.kvstore import (
    FORMAT_VERSION,
    KVEntry,
    KVKey,
    StoreStats,
    decode_bytes,
    encode_entry,
    entry_format,
    entry_provenance,
    header_length,
    header_meta,
)
from codekv.stores import KV_DTYPES_NAMES, StoreUnavailable

SCHEMES = ("redis", "rediss")
TIMEOUT_S = 5.0  # per socket read or write; a 4K-token request's largest chunk is ~25 MB
CONNECT_TIMEOUT_S = 1.0
LEASE_S = 30.0  # a chunk prefill on a CPU takes seconds; a dead holder delays others this long
RETRY_AFTER_S = 30.0
_POLL_S = 0.02
_STORED_FROM = "codekv.kv_dtype_of"  # provenance of a 16-bit entry: the dtype it came from
KV_DTYPES = {name: getattr(torch, name) for name in KV_DTYPES_NAMES}
# Unreachable, timed out, killed mid-request, refused - and whatever a broken server or proxy
# makes the client raise (a malformed handshake reply is an AttributeError): a request never
# fails because the shared store did.
_FAILURES = (RedisError, OSError, ValueError, TypeError, AttributeError, IndexError)
_PLAIN_SCOPE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# Delete a key only while it still holds the value the caller saw (by its SHA-1): a corrupt
# value found by one reader must not take a good entry another writer has put since.
_DELETE_IF_SAME = """
local value = redis.call('GET', KEYS[1])
if value and redis.sha1hex(value) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def scope_tag(scope: str) -> str:
    """The scope as it appears in keys (and in ACL key patterns)."""
    if _PLAIN_SCOPE.fullmatch(scope):
        return scope
    return "#" + hashlib.sha256(scope.encode()).hexdigest()


def key_pattern(scope: str) -> str:
    """The ACL key pattern that covers exactly one scope's keys: ``codekv:{<scope>}:*``."""
    return f"codekv:{{{scope_tag(scope)}}}:*"


# What a scope's user may run: the store's reads, writes and leases, on its own keys only.
# No SCAN or KEYS (key names of other scopes stay hidden): maintenance (``gc``, ``evict``,
# ``stats``) runs as an administrator.
SCOPE_USER_COMMANDS = ("-@all", "+get", "+set", "+exists", "+del", "+strlen", "+getrange",
                       "+zadd", "+zrem", "+zscore", "+zrange", "+evalsha", "+script|load",
                       "+multi", "+exec", "+discard", "+ping", "+hello", "+client|setname")


def scope_user_rules(password: str, scope: str) -> list[str]:
    """``ACL SETUSER <user>`` rules for a user limited to ``scope``'s keys."""
    return ["reset", "on", f">{password}", f"~{key_pattern(scope)}", "resetchannels",
            *SCOPE_USER_COMMANDS]


def public_url(url: str) -> str:
    """``url`` without user, password or query: what reports and logs may show."""
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    if ":" in host:
        host = f"[{host}]"
    port = parts.port or 6379
    db = parts.path.strip("/") or "0"
    return f"{parts.scheme}://{host}:{port}/{db}"


class RedisKVStore:
    """A KVStore on a Redis (or Valkey) server, shared by every process that names its URL."""

    def __init__(self, url: str, max_bytes: int | None = None, *, lease_s: float = LEASE_S,
                 retry_after_s: float = RETRY_AFTER_S):
        parts = urlsplit(url)
        if parts.scheme not in SCHEMES:
            raise ValueError(f"not a Redis URL: {public_url(url)} (use redis:// or rediss://)")
        query = parse_qs(parts.query)
        self.kv_dtype = query.pop("kv_dtype", [None])[0]  # 16-bit values on the wire
        if self.kv_dtype is not None and self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}")
        client_url = urlunsplit(parts._replace(query=urlencode(query, doseq=True)))
        try:
            parts.port  # noqa: B018 - raises on a port that is not a number
            self._client = redis.Redis.from_url(
                client_url, socket_timeout=TIMEOUT_S, socket_connect_timeout=CONNECT_TIMEOUT_S,
                retry=Retry(NoBackoff(), 0),  # one bounded try: a fallback beats a wait
                client_name="codekv",
            )
        except ValueError as error:
            raise ValueError(f"bad Redis URL {public_url(url)}: {error}") from error
        if max_bytes is not None and max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.url = public_url(url) + (f"?kv_dtype={self.kv_dtype}" if self.kv_dtype else "")
        self.user = parts.username or "default"
        self.max_bytes = max_bytes
        self.lease_s = lease_s
        self.retry_after_s = retry_after_s
        self.error: str | None = None  # why the store is off; None once a call succeeds
        self._off_until = 0.0
        self._hits = self._misses = self._corrupt = 0
        self.waited = 0  # entries got by waiting for another process's lease
        self._last_stamp = 0
        self._leases: set[str] = set()
        self._delete_if_same = self._client.register_script(_DELETE_IF_SAME)

    def __repr__(self) -> str:
        return f"RedisKVStore({self.url!r})"

    # -- public API -------------------------------------------------------------------------

    def get(self, key: KVKey) -> KVEntry | None:
        """The entry for ``key`` or None; never raises (a failure is a miss, see ``error``)."""
        entry = self._fetch(self._wire_key(key))
        self._count(entry)
        return entry

    def get_or_lease(self, key: KVKey) -> KVEntry | None:
        """The entry, or None when this process should compute it (and then ``put`` it).

        On a miss, takes the key's lease (``SET NX`` with a ``lease_s`` expiry); if another
        process holds it, waits for that process's entry, at most until the lease expires.
        """
        key = self._wire_key(key)
        entry = self._fetch(key)
        deadline = time.monotonic() + self.lease_s
        while entry is None and not self._off():
            lease = self._lease_key(key)
            try:
                expiry = int(self.lease_s * 1000)
                if self._client.set(lease, secrets.token_hex(8), nx=True, px=expiry):
                    # The holder before us may have stored the entry (and freed the lease)
                    # between our miss and our lease: then there is nothing to compute.
                    entry = self._fetch(key)
                    if entry is None:
                        self._leases.add(lease)
                    else:
                        self._client.delete(lease)
                    break
                while self._client.exists(lease) and time.monotonic() < deadline:
                    time.sleep(_POLL_S)
            except _FAILURES as error:
                self._fail(error, key.scope)
                break
            entry = self._fetch(key)
            self.waited += entry is not None
            if time.monotonic() >= deadline:
                break
        self._count(entry)
        return entry

    def put(self, key: KVKey, entry: KVEntry) -> None:
        """Store ``entry`` unless one is there already; raises only on an invalid entry.

        An entry larger than ``max_bytes`` is not stored. A failing server is recorded in
        ``error``: the caller has its KV and loses only the chance to share it.
        """
        key = self._wire_key(key)
        data = encode_entry(key, self._narrowed(entry))
        lease = self._lease_key(key)
        held = lease in self._leases
        self._leases.discard(lease)
        fits = self.max_bytes is None or len(data) <= self.max_bytes
        if self._off() or not (fits or held):
            return
        try:
            with self._client.pipeline(transaction=True) as pipe:  # one slot: MULTI works
                if fits:
                    pipe.set(self._entry_key(key), data, nx=True)
                    pipe.zadd(self._lru_key(key.scope), {key.digest(): self._stamp()})
                if held:  # waiters look for the entry now (or compute it, if it did not fit)
                    pipe.delete(lease)
                pipe.execute()
        except _FAILURES as error:
            self._fail(error, key.scope)
            return
        self.error = None
        if self.max_bytes is not None:
            try:
                self.evict(self.max_bytes)
            except StoreUnavailable:
                pass  # recorded in ``error``; the entry itself is stored

    def contains(self, key: KVKey) -> bool:
        """Whether a value exists for ``key`` (not verified - ``get`` may still miss)."""
        if self._off():
            return False
        key = self._wire_key(key)
        try:
            found = bool(self._client.exists(self._entry_key(key)))
        except _FAILURES as error:
            self._fail(error, key.scope)
            return False
        self.error = None
        return found

    def stats(self) -> StoreStats:
        """Entries and bytes of every scope this client may scan (none while unreachable)."""
        try:
            with self._maintenance("stats"):
                sizes = self._sizes(self._scan("codekv:{*}:e:*"))
        except StoreUnavailable:
            sizes = {}
        return StoreStats(entries=len(sizes), bytes=sum(sizes.values()), hits=self._hits,
                          misses=self._misses, corrupt=self._corrupt)

    def evict(self, max_bytes: int) -> int:
        """Delete least-recently-used entries until the store holds <= ``max_bytes``."""
        with self._maintenance("evict"):
            return self._evict(max_bytes)

    def _evict(self, max_bytes: int) -> int:
        sizes = self._sizes(self._scan("codekv:{*}:e:*"))
        total = sum(sizes.values())
        if total <= max_bytes:
            return 0
        with self._client.pipeline(transaction=False) as pipe:
            for name in sizes:
                lru, digest = _lru_and_digest(name)
                pipe.zscore(lru, digest)
            scores = pipe.execute()
        order = sorted(zip(sizes, scores), key=lambda item: (item[1] or 0.0, item[0]))
        removed = 0
        for name, _ in order:
            if total <= max_bytes:
                break
            removed += self._delete(name)
            total -= sizes[name]
        return removed

    def gc(self, keep: Callable[[dict], bool] | None = None, *,
           stale_after_s: float = 3600.0) -> int:
        """Remove entries of another format version, unreadable ones and, with ``keep``, those
        whose provenance fails it; drop LRU records of entries the server evicted.

        Leases expire on their own (``stale_after_s`` is the local store's notion). Returns the
        number of entries removed.
        """
        with self._maintenance("gc"):
            return self._gc(keep)

    def _delete(self, name: str) -> int:
        """Delete an entry and its LRU record together; 1 if the entry was there."""
        lru, digest = _lru_and_digest(name)
        with self._client.pipeline(transaction=True) as pipe:
            pipe.delete(name)
            pipe.zrem(lru, digest)
            deleted, _ = pipe.execute()
        return deleted

    def _gc(self, keep: Callable[[dict], bool] | None) -> int:
        removed = 0
        for name in self._scan("codekv:{*}:e:*"):
            meta = self._meta(name)
            provenance = entry_provenance(meta) if meta is not None else None
            if meta is None or entry_format(meta) != FORMAT_VERSION:
                gone = True
                self._corrupt += meta is None
            elif keep is None:
                gone = False
            else:
                gone = provenance is None or not keep(provenance)
            if gone:
                removed += self._delete(name)
        for lru in self._scan("codekv:{*}:lru"):
            prefix = lru[: -len("lru")]
            digests = [d.decode() for d in self._client.zrange(lru, 0, -1)]
            with self._client.pipeline(transaction=False) as pipe:
                for digest in digests:
                    pipe.exists(f"{prefix}e:{digest}")
                present = pipe.execute()
            stale = [d for d, there in zip(digests, present) if not there]
            if stale:
                self._client.zrem(lru, *stale)
        return removed

    def delete_scope(self, scope: str) -> int:
        """Delete every key of ``scope``; returns the number of entries removed."""
        with self._maintenance("delete_scope", scope):
            return self._delete_scope(scope)

    def _delete_scope(self, scope: str) -> int:
        names = list(self._scan(key_pattern(scope)))
        entries = sum(":e:" in n for n in names)
        for start in range(0, len(names), 512):
            self._client.delete(*names[start : start + 512])
        return entries

    # -- internals --------------------------------------------------------------------------

    def _fetch(self, key: KVKey) -> KVEntry | None:
        if self._off():
            return None
        name = self._entry_key(key)
        try:
            with self._client.pipeline(transaction=False) as pipe:
                pipe.get(name)
                pipe.zadd(self._lru_key(key.scope), {key.digest(): self._stamp()}, xx=True)
                data, _ = pipe.execute()
        except _FAILURES as error:
            self._fail(error, key.scope)
            return None
        self.error = None
        if data is None:
            return None
        try:
            return _widened(decode_bytes(data, key))
        except Exception:  # anything a damaged value makes the parser raise
            self._corrupt += 1
            try:
                self._delete_if_same(keys=[name], args=[hashlib.sha1(data).hexdigest()])
            except _FAILURES as error:
                self._fail(error, key.scope)
            return None

    @contextmanager
    def _maintenance(self, what: str, scope: str = "*") -> Iterator[None]:
        try:
            yield
        except _FAILURES as error:
            self._fail(error, scope)
            raise StoreUnavailable(f"{what}: {self.error}") from error

    def _count(self, entry: KVEntry | None) -> None:
        if entry is None:
            self._misses += 1
        else:
            self._hits += 1

    def _off(self) -> bool:
        return time.monotonic() < self._off_until

    def _fail(self, error: Exception, scope: str) -> None:
        """Record why the store failed and stop using it for ``retry_after_s``."""
        if isinstance(error, NoPermissionError):
            self.error = (f"{self.url}: Redis user {self.user!r} may not use scope {scope!r} "
                          f"(keys {key_pattern(scope)}): NOPERM; ask for an ACL user of this "
                          "scope")
        else:
            self.error = f"{self.url} failed: {type(error).__name__}: {error}"
        self._off_until = time.monotonic() + self.retry_after_s

    def _stamp(self) -> int:
        """Microseconds, strictly increasing within this object (exact in a double)."""
        stamp = max(time.time_ns() // 1000, self._last_stamp + 1)
        self._last_stamp = stamp
        return stamp

    def _wire_key(self, key: KVKey) -> KVKey:
        """16-bit entries are other entries: a full-precision reader never gets one."""
        return replace(key, model=f"{key.model}|kv:{self.kv_dtype}") if self.kv_dtype else key

    def _narrowed(self, entry: KVEntry) -> KVEntry:
        """``entry`` in ``kv_dtype`` (its own dtype recorded), unless a value would not fit."""
        if self.kv_dtype is None:
            return entry
        wire = KV_DTYPES[self.kv_dtype]
        tensors = entry.keys + entry.values
        if any(not t.is_floating_point() or t.dtype == wire for t in tensors):
            return entry
        narrow = [t.to(wire) for t in tensors]
        if not all(bool(torch.isfinite(t).all()) for t in narrow):
            return entry  # beyond the 16-bit range: stored in full rather than as inf
        n = len(entry.keys)
        provenance = dict(entry.provenance, **{_STORED_FROM: str(tensors[0].dtype)[6:]})
        return KVEntry(narrow[:n], narrow[n:], provenance)

    def _entry_key(self, key: KVKey) -> str:
        return f"codekv:{{{scope_tag(key.scope)}}}:e:{key.digest()}"

    def _lru_key(self, scope: str) -> str:
        return f"codekv:{{{scope_tag(scope)}}}:lru"

    def _lease_key(self, key: KVKey) -> str:
        return f"codekv:{{{scope_tag(key.scope)}}}:lease:{key.digest()}"

    def _scan(self, pattern: str):
        for name in self._client.scan_iter(match=pattern, count=1000):
            yield name.decode()

    def _sizes(self, names) -> dict[str, int]:
        names = list(names)
        with self._client.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.strlen(name)
            return {n: size for n, size in zip(names, pipe.execute()) if size}

    def _meta(self, name: str) -> dict | None:
        prefix = self._client.getrange(name, 0, 7)
        n = header_length(prefix)
        if n is None:
            return None
        return header_meta(prefix + self._client.getrange(name, 8, 8 + n - 1))


def _widened(entry: KVEntry) -> KVEntry:
    """A 16-bit entry back in the dtype it was computed in (the caller's model dtype)."""
    original = entry.provenance.pop(_STORED_FROM, None)
    if original is None:
        return entry
    dtype = getattr(torch, original)
    return KVEntry([k.to(dtype) for k in entry.keys], [v.to(dtype) for v in entry.values],
                   entry.provenance)


def _lru_and_digest(entry_name: str) -> tuple[str, str]:
    prefix, _, digest = entry_name.rpartition(":e:")
    return f"{prefix}:lru", digest
