"""JavaScript chunks, anchors, module resolution and def-use links against hand-checked fixtures."""

from codekv.defuse.graph import ModuleResolver
from codekv.grammars import language_for_path
from codekv.index import Index
from codekv.tokens import CounterSpec

SOURCE = """\
import { helper as h } from './util';
import * as path from 'path';
const fs = require('fs');

const LIMIT = 10;

// Adds one, or throws.
export function top(x) {
  if (x > LIMIT) {
    throw new Error('big');
  }
  const y = h(x) + path.join(x);
  return y;
}

export const double = (n) => n * 2;

class Box extends Base {
  size = 3;

  grow(n) {
    for (let i = 0; i < n; i++) {
      this.size += 1;
    }
    return this.size;
  }

  @observable
  empty() {
    return this.size === 0 ? true : false;
  }
}
"""


def _found(source: bytes, chunk, kind: str) -> list[str]:
    return [source[a.start_byte : a.end_byte].decode() for a in chunk.anchors if a.kind == kind]


def test_extensions_are_javascript():
    assert [language_for_path(p).name for p in ("a.js", "b.mjs", "c.cjs", "d/e.jsx")] == [
        "javascript"
    ] * 4


def test_whole_definitions_are_chunks(analyze):
    result = analyze("javascript", SOURCE)
    shape = [(c.kind, c.qualname, c.start_line, c.end_line) for c in result.chunks]
    assert shape == [
        ("module", None, 1, 5),
        ("function", "top", 7, 14),
        # An arrow function bound to a name is a function chunk named after the binding.
        ("function", "double", 16, 16),
        ("class", "Box", 18, 32),
    ]
    assert result.chunks[1].text(SOURCE.encode()).startswith(b"// Adds one, or throws.\nexport")
    assert result.syntax_errors == 0


def test_oversized_class_splits_into_header_and_methods(analyze):
    result = analyze("javascript", SOURCE, budget=120)
    shape = [
        (c.kind, c.qualname, c.parent, c.part, c.start_line, c.end_line) for c in result.chunks
    ]
    assert shape == [
        ("module", None, None, 0, 1, 5),
        ("function", "top", None, 1, 7, 11),
        ("function", "top", None, 2, 12, 14),
        ("function", "double", None, 0, 16, 16),
        ("class", "Box", None, 0, 18, 19),
        ("method", "Box.grow", "Box", 0, 21, 26),
        # The decorator line belongs to its method.
        ("method", "Box.empty", "Box", 0, 28, 31),
    ]
    assert all(c.n_tokens <= 120 for c in result.chunks)


def test_anchors_by_kind(analyze):
    source = SOURCE.encode()
    module, top, double, box = analyze("javascript", SOURCE).chunks
    assert _found(source, module, "import") == [
        "import { helper as h } from './util';",
        "import * as path from 'path';",
        "const fs = require('fs');",
    ]
    assert [a.name for a in module.anchors if a.kind == "import"] == ["h", "path", "fs"]
    assert _found(source, module, "def") == ["LIMIT"]
    assert _found(source, module, "assign") == ["fs", "LIMIT"]
    assert _found(source, top, "def") == ["top"]
    assert _found(source, top, "branch") == [
        "if (x > LIMIT) {\n    throw new Error('big');\n  }"
    ]
    assert _found(source, top, "return") == ["throw new Error('big');", "return y;"]
    assert _found(source, top, "call") == ["new Error('big')", "h(x)", "path.join(x)"]
    assert [a.name for a in top.anchors if a.kind == "call"] == ["Error", "h", "join"]
    assert _found(source, top, "assign") == ["y"]
    assert _found(source, double, "def") == ["double"]
    assert _found(source, box, "def") == ["Box", "grow", "empty"]
    assert _found(source, box, "branch") == [
        "for (let i = 0; i < n; i++) {\n      this.size += 1;\n    }",
        "this.size === 0 ? true : false",
    ]
    assert _found(source, box, "assign") == ["size", "i", "i", "size"]
    assert _found(source, box, "return") == [
        "return this.size;",
        "return this.size === 0 ? true : false;",
    ]


