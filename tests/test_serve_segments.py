"""How ``codekv serve`` finds, classes and keys a prompt's segments, and its exact-prefix cache."""

from __future__ import annotations

import json

import numpy as np
import pytest

from codekv.serve.prefix import ExactPrefixLRU
from codekv.serve.segments import (
    CodeSplitter,
    Span,
    fence_language,
    known_code_digests,
    prompt_spans,
    token_segments,
    tool_descriptions,
)
from codekv.tokens import CounterSpec

CODE = "def area(w, h):\n    return w * h\n"


def spans_text(text: str, spans: list[Span]) -> list[tuple[str, str]]:
    return [(s.kind, text[s.start:s.end]) for s in spans]


@pytest.mark.parametrize("tag, line_before, language", [
    ("python", "", "python"), ("py", "", "python"), ("Rust", "", "rust"), ("c++", "", "cpp"),
    ("ts", "", "typescript"), ("go title", "", "go"), ("text", "", None), ("", "", None),
    ("", "src/app.py", "python"), ("", "**lib/util.js**", "javascript"),
    ("", "see the file below", None), ("", "notes.md", None),
])
def test_fence_language(tag, line_before, language):
    assert fence_language(tag, line_before) == language


def test_a_message_splits_into_its_fenced_blocks_and_the_text_between():
    content = f"Here is a.py:\n```python\n{CODE}```\nand some notes\n~~~\nplain\n~~~\nDone?"
    text = f"<user>\n{content}\n<assistant>\n"
    spans = prompt_spans(text, [content], [])
    assert spans_text(text, spans) == [
        ("passage", "Here is a.py:\n"), ("code", CODE), ("passage", "\nand some notes\n"),
        ("passage", "plain\n"), ("passage", "\nDone?")]


def test_a_block_in_a_parsed_language_is_cut_as_the_index_cuts_its_file():
    two = "def area(w, h):\n    return w * h\n\n\ndef half(x):\n    return x / 2\n"
    content = f"```python\n{two}```\n```text\n{two}```\n"
    spans = prompt_spans(content, [content], [], split=CodeSplitter(CounterSpec("bytes")))
    assert spans_text(content, spans) == [
        ("code", "def area(w, h):\n    return w * h"), ("code", "def half(x):\n    return x / 2"),
        ("passage", "\n"), ("passage", two), ("passage", "\n")]  # no parsed language: whole
    # by characters, not bytes: a piece after non-ASCII text starts where its code does
    text = 'NAME = "Zoë"\n\n\ndef greet():\n    return NAME\n'
    assert [text[a:b] for a, b in CodeSplitter(CounterSpec("bytes"))(text, "python")] == [
        'NAME = "Zoë"', "def greet():\n    return NAME"]


def test_messages_are_found_in_order_and_a_rewritten_one_is_skipped():
    first, second = "same words", "same words"
    text = f"<system>\n{first}\n<user>\nSAME WORDS\n<user>\n{second}\n"
    spans = prompt_spans(text, [first, "rewritten by the template", second], [])
    assert [(s.start, s.end) for s in spans] == [(9, 19), (text.rindex(second),
                                                           text.rindex(second) + 10)]


def test_text_of_a_served_repository_is_code_whatever_its_fence_says():
    known = known_code_digests([CODE, "   "])
    content = f"```\n{CODE}```\n{CODE}"
    spans = prompt_spans(content, [content], [], known)
    assert [s.kind for s in spans] == ["code", "code"]
    assert [s.kind for s in prompt_spans(content, [content], [])] == ["passage", "passage"]


def test_tool_descriptions_are_their_own_segments():
    tool = {"type": "function", "function": {"name": "read", "description": "Read a file."}}
    rendered = json.dumps(tool, indent=4)  # as some templates write it
    text = f"<system>\nTools:\n{rendered}\nBe brief.\n<user>\nhi\n"
    system = f"Tools:\n{rendered}\nBe brief."
    spans = prompt_spans(text, [system, "hi"], tool_descriptions([tool]))
    kinds = spans_text(text, spans)
    assert ("tool-doc", rendered) in kinds
    assert all(kind != "passage" or rendered not in part for kind, part in kinds)


