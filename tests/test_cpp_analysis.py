"""C++ chunks, anchors and cross-file resolution against hand-checked fixtures."""

from codekv.index import Index
from codekv.tokens import CounterSpec

SOURCE = """\
#include "shapes/box.hpp"
#include <vector>

namespace geo {

template <typename T>
class Box : public Base, private Holder<T> {
 public:
  Box(int w) : w_(w) {}
  ~Box();
  int width() const { return w_; }
  bool operator<(const Box& o) const { return w_ < o.w_; }

 private:
  int w_ = 0;
};

int Box::area() const {
  std::vector<Point> corners;
  for (const auto& c : corners) {
    total += c.x;
  }
  return util::scale<int>(total);
}

}  // namespace geo

geo::Circle::Circle(double r) : r_(r) {}

template <typename T> Box<T>::~Box() {}

bool operator==(const Box& a, const Box& b) {
  try {
    auto* copy = new geo::Box<int>(3);
    copy->width();
  } catch (const std::exception& e) {
    throw Error("bad");
  }
  return a.width() == b.width() ? true : false;
}

extern "C" {
int c_api(int x) { return x; }
}
"""


def _found(chunk, kind):
    data = SOURCE.encode()
    return [data[a.start_byte : a.end_byte].decode() for a in chunk.anchors if a.kind == kind]


def test_small_namespace_is_one_chunk(analyze):
    result = analyze("cpp", SOURCE)
    shape = [(c.kind, c.qualname, c.start_line, c.end_line) for c in result.chunks]
    assert shape == [
        ("module", None, 1, 2),
        ("module", "geo", 4, 26),
        ("module", None, 26, 26),  # the `// namespace geo` comment after the brace
        ("method", "geo.Circle.Circle", 28, 28),  # out of class: named by its scope
        ("method", "Box.~Box", 30, 30),  # the template declaration is the chunk
        ("function", "operator==", 32, 40),
        ("module", None, 42, 42),  # `extern "C" {` is no scope: its functions stand alone
        ("function", "c_api", 43, 43),
        ("module", None, 44, 44),
    ]
    data = SOURCE.encode()
    assert result.chunks[4].text(data) == b"template <typename T> Box<T>::~Box() {}"
    assert result.chunks[6].text(data) == b'extern "C" {'


def test_oversized_namespace_and_class_split(analyze):
    result = analyze("cpp", SOURCE, budget=150)
    shape = [(c.kind, c.qualname, c.parent, c.part, c.start_line, c.end_line)
             for c in result.chunks[:8]]
    assert shape == [
        ("module", None, None, 0, 1, 2),
        ("class", "geo.Box", "geo", 1, 6, 8),  # template line, signature, `public:`
        ("method", "geo.Box.Box", "geo.Box", 0, 9, 9),
        ("class", "geo.Box", "geo", 2, 10, 10),  # a declaration is no definition
        ("method", "geo.Box.width", "geo.Box", 0, 11, 11),
        ("method", "geo.Box.operator<", "geo.Box", 0, 12, 12),
        ("class", "geo.Box", "geo", 3, 14, 15),
        # Defined outside the class, in the namespace block: namespace, then owner.
        ("method", "geo.Box.area", "geo.Box", 0, 18, 24),
    ]
    assert [(c.qualname, c.part) for c in result.chunks if c.qualname == "operator=="] == [
        ("operator==", 1), ("operator==", 2), ("operator==", 3),
    ]


def test_anchors_by_kind(analyze):
    result = analyze("cpp", SOURCE, budget=150)
    includes = result.chunks[0]
    assert _found(includes, "import") == ['#include "shapes/box.hpp"\n', "#include <vector>\n"]
    assert [a.name for a in includes.anchors] == ["shapes/box.hpp", "<vector>"]
    chunks = {c.qualname: c for c in result.chunks if c.part == 0}
    assert _found(chunks["geo.Box.width"], "def") == ["width"]
    assert _found(chunks["geo.Box.width"], "return") == ["return w_;"]
    assert _found(chunks["geo.Box.operator<"], "def") == ["operator<"]
    area = chunks["geo.Box.area"]
    assert _found(area, "def") == ["area"]
    assert _found(area, "branch") == ["for (const auto& c : corners) {\n    total += c.x;\n  }"]
    assert _found(area, "assign") == ["total"]
    assert _found(area, "call") == ["util::scale<int>(total)"]
    assert [a.name for a in area.anchors if a.kind == "call"] == ["scale"]
    assert _found(chunks["Box.~Box"], "def") == ["~Box"]
    whole = {c.qualname: c for c in analyze("cpp", SOURCE).chunks}
    equals = whole["operator=="]
    assert _found(equals, "def") == ["operator=="]
    assert [a.name for a in equals.anchors if a.kind == "branch"] == [
        "try_statement", "catch_clause", "conditional_expression",
    ]
    assert _found(equals, "call") == [
        "new geo::Box<int>(3)", "copy->width()", 'Error("bad")', "a.width()", "b.width()",
    ]
    assert [a.name for a in equals.anchors if a.kind == "call"] == [
        "Box", "width", "Error", "width", "width",
    ]
    assert _found(equals, "assign") == ["copy"]
    assert _found(equals, "return") == [
        'throw Error("bad");', "return a.width() == b.width() ? true : false;",
    ]


