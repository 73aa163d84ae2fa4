"""Language registry: which files are which language, and their compiled tree-sitter queries.

Each language has its query file, ``queries/<name>.scm``, compiled with the files it shares
with languages whose grammars name the same nodes alike (``LanguageSpec.query_files``), all
using these captures:

``@definition.<kind>`` + ``@name``
    a definition (function, method, class, interface, type, constant, module).
``@call`` + ``@name``
    a call site; ``@name`` is the callee's identifier. Also a reference.
``@reference.<kind>`` + ``@name``
    any other reference worth resolving (a base class, a type, a decorator).
``@branch``, ``@return``
    control flow: if/else/loops/try/match/switch/ternary; return/yield/raise/throw.
``@assign`` + ``@name``
    an assignment and each of its target identifiers.
``@import`` + ``@module`` [+ ``@name`` [+ ``@alias``]]
    one match per imported name.

Queries are compiled once per language per process (compiling the TypeScript query takes tens
of milliseconds, which per file would dominate indexing).
"""

from __future__ import annotations

import builtins
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import PurePosixPath

from tree_sitter import Language, Parser, Query

from codekv.grammars.modules import (
    C_MODULES,
    JAVASCRIPT_MODULES,
    NO_MODULES,
    TYPESCRIPT_MODULES,
    GoModules,
    JavaModules,
    LanguageModules,
    PythonModules,
    RustModules,
)


@dataclass(frozen=True)
class TaskSyntax:
    """How code-QA tasks (``codekv.eval.workloads``) are written in a language: their question
    lines are its line comments, qualified names are written its way, and lines that are no
    code to complete (comments, decorators, preprocessor lines) are skipped."""

    comment: str = "//"
    # How a member is written after its owner: ``Owner.name`` or ``Owner::name``.
    scope: str = "."
    # Line starts that are no completion: comments, annotations/decorators, preprocessor.
    skipped_lines: tuple[str, ...] = ("//", "/*", "*", "@")
    # Callees that are the language's own, not the repository's: no question about them.
    builtins: frozenset[str] = frozenset()

    def line_comment(self, text: str) -> str:
        return f"{self.comment} {text}"

    def qualified(self, qualname: str) -> str:
        return qualname.replace(".", self.scope)


@dataclass(frozen=True)
class LanguageSpec:
    """What the chunker and the anchor extractor need to know about one language."""

    name: str
    extensions: tuple[str, ...]
    load: Callable[[], object]
    # Node types that are chunk units of their own (functions, methods).
    function_types: frozenset[str]
    # Node types that hold members and may be split into their members (classes, impls).
    class_types: frozenset[str]
    # Wrapper node types whose inner definition decides the chunk (decorators, export).
    wrapper_types: frozenset[str] = frozenset()
    # Fields of a wrapper holding the wrapped node, tried in order; else its last named child.
    wrapped_fields: tuple[str, ...] = ("definition", "declaration")
    # Container node types that are transparent for chunking (namespaces, modules).
    namespace_types: frozenset[str] = frozenset()
    # Node types spliced into their parent's member list, their own tokens becoming loose
    # text (C preprocessor conditionals, ``extern "C" {``): no chunk, no name of their own.
    transparent_types: frozenset[str] = frozenset()
    # Field holding a class/namespace's member list, and a function's statement block.
    body_field: str = "body"
    comment_types: frozenset[str] = frozenset({"comment"})
    # How to read a definition's name when the ``name`` field does not hold it.
    name_of: Callable[[object], str | None] | None = field(default=None, compare=False)
    # The type a top-level function belongs to, when the language declares methods outside
    # their type (Go receivers): the chunk becomes the method ``Owner.name``.
    owner_of: Callable[[object], str | None] | None = field(default=None, compare=False)
    # Where a type lists members that no ``body_field`` holds (the methods of a Go interface):
    # its body, as a class's (outlined, split into its members when it is over the budget).
    members_of: Callable[[object], object | None] | None = field(default=None, compare=False)
    # Query files compiled together, in order: a language's own, then those it shares with
    # languages naming the same nodes alike (``ecmascript``, ``jsx``, ``c_family``); default:
    # ``queries/<name>.scm`` alone.
    query_files: tuple[str, ...] = ()
    # Which repository files an import names (``codekv.grammars.modules``); the def-use graph
    # resolves imported names through it.
    modules: LanguageModules = field(default=NO_MODULES, compare=False)
    # The directory of its query files (a ``Path`` or a package resource); default: this
    # package's ``queries``.
    queries: object | None = field(default=None, compare=False)
    # How code-QA tasks drawn from its files are written.
    tasks: TaskSyntax = field(default=TaskSyntax(), compare=False)


