"""What a selection strategy sees of a request, and the interface it implements."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the command line lists strategies without loading torch
    import torch


@dataclass(frozen=True)
class TokenAnchor:
    """An anchor as token positions inside its segment: [start, end)."""

    kind: str
    name: str
    start: int
    end: int
    target: str | None = None  # for ``use``: the chunk id defining the name


@dataclass
class Segment:
    """One composed chunk: where it sits in the context and what it holds."""

    start: int  # absolute position of its first token
    length: int
    chunk_id: str | None = None
    anchors: list[TokenAnchor] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass
class SelectionContext:
    n_context: int  # positions 0 .. n_context-1 (an exact prefix included)
    prefix_length: int  # positions below it come from an exact prefix: never recomputed
    segments: list[Segment]
    budget: int  # how many context tokens may be recomputed
    # Per-position KV deviation of the reused state from a fresh one (CacheBlend), on demand.
    deviation: Callable[[], torch.Tensor] | None = None
    query_names: frozenset[str] = frozenset()  # identifiers the query mentions
    # Per-position attention of the query over the reused context (query-aware rules), on demand.
    relevance: Callable[[], torch.Tensor] | None = None
    # A recomputed row at position p costs 1 + key_cost * (p + 1) (``ModelInfo.key_cost``).
    key_cost: float = 0.0

    def request_chunks(self) -> set[str]:
        return {s.chunk_id for s in self.segments if s.chunk_id}


class Strategy:
    """A selection rule: which context positions to recompute within ``context.budget``."""

    name: str = ""
    reposition: bool = True  # False only for the evaluation's "not re-positioned" baseline
    needs_deviation: bool = False  # reads ``context.deviation`` (an engine may not score it)
    needs_relevance: bool = False  # reads ``context.relevance``, likewise
    deep_probe: bool = False  # ``relevance`` averages every layer's attention, not the first half's
    ratio_free: bool = False  # recomputes nothing whatever the ratio
    recomputes_all: bool = False  # full prefill's result at a higher cost: the exactness check
    control: bool = False  # a negative control of the gate's calibration: never licensed

    def select(self, context: SelectionContext) -> list[int]:
        raise NotImplementedError


def take(ordered, budget: int, chosen: list[int] | None = None) -> list[int]:
    """Add positions in order, skipping repeats, until ``budget`` positions are chosen."""
    chosen = list(chosen or [])
    seen = set(chosen)
    for position in ordered:
        if len(chosen) >= budget:
            break
        if position not in seen:
            seen.add(position)
            chosen.append(position)
    return chosen


def boundary_positions(context: SelectionContext, per_chunk: int) -> list[int]:
    """The first ``per_chunk`` tokens of each chunk that follows other context (EPIC).

    Interleaved (every chunk's first token, then every chunk's second, ...), so a budget that
    cuts the list short shares it between the chunks instead of spending it on the first ones.
    """
    # A chunk at position 0 has nothing before it: its KV computed alone is already exact.
    following = [segment for segment in context.segments if segment.start > 0]
    positions = []
    for offset in range(per_chunk):
        positions.extend(s.start + offset for s in following if offset < s.length)
    return positions
