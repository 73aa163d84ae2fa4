"""Python chunks and anchors against a hand-checked fixture."""

SOURCE = '''\
import os
from pkg.util import helper as h

LIMIT = 10


# Comment that belongs to the function below.
def top(x):
    if x > LIMIT:
        return h(x)
    y = os.path.join(x)
    return y


class Box(Base):
    """A box."""

    size = 3

    def grow(self, n):
        for _ in range(n):
            self.size += 1
        yield self.size

    @property
    def empty(self):
        return self.size == 0 if self else None
'''


def _kinds(chunk):
    return sorted({a.kind for a in chunk.anchors})


def test_whole_definitions_are_chunks(analyze):
    result = analyze("python", SOURCE)
    shape = [(c.kind, c.qualname, c.start_line, c.end_line) for c in result.chunks]
    assert shape == [
        ("module", None, 1, 4),
        ("function", "top", 7, 12),
        ("class", "Box", 15, 27),
    ]
    assert result.chunks[1].text(SOURCE.encode()).startswith(b"# Comment that belongs")


def test_oversized_class_splits_into_header_and_methods(analyze):
    result = analyze("python", SOURCE, budget=140)
    shape = [(c.kind, c.qualname, c.parent, c.start_line, c.end_line) for c in result.chunks]
    assert shape == [
        ("module", None, None, 1, 4),
        ("function", "top", None, 7, 12),
        ("class", "Box", None, 15, 18),
        ("method", "Box.grow", "Box", 20, 23),
        ("method", "Box.empty", "Box", 25, 27),
    ]
    source = SOURCE.encode()
    for chunk in result.chunks:
        # Text is the exact byte slice of the blob and chunks never overlap.
        assert chunk.text(source) == source[chunk.start_byte : chunk.end_byte]
    ends = [c.end_byte for c in result.chunks]
    starts = [c.start_byte for c in result.chunks]
    assert all(end <= start for end, start in zip(ends, starts[1:]))


def test_anchors_by_kind(analyze):
    source = SOURCE.encode()
    result = analyze("python", SOURCE, budget=140)
    module, top, box, grow, empty = result.chunks
    found = lambda chunk, kind: [  # noqa: E731
        source[a.start_byte : a.end_byte].decode() for a in chunk.anchors if a.kind == kind
    ]
    assert found(module, "import") == ["import os", "from pkg.util import helper as h"]
    assert [a.name for a in module.anchors if a.kind == "import"] == ["os", "h"]
    assert found(top, "call") == ["h(x)", "os.path.join(x)"]
    assert [a.name for a in top.anchors if a.kind == "call"] == ["h", "join"]
    assert found(top, "branch") == ["if x > LIMIT:\n        return h(x)"]
    assert found(top, "return") == ["return h(x)", "return y"]
    assert found(top, "assign") == ["y"]
    assert found(top, "def") == ["top"]
    assert found(grow, "branch") == ["for _ in range(n):\n            self.size += 1"]
    assert found(grow, "assign") == ["size"]
    assert found(grow, "return") == ["yield self.size"]
    assert found(empty, "branch") == ["self.size == 0 if self else None"]
    assert _kinds(box) == ["assign", "def"]


def test_definitions_references_and_imports(analyze):
    result = analyze("python", SOURCE)
    assert {(d.name, d.kind) for d in result.definitions} == {
        ("LIMIT", "constant"),
        ("top", "function"),
        ("Box", "class"),
        ("grow", "function"),
        ("empty", "function"),
    }
    refs = {(r.name, r.kind) for r in result.references}
    assert {("h", "call"), ("join", "call"), ("range", "call"), ("Base", "inherit")} <= refs
    assert ("property", "decorator") in refs
    assert [(i.module, i.name, i.alias) for i in result.imports] == [
        ("os", None, None),
        ("pkg.util", "helper", "h"),
    ]


def test_oversized_function_splits_at_statements(analyze):
    body = "".join(f"    v{i} = call_{i}(v{i - 1})\n" for i in range(1, 40))
    source = f"def long(v0):\n{body}    return v39\n"
    result = analyze("python", source, budget=300)
    assert len(result.chunks) > 2
    assert {c.qualname for c in result.chunks} == {"long"}
    assert [c.part for c in result.chunks] == list(range(1, len(result.chunks) + 1))
    assert all(c.n_tokens <= 300 for c in result.chunks)
    assert result.chunks[0].text(source.encode()).startswith(b"def long(v0):")
    # Pieces are contiguous: together they cover the function.
    covered = b"".join(
        source.encode()[a.start_byte : b.start_byte]
        for a, b in zip(result.chunks, result.chunks[1:])
    ) + result.chunks[-1].text(source.encode())
    assert covered == source.encode().rstrip()


def test_syntax_errors_are_chunked_and_counted(analyze):
    result = analyze("python", "def ok():\n    return 1\n\ndef broken(:\n    pass\n")
    assert result.syntax_errors > 0
    assert result.chunks
