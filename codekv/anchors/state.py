"""The def-use graph of the indexed snapshot, stored per path so a changed file updates it.

Resolving every reference of the standard library (344k) takes seconds, most of it reading
them back from the database; after one file changes, few can resolve differently:

- the file's own references;
- references in files whose imported names were read from it (``graph_deps``);
- anywhere else, references to a name the file defines (before or after the change) that
  only the repository-wide lookup decided (``graph_falls``), and only when that lookup's
  answer for the name changes (unique target <-> ambiguous or none, or a new chunk id).

Those files are resolved again with ``resolve_file``, the same code a full build runs, so an
update gives exactly what a full build of the new snapshot would; when the set of paths
changes (module resolution depends on it) or many files are touched, a full build runs.

``graph_nodes`` counts distinct chunk ids and ``graph_edges`` distinct (source, target)
pairs, as the networkx graph of ``build_graph`` would.
"""

from __future__ import annotations

import json
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass

from codekv.anchors.graph import FileSymbols, ModuleResolver, resolve_file, resolve_snapshot

# Beyond this many re-resolved files an update is no cheaper than a full build.
MAX_UPDATED_PATHS = 200


class _Import:
    __slots__ = ("module", "name", "alias")

    def __init__(self, module, name, alias):
        self.module, self.name, self.alias = module, name, alias


@dataclass
class BlobInfo:
    """One analysed blob as the graph and the statistics need it."""

    symbols: FileSymbols
    chunks: Counter  # chunk kind -> count
    anchors: Counter  # anchor kind -> count
    syntax_errors: int
    decode_errors: bool

    @classmethod
    def unpack(cls, language: str, syntax_errors, decode_errors, data: dict) -> BlobInfo:
        """From the symbols ``storage`` packs for each blob (see ``BlobSymbols``): as stored,
        or as a worker made them (``StoredBlob.symbols``). References stay lists."""
        chunks = data["c"]
        anchors = Counter()
        for _, _, counts in chunks:
            for kind, count in counts.items():
                anchors[kind] += count
        symbols = FileSymbols(
            language,
            [(d[0], d[2]) for d in data["d"]],
            data["r"],
            [_Import(i[0], i[1], i[2]) for i in data["i"]],
            [c[0] for c in chunks],
        )
        return cls(symbols, Counter(c[1] for c in chunks), anchors, syntax_errors,
                   bool(decode_errors))


def _target(targets: set[str]):
    """What the repository-wide lookup answers for a name with these definitions."""
    if len(targets) == 1:
        return next(iter(targets))
    return "*ambiguous*" if targets else None


def _pack(uses: list[tuple]) -> bytes:
    return zlib.compress(json.dumps(uses).encode(), 1)


def _unpack(packed: bytes) -> list[list]:
    return json.loads(zlib.decompress(packed))


def _rows(path: str, key: tuple[str, str], info: BlobInfo, resolved) -> dict[str, list]:
    """The graph state rows of one path (``storage`` adds the repository)."""
    sym = info.symbols
    uses = resolved.uses
    return {
        "graph_paths": [(path, *key, len(uses), _pack(uses))],
        "graph_defs": [(name, path, chunk_id) for name, chunk_id in set(sym.defs)],
        "graph_falls": [(name, path) for name in resolved.falls],
        "graph_deps": [(target, path) for target in resolved.deps],
    }


