"""KV pruning baselines (kvpress): one shared prefill gives what each press gives alone, a budget
keeps that many entries, anchor-preserving keeps the anchors, and pruned states score like any
other request state. Tiny random-weight models; which positions survive is read off the keys
(every position's rotated key is distinct)."""

from __future__ import annotations

import pytest
import torch
from fixtures.needs import missing
from transformers import DynamicCache

from codekv.compose import Composer, Passage
from codekv.eval import pruning, runner, support, workloads
from codekv.eval.measures import ResultRow
from codekv.eval.methods import RULES, Method
from codekv.index import Index
from codekv.stores.local import LocalKVStore

kvpress = pruning.load()


@pytest.fixture(autouse=True)
def _kvpress():
    if kvpress is None:
        missing("kvpress (the eval extra) is not installed")
TEXT = "the quick brown fox jumps over the lazy dog; a rectangle's area is width times height "


@pytest.fixture(autouse=True)
def _bytes(byte_counter):
    """Every test here indexes with byte counting (the ``byte_counter`` fixture)."""


@pytest.fixture
def composer(tiny_backend, tmp_path):
    return Composer(tiny_backend("llama"), None, store=LocalKVStore(tmp_path / "kv"),
                    experimental=True)


CONTEXT = [Passage(TEXT, "a"), Passage(TEXT[::-1], "b"), Passage(TEXT.upper(), "c")]
QUERY = "the area of a"


def kv(rule: str, budget: float) -> Method:
    """A pruning method keeping ``budget`` of the context KV."""
    return Method(rule, budget, "pruning")


def pruned(composer, methods, chunks=CONTEXT, query=QUERY) -> dict:
    return dict(pruning.run(composer, chunks, query, methods))


def kept_positions(full_keys: torch.Tensor, keys: torch.Tensor) -> list[list[int]]:
    """Per KV head, the context positions whose keys survived (keys [1, heads, m, dim]; kvpress
    keeps them in score order). Matched within 1e-4: eager attention rounds differently."""
    out = []
    for head in range(keys.shape[1]):
        close = (keys[0, head][:, None, :] - full_keys[0, head][None, :, :]).abs().amax(-1) < 1e-4
        assert (close.sum(-1) == 1).all()  # each kept key is one context position's
        out.append(sorted(close.int().argmax(-1).tolist()))
    return out


def context_keys(composer, chunks=CONTEXT) -> tuple[list[int], list[torch.Tensor]]:
    ids = composer.build_request(chunks).context_ids
    state = composer.backend.full_prefill(ids)
    return ids, [layer.keys for layer in state.cache.layers]


def test_budget_one_is_full_prefill(composer):
    methods = [kv(name, 1.0) for name in ("snapkv", "streamingllm", "h2o", "pyramidkv")]
    results = pruned(composer, methods)
    full = composer.full_prefill(CONTEXT, QUERY)
    assert set(results) == set(methods)
    for result in results.values():
        assert result.status == pruning.PRUNED and result.kv_kept == 1.0
        assert result.state.token_ids == full.state.token_ids
        assert (result.state.logits - full.state.logits).abs().max() < 1e-4
        assert result.report.context_tokens == full.report.context_tokens
        assert result.report.ttft_s == pytest.approx(sum(result.report.timings.values()), abs=1e-3)


@pytest.mark.parametrize("budget", [0.25, 0.5])
def test_a_budget_keeps_that_many_entries_per_layer(composer, budget):
    methods = [kv(name, budget) for name in ("snapkv", "streamingllm", "h2o", "pyramidkv")]
    results = pruned(composer, methods)
    n = results[methods[0]].report.context_tokens
    q = results[methods[0]].report.query_tokens
    assert n > 150
    for method, result in results.items():
        lengths = [layer.keys.shape[2] - q for layer in result.state.cache.layers]
        if method.strategy == "pyramidkv":  # more in lower layers, the same in all
            assert lengths[0] > lengths[1] and sum(lengths) == pytest.approx(2 * n * budget, abs=2)
        else:
            assert lengths == [int(n * budget)] * 2
        assert result.kv_kept == pytest.approx(sum(lengths) / (2 * n))


def test_streamingllm_keeps_the_sinks_and_the_last_tokens(composer):
    [result] = pruned(composer, [kv("streamingllm", 0.25)]).values()
    ids, full_keys = context_keys(composer)
    n, m = len(ids), int(len(ids) * 0.25)
    for layer, keys in enumerate(full_keys):
        state_keys = result.state.cache.layers[layer].keys[:, :, :m]
        expected = [0, 1, 2, 3] + list(range(n - (m - 4), n))
        assert kept_positions(keys, state_keys) == [expected] * keys.shape[1]


