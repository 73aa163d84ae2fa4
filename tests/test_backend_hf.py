"""HFBackend exactness on tiny random-weight models: full prefill of the same tokens is the truth.

Exactness does not depend on training, so every family is checked with a 2-layer model built
from its config (tests/fixtures/models.py). Logits of these models are O(1), and the naive baseline
differs from full prefill by > 1e-2, so the 1e-4 tolerance can tell a right answer from a wrong
one.
"""

from __future__ import annotations

import pytest
import torch
from fixtures.compose import composed_context, token_ids
from fixtures.models import TINY_FAMILIES, tiny_model, tiny_tokenizer
from transformers import DynamicCache

from codekv.backends import hf
from codekv.backends.hf import ChunkKV, HFBackend, unsupported_reason

FAMILIES = sorted(TINY_FAMILIES)
TOL = 1e-4


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def assert_same_state(state, reference) -> None:
    """Same tokens, next-token logits and every layer's KV."""
    assert state.token_ids == reference.token_ids
    assert max_diff(state.logits, reference.logits) <= TOL
    for ours, theirs in zip(state.cache.layers, reference.cache.layers, strict=True):
        assert ours.keys.shape == theirs.keys.shape
        assert max_diff(ours.keys, theirs.keys) <= TOL
        assert max_diff(ours.values, theirs.values) <= TOL


def keys_at(backend: HFBackend, ids: list[int], start: int) -> DynamicCache:
    """The chunk's KV computed alone at positions ``start``.. by the model itself (every
    position's: a config's cache would keep only a sliding layer's window)."""
    cache = DynamicCache()
    with torch.inference_mode():
        backend.model(input_ids=torch.tensor([ids]),
                      position_ids=torch.arange(start, start + len(ids))[None],
                      past_key_values=cache, use_cache=True)
    return cache


@pytest.fixture(params=[64, 3], ids=["one-block", "blocks-of-3"])
def block_rows(request, monkeypatch):
    """Row blocks of the ragged attention: one block for these short requests, or many."""
    monkeypatch.setattr(hf, "RAGGED_BLOCK_ROWS", request.param)
    return request.param


@pytest.mark.parametrize("family", FAMILIES)
def test_recompute_all_equals_full_prefill(tiny_backend, family, block_rows):
    backend = tiny_backend(family)
    assert backend.info.unsupported is None
    chunks = [token_ids(30, 1), token_ids(45, 2), token_ids(20, 3)]
    query = token_ids(7, 4)
    ids, context = composed_context(backend, chunks)
    state = backend.recompute(ids, context, list(range(len(ids))), query)
    assert_same_state(state, backend.full_prefill(ids + query))


@pytest.mark.parametrize("family", FAMILIES)
def test_single_chunk_at_zero_needs_no_recompute(tiny_backend, family):
    backend = tiny_backend(family)
    chunk, query = token_ids(40, 5), token_ids(6, 6)
    state = backend.recompute(chunk, backend.prefill_chunk(chunk), [], query)
    assert_same_state(state, backend.full_prefill(chunk + query))
    # Without a query the last context token is recomputed for the next-token logits.
    state = backend.recompute(chunk, backend.prefill_chunk(chunk), [], [])
    assert_same_state(state, backend.full_prefill(chunk))


@pytest.mark.parametrize("family", FAMILIES)
def test_reposition_is_exact_in_every_layer(tiny_backend, family):
    backend = tiny_backend(family)
    ids = token_ids(24, 7)
    kv = backend.prefill_chunk(ids)
    for start in (1, 37, 200):
        moved = backend.reposition(kv, start)
        truth = keys_at(backend, ids, start)
        assert moved.start == start
        for layer, expected in enumerate(truth.layers):
            assert max_diff(moved.keys[layer], expected.keys[0]) <= TOL
            assert torch.equal(moved.values[layer], kv.values[layer])  # values never move
        # Moving again (and back) composes: start -> 5 equals 0 -> 5.
        back = backend.reposition(moved, 5)
        for layer, expected in enumerate(keys_at(backend, ids, 5).layers):
            assert max_diff(back.keys[layer], expected.keys[0]) <= TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_reposition_matches_keys_after_filler(tiny_backend, family):
    """Layer-0 keys depend only on the token and its position: compare with a real prefix."""
    backend = tiny_backend(family)
    filler, ids = token_ids(13, 8), token_ids(10, 9)
    prefixed = backend.prefill_chunk(filler + ids)
    moved = backend.reposition(backend.prefill_chunk(ids), len(filler))
    assert max_diff(moved.keys[0], prefixed.keys[0][:, len(filler):]) <= TOL


