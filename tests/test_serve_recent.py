"""Segments taken from the scope's last prompt (``codekv.serve.recent``), in process on a tiny
random-weight Llama: the KV reused is the one the last prompt computed in place, and with every
token recomputed the reply is full prefill's."""

from __future__ import annotations

import threading

import pytest
import torch
from fixtures.turns import (
    FILE,
    HEADER,
    HISTORY,
    LONGER_HEADER,
    NEW_TURN,
    NOTE,
    QUESTION,
    REPLY,
    SYSTEM,
    TURN,
    prompt,
    served,
)


@pytest.fixture
def engine_of(tiny_backend, tmp_path):
    from codekv.gate import SupportGate
    from codekv.serve.engine import Engine
    from codekv.stores.local import LocalKVStore

    made = []

    def make(**options):
        engine = Engine(tiny_backend(), LocalKVStore(tmp_path / f"kv{len(made)}"),
                        SupportGate([], "no evidence"), experimental=True,
                        min_segment_tokens=8, **options)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()


@pytest.fixture
def licensed_engine(tiny_backend, tmp_path):
    """An engine on the tiny model whose gate licenses ``none`` for the given workloads."""
    from fixtures.evidence import covering

    from codekv.gate import SupportGate
    from codekv.serve.engine import Engine
    from codekv.stores.local import LocalKVStore

    made = []

    def make(licensed: tuple[str, ...]):
        backend = tiny_backend()
        gate = SupportGate([covering({"family": "llama", "workload": workload, "passed": True,
                                      "strategy": "none", "held_out": {"passed": True}},
                                     backend.info.fingerprint) for workload in licensed], "test")
        made.append(Engine(backend, LocalKVStore(tmp_path / f"kv{len(made)}"), gate,
                           min_segment_tokens=8))
        return made[-1]

    yield make
    for engine in made:
        engine.close()


def token_span(backend, parts: tuple[str, ...], index: int) -> tuple[int, int]:
    """Where part ``index`` lies in the prompt's tokens (parts end on token boundaries)."""
    before = backend.tokenize_prompt("".join(parts[:index]))[0]
    through = backend.tokenize_prompt("".join(parts[:index + 1]))[0]
    assert through[:len(before)] == before
    return len(before), len(through)


