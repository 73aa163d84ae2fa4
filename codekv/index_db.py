"""The index database: embedded SQLite (WAL), keyed by repository and blob.

One row per analysed blob (its definitions, references and imports packed as compressed
JSON), one row per chunk (anchors as JSON), and the current snapshot of each repository
(path -> blob), plus the def-use graph of that snapshot per path. Analysed blobs are written
in batches, each batch one transaction holding whole blobs only; the snapshot and its graph
are replaced in one transaction. An index killed midway leaves a consistent database that the
next run completes.
"""

from __future__ import annotations

import functools
import json
import operator
import sqlite3
import time
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from codekv.analysis import BlobAnalysis, Definition, Import, Reference
from codekv.chunks import Anchor, Chunk, Outlined
from codekv.gitrepo import SourceFile

SCHEMA_VERSION = "1"
LOCK_TIMEOUT = 60  # seconds a writer waits for another

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS repos (id INTEGER PRIMARY KEY, root TEXT UNIQUE NOT NULL);
CREATE TABLE IF NOT EXISTS blobs (
    repo_id INTEGER NOT NULL, blob_hash TEXT NOT NULL, language TEXT NOT NULL,
    chunker TEXT NOT NULL, status TEXT NOT NULL, syntax_errors INTEGER NOT NULL,
    decode_errors INTEGER NOT NULL, symbols BLOB,
    PRIMARY KEY (repo_id, blob_hash, language, chunker)
);
CREATE TABLE IF NOT EXISTS chunks (
    repo_id INTEGER NOT NULL, id TEXT NOT NULL, blob_hash TEXT NOT NULL,
    language TEXT NOT NULL, chunker TEXT NOT NULL, seq INTEGER NOT NULL,
    kind TEXT NOT NULL, name TEXT, qualname TEXT, parent TEXT, part INTEGER NOT NULL,
    start_byte INTEGER NOT NULL, end_byte INTEGER NOT NULL,
    start_line INTEGER NOT NULL, end_line INTEGER NOT NULL, n_tokens INTEGER NOT NULL,
    anchors TEXT NOT NULL,
    PRIMARY KEY (repo_id, id)
);
CREATE INDEX IF NOT EXISTS chunks_by_blob ON chunks (repo_id, blob_hash, language, chunker);
CREATE TABLE IF NOT EXISTS files (
    repo_id INTEGER NOT NULL, path TEXT NOT NULL, blob_hash TEXT NOT NULL,
    language TEXT NOT NULL, origin TEXT NOT NULL, PRIMARY KEY (repo_id, path)
);
CREATE TABLE IF NOT EXISTS skipped (
    repo_id INTEGER NOT NULL, path TEXT NOT NULL, reason TEXT NOT NULL,
    PRIMARY KEY (repo_id, path)
);
CREATE TABLE IF NOT EXISTS graphs (
    repo_id INTEGER PRIMARY KEY, snapshot TEXT NOT NULL, stats TEXT NOT NULL, uses BLOB NOT NULL
);
-- The def-use graph of the snapshot in ``graphs``, one row per path, so that a changed file
-- updates it in place (codekv/defuse/state.py): the path's uses, and what resolving it
-- depended on (its definitions, names only the whole repository decided, files it read).
CREATE TABLE IF NOT EXISTS graph_files (
    repo_id INTEGER NOT NULL, path TEXT NOT NULL, blob_hash TEXT NOT NULL,
    language TEXT NOT NULL, n_uses INTEGER NOT NULL, uses BLOB NOT NULL, basis BLOB NOT NULL,
    PRIMARY KEY (repo_id, path)
) WITHOUT ROWID;
"""


# Skip reasons that say nothing about the blob's content (a blob missing from a shallow or
# damaged clone may be fetched later, a path that led out of the repository may not next
# time): reported for this run, never stored.
TRANSIENT_REASONS = ("missing", "outside-repository")

# SQLite's primary result codes for a damaged file; "database is locked" and the like are not.
_SQLITE_BUSY = 5
_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26


class CorruptIndexError(Exception):
    """The index database cannot be read; ``codekv index --rebuild`` starts it afresh."""


def _is_corrupt(error: sqlite3.DatabaseError) -> bool:
    code = getattr(error, "sqlite_errorcode", None)
    if code is None:
        return type(error) is sqlite3.DatabaseError
    return code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)


def _guarded(method):
    """Damage found mid-read (SQLite checks pages as it touches them) is a CorruptIndexError."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except sqlite3.DatabaseError as error:
            if not _is_corrupt(error):
                raise
            raise self._corrupt(error) from error

    return wrapper