def test_naive_concatenation_is_not_exact(tiny_backend):
    """The tolerance discriminates: reusing KV computed without the preceding chunk is off."""
    backend = tiny_backend("llama")
    chunks, query = [token_ids(30, 1), token_ids(30, 2)], token_ids(5, 3)
    ids, context = composed_context(backend, chunks)
    full = backend.full_prefill(ids + query)
    assert max_diff(backend.recompute(ids, context, [], query).logits, full.logits) > 1e-2
    boundary = backend.recompute(ids, context, list(range(30, 40)), query)
    assert max_diff(boundary.logits, full.logits) > TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_partial_recompute_over_exact_kv_is_exact(tiny_backend, family, block_rows):
    """Recomputing any subset over already-exact KV must give full prefill back.

    Checks the 4-D mask: each selected row sees exactly one copy of every earlier position
    (the fresh one when it is selected, else the cached one) and nothing later.
    """
    backend = tiny_backend(family)
    ids, query = token_ids(50, 10), token_ids(5, 11)
    exact = backend.full_prefill(ids)
    context = ChunkKV([layer.keys[0] for layer in exact.cache.layers],
                      [layer.values[0] for layer in exact.cache.layers])
    full = backend.full_prefill(ids + query)
    for selected in ([0], [3, 4, 17, 49], list(range(10, 30, 3)), [49], []):
        assert_same_state(backend.recompute(ids, context, selected, query), full)
    assert_same_state(backend.recompute(ids, context, [7, 20], []), exact)


@pytest.mark.parametrize("family", FAMILIES)
def test_placeholders_for_recomputed_positions_are_never_read(tiny_backend, family):
    """Positions the request recomputes may hold zeros (``placeholder``) instead of KV
    computed alone: each layer writes their fresh KV before any row reads them."""
    backend = tiny_backend(family)
    ids, query = token_ids(50, 10), token_ids(5, 11)
    exact = backend.full_prefill(ids)
    whole = ChunkKV([layer.keys[0] for layer in exact.cache.layers],
                    [layer.values[0] for layer in exact.cache.layers])
    blank = backend.placeholder(ids[12:30], 12)
    assert blank.start == 12 and blank.n_tokens == 18
    assert all(not k.any() for k in blank.keys + blank.values)
    context = backend.concat([backend.head(whole, 12), blank,
                              ChunkKV([k[:, 30:] for k in whole.keys],
                                      [v[:, 30:] for v in whole.values], 30)])
    full = backend.full_prefill(ids + query)
    for selected in (list(range(12, 30)), [3, *range(12, 30), 41]):
        assert_same_state(backend.recompute(ids, context, selected, query), full)
    # Not selected, a placeholder is read, and the state is wrong: the check can fail.
    assert max_diff(backend.recompute(ids, context, [], query).logits, full.logits) > TOL


