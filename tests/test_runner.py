"""The evaluation's per-task measures, checked against the backend's own decoding."""

from __future__ import annotations

import pytest
import torch
from fixtures.needs import missing

from codekv.compose import Composer, Passage
from codekv.eval import methods, peer, pruning, runner, workloads
from codekv.eval.methods import Method
from codekv.eval.scores import score
from codekv.stores.local import LocalKVStore

CONTEXT = [Passage("def area(w, h):\n    return w * h\n", "a"),
           Passage("the quick brown fox jumps over the lazy dog", "b"),
           Passage("class Stack:\n    def push(self, item):\n        pass\n", "c")]


@pytest.fixture
def composer(tiny_backend, tmp_path):
    backend = tiny_backend("llama", seed=3)
    return Composer(backend, None, store=LocalKVStore(tmp_path / "kv"), experimental=True)


def task(kind="quote", answer="self, item)"):
    return workloads.Task("rag", "t0", kind, CONTEXT, "def push(", answer, "c")


def test_greedy_answers_are_each_methods_own_decoding(composer):
    backend = composer.backend
    t = task()
    full, every, none = runner.run_task(
        composer, t, [runner.Composition([Method("all", 1.0), Method("none")])],
        greedy_tokens=16)
    full_state = composer.full_prefill(t.context, t.query).state
    n = len(backend.tokenize(t.answer))  # not a completion: as long as the answer
    assert n < 16  # shorter than the agreement's greedy tokens: scored on n tokens all the same
    expected = score(backend.detokenize(backend.generate(full_state, n)), t.answer)
    assert (full.edit_similarity, full.identifier_f1) == (expected.edit_similarity,
                                                          expected.identifier_f1)
    assert every.edit_similarity == full.edit_similarity
    naive = composer.compose(t.context, t.query, strategy="none").state
    own = score(backend.detokenize(backend.generate(naive, n)), t.answer)
    assert none.edit_similarity == own.edit_similarity
    assert none.answer_exact == own.exact_match


def test_greedy_answer_decodes_only_after_the_first_difference(composer):
    backend = composer.backend
    t = task()
    full = composer.full_prefill(t.context, t.query)
    ref = runner._Reference.of(backend, full, t, greedy_tokens=8)
    for name in ("none", "boundary"):
        state = composer.compose(t.context, t.query, strategy=name, ratio=0.3).state
        top1 = runner.forced_logprobs(backend, state, ref.greedy_ids).argmax(-1)
        length = state.length
        answer = runner.greedy_answer(backend, state, ref, top1)
        assert state.length == length  # left as it was
        expected = backend.generate(state, len(ref.greedy_ids))
        eos = backend.eos_token_id
        assert [t for t in answer if t != eos] == expected[: len(answer)]


def test_decisive_positions_are_where_full_prefill_is_clear(composer):
    backend = composer.backend
    t = task()
    full = composer.full_prefill(t.context, t.query)
    ref = runner._Reference.of(backend, full, t, greedy_tokens=6)
    state = full.state
    margins = []
    for token in ref.greedy_ids[:6]:
        top = torch.softmax(state.logits.float(), -1).topk(2).values
        margins.append(float(top[0] - top[1]))
        backend.extend(state, [token])
    assert ref.decisive.tolist() == [m >= runner.DECISIVE_MARGIN for m in margins]
    [measure] = [m for m in runner.run_task(composer, t, [], greedy_tokens=6)]
    assert measure.decisive_positions + measure.near_ties == len(ref.greedy_ids[:6])
    assert measure.decisive_positions == sum(margins[i] >= 0.1 for i in range(6))


def test_completions_are_scored_on_their_first_line(composer):
    t = task(kind="completion", answer="    return w * h\n")
    full, = runner.run_task(composer, t, [])
    ref = runner._Reference.of(composer.backend, composer.full_prefill(t.context, t.query), t, 8)
    assert len(ref.greedy_ids) == min(runner.ANSWER_TOKENS,
                                      len(composer.backend.tokenize(t.answer))
                                      + runner.COMPLETION_SLACK)
    text = composer.backend.detokenize(ref.greedy_ids)
    assert full.edit_similarity == score(text, t.answer, one_line=True).edit_similarity