def test_definitions_references_and_imports(analyze):
    result = analyze("cpp", SOURCE)
    assert {(d.name, d.kind) for d in result.definitions} == {
        ("geo", "namespace"),
        ("Box", "class"),
        ("width", "method"),
        ("operator<", "method"),
        ("area", "method"),
        ("~Box", "method"),
        ("operator==", "function"),
        ("c_api", "function"),
    }
    refs = [(r.name, r.kind) for r in result.references]
    assert ("Base", "inherit") in refs and ("Holder", "inherit") in refs
    # Constructors, in and out of class, refer to their class instead of redefining it.
    assert ("Box", "constructor") in refs and ("Circle", "constructor") in refs
    assert {("vector", "type"), ("Point", "type"), ("exception", "type")} <= set(refs)
    assert refs.count(("Box", "type")) == 3  # `const Box&` in operator< and operator==
    assert refs.count(("Box", "call")) == 1  # `new geo::Box<int>(3)`, not also a type
    assert {("scale", "call"), ("Error", "call")} <= set(refs)
    assert [(i.module, i.name) for i in result.imports] == [
        ("shapes/box.hpp", None),
        ("<vector>", None),
    ]


def test_names_through_declarators(analyze):
    source = (
        "int *Grid::cell(int i) { return 0; }\n"
        "const Grid& Grid::self() const { return *this; }\n"
        "Grid& Grid::operator=(const Grid& o) { return *this; }\n"
        "Grid::operator bool() const { return true; }\n"
        "namespace a::b { int f() { return 0; } }\n"
        "template <> class Box<int> { };\n"
    )
    result = analyze("cpp", source)
    assert [(c.kind, c.qualname) for c in result.chunks] == [
        ("method", "Grid.cell"),
        ("method", "Grid.self"),
        ("method", "Grid.operator="),
        ("method", "Grid.operator bool"),
        ("module", "a.b"),
        ("class", "Box"),  # a specialization is named by its template
    ]
    assert {(d.name, d.kind) for d in result.definitions} == {
        ("cell", "method"), ("self", "method"), ("operator=", "method"), ("b", "namespace"),
        ("f", "function"),
    }


HEADER = """\
#pragma once

namespace shapes {

class Box {
 public:
  explicit Box(int w);
  int area() const;

 private:
  int w_;
};

}  // namespace shapes
"""
IMPL = """\
#include "shapes/box.hpp"

namespace shapes {

Box::Box(int w) : w_(w) {}

int Box::area() const { return w_ * w_; }

}  // namespace shapes
"""
CIRCLE = """\
struct Circle {
  double r;
  double area() const { return 3.14 * r * r; }
};
"""
MAIN = """\
#include "shapes/box.hpp"

int main() {
  shapes::Box box(3);
  return box.area();
}
"""


def test_uses_link_to_definitions_in_other_files(git_repo):
    git_repo.commit({
        "include/shapes/box.hpp": HEADER,
        "src/box.cpp": IMPL,
        "src/circle.hpp": CIRCLE,
        "src/main.cpp": MAIN,
    })
    index = Index(git_repo.root, counter=CounterSpec("bytes"), budget=60)
    index.update(workers=1)
    try:
        (main,) = index.find("src/main.cpp", "main")
        # `area` is defined twice; the include (and its implementation file) decides.
        assert {(c.path, c.qualname) for c in index.depends_on(main)} == {
            ("include/shapes/box.hpp", "shapes.Box"),
            ("src/box.cpp", "shapes.Box.area"),
        }
        (constructor,) = index.find("src/box.cpp", "shapes.Box.Box")
        assert [(c.path, c.qualname) for c in index.depends_on(constructor)] == [
            ("include/shapes/box.hpp", "shapes.Box")
        ]
    finally:
        index.close()
