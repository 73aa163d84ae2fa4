"""The def-use graph of the indexed snapshot, stored per path so a changed file updates it.

Resolving every reference of the standard library (344k) takes seconds, most of it reading
them back from the database; after one file changes, few can resolve differently:

- the file's own references;
- references in files whose imported names were read from it;
- anywhere else, references to a name the file defines (before or after the change) that
  only the repository-wide lookup decided, and only when that lookup's answer for the name
  changes (unique target <-> ambiguous or none, or a new chunk id).

So each path's row keeps, beside its uses, the basis of its resolution: its definitions,
the names the repository-wide lookup decided, and the files whose definitions it read.

Those files are resolved again with ``resolve_file``, the same code a full build runs, so an
update gives exactly what a full build of the new snapshot would; when the set of paths
changes or many files are touched, a full build runs. This relies on ``ModuleResolver``
answering from the set of paths alone: were it to read file contents, a changed file could
move other files' imports, and updates would have to rebuild.

``graph_nodes`` counts distinct chunk ids and ``graph_edges`` distinct (source, target)
pairs, as the networkx graph of ``build_graph`` would.
"""

from __future__ import annotations

import json
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass

from codekv.defuse.graph import FileSymbols, ModuleResolver, resolve_file, resolve_snapshot

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
        """From the symbols ``index_db`` packs for each blob (see ``BlobSymbols``): as stored,
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


def _pack(data) -> bytes:
    return zlib.compress(json.dumps(data).encode(), 1)


def _unpack(packed: bytes):
    return json.loads(zlib.decompress(packed))


def _row(path: str, key: tuple[str, str], info: BlobInfo, resolved) -> tuple:
    """The path's ``graph_files`` row (``index_db`` adds the repository)."""
    basis = {
        "d": sorted(set(info.symbols.defs)),
        "f": sorted(resolved.falls),
        "p": sorted(resolved.deps),
    }
    uses = resolved.uses
    # The basis is read for every path at each update: plain JSON, no decompression.
    return (path, *key, len(uses), _pack(uses), json.dumps(basis).encode())


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
        rows = []
        pairs: set[tuple[str, str]] = set()
        n_uses = 0
        for path, key in files.items():
            result = resolved[path]
            rows.append(_row(path, key, infos[key], result))
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
        old = self.store.graph_files(self.repo_id, columns=", basis")
        if set(old) != set(self.files):
            return None
        changed = sorted(p for p, key in self.files.items() if old[p][:2] != key)
        if len(changed) > MAX_UPDATED_PATHS:
            return None
        infos = self.blobs({self.files[p] for p in changed})
        if len(infos) < len({self.files[p] for p in changed}):
            return None
        basis = {p: json.loads(row[3]) for p, row in old.items()}

        # Names the changed files define, before and after, and how the repository-wide
        # lookup answers for them now and before.
        old_defs, new_defs = defaultdict(set), defaultdict(set)
        for path in changed:
            for name, chunk_id in basis[path]["d"]:
                old_defs[name].add(chunk_id)
            for name, chunk_id in infos[self.files[path]].symbols.defs:
                new_defs[name].add(chunk_id)
        everywhere = _Everywhere(basis, set(changed), new_defs)
        everywhere.prefetch(set(old_defs) | set(new_defs))
        decided = set()
        for name in set(old_defs) | set(new_defs):
            before = everywhere.base.get(name, set()) | old_defs[name]
            if _target(before) != _target(everywhere[name]):
                decided.add(name)
        targets = set(changed)
        affected = set(changed) | {
            path for path, data in basis.items()
            if not targets.isdisjoint(data["p"]) or not decided.isdisjoint(data["f"])
        }
        if len(affected) > MAX_UPDATED_PATHS:
            return None

        keys = {self.files[p] for p in affected}
        infos.update(self.blobs(keys - set(infos)))
        if keys - set(infos):
            return None
        symbols = {p: infos[self.files[p]].symbols for p in sorted(affected)}
        everywhere.prefetch({ref[0] for sym in symbols.values() for ref in sym.refs})
        definitions = _Definitions(self.files, basis, symbols)
        modules = ModuleResolver(self.files)
        resolved = {
            p: resolve_file(p, sym, definitions, everywhere, modules) for p, sym in symbols.items()
        }
        stats = self._updated_stats(stored[1], old, resolved, infos)
        if stats is None:
            return None
        rows = [_row(p, self.files[p], infos[self.files[p]], r) for p, r in resolved.items()]
        return _sorted(stats), rows, sorted(affected)

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
        uses += sum(len(r.uses) for r in resolved.values()) - sum(old[p][2] for p in resolved)
        touched = {old[p][:2] for p in resolved} | {self.files[p] for p in resolved}
        members = [p for p in old if old[p][:2] in touched or self.files[p] in touched]
        packed = self.store.graph_files(self.repo_id, members, columns=", uses")
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
    """name -> chunk ids defining it anywhere in the new snapshot: the unchanged paths'
    stored definitions (``base``, read for the names asked for) plus the changed files' new
    ones."""

    def __init__(self, basis: dict, changed: set[str], new_defs: dict[str, set[str]]):
        self.basis = basis
        self.changed = changed
        self.new_defs = new_defs
        self.base: dict[str, set[str]] = {}

    def prefetch(self, names) -> None:
        wanted = {name for name in names if name not in self.base}
        if not wanted:
            return
        base = self.base
        for name in wanted:
            base[name] = set()
        for path, data in self.basis.items():
            if path in self.changed:
                continue
            for name, chunk_id in data["d"]:
                if name in wanted:
                    base[name].add(chunk_id)

    def __getitem__(self, name: str) -> set[str]:
        if name not in self.base:
            self.prefetch((name,))
        base, new = self.base[name], self.new_defs.get(name)
        return base | new if new else base

    def get(self, name: str, default=None):
        return self[name] or default


class _Definitions:
    """path -> name -> chunk ids: the re-resolved files' from their symbols, any other's
    (unchanged, since only those can have changed) from its stored basis."""

    def __init__(self, files: dict, basis: dict, symbols: dict[str, FileSymbols]):
        self.files = files
        self.basis = basis
        self.known = {p: sym.by_name() for p, sym in symbols.items()}

    def get(self, path: str, default=None):
        if path not in self.files:
            return default
        if path not in self.known:
            by_name = defaultdict(set)
            for name, chunk_id in self.basis[path]["d"]:
                by_name[name].add(chunk_id)
            self.known[path] = by_name
        return self.known[path]

    def __getitem__(self, path: str):
        found = self.get(path)
        if found is None:
            raise KeyError(path)
        return found

    def __contains__(self, path: str) -> bool:
        return path in self.files


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
