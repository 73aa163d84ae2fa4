"""Compose backends: what composition needs from a model runtime, behind one small protocol.

A backend tokenizes, prefills a chunk alone into per-layer KV, re-positions cached KV,
recomputes a selected set of tokens plus the query against a composed context, and scores or
generates from the resulting request state. It also describes itself (family, fingerprints) so
that cached KV is never used with a model or tokenizer it was not made by.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


class UnsupportedModel(Exception):
    """Composition would be wrong for this model (or input): callers fall back to full prefill."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ModelInfo:
    family: str  # the model_type, e.g. "llama"
    fingerprint: str  # weights, dtype, family and RoPE parameters
    tokenizer_fingerprint: str
    dtype: str
    n_layers: int
    max_positions: int
    unsupported: str | None = None  # why composition is refused for this model, if it is


@dataclass
class ChunkKV:
    """Per-layer keys and values of a token span, rotated for positions ``start``.."""

    keys: list[torch.Tensor]  # per layer, [kv_heads, n_tokens, head_dim]
    values: list[torch.Tensor]
    start: int = 0

    @property
    def n_tokens(self) -> int:
        return self.keys[0].shape[1] if self.keys else 0

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


class Backend(Protocol):
    info: ModelInfo

    def tokenize(self, text: str) -> list[int]: ...

    def detokenize(self, token_ids: list[int]) -> str: ...

    def prefill_chunk(self, token_ids: list[int], prefix_ids: list[int] = ()) -> ChunkKV: ...

    def reposition(self, kv: ChunkKV, start: int) -> ChunkKV: ...

    def full_prefill(self, token_ids: list[int]): ...

    def recompute(self, context_ids: list[int], context: ChunkKV, selected: list[int],
                  query_ids: list[int]): ...

    def score(self, state, target_ids: list[int]) -> float: ...

    def generate(self, state, max_new_tokens: int) -> list[int]: ...
