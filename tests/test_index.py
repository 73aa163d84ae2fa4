"""``Index.update`` invalidation (only new blobs are parsed; ids follow content) and bad input
(broken, non-UTF-8, binary, oversized, missing or corrupt things never stop an index)."""

import os

import pygit2
import pytest
from fixtures.checks import imported_by

from codekv import gitrepo
from codekv.index import INDEX_FILE, Index
from codekv.index_db import CorruptIndexError
from codekv.tokens import CounterSpec

BYTES = CounterSpec("bytes")

A_V1 = "def alpha():\n    return 1\n\n\ndef beta():\n    return 2\n"
A_V2 = "def alpha():\n    return 1\n\n\ndef beta():\n    return 22\n"
B = "from a import alpha\n\n\ndef gamma():\n    return alpha()\n"


def _index(git_repo, **options) -> Index:
    return Index(git_repo.root, counter=BYTES, **options)


def _ids(index: Index) -> dict[str, list[str]]:
    ids: dict[str, list[str]] = {}
    for chunk in index.chunks():
        ids.setdefault(chunk.path, []).append(chunk.id)
    return ids


def _remove(git_repo, *paths: str) -> None:
    """Delete files from disk; the next ``commit`` (``add_all``) stages their removal."""
    git_repo.write(dict.fromkeys(paths))


def _blobs(index: Index) -> set[str]:
    return {blob for blob, _ in index.store.known_blobs(index.repo_id, index.chunker)}


@pytest.fixture
def indexed(git_repo):
    git_repo.commit({"a.py": A_V1, "b.py": B})
    index = _index(git_repo)
    first = index.update(workers=1)
    assert (first.parsed, first.reused, first.files) == (2, 0, 2)
    yield git_repo, index
    index.close()


def test_unchanged_repo_parses_nothing(indexed):
    git_repo, index = indexed
    before = _ids(index)
    again = index.update(workers=1)
    assert (again.parsed, again.reused) == (0, 2)
    assert _ids(index) == before
    # A new Index on the same store (a new process) finds the same.
    fresh = _index(git_repo)
    assert fresh.update(workers=1).parsed == 0
    fresh.close()


def test_edit_reparses_only_that_blob(indexed):
    git_repo, index = indexed
    before = _ids(index)
    git_repo.commit({"a.py": A_V2})
    summary = index.update(workers=1)
    assert (summary.parsed, summary.reused) == (1, 1)
    after = _ids(index)
    assert after["b.py"] == before["b.py"]
    assert len(after["a.py"]) == len(before["a.py"]) == 2
    assert not set(after["a.py"]) & set(before["a.py"])
    new_hash = str(pygit2.hash(A_V2.encode()))
    assert {c.blob_hash for c in index.chunks("a.py")} == {new_hash}
    assert index.text(index.find("a.py", "beta")[0]) == b"def beta():\n    return 22"


def test_uncommitted_edit_is_indexed_and_revert_reuses(indexed):
    git_repo, index = indexed
    before = _ids(index)
    git_repo.write({"a.py": A_V2})  # working tree only
    edited = index.update(workers=1)
    assert edited.parsed == 1
    assert index.files()[0].origin == "worktree"
    git_repo.write({"a.py": A_V1})
    reverted = index.update(workers=1)
    assert (reverted.parsed, reverted.reused) == (0, 2)
    assert _ids(index) == before


def test_rename_reuses_chunks_under_new_path(indexed):
    git_repo, index = indexed
    before = _ids(index)
    _remove(git_repo, "a.py")
    git_repo.commit({"lib/renamed.py": A_V1})
    summary = index.update(workers=1)
    assert (summary.parsed, summary.reused) == (0, 2)
    assert index.chunks("a.py") == []
    moved = index.chunks("lib/renamed.py")
    assert [c.id for c in moved] == before["a.py"]
    assert [c.qualname for c in moved] == ["alpha", "beta"]
    assert {c.path for c in moved} == {"lib/renamed.py"}


def test_delete_then_gc(indexed):
    git_repo, index = indexed
    git_repo.commit({"a.py": A_V2})
    index.update(workers=1)
    _remove(git_repo, "b.py")
    git_repo.commit({})
    summary = index.update(workers=1)
    assert (summary.files, summary.parsed) == (1, 0)
    assert index.chunks("b.py") == []
    assert [f.path for f in index.files()] == ["a.py"]
    old_a, b = str(pygit2.hash(A_V1.encode())), str(pygit2.hash(B.encode()))
    new_a = str(pygit2.hash(A_V2.encode()))
    assert _blobs(index) == {old_a, new_a, b}

    assert index.gc() == 2
    assert _blobs(index) == {new_a}
    assert index.gc() == 0
    assert [c.qualname for c in index.chunks()] == ["alpha", "beta"]
    assert index.update(workers=1).parsed == 0
    # The dropped blob comes back by parsing it again.
    git_repo.commit({"b.py": B})
    assert index.update(workers=1).parsed == 1