def test_the_reordered_reference_is_full_prefill_in_another_order(composer):
    backend = composer.backend
    t = task()
    order = runner.reordered(t)
    assert sorted(p.name for p in order) == sorted(p.name for p in CONTEXT)
    assert order != CONTEXT and runner.reordered(t) == order  # another order, always the same
    full, reordered = runner.run_task(composer, t, [runner.Reordered()])
    assert (reordered.method, reordered.kind, reordered.status) == (
        "full-reordered", "reference", "full-prefill")
    alone = composer.full_prefill(order, t.query).state
    assert reordered.nll == pytest.approx(backend.score(alone, backend.tokenize(t.answer)),
                                          abs=1e-5)
    assert reordered.delta_nll == pytest.approx(reordered.nll - full.nll)
    assert reordered.kl > 1e-6  # random weights: the order moves the distribution
    one = workloads.Task("rag", "t1", "quote", CONTEXT[:1], "def push(", "self", "a")
    assert [m.method for m in runner.run_task(composer, one, [runner.Reordered()])] == ["full"]


def test_composition_reports_each_conditionings_offline_cost(composer):
    """Filling the chunk store is timed per conditioning, with the tokens it ran: chunks after
    the prefix cost the prefix's tokens again per chunk, chunks alone do not, and a chunk
    already stored costs nothing."""
    prefix = "System prompt.\n"
    composition = runner.Composition([Method("none"), Method("none", conditioning="none"),
                                      Method("boundary", 0.3)])
    _, after, alone, boundary = runner.run_task(composer, task(), [composition], prefix=prefix)
    chunks = sum(len(piece.ids) for piece in composer.build_request(CONTEXT).pieces)
    prefix_tokens = len(composer.backend.tokenize(prefix))
    assert after.offline_tokens == boundary.offline_tokens == chunks + 3 * prefix_tokens
    assert alone.offline_tokens == chunks
    assert after.offline_prefill_s > 0 and alone.offline_prefill_s > 0
    assert (alone.method, alone.conditioning) == ("none+none", "none")
    again = runner.run_task(composer, task(), [composition], prefix=prefix)
    assert [m.offline_tokens for m in again] == [0, 0, 0, 0]


def test_baselines_run_on_the_first_tasks_of_each_workload():
    tasks = [workloads.Task(w, f"{w}:{n}", "quote", [], "q", "a", "x")
             for w in ("code-qa", "rag") for n in range(3)]
    composition = runner.Composition(methods.composition_methods(("none", "boundary"), (0.1,)))
    pruned = pruning.Pruning(methods.pruning_methods(("snapkv", "anchor-preserving"), (0.5,)),
                             tasks=2)
    scheduled = [(task.id, len(active))
                 for task, active in runner.schedule(tasks, [composition, pruned])]
    assert scheduled == [("code-qa:0", 2), ("code-qa:1", 2), ("code-qa:2", 1),
                         ("rag:0", 2), ("rag:1", 2), ("rag:2", 1)]
    # Two composition methods on every task; pruning on the first two of each workload, where
    # only code has the anchors anchor-preserving needs.
    assert runner.requests(tasks, [composition, pruned]) == 6 * 2 + 2 * 2 + 2 * 1


