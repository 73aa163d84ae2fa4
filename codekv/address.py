"""Addresses of indexed code: one syntax for ``show``, ``compose``, ``depends_on`` and ``used_by``.

    CHUNK_ID               a chunk's 24-hex-digit id
    PATH                   a whole file (``show``: its chunks; ``compose``: one span)
    PATH::QUALNAME         one definition: ``db.py::connect``, ``db.py::Pool.get``
    PATH::QUALNAME@LINE    the one of several same-name definitions whose lines hold LINE

PATH is relative to the repository root; ``./src/db.py``, ``src//db.py`` and an absolute path
inside the root name the same file. A file name may itself hold ``::`` (``a::b.py::f``): the
longest part before a ``::`` that is an indexed file is the path.

A definition is named as the chunker names it (``Class.method``, ``namespace.Class``, a Go
method by its receiver ``Server.Serve``) and resolves to its own span, whether it is a chunk,
the parts of one split by size, or a span inside its class's chunk.
"""

from __future__ import annotations

import difflib
import os
import posixpath
import re
from dataclasses import dataclass
from typing import Protocol

from codekv.chunks import Chunk, Outlined, chunk_id

SEPARATOR = "::"
_CHUNK_ID = re.compile(r"[0-9a-f]{24}")
_AT_LINE = re.compile(r"(.+)@([0-9]+)")


class AddressError(KeyError):
    """An address that names nothing, or several definitions; the message says what to write."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


@dataclass(frozen=True)
class Address:
    text: str
    path: str | None = None
    qualname: str | None = None
    line: int | None = None
    chunk_id: str | None = None


@dataclass
class Target:
    """What an address names: the stored chunks within it, and all of it as one chunk."""

    chunks: list[Chunk]  # stored chunks, in file order; a span inside a chunk: that span
    span: Chunk  # one stored chunk, or a span made of the bytes the address names


class Indexed(Protocol):
    """What resolving an address reads of an index (``codekv.Index`` implements it); declared
    here so that this module needs nothing of the index module, which uses it."""

    root: str
    boundaries: str  # the chunker version chunk ids are made with

    def has_file(self, path: str) -> bool: ...

    def chunk(self, chunk_id: str) -> Chunk: ...

    def chunks(self, path: str | None = None) -> list[Chunk]: ...

    def outline(self, path: str) -> list[Outlined]: ...

    def blob(self, chunk: Chunk) -> bytes: ...

    def count_tokens(self, data: bytes, start: int, end: int) -> int: ...


def parse(text: str, is_file, root: str | None = None) -> Address:
    """Split ``text`` into path, qualified name and line; ``is_file(path)`` says which paths
    are indexed (they decide where a path holding ``::`` ends)."""
    text = text.strip()
    if _CHUNK_ID.fullmatch(text) and not is_file(text):
        return Address(text, chunk_id=text)
    # The longest prefix ending before a separator (or the whole text) that is a file.
    ends = [len(text)] + [m.start() for m in re.finditer(re.escape(SEPARATOR), text)][::-1]
    for end in ends:
        path = normalize(text[:end], root)
        if is_file(path):
            rest = text[end + len(SEPARATOR):] if end < len(text) else ""
            break
    else:
        path = normalize(text.split(SEPARATOR, 1)[0], root)
        raise AddressError(f"no indexed file {path!r} in the address {text!r}")
    if not rest:
        return Address(text, path)
    line = None
    match = _AT_LINE.fullmatch(rest)
    if match:
        rest, line = match.group(1), int(match.group(2))
    return Address(text, path, rest, line)


def normalize(path: str, root: str | None = None) -> str:
    """A repository-relative path: ``./a.py`` and ``a//b.py`` as indexed, an absolute path
    inside ``root`` made relative to it."""
    if root is not None and os.path.isabs(path):
        relative = os.path.relpath(path, root)
        if not relative.startswith(os.pardir):
            path = relative
    return posixpath.normpath(path) if path else path


def resolve(index: Indexed, item: str | Chunk) -> Target:
    """The chunks ``item`` (an address or a ``Chunk``) names in ``index``."""
    if isinstance(item, Chunk):
        return Target([item], item)
    address = parse(item, index.has_file, index.root)
    if address.chunk_id is not None:
        try:
            chunk = index.chunk(address.chunk_id)
        except KeyError as error:
            raise AddressError(error.args[0]) from None
        return Target([chunk], chunk)
    chunks = index.chunks(address.path)
    if not chunks:
        raise AddressError(
            f"no chunk of {address.path!r} in the index: the file has no code to cache, or "
            "another version of codekv indexed it (run `codekv index`)"
        )
    if address.qualname is None:
        whole = chunks[0] if len(chunks) == 1 else _span(
            index, chunks, chunks[0].start_byte, chunks[-1].end_byte, "module", None
        )
        return Target(chunks, whole)
    definition = _definition(address, index.outline(address.path))
    start, end = definition.start_byte, definition.end_byte
    inside = [c for c in chunks if start <= c.start_byte and c.end_byte <= end]
    if inside and inside[0].start_byte == start:
        if len(inside) == 1:
            return Target(inside, inside[0])
        return Target(inside, _span(index, inside, start, end, definition.kind,
                                    definition.qualname))
    # A definition inside a chunk: a method of a class kept whole.
    holders = [c for c in chunks if c.start_byte <= start and end <= c.end_byte]
    span = _span(index, holders, start, end, definition.kind, definition.qualname)
    return Target([span], span)


def _definition(address: Address, outline: list[Outlined]) -> Outlined:
    named = [d for d in outline if d.qualname == address.qualname]
    found = named
    if address.line is not None:
        found = [d for d in named if d.start_line <= address.line <= d.end_line]
    if len(found) == 1:
        return found[0]
    where = f"{address.path}::{address.qualname}"
    if not found:
        if named:
            raise AddressError(
                f"no definition {where} holds line {address.line}; there are: "
                + ", ".join(_address(address.path, d) for d in named)
            )
        close = difflib.get_close_matches(address.qualname, {d.qualname for d in outline}, 3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise AddressError(f"no chunk matches {address.text!r}: no definition "
                           f"{address.qualname!r} in {address.path}{hint}")
    raise AddressError(
        f"{where} is ambiguous: {len(found)} definitions share the name; address one of them "
        "as " + ", ".join(f"{_address(address.path, d)} ({d.kind}, lines "
                          f"{d.start_line}-{d.end_line})" for d in found)
    )


def _address(path: str, definition: Outlined) -> str:
    return f"{path}{SEPARATOR}{definition.qualname}@{definition.start_line}"


def _span(index: Indexed, chunks: list[Chunk], start: int, end: int, kind: str,
          qualname: str | None) -> Chunk:
    """Bytes [start, end) of the chunks' file as one chunk: its anchors are theirs within it."""
    first = chunks[0]
    data = index.blob(first)
    return Chunk(
        id=chunk_id(first.blob_hash, first.language, start, end, index.boundaries),
        blob_hash=first.blob_hash, language=first.language, kind=kind,
        name=qualname.rpartition(".")[2] if qualname else None, qualname=qualname,
        parent=qualname.rpartition(".")[0] or None if qualname else None, part=0,
        start_byte=start, end_byte=end,
        start_line=data.count(b"\n", 0, start) + 1,
        end_line=data.count(b"\n", 0, max(start, end - 1)) + 1,
        n_tokens=index.count_tokens(data, start, end),
        anchors=[a for c in chunks for a in c.anchors
                 if start <= a.start_byte and a.end_byte <= end],
        path=first.path,
    )
