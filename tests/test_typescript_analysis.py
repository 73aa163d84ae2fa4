"""TypeScript and TSX chunks, anchors, module resolution and def-use links against fixtures."""

import pytest

from codekv import grammars
from codekv.defuse.graph import ModuleResolver
from codekv.index import Index
from codekv.tokens import CounterSpec

SOURCE = """\
import { Shape, area as computeArea } from './shapes';
import type { Options } from '../options';

export interface Sized extends Shape {
  size: number;
}

export type Unit = 'px' | Metric;

export enum Color { Red, Green }

export const scale = (s: Sized, by: number): Sized => ({ ...s, size: s.size * by });

@register
export class Square implements Sized {
  size: number = 1;

  constructor(private opts: Options) {}

  @memo
  area(): number {
    while (this.size < 0) {
      this.size++;
    }
    return computeArea(this) ?? 0;
  }
}

namespace Geometry {
  export function unit(): Square {
    return new Square({} as Options);
  }
}
"""


def _found(source: bytes, chunk, kind: str) -> list[str]:
    return [source[a.start_byte : a.end_byte].decode() for a in chunk.anchors if a.kind == kind]


def test_queries_compile_for_both_grammars():
    """TSX compiles typescript.scm too, plus its JSX patterns the TypeScript grammar lacks."""
    assert grammars.query("tsx").pattern_count > grammars.query("typescript").pattern_count
    assert grammars.language_for_path("a/b.ts").name == "typescript"
    assert grammars.language_for_path("a/b.tsx").name == "tsx"


@pytest.mark.parametrize("language", ["typescript", "tsx"])
def test_whole_definitions_are_chunks(analyze, language):
    result = analyze(language, SOURCE)
    shape = [(c.kind, c.qualname, c.start_line, c.end_line) for c in result.chunks]
    assert shape == [
        ("module", None, 1, 2),
        ("class", "Sized", 4, 6),
        ("class", "Unit", 8, 8),
        ("class", "Color", 10, 10),
        ("function", "scale", 12, 12),
        # The class decorator sits outside `export`, and still belongs to the class.
        ("class", "Square", 14, 27),
        ("module", "Geometry", 29, 33),
    ]
    assert result.syntax_errors == 0


def test_oversized_class_splits_into_header_and_methods(analyze):
    result = analyze("typescript", SOURCE, budget=150)
    shape = [(c.kind, c.qualname, c.parent, c.start_line, c.end_line) for c in result.chunks]
    assert shape[5:8] == [
        ("class", "Square", None, 14, 16),
        ("method", "Square.constructor", "Square", 18, 18),
        # A method's decorator is its sibling in the class body; it is folded into the method.
        ("method", "Square.area", "Square", 20, 26),
    ]
    assert result.chunks[7].text(SOURCE.encode()).startswith(b"@memo\n  area(): number {")


def test_oversized_namespace_splits_into_members(analyze):
    source = (
        "export namespace Geo {\n"
        "  export const ORIGIN = 0;\n"
        "\n"
        "  export function unit(): number {\n"
        "    return ORIGIN + 1;\n"
        "  }\n"
        "}\n"
    )
    result = analyze("typescript", source, budget=60)
    shape = [(c.kind, c.qualname, c.start_line, c.end_line) for c in result.chunks]
    assert shape == [("module", "Geo", 2, 2), ("method", "Geo.unit", 4, 6)]


def test_anchors_by_kind(analyze):
    source = SOURCE.encode()
    module, sized, unit, color, scale, square, geometry = analyze("typescript", SOURCE).chunks
    assert _found(source, module, "import") == [
        "import { Shape, area as computeArea } from './shapes';",
        "import { Shape, area as computeArea } from './shapes';",
        "import type { Options } from '../options';",
    ]
    assert [a.name for a in module.anchors if a.kind == "import"] == [
        "Shape", "computeArea", "Options"
    ]
    assert [a.kind for a in sized.anchors] == ["def"]
    assert _found(source, unit, "def") == ["Unit"]
    assert _found(source, color, "def") == ["Color"]
    assert _found(source, scale, "def") == ["scale"]
    assert _found(source, scale, "assign") == ["scale"]
    assert _found(source, square, "def") == ["Square", "constructor", "area"]
    assert _found(source, square, "assign") == ["size", "size"]
    assert _found(source, square, "branch") == [
        "while (this.size < 0) {\n      this.size++;\n    }"
    ]
    assert _found(source, square, "return") == ["return computeArea(this) ?? 0;"]
    assert _found(source, square, "call") == ["computeArea(this)"]
    assert _found(source, geometry, "def") == ["Geometry", "unit"]
    assert _found(source, geometry, "call") == ["new Square({} as Options)"]
    assert _found(source, geometry, "return") == ["return new Square({} as Options);"]


