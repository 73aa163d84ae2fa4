"""Query-aware selection: the probe's attention is the model's own, and the rules use it."""

from __future__ import annotations

import pytest
import torch
from fixtures.compose import QUERY_RULES, composed_context, token_ids
from fixtures.models import TINY_FAMILIES
from transformers import DynamicCache

from codekv.selection import Segment, SelectionContext, TokenAnchor, strategy
from codekv.selection.query import (
    QueryAnchorSelection,
    QueryCostSelection,
    QueryDeepSelection,
    QueryNextSelection,
    QuerySelection,
)


def eager_attention(backend, context, query: list[int]) -> list[torch.Tensor]:
    """The model's own eager attention weights of the query over the reused context (a cache
    that keeps every position: the model's own masks apply any sliding window)."""
    cache = DynamicCache()
    for layer, (k, v) in enumerate(zip(context.keys, context.values)):
        cache.update(k[None].clone(), v[None].clone(), layer)
    config = backend.model.config
    inner = config._attn_implementation
    config._attn_implementation = "eager"
    n = context.n_tokens
    try:
        with torch.inference_mode():
            out = backend.model(input_ids=torch.tensor([query]),
                                position_ids=torch.arange(n, n + len(query))[None],
                                past_key_values=cache, use_cache=True, output_attentions=True)
    finally:
        config._attn_implementation = inner
    return [a[0, :, :, :n].mean(dim=(0, 1)) for a in out.attentions]


@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
@pytest.mark.parametrize("layers", [(0,), (1,), (0, 1)])
def test_relevance_is_the_models_own_attention(tiny_backend, family, layers):
    backend = tiny_backend(family)
    n_layers = len(backend.model.base_model.layers)
    ids, context = composed_context(backend, [token_ids(30, 1), token_ids(25, 2)])
    query = token_ids(6, 9)
    expected = torch.stack([eager_attention(backend, context, query)[i] for i in layers]).mean(0)
    relevance = backend.query_relevance(context, query, layers)
    assert relevance.shape == (len(ids),)
    assert torch.allclose(relevance, expected, atol=1e-5)
    assert backend.model.config._attn_implementation == "sdpa"  # restored
    assert len(backend.model.base_model.layers) == n_layers  # restored


@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_the_probe_does_not_see_hidden_positions(tiny_backend, family):
    """Placeholders (``hidden``) take no attention and change nothing the query sees."""
    backend = tiny_backend(family)
    ids, context = composed_context(backend, [token_ids(30, 1), token_ids(25, 2)])
    query, hidden, layers = token_ids(6, 9), list(range(10, 22)), (0, 1)
    seen = backend.query_relevance(context, query, layers, hidden)
    assert not seen[hidden].any() and seen.sum() > 0
    blank = backend.placeholder(ids[10:22], 10)
    zeroed = backend.concat([backend.head(context, 10), blank, backend.span(context, 22, 55)])
    assert torch.allclose(backend.query_relevance(zeroed, query, layers, hidden), seen,
                          atol=1e-6)
    assert not torch.allclose(backend.query_relevance(context, query, layers), seen, atol=1e-3)


def test_relevance_refuses_bad_input(tiny_backend):
    backend = tiny_backend("llama")
    _, context = composed_context(backend, [token_ids(10, 1)])
    with pytest.raises(ValueError, match="query tokens"):
        backend.query_relevance(context, [], (0,))
    with pytest.raises(ValueError, match="outside"):
        backend.query_relevance(context, [1, 2], (5,))


def selection_context(relevance: torch.Tensor, budget: int, anchors=(), query_names=(),
                      key_cost=0.0):
    segments = [Segment(0, 10, "a"), Segment(10, 10, "b", list(anchors)), Segment(20, 10, "c")]
    return SelectionContext(30, 0, segments, budget, None, frozenset(query_names),
                            lambda: relevance, key_cost)


def test_query_rule_takes_the_floor_then_the_most_attended():
    relevance = torch.zeros(30)
    relevance[[5, 17, 25]] = torch.tensor([0.9, 0.5, 0.7])
    chosen = QuerySelection(floor=2).select(selection_context(relevance, 7))
    # Floors of the chunks after the first (10, 11, 20, 21), then 5, 25, 17 by attention.
    assert chosen == [5, 10, 11, 17, 20, 21, 25]
    assert QuerySelection(floor=2).select(selection_context(relevance, 3)) == [10, 11, 20]
    assert QuerySelection().select(selection_context(relevance, 0)) == []


def test_query_cost_prices_late_rows():
    # Row p costs 1 + 0.1 * (p + 1); rows spread evenly would cost 2.55 each on average.
    relevance = torch.arange(1, 31) * 1e-3
    relevance[[5, 28, 29]] = torch.tensor([0.5, 0.9, 1.0])
    rule = QueryCostSelection(floor=1)
    # Three rows: the floor (10, 20), then 5, whose attention per cost (0.5 / 1.6) beats 29's
    # (1.0 / 4.0); `query` takes 29.
    assert rule.select(selection_context(relevance, 3, key_cost=0.1)) == [5, 10, 20]
    assert QuerySelection(floor=1).select(selection_context(relevance, 3)) == [10, 20, 29]
    # Five rows may cost 12.75: floor 5.2, + 5 (1.6), + 29 (4.0) = 10.8; 28 (3.9) would go
    # over, and of the rows that still fit (p <= 8) 8 has the most attention per cost.
    assert rule.select(selection_context(relevance, 5, key_cost=0.1)) == [5, 8, 10, 20, 29]
    assert rule.select(selection_context(relevance, 0, key_cost=0.1)) == []


