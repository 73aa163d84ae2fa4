"""The server's pipeline on llama.cpp: recent prompts kept in the engine's own sequences.

As llama-server's slots do, each recent prompt's KV stays in a sequence of the llama.cpp
context (a bounded number of them, ``KEPT_SEQUENCES``, within the cells
``--prefix-cache-mb`` buys, least recently used out first). A new prompt's longest common
token prefix with a kept one (the same radix tree per scope as the transformers engine's) is
placed by sharing that sequence's cells into the request (``llama_memory_seq_cp``): nothing
is saved, restored or computed again. What a request keeps is shared back the same way; a kept
prompt that a new one extends is dropped and its sequence reused. Segments after the prefix are
composed as on any engine (``codekv.backends.llamacpp``).
"""

from __future__ import annotations

from dataclasses import dataclass

from codekv.backends.llamacpp import KEPT_FIRST, KeptPrefix, LlamaCppBackend, LlamaRequest
from codekv.serve.engine import Engine
from codekv.serve.prefix import DEFAULT_BUDGET_BYTES, ExactPrefixLRU

KEPT_SEQUENCES = 8  # recent prompts kept at once (llama-server's default is 4 slots)


@dataclass
class Slot:
    """A kept prompt's sequence (given once the cache has taken the prompt)."""

    seq: int = -1


class LlamaCppEngine(Engine):
    """``Engine`` whose exact-prefix cache is kept sequences of the backend's context."""

    backend: LlamaCppBackend

    def _exact_prefix_cache(self, budget_bytes: int | None) -> ExactPrefixLRU:
        """Sequences with room for ``budget_bytes`` of cells (allocated by llama.cpp up front,
        so no more than the kept sequences can fill)."""
        backend = self.backend
        budget = DEFAULT_BUDGET_BYTES if budget_bytes is None else budget_bytes
        cells = min(budget // backend.cell_bytes, KEPT_SEQUENCES * backend.info.max_positions)
        sequences = KEPT_SEQUENCES if cells else 0
        backend.keep_sequences(sequences, cells)
        # popped: the lowest first
        self._free = [KEPT_FIRST + i for i in reversed(range(sequences))]
        return ExactPrefixLRU(cells * backend.cell_bytes, on_drop=self._release)

    def _release(self, slot: Slot) -> None:
        if slot.seq >= 0:
            self.backend.release(slot.seq)
            self._free.append(slot.seq)

    def _prefix_part(self, slot: Slot, n: int) -> KeptPrefix:
        return KeptPrefix(slot.seq, n)

    def _keep_prefix(self, scope: str, ids: list[int], state: LlamaRequest) -> None:
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