def _node_name(node) -> str | None:
    name = node.child_by_field_name("name")
    if name is None:
        return None
    return name.text.decode("utf-8", "replace")


def _loader(module: str, function: str = "language"):
    def load():
        import importlib

        return getattr(importlib.import_module(module), function)()

    return load


def _go_name(node) -> str | None:
    """A type declaration is named by its (first) type spec."""
    if node.type == "type_declaration":
        spec = next((c for c in node.named_children if c.type in ("type_spec", "type_alias")), None)
        return _node_name(spec) if spec is not None else None
    return _node_name(node)


def _go_interface(node):
    """The method list of ``type Name interface { ... }`` (its first type spec), else None."""
    spec = next((c for c in node.named_children if c.type == "type_spec"), None)
    kind = spec.child_by_field_name("type") if spec is not None else None
    return kind if kind is not None and kind.type == "interface_type" else None


def _go_receiver(node) -> str | None:
    """Go methods are qualified by their receiver type: ``(s *Server[T]) Serve`` -> ``Server``."""
    receiver = node.child_by_field_name("receiver")
    if node.type != "method_declaration" or receiver is None:
        return None
    parameter = next(
        (c for c in receiver.named_children if c.type == "parameter_declaration"), None
    )
    target = parameter.child_by_field_name("type") if parameter is not None else None
    while target is not None and target.type in ("pointer_type", "generic_type",
                                                 "parenthesized_type"):
        target = target.child_by_field_name("type") or next(iter(target.named_children), None)
    if target is None or target.type != "type_identifier":
        return None
    return target.text.decode("utf-8", "replace")


_C_NAMES = frozenset({
    "identifier", "field_identifier", "type_identifier", "namespace_identifier",
    "destructor_name", "operator_name",
})
_C_QUALIFIED = frozenset({"qualified_identifier", "template_type", "template_function",
                          "template_method"})
_C_SPECIFIERS = frozenset({"struct_specifier", "union_specifier", "enum_specifier",
                           "class_specifier"})


def _c_text(node) -> str:
    return node.text.decode("utf-8", "replace")


def _c_inner(node):
    """One step into a C/C++ declarator: ``*p``, ``&r``, ``(p)``, ``f(...)``, ``a[3]``."""
    return node.child_by_field_name("declarator") or next(
        (c for c in node.named_children
         if c.type.endswith("declarator") or c.type in _C_NAMES or c.type in _C_QUALIFIED
         or c.type == "operator_cast"),
        None,
    )


def _c_declared(node) -> str | None:
    """The name a declarator declares; the last part of a qualified one (``A::b`` -> ``b``)."""
    while node is not None:
        if node.type in _C_NAMES:
            return _c_text(node)
        if node.type == "operator_cast":  # `operator bool`
            target = node.child_by_field_name("type")
            return f"operator {_c_text(target)}" if target is not None else "operator"
        if node.type == "nested_namespace_specifier":  # `namespace a::b`
            return ".".join(_c_text(c) for c in node.named_children)
        if node.type in _C_QUALIFIED:
            node = node.child_by_field_name("name")
            continue
        node = _c_inner(node)
    return None


