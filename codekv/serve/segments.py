"""Where a rendered prompt's reusable segments are, what class the gate rules on, and their keys.

Agents send no separators: a segment is found in the text itself. Each message's content is
located in the prompt the chat template rendered; inside it, every fenced code block is a
segment, and so is every run of text between blocks (the whole content when it has none).
Tool descriptions the template rendered are segments of their own. A segment is then the
prompt's tokens lying wholly inside its characters (tokens that straddle an edge stay with the
surrounding text), kept only when it has at least ``min_tokens`` of them.

A fenced block in a language the index parses is cut further, into the pieces the index cuts
a file of that language into (``CodeSplitter``): an edit inside one function then leaves the
block's other pieces reusable, and what is composed is the kind of chunk the gate's code
evidence was measured on.

Classes (what the support gate rules on): ``code`` for a fenced block in a language the index
parses (its tag, or a file name on the line before the fence, as aider writes it) or for text
that is an indexed file or chunk of a served repository; ``tool-doc`` for a tool's description;
``passage`` for the rest.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from codekv.analysis import Analyzer
from codekv.chunks import DEFAULT_BUDGET
from codekv.grammars import LANGUAGES, language_for_path
from codekv.schema import ChunkKind
from codekv.tokens import CounterSpec, default_counter_spec

MIN_TOKENS = 32  # smaller blocks cost more to look up and place than to compute
FENCE = re.compile(r"^(?P<fence>```+|~~~+)(?P<tag>[^\n`]*)\n(?P<body>.*?)^(?P=fence)[ \t]*$",
                   re.MULTILINE | re.DOTALL)
TAG_ALIASES = {"c++": "cpp", "golang": "go", "py": "python", "js": "javascript",
               "ts": "typescript", "rs": "rust", "jsx": "javascript"}


@dataclass(frozen=True)
class Span:
    """Characters ``[start, end)`` of the rendered prompt and the class they belong to."""

    start: int
    end: int
    kind: ChunkKind
    language: str | None = None


@dataclass(frozen=True)
class Segment:
    """A reusable run of the prompt's tokens ``[start, end)``."""

    start: int
    end: int
    kind: ChunkKind
    identity: str  # what its stored KV is keyed by, besides its tokens and what came before
    language: str | None = None  # a code segment's, where its fence names one

    @property
    def length(self) -> int:
        return self.end - self.start


def fence_language(tag: str, line_before: str) -> str | None:
    """The indexed language a fence is in: its tag (a name, alias or extension), else a file
    name alone on the line before it."""
    tag = tag.strip().split()[0].lower() if tag.strip() else ""
    if tag:
        tag = TAG_ALIASES.get(tag, tag)
        if tag in LANGUAGES:  # by name: parsed when its extensions are
            spec = language_for_path("file" + LANGUAGES[tag].extensions[0])
            return spec.name if spec else None
        spec = language_for_path(f"file.{tag}")
        return spec.name if spec else None
    name = line_before.strip().strip("`*:")
    if name and " " not in name:
        spec = language_for_path(name)
        return spec.name if spec else None
    return None


# body, language -> the character ranges of the body's pieces
Split = Callable[[str, str], list[tuple[int, int]]]


class CodeSplitter:
    """Cuts a code block into the pieces the index would cut a file of its language into
    (``Analyzer.cut``: definitions, and the statements between them, under the chunk budget),
    counting tokens as the index does, so the same text is cut the same way in every
    request."""

    def __init__(self, counter: CounterSpec | None = None, budget: int = DEFAULT_BUDGET):
        self.analyzer = Analyzer(counter or default_counter_spec(), budget)

    def __call__(self, body: str, language: str) -> list[tuple[int, int]]:
        source = body.encode()
        _, _, pieces = self.analyzer.cut(language, source)
        # Pieces start and end where syntax nodes do: on character boundaries.
        return [(len(source[:piece.start].decode()), len(source[:piece.end].decode()))
                for piece in pieces]