def test_a_sliding_layer_sees_only_its_window_of_reused_kv(tiny_backend):
    """Past a window, reused KV no longer reaches a sliding layer: garbage there leaves the
    result exact, garbage one position later (inside the window) does not."""
    backend = tiny_backend("gemma3_text")
    window = backend.config.sliding_window
    ids, query = token_ids(60, 12), token_ids(5, 13)
    exact = backend.full_prefill(ids)
    full = backend.full_prefill(ids + query)
    sliding = [i for i, t in enumerate(backend.config.layer_types) if t == "sliding_attention"]

    def with_garbage(end: int) -> ChunkKV:
        """Exact KV, but the sliding layers' positions before ``end`` are noise."""
        keys = [layer.keys[0].clone() for layer in exact.cache.layers]
        values = [layer.values[0].clone() for layer in exact.cache.layers]
        for layer in sliding:
            keys[layer][:, :end] = torch.randn_like(keys[layer][:, :end]) * 10
            values[layer][:, :end] = torch.randn_like(values[layer][:, :end]) * 10
        return ChunkKV(keys, values)

    # The first query row (position 60) sees keys 60 - window + 1 .. 60 in a sliding layer.
    outside = 60 - window + 1
    state = backend.recompute(ids, with_garbage(outside), [], query)
    assert max_diff(state.logits, full.logits) <= TOL
    assert max_diff(backend.recompute(ids, with_garbage(outside + 1), [], query).logits,
                    full.logits) > TOL


@pytest.mark.parametrize("family", ["llama", "qwen3", "phi", "gemma3_text"])
def test_ragged_blocks_match_one_dense_pass(tiny_backend, family, monkeypatch):
    """Blocked attention skips only masked scores: any block size gives the dense result."""
    backend = tiny_backend(family)
    ids, context = composed_context(backend, [token_ids(30, 1), token_ids(25, 2),
                                              token_ids(35, 3)])
    query, selected = token_ids(6, 4), [0, 1, 30, 31, 32, 44, 55, 56, 70, 89]
    monkeypatch.setattr(backend.model.config, "_attn_implementation", "eager")
    dense = backend.recompute(ids, context, selected, query)  # eager: one pass, no blocks
    monkeypatch.setattr(backend.model.config, "_attn_implementation", "sdpa")
    for rows in (1, 4, 7, 1000):
        monkeypatch.setattr(hf, "RAGGED_BLOCK_ROWS", rows)
        assert_same_state(backend.recompute(ids, context, selected, query), dense)
        assert backend.model.config._attn_implementation == "sdpa"  # restored


def test_recompute_leaves_its_inputs_alone(tiny_backend):
    backend = tiny_backend("qwen3")
    chunks, query = [token_ids(20, 1), token_ids(20, 2)], token_ids(4, 3)
    ids, context = composed_context(backend, chunks)
    before = [t.clone() for t in (*context.keys, *context.values)]
    state = backend.recompute(ids, context, [20, 21, 22, 39], query)
    assert all(torch.equal(a, b) for a, b in zip(before, (*context.keys, *context.values)))
    # Selected slots were replaced by fresh KV, the others are the reused ones.
    keys = state.cache.layers[1].keys[0]
    assert torch.equal(keys[:, :20], context.keys[1][:, :20])
    assert max_diff(keys[:, 20], context.keys[1][:, 20]) > TOL
    assert state.length == 44


def test_recompute_rejects_mismatched_context(tiny_backend):
    backend = tiny_backend("llama")
    kv = backend.prefill_chunk(token_ids(10))
    with pytest.raises(ValueError, match="context KV has 10 tokens"):
        backend.recompute(token_ids(11), kv, [], [1])


@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
def test_score_and_generate_leave_the_state_unchanged(tiny_backend, family):
    backend = tiny_backend(family)
    chunks, query = [token_ids(20, 1), token_ids(20, 2)], token_ids(4, 3)
    ids, context = composed_context(backend, chunks)
    state = backend.recompute(ids, context, list(range(40)), query)
    full = backend.full_prefill(ids + query)
    target = token_ids(6, 12)
    first = backend.score(state, target)
    assert backend.score(state, target) == pytest.approx(first, abs=1e-6)
    assert first == pytest.approx(backend.score(full, target), abs=1e-4)
    generated = backend.generate(state, 8)
    assert len(generated) == 8
    assert backend.generate(state, 8) == generated
    assert generated == backend.generate(full, 8)
    assert_same_state(state, full)
    # Mean NLL by hand: extend full prefill token by token.
    nll, reference = 0.0, backend.full_prefill(ids + query)
    for token in target:
        nll -= torch.log_softmax(reference.logits, -1)[token].item()
        reference = backend.full_prefill(reference.token_ids + [token])
    assert first == pytest.approx(nll / len(target), abs=1e-4)