class GraphState:
    """Builds or updates the stored graph of ``files`` (a snapshot, in path order).

    ``blobs(keys)`` returns ``BlobInfo`` for (blob hash, language) keys: from this run's
    analyses or the database; keys it cannot find are left out.
    """

    def __init__(self, store, repo_id: int, chunker: str, files, blobs):
        self.store = store
        self.repo_id = repo_id
        self.chunker = chunker
        self.files = {f.path: (f.blob_hash, f.language) for f in files}
        self.blobs = blobs

    def save(self, snapshot: str) -> dict:
        """Store the graph of the snapshot keyed ``snapshot``; returns its statistics."""
        update = self._update()
        if update is None:
            stats, rows, replace = self._full()
        else:
            stats, rows, replace = update
        stored = dict(stats, chunker=self.chunker)
        self.store.put_graph_state(self.repo_id, snapshot, stored, rows, replace)
        return stats

    # -- a full build ----------------------------------------------------------------------
    def _full(self):
        infos = self.blobs(set(self.files.values()))
        files = {path: key for path, key in self.files.items() if key in infos}
        resolved = resolve_snapshot({path: infos[key].symbols for path, key in files.items()})
        rows: dict[str, list] = defaultdict(list)
        pairs: set[tuple[str, str]] = set()
        n_uses = 0
        for path, key in files.items():
            result = resolved[path]
            for table, table_rows in _rows(path, key, infos[key], result).items():
                rows[table].extend(table_rows)
            pairs.update((use[1], use[2]) for use in result.uses)
            n_uses += len(result.uses)
        stats = _blob_stats(files, infos)
        stats["anchors"]["use"] = n_uses
        stats["graph_edges"] = len(pairs)
        return _sorted(stats), rows, None

    # -- an update of the stored graph -----------------------------------------------------
    def _update(self):
        stored = self.store.graph_stats(self.repo_id)
        if stored is None or stored[1].get("chunker") != self.chunker:
            return None
        old = self.store.graph_paths(self.repo_id)
        if set(old) != set(self.files):
            return None
        changed = sorted(p for p, key in self.files.items() if old[p][:2] != key)
        if len(changed) > MAX_UPDATED_PATHS:
            return None
        infos = self.blobs({self.files[p] for p in changed})
        if len(infos) < len({self.files[p] for p in changed}):
            return None
        fresh = {p: infos[self.files[p]].symbols for p in changed}

        # Names the changed files define, before and after, and how the repository-wide
        # lookup answers for them now and before.
        old_defs = defaultdict(set)
        for name, _, chunk_id in self.store.graph_select("graph_defs", "path", self.repo_id,
                                                         changed):
            old_defs[name].add(chunk_id)
        new_defs = defaultdict(set)
        for sym in fresh.values():
            for name, chunk_id in sym.defs:
                new_defs[name].add(chunk_id)
        everywhere = _Everywhere(self, set(changed), new_defs)
        names = set(old_defs) | set(new_defs)
        everywhere.prefetch(names)
        decided = {
            name for name in names
            if _target(everywhere.base[name] | old_defs[name]) != _target(everywhere[name])
        }
        importers = {path for _, path in self.store.graph_select(
            "graph_deps", "target", self.repo_id, changed)}
        falls = {path for _, path in self.store.graph_select(
            "graph_falls", "name", self.repo_id, decided)}
        affected = sorted(set(changed) | importers | falls)
        if len(affected) > MAX_UPDATED_PATHS:
            return None

        keys = {self.files[p] for p in affected}
        infos.update(self.blobs(keys - set(infos)))
        if len(keys - set(infos)):
            return None
        symbols = {p: infos[self.files[p]].symbols for p in affected}
        definitions = _Definitions(self, symbols)
        everywhere.prefetch({ref[0] for sym in symbols.values() for ref in sym.refs})
        modules = ModuleResolver(self.files)
        resolved = {
            p: resolve_file(p, symbols[p], definitions, everywhere, modules) for p in affected
        }

        stats = self._updated_stats(stored[1], old, resolved, infos)
        if stats is None:
            return None
        rows: dict[str, list] = defaultdict(list)
        for path in affected:
            key = self.files[path]
            for table, table_rows in _rows(path, key, infos[key], resolved[path]).items():
                rows[table].extend(table_rows)
        return _sorted(stats), rows, affected

    def _updated_stats(self, stats: dict, old: dict, resolved: dict, infos: dict):
        stats = json.loads(json.dumps(stats))  # a copy
        stats.pop("chunker", None)
        chunks, anchors = Counter(stats["chunks"]), Counter(stats["anchors"])
        uses = anchors.pop("use", 0)

        # Per blob (the last path's language, as a full build counts): chunks, anchors, errors.
        before = {blob: language for blob, language, *_ in (old[p] for p in sorted(old))}
        after = {blob: language for blob, language in self.files.values()}
        moved = [b for b in set(before) | set(after) if before.get(b) != after.get(b)]
        # Per (blob, language): chunk ids, the graph's nodes.
        groups_before = {old[p][:2] for p in old}
        groups_after = set(self.files.values())
        gone, new = groups_before - groups_after, groups_after - groups_before
        wanted = {(b, before[b]) for b in moved if b in before} | gone | new
        wanted |= {(b, after[b]) for b in moved if b in after}
        infos.update(self.blobs(wanted - set(infos)))
        if wanted - set(infos):
            return None
        for blob in moved:
            for language, sign in ((before.get(blob), -1), (after.get(blob), 1)):
                if language is None:
                    continue
                info = infos[blob, language]
                for counter, counts in ((chunks, info.chunks), (anchors, info.anchors)):
                    for kind, count in counts.items():
                        counter[kind] += sign * count
                stats["syntax_errors"] += sign * bool(info.syntax_errors)
                stats["decode_errors"] += sign * bool(info.decode_errors)
        for key, sign in [(g, -1) for g in gone] + [(g, 1) for g in new]:
            stats["graph_nodes"] += sign * len(infos[key].symbols.chunk_ids)

        # Uses and edges: the uses of the re-resolved paths replace theirs; an edge is a
        # distinct (source, target) pair, and sources are chunks of the path's own blob, so
        # only the blobs of re-resolved paths can gain or lose edges.
        stored = self.store.graph_paths(self.repo_id, resolved, uses=False)
        uses += sum(len(r.uses) for r in resolved.values()) - sum(
            stored[p][2] for p in resolved
        )
        touched = {old[p][:2] for p in resolved} | {self.files[p] for p in resolved}
        members = [p for p in old if old[p][:2] in touched or self.files[p] in touched]
        packed = self.store.graph_paths(self.repo_id, members, uses=True)
        old_uses = {p: _unpack(packed[p][3]) for p in members}
        new_uses = {p: resolved[p].uses if p in resolved else old_uses[p] for p in members}
        for group in touched:
            was = {(u[1], u[2]) for p in members if old[p][:2] == group for u in old_uses[p]}
            now = {(u[1], u[2]) for p in members if self.files[p] == group for u in new_uses[p]}
            stats["graph_edges"] += len(now) - len(was)

        anchors["use"] = uses
        stats["chunks"] = {k: v for k, v in chunks.items() if v}
        stats["anchors"] = {k: v for k, v in anchors.items() if v or k == "use"}
        return stats


