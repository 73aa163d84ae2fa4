"""Go chunks, anchors and package resolution against hand-checked fixtures."""

import hashlib

from codekv.defuse.graph import ModuleResolver
from codekv.grammars import GO
from codekv.index import Index
from codekv.tokens import CounterSpec

SOURCE = """\
package server

import (
	"fmt"
	str "strings"
)

const Limit = 10

// Server serves.
type Server struct {
	Name string
	next *Server
}

type Handler interface {
	Serve(r *Request) error
}

func (s *Server) Serve(r *Request) error {
	if r == nil {
		return fmt.Errorf("nil request")
	} else {
		s.Name = str.ToUpper(r.Path)
	}
	for i := 0; i < Limit; i++ {
		n := s.next
		switch n {
		case nil:
			panic("loop")
		}
	}
	return nil
}

func New(name string) *Server {
	return &Server{Name: name}
}
"""


def _found(chunk, kind):
    source = SOURCE.encode()
    return [source[a.start_byte : a.end_byte].decode() for a in chunk.anchors if a.kind == kind]


def test_methods_are_qualified_by_their_receiver(analyze):
    result = analyze("go", SOURCE)
    shape = [(c.kind, c.qualname, c.parent, c.start_line, c.end_line) for c in result.chunks]
    assert shape == [
        ("module", None, None, 1, 8),
        ("class", "Server", None, 10, 14),
        ("class", "Handler", None, 16, 18),
        ("method", "Server.Serve", "Server", 20, 34),
        ("function", "New", None, 36, 38),
    ]
    assert [c.name for c in result.chunks[3:]] == ["Serve", "New"]
    assert result.chunks[1].text(SOURCE.encode()).startswith(b"// Server serves.\ntype Server")


def test_interface_methods_are_outlined_and_addressable(analyze, git_repo):
    """A method an interface declares is ``Type.Method`` in the outline, as a Java interface
    method is, while the interface stays one chunk (its boundaries do not move)."""
    result = analyze("go", SOURCE)
    assert [(o.qualname, o.kind, o.start_line, o.end_line) for o in result.outline] == [
        ("Server", "class", 10, 14),
        ("Handler", "class", 16, 18),
        ("Handler.Serve", "method", 17, 17),
        ("Server.Serve", "method", 20, 34),
        ("New", "function", 36, 38),
    ]
    git_repo.commit({"server.go": SOURCE})
    index = Index(git_repo.root, counter=CounterSpec("bytes"))
    index.update(workers=1)
    try:
        method = index.resolve("server.go::Handler.Serve")
        assert index.text(method) == b"Serve(r *Request) error"
        assert (method.kind, method.parent, method.start_line) == ("method", "Handler", 17)
        # The receiver's method of the same name is another definition, addressed apart.
        assert index.resolve("server.go::Server.Serve").start_line == 20
    finally:
        index.close()


def test_an_oversized_interface_splits_into_its_methods(analyze):
    """Like a class over the budget: a header chunk, then one chunk per method it declares."""
    methods = "".join(f"\t// Op{i} does step {i} of the protocol.\n\tOp{i}(ctx Context, "
                      f"in *Input{i}) (*Output{i}, error)\n" for i in range(6))
    source = ("package proto\n\n// Service is the protocol.\ntype Service interface {\n"
              f"{methods}}}\n")
    result = analyze("go", source, budget=120)
    shape = [(c.kind, c.qualname, c.start_line, c.end_line) for c in result.chunks]
    assert shape == [("module", None, 1, 1), ("class", "Service", 3, 4)] + [
        ("method", f"Service.Op{i}", 5 + 2 * i, 6 + 2 * i) for i in range(6)]
    assert all(c.n_tokens <= 120 for c in result.chunks)
    assert result.chunks[2].text(source.encode()).startswith(b"// Op0 does step 0")
    whole = analyze("go", source, budget=2000)  # it fits: one chunk, methods outlined
    assert [c.qualname for c in whole.chunks] == [None, "Service"]
    assert [o.qualname for o in whole.outline] == ["Service"] + [f"Service.Op{i}"
                                                                 for i in range(6)]


