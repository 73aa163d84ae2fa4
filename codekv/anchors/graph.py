"""The def-use graph: each reference linked to the chunk that defines it.

Resolution order for a name used in a file: a definition in the same file, then one in a
module the file imports (by name or alias, or a wildcard import), then the single definition
of that name in the whole repository. A name with several candidates at the deciding step is
recorded as ambiguous, never guessed; a name defined nowhere (builtins, libraries) is left out.
"""

from __future__ import annotations

import posixpath
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # networkx takes 0.1 s to import; only build_graph needs it
    import networkx as nx


@dataclass(frozen=True)
class Use:
    """A reference in ``source`` (a chunk id) resolved to the chunk ``target`` that defines it."""

    source: str
    target: str
    name: str
    kind: str
    start_byte: int
    end_byte: int


@dataclass
class DefUseGraph:
    graph: nx.DiGraph  # chunk id -> chunk id, edge attribute "names"
    uses: list[Use] = field(default_factory=list)
    ambiguous: dict[str, set[str]] = field(default_factory=dict)  # chunk id -> names

    def depends_on(self, chunk_id: str) -> list[str]:
        """Chunks defining what ``chunk_id`` uses."""
        if chunk_id not in self.graph:
            return []
        return sorted(self.graph.successors(chunk_id))

    def used_by(self, chunk_id: str) -> list[str]:
        """Chunks using what ``chunk_id`` defines."""
        if chunk_id not in self.graph:
            return []
        return sorted(self.graph.predecessors(chunk_id))


def build_graph(files: dict) -> DefUseGraph:
    """Link references to definitions across the files of one snapshot.

    ``files`` maps each path to its blob's analysis or stored symbols: anything with
    ``language``, ``definitions``, ``references``, ``imports`` and ``chunk_ids`` (or
    ``FileSymbols``, the plain form the indexer builds without those objects).
    """
    import networkx as nx

    symbols = {path: FileSymbols.of(analysis) for path, analysis in files.items()}
    graph = nx.DiGraph()
    for path, sym in symbols.items():
        graph.add_nodes_from(sym.chunk_ids, path=path)
    result = DefUseGraph(graph)
    for resolved in resolve_snapshot(symbols).values():
        for chunk_id, name in resolved.ambiguous:
            result.ambiguous.setdefault(chunk_id, set()).add(name)
        for _, source, target, name, kind, start, end in resolved.uses:
            result.uses.append(Use(source, target, name, kind, start, end))
            if graph.has_edge(source, target):
                graph.edges[source, target]["names"].add(name)
            else:
                graph.add_edge(source, target, names={name})
    return result


class FileSymbols:
    """What resolution needs of one file, as plain tuples (cheap to build, pickle and store).

    ``defs``: (name, chunk id); ``refs``: (name, kind, chunk id, start byte, end byte);
    ``imports``: objects with ``module``, ``name`` and ``alias``.
    """

    __slots__ = ("language", "defs", "refs", "imports", "chunk_ids")

    def __init__(self, language, defs, refs, imports, chunk_ids):
        self.language = language
        self.defs = defs
        self.refs = refs
        self.imports = imports
        self.chunk_ids = chunk_ids

    @classmethod
    def of(cls, analysis) -> FileSymbols:
        if isinstance(analysis, FileSymbols):
            return analysis
        from codekv.analysis import Reference

        refs = analysis.references
        if not all(type(r) is Reference for r in refs):
            refs = [(r.name, r.kind, r.chunk_id, r.start_byte, r.end_byte) for r in refs]
        # A Reference already is (name, kind, chunk id, start byte, end byte).
        return cls(
            analysis.language,
            [(d.name, d.chunk_id) for d in analysis.definitions],
            refs,
            list(analysis.imports),
            list(analysis.chunk_ids),
        )

    def by_name(self) -> dict[str, set[str]]:
        """This file's definitions: name -> chunk ids."""
        names: dict[str, set[str]] = defaultdict(set)
        for name, chunk_id in self.defs:
            names[name].add(chunk_id)
        return names