def pruned_state(backend, context: list[int], query: list[int], keep: list[list[int]]):
    """Context KV pruned to ``keep[layer]`` positions (KV pruning), then the query appended."""
    full = backend.full_prefill(context)
    cache = DynamicCache(config=backend.config)
    for layer, positions in enumerate(keep):
        index = torch.tensor(positions)
        cache.update(full.cache.layers[layer].keys[:, :, index],
                     full.cache.layers[layer].values[:, :, index], layer)
    state = hf.HFRequest(cache, list(context), full.logits)
    backend.extend(state, query)
    return state


def test_scoring_a_pruned_state_leaves_it_unchanged(tiny_backend):
    """The cache holds fewer entries than the state has tokens: rewinding must drop what was
    appended, not crop to the token count (which would keep it)."""
    backend = tiny_backend("llama")
    context, query, target = token_ids(30, 1), token_ids(4, 3), token_ids(6, 12)
    state = pruned_state(backend, context, query, [list(range(0, 30, 2)), list(range(15, 30))])
    keys = [layer.keys.clone() for layer in state.cache.layers]
    first = backend.score(state, target)
    assert [layer.keys.shape[2] for layer in state.cache.layers] == [15 + 4, 15 + 4]
    assert all(torch.equal(a, layer.keys) for a, layer in zip(keys, state.cache.layers))
    assert state.length == 34
    assert backend.score(state, target) == pytest.approx(first, abs=1e-6)
    generated = backend.generate(state, 5)
    assert backend.generate(state, 5) == generated
    fresh = pruned_state(backend, context, query, [list(range(0, 30, 2)), list(range(15, 30))])
    assert first == pytest.approx(backend.score(fresh, target), abs=1e-6)
    # Pruning changed the answer's NLL: the check above is not full prefill by accident.
    assert abs(first - backend.score(backend.full_prefill(context + query), target)) > 1e-3


def test_generate_stops_at_the_position_limit(tiny_backend):
    backend = tiny_backend("llama")
    state = backend.full_prefill(token_ids(backend.info.max_positions - 3))
    assert len(backend.generate(state, 10)) <= 3
    assert state.length == backend.info.max_positions - 3


def test_kv_deviation_is_zero_where_reuse_is_exact(tiny_backend):
    backend = tiny_backend("llama")
    chunks = [token_ids(15, 1), token_ids(15, 2)]
    ids, context = composed_context(backend, chunks)
    deviation = backend.kv_deviation(ids, context)
    assert deviation.shape == (30,)
    assert deviation[:15].abs().max().item() <= TOL  # the first chunk's KV is exact
    assert deviation[15:].min().item() > TOL  # layer 1 of the second chunk missed chunk one
    assert len(backend.model.base_model.layers) == 2  # the layers are restored


