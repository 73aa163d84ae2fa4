"""Chunks: the units whose KV is cached, cut from a parsed file along syntax.

The rules follow cAST: definitions are chunks of their own; a class that exceeds the budget
becomes a header chunk plus one chunk per method; an oversized node splits at statement
boundaries; small non-definition siblings (imports, constants, loose statements) merge into
module chunks up to the budget. A chunk's text is always the exact byte slice of its blob.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import NamedTuple

from codekv.grammars import LanguageSpec, definition_name

# Bump when chunk boundaries or anchor rules change: it retires every stored chunk.
CHUNKER_VERSION = "1"
DEFAULT_BUDGET = 512


class Anchor(NamedTuple):
    """A token span worth recomputing: a call, branch, return, assignment, def, use or import.

    Immutable like a frozen dataclass, but a tuple: indexing makes 655k of them for the
    standard library, where a tuple is built in a third of the time.
    """

    kind: str
    name: str
    start_byte: int
    end_byte: int


@dataclass
class Chunk:
    id: str
    blob_hash: str
    language: str
    kind: str  # module, function, class, method, text
    name: str | None
    qualname: str | None
    parent: str | None
    part: int  # 0 for a whole node, 1.. for the pieces of a split one
    start_byte: int
    end_byte: int
    start_line: int  # 1-based, inclusive
    end_line: int
    n_tokens: int
    anchors: list[Anchor] = field(default_factory=list)
    path: str | None = None  # set when read through an Index: a blob may sit at several paths

    def text(self, blob: bytes) -> bytes:
        return blob[self.start_byte : self.end_byte]


def chunk_id(blob_hash: str, language: str, start: int, end: int, chunker: str) -> str:
    """Stable identity: the same blob chunked by the same chunker gets the same ids."""
    key = f"{blob_hash}:{language}:{start}:{end}:{chunker}".encode()
    return hashlib.sha256(key).hexdigest()[:24]


@dataclass
class _Piece:
    kind: str
    start: int
    end: int
    name: str | None = None
    qualname: str | None = None
    parent: str | None = None


def number_parts(pieces: list[_Piece]) -> list[int]:
    """Part numbers: 0 for a node kept whole, 1.. for the pieces of one split node."""
    totals: dict[tuple, int] = {}
    for piece in pieces:
        if piece.qualname:
            key = (piece.kind, piece.qualname)
            totals[key] = totals.get(key, 0) + 1
    seen: dict[tuple, int] = {}
    parts = []
    for piece in pieces:
        key = (piece.kind, piece.qualname)
        if piece.qualname and totals[key] > 1:
            seen[key] = seen.get(key, 0) + 1
            parts.append(seen[key])
        else:
            parts.append(0)
    return parts


class Chunker:
    """Cuts one file of one language into pieces under a token budget."""

    def __init__(self, spec: LanguageSpec, count, budget: int = DEFAULT_BUDGET, fits=None):
        self.spec = spec
        self.count = count  # count(start_byte, end_byte) -> tokens
        self.budget = budget
        # fits(start_byte, end_byte) -> whether the range is within the budget; a counter
        # may answer it without counting (see TokenCounter.fits).
        self.fits = fits or (lambda start, end: count(start, end) <= budget)

    def pieces(self, root, source: bytes) -> list[_Piece]:
        self.source = source
        out: list[_Piece] = []
        self._members(self._segments(root.named_children), _Piece("module", 0, 0), out)
        return out

    # -- members of a module, class body or namespace ------------------------------------
    def _members(self, segments, owner: _Piece, out: list[_Piece]) -> None:
        """Chunk a sequence of sibling segments; loose statements take ``owner``'s kind and name."""
        parent = owner.qualname if owner.kind != "module" or owner.qualname else None
        loose: list[tuple[int, int]] = []  # byte ranges of non-definition siblings

        def flush():
            self._merge(loose, owner, out)
            loose.clear()

        for start, node in segments:
            definition = self._definition(node)
            if definition is None:
                if self._is_namespace(node):
                    flush()
                    self._namespace(start, node, parent, out)
                else:
                    loose.append((start, node.end_byte))
                continue
            flush()
            self._definition_chunks(start, node, definition, parent, out)
        flush()

    def _segments(self, nodes):
        """Named children with the comments right above them folded in."""
        pending = None
        for node in self._flatten(nodes):
            if node.type in self.spec.comment_types:
                if pending is None or not self._adjacent(pending[1], node):
                    if pending is not None:
                        yield pending[0], pending[1]
                    pending = (node.start_byte, node)
                else:
                    pending = (pending[0], node)
                continue
            if pending is not None:
                if self._adjacent(pending[1], node) and (
                    self._definition(node) is not None or self._is_namespace(node)
                ):
                    yield pending[0], node
                    pending = None
                    continue
                yield pending[0], pending[1]
                pending = None
            yield node.start_byte, node
        if pending is not None:
            yield pending[0], pending[1]

    def _flatten(self, nodes):
        """``nodes`` with transparent containers replaced by their children and own tokens."""
        for node in nodes:
            if node.type not in self.spec.transparent_types:
                yield node
                continue
            # Directive tokens (`#ifdef`, `#endif`, `extern`, braces) stay as loose text.
            yield from self._flatten(c for c in node.children if c.is_named or c.type.strip())

    @staticmethod
    def _adjacent(above, below) -> bool:
        return below.start_point[0] - above.end_point[0] <= 1

    def _is_namespace(self, node) -> bool:
        """A namespace with a body (Rust ``mod a;`` without one is a loose statement)."""
        node = self._unwrap(node)  # TypeScript: `export namespace`, `declare module`
        return (
            node is not None
            and node.type in self.spec.namespace_types
            and node.child_by_field_name(self.spec.body_field) is not None
        )

    def _definition(self, node):
        """The function or class node that ``node`` is or wraps, else None."""
        node = self._unwrap(node)
        if node is None:
            return None
        if node.type in self.spec.function_types or node.type in self.spec.class_types:
            return node
        return None

    def _unwrap(self, node):
        """The node inside ``node``'s wrappers (decorators, export, declarations), or None."""
        while node.type in self.spec.wrapper_types:
            inner = next(
                (c for c in map(node.child_by_field_name, self.spec.wrapped_fields) if c), None
            )
            if inner is None:
                comments = self.spec.comment_types
                inner = next(
                    (c for c in reversed(node.named_children) if c.type not in comments), None
                )
            if inner is None:
                return None
            node = inner
        return node

    def _definition_chunks(self, start, node, definition, parent, out) -> None:
        name = definition_name(self.spec, definition)
        is_class = definition.type in self.spec.class_types
        if not is_class and self.spec.owner_of is not None:
            # A method declared outside its type: Go receivers, C++ `Box::get` (maybe in a
            # namespace block, whose name then comes first).
            owner = self.spec.owner_of(definition)
            if owner:
                parent = f"{parent}.{owner}" if parent else owner
        qualname = f"{parent}.{name}" if parent and name else name
        kind = "class" if is_class else ("method" if parent else "function")
        end = node.end_byte
        if self.fits(start, end):
            out.append(_Piece(kind, start, end, name, qualname, parent))
            return
        body = definition.child_by_field_name(self.spec.body_field)
        if body is None or not body.named_children:
            out.append(_Piece(kind, start, end, name, qualname, parent))
            return
        if is_class:
            # The header (signature, docstring, fields) is the class chunk; members split off.
            members = list(self._segments(body.named_children))
            first_def = next((s for s, n in members if self._definition(n) is not None), None)
            if first_def is not None:
                header_end = self._rstrip(start, self._line_start(first_def))
                out.append(_Piece(kind, start, header_end, name, qualname, parent))
                owner = _Piece(kind, 0, 0, name, qualname, parent)
                self._members([(s, n) for s, n in members if s >= first_def], owner, out)
                return
        self._split(start, end, _body_statements(body), kind, name, qualname, parent, out)

    def _namespace(self, start, node, parent, out) -> None:
        inner = self._unwrap(node)
        name = definition_name(self.spec, inner)
        qualname = f"{parent}.{name}" if parent and name else name
        body = inner.child_by_field_name(self.spec.body_field)
        if self.fits(start, node.end_byte) or body is None:
            out.append(_Piece("module", start, node.end_byte, name, qualname, parent))
            return
        owner = _Piece("module", 0, 0, name, qualname, parent)
        self._members(self._segments(body.named_children), owner, out)

    # -- splitting and merging ---------------------------------------------------------
    def _split(self, start, end, statements, kind, name, qualname, parent, out) -> None:
        """Split an oversized node at statement boundaries into contiguous pieces."""
        cuts = [start]
        self._cut(statements, cuts)
        cuts.append(end)
        for a, b in zip(cuts, cuts[1:]):
            out.append(_Piece(kind, a, self._rstrip(a, b), name, qualname, parent))

    def _cut(self, statements, cuts: list[int]) -> None:
        """Greedy cuts before statements; a statement too big alone is cut inside, recursively."""
        for node in statements:
            if self.fits(cuts[-1], node.end_byte):
                continue
            cut = self._line_start(node.start_byte)
            if cut > cuts[-1]:
                cuts.append(cut)
            if not self.fits(cuts[-1], node.end_byte):
                inner = _statements_inside(node)
                if inner:
                    self._cut(inner, cuts)

    def _merge(self, ranges, owner: _Piece, out) -> None:
        """Merge consecutive small siblings into chunks of at most the budget."""
        groups: list[list[tuple[int, int]]] = []
        for start, end in ranges:
            if groups and self.fits(groups[-1][0][0], end):
                groups[-1].append((start, end))
            else:
                groups.append([(start, end)])
        for group in groups:
            start, end = group[0][0], group[-1][1]
            out.append(_Piece(owner.kind, start, end, owner.name, owner.qualname, owner.parent))

    def _line_start(self, offset: int) -> int:
        """The start of the line holding ``offset`` when only indentation precedes it."""
        line_start = self.source.rfind(b"\n", 0, offset) + 1
        if self.source[line_start:offset].strip() == b"":
            return line_start
        return offset

    def _rstrip(self, start: int, end: int) -> int:
        while end > start and self.source[end - 1 : end] in (b" ", b"\t", b"\n", b"\r"):
            end -= 1
        return end


