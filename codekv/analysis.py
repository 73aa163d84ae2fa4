"""Analysis of one blob: chunks, their anchors, and the definitions, references and imports
the def-use graph is built from. A pure function of (language, bytes), run in worker processes
and stored per blob, so an unchanged blob is never analysed twice.
"""

from __future__ import annotations

import bisect
import functools
import operator
from dataclasses import dataclass, field
from typing import NamedTuple

from tree_sitter import QueryCursor

from codekv import grammars
from codekv.chunks import (
    ANALYSIS_VERSION,
    CHUNKER_VERSION,
    DEFAULT_BUDGET,
    LANGUAGE_VERSIONS,
    Anchor,
    Chunk,
    Chunker,
    Outlined,
    chunk_id,
    number_parts,
    text_pieces,
)
from codekv.tokens import CounterSpec, TokenCounter

TEXT = "text"


# Tuples (immutable, hashable, compared by value), made by the hundred thousand per index.
class Definition(NamedTuple):
    name: str
    kind: str
    chunk_id: str
    start_byte: int


class Reference(NamedTuple):
    name: str
    kind: str
    chunk_id: str
    start_byte: int
    end_byte: int


class Import(NamedTuple):
    module: str
    name: str | None
    alias: str | None
    chunk_id: str


@dataclass
class BlobAnalysis:
    blob_hash: str
    language: str
    chunker: str
    chunks: list[Chunk]
    definitions: list[Definition] = field(default_factory=list)
    references: list[Reference] = field(default_factory=list)
    imports: list[Import] = field(default_factory=list)
    outline: list[Outlined] = field(default_factory=list)  # named definitions, with spans
    syntax_errors: int = 0
    decode_errors: bool = False

    @property
    def chunk_ids(self) -> list[str]:
        return [chunk.id for chunk in self.chunks]


def chunker_version(counter: CounterSpec, budget: int) -> str:
    """Everything chunk boundaries depend on, in one string: part of every chunk id."""
    return f"{CHUNKER_VERSION}:{counter.fingerprint}:{budget}"


def analysis_version(counter: CounterSpec, budget: int) -> str:
    """Everything a blob's stored analysis depends on: its boundaries and what is read from
    its chunks. Stored blobs are keyed by it; a new one analyses every blob again."""
    languages = "".join(f"/{name}-{v}" for name, v in sorted(LANGUAGE_VERSIONS.items()))
    return f"{chunker_version(counter, budget)}/{ANALYSIS_VERSION}{languages}"


class Analyzer:
    """Analyses blobs; one per process, holding the token counter and compiled queries."""

    def __init__(self, counter: CounterSpec, budget: int = DEFAULT_BUDGET):
        self.counter = TokenCounter(counter)
        self.budget = budget
        self.chunker = analysis_version(counter, budget)  # what blobs are stored under
        self.boundaries = chunker_version(counter, budget)  # what chunk ids are made of
        self._parsers: dict[str, object] = {}

    def analyze(self, blob_hash: str, language: str, source: bytes) -> BlobAnalysis:
        self.counter.reset(source)
        decode_errors = _has_decode_errors(source)
        if language == TEXT:
            pieces = text_pieces(source, self.counter.count, self.budget)
            chunks = self._chunks(blob_hash, language, source, pieces)
            return BlobAnalysis(
                blob_hash, language, self.chunker, chunks, decode_errors=decode_errors
            )
        tree, chunker, pieces = self.cut(language, source)
        chunks = self._chunks(blob_hash, language, source, pieces)
        lines = _LineNumbers(source)
        outline = [
            item._replace(start_line=lines.at(item.start_byte),
                          end_line=lines.at(max(item.start_byte, item.end_byte - 1)))
            for item in chunker.outline
        ]
        analysis = BlobAnalysis(
            blob_hash,
            language,
            self.chunker,
            chunks,
            outline=outline,
            syntax_errors=_count_errors(tree.root_node),
            decode_errors=decode_errors,
        )
        _extract(analysis, grammars.query(language), tree.root_node, source)
        return analysis

    def cut(self, language: str, source: bytes):
        """``source`` parsed as ``language`` (a parsed one), and cut into pieces under the
        budget: (its syntax tree, the chunker, which then holds its outline, the pieces)."""
        self.counter.reset(source)
        parser = self._parsers.get(language) or self._parsers.setdefault(
            language, grammars.parser(language)
        )
        tree = parser.parse(source)
        fits = functools.partial(self.counter.fits, budget=self.budget)
        chunker = Chunker(grammars.LANGUAGES[language], self.counter.count, self.budget, fits)
        return tree, chunker, chunker.pieces(tree.root_node, source)

    def _chunks(self, blob_hash, language, source, pieces) -> list[Chunk]:
        lines = _LineNumbers(source)
        count = self.counter.count
        chunks = []
        for piece, part in zip(pieces, number_parts(pieces)):
            start, end = piece.start, piece.end
            chunks.append(
                Chunk(
                    id=chunk_id(blob_hash, language, start, end, self.boundaries),
                    blob_hash=blob_hash,
                    language=language,
                    kind=piece.kind,
                    name=piece.name,
                    qualname=piece.qualname,
                    parent=piece.parent,
                    part=part,
                    start_byte=start,
                    end_byte=end,
                    start_line=lines.at(start),
                    end_line=lines.at(max(start, end - 1)),
                    n_tokens=count(start, end),
                )
            )
        return chunks


