"""Analysis of one blob: chunks, their anchors, and the definitions, references and imports
the def-use graph is built from. A pure function of (language, bytes), run in worker processes
and stored per blob, so an unchanged blob is never analysed twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tree_sitter import QueryCursor

from codekv import grammars
from codekv.chunks import (
    CHUNKER_VERSION,
    DEFAULT_BUDGET,
    Anchor,
    Chunk,
    Chunker,
    chunk_id,
    number_parts,
    text_pieces,
)
from codekv.tokens import CounterSpec, TokenCounter

TEXT = "text"


@dataclass(frozen=True)
class Definition:
    name: str
    kind: str
    chunk_id: str
    start_byte: int


@dataclass(frozen=True)
class Reference:
    name: str
    kind: str
    chunk_id: str
    start_byte: int
    end_byte: int


@dataclass(frozen=True)
class Import:
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
    syntax_errors: int = 0
    decode_errors: bool = False

    @property
    def chunk_ids(self) -> list[str]:
        return [chunk.id for chunk in self.chunks]


def chunker_version(counter: CounterSpec, budget: int) -> str:
    """Everything chunk boundaries depend on, in one string stored with each blob."""
    return f"{CHUNKER_VERSION}:{counter.fingerprint}:{budget}"


class Analyzer:
    """Analyses blobs; one per process, holding the token counter and compiled queries."""

    def __init__(self, counter: CounterSpec, budget: int = DEFAULT_BUDGET):
        self.counter = TokenCounter(counter)
        self.budget = budget
        self.chunker = chunker_version(counter, budget)
        self._parsers: dict[str, object] = {}

    def analyze(self, blob_hash: str, language: str, source: bytes) -> BlobAnalysis:
        self.counter.reset(source)
        decode_errors = _has_decode_errors(source)
        if language == TEXT:
            pieces = text_pieces(source, self.counter.count, self.budget)
            chunks = self._chunks(blob_hash, language, source, pieces)
            return BlobAnalysis(blob_hash, language, self.chunker, chunks, decode_errors=decode_errors)
        spec = grammars.LANGUAGES[language]
        parser = self._parsers.get(language) or self._parsers.setdefault(
            language, grammars.parser(language)
        )
        tree = parser.parse(source)
        pieces = Chunker(spec, self.counter.count, self.budget).pieces(tree.root_node, source)
        chunks = self._chunks(blob_hash, language, source, pieces)
        analysis = BlobAnalysis(
            blob_hash,
            language,
            self.chunker,
            chunks,
            syntax_errors=_count_errors(tree.root_node),
            decode_errors=decode_errors,
        )
        _extract(analysis, grammars.query(language), tree.root_node)
        return analysis

    def _chunks(self, blob_hash, language, source, pieces) -> list[Chunk]:
        chunks = []
        for piece, part in zip(pieces, number_parts(pieces)):
            chunks.append(
                Chunk(
                    id=chunk_id(blob_hash, language, piece.start, piece.end, self.chunker),
                    blob_hash=blob_hash,
                    language=language,
                    kind=piece.kind,
                    name=piece.name,
                    qualname=piece.qualname,
                    parent=piece.parent,
                    part=part,
                    start_byte=piece.start,
                    end_byte=piece.end,
                    start_line=source.count(b"\n", 0, piece.start) + 1,
                    end_line=source.count(b"\n", 0, max(piece.start, piece.end - 1)) + 1,
                    n_tokens=self.counter.count(piece.start, piece.end),
                )
            )
        return chunks


def _text(node) -> str:
    return node.text.decode("utf-8", "replace")


def _has_decode_errors(source: bytes) -> bool:
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


class _ChunkLocator:
    """Maps a byte offset to the chunk holding it (chunks do not overlap)."""

    def __init__(self, chunks: list[Chunk]):
        self.chunks = sorted(chunks, key=lambda c: c.start_byte)
        self.starts = [c.start_byte for c in self.chunks]

    def at(self, offset: int) -> Chunk | None:
        import bisect

        index = bisect.bisect_right(self.starts, offset) - 1
        if index >= 0 and offset < self.chunks[index].end_byte:
            return self.chunks[index]
        return None


def _extract(analysis: BlobAnalysis, query, root) -> None:
    """Turn query matches into anchors (per chunk), definitions, references and imports."""
    locate = _ChunkLocator(analysis.chunks).at
    seen: set[tuple] = set()

    def anchor(kind: str, name: str, node) -> Chunk | None:
        chunk = locate(node.start_byte)
        if chunk is None:
            return None
        key = (kind, node.start_byte, node.end_byte, name)
        if key not in seen:
            seen.add(key)
            chunk.anchors.append(Anchor(kind, name, node.start_byte, node.end_byte))
        return chunk

    for _, captures in QueryCursor(query).matches(root):
        names = captures.get("name", [])
        for capture, nodes in captures.items():
            node = nodes[0]
            if capture.startswith("definition."):
                for name_node in names:
                    chunk = anchor("def", _text(name_node), name_node)
                    if chunk is not None:
                        analysis.definitions.append(
                            Definition(_text(name_node), capture[11:], chunk.id, node.start_byte)
                        )
            elif capture == "call" or capture.startswith("reference."):
                kind = "call" if capture == "call" else capture[10:]
                for name_node in names:
                    chunk = locate(name_node.start_byte)
                    if chunk is None:
                        continue
                    if capture == "call":
                        anchor("call", _text(name_node), node)
                    analysis.references.append(
                        Reference(
                            _text(name_node), kind, chunk.id, name_node.start_byte, name_node.end_byte
                        )
                    )
            elif capture in ("branch", "return"):
                anchor(capture, node.type, node)
            elif capture == "assign":
                for name_node in names:
                    anchor("assign", _text(name_node), name_node)
            elif capture == "import":
                # A nested Rust use tree splits the path over several captures: join them.
                parts = sorted(captures.get("module", []), key=lambda n: n.start_byte)
                module = "::".join(_text(n) for n in parts)
                name = _text(names[0]) if names else None
                alias = _text(captures["alias"][0]) if "alias" in captures else None
                chunk = anchor("import", alias or name or module, node)
                if chunk is not None:
                    analysis.imports.append(Import(module, name, alias, chunk.id))
    for chunk in analysis.chunks:
        chunk.anchors.sort(key=lambda a: (a.start_byte, a.end_byte, a.kind))
