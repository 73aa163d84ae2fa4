"""What a request is made of and what happened to it: the vocabulary the library, the server
and the evaluation share, importable without torch (generating tasks loads no model runtime).

A request is an optional exact prefix, an ordered list of chunks (code chunks from the index,
free text passages, tool docs) and the query. Its status says what its KV state is:
``exact-prefix``, ``composed`` or ``full-prefill`` - a composed state is never an exact hit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from codekv.schema import ChunkKind
from codekv.selection import TokenAnchor

if TYPE_CHECKING:  # a code chunk comes from the index, which loads its parsers
    from codekv.chunks import Chunk

EXACT_PREFIX, COMPOSED, FULL_PREFILL = "exact-prefix", "composed", "full-prefill"


@dataclass(frozen=True)
class Passage:
    """Free text reused like a chunk: a retrieved passage or a tool's documentation."""

    text: str
    name: str = ""
    kind: ChunkKind = ChunkKind.PASSAGE  # or ChunkKind.TOOL_DOC


@dataclass(frozen=True)
class RequestPiece:
    """A chunk of the request, tokenized, with its identity and anchors in token positions."""

    ids: list[int]
    identity: str  # what its stored KV is keyed by (with the token ids' hash)
    kind: ChunkKind
    chunk_id: str | None
    anchors: list[TokenAnchor]
    provenance: dict
    chunk: Chunk | None = None  # a code piece's chunk (graph conditioning reads its uses)


@dataclass(frozen=True)
class Request:
    """A request's tokens: ``prefix_ids + pieces + query_ids``, tokenized once by
    ``Composer.build_request`` so composition, full prefill and the evaluation's other methods
    all see the same token sequence. ``prefix_ids`` start with the model's leading tokens (its
    BOS, where it has one)."""

    prefix_ids: list[int]
    pieces: list[RequestPiece]
    query_ids: list[int]

    @property
    def context_ids(self) -> list[int]:
        return self.prefix_ids + [t for piece in self.pieces for t in piece.ids]

    @property
    def token_ids(self) -> list[int]:
        return self.context_ids + self.query_ids


@dataclass
class Report:
    status: str = FULL_PREFILL
    # The rule, its ratio and what the chunks' KV was computed after: a composed request's
    # (or an exact-prefix one's); a full prefill has none.
    strategy: str | None = None
    ratio: float | None = None
    conditioning: str | None = None
    total_tokens: int = 0
    prefix_tokens: int = 0
    context_tokens: int = 0
    query_tokens: int = 0
    reused_tokens: int = 0
    recomputed_tokens: int = 0
    recompute_ratio: float = 0.0
    # The share of full prefill's causal attention work over the context that the recomputed
    # rows do: a row at position p attends to p + 1 keys, so rows late in the context cost more
    # than the ratio says (attention outweighs the rest of the model at a few thousand tokens).
    recompute_attention: float = 0.0
    chunk_hits: int = 0
    chunk_misses: int = 0
    exact_prefix_hit: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    ttft_s: float = 0.0
    fallback_reason: str | None = None
    store: str = ""  # the chunk KV store: a directory, or a URL without credentials
    store_hits: int = 0  # chunks whose KV the store served
    store_misses: int = 0  # chunks prefilled because the store had no valid entry
    store_error: str | None = None  # why the store was not used (the request went on without)
    # Entries found bad on reading (damaged, non-finite values, another layout, dtype or token
    # count than the request's): deleted, then recomputed and replaced (counted in
    # store_misses too) or, where a local copy was bad, served from the shared store.
    store_rejected: int = 0

    def as_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Counters:
    """Exact-prefix and composed paths are counted apart, never mixed."""

    exact_prefix_hits: int = 0
    exact_prefix_misses: int = 0
    composed: int = 0
    full_prefill: int = 0
    fallbacks: dict[str, int] = field(default_factory=dict)
    store_errors: dict[str, int] = field(default_factory=dict)  # chunk KV that could not be kept
    chunk_prefills: int = 0  # chunk KV computed because the store had none
    chunk_prefill_tokens: int = 0  # tokens those took through the model, conditioning included
