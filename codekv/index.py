"""``Index``: build and update a repository's chunk index; read chunks, anchors and the graph."""

from __future__ import annotations

import fcntl
import gc
import hashlib
import multiprocessing
import os
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from codekv import address, gitrepo, grammars, paths
from codekv.analysis import Analyzer, analysis_version, chunker_version
from codekv.chunks import DEFAULT_BUDGET, Anchor, Chunk, Outlined
from codekv.defuse.graph import DefUseGraph, Use, build_graph
from codekv.defuse.state import BlobInfo, GraphState
from codekv.index_db import BlobSymbols, IndexStore, StoredBlob, blob_rows
from codekv.tokens import CounterSpec, default_counter_spec

INDEX_FILE = "index.sqlite"
BATCH = 64  # blobs per write transaction


@dataclass
class IndexSummary:
    repo: str
    files: int = 0
    parsed: int = 0
    reused: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    syntax_errors: int = 0
    decode_errors: int = 0
    chunks: dict[str, int] = field(default_factory=dict)
    anchors: dict[str, int] = field(default_factory=dict)
    graph_nodes: int = 0
    graph_edges: int = 0
    seconds: float = 0.0

    def as_json(self) -> dict:
        data = dict(self.__dict__)
        data["chunks_total"] = sum(self.chunks.values())
        return data


@dataclass(frozen=True)
class _Task:
    path: str
    blob_hash: str
    language: str
    origin: str


_worker: tuple[Analyzer, gitrepo.BlobReader, int] | None = None
_analyzers: dict[tuple[CounterSpec, int], Analyzer] = {}


def _analyzer(counter: CounterSpec, budget: int, languages=()) -> Analyzer:
    """One analyzer per counter and budget per process (loading a tokenizer takes 0.2 s);
    made before the workers fork, they inherit it, with ``languages``' queries compiled."""
    analyzer = _analyzers.get((counter, budget))
    if analyzer is None:
        analyzer = _analyzers[counter, budget] = Analyzer(counter, budget)
    for language in languages:
        if language in grammars.LANGUAGES:
            grammars.query(language)
    return analyzer


def _init_worker(
    counter: CounterSpec, budget: int, repo_path: str, repo_id: int = 0, pool: bool = False
) -> None:
    global _worker
    # The repository is opened here, not inherited: libgit2's file handles are per process.
    _worker = (_analyzer(counter, budget), gitrepo.BlobReader(repo_path), repo_id)
    if pool:
        # Analysis makes millions of short-lived objects and no cycles: the cycle collector
        # would only rescan them (about a tenth of the run); a pool worker exits at the end.
        gc.disable()


def _analyze(task: _Task):
    """Worker side: read one blob and analyse it; returns (task, status, result-or-None), the
    result being the blob's database rows and what the graph needs, made here so the main
    process only writes them."""
    analyzer, reader, repo_id = _worker
    try:
        file = gitrepo.SourceFile(task.path, task.blob_hash, task.language, task.origin)
        data = reader.read(file)
    except gitrepo.OutsideRepositoryError as error:
        return task, f"outside-repository: {error}", None
    except (gitrepo.MissingBlobError, OSError) as error:
        return task, f"missing: {error}", None
    reason = gitrepo.skip_reason(data)
    if reason is not None:
        return task, reason, None
    try:
        analysis = analyzer.analyze(task.blob_hash, task.language, data)
    except Exception as error:  # one file the analyzer cannot handle must not stop the index
        return task, f"error: {type(error).__name__}: {error}", None
    return task, "ok", blob_rows(repo_id, analysis)