def test_syntax_error_file_is_still_chunked(git_repo):
    git_repo.commit({"broken.py": "def broken(:\n    pass\n\n\ndef fine():\n    return 1\n"})
    index = _index(git_repo)
    summary = index.update(workers=1)
    assert (summary.parsed, summary.syntax_errors) == (1, 1)
    assert [c.qualname for c in index.chunks("broken.py")] == ["broken", "fine"]
    index.close()


def test_latin1_file_is_indexed_and_counted(git_repo):
    source = "# café\ndef f():\n    return 'é'\n".encode("latin-1")
    git_repo.commit({"legacy.py": source, "ok.py": "x = 1\n"})
    index = _index(git_repo)
    summary = index.update(workers=1)
    assert (summary.parsed, summary.decode_errors) == (2, 1)
    (chunk,) = index.find("legacy.py", "f")
    # The comment above a definition belongs to its chunk.
    assert index.text(chunk) == "# café\ndef f():\n    return 'é'".encode("latin-1")
    index.close()


def test_binary_and_oversized_files_are_skipped(git_repo, monkeypatch):
    monkeypatch.setattr(gitrepo, "MAX_FILE_BYTES", 100)
    git_repo.commit(
        {
            "logo.png": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
            "data.py": b"x = b'\x00'\n",
            "big.py": "x = 1\n" * 20,  # 120 bytes
            "small.py": "x = 1\n" * 16,  # 96 bytes
        }
    )
    index = _index(git_repo)
    summary = index.update(workers=1)
    assert summary.skipped == {"binary": 2, "too-large": 1}
    assert (summary.files, summary.parsed) == (4, 1)
    assert [f.path for f in index.files()] == ["small.py"]
    index.close()


def test_missing_blob_is_skipped_and_retried(git_repo):
    git_repo.commit({"a.py": A_V1, "b.py": B})
    blob = str(pygit2.hash(B.encode()))
    (git_repo.root / ".git" / "objects" / blob[:2] / blob[2:]).unlink()
    index = _index(git_repo)
    summary = index.update(workers=1)
    assert summary.skipped == {"missing": 1}
    assert (summary.parsed, [f.path for f in index.files()]) == (1, ["a.py"])
    # Not remembered as content: once the object is back (say, fetched), it is indexed.
    assert str(git_repo.repo.create_blob(B.encode())) == blob
    summary = index.update(workers=1)
    assert (summary.parsed, summary.skipped) == (1, {})
    assert [c.qualname for c in index.chunks("b.py")] == [None, "gamma"]  # import, def
    index.close()


def test_missing_blob_with_workers(git_repo):
    """The same through worker processes, which read blobs on their own."""
    git_repo.commit({f"m{i}.py": f"def f{i}():\n    return {i}\n" for i in range(20)})
    blob = str(pygit2.hash(b"def f7():\n    return 7\n"))
    (git_repo.root / ".git" / "objects" / blob[:2] / blob[2:]).unlink()
    index = _index(git_repo)
    summary = index.update(workers=2)
    assert (summary.parsed, summary.skipped) == (19, {"missing": 1})
    index.close()


def test_not_a_repository(tmp_path):
    with pytest.raises(gitrepo.NotARepositoryError, match="is not inside a git repository"):
        Index(tmp_path, counter=BYTES)


def _corrupt_pages(path, first_page: int) -> None:
    data = bytearray(path.read_bytes())
    data[first_page * 4096 :] = os.urandom(len(data) - first_page * 4096)
    path.write_bytes(bytes(data))


def test_stored_anchors_are_the_blobs_own(git_repo, codekv_home):
    """Four fields an anchor, as before uses carried a ``target``: a blob's own anchors have
    none (uses get theirs from the def-use graph when read), so storing it would waste bytes."""
    import json
    import sqlite3

    git_repo.commit({"a.py": A_V1, "b.py": B})
    index = _index(git_repo)
    index.update(workers=1)
    index.close()
    with sqlite3.connect(codekv_home / INDEX_FILE) as db:
        rows = db.execute("SELECT anchors FROM chunks").fetchall()
    stored = [anchor for (text,) in rows for anchor in json.loads(text)]
    assert stored and all(len(anchor) == 4 for anchor in stored)


def test_garbage_database_is_reported(git_repo, codekv_home):
    git_repo.commit({"a.py": A_V1})
    index = _index(git_repo)
    index.update(workers=1)
    index.close()
    (codekv_home / INDEX_FILE).write_bytes(b"not a database " * 512)
    with pytest.raises(CorruptIndexError, match="--rebuild"):
        _index(git_repo)


