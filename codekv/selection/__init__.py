"""Which context tokens to recompute: one small strategy class per rule, behind one method.

Like kvpress's presses: each strategy is a dataclass with ``select(context) -> positions``; a
new rule is one file registered in ``STRATEGIES``, which the command line and the evaluation
(``codekv.eval.methods``) read their names from. Importing it does not load torch.
"""

from codekv.selection.anchors import AnchorSelection, HybridSelection
from codekv.selection.base import (
    Segment,
    SelectionContext,
    Strategy,
    TokenAnchor,
)
from codekv.selection.deviation import DeviationSelection
from codekv.selection.query import (
    QueryAnchorSelection,
    QueryCostSelection,
    QueryDeepSelection,
    QueryNextSelection,
    QuerySelection,
)
from codekv.selection.simple import (
    AllSelection,
    BoundarySelection,
    NoneNoRopeSelection,
    NoneSelection,
    RandomSelection,
)

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls
    for cls in (
        NoneSelection,
        NoneNoRopeSelection,
        BoundarySelection,
        DeviationSelection,
        AnchorSelection,
        HybridSelection,
        QuerySelection,
        QueryCostSelection,
        QueryDeepSelection,
        QueryNextSelection,
        QueryAnchorSelection,
        AllSelection,
        RandomSelection,
    )
}


def strategy(name: str) -> Strategy:
    try:
        return STRATEGIES[name]()
    except KeyError:
        choices = ", ".join(STRATEGIES)
        raise ValueError(f"unknown strategy {name!r}; choose from {choices}") from None


__all__ = [
    "STRATEGIES",
    "SelectionContext",
    "Segment",
    "Strategy",
    "TokenAnchor",
    "strategy",
]