def _c_name(node) -> str | None:
    """C/C++ definitions keep their name inside declarators: ``int **f(void)`` -> ``f``.

    A struct/union/enum in a typedef is named by the typedef (``typedef struct {..} point;``).
    """
    if node.type in _C_SPECIFIERS and node.parent is not None \
            and node.parent.type == "type_definition":
        return _c_declared(node.parent.child_by_field_name("declarator"))
    declarator = node.child_by_field_name("declarator")
    if declarator is not None:
        return _c_declared(declarator)
    name = node.child_by_field_name("name")
    return _c_declared(name) if name is not None else None


def _cpp_owner(node) -> str | None:
    """The scope of an out-of-class definition: ``int ns::Box<T>::get()`` -> ``ns.Box``."""
    if node.type != "function_definition":
        return None
    declarator = node.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "qualified_identifier":
        if declarator.type in _C_NAMES or declarator.type == "operator_cast":
            return None
        declarator = _c_inner(declarator)
    scopes = []
    while declarator is not None and declarator.type == "qualified_identifier":
        scope = declarator.child_by_field_name("scope")
        if scope is not None:  # `::f` names the global scope
            scopes.append(_c_declared(scope) or _c_text(scope))
        declarator = declarator.child_by_field_name("name")
    return ".".join(scopes) or None


_JS_VALUES = frozenset({
    "arrow_function", "function_expression", "generator_function", "class",
})


def _js_name(node) -> str | None:
    """A function or class value is named by what holds it: ``const f = () => ...`` -> ``f``."""
    name = None
    if node.type in _JS_VALUES and node.parent is not None:
        holder = node.parent
        if holder.type == "variable_declarator":
            name = holder.child_by_field_name("name")
        elif holder.type in ("field_definition", "public_field_definition"):
            name = holder.child_by_field_name("property") or holder.child_by_field_name("name")
        elif holder.type == "export_statement":
            return "default"
    name = name or node.child_by_field_name("name")
    if name is None or name.type in ("object_pattern", "array_pattern"):
        return None
    text = name.text.decode("utf-8", "replace")
    return text.strip("'\"") if name.type == "string" else text


def _rust_name(node) -> str | None:
    """An impl block is named by the type it implements: ``impl<T> Tr for &a::Foo<T>`` -> Foo."""
    if node.type == "impl_item":
        target = node.child_by_field_name("type")
        while target is not None and target.type in ("generic_type", "reference_type",
                                                     "pointer_type", "scoped_type_identifier"):
            target = target.child_by_field_name("type") or target.child_by_field_name("name")
        return target.text.decode("utf-8", "replace") if target is not None else None
    return _node_name(node)


PYTHON = LanguageSpec(
    name="python",
    extensions=(".py", ".pyi"),
    load=_loader("tree_sitter_python"),
    function_types=frozenset({"function_definition"}),
    class_types=frozenset({"class_definition"}),
    wrapper_types=frozenset({"decorated_definition"}),
    modules=PythonModules(),
    tasks=TaskSyntax("#", skipped_lines=("#", "@"), builtins=frozenset(vars(builtins))),
)

# Function and class values count as definitions where the chunker meets them: a declarator
# (`const f = () => ...`) and a class field (`handler = () => ...`) are wrappers around their
# value, named by ``_js_name``; `export default function () {}` is named "default".
_JS_FUNCTIONS = frozenset({
    "function_declaration", "generator_function_declaration", "method_definition",
    "arrow_function", "function_expression", "generator_function",
})
_JS_CLASSES = frozenset({"class_declaration", "class"})
_JS_WRAPPERS = frozenset({
    "export_statement", "lexical_declaration", "variable_declaration", "variable_declarator",
})

JAVASCRIPT = LanguageSpec(
    name="javascript",
    extensions=(".js", ".mjs", ".cjs", ".jsx"),
    load=_loader("tree_sitter_javascript"),
    function_types=_JS_FUNCTIONS,
    class_types=_JS_CLASSES,
    wrapper_types=_JS_WRAPPERS | {"field_definition"},
    name_of=_js_name,
    modules=JAVASCRIPT_MODULES,
    query_files=("javascript", "ecmascript", "jsx"),
)

