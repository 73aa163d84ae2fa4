"""The chunk KV store on Redis: one cache for a team's agents on many machines.

Keys, one prefix per scope, the scope in a hash tag so that a scope's keys share one Redis
Cluster slot and one ACL key pattern (``~codekv:{<scope>}:*``)::

    codekv:{<scope>}:e:<digest>       an entry: the local store's file, byte for byte
                                      (safetensors, key fields, provenance, xxh3-128 checksum)
    codekv:{<scope>}:lru              sorted set: digest -> last access, for ``evict``
    codekv:{<scope>}:lease:<digest>   a short lease: one process computes a missing chunk
    codekv:{<scope>}:claims           hash: holder (a codekv home) -> when it last used the scope

A scope made of other characters than ``[A-Za-z0-9._:-]`` (or longer than 128) is named by its
sha256 (``#<hex>``), which no plain scope can spell. An entry is one ``SET NX`` of one value,
so it appears whole or not at all and is never overwritten; every read is verified like a local
file, and a damaged, forged or wrong-key value - or a key holding another Redis type - is
deleted (only while it still holds what failed) and reported as a miss, so the caller
recomputes.

Failures - the server unreachable, a timeout, a connection killed mid-request, an ACL refusal -
never raise out of ``get``, ``put`` or ``contains``: the store answers a miss, records why in
``error`` and stays off for ``retry_after_s``, so that a request pays one bounded timeout, not
one per chunk. Server-side, ``maxmemory`` with ``maxmemory-policy allkeys-lru`` bounds the
store; ``max_bytes`` and ``evict`` are the client-side equivalent of the local store's bound.
"""

from __future__ import annotations

import functools
import hashlib
import re
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.exceptions import NoPermissionError, RedisError, ResponseError
from redis.retry import Retry

from codekv.stores.base import AccessClock, KVStore, StoreSpecError, StoreUnavailable
from codekv.stores.entry import (
    FORMAT_VERSION,
    CorruptEntry,
    KVEntry,
    KVKey,
    StoreStats,
    all_finite,
    decode_bytes,
    encode_entry,
    entry_format,
    entry_provenance,
    header_length,
    header_meta,
)
from codekv.stores.urls import (
    check_redis_url,
    mask_credentials,
    mask_secrets,
    mask_url,
    public_url,
)

TIMEOUT_S = 5.0  # per socket read or write; a 4K-token request's largest chunk is ~25 MB
CONNECT_TIMEOUT_S = 1.0
LEASE_S = 30.0  # a chunk prefill on a CPU takes seconds; a dead holder delays others this long
RETRY_AFTER_S = 30.0
# Every client: bounded waits, one try (a fallback beats a wait), named in CLIENT LIST.
CLIENT_OPTIONS = {"socket_timeout": TIMEOUT_S, "socket_connect_timeout": CONNECT_TIMEOUT_S,
                  "client_name": "codekv"}
_POLL_S = 0.02
_STORED_FROM = "codekv.kv_dtype_of"  # provenance of a 16-bit entry: the dtype it came from
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
# Delete a key that holds another Redis type than a string: never an entry, whoever wrote it.
_DELETE_IF_NOT_STRING = """
if redis.call('TYPE', KEYS[1])['ok'] ~= 'string' then return redis.call('DEL', KEYS[1]) end
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


# What a scope's user may run: the store's reads, writes, leases and claims, on its own keys
# only. No SCAN or KEYS (key names of other scopes stay hidden): its ``gc`` and ``stats`` of its
# scope walk the scope's LRU record instead; ``evict`` and those of every scope run as an
# administrator.
SCOPE_USER_COMMANDS = ("-@all", "+get", "+set", "+exists", "+del", "+type", "+strlen",
                       "+getrange", "+zadd", "+zrem", "+zscore", "+zrange", "+hset", "+hgetall",
                       "+evalsha", "+script|load", "+multi", "+exec", "+discard", "+ping",
                       "+hello", "+client|setname")


def scope_user_rules(password: str, scope: str) -> list[str]:
    """``ACL SETUSER <user>`` rules for a user limited to ``scope``'s keys."""
    return ["reset", "on", f">{password}", f"~{key_pattern(scope)}", "resetchannels",
            *SCOPE_USER_COMMANDS]


