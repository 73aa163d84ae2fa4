"""The one interface every chunk KV store implements, and the rule ``gc`` follows on it.

A store keeps entries (``codekv.stores.entry``) per scope. What the composer, ``codekv gc`` and
the reports use is declared here: the abstract operations every store has, and the optional
abilities with the default a store that lacks them behaves by (a lease is a plain ``get``; a
store that cannot fail has no ``error``).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable

from codekv.stores.entry import KVEntry, KVKey, StoreStats

# How long a holder's claim on a scope keeps its entries from another holder's ``gc``.
CLAIM_RETENTION_S = 7 * 24 * 3600.0


class StoreSpecError(ValueError):
    """A store spec that names no store codekv can open."""


class StoreUnavailable(RuntimeError):
    """A shared store's maintenance (``gc``, ``evict``, ``delete_scope``) could not reach it.

    Requests never see this: their reads and writes fall back to a miss."""


class AccessClock:
    """Last-access stamps for LRU order, one per store object: microseconds since the epoch
    (exact in a double, which a Redis sorted-set score is), strictly increasing, so two
    accesses in one tick keep their order."""

    def __init__(self):
        self._last = 0

    def stamp(self) -> int:
        self._last = max(time.time_ns() // 1000, self._last + 1)
        return self._last


class KVStore(ABC):
    """A chunk KV store: local on disk, shared on a server, or one in front of the other.

    ``get`` verifies every entry it returns and answers a damaged, forged or wrong-key value as
    a miss (deleting it), so the caller recomputes; ``put`` writes an entry whole or not at all.
    """

    # Why the last call could not use the store (a shared server down or refusing); None when
    # it could. A store that cannot be unreachable never sets it.
    error: str | None = None

    @property
    @abstractmethod
    def location(self) -> str:
        """What reports show: a directory, or a URL without credentials."""

    @property
    @abstractmethod
    def corrupt(self) -> int:
        """Bad entries this object has found and deleted so far (``stats().corrupt``, without
        counting the store)."""

    @abstractmethod
    def get(self, key: KVKey) -> KVEntry | None:
        """The verified entry for ``key``, or None; never raises on a missing or bad entry."""

    def get_or_lease(self, key: KVKey) -> KVEntry | None:
        """The entry, or None when this process should compute it (and then ``put`` it).

        A shared store makes other processes missing the same key wait for that entry instead
        of computing it too; a store of one machine has nothing to wait for."""
        return self.get(key)

    @abstractmethod
    def put(self, key: KVKey, entry: KVEntry) -> None:
        """Store ``entry`` whole or not at all; raises on an invalid entry."""

    @abstractmethod
    def contains(self, key: KVKey) -> bool:
        """Whether an entry exists for ``key`` (cheap, not verified: ``get`` may still miss)."""

    @abstractmethod
    def reject(self, key: KVKey) -> None:
        """Delete ``key``'s entry: a reader found it unusable for the key (``BadEntry``).
        Counted as corrupt; the caller recomputes and puts a good one."""

    @abstractmethod
    def stats(self, scope: str | None = None) -> StoreStats:
        """Entries and bytes of ``scope`` (None: of every scope this client can see), and this
        object's hits, misses and corrupt entries."""

    @abstractmethod
    def evict(self, max_bytes: int) -> int:
        """Delete least-recently-used entries until the store holds <= ``max_bytes``."""

    @abstractmethod
    def gc(self, keep: Callable[[dict], bool] | None = None, *, scope: str | None = None,
           stale_after_s: float = 3600.0) -> int:
        """Remove leftovers (entries of another format, unreadable ones, what dead writers
        left) and, with ``keep``, entries whose provenance fails it; only in ``scope`` when
        given. Returns the number removed."""

    @abstractmethod
    def delete_scope(self, scope: str) -> int:
        """Delete every entry of ``scope``; returns the number of entries removed."""

    @abstractmethod
    def claim(self, scope: str, holder: str) -> None:
        """Record, in the store itself, that ``holder`` (a codekv home) uses ``scope`` now."""

    @abstractmethod
    def claims(self, scope: str) -> dict[str, float]:
        """Who claimed ``scope``, and when (seconds since the epoch)."""

    def collect(self, scope: str, keep: Callable[[dict], bool], holder: str, *,
                retention_s: float = CLAIM_RETENTION_S) -> tuple[int, list[str]]:
        """``gc`` of ``scope`` for ``holder``, whose view of what is live is ``keep``.

        One home's view is not another's: entries failing ``keep`` are removed only when no
        other holder has claimed the scope within ``retention_s``; leftovers always go. Records
        the holder's own claim first. Returns (removed, the other holders whose claims kept
        entries)."""
        self.claim(scope, holder)
        cutoff = time.time() - retention_s
        others = sorted(h for h, at in self.claims(scope).items() if h != holder and at >= cutoff)
        return self.gc(None if others else keep, scope=scope), others