def test_definitions_references_and_imports(analyze):
    result = analyze("javascript", SOURCE)
    assert [(d.name, d.kind) for d in result.definitions] == [
        ("LIMIT", "constant"),
        ("top", "function"),
        ("double", "function"),
        ("Box", "class"),
        ("grow", "method"),
        ("empty", "method"),
    ]
    refs = {(r.name, r.kind) for r in result.references}
    assert refs == {
        ("require", "call"),
        ("Error", "call"),
        ("h", "call"),
        ("join", "call"),
        ("Base", "inherit"),
        ("observable", "decorator"),
    }
    assert [(i.module, i.name, i.alias) for i in result.imports] == [
        ("./util", "helper", "h"),
        # A namespace import brings in every name of the module.
        ("path", "*", "path"),
        # `const fs = require('fs')` binds the module itself, like Python's `import fs`.
        ("fs", None, "fs"),
    ]


def test_other_import_forms(analyze):
    source = (
        "import React, { useState } from 'react';\n"
        "import './polyfill';\n"
        "const { a, b: c } = require('./lib');\n"
    )
    result = analyze("javascript", source)
    assert [(i.module, i.name, i.alias) for i in result.imports] == [
        ("react", "React", None),
        ("react", "useState", None),
        ("./polyfill", None, None),
        ("./lib", "a", None),
        ("./lib", "b", "c"),
    ]
    # Destructured require() bindings are imports, not module constants.
    assert result.definitions == []


def test_function_values_and_commonjs_exports(analyze):
    source = (
        "const f = function () { return 1; };\n"
        "const Widget = class extends Base {};\n"
        "export default function () {}\n"
        "exports.g = () => f();\n"
    )
    result = analyze("javascript", source)
    shape = [(c.kind, c.qualname, c.start_line) for c in result.chunks]
    assert shape == [
        ("function", "f", 1),
        ("class", "Widget", 2),
        ("function", "default", 3),
        ("module", None, 4),
    ]
    assert [(d.name, d.kind) for d in result.definitions] == [
        ("f", "function"),
        ("Widget", "class"),
        ("g", "function"),
    ]


def test_jsx_components_are_calls(analyze):
    source = "function App() {\n  return <div><Button onClick={go} /><ui.Card /></div>;\n}\n"
    (app,) = analyze("javascript", source).chunks
    assert _found(source.encode(), app, "call") == ["<Button onClick={go} />", "<ui.Card />"]
    assert [a.name for a in app.anchors if a.kind == "call"] == ["Button", "Card"]


def test_module_resolution():
    paths = ["src/a.js", "src/c.jsx", "src/lib/b.ts", "src/util/index.js", "index.js"]
    resolver = ModuleResolver(dict.fromkeys(paths))
    resolve = lambda module: resolver.resolve("src/a.js", "javascript", module)  # noqa: E731
    assert resolve("./c") == ["src/c.jsx"]
    assert resolve("./c.jsx") == ["src/c.jsx"]
    assert resolve("./lib/b") == ["src/lib/b.ts"]
    assert resolve("./util") == ["src/util/index.js"]
    assert resolve("..") == ["index.js"]
    assert resolve("../index") == ["index.js"]
    assert resolve("./missing") == []
    assert resolve("../../outside") == []
    # Bare specifiers are packages, even when a repository file has the same name.
    assert resolve("c") == []
    assert resolve("lib/b") == []


def test_call_resolves_through_import_alias(git_repo):
    git_repo.commit({
        "src/util.js": "export function helper(x) {\n  return x + 1;\n}\n",
        "src/main.js": (
            "import { helper as h } from './util';\n"
            "\n"
            "export function run(x) {\n"
            "  return h(x) * 2;\n"
            "}\n"
        ),
    })
    index = Index(git_repo.root, counter=CounterSpec("bytes"))
    index.update(workers=1)
    (run,) = index.find("src/main.js", "run")
    (helper,) = index.find("src/util.js", "helper")
    # `h` is defined nowhere: only the import alias links it to util.js's helper.
    assert [c.id for c in index.depends_on(run)] == [helper.id]
    assert [(u.name, u.kind) for u in index.uses(run)] == [("h", "call")]
    assert [c.id for c in index.used_by(helper)] == [run.id]