TYPESCRIPT = LanguageSpec(
    name="typescript",
    extensions=(".ts", ".mts", ".cts"),
    load=_loader("tree_sitter_typescript", "language_typescript"),
    function_types=_JS_FUNCTIONS | {"function_signature", "method_signature",
                                    "abstract_method_signature"},
    class_types=_JS_CLASSES | {"abstract_class_declaration", "interface_declaration",
                               "enum_declaration", "type_alias_declaration"},
    # `namespace N {}` parses inside an expression statement; `declare ...` is ambient.
    wrapper_types=_JS_WRAPPERS | {"public_field_definition", "ambient_declaration",
                                  "expression_statement"},
    namespace_types=frozenset({"internal_module", "module"}),
    # A method's decorators are siblings before it in a class body: fold them in like comments.
    comment_types=frozenset({"comment", "decorator"}),
    name_of=_js_name,
    modules=TYPESCRIPT_MODULES,
    query_files=("typescript", "ecmascript"),
)

TSX = LanguageSpec(
    name="tsx",
    extensions=(".tsx",),
    load=_loader("tree_sitter_typescript", "language_tsx"),
    function_types=TYPESCRIPT.function_types,
    class_types=TYPESCRIPT.class_types,
    wrapper_types=TYPESCRIPT.wrapper_types,
    namespace_types=TYPESCRIPT.namespace_types,
    comment_types=TYPESCRIPT.comment_types,
    name_of=_js_name,
    modules=TYPESCRIPT_MODULES,
    query_files=("typescript", "ecmascript", "jsx"),
)

# Go's predeclared functions (the language specification's "Built-in functions").
GO_BUILTINS = frozenset({
    "append", "cap", "clear", "close", "complex", "copy", "delete", "imag", "len", "make",
    "max", "min", "new", "panic", "print", "println", "real", "recover",
})

GO = LanguageSpec(
    name="go",
    extensions=(".go",),
    load=_loader("tree_sitter_go"),
    # ``method_elem``: a method an interface declares.
    function_types=frozenset({"function_declaration", "method_declaration", "method_elem"}),
    class_types=frozenset({"type_declaration"}),
    name_of=_go_name,
    owner_of=_go_receiver,
    members_of=_go_interface,
    modules=GoModules(),
    tasks=TaskSyntax(builtins=GO_BUILTINS),
)

RUST = LanguageSpec(
    name="rust",
    extensions=(".rs",),
    load=_loader("tree_sitter_rust"),
    function_types=frozenset({"function_item", "function_signature_item", "macro_definition"}),
    class_types=frozenset({"impl_item", "trait_item", "struct_item", "enum_item", "union_item"}),
    namespace_types=frozenset({"mod_item"}),
    # Attributes (``#[derive(..)]``) sit above an item like comments and travel with it.
    comment_types=frozenset({"line_comment", "block_comment", "attribute_item"}),
    name_of=_rust_name,
    modules=RustModules(),
    tasks=TaskSyntax(scope="::", skipped_lines=("//", "/*", "*", "#[", "#!")),
)

JAVA = LanguageSpec(
    name="java",
    extensions=(".java",),
    load=_loader("tree_sitter_java"),
    function_types=frozenset({"method_declaration", "constructor_declaration",
                              "compact_constructor_declaration"}),
    class_types=frozenset({"class_declaration", "interface_declaration", "enum_declaration",
                           "record_declaration", "annotation_type_declaration"}),
    # An enum's methods sit in a declarations node after its constants.
    transparent_types=frozenset({"enum_body_declarations"}),
    comment_types=frozenset({"line_comment", "block_comment"}),
    modules=JavaModules(),
)