def test_definitions_references_and_imports(analyze):
    result = analyze("typescript", SOURCE)
    assert [(d.name, d.kind) for d in result.definitions] == [
        ("Sized", "interface"),
        ("Unit", "type"),
        ("Color", "enum"),
        ("scale", "function"),
        ("Square", "class"),
        ("constructor", "method"),
        ("area", "method"),
        ("Geometry", "module"),
        ("unit", "function"),
    ]
    assert {(r.name, r.kind) for r in result.references} == {
        ("Shape", "inherit"),
        ("Sized", "inherit"),
        ("register", "decorator"),
        ("memo", "decorator"),
        ("Metric", "type"),
        ("Sized", "type"),
        ("Options", "type"),
        ("Square", "type"),
        ("Square", "call"),
        ("computeArea", "call"),
    }
    assert [(i.module, i.name, i.alias) for i in result.imports] == [
        ("./shapes", "Shape", None),
        ("./shapes", "area", "computeArea"),
        ("../options", "Options", None),
    ]


def test_types_and_commonjs_imports(analyze):
    source = (
        "import fs = require('fs');\n"
        "import * as util from './util';\n"
        "function pick<T extends Base>(xs: Array<T>, key: keyof Opts): ns.Item | null {\n"
        "  return xs[0] as unknown as Item;\n"
        "}\n"
    )
    result = analyze("typescript", source)
    assert [(i.module, i.name, i.alias) for i in result.imports] == [
        ("fs", None, "fs"),
        ("./util", "*", "util"),
    ]
    # Uses of types only: the type parameter's declaration `T` is not a reference.
    assert [(r.name, r.kind) for r in result.references] == [
        ("Base", "type"),
        ("Array", "type"),
        ("T", "type"),
        ("Opts", "type"),
        ("Item", "type"),
        ("Item", "type"),
    ]


def test_tsx_components_are_calls(analyze):
    source = (
        "export const App = <T,>(props: Props<T>) => (\n"
        "  <main>\n"
        "    <Header title={props.title} />\n"
        "    <Layout.Body>{render(props)}</Layout.Body>\n"
        "  </main>\n"
        ");\n"
    )
    result = analyze("tsx", source)
    assert [(c.kind, c.qualname) for c in result.chunks] == [("function", "App")]
    (app,) = result.chunks
    assert _found(source.encode(), app, "call") == [
        "<Header title={props.title} />",
        "<Layout.Body>",
        "render(props)",
    ]
    assert [a.name for a in app.anchors if a.kind == "call"] == ["Header", "Body", "render"]


def test_module_resolution():
    paths = ["src/app.ts", "src/lib/b.ts", "src/lib/b.js", "src/view.tsx", "src/types.d.ts",
             "src/ui/index.tsx"]
    resolver = ModuleResolver(dict.fromkeys(paths))
    resolve = lambda module, lang="typescript": resolver.resolve(  # noqa: E731
        "src/app.ts", lang, module
    )
    assert resolve("./lib/b") == ["src/lib/b.ts"]  # TypeScript prefers .ts to .js
    assert resolve("./lib/b", "javascript") == ["src/lib/b.js"]
    assert resolve("./view.js") == ["src/view.tsx"]  # ESM style names the compiled file
    assert resolve("./types") == ["src/types.d.ts"]
    assert resolve("./ui", "tsx") == ["src/ui/index.tsx"]
    assert resolve("@scope/ui") == []
    assert resolve("./nothing") == []


def _index(git_repo, files):
    git_repo.commit(files)
    index = Index(git_repo.root, counter=CounterSpec("bytes"))
    index.update(workers=1)
    return index


def test_call_and_type_resolve_through_import(git_repo):
    index = _index(git_repo, {
        "src/shapes.ts": (
            "export interface Shape {\n  side: number;\n}\n\n"
            "export function area(s: Shape): number {\n  return s.side * s.side;\n}\n"
        ),
        "src/report.ts": (
            "import { Shape, area as measure } from './shapes.js';\n"
            "\n"
            "export function total(xs: Shape[]): number {\n"
            "  return xs.reduce((sum, x) => sum + measure(x), 0);\n"
            "}\n"
        ),
    })
    (total,) = index.find("src/report.ts", "total")
    (shape,) = index.find("src/shapes.ts", "Shape")
    (area,) = index.find("src/shapes.ts", "area")
    # `measure` is defined nowhere: only the import alias links it to shapes.ts's area.
    assert {c.id for c in index.depends_on(total)} == {shape.id, area.id}
    assert sorted((u.name, u.kind) for u in index.uses(total)) == [
        ("Shape", "type"), ("measure", "call"),
    ]


def test_jsx_element_resolves_through_import(git_repo):
    index = _index(git_repo, {
        "src/badge.tsx": "export function Badge({ label }: { label: string }) {\n"
                         "  return <span>{label}</span>;\n}\n",
        "src/app.tsx": "import { Badge as Pill } from './badge';\n\n"
                       "export function App() {\n  return <Pill label=\"new\" />;\n}\n",
    })
    (app,) = index.find("src/app.tsx", "App")
    (badge,) = index.find("src/badge.tsx", "Badge")
    assert [c.id for c in index.depends_on(app)] == [badge.id]