@pytest.mark.parametrize("name", ["snapkv", "h2o"])
def test_shared_prefill_keeps_what_the_press_keeps_alone(composer, name):
    """kvpress's own context manager (eager attention for H2O, which needs the weights)."""
    from fixtures.models import tiny_model

    [result] = pruned(composer, [kv(name, 0.5)]).values()
    ids, full_keys = context_keys(composer)
    model = tiny_model("llama")
    if name == "h2o":
        model.set_attn_implementation("eager")
    press = RULES[name].make(kvpress, 0.5, len(ids), pruning.Anchors())
    cache = DynamicCache(config=model.config)
    with torch.inference_mode(), press(model):
        model.model(input_ids=torch.tensor([ids]), past_key_values=cache)
    m = int(len(ids) * 0.5)
    for layer, keys in enumerate(full_keys):
        alone = kept_positions(keys, cache.layers[layer].keys)
        shared = kept_positions(keys, result.state.cache.layers[layer].keys[:, :, :m])
        assert shared == alone
        assert alone != [list(range(len(ids) - m, len(ids)))] * keys.shape[1]  # not a window


def test_scoring_a_ragged_pruned_state_is_exact_and_leaves_it_unchanged(composer):
    """PyramidKV keeps a different number of entries per layer: appending several tokens at
    once must equal appending them one by one, and scoring must restore the state."""
    backend = composer.backend
    [first] = pruned(composer, [kv("pyramidkv", 0.25)]).values()
    [again] = pruned(composer, [kv("pyramidkv", 0.25)]).values()
    lengths = [layer.keys.shape[2] for layer in first.state.cache.layers]
    assert len(set(lengths)) > 1
    answer = backend.tokenize(" rectangle as width")
    with pruning.ragged_attention():  # as while the runner scores a pruning result
        logp = runner.forced_logprobs(backend, first.state, answer)
        assert [layer.keys.shape[2] for layer in first.state.cache.layers] == lengths
        assert first.state.length == again.state.length
        assert torch.equal(runner.forced_logprobs(backend, first.state, answer), logp)
        one_by_one = [torch.log_softmax(again.state.logits, -1)]
        for token in answer[:-1]:
            one_by_one.append(torch.log_softmax(backend.extend(again.state, [token])[-1], -1))
    assert (torch.stack(one_by_one) - logp).abs().max() < 1e-4