@dataclass
class Resolved:
    """One file's resolution: its uses, ambiguous names, and what the result depended on.

    ``uses``: (reference index, source, target, name, kind, start byte, end byte), in
    reference order. ``falls``: names that no local or imported definition decided, so the
    whole repository's definitions did. ``deps``: files whose definitions were consulted.
    """

    uses: list[tuple]
    ambiguous: list[tuple[str, str]]
    falls: set[str]
    deps: set[str]


def resolve_snapshot(symbols: dict[str, FileSymbols]) -> dict[str, Resolved]:
    """Resolve every file of a snapshot (``symbols`` in snapshot order)."""
    definitions: dict[str, dict[str, set[str]]] = {}  # path -> name -> chunk ids
    everywhere: dict[str, set[str]] = defaultdict(set)  # name -> chunk ids
    for path, sym in symbols.items():
        definitions[path] = sym.by_name()
        for name, chunk_id in sym.defs:
            everywhere[name].add(chunk_id)
    modules = ModuleResolver(symbols)
    return {
        path: resolve_file(path, sym, definitions, everywhere, modules)
        for path, sym in symbols.items()
    }


def resolve_file(path, sym: FileSymbols, definitions, everywhere, modules) -> Resolved:
    """Resolve one file's references: a definition in the file, else one it imports, else the
    single definition anywhere. ``definitions`` and ``everywhere`` may be lazy mappings."""
    local = definitions.get(path) or {}
    consulted = _Consulted(definitions)
    imported = _imported_names(path, sym, modules, consulted, {ref[0] for ref in sym.refs})
    uses: list[tuple] = []
    ambiguous: list[tuple[str, str]] = []
    falls: set[str] = set()
    local_get, imported_get = local.get, imported.get
    for index, (name, kind, chunk_id, start, end) in enumerate(sym.refs):
        targets = local_get(name) or imported_get(name)  # _resolve, inlined: 344k calls
        if not targets:
            falls.add(name)
            targets = everywhere.get(name)
            if not targets:
                continue
        if len(targets) > 1:
            ambiguous.append((chunk_id, name))
            continue
        (target,) = targets
        if target != chunk_id:
            uses.append((index, chunk_id, target, name, kind, start, end))
    return Resolved(uses, ambiguous, falls, consulted.keys)


class _Consulted:
    """A read-only view of ``definitions`` that records which files were looked at."""

    def __init__(self, definitions):
        self.definitions = definitions
        self.keys: set[str] = set()

    def get(self, path, default=None):
        self.keys.add(path)
        return self.definitions.get(path, default)

    def __getitem__(self, path):
        self.keys.add(path)
        return self.definitions[path]

    def __contains__(self, path) -> bool:
        self.keys.add(path)
        return path in self.definitions


def _resolve(name, local, imported, everywhere) -> set[str] | None:
    for scope in (local, imported, everywhere):
        if scope is None:
            continue
        targets = scope.get(name)
        if targets:
            return targets
    return None