class IndexStore:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            self.db = sqlite3.connect(self.path, timeout=LOCK_TIMEOUT, isolation_level=None)
            self.path.chmod(0o600)
            self._while_busy(lambda: self.db.execute("PRAGMA journal_mode=WAL"))
            self.db.execute("PRAGMA synchronous=NORMAL")
            self._while_busy(lambda: self.db.executescript(SCHEMA))
            self._check_version()
        except sqlite3.DatabaseError as error:
            if not _is_corrupt(error):
                raise
            raise self._corrupt(error) from error

    @staticmethod
    def _while_busy(statement) -> None:
        """Retry a statement SQLite refused as busy without waiting: two processes creating
        the database at once both switch it to WAL, and one is told "database is locked"
        at once (waiting could deadlock), not after the connection's timeout."""
        deadline = time.monotonic() + LOCK_TIMEOUT
        while True:
            try:
                statement()
                return
            except sqlite3.OperationalError as error:
                code = getattr(error, "sqlite_errorcode", _SQLITE_BUSY) & 0xFF
                if code != _SQLITE_BUSY or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def _corrupt(self, error: Exception) -> CorruptIndexError:
        return CorruptIndexError(
            f"the index database {self.path} is unreadable ({error}); "
            "run `codekv index --rebuild` to start it afresh"
        )

    def _check_version(self) -> None:
        row = self.db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        if row is None:
            self.db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
        elif row[0] != SCHEMA_VERSION:
            raise CorruptIndexError(
                f"the index database {self.path} has schema {row[0]}, this codekv writes "
                f"{SCHEMA_VERSION}; run `codekv index --rebuild`"
            )

    def close(self) -> None:
        self.db.close()

    def transaction(self):
        return _Transaction(self.db)

    @_guarded
    def repo_id(self, root: str) -> int:
        with self.transaction():
            self.db.execute("INSERT OR IGNORE INTO repos (root) VALUES (?)", (root,))
            return self.db.execute("SELECT id FROM repos WHERE root = ?", (root,)).fetchone()[0]

    @_guarded
    def known_blobs(self, repo_id: int, chunker: str) -> dict[tuple[str, str], str]:
        """(blob hash, language) -> status of every blob already analysed by this chunker."""
        rows = self.db.execute(
            "SELECT blob_hash, language, status FROM blobs WHERE repo_id = ? AND chunker = ?",
            (repo_id, chunker),
        )
        return {(blob, language): status for blob, language, status in rows}

    @_guarded
    def put_skipped_blob(self, repo_id, blob_hash, language, chunker, reason) -> None:
        if reason.startswith(TRANSIENT_REASONS):
            return
        with self.transaction():
            self.db.execute(
                "INSERT OR REPLACE INTO blobs VALUES (?, ?, ?, ?, ?, 0, 0, NULL)",
                (repo_id, blob_hash, language, chunker, reason),
            )

    @_guarded
    def put_analyses(self, repo_id: int, analyses: list[BlobAnalysis | StoredBlob]) -> None:
        """Store analysed blobs (or their rows, made by ``blob_rows`` in a worker); each batch
        is one transaction, so none is ever half-written."""
        stored = [a if isinstance(a, StoredBlob) else blob_rows(repo_id, a) for a in analyses]
        with self.transaction():
            self.db.executemany(
                "DELETE FROM chunks "
                "WHERE repo_id = ? AND blob_hash = ? AND language = ? AND chunker = ?",
                [s.key for s in stored],
            )
            self.db.executemany(
                "INSERT OR REPLACE INTO chunks VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                [row for s in stored for row in s.chunk_rows],
            )
            self.db.executemany(
                "INSERT OR REPLACE INTO blobs VALUES (?, ?, ?, ?, 'ok', ?, ?, ?)",
                [(*s.key, *s.blob_row) for s in stored],
            )

    def _analysed_blob(self, repo_id: int, blob_hash: str, language: str, chunker: str):
        """The blob's (status, syntax errors, decode errors, symbols) row if it was analysed
        ("ok"); None if it is unknown or was skipped."""
        row = self.db.execute(
            "SELECT status, syntax_errors, decode_errors, symbols FROM blobs "
            "WHERE repo_id = ? AND blob_hash = ? AND language = ? AND chunker = ?",
            (repo_id, blob_hash, language, chunker),
        ).fetchone()
        return row if row is not None and row[0] == "ok" else None

    @_guarded
    def load_symbols(self, repo_id: int, blob_hash: str, language: str, chunker: str):
        """The blob's packed definitions, references, imports and chunk summaries, or None."""
        row = self._analysed_blob(repo_id, blob_hash, language, chunker)
        if row is None:
            return None
        return BlobSymbols.unpack(blob_hash, language, row[1], row[2], row[3])

    @_guarded
    def load_packed_symbols(self, repo_id: int, chunker: str, keys) -> dict:
        """(blob hash, language) -> (syntax errors, decode errors, the unpacked JSON of
        ``BlobSymbols``) for each of ``keys`` stored as analysed; plain lists, no objects."""
        found = {}
        for batch in _batches(sorted(set(keys))):
            rows = self.db.execute(
                "SELECT blob_hash, language, syntax_errors, decode_errors, symbols FROM blobs "
                "WHERE repo_id = ? AND chunker = ? AND status = 'ok' AND blob_hash IN "
                f"({','.join('?' * len(batch))})",
                (repo_id, chunker, *(blob for blob, _ in batch)),
            )
            wanted = set(batch)
            for blob, language, syntax, decode, packed in rows:
                if (blob, language) in wanted:
                    found[blob, language] = (syntax, decode, json.loads(zlib.decompress(packed)))
        return found

    @_guarded
    def load_analysis(
        self, repo_id: int, blob_hash: str, language: str, chunker: str
    ) -> BlobAnalysis | None:
        """The blob's chunks with their anchors (no symbols: see ``load_symbols``)."""
        row = self._analysed_blob(repo_id, blob_hash, language, chunker)
        if row is None:
            return None
        chunks = [
            _chunk(r)
            for r in self.db.execute(
                "SELECT id, blob_hash, language, kind, name, qualname, parent, part, start_byte, "
                "end_byte, start_line, end_line, n_tokens, anchors FROM chunks WHERE repo_id = ? "
                "AND blob_hash = ? AND language = ? AND chunker = ? ORDER BY seq",
                (repo_id, blob_hash, language, chunker),
            )
        ]
        analysis = BlobAnalysis(blob_hash, language, chunker, chunks, syntax_errors=row[1],
                                decode_errors=bool(row[2]))
        return analysis

    @_guarded
    def replace_snapshot(
        self, repo_id: int, files: list[SourceFile], skipped: dict[str, str]
    ) -> None:
        with self.transaction():
            self.db.execute("DELETE FROM files WHERE repo_id = ?", (repo_id,))
            self.db.executemany(
                "INSERT INTO files VALUES (?, ?, ?, ?, ?)",
                [(repo_id, f.path, f.blob_hash, f.language, f.origin) for f in files],
            )
            self.db.execute("DELETE FROM skipped WHERE repo_id = ?", (repo_id,))
            self.db.executemany(
                "INSERT INTO skipped VALUES (?, ?, ?)",
                [(repo_id, path, reason) for path, reason in skipped.items()],
            )

    @_guarded
    def snapshot_files(self, repo_id: int) -> list[SourceFile]:
        rows = self.db.execute(
            "SELECT path, blob_hash, language, origin FROM files WHERE repo_id = ? ORDER BY path",
            (repo_id,),
        )
        return [SourceFile(*row) for row in rows]

    @_guarded
    def graph_cache(self, repo_id: int, snapshot: str) -> tuple[dict, list] | None:
        """The stats and resolved uses stored for exactly this snapshot, else None."""
        row = self.db.execute(
            "SELECT stats, uses FROM graphs WHERE repo_id = ? AND snapshot = ?", (repo_id, snapshot)
        ).fetchone()
        if row is None:
            return None
        uses = []
        for (packed,) in self.db.execute(
            "SELECT uses FROM graph_files WHERE repo_id = ? ORDER BY path", (repo_id,)
        ):
            uses.extend(use[1:] for use in json.loads(zlib.decompress(packed)))
        return json.loads(row[0]), uses

    @_guarded
    def graph_stats(self, repo_id: int, snapshot: str | None = None) -> tuple[str, dict] | None:
        """(snapshot key, stats) of the stored graph: of exactly ``snapshot`` when given."""
        row = self.db.execute("SELECT snapshot, stats FROM graphs WHERE repo_id = ?", (repo_id,))
        row = row.fetchone()
        if row is None or (snapshot is not None and row[0] != snapshot):
            return None
        return row[0], json.loads(row[1])

    # -- the graph state (codekv/defuse/state.py) ------------------------------------------
    @_guarded
    def graph_files(self, repo_id: int, paths=None, columns: str = "") -> dict[str, tuple]:
        """path -> (blob hash, language, number of uses, *columns) of the stored graph, for
        all paths or those given; ``columns``: more of its columns, as ", uses, basis"."""
        assert columns in ("", ", uses", ", basis", ", uses, basis"), columns
        query = f"SELECT path, blob_hash, language, n_uses{columns} FROM graph_files"
        if paths is None:
            rows = self.db.execute(f"{query} WHERE repo_id = ?", (repo_id,))
            return {path: tuple(rest) for path, *rest in rows}
        found = {}
        for batch in _batches(sorted(set(paths))):
            marks = ",".join("?" * len(batch))
            rows = self.db.execute(f"{query} WHERE repo_id = ? AND path IN ({marks})",
                                   (repo_id, *batch))
            found.update((path, tuple(rest)) for path, *rest in rows)
        return found

    @_guarded
    def put_graph_state(self, repo_id: int, snapshot: str, stats: dict, rows: list[tuple],
                        replace_paths=None) -> None:
        """Store the graph of ``snapshot`` in one transaction: all paths' rows anew, or (with
        ``replace_paths``) those paths' only. ``rows`` are ``graph_files`` rows without
        ``repo_id``."""
        with self.transaction():
            if replace_paths is None:
                self.db.execute("DELETE FROM graph_files WHERE repo_id = ?", (repo_id,))
            else:
                for batch in _batches(sorted(set(replace_paths))):
                    marks = ",".join("?" * len(batch))
                    self.db.execute(
                        f"DELETE FROM graph_files WHERE repo_id = ? AND path IN ({marks})",
                        (repo_id, *batch),
                    )
            self.db.executemany(
                "INSERT INTO graph_files VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(repo_id, *row) for row in rows],
            )
            self.db.execute(
                "INSERT OR REPLACE INTO graphs VALUES (?, ?, ?, ?)",
                (repo_id, snapshot, json.dumps(stats), b""),
            )

    @_guarded
    def gc(self, repo_id: int, chunker: str) -> int:
        """Drop blobs (and their chunks) no file of the current snapshot points to."""
        with self.transaction():
            dead = (
                "WHERE repo_id = ? AND (chunker != ? OR blob_hash NOT IN "
                "(SELECT blob_hash FROM files WHERE repo_id = ?))"
            )
            removed = self.db.execute(
                f"DELETE FROM blobs {dead}", (repo_id, chunker, repo_id)
            ).rowcount
            self.db.execute(f"DELETE FROM chunks {dead}", (repo_id, chunker, repo_id))
        self.db.execute("VACUUM")
        return removed


