"""Selection strategies on hand-built contexts (no model needed)."""

from codekv.selection import Segment, SelectionContext, TokenAnchor, strategy


def _context(budget, anchors=()):
    segments = [Segment(0, 40, "a"), Segment(40, 40, "b", list(anchors)), Segment(80, 40, "c")]
    return SelectionContext(120, 0, segments, budget)


def test_anchors_spend_the_whole_budget_on_text_without_anchors():
    chosen = strategy("anchors").select(_context(30))
    assert len(chosen) == 30
    # Only chunks with something before them, boundaries first, shared evenly.
    assert chosen == sorted(list(range(40, 55)) + list(range(80, 95)))


def test_anchors_take_boundaries_then_anchor_tokens():
    call = TokenAnchor("call", "f", 30, 33)
    chosen = strategy("anchors").select(_context(12, [call]))
    assert len(chosen) == 12
    assert {70, 71, 72} <= set(chosen)  # the call's tokens, at 40 + 30..33
    assert {40, 41, 42, 80, 81, 82} <= set(chosen)  # boundaries of b and c


def test_none_and_all():
    assert strategy("none").select(_context(30)) == []
    assert strategy("all").select(_context(30)) == list(range(120))