def _imported_names(path, analysis, modules, definitions, used=None) -> dict[str, set[str]]:
    """Names a file imports, mapped to the chunks defining them in the imported files."""
    names: dict[str, set[str]] = defaultdict(set)
    # Only names the file uses matter: a wildcard (a C header, a Go or Java package) may
    # define thousands.
    if used is None:
        used = {ref.name for ref in analysis.references}

    def merge_all(target_defs):
        for name in target_defs.keys() & used:
            names[name] |= target_defs[name]

    for imp in analysis.imports:
        imported = imp.name
        if imported is None and analysis.language == "go" and imp.alias != "_":
            # A Go import brings in a whole package, whose names are used qualified
            # (``util.Helper``); references carry only ``Helper``, so all of them are in scope.
            imported = "*"
        if imported is None and analysis.language in ("c", "cpp"):
            # `#include "x.h"` brings in all that x.h (and its implementation file) defines.
            imported = "*"
        if imported is None:
            continue
        for target_path in modules.resolve(path, analysis.language, imp.module):
            target_defs = definitions.get(target_path, {})
            if imported == "*":
                merge_all(target_defs)
            elif imported in target_defs:
                names[imp.alias or imported] |= target_defs[imported]
    if analysis.language == "go":
        # The other files of a Go package (its directory) share its scope. They join the
        # imported names rather than the local ones, so a name both they and an imported
        # package define stays ambiguous instead of being guessed.
        for sibling in modules.go_package(posixpath.dirname(path)):
            if sibling != path:
                merge_all(definitions.get(sibling, {}))
    if analysis.language == "java":
        # A Java package's classes see each other without imports; like Go's, they join the
        # imported names, so a name both they and an import define stays ambiguous.
        for sibling in modules.java_package(posixpath.dirname(path)):
            if sibling != path:
                merge_all(definitions.get(sibling, {}))
    if analysis.language in ("c", "cpp"):
        # A header and its implementation file (x.h beside x.c) see each other's definitions.
        for companion in modules.c_companions(path):
            merge_all(definitions.get(companion, {}))
    return names