def _batches(values: list, size: int = 500):
    for index in range(0, len(values), size):
        yield values[index : index + size]


class StoredBlob(NamedTuple):
    """One analysed blob as rows of the database, made where it was analysed (a worker)."""

    key: tuple  # (repo id, blob hash, language, chunker)
    chunk_rows: list[tuple]
    blob_row: tuple  # (syntax errors, decode errors, packed symbols)
    symbols: dict | None = None  # what was packed, unpacked: for the caller, not stored


# json.dumps's output without its check for reference cycles (plain lists and tuples here).
_dumps = json.JSONEncoder(check_circular=False).encode


def blob_rows(repo_id: int, analysis: BlobAnalysis) -> StoredBlob:
    # Anchors, definitions, references and imports are named tuples whose fields are in the
    # order stored here: JSON writes them as arrays, and plain tuples pickle cheaply. A blob's
    # anchors have no ``target`` (uses get theirs from the def-use graph when read): a null in
    # every row would cost 5 bytes an anchor.
    key = (repo_id, analysis.blob_hash, analysis.language, analysis.chunker)
    chunk_rows = [
        (
            repo_id, c.id, c.blob_hash, c.language, analysis.chunker, seq, c.kind,
            c.name, c.qualname, c.parent, c.part, c.start_byte, c.end_byte,
            c.start_line, c.end_line, c.n_tokens, _dumps([a[:4] for a in c.anchors]),
        )
        for seq, c in enumerate(analysis.chunks)
    ]
    first = operator.itemgetter(0)
    symbols = {
        "d": list(map(tuple, analysis.definitions)),
        "r": list(map(tuple, analysis.references)),
        "i": list(map(tuple, analysis.imports)),
        # Enough to count and graph a snapshot without reading every chunk row.
        "c": [[c.id, c.kind, dict(Counter(map(first, c.anchors)))] for c in analysis.chunks],
        # Named definitions with their spans: how an address finds a method inside a chunk.
        "o": list(map(tuple, analysis.outline)),
    }
    packed = zlib.compress(_dumps(symbols).encode(), 1)
    errors = (analysis.syntax_errors, int(analysis.decode_errors))
    return StoredBlob(key, chunk_rows, (*errors, packed), symbols)


