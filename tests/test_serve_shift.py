"""Shift-only reuse (``codekv serve --reuse shift-only``), llama-server's ``--cache-reuse``: the
baseline the replay benchmark measures composition against."""

from __future__ import annotations

import pytest
from fixtures.needs import require
from fixtures.servers import ServeProcess

from codekv.serve.shift import shift_runs


def test_runs_skip_what_the_prompt_dropped_and_end_at_what_it_inserted():
    cached = list(range(100))
    # The prompt keeps 0..9, drops 10..29, keeps 30..59, inserts 999, then keeps 60..99.
    ids = cached[:10] + cached[30:60] + [999] + cached[60:]
    assert shift_runs(cached, ids, 10, min_run=16) == [(30, 10, 30)]
    assert shift_runs(cached, ids, 10, min_run=31) == []  # the run is shorter than asked
    # Two dropped spans: both kept runs shift, in order.
    ids = cached[:10] + cached[30:50] + cached[70:]
    assert shift_runs(cached, ids, 10, min_run=16) == [(30, 10, 20), (70, 30, 30)]


TINY = "tiny-chat-model"
SYSTEM = {"role": "system", "content": "You review code and answer briefly."}
FILE = ("def area(width, height):\n    return width * height\n\n\n"
        "def perimeter(width, height):\n    return 2 * (width + height)\n")
NOTE = "The quick brown fox jumps over the lazy dog near the river bank, twice a day."


def ask(client, messages) -> dict:
    reply = client.chat.completions.create(model=TINY, messages=messages, temperature=0,
                                           max_tokens=4)
    report = reply.model_extra["codekv"]
    parts = ("exact_prefix_tokens", "reused_tokens", "recomputed_tokens", "prefilled_tokens")
    assert sum(report[p] for p in parts) == report["prompt_tokens"] == reply.usage.prompt_tokens
    return report


@pytest.fixture(scope="module")
def shift_server(tiny_model_dir, tmp_path_factory):
    require("uvicorn", "uvicorn is not installed (the 'serve' extra)")
    require("openai", "the openai client is not installed (the 'serve' extra)")
    server = ServeProcess(["--model", str(tiny_model_dir), "--served-model-name", TINY,
                           "--reuse", "shift-only", "--min-segment-tokens", "8"],
                          tmp_path_factory.mktemp("serve-shift")).wait()
    yield server
    server.stop()


def test_a_dropped_message_shifts_the_rest_an_inserted_one_ends_the_reuse(shift_server):
    client = shift_server.client()
    question = {"role": "user", "content": f"```python\n{FILE}```\nWhat does area return?"}
    first = ask(client, [SYSTEM, {"role": "user", "content": NOTE}, question])
    assert first["status"] == "full-prefill" and first["reused_tokens"] == 0
    # The note dropped: the question's tokens, held by the slot after it, shift into place.
    dropped = ask(client, [SYSTEM, question])
    assert dropped["status"] == "composed" and dropped["strategy"] == "shift"
    assert dropped["reused_tokens"] > len(FILE) // 4 and dropped["recomputed_tokens"] == 0
    assert dropped["segments_stored"] == 0  # nothing goes to the chunk store
    # A message inserted before the question: nothing after the common prefix is reused,
    # and that prefix (before the shifted run) is exact.
    inserted = ask(client, [SYSTEM, {"role": "user", "content": NOTE}, question])
    assert inserted["reused_tokens"] == 0 and inserted["status"] == "exact-prefix"
    assert 0 < inserted["exact_prefix_tokens"] <= dropped["exact_prefix_tokens"]
    # Appended to: the whole previous prompt is an exact prefix.
    appended = ask(client, [SYSTEM, {"role": "user", "content": NOTE}, question,
                            {"role": "assistant", "content": "width * height"},
                            {"role": "user", "content": "And perimeter?"}])
    assert appended["status"] == "exact-prefix" and appended["reused_tokens"] == 0
    assert appended["exact_prefix_tokens"] >= inserted["prompt_tokens"] - 1


def test_shift_only_needs_a_prompt_cache_that_shifts(monkeypatch):
    """The server asks the engine's prompt cache what it can do, never the engine's name: one
    whose kept prompts cannot be cut into spans refuses shift-only reuse at start."""
    from types import SimpleNamespace

    from codekv.serve import engine as serve_engine
    from codekv.serve.prefix import ExactPrefixLRU
    from codekv.serve.prompt_cache import KVPrompts, PromptCache

    class Unshifting(PromptCache):
        def __init__(self, backend, budget_bytes):
            self.prefix = ExactPrefixLRU(1 << 20)

    assert KVPrompts.supports_shift and not Unshifting.supports_shift
    monkeypatch.setattr(serve_engine, "prompt_cache", Unshifting)
    backend = SimpleNamespace(info=SimpleNamespace(engine="toy"))
    with pytest.raises(ValueError, match="shift-only reuse shifts spans"):
        serve_engine.Engine(backend, None, None, reuse="shift-only")