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


def test_anchors_take_key_anchors_then_boundaries():
    call = TokenAnchor("call", "f", 30, 33)
    context = _context(12, [call])
    # A call nobody asked about is not a key anchor: boundaries take the whole budget.
    assert strategy("anchors").select(context) == list(range(40, 46)) + list(range(80, 86))
    context.query_names = frozenset({"f"})
    chosen = strategy("anchors").select(context)
    assert chosen == [40, 41, 42, 43, 44, 70, 71, 72, 80, 81, 82, 83]


def test_none_and_all():
    assert strategy("none").select(_context(30)) == []
    assert strategy("all").select(_context(30)) == list(range(120))
