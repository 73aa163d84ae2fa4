"""The chunk KV cache: what a chunk's KV is stored under, the KV itself (the store's, else
computed after what its key says and stored), and the claim that keeps a scope's entries.

``Composer`` reads its chunks' KV through it, and ``codekv serve`` its prompts' segments: one
key, one get-or-compute, for both.
"""

from __future__ import annotations

import math
import time

from codekv.backends import Backend
from codekv.request import Counters, Report, RequestPiece
from codekv.stores import default_holder
from codekv.stores.base import KVStore
from codekv.stores.entry import BadEntry, KVKey, token_hash

CLAIM_REFRESH_S = 3600.0  # a cache renews its claim on its scope at most this often


class ChunkCache:
    """Chunk KV of one backend in one scope of ``store``; ``counters`` counts what it computed
    and what the store could not keep. ``holder`` names this home in its claim on the scope
    (default: ``home``'s, made lazily)."""

    def __init__(self, backend: Backend, store: KVStore, scope: str,
                 counters: Counters | None = None, holder: str | None = None, home=None):
        self.backend = backend
        self.store = store
        self.scope = scope
        self.counters = counters if counters is not None else Counters()
        self.holder = holder
        self.home = home
        self._claimed_at = -math.inf

    def key(self, piece: RequestPiece, after: list[int]) -> KVKey:
        """A chunk's KV depends on what it was prefilled after: nothing, the request's exact
        prefix (then its tokens never saw themselves start a sequence), or that prefix and the
        chunk's def-use neighbours."""
        info = self.backend.info
        identity = piece.identity
        if after:
            identity += "@after:" + token_hash(after)
        return KVKey(self.scope, info.fingerprint, info.tokenizer_fingerprint, identity,
                     token_hash(piece.ids))

    def kv(self, piece: RequestPiece, after: list[int], report: Report | None = None,
           after_kv: object = None) -> tuple[object, bool]:
        """``piece``'s KV computed after ``after``, in the backend's form: the store's, else
        computed (against ``after_kv``, the exact KV of ``after`` where the caller holds it) and
        stored; and whether the store had it. A bad entry found for it (deleted, then computed
        and stored again) is counted in ``report``."""
        key = self.key(piece, after)
        corrupt = self.store.corrupt
        # A shared store lets one process compute a missing chunk while the others wait.
        entry = self.store.get_or_lease(key)
        rejected = self.store.corrupt - corrupt  # bad entries the store found and deleted
        if entry is not None:
            try:
                kv = self.backend.from_entry(entry, len(after))
                if kv.n_tokens != len(piece.ids):
                    raise BadEntry(f"{kv.n_tokens} tokens where the key's have {len(piece.ids)}")
            except BadEntry:  # valid, but not this request's: the reader deletes it
                self.store.reject(key)
                rejected += 1
                entry = None
        if report is not None:
            report.store_rejected += rejected
        if entry is not None:
            return kv, True
        kv = self.backend.prefill_chunk(piece.ids, after, after_kv)
        self.counters.chunk_prefills += 1
        self.counters.chunk_prefill_tokens += len(piece.ids) + (
            len(after) if after_kv is None else 0)
        provenance = dict(piece.provenance, model=self.backend.info.fingerprint,
                          engine=self.backend.info.engine, n_tokens=len(piece.ids),
                          start=kv.start, created=time.time(),
                          anchor_positions=[[a.kind, a.start, a.end] for a in piece.anchors])
        entry = self.backend.to_entry(kv, provenance)
        try:
            self.store.put(key, entry)
        except OSError as error:
            # A full or read-only disk costs the next request a recompute, not this one.
            self._store_error(error)
        return kv, False

    def claim(self) -> None:
        """Record in the store that this home uses the scope (at most once an hour): another
        home's ``gc`` then keeps the scope's entries (``KVStore.collect``)."""
        now = time.time()
        if now - self._claimed_at < CLAIM_REFRESH_S:
            return
        self._claimed_at = now
        try:
            self.store.claim(self.scope, self.holder or default_holder(self.home))
        except OSError as error:  # a read-only store still serves
            self._store_error(error)

    def _store_error(self, error: OSError) -> None:
        errors = self.counters.store_errors
        errors[type(error).__name__] = errors.get(type(error).__name__, 0) + 1