def content_spans(text: str, start: int, end: int, known_code: frozenset[str],
                  split: Split | None = None) -> list[Span]:
    """The spans of one message's content ``text[start:end]``: its fenced blocks' bodies (a
    block in a parsed language cut into pieces by ``split``) and the runs of text between
    them."""
    content = text[start:end]
    spans: list[Span] = []
    cursor = 0
    for match in FENCE.finditer(content):
        if match.start() > cursor:
            spans.append(_text_span(content, start, cursor, match.start(), known_code))
        line_before = content[:match.start()].rstrip("\n").rpartition("\n")[2]
        language = fence_language(match["tag"], line_before)
        body, base = match["body"], start + match.start("body")
        pieces = split(body, language) if split is not None and language is not None else []
        if pieces:
            spans += [Span(base + first, base + last, ChunkKind.CODE, language)
                      for first, last in pieces]
        else:
            code = language is not None or _digest(body) in known_code
            kind = ChunkKind.CODE if code else ChunkKind.PASSAGE
            spans.append(Span(base, base + len(body), kind, language))
        cursor = match.end()
    if cursor < len(content):
        spans.append(_text_span(content, start, cursor, len(content), known_code))
    return spans


def _text_span(content: str, base: int, start: int, end: int, known_code: frozenset[str]
               ) -> Span:
    kind = ChunkKind.CODE if _digest(content[start:end]) in known_code else ChunkKind.PASSAGE
    return Span(base + start, base + end, kind)


def _digest(text: str) -> str:
    """How served repositories' files and chunks are recognised: by their text, edges
    trimmed (a message adds its own blank lines)."""
    return hashlib.sha256(text.strip().encode()).hexdigest()


def known_code_digests(texts) -> frozenset[str]:
    return frozenset(_digest(text) for text in texts if text.strip())


def prompt_spans(text: str, contents: list[str], tool_docs: list[str],
                 known_code: frozenset[str] = frozenset(), split: Split | None = None
                 ) -> list[Span]:
    """Every span of the rendered prompt ``text``: each message content found in order (one a
    template rewrote is not found, and stays plain prompt), its code blocks cut by ``split``,
    and each tool description."""
    spans: list[Span] = []
    cursor = 0
    for content in contents:
        if not content:
            continue
        at = text.find(content, cursor)
        if at < 0:
            continue
        spans += content_spans(text, at, at + len(content), known_code, split)
        cursor = at + len(content)
    for doc in tool_docs:
        at = text.find(doc)
        if at >= 0:
            spans.append(Span(at, at + len(doc), ChunkKind.TOOL_DOC))
    # A tool description inside a message's span wins: drop what it overlaps.
    tools = [s for s in spans if s.kind == ChunkKind.TOOL_DOC]
    spans = [s for s in spans if s.kind == ChunkKind.TOOL_DOC
             or not any(t.start < s.end and s.start < t.end for t in tools)]
    return sorted(spans, key=lambda s: s.start)


def tool_descriptions(tools: list[dict]) -> list[str]:
    """The forms a template may render a tool in (its JSON, or its function's)."""
    docs: list[str] = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        for item in (tool, function):
            if isinstance(item, dict):
                docs += [json.dumps(item, ensure_ascii=ascii, indent=indent)
                         for ascii in (False, True) for indent in (None, 2, 4)]
    return list(dict.fromkeys(docs))


def token_segments(spans: list[Span], offsets: list[tuple[int, int]], token_ids: list[int],
                   min_tokens: int = MIN_TOKENS) -> list[Segment]:
    """Each span as the tokens wholly inside it, when there are at least ``min_tokens``;
    keyed by the tokens themselves (their hash rides in the store key as well)."""
    segments = []
    index = 0
    for span in spans:
        while index < len(offsets) and offsets[index][0] < span.start:
            index += 1
        first = index
        last = first
        while last < len(offsets) and offsets[last][1] <= span.end:
            last += 1
        # A token that ends at the span's start but begins before it belongs outside.
        if last - first >= min_tokens:
            ids = token_ids[first:last]
            digest = hashlib.sha256(json.dumps(ids).encode()).hexdigest()
            segments.append(Segment(first, last, span.kind, f"segment:{digest}",
                                    span.language))
        index = last
    return segments
