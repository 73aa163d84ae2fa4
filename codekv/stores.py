"""Which chunk KV store a request uses: the local disk (the default), a shared Redis, or both.

A store spec is one of

- a directory: the local store there;
- a Redis URL, ``redis://[user:password@]host:port/db`` (``rediss://`` for TLS; query options
  such as ``?socket_timeout=2`` reach the client): the shared store alone;
- ``local,<redis URL>``: the local store first, the shared one behind it (a shared hit is copied
  to the local disk; when the server is down the local store still serves).

Anything with ``://`` or starting ``redis:`` is a URL, never a directory: a mistyped URL is an
error, not a folder.
``$CODEKV_STORE`` holds the spec the CLI and ``Composer`` use when none is given.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:  # the store modules import torch; option parsing must not
    from codekv.kvstore import KVEntry, KVKey, KVStore, StoreStats

STORE_ENV = "CODEKV_STORE"
LOCAL = "local"
SHARED_SCHEMES = ("redis", "rediss")
KV_DTYPES_NAMES = ("float16", "bfloat16")  # ?kv_dtype= : 16-bit values on the wire
_SPEC = re.compile(r"(rediss?:|local,|[A-Za-z][A-Za-z0-9+.-]*://)")


class StoreSpecError(ValueError):
    """A store spec that names no store codekv can open."""


class StoreUnavailable(RuntimeError):
    """A shared store's maintenance (``gc``, ``evict``, ``delete_scope``) could not reach it.

    Requests never see this: their reads and writes fall back to a miss."""


def is_shared_spec(spec: str | Path) -> bool:
    """Whether ``spec`` names a shared store (a URL, possibly after ``local,``)."""
    return isinstance(spec, str) and _SPEC.match(spec) is not None


def check_spec(spec: str) -> list[str]:
    """The parts of a shared-store spec (``[url]`` or ``["local", url]``); raises on others."""
    parts = [p.strip() for p in spec.split(",")]
    if len(parts) == 2 and parts[0] == LOCAL:
        url = parts[1]
    elif len(parts) == 1:
        url = parts[0]
    else:
        raise StoreSpecError(f"not a store: {_shown(spec)} (use a directory, a redis:// URL, or "
                             "local,<redis URL>)")
    scheme = url.partition("://")[0]
    if scheme not in SHARED_SCHEMES or not urlsplit(url).hostname:
        raise StoreSpecError(f"not a Redis URL: {_shown(url)} (use "
                             "redis://[user:password@]host:port/db or rediss://...)")
    try:
        urlsplit(url).port  # noqa: B018 - raises on a port that is not a number
    except ValueError as error:
        raise StoreSpecError(f"bad port in {_shown(url)}: {error}") from error
    for value in parse_qs(urlsplit(url).query).get("kv_dtype", []):
        if value not in KV_DTYPES_NAMES:
            raise StoreSpecError(f"kv_dtype={value}: use one of {', '.join(KV_DTYPES_NAMES)}")
    return parts


def open_kv_store(spec: str | Path, local: Callable[[], KVStore] | None = None) -> KVStore:
    """The store ``spec`` names; ``local`` makes the local store ``local,<url>`` puts first."""
    from codekv.kvstore import LocalKVStore

    if not is_shared_spec(spec):
        if str(spec) == LOCAL and local is not None:
            return local()
        return LocalKVStore(Path(spec))
    parts = check_spec(str(spec))
    try:
        from codekv.redisstore import RedisKVStore
    except ImportError as error:
        raise StoreSpecError("the Redis store needs the 'shared' extra: "
                             "pip install 'codekv[shared]'") from error
    shared = RedisKVStore(parts[-1])
    if len(parts) == 1:
        return shared
    if local is None:
        raise StoreSpecError("'local,<url>' needs a local store to put first")
    return TieredKVStore(local(), shared)


def describe(store: KVStore) -> str:
    """What reports say the store is: a directory, or a URL without credentials."""
    from codekv.kvstore import LocalKVStore

    if isinstance(store, LocalKVStore):
        return str(store.root)
    return getattr(store, "url", type(store).__name__)


class TieredKVStore:
    """The local store in front of a shared one: local hits cost a memory map, shared hits are
    copied to the local disk, and a shared store that is down leaves the local one working."""

    def __init__(self, local: KVStore, shared: KVStore):
        self.local = local
        self.shared = shared
        self.url = f"{LOCAL},{describe(shared)}"
        self._hits = self._misses = 0

    @property
    def error(self) -> str | None:
        return getattr(self.shared, "error", None)

    def get(self, key: KVKey) -> KVEntry | None:
        return self._read(key, self.shared.get)

    def get_or_lease(self, key: KVKey) -> KVEntry | None:
        return self._read(key, getattr(self.shared, "get_or_lease", self.shared.get))

    def put(self, key: KVKey, entry: KVEntry) -> None:
        self.shared.put(key, entry)  # never raises on a failing server
        self.local.put(key, entry)

    def contains(self, key: KVKey) -> bool:
        return self.local.contains(key) or self.shared.contains(key)

    def stats(self) -> StoreStats:
        """Entries and bytes of the shared store; hits and misses of either."""
        from codekv.kvstore import StoreStats

        shared = self.shared.stats()
        corrupt = self.local.stats().corrupt + shared.corrupt
        return StoreStats(shared.entries, shared.bytes, self._hits, self._misses, corrupt)

    def evict(self, max_bytes: int) -> int:
        return self.local.evict(max_bytes) + self.shared.evict(max_bytes)

    def gc(self, keep=None, *, stale_after_s: float = 3600.0) -> int:
        return (self.local.gc(keep, stale_after_s=stale_after_s)
                + self.shared.gc(keep, stale_after_s=stale_after_s))

    def delete_scope(self, scope: str) -> int:
        return self.local.delete_scope(scope) + self.shared.delete_scope(scope)

    def _read(self, key: KVKey, shared_get) -> KVEntry | None:
        entry = self.local.get(key)
        if entry is None:
            entry = shared_get(key)
            if entry is not None:
                try:
                    self.local.put(key, entry)
                except OSError:
                    pass  # a full local disk: the next read goes to the shared store again
        if entry is None:
            self._misses += 1
        else:
            self._hits += 1
        return entry


def _shown(text: str) -> str:
    """``text`` with any password masked: errors and reports never show one."""
    parts = urlsplit(text) if "://" in text else None
    if parts is None or not parts.password:
        return text
    return text.replace(f":{parts.password}@", ":***@", 1)