def test_recomputing_everything_measures_as_full_prefill(tiny_backend, tmp_path):
    backend = tiny_backend("llama")
    composer = Composer(backend, None, store=LocalKVStore(tmp_path / "kv"), experimental=True)
    context = [Passage("def area(w, h):\n    return w * h\n", "a"),
               Passage("the quick brown fox jumps", "b"),
               Passage("class Stack:\n    def push(self, item):\n        pass\n", "c")]
    task = workloads.Task("rag", "t0", "quote", context, "def push(", "self, item)", "c")
    measures = runner.run_task(composer, task,
                               [runner.Composition([Method("all", 1.0), Method("none")])])
    full, everything, none = measures
    # Full prefill is scored like every method: its NLL is the backend's own score of the
    # answer after the request, and greedy decoding agrees with its teacher-forced top-1.
    alone = backend.full_prefill(composer.build_request(context, task.query).token_ids)
    assert (full.method, full.kind) == ("full", "reference")
    assert full.nll == pytest.approx(backend.score(alone, backend.tokenize(task.answer)), abs=1e-5)
    assert abs(full.delta_nll) < 1e-6 and full.agreement == 1 and full.greedy_match
    assert everything.status == "composed" and everything.recompute_ratio == 1.0
    assert abs(everything.delta_nll) < 1e-4 and everything.kl < 1e-6
    assert everything.agreement == 1.0 and everything.greedy_match
    assert everything.exact_match == full.exact_match
    assert none.kl > 1e-4  # random weights: naive concatenation moves the distribution
    assert full.answer_tokens == len(backend.tokenize("self, item)"))
    assert full.context_tokens == everything.context_tokens == none.context_tokens


def test_peer_methods_run_on_the_same_tokens(tiny_backend, tmp_path):
    if peer.available():
        missing(peer.available())
    backend = tiny_backend("llama", seed=5, max_position_embeddings=1024)
    composer = Composer(backend, None, store=LocalKVStore(tmp_path / "kv"), experimental=True)
    context = [Passage("def area(w, h):\n    return w * h\n" * 6, "a"),
               Passage("the quick brown fox jumps over the lazy dog\n" * 6, "b")]
    task = workloads.Task("rag", "t0", "quote", context, "def push(", "self, item)", "b")
    full, passage = runner.run_task(composer, task, [peer.Peers(
        methods.peer_methods(("kvboost-passage",), 0.15))])
    assert (passage.kind, passage.status, passage.method) == ("peer", "peer",
                                                              "kvboost-passage@0.15")
    assert passage.context_tokens == full.context_tokens
    assert passage.recompute_ratio == 0  # every piece reused (then repaired by its CacheBlend)
    assert passage.kl > 1e-4  # no re-positioning: not full prefill


def test_shift_only_is_the_stored_chunk_kv_in_the_previous_requests_order(
        engine_backend, tmp_path, monkeypatch):
    """``shift-only`` composes nothing but the stored chunk KV, shifted into the order the
    previous request held the chunks in (the reordered reference's): where that order is the
    task's own it is ``none``, measure for measure; where it changed, its answer is the one
    ``none`` gives over the old order, scored independently by the backend, not ``none``'s."""
    composer = Composer(engine_backend, None, store=LocalKVStore(tmp_path / "kv"),
                        experimental=True)
    backend, t = engine_backend, task()
    composition = runner.Composition(methods.composition_methods(("none", "shift-only")))
    _, none, shifted = runner.run_task(composer, t, [composition])
    assert (shifted.method, shifted.kind, shifted.recomputed_tokens) == (
        "shift-only", "composition", 0)
    old = runner.reordered(t)
    assert runner.previous_order(t) == old != CONTEXT
    alone = composer.compose(old, t.query, strategy="none").state
    expected = backend.score(alone, backend.tokenize(t.answer))
    assert shifted.nll == pytest.approx(expected, abs=1e-6)
    assert abs(shifted.nll - none.nll) > 1e-5  # the order moved it (the GGUF's by 4e-5)

    monkeypatch.setattr(runner, "previous_order", lambda task: list(task.context))
    _, none, shifted = runner.run_task(composer, t, [composition])
    same = ("nll", "kl", "agreement", "edit_similarity", "context_tokens", "recompute_ratio")
    assert [getattr(shifted, k) for k in same] == pytest.approx(
        [getattr(none, k) for k in same], abs=1e-6)