class _Everywhere:
    """name -> chunk ids defining it anywhere in the new snapshot, read from the stored
    definitions of unchanged paths (``base``) plus the changed files' new ones."""

    def __init__(self, state: GraphState, changed: set[str], new_defs: dict[str, set[str]]):
        self.state = state
        self.changed = changed
        self.new_defs = new_defs
        self.base: dict[str, set[str]] = {}

    def prefetch(self, names) -> None:
        missing = [n for n in names if n not in self.base]
        for name in missing:
            self.base[name] = set()
        rows = self.state.store.graph_select("graph_defs", "name", self.state.repo_id, missing)
        for name, path, chunk_id in rows:
            if path not in self.changed:
                self.base[name].add(chunk_id)

    def __getitem__(self, name: str) -> set[str]:
        if name not in self.base:
            self.prefetch([name])
        return self.base[name] | self.new_defs.get(name, set())

    def get(self, name: str, default=None):
        return self[name] or default


class _Definitions:
    """path -> name -> chunk ids, for the files resolved again (from their symbols) and any
    file they read (from the stored definitions, which are unchanged for those)."""

    def __init__(self, state: GraphState, symbols: dict[str, FileSymbols]):
        self.state = state
        self.known = {p: sym.by_name() for p, sym in symbols.items()}

    def get(self, path: str, default=None):
        if path not in self.state.files:
            return default
        if path not in self.known:
            by_name = defaultdict(set)
            rows = self.state.store.graph_select("graph_defs", "path", self.state.repo_id, [path])
            for name, _, chunk_id in rows:
                by_name[name].add(chunk_id)
            self.known[path] = by_name
        return self.known[path]

    def __getitem__(self, path: str):
        found = self.get(path)
        if found is None:
            raise KeyError(path)
        return found

    def __contains__(self, path: str) -> bool:
        return path in self.state.files


def _blob_stats(files: dict, infos: dict) -> dict:
    """Chunks, anchors and errors per blob (the last path's language), nodes per (blob, lang)."""
    unique = {blob: (blob, language) for blob, language in files.values()}.values()
    chunks, anchors = Counter(), Counter()
    for key in unique:
        chunks.update(infos[key].chunks)
        anchors.update(infos[key].anchors)
    return {
        "chunks": dict(chunks),
        "anchors": dict(anchors),
        "graph_nodes": sum(len(infos[key].symbols.chunk_ids) for key in set(files.values())),
        "graph_edges": 0,
        "syntax_errors": sum(1 for key in unique if infos[key].syntax_errors),
        "decode_errors": sum(1 for key in unique if infos[key].decode_errors),
    }


def _sorted(stats: dict) -> dict:
    stats["chunks"] = dict(sorted(stats["chunks"].items()))
    stats["anchors"] = dict(sorted(stats["anchors"].items()))
    return stats
