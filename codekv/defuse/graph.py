"""The def-use graph: each reference linked to the chunk that defines it.

Resolution order for a name used in a file: a definition in the same file, then one in a
module the file imports (by name or alias, or a wildcard import), then the single definition
of that name in the whole repository. A name with several candidates at the deciding step is
recorded as ambiguous, never guessed; a name defined nowhere (builtins, libraries) is left out.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from codekv.grammars import LANGUAGES
from codekv.grammars.modules import NO_MODULES, LanguageModules, RepoPaths

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
    """Names a file imports, mapped to the chunks defining them in the imported files, plus
    those of the files its language makes visible without an import (``ModuleResolver``)."""
    names: dict[str, set[str]] = defaultdict(set)
    # Only names the file uses matter: a wildcard (a C header, a Go or Java package) may
    # define thousands.
    if used is None:
        used = {ref.name for ref in analysis.references}

    def merge_all(target_defs):
        for name in target_defs.keys() & used:
            names[name] |= target_defs[name]

    language = modules.language(analysis.language)
    for imp in analysis.imports:
        imported = imp.name
        if imported is None and language.imports_all(imp):
            imported = "*"
        if imported is None:
            continue
        for target_path in modules.resolve(path, analysis.language, imp.module):
            target_defs = definitions.get(target_path, {})
            if imported == "*":
                merge_all(target_defs)
            elif imported in target_defs:
                names[imp.alias or imported] |= target_defs[imported]
    for other in language.visible(modules.paths, path):
        merge_all(definitions.get(other, {}))
    return names


class ModuleResolver:
    """Maps an import's module string to repository files, through each language's own
    resolver (``LanguageSpec.modules``), from the snapshot's paths alone."""

    def __init__(self, files: dict):
        self.paths = RepoPaths(files)

    @staticmethod
    def language(name: str) -> LanguageModules:
        spec = LANGUAGES.get(name)
        return spec.modules if spec is not None else NO_MODULES

    def resolve(self, importer: str, language: str, module: str) -> list[str]:
        if not module:
            return []
        return self.language(language).resolve(self.paths, importer, module)