# Preprocessor conditionals (header guards, `#ifdef FEATURE`) and `extern "C" {` are no
# scopes: their contents are chunked as if they stood outside. So is a parse error, which
# conditionals around unbalanced braces (`#ifdef __cplusplus` + `extern "C" {`) often cause.
_C_TRANSPARENT = frozenset({"preproc_if", "preproc_ifdef", "preproc_else", "preproc_elif",
                            "preproc_elifdef", "linkage_specification", "declaration_list",
                            "ERROR"})

# Comments and preprocessor lines (``#include``, ``#define``) are no code to complete.
C_SKIPPED_LINES = ("//", "/*", "*", "#")

C = LanguageSpec(
    name="c",
    extensions=(".c", ".h"),
    load=_loader("tree_sitter_c"),
    function_types=frozenset({"function_definition"}),
    class_types=frozenset({"struct_specifier", "union_specifier", "enum_specifier"}),
    # `typedef struct {...} point;` is the struct's chunk; `typedef int id;` is loose.
    wrapper_types=frozenset({"type_definition"}),
    wrapped_fields=("type",),
    transparent_types=_C_TRANSPARENT,
    name_of=_c_name,
    modules=C_MODULES,
    query_files=("c", "c_family"),
    tasks=TaskSyntax(skipped_lines=C_SKIPPED_LINES),
)

CPP = LanguageSpec(
    name="cpp",
    extensions=(".cc", ".cpp", ".cxx", ".hpp", ".hh", ".hxx", ".ipp"),
    load=_loader("tree_sitter_cpp"),
    function_types=frozenset({"function_definition"}),
    class_types=frozenset({"class_specifier", "struct_specifier", "union_specifier",
                           "enum_specifier"}),
    wrapper_types=frozenset({"template_declaration", "type_definition"}),
    wrapped_fields=("type",),
    namespace_types=frozenset({"namespace_definition"}),
    transparent_types=_C_TRANSPARENT,
    name_of=_c_name,
    owner_of=_cpp_owner,
    modules=C_MODULES,
    query_files=("cpp", "c_family"),
    tasks=TaskSyntax(scope="::", skipped_lines=C_SKIPPED_LINES),
)

def _query_names(spec: LanguageSpec) -> tuple[str, ...]:
    return spec.query_files or (spec.name,)


def _query_dir(spec: LanguageSpec):
    return spec.queries or resources.files(__package__).joinpath("queries")


def _has_queries(spec: LanguageSpec) -> bool:
    return all(_query_dir(spec).joinpath(f"{name}.scm").is_file() for name in _query_names(spec))


LANGUAGES: dict[str, LanguageSpec] = {}
_BY_EXTENSION: dict[str, LanguageSpec] = {}


def register(spec: LanguageSpec) -> LanguageSpec:
    """Add a language: its files are chunked and analysed from then on."""
    LANGUAGES[spec.name] = spec
    # A language without its query file is indexed as plain text rather than half-analysed.
    if _has_queries(spec):
        _BY_EXTENSION.update(dict.fromkeys(spec.extensions, spec))
    return spec


for _spec in (PYTHON, JAVASCRIPT, TYPESCRIPT, TSX, GO, RUST, JAVA, C, CPP):
    register(_spec)
del _spec


def language_for_path(path: str) -> LanguageSpec | None:
    """The language of a repository path, by its extension; None for other files."""
    return _BY_EXTENSION.get(PurePosixPath(path).suffix.lower())


def definition_name(spec: LanguageSpec, node) -> str | None:
    """The declared name of a definition node, or None when it has none."""
    if spec.name_of is not None:
        return spec.name_of(node)
    return _node_name(node)


@functools.cache
def tree_sitter_language(name: str) -> Language:
    return Language(LANGUAGES[name].load())


@functools.cache
def query(name: str) -> Query:
    """The language's anchor query, compiled once per process."""
    spec = LANGUAGES[name]
    source = "\n".join(
        _query_dir(spec).joinpath(f"{file}.scm").read_text() for file in _query_names(spec)
    )
    return Query(tree_sitter_language(name), source)


def parser(name: str) -> Parser:
    return Parser(tree_sitter_language(name))