@dataclass
class BlobSymbols:
    """What the def-use graph and the snapshot statistics need of one blob."""

    blob_hash: str
    language: str
    syntax_errors: int
    decode_errors: bool
    definitions: list[Definition]
    references: list[Reference]
    imports: list[Import]
    chunks: list[tuple[str, str, dict[str, int]]]  # (id, kind, anchor counts by kind)
    outline: list[Outlined]

    @property
    def chunk_ids(self) -> list[str]:
        return [chunk[0] for chunk in self.chunks]

    @classmethod
    def unpack(cls, blob_hash, language, syntax_errors, decode_errors, packed: bytes):
        data = json.loads(zlib.decompress(packed))
        return cls(
            blob_hash,
            language,
            syntax_errors,
            bool(decode_errors),
            [Definition(*d) for d in data["d"]],
            [Reference(*r) for r in data["r"]],
            [Import(*i) for i in data["i"]],
            [tuple(c) for c in data["c"]],
            [Outlined(*o) for o in data["o"]],
        )


def _chunk(row) -> Chunk:
    *fields, anchors = row
    return Chunk(*fields, anchors=[Anchor(*a) for a in json.loads(anchors)])


class _Transaction:
    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self):
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type, exc, tb):
        self.db.execute("COMMIT" if exc_type is None else "ROLLBACK")
        return False