def test_fingerprints_follow_weights_dtype_and_tokenizer(tiny_backend):
    base = tiny_backend("llama").info
    assert tiny_backend("llama").info == base  # deterministic
    assert tiny_backend("llama", seed=1).info.fingerprint != base.fingerprint
    float64 = tiny_backend("llama", dtype="float64").info
    assert float64.fingerprint != base.fingerprint and float64.dtype == "float64"
    other = tiny_backend("llama", tokenizer=1).info
    assert other.fingerprint == base.fingerprint
    assert other.tokenizer_fingerprint != base.tokenizer_fingerprint
    theta = tiny_backend("llama", rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    assert theta.info.fingerprint != base.fingerprint


# -- models composition must refuse -----------------------------------------------------------

REFUSED = {
    "gpt2 absolute positions": ("gpt2", {}, "absolute position embeddings"),
    "dynamic rope": (
        "llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0,
                                      "rope_theta": 10000.0}}, "'dynamic'",
    ),
    "longrope switches factors": (
        "phi3", {"original_max_position_embeddings": 64, "rope_parameters": {
            "rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8,
            "long_factor": [4.0] * 8, "original_max_position_embeddings": 64}}, "'longrope'",
    ),
    "mistral sliding window": ("mistral", {"sliding_window": 16}, "sliding-window"),
    "phi3 sliding window": ("phi3", {"sliding_window": 16}, "sliding-window"),
    "qwen2 sliding layers": (
        "qwen2", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1},
        "sliding-window",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_models_are_refused(tiny_backend, case):
    family, config, reason = REFUSED[case]
    backend = tiny_backend(family, **config)
    assert backend.info.unsupported is not None
    assert reason in backend.info.unsupported
    # Full prefill (the fallback) still works.
    assert backend.full_prefill(token_ids(10)).logits.shape == (320,)


def test_multimodal_model_is_refused():
    from fixtures.models import TINY_CONFIG
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                              num_attention_heads=2, image_size=32, patch_size=8)
    text = LlamaConfig(**TINY_CONFIG, num_key_value_heads=2)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=310)
    torch.manual_seed(0)
    backend = HFBackend(LlavaForConditionalGeneration(config).eval(), tiny_tokenizer())
    assert backend.info.unsupported.startswith("multimodal model (llava)")
    assert backend.info.n_layers == 2 and backend.info.max_positions == 256
    assert backend.full_prefill(token_ids(10)).logits.shape == (320,)


def test_supported_configs_are_not_refused():
    for family in FAMILIES:
        assert unsupported_reason(tiny_model(family).config) is None, family
    yarn = {"rope_type": "yarn", "factor": 2.0, "rope_theta": 10000.0,
            "original_max_position_embeddings": 128}
    assert unsupported_reason(tiny_model("llama", rope_parameters=yarn).config) is None


@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
def test_a_states_prefix_continued_equals_full_prefill(tiny_backend, family):
    """What a server's exact-prefix cache does: a finished request's KV (``state_kv``), cut to
    a common prefix (``head``), then the rest of a new prompt, is full prefill of the new one."""
    backend = tiny_backend(family)
    first, second = token_ids(40, seed=1), token_ids(40, seed=1)[:25] + token_ids(12, seed=2)
    state = backend.full_prefill(first)
    kv = backend.state_kv(state, len(first))
    backend.generate(state, 4)  # the state goes on; the copy does not move
    assert kv.n_tokens == 40 and kv.nbytes() > 0
    context = backend.head(kv, 25)
    continued = backend.recompute(second[:25], context, [], second[25:])
    assert_same_state(continued, backend.full_prefill(second))
    with pytest.raises(ValueError, match="41 tokens"):
        backend.head(kv, 41)


def test_generate_stops_at_the_generation_configs_end_token(tiny_backend):
    """A GGUF converted by transformers names <|im_start|> the tokenizer's end of sequence and
    <|im_end|> the generation config's: a reply stops at either."""
    backend = tiny_backend("llama")
    state = backend.full_prefill(token_ids(12, seed=2))  # six distinct tokens, none an end
    free = backend.generate(state, 6)
    assert len(set(free)) == 6
    config = backend.model.generation_config
    previous, config.eos_token_id = config.eos_token_id, free[3]
    try:
        assert backend.generate(state, 6) == free[:3]
    finally:
        config.eos_token_id = previous


def test_end_tokens_hold_the_tokenizers_and_the_generation_configs(tiny_backend):
    backend = tiny_backend("llama")
    eos = backend.tokenizer.eos_token_id
    assert eos in backend.end_token_ids
    config = backend.model.generation_config
    previous, config.eos_token_id = config.eos_token_id, [7, 9]
    try:
        assert backend.end_token_ids == {eos, 7, 9}
    finally:
        config.eos_token_id = previous  # the backend is shared between tests