def kept_as_computed_there(engine, first_ids: list[int], old: tuple[int, int], start: int):
    """The scope's last prompt holds tokens ``old`` of the first prompt as its full prefill
    computed them there, rotated to ``start`` (where the second prompt has them)."""
    backend = engine.backend
    full = backend.state_kv(backend.full_prefill(first_ids), len(first_ids))
    in_place = backend.reposition(backend.span(full, *old), start)
    kept = backend.span(engine.recent.prompts["agent"].kv, start, start + old[1] - old[0])
    for want, got in zip(in_place.keys + in_place.values, kept.keys + kept.values, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    return kept


def second_served(engine_of, first, second):
    """Three engines: ``none``, ``all`` and exact-only; ``first`` served on the first two, and
    the outcome of ``second`` on the first."""
    engine, everything, exact = (engine_of(strategy="none"), engine_of(strategy="all"),
                                 engine_of(reuse="exact-only"))
    for each in (engine, everything):
        served(each, "agent", first)
    return engine, everything, exact, served(engine, "agent", second)


def test_a_segment_moved_by_a_new_turn_is_taken_from_the_last_prompt_as_computed_there(
        engine_of):
    engine = engine_of(strategy="none")
    backend = engine.backend
    first = (SYSTEM, NOTE, FILE, QUESTION)
    outcome = served(engine, "agent", first)
    assert outcome.status == "full-prefill"
    second = (SYSTEM, TURN, NOTE, FILE, QUESTION)  # a turn written before what it re-sends
    outcome = served(engine, "agent", second)
    assert outcome.status == "composed" and outcome.strategy == "none"
    assert outcome.segments_reused == outcome.segments_from_last_prompt == 2
    assert outcome.recomputed_tokens == 0
    # The file's KV is the first prompt's, as its full prefill computed it there (after the
    # note), rotated to where the file is now: not the chunk store's (computed alone).
    old, new = token_span(backend, first, 2), token_span(backend, second, 3)
    kept = kept_as_computed_there(engine, backend.tokenize_prompt("".join(first))[0], old,
                                  new[0])
    alone = backend.reposition(backend.prefill_chunk(backend.tokenize(FILE)), new[0])
    assert not torch.allclose(kept.values[-1], alone.values[-1], atol=1e-3)
    # Another scope's prompt is never read: the same prompt there is a full prefill.
    assert served(engine, "other", second).segments_from_last_prompt == 0


def test_with_every_token_recomputed_the_reply_scores_as_full_prefill(engine_of):
    composed, exact = engine_of(strategy="all"), engine_of(reuse="exact-only")
    first, second = (SYSTEM, NOTE, FILE, QUESTION), (SYSTEM, TURN, FILE, NOTE, QUESTION)
    served(composed, "agent", first)
    outcome = served(composed, "agent", second)
    assert outcome.status == "composed" and outcome.segments_from_last_prompt == 2
    reference = served(exact, "agent", second)
    assert reference.status == "full-prefill"
    assert outcome.continuation_nll == pytest.approx(reference.continuation_nll, abs=1e-4)


EDITED = FILE.replace("width * height", "height * width")
# (first prompt, second prompt): what agents change between calls. Each part is a message's
# content; the question is the request.
SHAPES = {
    "a header changed early": ((HEADER + SYSTEM, NOTE, FILE, QUESTION),
                               (LONGER_HEADER + SYSTEM, NOTE, FILE, QUESTION)),
    "a block edited in the middle": ((SYSTEM, NOTE, FILE, TURN, QUESTION),
                                     (SYSTEM, NOTE, EDITED, TURN, QUESTION)),
    "a message removed": ((SYSTEM, NOTE, TURN, FILE, QUESTION),
                          (SYSTEM, NOTE, FILE, QUESTION)),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_after_a_changed_span_the_rest_comes_from_the_last_prompt(engine_of, shape):
    """After a span that changed (a header with an id and the time, an edited block, a
    removed message), every later segment the last prompt holds is taken from it, re-positioned
    where lengths changed; the changed message is computed in place. With every token
    recomputed, the reply scores as full prefill's."""
    first, second = SHAPES[shape]
    reused, everything, exact = (engine_of(strategy="none"), engine_of(strategy="all"),
                                 engine_of(reuse="exact-only"))
    for engine in (reused, everything):
        served(engine, "agent", first)
    outcome = served(reused, "agent", second)
    assert outcome.status == "composed" and outcome.segments_from_last_prompt >= 1
    assert outcome.recomputed_tokens == 0 and outcome.reused_tokens > 0
    ids = [reused.backend.tokenize_prompt("".join(p))[0] for p in (first, second)]
    same = next(i for i, (a, b) in enumerate(zip(*ids)) if a != b)
    assert outcome.exact_prefix_tokens <= same  # nothing past the change is exact
    recomputed = served(everything, "agent", second)
    assert recomputed.segments_from_last_prompt == outcome.segments_from_last_prompt
    reference = served(exact, "agent", second)
    assert reference.status == "full-prefill"
    assert recomputed.continuation_nll == pytest.approx(reference.continuation_nll, abs=1e-4)


RULES = "Quote the code you rely on.\n\n"
# (first system message, second): a change at its start, and one deep inside it (past what
# the exact prefix serves before it stops inside the message)
CHANGED = {
    "a header before the text": (HEADER + SYSTEM + RULES, LONGER_HEADER + SYSTEM + RULES),
    "an id deep inside": (SYSTEM + RULES + "Id 7f3a.\n" + RULES,
                          SYSTEM + RULES + "Id 5be14d77.\n" + RULES),
}


def test_after_a_changed_header_the_history_of_short_messages_is_one_run(engine_of):
    """Short messages between segments (a history after a new header) are taken from the last
    prompt as one run, as computed there, re-positioned; the turn added since is computed in
    place. With every token recomputed, the reply scores as full prefill's."""
    first = (HEADER + SYSTEM, *HISTORY, FILE, QUESTION)
    second = (LONGER_HEADER + SYSTEM, *HISTORY, *NEW_TURN, FILE, QUESTION)
    engine, everything, exact, outcome = second_served(engine_of, first, second)
    backend = engine.backend
    assert outcome.status == "composed" and outcome.runs_from_last_prompt == 1
    assert outcome.recomputed_tokens == 0
    # The run: the history's tokens, where each prompt has them, from the first's full prefill.
    history = [(token_span(backend, p, 1)[0], token_span(backend, p, 4)[1])
               for p in (first, second)]
    ids = [backend.tokenize_prompt("".join(p))[0] for p in (first, second)]
    (a, b), (c, d) = history
    assert ids[0][a:b] == ids[1][c:d] and b - a >= 8
    kept_as_computed_there(engine, ids[0], (a, b), c)
    recomputed = served(everything, "agent", second)
    assert recomputed.runs_from_last_prompt == 1
    reference = served(exact, "agent", second)
    assert recomputed.continuation_nll == pytest.approx(reference.continuation_nll, abs=1e-4)


@pytest.mark.parametrize("change", CHANGED)
def test_a_changed_segments_unchanged_tail_is_taken_from_the_last_prompt(engine_of, change):
    """Where a message changed inside, the text after the change is taken from the last
    prompt as computed there (a part: the segment is not found whole), re-positioned; the
    change is computed in place. With every token recomputed, the reply scores as full
    prefill's."""
    old, new = CHANGED[change]
    first, second = (old, FILE, QUESTION), (new, FILE, QUESTION)
    engine, everything, exact, outcome = second_served(engine_of, first, second)
    backend = engine.backend
    assert outcome.status == "composed" and outcome.parts_from_last_prompt == 1
    assert outcome.segments_from_last_prompt == 2  # the part and the file
    assert outcome.recomputed_tokens == 0
    # The tail: the tokens the two system messages end with, where the prompts have them.
    ends = [token_span(backend, prompt, 0)[1] for prompt in (first, second)]
    ids = [backend.tokenize_prompt("".join(prompt))[0] for prompt in (first, second)]
    tail = next(n for n in range(1, min(ends) + 1)
                if ids[0][ends[0] - n] != ids[1][ends[1] - n]) - 1
    assert tail >= 8
    kept_as_computed_there(engine, ids[0], (ends[0] - tail, ends[0]), ends[1] - tail)
    recomputed = served(everything, "agent", second)
    assert recomputed.parts_from_last_prompt == 1
    reference = served(exact, "agent", second)
    assert recomputed.continuation_nll == pytest.approx(reference.continuation_nll, abs=1e-4)


def test_parts_are_the_longest_head_and_tail_a_segment_shares_with_the_last_prompt():
    from codekv.serve.recent import Part, RecentPrompts

    class Kept:
        def nbytes(self):
            return 0

    recent = RecentPrompts(backend=None, budget_bytes=1)
    last = list(range(100, 130)) + list(range(200, 220))  # two segments: 30 and 20 tokens
    recent.remember("s", last, [(0, 30), (30, 50)], Kept())
    changed = [1, 2, 3] + list(range(103, 130))  # a new head, the first segment's tail
    assert recent.parts("s", changed, 8) == [Part(3, 3, 27)]
    grown = list(range(100, 130)) + [7, 8]  # the first segment's head, then new tokens
    assert recent.parts("s", grown, 8) == [Part(0, 0, 30)]
    middle = list(range(100, 110)) + [5] + list(range(111, 130))  # one token changed inside
    assert recent.parts("s", middle, 8) == [Part(0, 0, 10), Part(11, 11, 19)]
    assert recent.parts("s", list(range(100, 105)) + [5] * 20, 8) == []  # a head too short
    two = list(range(200, 220)) + list(range(110, 130))  # heads and tails of two segments
    assert recent.parts("s", two, 8) == [Part(0, 30, 20), Part(20, 10, 20)]
    assert recent.parts("other", changed, 8) == []
    recent.remember("r", [5] * 25, [(0, 25)], Kept())
    assert recent.parts("r", [5] * 20, 8) == [Part(0, 0, 20)]  # no tail over the head


def test_runs_are_the_longest_head_and_tail_of_the_text_between_segments():
    from codekv.serve.recent import Part, RecentPrompts, gaps

    class Kept:
        def nbytes(self):
            return 0

    assert gaps([(2, 5), (5, 9), (12, 20)], 0, 25) == [(0, 2), (9, 12), (20, 25)]
    assert gaps([(2, 5), (12, 20)], 3, 15) == [(5, 12)]
    assert gaps([], 4, 9) == [(4, 9)] and gaps([(0, 9)], 0, 9) == []
    recent = RecentPrompts(backend=None, budget_bytes=1)
    # a segment, then a history of short messages (no segment), then a segment
    last = list(range(100, 110)) + list(range(300, 320)) + list(range(200, 210))
    recent.remember("s", last, [(0, 10), (30, 40)], Kept())
    grown = list(range(300, 320)) + [1, 2, 3]  # the history, and a turn added since
    assert recent.runs("s", grown, 8) == [Part(0, 10, 20)]
    assert recent.parts("s", grown, 8) == []  # no segment holds it
    assert recent.runs("s", list(range(100, 110)), 8) == []  # a segment is not a run


def test_only_the_last_prompt_is_kept_and_within_the_budget(engine_of):
    engine = engine_of(strategy="none")
    served(engine, "agent", (SYSTEM, NOTE, FILE, QUESTION))
    served(engine, "agent", (SYSTEM, TURN, QUESTION))  # the file not sent this time
    assert served(engine, "agent", (SYSTEM, FILE, QUESTION)).segments_from_last_prompt == 0
    none_kept = engine_of(strategy="none", prefix_budget_bytes=0)
    served(none_kept, "agent", (SYSTEM, NOTE, FILE, QUESTION))
    assert not none_kept.recent.prompts


def test_text_between_reused_segments_is_computed_once_in_place(engine_of, monkeypatch):
    """A few tokens between two reused segments are computed in place against the whole
    context, and nowhere before (on transformers their placeholder is zeros, never read)."""
    composed, exact = engine_of(strategy="all"), engine_of(reuse="exact-only")
    backend = composed.backend
    served(composed, "agent", (SYSTEM, FILE, NOTE, QUESTION))
    between = "See:\n"
    second = (SYSTEM, NOTE, between, FILE, QUESTION)
    alone = []
    prefill_chunk = backend.prefill_chunk

    def counted(token_ids, *args, **kwargs):
        alone.append(list(token_ids))
        return prefill_chunk(token_ids, *args, **kwargs)

    monkeypatch.setattr(backend, "prefill_chunk", counted)
    outcome = served(composed, "agent", second)
    assert outcome.status == "composed" and outcome.segments_from_last_prompt == 2
    start, end = token_span(backend, second, 2)
    assert end > start and outcome.prefilled_tokens >= end - start
    ids = backend.tokenize_prompt("".join(second))[0]
    assert not any(ids[start:end] == run[i:i + end - start] for run in alone
                   for i in range(len(run)))
    reference = served(exact, "agent", second)
    assert outcome.continuation_nll == pytest.approx(reference.continuation_nll, abs=1e-4)


def test_experimental_reuses_the_last_prompt_past_its_exact_part_in_place(engine_of):
    """A composed request's KV past its first reused segment is not exact, so the exact-prefix
    cache keeps only what comes before; a next prompt repeating the whole last one reuses the
    rest in place (composed, never counted exact), and with every token recomputed it scores
    as full prefill."""
    for strategy in ("none", "all"):
        engine, exact = engine_of(strategy=strategy), engine_of(reuse="exact-only")
        served(engine, "agent", (SYSTEM, NOTE, FILE, QUESTION))
        composed = served(engine, "agent", (SYSTEM, TURN, NOTE, FILE, QUESTION))
        assert composed.status == "composed"
        follow = (SYSTEM, TURN, NOTE, FILE, QUESTION + REPLY, " And the perimeter?")
        outcome = served(engine, "agent", follow)
        assert outcome.status == "composed"
        # Exact: up to the note, the first segment the last request reused; from there to
        # where the prompts part (the last question's end), reused in place.
        backend = engine.backend
        assert outcome.exact_prefix_tokens == token_span(backend, follow, 2)[0]
        common = token_span(backend, (SYSTEM, TURN, NOTE, FILE, QUESTION), 4)[1]
        reused = outcome.reused_tokens + outcome.recomputed_tokens
        assert common - 2 <= outcome.exact_prefix_tokens + reused <= common
        if strategy == "all":
            reference = served(exact, "agent", follow)
            assert outcome.continuation_nll == pytest.approx(reference.continuation_nll,
                                                             abs=1e-4)
        else:
            assert outcome.recomputed_tokens == 0
            assert outcome.prefilled_tokens <= outcome.prompt_tokens - common + 2


def test_a_new_segment_between_reused_ones_is_stored_only_after_the_reply(engine_of,
                                                                         monkeypatch):
    """On transformers a placeholder costs nothing, so a new segment between reused ones is
    computed in place for the request, and for the store (alone) only once the reply is out:
    not before the first token, as where a placeholder is the text computed alone."""
    from codekv.serve.engine import Failed, Final, Job, Sampling

    engine = engine_of(strategy="all")
    backend = engine.backend
    served(engine, "agent", (SYSTEM, NOTE, FILE, QUESTION))
    second = (SYSTEM, NOTE, TURN, FILE, QUESTION)  # the turn: a new segment between
    new = backend.tokenize_prompt("".join(second))[0][slice(*token_span(backend, second, 2))]
    timeline = []
    prefill_chunk = backend.prefill_chunk

    def counted(token_ids, *args, **kwargs):
        if list(token_ids) == new:
            timeline.append("computed alone")
        return prefill_chunk(token_ids, *args, **kwargs)

    monkeypatch.setattr(backend, "prefill_chunk", counted)
    done = threading.Event()

    def emit(event):
        timeline.append(type(event).__name__)
        if isinstance(event, Final | Failed):
            done.set()

    engine.submit(Job("agent", lambda: prompt(*second), Sampling(max_tokens=1, temperature=0),
                      emit, chat=False))
    assert done.wait(60)
    while engine.busy:
        threading.Event().wait(0.01)
    assert [e for e in timeline if e != "Partial"] == ["Prefilled", "Final", "computed alone"]


@pytest.mark.parametrize("licensed, from_last, from_store", [
    ("agent-session", 2, 0),  # the last prompt's class: its segments, and nothing stored
    ("rag", 0, 2),  # the store's class of passages: the same segments, from the store
])
def test_the_gate_rules_on_each_source_of_reused_kv_apart(tiny_backend, tmp_path, licensed,
                                                          from_last, from_store):
    from fixtures.evidence import covering

    from codekv.gate import SupportGate
    from codekv.serve.engine import Engine
    from codekv.stores.local import LocalKVStore

    backend = tiny_backend()
    gate = SupportGate([covering({"family": "llama", "workload": licensed, "passed": True,
                                  "strategy": "boundary", "ratio": 0.15,
                                  "held_out": {"passed": True}}, backend.info.fingerprint,
                                 languages=("python",))], "test")
    engine = Engine(backend, LocalKVStore(tmp_path / "kv"), gate, min_segment_tokens=8)
    try:
        first = served(engine, "agent", (SYSTEM, NOTE, FILE, QUESTION))
        assert first.status == "full-prefill"
        assert first.segments_stored == (0 if licensed == "agent-session" else 3)
        outcome = served(engine, "agent", (SYSTEM, TURN, NOTE, FILE, QUESTION))
        assert outcome.status == "composed" and outcome.strategy == "boundary"
        assert outcome.segments_from_last_prompt == from_last
        assert outcome.segments_reused - outcome.segments_from_last_prompt == from_store
    finally:
        engine.close()


# A piece of code changed inside (a line edited in a function), in a fenced block.
CODE = ("```python\ndef area(width, height):\n    \"\"\"The surface, in square units.\"\"\"\n"
        "    scale = 1\n    surface = width * height * scale\n    if surface < 0:\n"
        "        raise ValueError('a negative side')\n    return surface\n```\n\n")
CODE_EDITED = CODE.replace("    scale = 1\n", "    scale = 2  # in half units\n")
# (first prompt, second): a message's text changed (a header), a piece of code changed
CHANGED_KIND = {
    "text": ((CHANGED["a header before the text"][0], FILE, QUESTION),
             (CHANGED["a header before the text"][1], FILE, QUESTION)),
    "code": ((SYSTEM, CODE, QUESTION), (SYSTEM, CODE_EDITED, QUESTION)),
}


@pytest.mark.parametrize("licensed, change, parts, missing", [
    # whole segments only: the changed message computed in place
    (("agent-session",), "text", 0, "agent-session-text-parts"),
    (("agent-session", "agent-session-text-parts"), "text", 1, None),
    # code's parts and text's are classes apart: neither licence reaches the other
    (("agent-session", "agent-session-parts"), "text", 0, "agent-session-text-parts"),
    (("agent-session", "agent-session-text-parts"), "code", 0, "agent-session-parts"),
    (("agent-session", "agent-session-parts"), "code", 1, None),
])
def test_the_gate_licenses_parts_of_changed_segments_apart(licensed_engine, licensed,
                                                           change, parts, missing):
    engine = licensed_engine(licensed)
    first, second = CHANGED_KIND[change]
    served(engine, "agent", first)
    outcome = served(engine, "agent", second)
    assert outcome.parts_from_last_prompt == parts
    if change == "text":  # the file is reused whatever the header's parts: composed
        assert outcome.status == "composed" and outcome.strategy == "none"
        assert outcome.segments_from_last_prompt == 1 + parts  # the file, and the part
    if parts:
        assert outcome.status == "composed" and outcome.strategy == "none"
        assert outcome.fallback_reason is None
    else:
        assert f"/{missing}" in outcome.fallback_reason, outcome.fallback_reason


@pytest.mark.parametrize("licensed, runs", [
    (("agent-session", "agent-session-text-parts"), 0),  # the history computed in place
    (("agent-session", "agent-session-text-parts", "agent-session-runs"), 1),
])
def test_the_gate_licenses_runs_of_the_text_between_segments_apart(licensed_engine, licensed,
                                                                    runs):
    engine = licensed_engine(licensed)
    served(engine, "agent", (HEADER + SYSTEM, *HISTORY, FILE, QUESTION))
    outcome = served(engine, "agent",
                     (LONGER_HEADER + SYSTEM, *HISTORY, *NEW_TURN, FILE, QUESTION))
    assert outcome.status == "composed" and outcome.runs_from_last_prompt == runs
    assert outcome.parts_from_last_prompt == 1
    if runs:
        assert outcome.fallback_reason is None
    else:
        assert "/agent-session-runs" in outcome.fallback_reason, outcome.fallback_reason
