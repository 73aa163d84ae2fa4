"""Rust chunks, anchors and module resolution against hand-checked fixtures."""

from codekv.defuse.graph import ModuleResolver
from codekv.index import Index
from codekv.tokens import CounterSpec

SOURCE = """\
use std::collections::HashMap;
use crate::shapes::{Shape, circle::Circle as C};

const LIMIT: usize = 10;

/// A point.
#[derive(Debug)]
pub struct Point {
    x: f64,
    y: f64,
}

impl Point {
    pub fn new(x: f64, y: f64) -> Self {
        Point { x, y }
    }

    fn norm(&self) -> f64 {
        let mut total = 0.0;
        for v in [self.x, self.y] {
            total += v * v;
        }
        if total > 1.0 { total.sqrt() } else { total }
    }
}

impl Shape for Point {
    fn area(&self) -> Result<f64, String> {
        let n = self.norm();
        match n {
            0.0 => return Err(format!("empty")),
            _ => {}
        }
        let c = C::new(n)?;
        Ok(c.area())
    }
}

macro_rules! square {
    ($x:expr) => { $x * $x };
}
"""


def _found(chunk, kind):
    source = SOURCE.encode()
    return [source[a.start_byte : a.end_byte].decode() for a in chunk.anchors if a.kind == kind]


def _names(chunk, kind):
    return [a.name for a in chunk.anchors if a.kind == kind]


def test_items_are_chunks(analyze):
    result = analyze("rust", SOURCE)
    shape = [(c.kind, c.qualname, c.start_line, c.end_line) for c in result.chunks]
    assert shape == [
        ("module", None, 1, 4),
        ("class", "Point", 6, 11),
        ("class", "Point", 13, 25),  # impl Point
        ("class", "Point", 27, 37),  # impl Shape for Point
        ("function", "square", 39, 41),
    ]
    # Doc comment and attribute travel with the struct.
    assert result.chunks[1].text(SOURCE.encode()).startswith(b"/// A point.\n#[derive(Debug)]\n")


def test_oversized_impl_splits_into_methods(analyze):
    result = analyze("rust", SOURCE, budget=200)
    shape = [(c.kind, c.qualname, c.parent, c.start_line, c.end_line) for c in result.chunks]
    assert shape == [
        ("module", None, None, 1, 4),
        ("class", "Point", None, 6, 11),
        ("class", "Point", None, 13, 13),
        ("method", "Point.new", "Point", 14, 16),
        ("method", "Point.norm", "Point", 18, 24),
        ("class", "Point", None, 27, 27),
        ("method", "Point.area", "Point", 28, 34),
        ("method", "Point.area", "Point", 35, 36),
        ("function", "square", None, 39, 41),
    ]
    source = SOURCE.encode()
    assert result.chunks[2].text(source) == b"impl Point {"
    assert result.chunks[5].text(source) == b"impl Shape for Point {"
    assert [c.part for c in result.chunks[6:8]] == [1, 2]
    assert all(c.n_tokens <= 200 for c in result.chunks)


def test_anchors_by_kind(analyze):
    module, point, inherent, shape, square = analyze("rust", SOURCE).chunks
    use_list = "use crate::shapes::{Shape, circle::Circle as C};"
    assert _found(module, "import") == ["use std::collections::HashMap;", use_list, use_list]
    assert _names(module, "import") == ["HashMap", "Shape", "C"]
    assert _found(module, "def") == ["LIMIT"]
    assert _found(point, "def") == ["Point"]
    assert _found(inherent, "def") == ["new", "norm"]
    assert _found(inherent, "assign") == ["total", "total"]  # let mut total, total +=
    assert _names(inherent, "branch") == ["for_expression", "if_expression", "else_clause"]
    assert _found(inherent, "branch")[2] == "else { total }"
    assert _found(inherent, "call") == ["total.sqrt()"]
    assert _found(shape, "def") == ["area"]
    assert _found(shape, "assign") == ["n", "c"]
    assert _names(shape, "call") == ["norm", "Err", "format", "new", "Ok", "area"]
    assert _found(shape, "call")[2] == 'format!("empty")'
    assert _names(shape, "branch") == ["match_expression", "match_arm", "match_arm"]
    assert _found(shape, "return") == ['return Err(format!("empty"))', "C::new(n)?"]
    assert _found(square, "def") == ["square"]


