"""Query-aware selection: recompute the context tokens the query attends to.

Deviation ranks tokens by how much their reused KV changed, whatever the question; ProphetKV
(arXiv 2602.02579) calls that crowding-out - globally salient tokens the query never reads eat
the budget. These rules rank by the query's attention over the re-positioned context instead
(``SelectionContext.relevance``, one pass of the query through a few layers), above a floor of
each chunk's first tokens (the attention sinks a chunk computed alone carries, EPIC).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from codekv.selection.anchors import anchor_positions
from codekv.selection.base import SelectionContext, Strategy, boundary_positions, take

if TYPE_CHECKING:  # the command line lists strategies without loading torch
    import torch


def by_relevance(context: SelectionContext, positions: list[int] | None = None,
                 costs: torch.Tensor | None = None) -> list[int]:
    """Chunk positions (or ``positions``) by the query's attention, most attended first (per
    unit of ``costs``, when given); exact-prefix positions last."""
    relevance = context.relevance().clone() if costs is None else context.relevance() / costs
    relevance[: context.prefix_length] = float("-inf")
    if positions is None:
        return relevance.argsort(descending=True).tolist()
    return sorted(positions, key=lambda p: -float(relevance[p]))


@dataclass
class QuerySelection(Strategy):
    """``floor`` first tokens of each chunk, then the tokens the query attends to most."""

    name = "query"
    needs_relevance = True
    floor: int = 4

    def select(self, context: SelectionContext) -> list[int]:
        if context.budget <= 0 or context.relevance is None:
            return []
        chosen = take(boundary_positions(context, self.floor), context.budget)
        return sorted(take(by_relevance(context), context.budget, chosen))


@dataclass
class QueryCostSelection(QuerySelection):
    """``query`` priced by compute: a row at position p attends to p + 1 keys, so it costs
    ``1 + key_cost * (p + 1)``, and the tokens the query attends to sit late, where rows cost
    most. After the floor, takes the tokens with the most attention per unit of cost while the
    total stays within what ``budget`` rows spread evenly over the chunks would cost (and at
    most ``budget`` rows). With ``key_cost`` 0 it is ``query``."""

    name = "query-cost"

    def select(self, context: SelectionContext) -> list[int]:
        if context.budget <= 0 or context.relevance is None:
            return []
        import torch

        chunk_start = context.prefix_length
        costs = 1 + context.key_cost * (torch.arange(context.n_context, dtype=torch.float64) + 1)
        # (a hair over, so a budget of every token is not lost to rounding in the sums)
        allowance = context.budget * float(costs[chunk_start:].mean()) * (1 + 1e-9)
        chosen = take(boundary_positions(context, self.floor), context.budget)
        spent = float(costs[chosen].sum())
        seen = set(chosen)
        for position in by_relevance(context, costs=costs):
            if len(chosen) >= context.budget or position < chunk_start:
                break  # exact-prefix positions come last
            cost = float(costs[position])
            if position not in seen and spent + cost <= allowance:
                chosen.append(position)
                spent += cost
        return sorted(chosen)


@dataclass
class QueryNextSelection(QuerySelection):
    """``query``, each attended token taken with the ``span`` tokens after it in its chunk.

    A lookup copies the text that follows what it matched (an induction head attends to the
    token after the match), and the query attends to the match, not to what follows it."""

    name = "query-next"
    span: int = 16

    def select(self, context: SelectionContext) -> list[int]:
        if context.budget <= 0 or context.relevance is None:
            return []
        chosen = take(boundary_positions(context, self.floor), context.budget)
        end = {p: s.end for s in context.segments for p in range(s.start, s.end)}

        def followed() -> Iterator[int]:
            for position in by_relevance(context):
                if position in end:
                    yield from range(position, min(position + 1 + self.span, end[position]))

        return sorted(take(followed(), context.budget, chosen))


@dataclass
class QueryDeepSelection(QuerySelection):
    """``query``, ranked by the query's attention averaged over every layer rather than the
    first half's, so the layers that read an answer out of the context have a say."""

    name = "query-deep"
    deep_probe = True


@dataclass
class QueryAnchorSelection(Strategy):
    """``query`` with code anchors as a prior: after the floor, up to ``anchor_share`` of the
    budget for the key anchors (definitions and calls of names the query mentions, def-use
    partners inside the request), most attended first; the rest by the query's attention."""

    name = "query-anchors"
    needs_relevance = True
    floor: int = 4
    anchor_share: float = 0.25

    def select(self, context: SelectionContext) -> list[int]:
        if context.budget <= 0 or context.relevance is None:
            return []
        chosen = take(boundary_positions(context, self.floor), context.budget)
        key = by_relevance(context, anchor_positions(context, ranked_kinds=False))
        share = len(chosen) + int(context.budget * self.anchor_share)
        chosen = take(key, min(context.budget, share), chosen)
        return sorted(take(by_relevance(context), context.budget, chosen))
