"""Composer on tiny random-weight models: exactness, cache reuse and isolation, statuses.

``strategy="all"`` recomputes every chunk token, so its result must equal a full prefill of the
same tokens (``Composer.full_prefill``) whatever the chunk order, repeats, cache state or store
damage; the other strategies only have to run and report honestly.
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path

import pytest
import torch
from fixtures.compose import (
    B2,
    PREFIX,
    QUERY,
    TOL,
    A,
    B,
    C,
    assert_exact,
    make_composer,
    max_diff,
)
from fixtures.evidence import covering
from fixtures.models import TINY_FAMILIES

from codekv.compose import COMPOSED, EXACT_PREFIX, FULL_PREFILL, Composer, Passage
from codekv.conditioning import CONDITIONINGS
from codekv.gate import SupportGate
from codekv.index import Index
from codekv.selection import STRATEGIES, Segment, SelectionContext, TokenAnchor
from codekv.selection import strategy as make_strategy
from codekv.stores import default_scope
from codekv.stores.local import LocalKVStore
from codekv.tokens import CounterSpec


def entry_files(root: Path) -> list[Path]:
    return sorted((root / "kv").rglob("*.safetensors"))


def store_tensors(composer: Composer) -> dict[str, list[torch.Tensor]]:
    from safetensors.torch import load_file

    out = {}
    for path in sorted(Path(composer.store.root).rglob("*.safetensors")):
        out[path.name] = [t.clone() for _, t in sorted(load_file(path).items())]
    return out


@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_all_equals_full_prefill(tiny_backend, tmp_path, family):
    composer = make_composer(tiny_backend(family), tmp_path)
    chunks = [A, B, C]
    for attempt in ("cold", "warm"):  # computed chunk KV, then KV read back from the store
        result = composer.compose(chunks, QUERY, prefix=PREFIX, strategy="all")
        assert result.status == COMPOSED
        report = result.report
        assert (report.chunk_hits, report.chunk_misses) == ((0, 3) if attempt == "cold" else (3, 0))
        assert report.exact_prefix_hit == (attempt == "warm")
        assert report.reused_tokens == 0
        assert report.recomputed_tokens == report.context_tokens - report.prefix_tokens
        assert report.recompute_ratio == 1.0
        # every context row but the prefix's: a row at p attends to p + 1 keys
        n, p = report.context_tokens, report.prefix_tokens
        assert report.recompute_attention == pytest.approx(1 - p * (p + 1) / (n * (n + 1)))
        assert_exact(result, composer.full_prefill(chunks, QUERY, prefix=PREFIX))


@pytest.mark.parametrize("family", ["llama", "phi"])
def test_one_chunk_at_offset_zero_with_none_is_exact(tiny_backend, tmp_path, family):
    composer = make_composer(tiny_backend(family), tmp_path)
    result = composer.compose([C], QUERY, strategy="none")
    assert result.status == COMPOSED and result.report.recomputed_tokens == 0
    assert result.report.recompute_attention == 0
    assert result.report.reused_tokens == result.report.context_tokens
    assert_exact(result, composer.full_prefill([C], QUERY))


def test_naive_composition_differs_from_full_prefill(tiny_backend, tmp_path):
    """The checks above can fail: reused KV of a chunk that follows another is not exact."""
    composer = make_composer(tiny_backend("llama"), tmp_path)
    result = composer.compose([A, B], QUERY, strategy="none")
    reference = composer.full_prefill([A, B], QUERY)
    assert max_diff(result.next_token_logits(), reference.next_token_logits()) > 1e-2


@pytest.mark.parametrize("family", ["qwen3", "gemma3_text"])
def test_every_order_of_three_chunks_is_exact(tiny_backend, tmp_path, family):
    composer = make_composer(tiny_backend(family), tmp_path)
    for order in itertools.permutations([A, B, C]):
        result = composer.compose(list(order), QUERY, strategy="all")
        assert_exact(result, composer.full_prefill(list(order), QUERY))
    assert composer.store.stats().entries == 3  # each chunk stored once, whatever its position


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_strategy_runs_within_its_budget(tiny_backend, tmp_path, strategy):
    composer = make_composer(tiny_backend("llama"), tmp_path)
    result = composer.compose([A, B, C], QUERY, prefix=PREFIX, strategy=strategy, ratio=0.2)
    report = result.report
    assert result.status == COMPOSED and report.fallback_reason is None
    chunk_tokens = report.context_tokens - report.prefix_tokens
    assert report.reused_tokens + report.recomputed_tokens == chunk_tokens
    if strategy == "all":
        assert report.recomputed_tokens == chunk_tokens
    else:
        assert report.recomputed_tokens <= round(0.2 * chunk_tokens)
    if strategy in ("none", "none-norope"):
        assert report.recomputed_tokens == 0
    if strategy in ("boundary", "deviation", "hybrid", "random"):
        assert report.recomputed_tokens > 0
    assert len(result.token_ids) == report.total_tokens
    assert result.next_token_logits().shape == (320,)


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_the_same_chunk_twice_in_one_request(tiny_backend, tmp_path, strategy, family):
    composer = make_composer(tiny_backend(family), tmp_path)
    result = composer.compose([A, B, A], QUERY, strategy=strategy)
    assert result.status == COMPOSED
    assert (result.report.chunk_misses, result.report.chunk_hits) == (2, 1)
    if strategy == "all":
        assert_exact(result, composer.full_prefill([A, B, A], QUERY))


@pytest.mark.parametrize("family", ["mistral", "gemma3_text"])
def test_a_changed_neighbour_reuses_the_chunk_and_stays_exact(tiny_backend, tmp_path, family):
    composer = make_composer(tiny_backend(family), tmp_path)
    first = composer.compose([B, A], QUERY, strategy="all")
    assert (first.report.chunk_hits, first.report.chunk_misses) == (0, 2)
    second = composer.compose([B2, A], QUERY, strategy="all")
    assert (second.report.chunk_hits, second.report.chunk_misses) == (1, 1)
    assert_exact(second, composer.full_prefill([B2, A], QUERY))
    assert max_diff(first.next_token_logits(), second.next_token_logits()) > TOL


def test_positions_up_to_the_model_limit(tiny_backend, tmp_path):
    backend = tiny_backend("llama")
    composer = make_composer(backend, tmp_path)
    limit = backend.info.max_positions
    chunk_ids = len(composer._piece(A).ids)
    query_ids = len(backend.tokenize(QUERY))
    # Fill the context with repeats of A and pad the prefix so the request is exactly ``limit``.
    repeats = (limit - query_ids - 8) // chunk_ids
    pad = limit - query_ids - repeats * chunk_ids
    prefix = "x" * pad
    assert len(backend.tokenize(prefix)) == pad  # one token per 'x' in this tokenizer
    result = composer.compose([A] * repeats, QUERY, prefix=prefix, strategy="all")
    assert result.report.total_tokens == limit
    assert_exact(result, composer.full_prefill([A] * repeats, QUERY, prefix=prefix))
    assert result.generate(5) == ""  # no position left to generate into
    with pytest.raises(ValueError, match=f"exceeds the model's {limit} positions"):
        composer.compose([A] * repeats, QUERY, prefix=prefix + "x", strategy="all")
    with pytest.raises(ValueError, match=r"\+1 to generate"):
        composer.compose([A] * repeats, QUERY, prefix=prefix, max_new_tokens=1)


@pytest.mark.parametrize("change", [{"seed": 1}, {"dtype": "float64"}, {"tokenizer": 1}])
def test_a_changed_model_never_reuses_entries(tiny_backend, tmp_path, change):
    old = make_composer(tiny_backend("llama"), tmp_path)
    old.compose([A, B], QUERY, strategy="all")
    assert old.compose([A, B], QUERY, strategy="all").report.chunk_hits == 2  # control
    new = make_composer(tiny_backend("llama", **change), tmp_path)
    assert new.scope == old.scope and new.store.root == old.store.root
    assert new.chunks.key(new._piece(A), []) != old.chunks.key(old._piece(A), [])
    result = new.compose([A, B], QUERY, strategy="all")
    assert (result.report.chunk_hits, result.report.chunk_misses) == (0, 2)
    assert len(entry_files(tmp_path)) == 4  # new entries beside the old ones
    assert_exact(result, new.full_prefill([A, B], QUERY))


@pytest.mark.parametrize("where", ["header", "tensor data", "truncated"])
def test_corrupt_entries_are_recomputed(tiny_backend, tmp_path, where):
    composer = make_composer(tiny_backend("llama"), tmp_path)
    composer.compose([A, B], QUERY, strategy="all")
    for path in entry_files(tmp_path):
        data = bytearray(path.read_bytes())
        if where == "truncated":
            data = data[: len(data) // 2]
        else:
            at = 20 if where == "header" else len(data) - 5
            data[at] ^= 0xFF
        path.write_bytes(bytes(data))
    result = composer.compose([A, B], QUERY, strategy="all")
    assert (result.report.chunk_hits, result.report.chunk_misses) == (0, 2)
    assert composer.store.stats().corrupt == 2
    assert_exact(result, composer.full_prefill([A, B], QUERY))
    # The recomputed entries replaced the damaged files.
    assert composer.compose([A, B], QUERY, strategy="all").report.chunk_hits == 2


def test_scopes_sharing_a_store_never_see_each_other(tiny_backend, tmp_path):
    backend = tiny_backend("llama")
    one = make_composer(backend, tmp_path, scope="repo:one")
    two = make_composer(backend, tmp_path, scope="repo:two")
    one.compose([A, B], QUERY, strategy="all")
    result = two.compose([A, B], QUERY, strategy="all")
    assert (result.report.chunk_hits, result.report.chunk_misses) == (0, 2)
    assert two.prefill([A, B, C]) == (1, 2)  # its own entries only
    assert one.prefill([A, B, C]) == (1, 2)
    assert len(entry_files(tmp_path)) == 6


def test_unsupported_without_evidence_falls_back_to_full_prefill(tiny_backend, tmp_path):
    backend = tiny_backend("llama")
    gated = make_composer(backend, tmp_path, experimental=False)
    result = gated.compose([A, B], QUERY, prefix=PREFIX, strategy="all")
    assert result.status == FULL_PREFILL
    assert result.report.fallback_reason.startswith("unsupported")
    assert "llama/rag" in result.report.fallback_reason
    assert result.report.recompute_ratio == 1.0 and result.report.chunk_misses == 0
    assert gated.counters.full_prefill == 1 and gated.counters.composed == 0
    assert gated.counters.exact_prefix_misses == gated.counters.exact_prefix_hits == 0
    assert entry_files(tmp_path) == []  # a refused request stores nothing
    assert_exact(result, gated.full_prefill([A, B], QUERY, prefix=PREFIX))
    passed = SupportGate([covering({"family": "llama", "workload": "rag", "passed": True,
                                    "strategy": "boundary", "ratio": 0.15,
                                    "held_out": {"passed": True}}, backend.info.fingerprint)],
                         "test")
    allowed = make_composer(backend, tmp_path, experimental=False, gate=passed)
    assert allowed.compose([A, B], QUERY, strategy="all").status == COMPOSED


def test_auto_composes_with_the_rule_the_support_file_passed(tiny_backend, tmp_path):
    import json

    from codekv.eval.support import support_document, write_json

    support = tmp_path / "support.json"
    model = tiny_backend("llama").info.fingerprint
    write_json(support, support_document([covering(entry, model) for entry in (
        {"family": "llama", "workload": "rag", "passed": True, "strategy": "boundary",
         "ratio": 0.25, "held_out": {"passed": True}},
        {"family": "llama", "workload": "tool-docs", "passed": False, "strategy": None,
         "ratio": None},
    )], "codekv eval ...", {"family": "llama"}, {}))
    assert json.loads(support.read_text())["entries"][0]["strategy"] == "boundary"
    gated = make_composer(tiny_backend("llama"), tmp_path, experimental=False,
                          gate=SupportGate.load(support))
    passages = gated.compose([A, B, C], QUERY)  # strategy="auto" is the default
    assert passages.status == COMPOSED
    assert (passages.report.strategy, passages.report.ratio) == ("boundary", 0.25)
    assert passages.report.recomputed_tokens == round(0.25 * passages.report.context_tokens)
    docs = [Passage(p.text, p.name, kind="tool-doc") for p in (A, B)]
    refused = gated.compose(docs, QUERY)
    assert refused.status == FULL_PREFILL
    assert refused.report.fallback_reason == "unsupported: llama/tool-docs failed its evaluation"
    mixed = gated.compose([A, docs[1]], QUERY)  # one of its workloads has no passing rule
    assert mixed.status == FULL_PREFILL and "tool-docs" in mixed.report.fallback_reason
    with pytest.raises(ValueError, match="takes its ratio from the support file"):
        gated.compose([A, B], QUERY, ratio=0.1)
    experimental = make_composer(tiny_backend("llama"), tmp_path, gate=SupportGate.load(support))
    anyway = experimental.compose(docs, QUERY)
    # No passing rule: the best measured one (query on transformers), not the anchors.
    assert anyway.status == COMPOSED and anyway.report.strategy == "query"
    assert passages.report.conditioning == "prefix"  # the composer's: the entry names none
    graph = make_composer(tiny_backend("llama"), tmp_path, experimental=False,
                          gate=SupportGate([covering({"family": "llama", "workload": "rag",
                                                      "passed": True, "strategy": "boundary",
                                                      "ratio": 0.25, "conditioning": "none",
                                                      "held_out": {"passed": True}}, model)]))
    assert graph.compose([A, B], QUERY, prefix=PREFIX).report.conditioning == "none"
    chosen = graph.compose([A, B], QUERY, prefix=PREFIX, conditioning="prefix")
    assert chosen.report.conditioning == "prefix"  # the caller's choice wins


@pytest.mark.parametrize("case", ["gpt2", "mistral-window"])
def test_unsupported_models_fall_back_even_when_experimental(tiny_backend, tmp_path, case):
    backend = tiny_backend("gpt2") if case == "gpt2" else tiny_backend("mistral", sliding_window=8)
    composer = make_composer(backend, tmp_path, experimental=True)
    result = composer.compose([A, B], QUERY, strategy="all")
    assert result.status == FULL_PREFILL
    assert result.report.fallback_reason == f"unsupported: {backend.info.unsupported}"
    assert composer.counters.fallbacks == {"unsupported": 1}
    assert_exact(result, composer.full_prefill([A, B], QUERY))


def test_statuses_and_counters(tiny_backend, tmp_path):
    composer = make_composer(tiny_backend("llama"), tmp_path)
    counters = composer.counters
    first = composer.compose([], QUERY, prefix=PREFIX)
    assert first.status == EXACT_PREFIX and not first.report.exact_prefix_hit
    assert_exact(first, composer.full_prefill([], QUERY, prefix=PREFIX))
    second = composer.compose([], "Another question?", prefix=PREFIX)
    assert second.status == EXACT_PREFIX and second.report.exact_prefix_hit
    assert (counters.exact_prefix_hits, counters.exact_prefix_misses) == (1, 1)
    assert counters.composed == counters.full_prefill == 0
    # Composed requests count as composed; only their prefix part touches the prefix counters.
    composer.compose([A], QUERY, strategy="boundary")
    assert (counters.exact_prefix_hits, counters.exact_prefix_misses) == (1, 1)
    composed = composer.compose([A], QUERY, prefix=PREFIX, strategy="all")
    assert composed.status == COMPOSED and composed.report.exact_prefix_hit
    assert (counters.exact_prefix_hits, counters.exact_prefix_misses) == (2, 1)
    assert counters.composed == 2 and counters.full_prefill == 0
    assert len(composer.prefix_cache.entries) == 1  # composed states never enter it
    # A prefix shared with a composed request still answers exactly.
    third = composer.compose([], QUERY, prefix=PREFIX)
    assert_exact(third, first)


def test_a_query_alone_is_a_full_prefill(tiny_backend, tmp_path):
    composer = make_composer(tiny_backend("llama"), tmp_path)
    result = composer.compose([], QUERY, strategy="all")
    assert result.status == FULL_PREFILL
    assert result.report.fallback_reason.startswith("no context")
    assert_exact(result, composer.full_prefill([], QUERY))
    assert composer.counters.composed == 0 and composer.counters.full_prefill == 1


def test_store_hits_land_on_the_model_device(tiny_backend, tmp_path, monkeypatch):
    """The store reads CPU tensors; a model on an accelerator needs them on its device."""
    backend = tiny_backend("llama")
    composer = make_composer(backend, tmp_path)
    piece = composer._piece(A)
    composer.chunks.kv(piece, [])
    monkeypatch.setattr(backend, "device", torch.device("meta"))
    kv, hit = composer.chunks.kv(piece, [])
    assert hit and {t.device.type for t in (*kv.keys, *kv.values)} == {"meta"}


def test_cached_entries_are_never_mutated(tiny_backend, tmp_path):
    composer = make_composer(tiny_backend("phi"), tmp_path)
    composer.compose([A, B, C], QUERY, prefix=PREFIX, strategy="all")
    stored = store_tensors(composer)
    prefix_kv = next(iter(composer.prefix_cache.entries.values()))
    prefix_before = [t.clone() for t in (*prefix_kv.keys, *prefix_kv.values)]
    for strategy in sorted(STRATEGIES):
        for chunks in ([A, B, C], [C, A, B], [B, B]):
            result = composer.compose(chunks, QUERY, prefix=PREFIX, strategy=strategy, ratio=0.5)
            result.score("answer")
            result.generate(3)
    after = store_tensors(composer)
    assert after.keys() == stored.keys()
    for name, tensors in stored.items():
        assert all(torch.equal(a, b) for a, b in zip(tensors, after[name], strict=True))
    assert all(torch.equal(a, b) for a, b in
               zip(prefix_before, (*prefix_kv.keys, *prefix_kv.values), strict=True))


def test_score_and_generate_leave_the_result_unchanged(tiny_backend, tmp_path):
    composer = make_composer(tiny_backend("qwen2"), tmp_path)
    result = composer.compose([A, B], QUERY, prefix=PREFIX, strategy="all")
    reference = composer.full_prefill([A, B], QUERY, prefix=PREFIX)
    score = result.score(" width times height")
    assert result.score(" width times height") == pytest.approx(score, abs=1e-6)
    assert score == pytest.approx(reference.score(" width times height"), abs=1e-4)
    text = result.generate(6)
    assert result.generate(6) == text == reference.generate(6)
    assert_exact(result, reference)


def test_an_empty_request_is_refused(tiny_backend, tmp_path):
    composer = make_composer(tiny_backend("llama"), tmp_path)
    with pytest.raises(ValueError, match="empty request"):
        composer.compose([], "")


# -- selection rules on hand-built contexts -------------------------------------------------


def selection_context(budget: int, prefix: int = 0) -> SelectionContext:
    """Two 20-token chunks after ``prefix`` tokens; the second uses a name the first defines."""
    first = Segment(prefix, 20, "c1", [
        TokenAnchor("def", "f", 2, 4),
        TokenAnchor("call", "g", 10, 12),
    ])
    second = Segment(prefix + 20, 20, "c2", [
        TokenAnchor("use", "f", 5, 6, target="c1"),
        TokenAnchor("return", "return_statement", 8, 11),
        TokenAnchor("call", "h", 14, 16),
    ])
    return SelectionContext(prefix + 40, prefix, [first, second], budget)


def test_anchor_selection_order():
    # A quarter of the budget (1) for key anchors: the cross-chunk use (25); the definition
    # it names sits in the exact first chunk. The rest: the second chunk's boundary.
    assert make_strategy("anchors").select(selection_context(6)) == [20, 21, 22, 23, 24, 25]
    # After a prefix the first chunk follows context too: key anchors (3) are the use (30) and
    # the definition it names (7, 8); boundaries alternate between the chunks for the rest.
    chosen = make_strategy("anchors").select(selection_context(12, prefix=5))
    assert chosen == [5, 6, 7, 8, 9, 10, 25, 26, 27, 28, 29, 30]
    # Query-named anchors come first among the key anchors.
    context = selection_context(8, prefix=5)
    context.query_names = frozenset({"h"})
    assert make_strategy("anchors").select(context) == [5, 6, 7, 25, 26, 27, 39, 40]


def test_selection_never_spends_budget_on_the_first_chunk_without_prefix():
    """Tokens of a chunk at position 0 already have exact KV: recomputing them changes nothing."""
    context = selection_context(30)
    for name in ("anchors", "boundary"):
        chosen = make_strategy(name).select(context)
        assert chosen and min(chosen) >= 20, name


def test_the_random_control_spends_its_whole_budget_the_same_way_each_time():
    """The gate's negative control: a random share, the same for the same request's shape (a
    rerun measures the same rule), another for another shape."""
    chosen = make_strategy("random").select(selection_context(7, prefix=3))
    assert len(chosen) == 7 and chosen == make_strategy("random").select(
        selection_context(7, prefix=3))
    assert chosen != make_strategy("random").select(selection_context(7, prefix=4))


def test_selection_stays_in_budget_and_out_of_the_prefix():
    for name in STRATEGIES:
        context = selection_context(7, prefix=3)
        context.deviation = lambda: torch.arange(43, dtype=torch.float32)
        chosen = make_strategy(name).select(context)
        assert chosen == sorted(set(chosen)), name
        assert all(3 <= p < 43 for p in chosen), name
        if name != "all":
            assert len(chosen) <= 7, name
    context = selection_context(7, prefix=3)
    context.deviation = lambda: torch.arange(43, dtype=torch.float32)
    assert make_strategy("deviation").select(context) == list(range(36, 43))


def test_code_chunks_from_an_index(tiny_backend, git_repo, tmp_path):
    git_repo.commit({
        "a.py": "def alpha(x):\n    if x > 1:\n        return x * 2\n    return 0\n",
        "b.py": "from a import alpha\n\n\ndef gamma(y):\n    z = alpha(y)\n    return z + 1\n",
    })
    index = Index(git_repo.root, counter=CounterSpec("bytes"))
    index.update()
    backend = tiny_backend("llama")
    composer = Composer(backend, index=index, store=LocalKVStore(tmp_path / "kv"),
                        gate=SupportGate([], "test"), experimental=True)
    assert composer.scope == default_scope(index)
    alpha, gamma = composer.build_request(["a.py::alpha", "b.py::gamma"]).pieces
    use = next(a for a in gamma.anchors if a.kind == "use")
    assert use.target == alpha.chunk_id
    assert backend.detokenize(gamma.ids[use.start : use.end]) == "alpha"
    chunks = ["a.py::alpha", "b.py::gamma"]
    result = composer.compose(chunks, "What does gamma return?", strategy="all")
    assert_exact(result, composer.full_prefill(chunks, "What does gamma return?"))
    anchored = composer.compose(chunks, "What does gamma return?", strategy="anchors", ratio=0.3)
    assert anchored.status == COMPOSED and anchored.report.chunk_hits == 2
    assert 0 < anchored.report.recomputed_tokens <= round(0.3 * anchored.report.context_tokens)


def graph_composer(backend, git_repo, tmp_path, conditioning="graph", **options):
    """An index where b.py::gamma uses a.py::alpha, and c.py::big is too long to condition on."""
    git_repo.commit({
        "a.py": "def alpha(x):\n    if x > 1:\n        return x * 2\n    return 0\n",
        "b.py": "from a import alpha\n\n\ndef gamma(y):\n    z = alpha(y)\n    return z + 1\n",
    })
    index = Index(git_repo.root, counter=CounterSpec("bytes"))
    index.update()
    return Composer(backend, index=index, store=LocalKVStore(tmp_path / "kv"),
                    gate=SupportGate([], "test"), experimental=True, conditioning=conditioning,
                    **options)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_graph_conditioning_computes_a_chunk_after_what_it_uses(tiny_backend, git_repo,
                                                               tmp_path, family):
    """Under graph conditioning gamma's KV is computed after the prefix and alpha, so a request
    laid out exactly that way needs no recompute to equal full prefill; prefix conditioning
    (gamma after the prefix alone) does not."""
    composer = graph_composer(tiny_backend(family), git_repo, tmp_path)
    chunks, query = ["a.py::alpha", "b.py::gamma"], "What does gamma return?"
    reference = composer.full_prefill(chunks, query, prefix=PREFIX)
    graph = composer.compose(chunks, query, prefix=PREFIX, strategy="none")
    assert graph.status == COMPOSED and graph.report.conditioning == "graph"
    assert graph.report.recomputed_tokens == 0
    assert_exact(graph, reference)
    prefix = composer.compose(chunks, query, prefix=PREFIX, strategy="none",
                              conditioning="prefix")
    assert prefix.report.chunk_misses == 1  # gamma after the prefix alone: its own entry
    assert max_diff(prefix.next_token_logits(), reference.next_token_logits()) > TOL
    # alpha uses nothing in the repository: its entry is the same under both
    assert composer.store.stats().entries == 3
    for order in (chunks, chunks[::-1]):  # and `all` stays exact in any order
        assert_exact(composer.compose(order, query, prefix=PREFIX, strategy="all"),
                     composer.full_prefill(order, query, prefix=PREFIX))


@pytest.mark.parametrize("conditioning", CONDITIONINGS)
def test_all_is_exact_under_every_conditioning(tiny_backend, git_repo, tmp_path, conditioning):
    composer = graph_composer(tiny_backend("llama"), git_repo, tmp_path, conditioning)
    for prefix in (PREFIX, None):
        chunks = ["b.py::gamma", A, "a.py::alpha"]
        result = composer.compose(chunks, QUERY, prefix=prefix, strategy="all")
        assert result.report.conditioning == conditioning
        assert_exact(result, composer.full_prefill(chunks, QUERY, prefix=prefix))


def test_graph_conditioning_is_keyed_by_the_neighbours(tiny_backend, git_repo, tmp_path):
    """Editing a definition retires the entries of the chunks conditioned on it; a neighbour
    beyond the token budget is left out."""
    composer = graph_composer(tiny_backend("llama"), git_repo, tmp_path)
    assert composer.prefill(["b.py::gamma"], PREFIX) == (1, 0)
    assert composer.prefill(["b.py::gamma"], PREFIX) == (0, 1)
    git_repo.commit({"a.py": "def alpha(x):\n    return -x\n"})  # gamma's text is unchanged
    composer.index.update()
    assert composer.prefill(["b.py::gamma"], PREFIX) == (1, 0)
    tight = graph_composer(composer.backend, git_repo, tmp_path / "tight", graph_tokens=4)
    gamma = tight.build_request(["b.py::gamma"], prefix=PREFIX).pieces[0]
    prefix_ids = tight.backend.tokenize(PREFIX)
    assert tight._after(gamma, prefix_ids, "graph") == prefix_ids  # alpha does not fit in 4
    assert len(composer._after(gamma, prefix_ids, "graph")) > len(prefix_ids)
    with pytest.raises(ValueError, match="unknown conditioning"):
        composer.compose(["b.py::gamma"], "q", strategy="none", conditioning="neighbours")


def test_a_request_is_the_token_sequence_full_prefill_runs(tiny_backend, tmp_path):
    composer = make_composer(tiny_backend("llama"), tmp_path)
    request = composer.build_request([A, B], QUERY, prefix=PREFIX)
    tokenize = composer.backend.tokenize
    assert request.prefix_ids == tokenize(PREFIX) and request.query_ids == tokenize(QUERY)
    assert [p.kind for p in request.pieces] == ["passage", "passage"]
    assert request.pieces[0].ids == tokenize(A.text + "\n")  # a passage ends in a blank line
    assert request.pieces[0].identity != request.pieces[1].identity
    assert request.token_ids == composer.full_prefill([A, B], QUERY, prefix=PREFIX).token_ids
    assert composer.build_request([B]).token_ids == request.pieces[1].ids  # no query, no prefix


@pytest.mark.parametrize("family", ["llama", "phi"])
def test_chunks_after_a_prefix_are_prefilled_after_it(tiny_backend, tmp_path, family):
    """With a prefix, a chunk's KV is computed right after it: one chunk then needs no
    recompute at all (it is exactly full prefill's), and each prefix has its own entries."""
    composer = make_composer(tiny_backend(family), tmp_path)
    for prefix in (PREFIX, "Another system prompt.\n"):
        result = composer.compose([A], QUERY, prefix=prefix, strategy="none")
        assert result.status == COMPOSED and result.report.recomputed_tokens == 0
        assert_exact(result, composer.full_prefill([A], QUERY, prefix=prefix))
    assert len(entry_files(tmp_path)) == 2  # A after each prefix; the prefixes' KV is not stored
    composer.compose([A], QUERY, strategy="none")  # no prefix: A from position 0, a third entry
    assert len(entry_files(tmp_path)) == 3
    assert composer.prefill([A, B], prefix=PREFIX) == (1, 1)  # A after PREFIX is there already
    shared = make_composer(composer.backend, tmp_path / "shared")
    shared.conditioning = "none"  # one entry per chunk whatever the prefix: not exact
    result = shared.compose([A], QUERY, prefix=PREFIX, strategy="none")
    assert max_diff(result.next_token_logits(),
                    shared.full_prefill([A], QUERY, prefix=PREFIX).next_token_logits()) > TOL
    shared.compose([A], QUERY, prefix="Another system prompt.\n", strategy="none")
    assert len(entry_files(tmp_path / "shared")) == 1


def test_a_full_prefill_reports_no_rule_and_generation_is_a_count(tiny_backend, tmp_path):
    """A fallback, and the reference full prefill, ran no rule: their reports name none (not
    the rule ``auto`` would have used). A negative number of tokens to generate is refused."""
    gated = make_composer(tiny_backend("llama"), tmp_path, experimental=False)
    for result in (gated.compose([A, B], QUERY), gated.compose([A, B], QUERY, strategy="query",
                                                               ratio=0.3),
                   gated.full_prefill([A, B], QUERY)):
        report = result.report
        assert report.status == FULL_PREFILL
        assert (report.strategy, report.ratio, report.conditioning) == (None, None, None)
    composed = make_composer(tiny_backend("llama"), tmp_path).compose([A, B], QUERY,
                                                                       strategy="query", ratio=0.3)
    assert (composed.report.strategy, composed.report.ratio) == ("query", 0.3)
    with pytest.raises(ValueError, match="max_new_tokens must be a count of tokens from 0, not -5"):
        gated.compose([A, B], QUERY, max_new_tokens=-5)


# -- a model whose tokenizer starts every sequence with a BOS (Gemma's <bos>) ----------------


def bos_backend():
    """The tiny Llama with a tokenizer that puts ``<bos>`` first, as Gemma's does."""
    from fixtures.models import tiny_model, tiny_tokenizer
    from tokenizers import processors

    from codekv.backends.hf import HFBackend

    tokenizer = copy.deepcopy(tiny_tokenizer())  # not the shared one every other test reads
    tokenizer.add_special_tokens({"bos_token": "<bos>"})
    bos = tokenizer.bos_token_id
    tokenizer._tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", bos)])
    return HFBackend(tiny_model("llama"), tokenizer), bos


def test_requests_start_with_the_models_bos_and_chunks_are_computed_after_it(tmp_path):
    backend, bos = bos_backend()
    assert backend.leading_ids == [bos] and bos not in backend.tokenize(A.text)
    composer = make_composer(backend, tmp_path)
    body = backend.tokenize(C.text + "\n") + backend.tokenize(QUERY)
    for conditioning in ("none", "prefix"):
        # One chunk right after the BOS, nothing recomputed: exact only if its KV was
        # computed after the BOS (alone at 0, re-positioned to 1, it is not).
        result = composer.compose([C], QUERY, strategy="none", conditioning=conditioning)
        assert result.status == COMPOSED and result.report.recomputed_tokens == 0
        assert result.token_ids == [bos] + body
        reference = backend.full_prefill([bos] + body)
        assert max_diff(result.next_token_logits(), reference.logits) <= TOL
    # With a system prompt and every token recomputed: full prefill's, BOS first.
    result = composer.compose([A, B, C], QUERY, prefix=PREFIX, strategy="all")
    reference = composer.full_prefill([A, B, C], QUERY, prefix=PREFIX)
    assert reference.token_ids[0] == bos and reference.token_ids.count(bos) == 1
    assert_exact(result, reference)
    # A query alone is still that: nothing to reuse after the BOS.
    alone = composer.compose([], QUERY, strategy="all")
    assert alone.status == FULL_PREFILL and alone.token_ids == [bos] + backend.tokenize(QUERY)


def test_a_model_without_a_bos_is_as_before(tiny_backend, tmp_path):
    backend = tiny_backend("llama")
    assert backend.leading_ids == []
    result = make_composer(backend, tmp_path).compose([C], QUERY, strategy="none")
    assert result.token_ids == backend.tokenize(C.text + "\n") + backend.tokenize(QUERY)


def test_the_server_composes_a_request_as_the_composer_does(tiny_backend, tmp_path):
    """One composition path: the server's pipeline, given the Composer's request as a prompt
    (its prefix kept by an earlier prompt, its chunks as the prompt's segments, the store
    holding their KV), builds the very same KV, logits and counts."""
    from codekv.serve import segments as seg
    from codekv.serve.engine import Engine, Outcome

    backend = tiny_backend("llama")
    composer = make_composer(backend, tmp_path, scope="agent")
    rule = {"strategy": "query", "ratio": 0.3}
    composer.compose([A, B, C], QUERY, prefix=PREFIX, **rule)  # the store now holds the chunks
    result = composer.compose([A, B, C], QUERY, prefix=PREFIX, **rule)
    assert result.status == COMPOSED and result.report.store_hits == 3
    request = composer.build_request([A, B, C], QUERY, PREFIX)
    ids, n = request.token_ids, len(request.prefix_ids)
    segments, start = [], n
    for piece in request.pieces:
        segments.append(seg.Segment(start, start + len(piece.ids), piece.kind, piece.identity))
        start += len(piece.ids)
    engine = Engine(backend, composer.store, composer.gate, experimental=True,
                    min_segment_tokens=1, **rule)
    try:
        prefix_kv = backend.prefill_chunk(request.prefix_ids)  # what an earlier prompt left
        engine.prefix.put("agent", request.prefix_ids, prefix_kv, prefix_kv.nbytes())
        outcome = Outcome(prompt_tokens=len(ids))
        state, pending = engine._prefill("agent", ids, segments, n, outcome)
    finally:
        engine.close()
    report = result.report
    assert (outcome.status, outcome.segments_reused, pending) == (COMPOSED, 3, [])
    assert (outcome.strategy, outcome.ratio) == (report.strategy, report.ratio)
    assert (outcome.exact_prefix_tokens, outcome.recomputed_tokens, outcome.reused_tokens) == (
        report.prefix_tokens, report.recomputed_tokens, report.reused_tokens)
    assert 0 < report.recomputed_tokens < report.context_tokens - n
    served, composed = backend.state_kv(state, len(ids)), backend.state_kv(result.state, len(ids))
    for ours, theirs in zip(served.keys + served.values, composed.keys + composed.values,
                            strict=True):
        assert torch.equal(ours, theirs)
    assert torch.equal(state.logits, result.next_token_logits())