def test_query_cost_without_a_key_cost_is_query():
    relevance = torch.rand(30, generator=torch.Generator().manual_seed(0))
    for budget in (1, 5, 12, 30):
        context = selection_context(relevance, budget)
        assert QueryCostSelection().select(context) == QuerySelection().select(context)


@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_key_cost_is_one_keys_flops_over_a_rows_weights(tiny_backend, family):
    backend = tiny_backend(family)
    config = backend.config.get_text_config()
    h, heads = config.hidden_size, config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    d = getattr(config, "head_dim", None) or h // heads
    mlp_matrices = 2 if family in ("gpt_neox", "phi") else 3  # plain or gated MLP
    # q and o projections, k and v, the MLP; norms are not matrices.
    weights = 2 * h * heads * d + 2 * h * kv_heads * d + mlp_matrices * h * config.intermediate_size
    assert backend.info.key_cost == pytest.approx(4 * heads * d / (2 * weights))


def test_query_next_takes_what_follows_each_attended_token_in_its_chunk():
    relevance = torch.zeros(30)
    relevance[[5, 17, 28]] = torch.tensor([0.9, 0.5, 0.7])
    rule = QueryNextSelection(floor=1, span=3)
    # The floor (10, 20); 5 and the three after it; 28 and 29, where its chunk ends; then 17
    # and what follows it while the budget lasts.
    assert rule.select(selection_context(relevance, 10)) == [5, 6, 7, 8, 10, 17, 18, 20, 28, 29]
    assert rule.select(selection_context(relevance, 4)) == [5, 6, 10, 20]
    assert QueryNextSelection(floor=1, span=0).select(selection_context(relevance, 6)) == \
        QuerySelection(floor=1).select(selection_context(relevance, 6))
    assert rule.select(selection_context(relevance, 0)) == []


def test_query_deep_reads_every_layers_attention(tiny_backend, tmp_path, monkeypatch):
    """``query-deep`` ranks by the mean over every layer, ``query`` over the first half."""
    from codekv.compose import Composer, Passage
    from codekv.stores.local import LocalKVStore

    backend = tiny_backend("llama")
    n_layers = len(backend.model.base_model.layers)
    read = []
    probe = backend.query_relevance
    monkeypatch.setattr(backend, "query_relevance",
                        lambda *args: read.append(args[2]) or probe(*args))
    composer = Composer(backend, store=LocalKVStore(tmp_path / "kv"), experimental=True)
    chunks = [Passage("def area(width, height):\n    return width * height\n"),
              Passage("the quick brown fox jumps over the lazy dog\n")]
    for name in ("query", "query-deep"):
        assert composer.compose(chunks, "area(", strategy=name, ratio=0.3).status == "composed"
    assert read == [tuple(range(n_layers // 2)), tuple(range(n_layers))]
    assert QueryDeepSelection.select is QuerySelection.select  # only the probe differs


def test_query_anchors_prefers_anchors_the_query_names():
    relevance = torch.linspace(1.0, 0.0, 30)  # earlier tokens attended more
    anchors = [TokenAnchor("def", "parse", 6, 8)]  # positions 16, 17
    context = selection_context(relevance, 6, anchors, {"parse"})
    chosen = QueryAnchorSelection(floor=1, anchor_share=0.5).select(context)
    assert chosen == [0, 1, 10, 16, 17, 20]
    assert QuerySelection(floor=1).select(context) == [0, 1, 2, 3, 10, 20]


@pytest.mark.parametrize("name", QUERY_RULES)
def test_query_rules_compose_exactly_with_a_full_budget(tiny_backend, tmp_path, name):
    from codekv.compose import Composer, Passage
    from codekv.stores.local import LocalKVStore

    backend = tiny_backend("llama")
    composer = Composer(backend, store=LocalKVStore(tmp_path / "kv"), experimental=True)
    chunks = [Passage("def area(width, height):\n    return width * height\n"),
              Passage("the quick brown fox jumps over the lazy dog\n")]
    full = composer.full_prefill(chunks, "area(")
    result = composer.compose(chunks, "area(", strategy=name, ratio=1.0)
    assert result.status == "composed" and result.report.recompute_ratio == 1.0
    assert "relevance" in result.report.timings
    assert (result.next_token_logits() - full.next_token_logits()).abs().max() < 1e-4
    partial = composer.compose(chunks, "area(", strategy=name, ratio=0.2)
    assert 0 < partial.report.recomputed_tokens <= round(0.2 * partial.report.context_tokens)
    assert strategy(name).name == name