@pytest.mark.parametrize("first_page", [1, 3])
def test_damage_found_after_opening_is_reported(git_repo, tmp_path, first_page):
    """A valid header with damaged pages further in: found by whichever read touches them
    first (opening, updating or listing chunks), always as CorruptIndexError."""
    git_repo.commit({f"m{i}.py": f"def f{i}():\n    return {i}\n" * 20 for i in range(30)})
    store = tmp_path / "store"
    index = Index(git_repo.root, store=store, counter=BYTES)
    index.update(workers=1)
    index.close()  # checkpoints the WAL into the file
    _corrupt_pages(store / INDEX_FILE, first_page)
    with pytest.raises(CorruptIndexError, match="--rebuild"):
        index = Index(git_repo.root, store=store, counter=BYTES)
        git_repo.commit({"new.py": "x = 1\n"})
        index.update(workers=1)
        index.chunks()


def test_analyzer_failure_skips_only_that_file(git_repo, monkeypatch):
    """A file the analyzer raises on (a bug, a pathological input) is skipped as "error",
    the rest is indexed, and the failure is kept: it is retried only by a new chunker."""
    from codekv.analysis import Analyzer

    analyze = Analyzer.analyze

    def fragile(self, blob_hash, language, source):
        if b"poison" in source:
            raise RecursionError("maximum recursion depth exceeded")
        return analyze(self, blob_hash, language, source)

    monkeypatch.setattr(Analyzer, "analyze", fragile)
    git_repo.commit({"a.py": A_V1, "bad.py": "poison = 1\n"})
    index = _index(git_repo)
    summary = index.update(workers=1)
    assert (summary.parsed, summary.skipped) == (1, {"error": 1})
    assert [f.path for f in index.files()] == ["a.py"]
    assert index.update(workers=1).skipped == {"error": 1}
    index.close()


def test_other_schema_asks_for_rebuild(git_repo, codekv_home):
    index = _index(git_repo)
    index.store.db.execute("UPDATE meta SET value = '0' WHERE key = 'schema'")
    index.close()
    with pytest.raises(CorruptIndexError, match="has schema 0.*codekv index --rebuild"):
        _index(git_repo)


def test_the_index_side_loads_nothing_of_the_compose_side():
    """Indexing needs neither torch nor the composer: the sides meet at ``Chunk`` and ``Index``."""
    compose_side = ("torch", "codekv.compose", "codekv.stores", "codekv.gate", "codekv.models",
                    "codekv.backends", "codekv.selection", "codekv.eval")
    loaded = imported_by("codekv.index", "codekv.show")
    assert not {m for m in loaded if m.startswith(compose_side)}


def test_a_new_analysis_version_analyses_again_and_keeps_chunk_ids(git_repo, monkeypatch):
    """What is read from chunks (anchors, the outline) has a version of its own: a new one
    analyses every blob again, but chunk ids, which name the bytes, and so the chunks'
    cached KV, stay."""
    import codekv.analysis
    import codekv.index

    git_repo.commit({"a.py": A_V1, "b.py": B})
    with monkeypatch.context() as patch:
        patch.setattr(codekv.analysis, "ANALYSIS_VERSION", "0")
        patch.setattr(codekv.index, "_analyzers", {})
        old = _index(git_repo)
        old.update(workers=1)
        old_ids, old_chunker = _ids(old), old.chunker
        old.close()
    index = _index(git_repo)
    assert index.chunker != old_chunker and index.chunks() == []  # not read: analysed again
    summary = index.update(workers=1)
    assert (summary.parsed, summary.reused) == (2, 0)
    assert _ids(index) == old_ids
    assert index.gc() == 2  # the old analysis's two blobs
    index.close()


def test_a_new_chunker_version_retires_the_old_entries(git_repo, monkeypatch):
    """Rows are keyed by chunker: an index written by another chunker version is analysed
    again (new ids, new outline), never read, and dropped by gc."""
    import codekv.analysis
    import codekv.index

    git_repo.commit({"a.py": A_V1, "b.py": B})
    with monkeypatch.context() as patch:
        patch.setattr(codekv.analysis, "CHUNKER_VERSION", "0")
        patch.setattr(codekv.index, "_analyzers", {})  # analyzers are kept per process
        old = _index(git_repo)
        old.update(workers=1)
        old_ids = _ids(old)
        old.close()
    index = _index(git_repo)
    assert index.chunks() == []  # what the old chunker stored is not read
    summary = index.update(workers=1)
    assert (summary.parsed, summary.reused) == (2, 0)
    assert not {i for ids in _ids(index).values() for i in ids} & {
        i for ids in old_ids.values() for i in ids
    }
    assert index.text(index.resolve("a.py::beta")) == b"def beta():\n    return 2"
    assert index.gc() == 2  # the old chunker's two blobs
    index.close()