def test_ragged_attention_is_on_only_while_pruning_runs(composer):
    """transformers' attention table is the process's: pruning puts its SDPA back when done,
    also when scoring one of its states fails."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def ours() -> bool:
        return ALL_ATTENTION_FUNCTIONS["sdpa"].__module__ == pruning.__name__

    before = ALL_ATTENTION_FUNCTIONS["sdpa"]
    assert not ours()  # kvpress is loaded (this module's import)
    results = pruning.run(composer, CONTEXT, QUERY, [kv("pyramidkv", 0.25), kv("snapkv", 0.5)])
    next(results)
    assert ours()  # while its states are scored
    assert len(list(results)) == 1
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is before

    def scoring_fails():
        raise RuntimeError("scoring failed")

    task = workloads.Task("rag", "t0", "quote", CONTEXT, QUERY, " rectangle as width", "a")
    with pytest.raises(RuntimeError) as failed:  # kept: its traceback holds the runner's frame
        runner.run_task(composer, task, [pruning.Pruning([kv("snapkv", 0.5), kv("h2o", 0.5)])],
                        on_method=scoring_fails)
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is before
    assert str(failed.value) == "scoring failed"


# -- anchor-preserving -----------------------------------------------------------------------
HAND = {
    "util.py": "def helper(x):\n    return x + 1\n",
    "app.py": ("from util import helper\n\n\ndef run(value):\n    doubled = value * 2\n"
               "    return helper(doubled)\n"),
}
ANCHOR_QUERY = "def main():\n    return run("


@pytest.fixture
def code_composer(tiny_backend, git_repo, tmp_path):
    git_repo.commit(HAND)
    index = Index(git_repo.root)
    index.update(workers=1)
    composer = Composer(tiny_backend("llama"), index, store=LocalKVStore(tmp_path / "kv"),
                        experimental=True)
    yield composer
    index.close()


def test_anchor_tiers_are_the_chunks_anchor_tokens(code_composer):
    chunks = ["util.py::helper", "app.py::run"]
    pieces = code_composer.build_request(chunks, ANCHOR_QUERY).pieces
    anchors = pruning.anchor_tiers(0, pieces, ANCHOR_QUERY)
    offsets = [0, len(pieces[0].ids)]
    spans = {(a.kind, a.name, off + a.start, off + a.end)
             for piece, off in zip(pieces, offsets) for a in piece.anchors}
    assert set(anchors.every) == {p for _, _, start, end in spans for p in range(start, end)}
    # Key anchors: ``run`` is named by the query; ``helper`` links the chunks (its use in
    # run() and its definition), including the first chunk, which recompute would skip.
    key = {p for kind, name, start, end in spans for p in range(start, end)
           if (name == "run" and kind in ("def", "call", "use"))
           or (name == "helper" and kind in ("def", "use"))}
    assert set(anchors.key) == key
    assert any(p < offsets[1] for p in anchors.key)
    text = code_composer.backend.detokenize([t for p in pieces for t in p.ids])
    assert "helper" in text and len(anchors.every) < offsets[1] + len(pieces[1].ids)


def test_anchor_preserving_keeps_every_anchor_that_fits(code_composer):
    """Tiers: the attention sinks (first 4) and SnapKV's window (last n // 8) above the key
    anchors above every other anchor above the rest."""
    chunks = ["util.py::helper", "app.py::run", "util.py::helper"]
    pieces = code_composer.build_request(chunks, ANCHOR_QUERY).pieces
    anchors = pruning.anchor_tiers(0, pieces, ANCHOR_QUERY)
    n = sum(len(p.ids) for p in pieces)
    protected = set(range(4)) | set(range(n - n // 8, n))
    ids, full_keys = context_keys(code_composer, chunks)
    everything = protected | set(anchors.every)
    roomy = (len(everything) + 8) / n  # every anchor fits, with 8 positions to spare
    tight = len(protected | set(anchors.key)) / n + 1e-9  # only the key anchors fit
    assert len(anchors.key) < len(anchors.every) and len(everything) + 8 < n
    results = pruned(code_composer, [kv("anchor-preserving", roomy),
                                      kv("anchor-preserving", tight)], chunks, ANCHOR_QUERY)
    for (method, result), wanted in zip(results.items(), (everything,
                                                          protected | set(anchors.key))):
        m = int(n * method.ratio)
        for layer, keys in enumerate(full_keys):
            survivors = kept_positions(keys, result.state.cache.layers[layer].keys[:, :, :m])
            for head in survivors:
                assert wanted <= set(head)
                if method.ratio == tight:
                    assert set(head) == wanted
    # Without anchors (passages) the rule is not run: it would be snapkv.
    assert not pruned(code_composer, [kv("anchor-preserving", 0.5)])


# -- evaluation ------------------------------------------------------------------------------
def test_pruning_measures_are_scored_like_every_method(composer):
    task = workloads.Task("rag", "t0", "quote", CONTEXT, QUERY, " rectangle as width", "a")
    measures = runner.run_task(composer, task, [
        runner.Composition([Method("none")]),
        pruning.Pruning([kv("snapkv", 1.0), kv("snapkv", 0.25)])])
    full, none, whole, quarter = measures
    assert [m.kind for m in measures] == ["reference", "composition", "pruning", "pruning"]
    assert (whole.method, quarter.method) == ("snapkv@kv1", "snapkv@kv0.25")
    assert whole.budget == 1.0 and quarter.budget == 0.25 and quarter.status == "pruned"
    assert abs(whole.delta_nll) < 1e-4 and whole.agreement == 1.0 and whole.kl < 1e-6
    assert quarter.kl > 1e-4  # random weights: dropping 3/4 of the KV moves the distribution
    assert quarter.kv_kept == pytest.approx(0.25, abs=0.01)
    assert full.kv_bytes == none.kv_bytes == whole.kv_bytes == quarter.full_kv_bytes
    assert quarter.ttft_s > 0 and quarter.context_tokens == full.context_tokens


def test_pruning_rows_never_feed_the_gate():
    row = ResultRow.from_json({
        "workload": "rag", "method": "snapkv@kv0.5", "strategy": "snapkv", "ratio": 0.5,
        "tasks": 12, "delta_nll": 0.0, "agreement": 1.0, "speedup": 3.0,
        "recompute_ratio": 1.0, "fallbacks": 0, "kind": "pruning"})
    [entry] = support.gate_entries([row], "llama")
    assert entry["passed"] is False and entry["candidates"] == []
