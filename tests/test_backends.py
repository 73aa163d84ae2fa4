"""The backend protocol: the composer and the evaluation use only what ``Backend`` declares, so
a second engine (llama.cpp, whose KV is an opaque per-sequence state) can implement it. The
contract tests run on every registered engine (``engine_backend``: one per registry entry)."""

from __future__ import annotations

import pytest

from codekv.backends import Backend, rule_refusal
from codekv.compose import COMPOSED, FULL_PREFILL, Composer, Passage
from codekv.eval import runner
from codekv.eval.methods import composition_methods
from codekv.eval.workloads import Task
from codekv.gate import SupportGate
from codekv.selection import STRATEGIES
from codekv.selection import strategy as make_strategy
from codekv.stores.local import LocalKVStore

DECLARED = {name for name in dir(Backend) if not name.startswith("_")} | set(
    Backend.__annotations__
)
A = Passage("def area(width, height):\n    return width * height\n", "area")
B = Passage("The quick brown fox jumps over the lazy dog near the river bank.", "fox")


class DeclaredOnly:
    """A backend seen only through the protocol: anything undeclared is an AttributeError."""

    def __init__(self, backend, **overrides):
        self._backend = backend
        self._overrides = overrides

    def __getattr__(self, name):
        if name not in DECLARED:
            raise AttributeError(f"{name!r} is not declared by the Backend protocol")
        if name in self._overrides:
            return self._overrides[name]
        return getattr(self._backend, name)


def composer(backend, tmp_path) -> Composer:
    return Composer(backend, store=LocalKVStore(tmp_path / "kv"), scope="test",
                    gate=SupportGate([], "test gate"), experimental=True)


def test_the_protocol_declares_what_composition_uses():
    assert {"tokenize_with_offsets", "kv_deviation", "concat", "to_entry", "from_entry",
            "eos_token_id", "deviation_refusal", "kv_bytes", "query_relevance",
            "relevance_refusal", "unshifted_refusal", "batch_floor"} <= DECLARED


def test_each_engine_implements_the_whole_protocol(engine_backend):
    assert {name for name in DECLARED if not hasattr(engine_backend, name)} == set()


def test_composer_and_evaluation_use_only_declared_members(engine_backend, tmp_path):
    backend = DeclaredOnly(engine_backend)
    comp = composer(backend, tmp_path)
    assert comp.prefill([A, B], prefix="System.\n") == (2, 0)
    for name in sorted(STRATEGIES):
        refusal = rule_refusal(backend, make_strategy(name))
        for prefix in (None, "System.\n"):
            result = comp.compose([A, B, A], "What is area?", prefix=prefix, strategy=name,
                                  ratio=0.3)
            if refusal:  # a rule this engine cannot run: refused up front, with the reason
                assert result.status == FULL_PREFILL
                assert result.report.fallback_reason == (
                    f"unsupported: strategy {name}: {refusal}")
            else:
                assert result.status == COMPOSED, result.report.fallback_reason
            result.score("width")
            result.generate(2)
        if not refusal:
            floor = backend.batch_floor(result.state)
            # An engine whose numerics depend on batch shapes decodes the same tokens.
            assert floor is None or floor.token_ids == result.state.token_ids
    task = Task("rag", "t0", "quote", [A, B], "Quote area:", " return width", "area")
    measures = runner.run_task(comp, task, [
        runner.Composition(composition_methods(("none", "boundary"), (0.25,)))])
    assert [m.status for m in measures] == [FULL_PREFILL, COMPOSED, COMPOSED]
    assert measures[0].kv_bytes > 0


@pytest.mark.parametrize(("name", "missing"), [
    ("deviation", "deviation_refusal"), ("hybrid", "deviation_refusal"),
    ("query", "relevance_refusal"), ("query-anchors", "relevance_refusal"),
    ("none-norope", "unshifted_refusal"),
])
def test_a_rule_the_engine_cannot_score_is_refused_not_approximated(tiny_backend, tmp_path,
                                                                     name, missing):
    backend = DeclaredOnly(tiny_backend("llama"), **{missing: "no access to V"})
    comp = composer(backend, tmp_path)
    refused = comp.compose([A, B], "What is area?", strategy=name)
    assert refused.status == FULL_PREFILL
    assert refused.report.fallback_reason == f"unsupported: strategy {name}: no access to V"
    assert comp.compose([A, B], "What is area?", strategy="boundary").status == COMPOSED


def test_a_chunk_computed_against_its_prefixs_kv_is_the_one_computed_after_its_text(
        engine_backend):
    """``prefill_chunk(chunk, prefix, prefix_kv)`` computes only the chunk, against the
    prefix's KV: placed in a request, it predicts what the chunk computed after the prefix's
    text does (the prefix's KV is the same; the chunk's differs only in its batches), and
    nothing else differs than full prefill's own batch split."""
    import torch

    backend = engine_backend
    prefix = backend.tokenize("System: you review code and answer briefly.\n")
    chunk = backend.tokenize(A.text * 3)
    query = backend.tokenize("What does area return?")
    n = len(prefix)
    prefix_kv = backend.prefill_chunk(prefix)
    given = backend.prefill_chunk(chunk, prefix, prefix_kv)
    plain = backend.prefill_chunk(chunk, prefix)
    assert (given.n_tokens, given.start) == (plain.n_tokens, plain.start) == (len(chunk), n)

    def logits(kv):
        return backend.recompute(prefix + chunk, backend.concat([prefix_kv, kv]), [],
                                 query).logits.float()

    full = backend.full_prefill(prefix + chunk + query).logits.float()
    ours, theirs = logits(given), logits(plain)
    reference = (theirs - full).abs().max().item()  # the engine's batch-split floor here
    assert (ours - theirs).abs().max().item() <= max(1e-4, 2 * reference)
    assert (ours - full).abs().max().item() <= max(1e-4, 2 * reference)
    # Another prefix's KV is refused, not used.
    with pytest.raises(ValueError, match="prefix KV"):
        backend.prefill_chunk(chunk, prefix[:-1], prefix_kv)
    assert torch.isfinite(ours).all()
