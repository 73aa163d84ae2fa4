"""Code-anchor selection: key anchors (query-named, cross-chunk def-use sites) and boundaries."""

from __future__ import annotations

from dataclasses import dataclass

from codekv.selection.base import SelectionContext, Strategy, boundary_positions, take
from codekv.selection.deviation import top_deviation

# After def-use sites, anchors by how much they shape what follows.
KIND_RANK = {"call": 0, "return": 1, "branch": 2, "assign": 3, "def": 4, "import": 5, "use": 6}


def anchor_positions(context: SelectionContext, ranked_kinds: bool = True) -> list[int]:
    """Anchor token positions in priority order: anchors naming what the query mentions, then
    def-use sites linking chunks of this request (the use and the definition it resolves to),
    then (with ``ranked_kinds``) the other anchors by kind."""
    present = context.request_chunks()
    used_names: dict[str, set[str]] = {}
    asked: list[int] = []
    cross: list[int] = []
    for segment in context.segments:
        for anchor in segment.anchors:
            if anchor.name in context.query_names and anchor.kind in ("def", "call", "use"):
                asked.extend(range(segment.start + anchor.start, segment.start + anchor.end))
            linked = anchor.target in present and anchor.target != segment.chunk_id
            if anchor.kind == "use" and linked:
                cross.extend(range(segment.start + anchor.start, segment.start + anchor.end))
                used_names.setdefault(anchor.target, set()).add(anchor.name)
    defs: list[int] = []
    ranked: list[tuple[int, int, int]] = []
    for segment in context.segments:
        names = used_names.get(segment.chunk_id, set())
        for anchor in segment.anchors:
            span = range(segment.start + anchor.start, segment.start + anchor.end)
            if anchor.kind == "def" and anchor.name in names:
                defs.extend(span)
            elif anchor.kind in KIND_RANK:
                ranked.extend((KIND_RANK[anchor.kind], p, 0) for p in span)
    ranked.sort()
    ordered = asked + cross + defs
    if ranked_kinds:
        ordered += [position for _, position, _ in ranked]
    # A chunk at position 0 has nothing before it: recomputing its tokens changes nothing.
    first = context.segments[0] if context.segments else None
    exact = first.end if first is not None and first.start == 0 else 0
    return [position for position in ordered if position >= exact]


@dataclass
class AnchorSelection(Strategy):
    """Up to ``anchor_share`` of the budget for the key anchors (named in the query, or
    def-use sites linking chunks of this request); the rest, and whatever those leave, for
    chunk boundaries shared evenly: the evaluation found boundaries the strongest single rule."""

    name = "anchors"
    anchor_share: float = 0.25

    def select(self, context: SelectionContext) -> list[int]:
        key = take(anchor_positions(context, ranked_kinds=False),
                   int(context.budget * self.anchor_share))
        longest = max((s.length for s in context.segments), default=0)
        return sorted(take(boundary_positions(context, longest), context.budget, key))


@dataclass
class HybridSelection(Strategy):
    """Half the budget by anchors (boundaries first), the rest by KV deviation."""

    name = "hybrid"
    needs_deviation = True
    boundary_per_chunk: int = 16

    def select(self, context: SelectionContext) -> list[int]:
        half = context.budget // 2
        boundary = take(boundary_positions(context, self.boundary_per_chunk), half // 2)
        chosen = take(anchor_positions(context), half, boundary)
        if context.deviation is not None:
            chosen += top_deviation(context, context.budget - len(chosen), exclude=set(chosen))
        return sorted(chosen)