@contextmanager
def _no_gc():
    """Pause the cycle collector: indexing keeps millions of acyclic objects alive at once,
    and each automatic collection would rescan all of them."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Index:
    """The chunk index of one git repository, stored under the codekv home (or ``store``)."""

    def __init__(
        self,
        repo: str | Path,
        store: str | Path | None = None,
        budget: int = DEFAULT_BUDGET,
        counter: CounterSpec | None = None,
        include_secrets: bool = False,
        include_ignored: bool = False,
    ):
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ValueError(f"budget must be a whole number of tokens >= 1, not {budget!r}")
        self.repo = gitrepo.open_repository(repo)
        self.root = str(Path(self.repo.workdir).resolve())
        self.store_dir = paths.user_dir(Path(store), "store") if store else paths.home()
        self.budget = budget
        self.counter = counter or default_counter_spec()
        # Blobs are stored under the analysis version; chunk ids carry only the boundaries'.
        self.chunker = analysis_version(self.counter, budget)
        self.boundaries = chunker_version(self.counter, budget)
        self.include_secrets = include_secrets
        self.include_ignored = include_ignored
        self.store = IndexStore(self.store_dir / INDEX_FILE)
        self.repo_id = self.store.repo_id(self.root)
        self._graph: DefUseGraph | None = None
        self._chunks: dict[str, Chunk] | None = None
        self._uses: dict[str, list[Use]] | None = None
        self._users: dict[str, list[Use]] | None = None  # uses by the chunk they resolve to
        self._by_path: dict[str, list[Chunk]] = {}  # stored chunks of the paths spans came from
        self._files_by_path: dict[str, gitrepo.SourceFile] | None = None
        self._reader: gitrepo.BlobReader | None = None
        self._fresh: dict[tuple[str, str], BlobInfo] = {}  # blobs analysed by this update

    # -- building ----------------------------------------------------------------------
    def update(self, workers: int | None = None, progress=None) -> IndexSummary:
        """Index HEAD plus the working tree; only blobs never analysed before are parsed."""
        started = time.perf_counter()
        with self._lock(), _no_gc():
            snapshot = gitrepo.scan(self.repo, self.include_secrets, self.include_ignored)
            scanned = len(snapshot.files) + sum(snapshot.skipped.values())
            summary = IndexSummary(self.root, files=scanned)
            known = self.store.known_blobs(self.repo_id, self.chunker)
            todo: dict[tuple[str, str], _Task] = {}
            for file in snapshot.files:
                key = (file.blob_hash, file.language)
                if key not in known and key not in todo:
                    todo[key] = _Task(file.path, file.blob_hash, file.language, file.origin)
            summary.parsed = self._analyze_all(list(todo.values()), workers, progress, known)
            skipped = dict(snapshot.skipped_paths)
            indexed = []
            for file in snapshot.files:
                status = known[(file.blob_hash, file.language)]
                if status != "ok":
                    skipped[file.path] = status.split(":")[0]
                else:
                    indexed.append(file)
                    if (file.blob_hash, file.language) not in todo:
                        summary.reused += 1
            self.store.replace_snapshot(self.repo_id, indexed, skipped)
            summary.skipped = dict(Counter(skipped.values()))
            self._graph = None
            self._chunks = None
            self._uses = None
            self._users = None
            self._by_path = {}
            self._files_by_path = None
            try:
                stats = self._stats(indexed)
            finally:
                self._fresh = {}
        summary.syntax_errors = stats["syntax_errors"]
        summary.decode_errors = stats["decode_errors"]
        summary.chunks = stats["chunks"]
        summary.anchors = stats["anchors"]
        summary.graph_nodes = stats["graph_nodes"]
        summary.graph_edges = stats["graph_edges"]
        summary.seconds = round(time.perf_counter() - started, 3)
        return summary

    def _analyze_all(self, tasks: list[_Task], workers, progress, known: dict) -> int:
        if not tasks:
            return 0
        workers = workers or min(len(os.sched_getaffinity(0)), max(1, len(tasks) // 8))
        args = (self.counter, self.budget, self.repo.path, self.repo_id)
        parsed = 0
        batch: list[StoredBlob] = []

        def record(task, status, result):
            nonlocal parsed
            if result is None:
                self.store.put_skipped_blob(
                    self.repo_id, task.blob_hash, task.language, self.chunker, status
                )
            else:
                batch.append(result._replace(symbols=None))
                syntax, decode, _ = result.blob_row
                self._fresh[task.blob_hash, task.language] = BlobInfo.unpack(
                    task.language, syntax, decode, result.symbols
                )
                parsed += 1
                if len(batch) >= BATCH:
                    self.store.put_analyses(self.repo_id, batch)
                    batch.clear()
            known[(task.blob_hash, task.language)] = status
            if progress is not None:
                progress(1, len(tasks))

        # Largest first keeps both cores busy to the end.
        tasks = sorted(tasks, key=lambda t: -self._size_hint(t))
        if workers <= 1:
            _init_worker(*args)
            for task in tasks:
                record(*_analyze(task))
        else:
            _analyzer(self.counter, self.budget, {task.language for task in tasks})
            context = multiprocessing.get_context("fork")
            with context.Pool(workers, initializer=_init_worker, initargs=(*args, True)) as pool:
                for result in pool.imap_unordered(_analyze, tasks, chunksize=4):
                    record(*result)
        if batch:
            self.store.put_analyses(self.repo_id, batch)
        return parsed

    def _size_hint(self, task: _Task) -> int:
        try:
            return self.repo.odb.read_header(task.blob_hash)[1] if task.origin == "head" else 0
        except (KeyError, ValueError):
            return 0

    @contextmanager
    def _lock(self):
        """One writer per repository: a second ``codekv index`` waits, then finds little to do."""
        lock_dir = paths.private_dir(self.store_dir / "locks")
        name = hashlib.sha256(self.root.encode()).hexdigest()[:16]
        descriptor = os.open(lock_dir / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        with open(descriptor, "r+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    # -- snapshot statistics and the graph ----------------------------------------------
    def _snapshot_key(self, files) -> str:
        digest = hashlib.sha256(self.chunker.encode())
        for file in files:
            digest.update(f"{file.path}\0{file.blob_hash}\0{file.language}\n".encode())
        return digest.hexdigest()

    def _stats(self, files) -> dict:
        """The snapshot's statistics; its def-use graph is stored (updated in place when few
        files changed, see ``codekv.defuse.state``) unless stored already."""
        key = self._snapshot_key(files)
        stored = self.store.graph_stats(self.repo_id, key)
        stats = stored[1] if stored is not None else (
            GraphState(self.store, self.repo_id, self.chunker, files, self._blob_infos).save(key)
        )
        stats.pop("chunker", None)
        return stats

    def _blob_infos(self, keys) -> dict[tuple[str, str], BlobInfo]:
        """(blob hash, language) -> BlobInfo: analysed by this update, else stored."""
        found = {key: self._fresh[key] for key in keys if key in self._fresh}
        stored = self.store.load_packed_symbols(self.repo_id, self.chunker, set(keys) - set(found))
        for (blob, language), (syntax, decode, data) in stored.items():
            found[blob, language] = BlobInfo.unpack(language, syntax, decode, data)
        return found

    def _symbols(self, files) -> dict[str, BlobSymbols]:
        cache: dict[tuple[str, str], BlobSymbols | None] = {}
        result = {}
        for file in files:
            key = (file.blob_hash, file.language)
            if key not in cache:
                cache[key] = self.store.load_symbols(self.repo_id, *key, self.chunker)
            if cache[key] is not None:
                result[file.path] = cache[key]
        return result

    # -- reading -----------------------------------------------------------------------
    def files(self) -> list[gitrepo.SourceFile]:
        return self.store.snapshot_files(self.repo_id)

    def chunks(self, path: str | None = None) -> list[Chunk]:
        """Chunks of the indexed snapshot (of one file when ``path`` is given), in file order."""
        if path is None:
            files = self.files()
        else:
            files = [self._file_map()[path]] if path in self._file_map() else []
        out = []
        for file in files:
            analysis = self.store.load_analysis(
                self.repo_id, file.blob_hash, file.language, self.chunker
            )
            if analysis is not None:
                out.extend(replace(chunk, path=file.path) for chunk in analysis.chunks)
        return out

    def chunk(self, chunk_id: str) -> Chunk:
        if self._chunks is None:
            self._chunks = {chunk.id: chunk for chunk in self.chunks()}
        try:
            return self._chunks[chunk_id]
        except KeyError:
            raise KeyError(f"no chunk {chunk_id} in the index of {self.root}") from None

    def find(self, path: str, qualname: str | None = None) -> list[Chunk]:
        """Stored chunks of ``path``, or those named ``qualname`` (of every definition of that
        name); ``lookup`` resolves an address to one definition."""
        chunks = self.chunks(path)
        if qualname is None:
            return chunks
        return [c for c in chunks if c.qualname == qualname]

    def lookup(self, item: str | Chunk) -> address.Target:
        """What an address (see ``codekv.address``) names: its stored chunks and its span.
        Raises ``AddressError`` naming the candidates when it is ambiguous."""
        return address.resolve(self, item)

    def resolve(self, item: str | Chunk) -> Chunk:
        """An address as one chunk: a stored chunk, or the span of what it names."""
        return self.lookup(item).span

    def has_file(self, path: str) -> bool:
        return path in self._file_map()

    def outline(self, path: str) -> list[Outlined]:
        """The named definitions of ``path`` with their spans, nested ones included."""
        file = self._file_map().get(path)
        symbols = file and self.store.load_symbols(
            self.repo_id, file.blob_hash, file.language, self.chunker
        )
        return symbols.outline if symbols else []

    def blob(self, chunk: Chunk) -> bytes:
        """The bytes of the file ``chunk`` was cut from."""
        if self._reader is None:
            self._reader = gitrepo.BlobReader(self.repo.path)
        return self._reader.read(self._file_map()[chunk.path])

    def text(self, chunk: Chunk) -> bytes:
        """The chunk's exact bytes; a composed request reads one per chunk, so the snapshot's
        path map and the blob reader are kept until the next ``update``."""
        return chunk.text(self.blob(chunk))

    def count_tokens(self, data: bytes, start: int, end: int) -> int:
        """Tokens of ``data[start:end]`` as the chunker counts them."""
        counter = _analyzer(self.counter, self.budget).counter
        counter.reset(data)
        return counter.count(start, end)

    def _file_map(self) -> dict[str, gitrepo.SourceFile]:
        if self._files_by_path is None:
            self._files_by_path = {file.path: file for file in self.files()}
        return self._files_by_path

    @property
    def graph(self) -> DefUseGraph:
        if self._graph is None:
            self._graph = build_graph(self._symbols(self.files()))
        return self._graph

    def anchors(self, chunk: Chunk) -> list[Anchor]:
        """The chunk's static anchors plus its ``use`` anchors from the def-use graph."""
        uses = [Anchor("use", u.name, u.start_byte, u.end_byte, u.target)
                for u in self.uses(chunk)]
        return sorted(chunk.anchors + uses, key=lambda a: (a.start_byte, a.end_byte, a.kind))

    def depends_on(self, item: str | Chunk) -> list[Chunk]:
        """Chunks defining what the chunk or address ``item`` uses."""
        target = self.lookup(item)
        own = {c.id for c in target.chunks}
        found = {use.target for use in self.uses(target.span)} - own
        return [self.chunk(i) for i in sorted(found)]

    def used_by(self, item: str | Chunk) -> list[Chunk]:
        """Chunks using what the chunk or address ``item`` defines."""
        target = self.lookup(item)
        span = target.span
        own = {c.id for c in target.chunks}
        if self._users is None:
            self._users = {}
            self.uses(span)  # loads every chunk's uses
            for uses in self._uses.values():
                for use in uses:
                    self._users.setdefault(use.target, []).append(use)
        # A span inside a chunk (a method of a class kept whole) is used where its names are.
        names = {a.name for a in span.anchors if a.kind == "def"}
        found = set()
        for chunk in self._holders(span):
            inside = span.start_byte <= chunk.start_byte and chunk.end_byte <= span.end_byte
            found.update(use.source for use in self._users.get(chunk.id, ())
                         if inside or use.name in names)
        return [self.chunk(i) for i in sorted(found - own)]

    def uses(self, chunk: Chunk) -> list[Use]:
        """References in ``chunk`` resolved to other chunks; read from the snapshot's stored
        graph when there is one, so a request does not rebuild the repository's graph. For a
        span (a joined definition, a method inside its class's chunk): the uses within it."""
        if self._uses is None:
            files = self.files()
            cached = self.store.graph_cache(self.repo_id, self._snapshot_key(files))
            rows = cached[1] if cached is not None else [
                [u.source, u.target, u.name, u.kind, u.start_byte, u.end_byte]
                for u in self.graph.uses
            ]
            self._uses = {}
            for row in rows:
                self._uses.setdefault(row[0], []).append(Use(*row))
        if chunk.id in self._uses or chunk.path is None:
            return self._uses.get(chunk.id, [])
        return [
            use
            for holder in self._holders(chunk)
            for use in self._uses.get(holder.id, ())
            if chunk.start_byte <= use.start_byte and use.end_byte <= chunk.end_byte
        ]

    def _holders(self, span: Chunk) -> list[Chunk]:
        """The stored chunks overlapping ``span`` (itself when it is one)."""
        if span.path is None:
            return [span]
        if span.path not in self._by_path:
            self._by_path[span.path] = self.chunks(span.path)
        return [c for c in self._by_path[span.path]
                if c.start_byte < span.end_byte and span.start_byte < c.end_byte]

    def gc(self) -> int:
        """Drop stored blobs no file of the last indexed snapshot points to; returns how many."""
        with self._lock():
            return self.store.gc(self.repo_id, self.chunker)

    def close(self) -> None:
        self.store.close()
