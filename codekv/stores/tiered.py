"""The local store in front of a shared one (``local,<url>``): local hits cost a memory map,
shared hits are copied to the local disk, and a shared store that is down leaves the local one
working."""

from __future__ import annotations

from collections.abc import Callable

from codekv.stores.base import KVStore
from codekv.stores.entry import KVEntry, KVKey, StoreStats


class TieredKVStore(KVStore):
    """``local`` first, ``shared`` behind it; claims live in the shared store, where other homes
    can see them."""

    def __init__(self, local: KVStore, shared: KVStore):
        self.local = local
        self.shared = shared
        self._hits = self._misses = 0

    def __repr__(self) -> str:
        return f"TieredKVStore({self.local!r}, {self.shared!r})"

    @property
    def location(self) -> str:
        return f"local,{self.shared.location}"

    @property
    def error(self) -> str | None:
        return self.shared.error

    @property
    def corrupt(self) -> int:
        return self.local.corrupt + self.shared.corrupt

    def get(self, key: KVKey) -> KVEntry | None:
        return self._read(key, self.shared.get)

    def get_or_lease(self, key: KVKey) -> KVEntry | None:
        return self._read(key, self.shared.get_or_lease)

    def put(self, key: KVKey, entry: KVEntry) -> None:
        self.shared.put(key, entry)  # never raises on a failing server
        self.local.put(key, entry)

    def contains(self, key: KVKey) -> bool:
        return self.local.contains(key) or self.shared.contains(key)

    def reject(self, key: KVKey) -> None:
        self.local.reject(key)
        self.shared.reject(key)

    def stats(self, scope: str | None = None) -> StoreStats:
        """Entries and bytes of the shared store; hits and misses of either."""
        shared = self.shared.stats(scope)
        return StoreStats(shared.entries, shared.bytes, self._hits, self._misses, self.corrupt)

    def evict(self, max_bytes: int) -> int:
        return self.local.evict(max_bytes) + self.shared.evict(max_bytes)

    def gc(self, keep: Callable[[dict], bool] | None = None, *, scope: str | None = None,
           stale_after_s: float = 3600.0) -> int:
        """Both tiers; counted are the shared store's entries, as ``stats`` counts them."""
        self.local.gc(keep, scope=scope, stale_after_s=stale_after_s)
        return self.shared.gc(keep, scope=scope, stale_after_s=stale_after_s)

    def delete_scope(self, scope: str) -> int:
        """The local copies go too; counted are the entries as ``stats`` counts them."""
        self.local.delete_scope(scope)
        return self.shared.delete_scope(scope)

    def claim(self, scope: str, holder: str) -> None:
        self.shared.claim(scope, holder)

    def claims(self, scope: str) -> dict[str, float]:
        return self.shared.claims(scope)

    def _read(self, key: KVKey, shared_get: Callable[[KVKey], KVEntry | None]) -> KVEntry | None:
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