def _body_statements(body) -> list:
    """A body's statements, looking through a lone statement list (Go: block > statement_list)."""
    children = body.named_children
    while len(children) == 1 and children[0].type.endswith("_list") and children[0].named_children:
        children = children[0].named_children
    return children


def _statements_inside(node) -> list:
    """The statements nested in a compound statement: its blocks' children, else its children."""
    inner = []
    for child in node.named_children:
        if child.named_child_count and child.type.endswith(("block", "body", "clause", "list")):
            inner.extend(_body_statements(child))
        else:
            inner.append(child)
    return inner if len(inner) > 1 or (inner and inner[0].named_child_count) else []


def text_pieces(source: bytes, count, budget: int = DEFAULT_BUDGET) -> list[_Piece]:
    """Split a plain text file at line (preferably paragraph) boundaries under the budget."""
    pieces: list[_Piece] = []
    start = 0
    lines = source.splitlines(keepends=True)
    offset = 0
    last_blank = None
    for line in lines:
        end = offset + len(line)
        if offset > start and count(start, end) > budget:
            cut = last_blank if last_blank and last_blank > start else offset
            pieces.append(_Piece("text", start, cut))
            start = cut
        if not line.strip():
            last_blank = end
        offset = end
    if start < len(source):
        pieces.append(_Piece("text", start, len(source)))
    return [p for p in pieces if source[p.start : p.end].strip()]
