"""Chunks: the units whose KV is cached, cut from a parsed file along syntax.

The rules follow cAST: definitions are chunks of their own; a class that exceeds the budget
becomes a header chunk plus one chunk per method; an oversized node splits at statement
boundaries; small non-definition siblings (imports, constants, loose statements) merge into
module chunks up to the budget. A chunk's text is always the exact byte slice of its blob.

Parts number the pieces of one definition cut for size, never different definitions that share
a name (two C ``main``s, Java overloads, a Rust struct and its ``impl`` blocks): those are
distinct chunks, told apart by their lines. Every definition the chunker meets, also one inside
a class kept whole, is listed in the file's outline with its byte span, so that
``PATH::Class.method`` can be addressed (see ``codekv.address``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from codekv.grammars import LanguageSpec, definition_name

# Bump when chunk boundaries change: it is part of every chunk id, so it retires every stored
# chunk and its cached KV.
CHUNKER_VERSION = "3"
# A language's own boundary version, bumped when only its chunking changes: only its chunk ids
# (and their cached KV) are renewed. go 1: an oversized interface splits into its methods.
LANGUAGE_VERSIONS = {"go": "1"}
# Bump when what is read from a chunk changes but not its bytes (anchors, definitions, the
# outline): every blob is analysed again, and chunk ids (and their cached KV) stay.
ANALYSIS_VERSION = "2"
DEFAULT_BUDGET = 512
# Deeper nesting (of classes, namespaces, statements, preprocessor blocks) is not cut further:
# the deep node stays whole in its chunk. A fixed depth, not Python's recursion limit, so
# that boundaries never depend on the caller's stack.
MAX_DEPTH = 64


class Anchor(NamedTuple):
    """A token span worth recomputing: a call, branch, return, assignment, def, use or import.

    Immutable like a frozen dataclass, but a tuple: indexing makes 655k of them for the
    standard library, where a tuple is built in a third of the time.
    """

    kind: str
    name: str
    start_byte: int
    end_byte: int
    # A ``use`` anchor's definition: the chunk id the def-use graph resolved the name to
    # (``Index.anchors`` adds uses); None for the anchors analysis finds in one blob.
    target: str | None = None


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
    version = LANGUAGE_VERSIONS.get(language)
    if version:
        chunker = f"{chunker}:{language}-{version}"
    key = f"{blob_hash}:{language}:{start}:{end}:{chunker}".encode()
    return hashlib.sha256(key).hexdigest()[:24]


class Outlined(NamedTuple):
    """A definition's (or a namespace's) qualified name, kind and span in its file."""

    qualname: str
    kind: str
    start_byte: int
    end_byte: int
    start_line: int = 0  # 1-based, inclusive; set by the analysis
    end_line: int = 0


@dataclass
class _Piece:
    kind: str
    start: int
    end: int
    name: str | None = None
    qualname: str | None = None
    parent: str | None = None
    owner: int | None = None  # which definition (in outline order) the piece is a part of


def number_parts(pieces: list[_Piece]) -> list[int]:
    """Part numbers: 0 for a node kept whole, 1.. for the pieces of one split definition."""
    totals: dict[int, int] = {}
    for piece in pieces:
        if piece.owner is not None:
            totals[piece.owner] = totals.get(piece.owner, 0) + 1
    seen: dict[int, int] = {}
    parts = []
    for piece in pieces:
        if piece.owner is not None and totals[piece.owner] > 1:
            seen[piece.owner] = seen.get(piece.owner, 0) + 1
            parts.append(seen[piece.owner])
        else:
            parts.append(0)
    return parts


class Chunker:
    """Cuts one file of one language into pieces under a token budget, and outlines it."""

    def __init__(self, spec: LanguageSpec, count, budget: int = DEFAULT_BUDGET, fits=None):
        self.spec = spec
        self.count = count  # count(start_byte, end_byte) -> tokens
        self.budget = budget
        # fits(start_byte, end_byte) -> whether the range is within the budget; a counter
        # may answer it without counting (see TokenCounter.fits).
        self.fits = fits or (lambda start, end: count(start, end) <= budget)
        self.outline: list[Outlined] = []

    def pieces(self, root, source: bytes) -> list[_Piece]:
        """The file's pieces in order; ``self.outline`` then lists its named definitions."""
        self.source = source
        self.outline = []
        self._owners = 0
        out: list[_Piece] = []
        self._members(self._segments(root.named_children), _Piece("module", 0, 0), out, 0)
        return out

    # -- members of a module, class body or namespace ------------------------------------
    def _members(self, segments, owner: _Piece, out: list[_Piece], depth: int) -> None:
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
                    self._namespace(start, node, parent, out, depth)
                else:
                    loose.append((start, node.end_byte))
                continue
            flush()
            self._definition_chunks(start, node, definition, parent, out, depth)
        flush()

    def _segments(self, nodes, depth: int = 0):
        """Named children with the comments right above them folded in."""
        pending = None
        for node in self._flatten(nodes, depth):
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

    def _flatten(self, nodes, depth: int):
        """``nodes`` with transparent containers replaced by their children and own tokens."""
        for node in nodes:
            if node.type not in self.spec.transparent_types or depth >= MAX_DEPTH:
                yield node
                continue
            # Directive tokens (`#ifdef`, `#endif`, `extern`, braces) stay as loose text.
            children = (c for c in node.children if c.is_named or c.type.strip())
            yield from self._flatten(children, depth + 1)

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

    def _named(self, definition, parent):
        """(kind, name, qualname, parent) of a definition among ``parent``'s members."""
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
        return kind, name, qualname, parent

    def _owner(self, kind: str, qualname: str | None, start: int, end: int) -> int:
        """A new definition: listed in the outline when named; its number groups its parts."""
        if qualname:
            self.outline.append(Outlined(qualname, kind, start, end))
        self._owners += 1
        return self._owners

    def _definition_chunks(self, start, node, definition, parent, out, depth) -> None:
        kind, name, qualname, parent = self._named(definition, parent)
        end = node.end_byte
        owner = self._owner(kind, qualname, start, end)
        is_class = kind == "class"
        body = self._body(definition)
        if self.fits(start, end) or body is None or not body.named_children \
                or depth >= MAX_DEPTH:
            out.append(_Piece(kind, start, end, name, qualname, parent, owner))
            if is_class and body is not None and depth < MAX_DEPTH:
                self._outline(body, qualname, depth + 1)
            return
        if is_class:
            # The header (signature, docstring, fields) is the class chunk; members split off.
            members = list(self._segments(body.named_children, depth))
            first_def = next((s for s, n in members if self._definition(n) is not None), None)
            if first_def is not None:
                header_end = self._rstrip(start, self._line_start(first_def))
                out.append(_Piece(kind, start, header_end, name, qualname, parent, owner))
                holder = _Piece(kind, 0, 0, name, qualname, parent, owner)
                remaining = [(s, n) for s, n in members if s >= first_def]
                self._members(remaining, holder, out, depth + 1)
                return
        statements = _body_statements(body)
        self._split(start, end, statements, _Piece(kind, 0, 0, name, qualname, parent, owner),
                    out, depth)

    def _namespace(self, start, node, parent, out, depth) -> None:
        inner = self._unwrap(node)
        name = definition_name(self.spec, inner)
        qualname = f"{parent}.{name}" if parent and name else name
        owner = self._owner("module", qualname, start, node.end_byte)
        body = inner.child_by_field_name(self.spec.body_field)
        if self.fits(start, node.end_byte) or body is None or depth >= MAX_DEPTH:
            out.append(_Piece("module", start, node.end_byte, name, qualname, parent, owner))
            if body is not None and depth < MAX_DEPTH:
                self._outline(body, qualname, depth + 1)
            return
        holder = _Piece("module", 0, 0, name, qualname, parent, owner)
        self._members(self._segments(body.named_children, depth), holder, out, depth + 1)

    def _body(self, definition):
        """A definition's member or statement list: its body field, else for a type whose
        members no field holds (a Go interface) what the language's ``members_of`` finds."""
        body = definition.child_by_field_name(self.spec.body_field)
        if body is None and self.spec.members_of and definition.type in self.spec.class_types:
            body = self.spec.members_of(definition)
        return body

    def _outline(self, body, parent, depth) -> None:
        """Outline the members of a class or namespace kept whole in one chunk."""
        for start, node in self._segments(body.named_children, depth):
            definition = self._definition(node)
            if definition is not None:
                kind, _, qualname, _ = self._named(definition, parent)
                self._owner(kind, qualname, start, node.end_byte)
                inner = self._body(definition)
            elif self._is_namespace(node):
                inner = self._unwrap(node)
                name = definition_name(self.spec, inner)
                qualname = f"{parent}.{name}" if parent and name else name
                self._owner("module", qualname, start, node.end_byte)
                inner = inner.child_by_field_name(self.spec.body_field)
            else:
                continue
            if inner is not None and qualname and depth < MAX_DEPTH and (
                definition is None or definition.type in self.spec.class_types
            ):
                self._outline(inner, qualname, depth + 1)

    # -- splitting and merging ---------------------------------------------------------
    def _split(self, start, end, statements, owner: _Piece, out, depth) -> None:
        """Split an oversized node at statement boundaries into contiguous pieces."""
        cuts = [start]
        self._cut(statements, cuts, end, depth)
        cuts.append(end)
        for a, b in zip(cuts, cuts[1:]):
            out.append(replace(owner, start=a, end=self._rstrip(a, b)))

    def _cut(self, statements, cuts: list[int], end: int, depth: int) -> None:
        """Greedy cuts before statements; a statement too big alone is cut inside, down to
        ``MAX_DEPTH``. The last statement carries what closes its block (``}``) up to ``end``:
        the piece ending there must fit too."""
        last = len(statements) - 1
        for index, node in enumerate(statements):
            stop = max(end, node.end_byte) if index == last else node.end_byte
            if self.fits(cuts[-1], stop):
                continue
            cut = self._line_start(node.start_byte)
            if cut > cuts[-1] and self._worth_cutting(cuts[-1], cut):
                cuts.append(cut)
            if not self.fits(cuts[-1], stop) and depth < MAX_DEPTH:
                inner = _statements_inside(node)
                if inner:
                    self._cut(inner, cuts, stop, depth + 1)

    def _worth_cutting(self, start: int, cut: int) -> bool:
        """A cut inside a line (a nested expression: `f(g(h(...` or minified code) is made only
        after a quarter of the budget; else deep nesting would cut a piece per bracket."""
        return self.source[cut - 1 : cut] == b"\n" or self.count(start, cut) >= self.budget // 4

    def _merge(self, ranges, owner: _Piece, out) -> None:
        """Merge consecutive small siblings into chunks of at most the budget."""
        groups: list[list[tuple[int, int]]] = []
        for start, end in ranges:
            if groups and self.fits(groups[-1][0][0], end):
                groups[-1].append((start, end))
            else:
                groups.append([(start, end)])
        for group in groups:
            out.append(replace(owner, start=group[0][0], end=group[-1][1]))

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
