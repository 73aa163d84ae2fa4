"""What the server keeps of recent prompts on one engine, behind one object that says what it
can do (as LMCache's connectors declare ``support_*``): the server asks its abilities, never
the engine's name. The engine registry names each engine's class
(``codekv.backends.engines.Engine.prompt_cache``).

- ``KVPrompts`` (transformers): prompts kept as the backend's chunk KV in memory; a span of it
  can be taken out at its positions (segments from the scope's last prompt,
  ``codekv.serve.recent``) or shifted to others (shift-only reuse, ``codekv.serve.shift``).
- ``KeptStates`` (llama.cpp): prompts kept as sequence states in host memory, as
  llama-server's prompt cache keeps them; a kept prompt's first tokens are restored into the
  request and cut there. Spans are not shifted to other positions: shift-only reuse on
  llama.cpp was never measured.
"""

from __future__ import annotations

import importlib
from typing import Any

from codekv.backends.engines import ENGINES
from codekv.serve.prefix import DEFAULT_BUDGET_BYTES, ExactPrefixLRU


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
        return self.backend.head(kept, n)  # never written to: shared with the cache


class KeptStates(KVPrompts):
    """Prompts kept as llama.cpp sequence states, never as cells of the request's context
    (``codekv.backends.llamacpp``: kept cells would be scored by every batch)."""

    supports_shift = False

    def part(self, kept: Any, n: int) -> Any:
        from codekv.backends.llamacpp import KeptPrefix

        return KeptPrefix(kept, n)