def test_definitions_references_and_imports(analyze):
    result = analyze("rust", SOURCE)
    assert [(d.name, d.kind) for d in result.definitions] == [
        ("LIMIT", "constant"),
        ("Point", "class"),
        ("new", "method"),
        ("norm", "method"),
        ("area", "method"),
        ("square", "macro"),
    ]
    refs = [(r.name, r.kind) for r in result.references]
    assert [name for name, kind in refs if kind == "type"] == [
        "Point",  # impl Point
        "Self",
        "Point",  # Point { x, y }
        "Point",  # impl Shape for Point
        "Result",
        "String",
    ]
    assert ("Shape", "implementation") in refs
    assert ("C", "path") in refs  # C::new: the alias, resolved through the import
    assert [(i.module, i.name, i.alias) for i in result.imports] == [
        ("std::collections", "HashMap", None),
        ("crate::shapes", "Shape", None),
        ("crate::shapes::circle", "Circle", "C"),
    ]


def test_use_trees_give_one_import_per_name(analyze):
    source = (
        "use serde;\n"
        "use serde_json as json;\n"
        "use super::util::*;\n"
        "use self::inner::helper as h;\n"
        "use std::{io::{self, Read, Write as W}, fs, fmt::*};\n"
        "pub(crate) use crate::x::Y;\n"
    )
    result = analyze("rust", source)
    assert [(i.module, i.name, i.alias) for i in result.imports] == [
        ("serde", None, None),
        ("serde_json", None, "json"),
        ("super::util", "*", None),
        ("self::inner", "helper", "h"),
        ("std::io", "Read", None),
        ("std::io", "Write", "W"),
        ("std", "fs", None),
        ("std::fmt", "*", None),
        ("crate::x", "Y", None),
    ]


def test_bounds_and_lets(analyze):
    source = (
        "fn f<T: Area + Clone>(t: &T) -> impl Shape where T: Debug {\n"
        "    let (a, mut b) = t.pair();\n"
        "    let Wrapper { inner, size: s } = w;\n"
        "    self.count = a;\n"
        "    loop { while a { a -= 1; } }\n"
        "}\n"
    )
    result = analyze("rust", source)
    refs = [(r.name, r.kind) for r in result.references]
    assert refs == [
        ("Area", "bound"),
        ("Clone", "bound"),
        ("T", "type"),  # &T
        ("Shape", "bound"),  # impl Shape
        ("T", "type"),  # where T
        ("Debug", "bound"),
        ("pair", "call"),
        ("Wrapper", "type"),
    ]
    (f,) = result.chunks
    assert _names(f, "assign") == ["a", "b", "inner", "s", "count", "a"]
    assert _names(f, "branch") == ["loop_expression", "while_expression"]


def test_mod_without_body_is_a_loose_statement(analyze):
    source = "mod a;\nmod b;\nuse a::x;\n\nmod inline {\n    fn g() {}\n}\n"
    result = analyze("rust", source)
    shape = [(c.kind, c.qualname, c.start_line, c.end_line) for c in result.chunks]
    assert shape == [("module", None, 1, 3), ("module", "inline", 5, 7)]
    assert [(d.name, d.kind) for d in result.definitions] == [
        ("a", "module"),
        ("b", "module"),
        ("inline", "module"),
        ("g", "function"),
    ]


