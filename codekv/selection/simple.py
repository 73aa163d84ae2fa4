"""The baselines: recompute nothing, everything, chunk boundaries, or a random share."""

from __future__ import annotations

from dataclasses import dataclass

from codekv.selection.base import SelectionContext, Strategy, boundary_positions, take


@dataclass
class NoneSelection(Strategy):
    """Naive concatenation of re-positioned chunk KV; only the query is computed."""

    name = "none"
    ratio_free = True

    def select(self, context: SelectionContext) -> list[int]:
        return []


@dataclass
class NoneNoRopeSelection(Strategy):
    """Concatenation without re-positioning: for evaluation only, to show the damage."""

    name = "none-norope"
    reposition = False
    ratio_free = True

    def select(self, context: SelectionContext) -> list[int]:
        return []


@dataclass
class AllSelection(Strategy):
    """Recompute every context token: equals full prefill (the exactness check)."""

    name = "all"
    recomputes_all = True

    def select(self, context: SelectionContext) -> list[int]:
        return list(range(context.prefix_length, context.n_context))


@dataclass
class BoundarySelection(Strategy):
    """The first tokens of each chunk after the first, the budget shared evenly (EPIC)."""

    name = "boundary"
    max_per_chunk: int = 64

    def select(self, context: SelectionContext) -> list[int]:
        following = [s for s in context.segments if s.start > 0]
        if not following or context.budget <= 0:
            return []
        per_chunk = min(self.max_per_chunk, max(1, context.budget // len(following)))
        return sorted(take(boundary_positions(context, per_chunk), context.budget))


@dataclass
class RandomSelection(Strategy):
    """A random share of the reused positions, seeded by the request's shape: the gate's
    negative control (a rule that spends the budget on nothing in particular must fail)."""

    name = "random"
    control = True

    def select(self, context: SelectionContext) -> list[int]:
        import random  # here: the registry's importers stay light (tests/test_imports.py)

        positions = range(context.prefix_length, context.n_context)
        rng = random.Random(f"random:{context.n_context}:{context.prefix_length}")
        return sorted(rng.sample(positions, min(context.budget, len(positions))))