class ModuleResolver:
    """Maps an import's module string to repository files, per language, by path suffix."""

    def __init__(self, files: dict):
        self.paths = set(files)
        self.by_suffix: dict[str, list[str]] = defaultdict(list)
        for path in files:
            parts = path.split("/")
            for index in range(len(parts)):
                self.by_suffix["/".join(parts[index:])].append(path)

    def resolve(self, importer: str, language: str, module: str) -> list[str]:
        if not module:
            return []
        resolver = getattr(self, f"_{language}", None)
        return resolver(importer, module) if resolver else []

    def _suffix(self, *candidates: str) -> list[str]:
        for candidate in candidates:
            found = self.by_suffix.get(candidate)
            if found:
                return found
        return []

    def _exact(self, *candidates: str) -> list[str]:
        return [c for c in candidates if c in self.paths][:1]

    def _python(self, importer: str, module: str) -> list[str]:
        module = module.replace(" ", "")
        if module.startswith("."):
            dots = len(module) - len(module.lstrip("."))
            base = posixpath.dirname(importer)
            for _ in range(dots - 1):
                base = posixpath.dirname(base)
            rest = module[dots:].replace(".", "/")
            stem = posixpath.join(base, rest) if rest else base
            return self._exact(f"{stem}.py", f"{stem}/__init__.py", f"{stem}.pyi")
        stem = module.replace(".", "/")
        return self._suffix(f"{stem}.py", f"{stem}/__init__.py", f"{stem}.pyi")

    # -- Go: a package is a directory ----------------------------------------------------
    def go_package(self, directory: str) -> list[str]:
        """The .go files directly in ``directory`` (a Go package)."""
        if not hasattr(self, "_go_dirs"):
            self._go_dirs: dict[str, list[str]] = defaultdict(list)
            for path in sorted(self.paths):
                if path.endswith(".go"):
                    self._go_dirs[posixpath.dirname(path)].append(path)
        return self._go_dirs.get(directory, [])

    def _go(self, importer: str, module: str) -> list[str]:
        """``example.com/shop/store`` -> the .go files of the package directory ``store``.

        A directory the import path ends with wins (the longest); else, for a module kept in
        a subdirectory, the directory ending with the path's longest tail of two or more
        segments, when only one does. One-segment paths (``fmt``, ``log``) are the standard
        library's; a package never imports itself.
        """
        segments = [s for s in module.strip("/").split("/") if s]
        if len(segments) < 2:
            return []
        module = "/".join(segments)
        self.go_package("")
        own = posixpath.dirname(importer)
        dirs = [d for d in self._go_dirs if d and d != own]
        exact = [d for d in dirs if module == d or module.endswith("/" + d)]
        if exact:
            return list(self._go_dirs[max(exact, key=len)])
        for start in range(len(segments) - 1):
            tail = "/".join(segments[start:])
            found = [d for d in dirs if d.endswith("/" + tail)]
            if len(found) == 1:
                return list(self._go_dirs[found[0]])
            if found:
                return []  # several packages end the same way: not guessed
        return []

    # -- Rust: modules are files (a.rs or a/mod.rs), crates are directories with src/ ------
    def _rust(self, importer: str, module: str) -> list[str]:
        parts = [p for p in module.split("::") if p]
        if not parts:
            return []
        head, rest = parts[0], parts[1:]
        if head in ("self", "super"):
            base = self._rust_module_dir(importer)
            while parts and parts[0] in ("self", "super"):
                if parts.pop(0) == "super":
                    base = posixpath.dirname(base)
            return self._rust_module(base, parts)
        crate = self._rust_crate_dir(importer)
        if head == "crate":
            if crate is not None:
                found = self._rust_module(crate, rest)
                if found:
                    return found
            stem = "/".join(rest)
            if not stem:
                return []
            return self._suffix(
                f"src/{stem}.rs", f"src/{stem}/mod.rs", f"{stem}.rs", f"{stem}/mod.rs"
            )
        # A bare path: a child module (2018 paths), a crate-root module (2015 paths), or
        # another crate of the workspace, by its directory.
        found = self._rust_module(self._rust_module_dir(importer), parts)
        if not found and crate is not None:
            found = self._rust_module(crate, parts)
        if found:
            return found
        stem = "/".join(rest)
        for name in dict.fromkeys((head, head.replace("_", "-"))):
            if stem:
                found = self._suffix(f"{name}/src/{stem}.rs", f"{name}/src/{stem}/mod.rs")
            else:
                found = self._suffix(f"{name}/src/lib.rs")
            if found:
                return found
        return []

    def _rust_module(self, directory: str, parts: list[str]) -> list[str]:
        """The file of module ``parts`` below the module whose children live in ``directory``."""
        stem = posixpath.join(directory, *parts) if parts else directory
        if parts or directory:
            found = self._exact(f"{stem}.rs", f"{stem}/mod.rs")
            if found or parts:
                return found
        return self._exact(posixpath.join(stem, "lib.rs"), posixpath.join(stem, "main.rs"))

    @staticmethod
    def _rust_module_dir(path: str) -> str:
        """Where a file's child modules live: ``src/a.rs`` and ``src/a/mod.rs`` -> ``src/a``."""
        directory, name = posixpath.split(path)
        if name in ("mod.rs", "lib.rs", "main.rs"):
            return directory
        return posixpath.join(directory, name[: -len(".rs")] if name.endswith(".rs") else name)

    def _rust_crate_dir(self, path: str) -> str | None:
        """The nearest directory above ``path`` holding lib.rs or main.rs (a crate root)."""
        directory = posixpath.dirname(path)
        while True:
            roots = (posixpath.join(directory, "lib.rs"), posixpath.join(directory, "main.rs"))
            if self._exact(*roots):
                return directory
            if not directory:
                return None
            directory = posixpath.dirname(directory)

    _JS_EXTENSIONS = (".js", ".jsx", ".mjs", ".cjs", ".ts", ".tsx", ".mts", ".cts", ".d.ts")
    _TS_EXTENSIONS = (".ts", ".tsx", ".d.ts", ".mts", ".cts", ".js", ".jsx", ".mjs", ".cjs")

    def _javascript(self, importer: str, module: str, extensions=_JS_EXTENSIONS) -> list[str]:
        """'./x' and '../x' against the importer's directory: x itself, x.<ext>, x/index.<ext>.

        Bare specifiers ('react', '@scope/pkg') name packages outside the repository.
        """
        if module not in (".", "..") and not module.startswith(("./", "../")):
            return []
        stem = posixpath.normpath(posixpath.join(posixpath.dirname(importer), module))
        if stem == ".." or stem.startswith("../"):
            return []
        stem = "" if stem == "." else stem
        candidates = [stem] if stem else []
        root, ext = posixpath.splitext(stem)
        if ext in (".js", ".jsx", ".mjs", ".cjs"):
            # TypeScript's ESM style names the compiled file: './x.js' is x.ts in the source.
            candidates += [root + e for e in extensions]
        if stem:
            candidates += [stem + e for e in extensions]
        candidates += [posixpath.join(stem, "index" + e) for e in extensions]
        return self._exact(*candidates)

    def _typescript(self, importer: str, module: str) -> list[str]:
        return self._javascript(importer, module, self._TS_EXTENSIONS)

    _tsx = _typescript

    # -- Java: a package is a directory, a top-level class a file --------------------------
    def java_package(self, directory: str) -> list[str]:
        """The .java files directly in ``directory``, or in any directory ending with it."""
        if not hasattr(self, "_java_dirs"):
            self._java_dirs: dict[str, list[str]] = defaultdict(list)
            for path in sorted(self.paths):
                if path.endswith(".java"):
                    parts = posixpath.dirname(path).split("/")
                    for index in range(len(parts)):
                        self._java_dirs["/".join(parts[index:])].append(path)
        return self._java_dirs.get(directory, [])

    def _java(self, importer: str, module: str) -> list[str]:
        """``a.b`` (from ``import a.b.C`` or ``a.b.*``) -> the files of package directory a/b.

        The imported name picks its class out of them (C.java defines C). A static or nested
        import names a class: ``a.b.Util`` (``import static a.b.Util.max``) -> a/b/Util.java.
        """
        stem = module.replace(" ", "").replace(".", "/")
        return list(self._suffix(f"{stem}.java")) or self.java_package(stem)

    # -- C/C++: `#include "x.h"` is a path ---------------------------------------------------
    _C_HEADERS = (".h", ".hh", ".hpp", ".hxx", ".h++", ".inl", ".ipp")
    _C_SOURCES = (".c", ".cc", ".cpp", ".cxx", ".c++")

    def _c(self, importer: str, module: str) -> list[str]:
        """``"x.h"`` next to the importer, else any x.h by path suffix (``<x.h>`` only so),
        plus the header's implementation file: x.c/x.cc/x.cpp beside it, or the only one."""
        system = module.startswith("<")
        # The answer depends on the importer's directory only; big C trees repeat includes.
        key = (None if system else posixpath.dirname(importer), module)
        cache = self.__dict__.setdefault("_c_cache", {})
        if key not in cache:
            cache[key] = self._c_resolve(importer, module, system)
        return cache[key]

    def _c_resolve(self, importer: str, module: str, system: bool) -> list[str]:
        name = posixpath.normpath(module.strip("<>\" \t"))
        headers: list[str] = []
        if not system:
            local = posixpath.normpath(posixpath.join(posixpath.dirname(importer), name))
            headers = self._exact(local)
        if not headers:
            while name.startswith("../"):  # relative to an include dir we don't know
                name = name[3:]
            headers = list(self._suffix(name))
        found = list(headers)
        for header in headers:
            stem, ext = posixpath.splitext(header)
            if ext.lower() not in self._C_HEADERS:
                continue
            sources = self._exact(*(stem + e for e in self._C_SOURCES))
            if not sources:
                base = posixpath.basename(stem)
                unique = [self._suffix(base + e) for e in self._C_SOURCES]
                unique = [path for paths in unique for path in paths]
                sources = unique if len(unique) == 1 else []
            found += [path for path in sources if path not in found]
        return found

    _cpp = _c

    def c_companions(self, path: str) -> list[str]:
        """x.h's implementation files beside it (x.c, x.cc, x.cpp, ...), or x.c's headers."""
        stem, ext = posixpath.splitext(path)
        ext = ext.lower()
        others = (self._C_SOURCES if ext in self._C_HEADERS
                  else self._C_HEADERS if ext in self._C_SOURCES else ())
        return [stem + e for e in others if stem + e in self.paths]