def test_module_resolver_follows_rust_paths():
    files = dict.fromkeys([
        "src/main.rs",
        "src/shapes/mod.rs",
        "src/shapes/circle.rs",
        "src/util.rs",
        "src/util/fmt.rs",
        "crates/geo-core/src/lib.rs",
        "crates/geo-core/src/point.rs",
    ])
    resolver = ModuleResolver(files)
    resolve = lambda importer, module: resolver.resolve(importer, "rust", module)  # noqa: E731
    assert resolve("src/main.rs", "crate::shapes") == ["src/shapes/mod.rs"]
    assert resolve("src/util/fmt.rs", "crate::shapes::circle") == ["src/shapes/circle.rs"]
    assert resolve("src/util/fmt.rs", "crate") == ["src/main.rs"]
    # super/self are relative to the importer's module: util/fmt.rs is crate::util::fmt.
    assert resolve("src/util/fmt.rs", "super") == ["src/util.rs"]
    assert resolve("src/shapes/circle.rs", "super") == ["src/shapes/mod.rs"]
    assert resolve("src/shapes/mod.rs", "self::circle") == ["src/shapes/circle.rs"]
    assert resolve("src/util.rs", "self::fmt") == ["src/util/fmt.rs"]
    assert resolve("src/shapes/circle.rs", "super::super::util") == ["src/util.rs"]
    # A bare path: a child module of the importer's, else another crate of the workspace.
    assert resolve("src/main.rs", "shapes::circle") == ["src/shapes/circle.rs"]
    assert resolve("src/main.rs", "geo_core") == ["crates/geo-core/src/lib.rs"]
    assert resolve("src/main.rs", "geo_core::point") == ["crates/geo-core/src/point.rs"]
    assert resolve("crates/geo-core/src/point.rs", "crate") == ["crates/geo-core/src/lib.rs"]
    assert resolve("src/main.rs", "std::collections") == []


REPO = {
    "Cargo.toml": '[package]\nname = "shop"\nversion = "0.1.0"\n',
    "src/main.rs": (
        "mod shapes;\n"
        "use crate::shapes::circle::Circle;\n\n"
        "fn main() {\n"
        "    let c = Circle::new(2.0);\n"
        "    let r = c.radius();\n"
        '    println!("{}", r);\n'
        "}\n"
    ),
    "src/shapes/mod.rs": "pub mod circle;\n\npub fn area(r: f64) -> f64 {\n    r * r\n}\n",
    "src/shapes/circle.rs": (
        "use super::area;\n\n"
        "pub struct Circle {\n    r: f64,\n}\n\n"
        "impl Circle {\n"
        "    pub fn new(r: f64) -> Self {\n        Circle { r }\n    }\n\n"
        "    pub fn radius(&self) -> f64 {\n        area(self.r)\n    }\n"
        "}\n"
    ),
    # Decoys: the same names in a module nobody imports.
    "src/decoy.rs": "pub struct Circle;\n\npub fn area() {}\n\npub fn new() {}\n",
}


def _qualnames(chunks):
    return {f"{c.path}::{c.qualname}:{c.start_line}" for c in chunks}


def test_index_links_a_use_to_the_imported_module(git_repo):
    git_repo.commit(REPO)
    index = Index(git_repo.root, counter=CounterSpec("bytes"))
    index.update(workers=1)
    try:
        (main,) = index.find("src/main.rs", "main")
        # `Circle` is defined twice; the `use` decides. `new` stays ambiguous (not guessed);
        # `radius` is defined once, in the impl.
        assert _qualnames(index.depends_on(main)) == {
            "src/shapes/circle.rs::Circle:3",
            "src/shapes/circle.rs::Circle:7",
        }
        assert {u.name for u in index.uses(main)} == {"Circle", "radius"}
        assert "new" in index.graph.ambiguous[main.id]
        # `use super::area` from shapes/circle.rs is shapes/mod.rs, not decoy.rs.
        (impl,) = [c for c in index.find("src/shapes/circle.rs", "Circle") if c.start_line == 7]
        assert _qualnames(index.depends_on(impl)) == {
            "src/shapes/circle.rs::Circle:3",
            "src/shapes/mod.rs::area:3",
        }
    finally:
        index.close()
