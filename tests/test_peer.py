"""The kvboost adapter: the request state it builds must be the one kvboost's own generate uses."""

from __future__ import annotations

import pytest
import torch
from fixtures.needs import missing

from codekv.eval import peer
from codekv.eval.methods import PEERS


@pytest.fixture(autouse=True)
def _kvboost():
    if peer.available():
        missing(peer.available())


def token_ids(n: int, seed: int) -> list[int]:
    return torch.randint(1, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture
def runner(tiny_backend):
    # A fresh model object: kvboost swaps the model's head while it runs.
    backend = tiny_backend("llama", seed=3)
    return peer.KVBoostRunner(backend)


def kvboost_first_logits(runner, ids: list[int]) -> torch.Tensor:
    """kvboost's own generate on exactly ``ids`` (its tokenizer call bypassed)."""
    from kvboost import GenerationMode

    engine = runner.engine
    engine._encode = lambda text: list(ids)
    try:
        result = engine.generate("", max_new_tokens=1, mode=GenerationMode.CHUNK_KV_REUSE,
                                 cacheable_prefix_len=0)
    finally:
        del engine._encode
    return torch.as_tensor(result.first_token_logits).float()


@pytest.mark.parametrize("variant", PEERS)
def test_state_matches_kvboost_generate(runner, variant):
    pieces = [token_ids(140, 1), token_ids(60, 2), token_ids(150, 3)]
    query = token_ids(9, 4)
    result = runner.run(pieces, query, variant, ratio=0.15)
    assert result.status == peer.PEER and result.state.length == 359
    # generate() re-splits and re-assembles from the cache the run left warm.
    with runner._splits(pieces, variant):
        theirs = kvboost_first_logits(runner, [t for p in pieces for t in p] + query)
    assert (result.state.logits - theirs).abs().max().item() <= 1e-4


def test_nothing_reused_is_full_prefill(runner):
    """Pieces shorter than kvboost's smallest chunk are never cached: a plain prefill."""
    pieces, query = [token_ids(20, 5), token_ids(25, 6)], token_ids(5, 7)
    result = runner.run(pieces, query, "kvboost", ratio=0.15)
    full = runner.backend.full_prefill([t for p in pieces for t in p] + query)
    assert result.report.reused_tokens == 0
    assert (result.state.logits - full.logits).abs().max().item() <= 1e-4


def test_passage_variant_reuses_every_piece(runner):
    pieces, query = [token_ids(80, 8), token_ids(90, 9)], token_ids(6, 10)
    result = runner.run(pieces, query, "kvboost-passage", ratio=0.15)
    assert result.report.reused_tokens == 170
    full = runner.backend.full_prefill([t for p in pieces for t in p] + query)
    # The second piece was warmed at position 0: without re-positioning, reuse is not exact.
    assert (result.state.logits - full.logits).abs().max().item() > 1e-3


def test_the_engine_gets_its_own_split_back_also_after_an_error(runner):
    own = runner.engine._split_tokens
    with pytest.raises(RuntimeError, match="mid-request"):
        with runner._splits([token_ids(10, 11)], "kvboost-passage"):
            assert runner.engine._split_tokens != own
            raise RuntimeError("mid-request")
    assert runner.engine._split_tokens == own


def test_the_adapter_refuses_another_kvboost_version(tiny_backend, monkeypatch):
    """It drives kvboost's internals, which another version may have changed."""
    from importlib import metadata

    monkeypatch.setattr(metadata, "version", lambda name: "0.9.1")
    with pytest.raises(RuntimeError, match="kvboost 0.9.1 is installed; the adapter needs 0.9.0"):
        peer.KVBoostRunner(tiny_backend("llama"))