class RedisKVStore(KVStore):
    """A KVStore on a Redis (or Valkey) server, shared by every process that names its URL."""

    def __init__(self, url: str, max_bytes: int | None = None, *, lease_s: float = LEASE_S,
                 retry_after_s: float = RETRY_AFTER_S):
        self._check_url(url)  # raises StoreSpecError, credentials masked
        parts = urlsplit(url)
        query = parse_qs(parts.query)
        self.kv_dtype = query.pop("kv_dtype", [None])[0]  # 16-bit values on the wire
        client_url = urlunsplit(parts._replace(query=urlencode(query, doseq=True)))
        self._connect = self._client_factory(client_url)
        if max_bytes is not None and max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.url = self._public_url(url) + (f"?kv_dtype={self.kv_dtype}" if self.kv_dtype else "")
        self.user = parts.username or "default"
        self.max_bytes = max_bytes
        self.lease_s = lease_s
        self.retry_after_s = retry_after_s
        self.error: str | None = None  # why the store is off; None once a call succeeds
        self._off_until = 0.0
        self._hits = self._misses = self._corrupt = 0
        self.waited = 0  # entries got by waiting for another process's lease
        self._clock = AccessClock()
        self._leases: set[str] = set()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # -- the client: what a subclass on another deployment of Redis replaces -----------------

    _check_url = staticmethod(check_redis_url)
    _public_url = staticmethod(public_url)

    def _client_factory(self, url: str) -> Callable[[], redis.Redis]:
        """What makes the client of ``url`` (its ``kv_dtype`` removed) at first use; raises
        ``StoreSpecError`` on a URL the client refuses. A server's client connects only when
        it sends its first command, so it is made now."""
        try:
            client = redis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), **CLIENT_OPTIONS)
        except ValueError as error:
            raise StoreSpecError(f"bad Redis URL {mask_url(url)}: "
                                 f"{mask_secrets(str(error), url)}") from error
        return lambda: client

    @functools.cached_property
    def _client(self) -> redis.Redis:
        """Made at first use: a cluster's client connects as it is made, and a store must open
        while its server is down (a failure here is one more failure a request falls back on)."""
        return self._connect()

    @functools.cached_property
    def _delete_if_same(self):
        return self._client.register_script(_DELETE_IF_SAME)

    @functools.cached_property
    def _delete_if_not_string(self):
        return self._client.register_script(_DELETE_IF_NOT_STRING)

    # -- public API -------------------------------------------------------------------------

    @property
    def location(self) -> str:
        """The URL without user, password or query (with ``?kv_dtype=`` when set)."""
        return self.url

    @property
    def corrupt(self) -> int:
        return self._corrupt

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
                    pipe.zadd(self._lru_key(key.scope), {key.digest(): self._clock.stamp()})
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

    def reject(self, key: KVKey) -> None:
        key = self._wire_key(key)
        try:
            self._delete(self._entry_key(key))
        except _FAILURES as error:
            self._fail(error, key.scope)
            return
        self._corrupt += 1

    def stats(self, scope: str | None = None) -> StoreStats:
        """Entries and bytes of ``scope``, else of every scope this client may scan (none
        while unreachable)."""
        try:
            with self._maintenance("stats", scope or "*"):
                sizes = self._sizes(self._entry_names(scope))
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

    def gc(self, keep: Callable[[dict], bool] | None = None, *, scope: str | None = None,
           stale_after_s: float = 3600.0) -> int:
        """Remove entries of another format version, unreadable ones (a key of another Redis
        type included) and, with ``keep``, those whose provenance fails it; drop LRU records of
        entries the server evicted. Only in ``scope`` when given.

        Leases expire on their own (``stale_after_s`` is the local store's notion). Returns the
        number of entries removed.
        """
        with self._maintenance("gc", scope or "*"):
            return self._gc(keep, scope)

    def _delete(self, name: str) -> int:
        """Delete an entry and its LRU record together; 1 if the entry was there."""
        lru, digest = _lru_and_digest(name)
        with self._client.pipeline(transaction=True) as pipe:
            pipe.delete(name)
            pipe.zrem(lru, digest)
            deleted, _ = pipe.execute()
        return deleted

    def _gc(self, keep: Callable[[dict], bool] | None, scope: str | None) -> int:
        removed = 0
        for name in self._entry_names(scope):
            try:
                meta = self._meta(name)
            except ResponseError as error:
                if not _wrong_type(error):
                    raise
                self._corrupt += 1
                removed += self._delete_if_not_string(keys=[name])
                self._client.zrem(*_lru_and_digest(name))
                continue
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
        lrus = [self._lru_key(scope)] if scope is not None else self._scan("codekv:{*}:lru")
        for lru in lrus:
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

    def claim(self, scope: str, holder: str) -> None:
        """Never fails a request: a refusal is recorded in ``error``, the store stays on."""
        if self._off():
            return
        try:
            self._client.hset(self._claims_key(scope), holder, repr(time.time()))
        except _FAILURES as error:
            self.error = f"{self.url}: claim of scope {scope!r} failed: {_described(error)}"

    def claims(self, scope: str) -> dict[str, float]:
        with self._maintenance("claims", scope):
            found = self._client.hgetall(self._claims_key(scope))
        claims = {}
        for holder, at in found.items():
            try:
                claims[holder.decode()] = float(at)
            except (UnicodeDecodeError, ValueError):
                continue  # not a claim codekv wrote: it keeps nothing
        return claims

    # -- internals --------------------------------------------------------------------------

    def _entry_names(self, scope: str | None) -> list[str]:
        """The entry keys of ``scope`` (else of every scope this client may scan)."""
        if scope is None:
            return list(self._scan("codekv:{*}:e:*"))
        try:
            return list(self._scan(f"codekv:{{{scope_tag(scope)}}}:e:*"))
        except NoPermissionError:  # a scope's user may not SCAN: its LRU record names them
            prefix = f"codekv:{{{scope_tag(scope)}}}:e:"
            return [prefix + d.decode() for d in self._client.zrange(self._lru_key(scope), 0, -1)]

    def _fetch(self, key: KVKey) -> KVEntry | None:
        if self._off():
            return None
        name = self._entry_key(key)
        try:
            with self._client.pipeline(transaction=False) as pipe:
                pipe.get(name)
                pipe.zadd(self._lru_key(key.scope), {key.digest(): self._clock.stamp()}, xx=True)
                data, recorded = pipe.execute(raise_on_error=False)
            for answer in (data, recorded):
                if isinstance(answer, Exception) and not _wrong_type(answer):
                    raise answer
        except _FAILURES as error:
            self._fail(error, key.scope)
            return None
        self.error = None
        if isinstance(data, Exception):  # not an entry, whoever wrote it: bad, not an outage
            self._corrupt += 1
            try:
                self._delete_if_not_string(keys=[name])
            except _FAILURES as error:
                self._fail(error, key.scope)
            return None
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
            where = "every scope (an administrator's job)" if scope == "*" else \
                f"scope {scope!r} (keys {key_pattern(scope)})"
            self.error = (f"{self.url}: Redis user {self.user!r} may not use {where}: NOPERM; "
                          "ask for an ACL user of this scope")
        else:
            self.error = f"{self.url} failed: {_described(error)}"
        self._off_until = time.monotonic() + self.retry_after_s

    def _wire_key(self, key: KVKey) -> KVKey:
        """16-bit entries are other entries: a full-precision reader never gets one."""
        return replace(key, model=f"{key.model}|kv:{self.kv_dtype}") if self.kv_dtype else key

    def _narrowed(self, entry: KVEntry) -> KVEntry:
        """``entry`` in ``kv_dtype`` (its own dtype recorded), unless a value would not fit."""
        import torch

        if self.kv_dtype is None:
            return entry
        wire = getattr(torch, self.kv_dtype)
        tensors = entry.keys + entry.values
        if any(not t.is_floating_point() or t.dtype == wire for t in tensors):
            return entry
        narrow = [t.to(wire) for t in tensors]
        if not all(all_finite(t) for t in narrow):
            return entry  # beyond the 16-bit range: stored in full rather than as inf
        n = len(entry.keys)
        provenance = dict(entry.provenance, **{_STORED_FROM: str(tensors[0].dtype)[6:]})
        return KVEntry(narrow[:n], narrow[n:], provenance)

    def _entry_key(self, key: KVKey) -> str:
        return f"codekv:{{{scope_tag(key.scope)}}}:e:{key.digest()}"

    def _lru_key(self, scope: str) -> str:
        return f"codekv:{{{scope_tag(scope)}}}:lru"

    def _claims_key(self, scope: str) -> str:
        return f"codekv:{{{scope_tag(scope)}}}:claims"

    def _lease_key(self, key: KVKey) -> str:
        return f"codekv:{{{scope_tag(key.scope)}}}:lease:{key.digest()}"

    def _scan(self, pattern: str):
        for name in self._client.scan_iter(match=pattern, count=1000):
            yield name.decode()

    def _sizes(self, names) -> dict[str, int]:
        """Sizes of the entries among ``names`` (a key of another type is none)."""
        names = list(names)
        with self._client.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.strlen(name)
            sizes = pipe.execute(raise_on_error=False)
        for size in sizes:
            if isinstance(size, Exception) and not _wrong_type(size):
                raise size
        return {n: size for n, size in zip(names, sizes) if isinstance(size, int) and size}

    def _meta(self, name: str) -> dict | None:
        prefix = self._client.getrange(name, 0, 7)
        n = header_length(prefix)
        if n is None:
            return None
        return header_meta(prefix + self._client.getrange(name, 8, 8 + n - 1))


def _widened(entry: KVEntry) -> KVEntry:
    """A 16-bit entry back in the dtype it was computed in (the caller's model dtype)."""
    import torch

    original = entry.provenance.pop(_STORED_FROM, None)
    if original is None:
        return entry
    dtype = getattr(torch, original, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise CorruptEntry(f"{_STORED_FROM} names no floating dtype: {original!r}")
    return KVEntry([k.to(dtype) for k in entry.keys], [v.to(dtype) for v in entry.values],
                   entry.provenance)


def _lru_and_digest(entry_name: str) -> tuple[str, str]:
    prefix, _, digest = entry_name.rpartition(":e:")
    return f"{prefix}:lru", digest


def _wrong_type(error: Exception) -> bool:
    """A command met a key of another Redis type: a planted value, not a failing server."""
    return isinstance(error, ResponseError) and str(error).startswith("WRONGTYPE")


def _described(error: Exception) -> str:
    return f"{type(error).__name__}: {mask_credentials(str(error))}"
