"""C chunks, anchors and cross-file resolution against hand-checked fixtures."""

from fixtures.repos import distinct_chunk_ids

from codekv.defuse.graph import ModuleResolver, build_graph
from codekv.index import Index
from codekv.tokens import CounterSpec

SOURCE = """\
#include "geo/point.h"
#include <stdio.h>

#define MAX_NORM 100
#define SQ(x) ((x) * (x))

typedef struct point {
    int x, y;
} point_t;

typedef int (*metric_fn)(point_t);

enum unit { UNIT_PX, UNIT_MM };

/* Squared norm, clamped. */
static int norm(const struct point *p, enum unit u) {
    int n = SQ(p->x) + SQ(p->y);
    if (n > MAX_NORM) {
        n = MAX_NORM;
    } else if (u == UNIT_MM) {
        n *= 2;
    }
    for (int i = 0; i < 3; i++) {
        log_value(n);
    }
    return n > 0 ? n : 0;
}

#ifdef DEBUG
void dump(point_t p) {
    while (p.x--) {
        putchar('.');
    }
}
#endif
"""


def _found(chunk, kind, source=SOURCE):
    data = source.encode()
    return [data[a.start_byte : a.end_byte].decode() for a in chunk.anchors if a.kind == kind]


def test_chunks(analyze):
    result = analyze("c", SOURCE)
    shape = [(c.kind, c.qualname, c.start_line, c.end_line) for c in result.chunks]
    assert shape == [
        ("module", None, 1, 5),  # includes and macros
        ("class", "point_t", 7, 9),  # a typedef'd struct is named by the typedef
        ("module", None, 11, 11),  # a plain typedef is loose
        ("class", "unit", 13, 13),
        ("function", "norm", 15, 27),  # with its comment
        ("module", None, 29, 29),  # `#ifdef DEBUG`: the conditional is no chunk of its own
        ("function", "dump", 30, 34),
        ("module", None, 35, 35),  # `#endif`
    ]
    data = SOURCE.encode()
    assert result.chunks[5].text(data) == b"#ifdef DEBUG"
    assert result.chunks[7].text(data) == b"#endif"


def test_oversized_function_splits_at_statements(analyze):
    result = analyze("c", SOURCE, budget=200)
    norm = [(c.part, c.start_line, c.end_line) for c in result.chunks if c.qualname == "norm"]
    assert norm == [(1, 15, 17), (2, 18, 27)]


def test_anchors_by_kind(analyze):
    result = analyze("c", SOURCE)
    module, point, metric, unit, norm, _, dump, _ = result.chunks
    assert _found(module, "import") == ['#include "geo/point.h"\n', "#include <stdio.h>\n"]
    assert [a.name for a in module.anchors if a.kind == "import"] == ["geo/point.h", "<stdio.h>"]
    assert _found(module, "def") == ["MAX_NORM", "SQ"]
    assert _found(point, "def") == ["point", "point_t"]
    assert _found(metric, "def") == ["metric_fn"]
    assert _found(unit, "def") == ["unit", "UNIT_PX", "UNIT_MM"]
    assert _found(norm, "def") == ["norm"]
    assert _found(norm, "call") == ["SQ(p->x)", "SQ(p->y)", "log_value(n)"]
    assert _found(norm, "assign") == ["n", "n", "n", "i"]
    assert [a.name for a in norm.anchors if a.kind == "branch"] == [
        "if_statement", "else_clause", "if_statement", "for_statement", "conditional_expression",
    ]
    assert _found(norm, "branch")[1] == "else if (u == UNIT_MM) {\n        n *= 2;\n    }"
    assert _found(norm, "return") == ["return n > 0 ? n : 0;"]
    assert _found(dump, "branch") == ["while (p.x--) {\n        putchar('.');\n    }"]


def test_definitions_references_and_imports(analyze):
    result = analyze("c", SOURCE)
    assert {(d.name, d.kind) for d in result.definitions} == {
        ("MAX_NORM", "macro"), ("SQ", "macro"),
        ("point", "struct"), ("point_t", "type"), ("metric_fn", "type"),
        ("unit", "enum"), ("UNIT_PX", "constant"), ("UNIT_MM", "constant"),
        ("norm", "function"), ("dump", "function"),
    }
    assert [(r.name, r.kind) for r in result.references] == [
        ("point_t", "type"),  # in the metric_fn typedef
        ("point", "type"),  # `const struct point *p`
        ("unit", "type"),
        ("SQ", "call"),
        ("SQ", "call"),
        ("log_value", "call"),
        ("point_t", "type"),
        ("putchar", "call"),
    ]
    assert [(i.module, i.name) for i in result.imports] == [
        ("geo/point.h", None),
        ("<stdio.h>", None),
    ]


def test_names_through_declarators(analyze):
    source = (
        "int **grid(void) { return 0; }\n"
        "char *(*pick)(int);\n"
        "const char *label(int n) { return 0; }\n"
        "typedef struct { int w; } size_t2, *size_ptr;\n"
        "struct list;\n"
    )
    result = analyze("c", source)
    assert [(c.kind, c.name) for c in result.chunks] == [
        ("function", "grid"),
        ("module", None),  # a function pointer variable is no definition
        ("function", "label"),
        ("class", "size_t2"),
        ("class", "list"),  # a forward declaration stays a (tiny) chunk of its own
    ]
    assert {(d.name, d.kind) for d in result.definitions} == {
        ("grid", "function"), ("label", "function"), ("size_t2", "type"), ("size_ptr", "type"),
    }


