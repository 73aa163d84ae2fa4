"""Which context tokens to recompute: one small strategy class per rule, behind one method.

Like kvpress's presses: each strategy is a dataclass with ``select(context) -> positions``; a
new rule is one file, and the evaluation loops over ``STRATEGIES``.
"""

from codekv.selection.anchors import AnchorSelection, HybridSelection
from codekv.selection.base import (
    SelectionContext,
    Segment,
    Strategy,
    TokenAnchor,
)
from codekv.selection.simple import (
    AllSelection,
    BoundarySelection,
    NoneNoRopeSelection,
    NoneSelection,
)
from codekv.selection.deviation import DeviationSelection

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls
    for cls in (
        NoneSelection,
        NoneNoRopeSelection,
        BoundarySelection,
        DeviationSelection,
        AnchorSelection,
        HybridSelection,
        AllSelection,
    )
}


def strategy(name: str) -> Strategy:
    try:
        return STRATEGIES[name]()
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}") from None


__all__ = [
    "STRATEGIES",
    "SelectionContext",
    "Segment",
    "Strategy",
    "TokenAnchor",
    "strategy",
]