def test_a_language_boundary_version_renews_only_that_languages_ids():
    from codekv.chunks import LANGUAGE_VERSIONS, chunk_id

    assert "python" not in LANGUAGE_VERSIONS and LANGUAGE_VERSIONS["go"]
    # Python ids are what they were before languages had versions of their own.
    key = "0" * 40 + ":python:0:10:3:bytes:512"
    assert chunk_id("0" * 40, "python", 0, 10, "3:bytes:512") == hashlib.sha256(
        key.encode()).hexdigest()[:24]
    go_key = "0" * 40 + ":go:0:10:3:bytes:512"
    assert chunk_id("0" * 40, "go", 0, 10, "3:bytes:512") != hashlib.sha256(
        go_key.encode()).hexdigest()[:24]


def test_receiver_forms():
    from codekv import grammars

    source = b"package p\nfunc (Plain) A() {}\nfunc (g *Gen[T]) B() {}\nfunc C() {}\n"
    tree = grammars.parser("go").parse(source)
    owners = [grammars.GO.owner_of(node) for node in tree.root_node.named_children[1:]]
    assert owners == ["Plain", "Gen", None]


def test_oversized_method_splits_at_statements(analyze):
    result = analyze("go", SOURCE, budget=150)
    shape = [(c.qualname, c.part, c.start_line, c.end_line) for c in result.chunks]
    # The body is block > statement_list: the cut falls before `for`, not after the `{`.
    assert shape[3:5] == [("Server.Serve", 1, 20, 25), ("Server.Serve", 2, 26, 34)]
    assert all(c.n_tokens <= 150 for c in result.chunks)


def test_anchors_by_kind(analyze):
    module, server, handler, serve, new = analyze("go", SOURCE).chunks
    assert _found(module, "import") == ['"fmt"', 'str "strings"']
    assert [a.name for a in module.anchors if a.kind == "import"] == ["fmt", "str"]
    assert _found(module, "def") == ["Limit"]
    assert _found(serve, "call") == [
        'fmt.Errorf("nil request")',
        "str.ToUpper(r.Path)",
        'panic("loop")',
    ]
    assert [a.name for a in serve.anchors if a.kind == "call"] == ["Errorf", "ToUpper", "panic"]
    assert [a.name for a in serve.anchors if a.kind == "branch"] == [
        "if_statement",
        "block",  # the else block
        "for_statement",
        "expression_switch_statement",
        "expression_case",
    ]
    assert _found(serve, "branch")[1] == "{\n\t\ts.Name = str.ToUpper(r.Path)\n\t}"
    assert _found(serve, "return") == ['return fmt.Errorf("nil request")', "return nil"]
    assert _found(serve, "assign") == ["Name", "i", "i", "n"]  # s.Name =, i := 0, i++, n :=
    assert _found(serve, "def") == ["Serve"]
    assert _found(new, "return") == ["return &Server{Name: name}"]
    # A method an interface declares is a definition, as in Java and TypeScript.
    assert _found(handler, "def") == ["Handler", "Serve"]
    assert {a.kind for a in server.anchors} == {"def"}


def test_definitions_references_and_imports(analyze):
    result = analyze("go", SOURCE)
    assert [(d.name, d.kind) for d in result.definitions] == [
        ("Limit", "constant"),
        ("Server", "class"),
        ("Handler", "interface"),
        ("Serve", "method"),  # declared by Handler
        ("Serve", "method"),  # defined for *Server
        ("New", "function"),
    ]
    refs = [(r.name, r.kind) for r in result.references]
    assert [name for name, kind in refs if kind == "call"] == ["Errorf", "ToUpper", "panic"]
    types = {name for name, kind in refs if kind == "type"}
    # Declared names count too (they resolve to their own chunk, which the graph skips).
    assert types == {"Server", "Handler", "Request", "error", "string"}
    assert [(i.module, i.name, i.alias) for i in result.imports] == [
        ("fmt", None, None),
        ("strings", None, "str"),
    ]