def test_segments_are_the_tokens_wholly_inside_and_large_enough():
    # Characters 0..9 as ten one-character tokens, and one token straddling 9..11.
    offsets = [(i, i + 1) for i in range(9)] + [(9, 11), (11, 12)]
    ids = list(range(100, 111))
    spans = [Span(2, 10, "code"), Span(11, 12, "passage")]
    segments = token_segments(spans, offsets, ids, min_tokens=3)
    assert [(s.start, s.end, s.kind) for s in segments] == [(2, 9, "code")]
    same = token_segments([Span(2, 10, "passage")], offsets, ids, min_tokens=3)
    assert same[0].identity == segments[0].identity  # keyed by tokens, not by class
    other = token_segments(spans, offsets, [t + 1 for t in ids], min_tokens=3)
    assert other[0].identity != segments[0].identity


def test_exact_prefix_cache_finds_the_longest_common_prefix_in_its_scope():
    cache = ExactPrefixLRU(budget_bytes=100)
    cache.put("a", [1, 2, 3, 4], "kv-1234", 10)
    cache.put("a", [1, 2, 9], "kv-129", 10)
    cache.put("b", [1, 2, 3, 4, 5], "kv-b", 10)
    assert cache.longest("a", [1, 2, 3, 7]) == (3, "kv-1234")
    assert cache.longest("a", [1, 2, 9, 9]) == (3, "kv-129")
    assert cache.longest("a", [5]) == (0, None)
    assert cache.longest("c", [1, 2, 3]) == (0, None)  # another scope's prompts never answer
    assert (cache.hits, cache.misses) == (2, 2)


def test_exact_prefix_cache_keeps_its_budget_least_recently_used_out_first():
    cache = ExactPrefixLRU(budget_bytes=25)
    cache.put("a", [1], "one", 10)
    cache.put("a", [2], "two", 10)
    cache.longest("a", [1])  # "one" is now the most recently used
    cache.put("a", [3], "three", 10)
    assert cache.bytes == 20
    assert [list(e.token_ids) for e in cache.entries.values()] == [[1], [3]]
    cache.put("a", [4], "too big", 26)
    assert cache.longest("a", [4]) == (0, None)


def test_a_prompt_extending_a_kept_one_replaces_it():
    cache = ExactPrefixLRU()
    cache.put("a", [1, 2], "short", 10)
    cache.put("a", [1, 2, 3], "long", 10)
    cache.put("a", [1], "shorter", 10)  # already covered: nothing added
    assert [np.asarray(e.token_ids).tolist() for e in cache.entries.values()] == [[1, 2, 3]]
    assert cache.bytes == 10


@pytest.mark.parametrize("args, message", [
    (["--host", "0.0.0.0"], "--host 0.0.0.0 is reachable from other machines: give --api-key"),
    (["--host", "192.168.1.5"], "give --api-key"),
    (["--strategy", "auto", "--ratio", "0.3"], "--ratio needs a named --strategy"),
    (["--store", "redis://localhost:notaport/0"], "bad port"),
])
def test_serve_refuses_before_loading_anything(args, message, monkeypatch):
    from click.testing import CliRunner

    from codekv.cli import main

    monkeypatch.delenv("CODEKV_API_KEY", raising=False)
    result = CliRunner().invoke(main, ["serve", *args])
    assert result.exit_code != 0 and message in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("::1", True),
                                            ("localhost", True), ("0.0.0.0", False),
                                            ("example.org", False)])
def test_loopback_hosts(host, loopback):
    from codekv.serve.command import is_loopback

    assert is_loopback(host) is loopback


def test_served_repositories_make_their_chunks_and_files_code(git_repo, byte_counter):
    from codekv.serve.command import _repo_code

    git_repo.commit({"util.py": "def helper(x):\n    return x + 1\n", "notes.txt": "hello\n"})
    known = _repo_code((str(git_repo.root),), None)
    assert known == known_code_digests(["def helper(x):\n    return x + 1\n", "hello\n"])
    content = "Here it is:\ndef helper(x):\n    return x + 1\n"
    spans = prompt_spans(content, ["Here it is:", "def helper(x):\n    return x + 1\n"], [],
                         known)
    assert [s.kind for s in spans] == ["passage", "code"]
