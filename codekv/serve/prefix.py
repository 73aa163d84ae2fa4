"""The exact-prefix cache of a server: recent requests' prompt KV, reused up to the longest
common token prefix with a new prompt.

Its own namespace and counters (never the chunk store's): what it serves is the same tokens at
the same positions after the same tokens, so it is exact. Entries are kept per scope (one API
key's prompts never answer another's) within a byte budget, least recently used out first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

DEFAULT_BUDGET_BYTES = 2 << 30


@dataclass
class Entry:
    token_ids: np.ndarray
    kv: Any  # the backend's chunk KV of those tokens, from position 0
    nbytes: int


class ExactPrefixLRU:
    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES):
        self.budget_bytes = budget_bytes
        self.entries: OrderedDict[tuple[str, bytes], Entry] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def longest(self, scope: str, token_ids: list[int]) -> tuple[int, Any]:
        """(n, kv): the longest common prefix of ``token_ids`` with a recent prompt of
        ``scope`` and that prompt's KV (n may be less than its length); (0, None) if none."""
        ids = np.asarray(token_ids, dtype=np.int64)
        best, best_key = 0, None
        for key, entry in self.entries.items():
            if key[0] != scope:
                continue
            n = min(len(ids), len(entry.token_ids))
            differ = np.flatnonzero(ids[:n] != entry.token_ids[:n])
            common = int(differ[0]) if differ.size else n
            if common > best:
                best, best_key = common, key
        if best_key is None:
            self.misses += 1
            return 0, None
        self.hits += 1
        self.entries.move_to_end(best_key)
        return best, self.entries[best_key].kv

    def put(self, scope: str, token_ids: list[int], kv: Any, nbytes: int) -> None:
        """Keep ``kv`` (of ``token_ids``); a prompt that is a prefix of one kept adds nothing."""
        if nbytes > self.budget_bytes:
            return
        ids = np.asarray(token_ids, dtype=np.int64)
        key = (scope, ids.tobytes())
        for other, entry in self.entries.items():
            if (other[0] == scope and len(entry.token_ids) >= len(ids)
                    and np.array_equal(entry.token_ids[:len(ids)], ids)):
                self.entries.move_to_end(other)
                return
        # Kept prompts that this one extends are now redundant.
        for other in [k for k, e in self.entries.items() if k[0] == scope
                      and len(e.token_ids) < len(ids)
                      and np.array_equal(ids[:len(e.token_ids)], e.token_ids)]:
            self.bytes -= self.entries.pop(other).nbytes
        self.entries[key] = Entry(ids, kv, nbytes)
        self.bytes += nbytes
        while self.bytes > self.budget_bytes:
            _, dropped = self.entries.popitem(last=False)
            self.bytes -= dropped.nbytes