def test_grouped_declarations_and_import_forms(analyze):
    source = (
        'package p\n\nimport (\n\t. "net/http"\n\t_ "embed"\n)\n\n'
        "const (\n\tA, B = 1, 2\n)\n\nvar (\n\tx = 1\n\t_ = 2\n)\n\n"
        "type (\n\tID = int\n\tList []ID\n)\n\n"
        "func f() {\n\tvar y, _ int\n\tfor k := range m {\n\t\ty--\n\t}\n\tselect {\n"
        "\tcase v := <-ch:\n\t\tuse(v)\n\tdefault:\n\t}\n}\n"
    )
    result = analyze("go", source)
    assert [(d.name, d.kind) for d in result.definitions] == [
        ("A", "constant"),
        ("B", "constant"),
        ("x", "variable"),
        ("_", "variable"),
        ("ID", "type"),
        ("List", "type"),
        ("f", "function"),
    ]
    assert [(i.module, i.alias) for i in result.imports] == [("net/http", "."), ("embed", "_")]
    f = result.chunks[-1]
    assert [a.name for a in f.anchors if a.kind == "assign"] == ["y", "y", "v"]
    assert [a.name for a in f.anchors if a.kind == "branch"] == [
        "for_statement",
        "select_statement",
        "communication_case",
        "default_case",
    ]


def test_module_resolver_maps_import_paths_to_package_directories():
    files = dict.fromkeys([
        "main.go",
        "store/store.go",
        "store/store_test.go",
        "internal/store/cache.go",
        "log/log.go",
        "fmtx/fmt.go",
        "backend/api/v1/handler.go",
        "tools/v1/gen.go",
        "README.md",
    ])
    resolver = ModuleResolver(files)
    resolve = lambda module, importer="main.go": resolver.resolve(importer, "go", module)  # noqa: E731
    assert resolve("example.com/shop/store") == ["store/store.go", "store/store_test.go"]
    # The longest directory the path ends with wins over a shorter one (`store`).
    assert resolve("example.com/shop/internal/store") == ["internal/store/cache.go"]
    # A module kept in a subdirectory (backend/): the longest tail that one directory ends with.
    assert resolve("example.com/api/v1") == ["backend/api/v1/handler.go"]
    # Tails shorter than two segments are not tried (`v1` ends two packages anyway).
    assert resolve("example.com/other/v1") == []
    assert resolve("log") == []
    assert resolve("fmt") == []
    # A package never imports itself.
    assert resolve("example.com/shop/store", "store/store.go") == []
    assert GO.modules.package(resolver.paths, "store") == ["store/store.go", "store/store_test.go"]
    twins = ModuleResolver(dict.fromkeys(["a/api/v1/x.go", "b/api/v1/y.go", "main.go"]))
    assert twins.resolve("main.go", "go", "example.com/api/v1") == []


REPO = {
    "go.mod": "module example.com/shop\n\ngo 1.22\n",
    "main.go": (
        "package main\n\n"
        'import "example.com/shop/store"\n\n'
        "func main() {\n"
        '\ts := store.Open("db")\n'
        "\ts.Close()\n"
        "}\n"
    ),
    "store/store.go": (
        "package store\n\n"
        "type Store struct{ name string }\n\n"
        "func Open(name string) *Store {\n"
        "\treturn &Store{name: clean(name)}\n"
        "}\n\n"
        "func (s *Store) Close() {}\n"
    ),
    "store/clean.go": "package store\n\nfunc clean(s string) string { return s }\n",
    # Decoys: the same names in a package main does not import.
    "other/other.go": (
        "package other\n\nfunc Open() {}\n\nfunc clean(s string) string { return s }\n"
    ),
}


def _names(chunks):
    return {f"{c.path}::{c.qualname}" for c in chunks}


def test_index_links_a_call_to_the_imported_package(git_repo):
    git_repo.commit(REPO)
    index = Index(git_repo.root, counter=CounterSpec("bytes"))
    index.update(workers=1)
    try:
        (main,) = index.find("main.go", "main")
        # `Open` is defined twice in the repository; the import decides.
        assert _names(index.depends_on(main)) == {
            "store/store.go::Open",
            "store/store.go::Store.Close",
        }
        assert {u.name for u in index.uses(main)} == {"Open", "Close"}
        (open_,) = index.find("store/store.go", "Open")
        # A sibling file of the same package is in scope unqualified; other/'s clean is not.
        assert _names(index.depends_on(open_)) == {"store/clean.go::clean", "store/store.go::Store"}
        (store,) = index.find("store/store.go", "Store")
        assert "store/store.go::Open" in _names(index.used_by(store))
    finally:
        index.close()