class _LineNumbers:
    """1-based line numbers of byte offsets; counting from the last offset asked, not from 0.

    Chunks come in file order, so each count scans only the bytes since the previous one
    (counting from 0 for every chunk made line numbering quadratic in the file size).
    """

    def __init__(self, source: bytes):
        self.source = source
        self.offset = 0
        self.line = 1

    def at(self, offset: int) -> int:
        if offset >= self.offset:
            self.line += self.source.count(b"\n", self.offset, offset)
        else:
            self.line -= self.source.count(b"\n", offset, self.offset)
        self.offset = offset
        return self.line


def _has_decode_errors(source: bytes) -> bool:
    if source.isascii():
        return False
    try:
        source.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _count_errors(root) -> int:
    """ERROR and MISSING nodes: the file is still chunked, the count is reported."""
    if not root.has_error:
        return 0
    count = 0
    stack = [root]
    while stack:
        node = stack.pop()
        if node.is_error or node.is_missing:
            count += 1
            continue
        stack.extend(child for child in node.children if child.has_error or child.is_missing)
    return count


# What each capture name does in ``_extract``.
_DEF, _CALL, _REF, _FLOW, _ASSIGN, _IMPORT = range(6)


class _Roles(dict):
    """capture name -> (role, kind), computed once per name (a dict lookup in the loop)."""

    def __missing__(self, capture: str) -> tuple[int | None, str]:
        role = self[capture] = _role(capture)
        return role


def _role(capture: str) -> tuple[int | None, str]:
    if capture.startswith("definition."):
        return _DEF, capture[11:]
    if capture == "call":
        return _CALL, "call"
    if capture.startswith("reference."):
        return _REF, capture[10:]
    if capture in ("branch", "return"):
        return _FLOW, capture
    if capture == "assign":
        return _ASSIGN, capture
    if capture == "import":
        return _IMPORT, capture
    return None, capture


def _extract(analysis: BlobAnalysis, query, root, source: bytes) -> None:
    """Turn query matches into anchors (per chunk), definitions, references and imports.

    The hot loop of indexing (a million captures in the standard library): node positions are
    read once, names are sliced from ``source``, and chunks are found by bisection.
    """
    ordered = sorted(analysis.chunks, key=lambda c: c.start_byte)
    starts = [c.start_byte for c in ordered]
    ends = [c.end_byte for c in ordered]
    definitions, references, imports = (
        analysis.definitions, analysis.references, analysis.imports
    )
    bisect_right = bisect.bisect_right
    seen: set[Anchor] = set()

    def locate(offset: int) -> Chunk | None:
        index = bisect_right(starts, offset) - 1
        if index >= 0 and offset < ends[index]:
            return ordered[index]
        return None

    def anchor(kind: str, name: str, start: int, end: int) -> Chunk | None:
        index = bisect_right(starts, start) - 1
        if index < 0 or start >= ends[index]:
            return None
        chunk = ordered[index]
        item = Anchor(kind, name, start, end)
        if item not in seen:
            seen.add(item)
            chunk.anchors.append(item)
        return chunk

    def spans(nodes) -> list[tuple[int, int, str]]:
        out = []
        for node in nodes:
            start, end = node.start_byte, node.end_byte
            out.append((start, end, source[start:end].decode("utf-8", "replace")))
        return out

    roles = _ROLES
    for _, captures in QueryCursor(query).matches(root):
        names = None
        for capture, nodes in captures.items():
            role, kind = roles[capture]
            if role is None:
                continue
            node = nodes[0]
            if role == _FLOW:
                anchor(kind, node.type, node.start_byte, node.end_byte)
                continue
            if role == _IMPORT:
                # A nested Rust use tree splits the path over several captures: join them.
                parts = sorted(spans(captures.get("module", ())), key=lambda span: span[0])
                module = "::".join(text for _, _, text in parts)
                first = captures.get("name")
                name = spans(first[:1])[0][2] if first else None
                alias = spans(captures["alias"][:1])[0][2] if "alias" in captures else None
                chunk = anchor("import", alias or name or module, node.start_byte, node.end_byte)
                if chunk is not None:
                    imports.append(Import(module, name, alias, chunk.id))
                continue
            if names is None:
                names = spans(captures.get("name", ()))
            if role == _DEF:
                for start, end, text in names:
                    chunk = anchor("def", text, start, end)
                    if chunk is not None:
                        definitions.append(Definition(text, kind, chunk.id, node.start_byte))
            elif role == _ASSIGN:
                for start, end, text in names:
                    anchor("assign", text, start, end)
            else:  # a call or another reference
                for start, end, text in names:
                    chunk = locate(start)
                    if chunk is None:
                        continue
                    if role == _CALL:
                        anchor("call", text, node.start_byte, node.end_byte)
                    references.append(Reference(text, kind, chunk.id, start, end))
    for chunk in analysis.chunks:
        chunk.anchors.sort(key=_ANCHOR_ORDER)


_ANCHOR_ORDER = operator.itemgetter(2, 3, 0)  # Anchor: start_byte, end_byte, kind
_ROLES = _Roles()