HEADER = """\
#ifndef GEO_POINT_H
#define GEO_POINT_H

typedef struct {
    int x, y;
} point;

int point_norm(point p);

static inline int point_sum(point p) {
    return p.x + p.y;
}

#endif
"""


def test_header_guard_is_transparent(analyze):
    result = analyze("c", HEADER, budget=64)
    shape = [(c.kind, c.qualname, c.start_line, c.end_line) for c in result.chunks]
    assert shape == [
        ("module", None, 1, 2),
        ("class", "point", 4, 6),
        ("module", None, 8, 8),  # a prototype is not a definition
        ("function", "point_sum", 10, 12),  # 62 bytes
        ("module", None, 14, 14),
    ]
    assert {d.name for d in result.definitions} == {"GEO_POINT_H", "point", "point_sum"}


def test_extern_c_guard_is_transparent(analyze):
    # `extern "C" {` opened in one `#ifdef` and closed in another: the parse recovers with an
    # error, and what stands between still gets chunks of its own.
    source = (
        '#ifdef __cplusplus\nextern "C" {\n#endif\n\n'
        "static inline int twice(int x) {\n    return 2 * x;\n}\n\n"
        "#ifdef __cplusplus\n}\n#endif\n"
    )
    result = analyze("c", source)
    assert result.syntax_errors > 0
    shape = [(c.kind, c.qualname, c.start_line, c.end_line) for c in result.chunks]
    assert shape == [
        ("module", None, 1, 3),
        ("function", "twice", 5, 7),
        ("module", None, 9, 11),
    ]


def test_include_resolution():
    files = dict.fromkeys([
        "include/geo/point.h",
        "src/geo/point.c",
        "src/util.h",
        "src/util.c",
        "src/main.c",
        "lib/util.h",
    ])
    resolver = ModuleResolver(files)
    # Next to the importer first, then with its implementation file beside it.
    assert resolver.resolve("src/main.c", "c", "util.h") == ["src/util.h", "src/util.c"]
    # Else by path suffix; the implementation is the only point.c in the repository.
    assert resolver.resolve("src/main.c", "c", "geo/point.h") == [
        "include/geo/point.h", "src/geo/point.c",
    ]
    assert resolver.resolve("src/main.c", "c", "../include/geo/point.h")[0] == "include/geo/point.h"
    # Relative to an include directory we don't know: the path without its `../`.
    assert resolver.resolve("tools/x.c", "c", "../geo/point.h")[0] == "include/geo/point.h"
    # A system include only by suffix: two util.h, and neither is the importer's neighbour.
    assert sorted(resolver.resolve("src/main.c", "c", "<util.h>")) == [
        "lib/util.h", "src/util.c", "src/util.h",
    ]
    assert resolver.resolve("src/main.c", "c", "<stdio.h>") == []


IMPL = """\
#include "geo/point.h"

int point_norm(point p) {
    return p.x * p.x + p.y * p.y;
}
"""
FAKE = '#include "geo/point.h"\n\nint point_norm(point p) {\n    return 0;\n}\n'
MAIN = """\
#include "geo/point.h"

int main(void) {
    point p = {3, 4};
    return point_norm(p) + point_sum(p);
}
"""


def test_uses_link_to_definitions_in_other_files(git_repo):
    git_repo.commit({
        "include/geo/point.h": HEADER,
        "src/geo/point.c": IMPL,
        "tests/fake_point.c": FAKE,
        "src/main.c": MAIN,
    })
    index = Index(git_repo.root, counter=CounterSpec("bytes"))
    index.update(workers=1)
    try:
        (main,) = index.find("src/main.c", "main")
        # point_norm is defined twice; the include's implementation file decides.
        assert {(c.path, c.qualname) for c in index.depends_on(main)} == {
            ("include/geo/point.h", "point"),
            ("include/geo/point.h", "point_sum"),
            ("src/geo/point.c", "point_norm"),
        }
        (impl,) = index.find("src/geo/point.c", "point_norm")
        assert [(c.path, c.qualname) for c in index.depends_on(impl)] == [
            ("include/geo/point.h", "point")
        ]
        assert {c.path for c in index.used_by(impl)} == {"src/main.c"}
    finally:
        index.close()


def test_header_sees_its_implementation_file(analyze):
    """No include links util.h to util.c, yet they are one unit: the header's inline function
    resolves ``clamp`` to util.c's, though other.c defines a ``clamp`` too."""
    files = {
        "src/util.h": analyze("c", "static inline int twice(int x) { return clamp(2 * x); }\n"),
        "src/util.c": analyze("c", "int clamp(int x) { return x; }\n"),
        "src/other.c": analyze("c", "int clamp(int x) { return 0; }\n"),
    }
    for path, analysis in files.items():
        distinct_chunk_ids(analysis, path)
    graph = build_graph(files)
    (twice,) = files["src/util.h"].chunks
    (clamp,) = files["src/util.c"].chunks
    assert graph.depends_on(twice.id) == [clamp.id]
    assert graph.ambiguous == {}
