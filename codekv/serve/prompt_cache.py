"""What the server keeps of recent prompts on one engine, behind one object that says what it
can do (as LMCache's connectors declare ``support_*``): the server asks its abilities, never
the engine's name. The engine registry names each engine's class
(``codekv.backends.engines.Engine.prompt_cache``).

- ``KVPrompts`` (transformers): prompts kept as the backend's chunk KV in memory; a span of it
  can be taken out at its positions (segments from the scope's last prompt,
  ``codekv.serve.recent``) or shifted to others (shift-only reuse, ``codekv.serve.shift``).
- ``KeptSequences`` (llama.cpp): as llama-server's slots, each recent prompt stays in a sequence
  of the llama.cpp context (a bounded number of them, ``KEPT_SEQUENCES``, within the cells
  ``--prefix-cache-mb`` buys, least recently used out first). A new prompt's longest common
  token prefix with a kept one (the same radix tree per scope) is placed by sharing that
  sequence's cells into the request (``llama_memory_seq_cp``): nothing is saved, restored or
  computed again. What a request keeps is shared back the same way; a kept prompt that a new
  one extends is dropped and its sequence reused. The scope's last prompt is saved as a
  sequence state of its own, spans of which are cut out by restoring it (``span``); they
  cannot be shifted in place (a cell has one position for every sequence sharing it).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from codekv.backends.engines import ENGINES
from codekv.serve.prefix import DEFAULT_BUDGET_BYTES, ExactPrefixLRU

KEPT_SEQUENCES = 8  # llama.cpp: recent prompts kept at once (llama-server's default: 4 slots)


class PromptCache:
    """An engine's recent prompts: the exact-prefix cache (``prefix``, the longest common
    token prefix with a kept prompt of the scope), a kept prompt's first tokens as a request's
    first part, and what a request leaves for later ones."""

    # Spans of a kept prompt's KV taken out at their positions: segments reused from the
    # scope's last prompt (``codekv.serve.recent``).
    supports_last_prompt: bool = False
    # The same spans shifted to other positions: shift-only reuse (``codekv.serve.shift``).
    supports_shift: bool = False
    prefix: ExactPrefixLRU

    def part(self, kept: Any, n: int) -> Any:
        """The first ``n`` tokens of a kept prompt as the first part of a request."""
        raise NotImplementedError

    def keep(self, scope: str, ids: list[int], state) -> None:
        """Keep the state's first ``len(ids)`` tokens (exact KV) for later prompts."""
        raise NotImplementedError

    def own(self, kept: Any, n: int) -> Any:
        """The first ``n`` tokens of a kept prompt as KV of their own, which outlives the kept
        prompt (the scope's last prompt, ``codekv.serve.recent``)."""
        raise NotImplementedError


def prompt_cache(backend, budget_bytes: int | None = None) -> PromptCache:
    """The prompt cache of ``backend``'s engine, within ``budget_bytes`` (default 2 GiB)."""
    module, _, name = ENGINES[backend.info.engine].prompt_cache.partition(":")
    return getattr(importlib.import_module(module), name)(backend, budget_bytes)


class KVPrompts(PromptCache):
    """Prompts kept as the backend's chunk KV, views of which are spans at any position."""

    supports_last_prompt = supports_shift = True

    def __init__(self, backend, budget_bytes: int | None = None):
        self.backend = backend
        self.prefix = ExactPrefixLRU(DEFAULT_BUDGET_BYTES if budget_bytes is None
                                     else budget_bytes)

    def part(self, kept: Any, n: int) -> Any:
        return self.backend.head(kept, n)

    def keep(self, scope: str, ids: list[int], state) -> None:
        kv = self.backend.state_kv(state, len(ids))
        self.prefix.put(scope, ids, kv, kv.nbytes())

    def own(self, kept: Any, n: int) -> Any:
        return self.backend.head(kept, n)  # views of KV never written to


@dataclass
class Slot:
    """A kept prompt's sequence (given once the cache has taken the prompt)."""

    seq: int = -1


class KeptSequences(PromptCache):
    """Prompts kept in sequences of a llama.cpp context with room for ``budget_bytes`` of
    cells (allocated by llama.cpp up front, so no more than the kept sequences can fill)."""

    supports_last_prompt = True

    def __init__(self, backend, budget_bytes: int | None = None):
        from codekv.backends.llamacpp import KEPT_FIRST

        self.backend = backend
        budget = DEFAULT_BUDGET_BYTES if budget_bytes is None else budget_bytes
        cells = min(budget // backend.cell_bytes, KEPT_SEQUENCES * backend.info.max_positions)
        sequences = KEPT_SEQUENCES if cells else 0
        backend.keep_sequences(sequences, cells)
        # popped: the lowest first
        self._free = [KEPT_FIRST + i for i in reversed(range(sequences))]
        self.prefix = ExactPrefixLRU(cells * backend.cell_bytes, on_drop=self._release)

    def _release(self, slot: Slot) -> None:
        if slot.seq >= 0:
            self.backend.release(slot.seq)
            self._free.append(slot.seq)

    def part(self, slot: Slot, n: int) -> Any:
        from codekv.backends.llamacpp import KeptPrefix

        return KeptPrefix(slot.seq, n)

    def own(self, slot: Slot, n: int) -> Any:
        return self.backend.kept_state(self.part(slot, n))

    def keep(self, scope: str, ids: list[int], state) -> None:
        """The cache first takes the prompt (dropping those it extends), then a sequence is
        found for it: a free one, else the least recently used prompt's."""
        slot = Slot()
        if not self.backend.kept_sequences or not self.prefix.put(
                scope, ids, slot, len(ids) * self.backend.cell_bytes):
            return
        if not self._free:
            self.prefix.drop_least_recent()  # never the new prompt: the most recent
        slot.seq = self._free.pop()
        self.backend.keep(state, slot.seq, len(ids))
