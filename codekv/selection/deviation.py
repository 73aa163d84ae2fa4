"""CacheBlend-style selection: the tokens whose reused KV deviates most from a fresh one."""

from __future__ import annotations

from dataclasses import dataclass

from codekv.selection.base import SelectionContext, Strategy


@dataclass
class DeviationSelection(Strategy):
    """Run all tokens through the first layers, then pick the top tokens by KV deviation."""

    name = "deviation"
    needs_deviation = True

    def select(self, context: SelectionContext) -> list[int]:
        if context.budget <= 0 or context.deviation is None:
            return []
        return top_deviation(context, context.budget, exclude=set())


def top_deviation(context: SelectionContext, count: int, exclude: set[int]) -> list[int]:
    deviation = context.deviation().clone()
    deviation[: context.prefix_length] = -1
    for position in exclude:
        deviation[position] = -1
    count = min(count, int((deviation >= 0).sum()))
    if count <= 0:
        return []
    return sorted(deviation.topk(count).indices.tolist())
