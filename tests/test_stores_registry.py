"""The store registry: a new store is one module and one registry line, and the contract tests
and the command line pick it up from the registry alone; ``codekv gc`` opens a store without
loading the composer or torch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from click.testing import CliRunner

from codekv.cli import main
from codekv.stores import STORES, StoreKind, check_spec, default_scope, open_kv_store

ROOT = Path(__file__).resolve().parents[1]
# A complete store in one module: entries as files, one directory per scope.
THROWAWAY_STORE = textwrap.dedent('''
"""A throwaway store: entries as files in one directory per scope, named by a URL's path."""

import hashlib
import json
import os
import time
from pathlib import Path
from urllib.parse import urlsplit

from codekv.stores.base import KVStore
from codekv.stores.entry import (
    StoreStats,
    decode_bytes,
    encode_entry,
    entry_format,
    entry_provenance,
    header_meta,
    FORMAT_VERSION,
)


class ThrowawayKVStore(KVStore):
    def __init__(self, url, max_bytes=None):
        self.root = Path(urlsplit(url).path)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._hits = self._misses = self._corrupt = 0
        self._clock = 0

    @property
    def location(self):
        return f"throwaway://{self.root}"

    @property
    def corrupt(self):
        return self._corrupt

    def _dir(self, scope):
        return self.root / hashlib.sha256(scope.encode()).hexdigest()

    def _path(self, key):
        return self._dir(key.scope) / key.digest()

    def _touch(self, path):
        self._clock = max(time.time_ns(), self._clock + 1)
        os.utime(path, ns=(self._clock, self._clock))

    def get(self, key):
        path = self._path(key)
        try:
            entry = decode_bytes(path.read_bytes(), key)
        except FileNotFoundError:
            self._misses += 1
            return None
        except Exception:
            path.unlink(missing_ok=True)
            self._corrupt += 1
            self._misses += 1
            return None
        self._hits += 1
        self._touch(path)
        return entry

    def put(self, key, entry):
        data = encode_entry(key, entry)
        if self.max_bytes is not None and len(data) > self.max_bytes:
            return
        path = self._path(key)
        path.parent.mkdir(exist_ok=True)
        path.with_suffix(".tmp").write_bytes(data)
        path.with_suffix(".tmp").replace(path)
        self._touch(path)
        if self.max_bytes is not None:
            self.evict(self.max_bytes)

    def contains(self, key):
        return self._path(key).is_file()

    def reject(self, key):
        if self._path(key).is_file():
            self._path(key).unlink()
            self._corrupt += 1

    def _files(self, scope=None):
        dirs = [self._dir(scope)] if scope is not None else [d for d in self.root.iterdir()]
        return [f for d in dirs if d.is_dir() for f in d.iterdir() if f.suffix == ""]

    def stats(self, scope=None):
        files = self._files(scope)
        return StoreStats(len(files), sum(f.stat().st_size for f in files), self._hits,
                          self._misses, self._corrupt)

    def evict(self, max_bytes):
        files = sorted(self._files(), key=lambda f: f.stat().st_mtime_ns)
        total, removed = sum(f.stat().st_size for f in files), 0
        for f in files:
            if total <= max_bytes:
                break
            total -= f.stat().st_size
            f.unlink()
            removed += 1
        return removed

    def gc(self, keep=None, *, scope=None, stale_after_s=3600.0):
        removed = 0
        for f in self._files(scope):
            meta = header_meta(f.read_bytes())
            if meta is None or entry_format(meta) != FORMAT_VERSION:
                gone = True
            else:
                provenance = entry_provenance(meta)
                gone = keep is not None and (provenance is None or not keep(provenance))
            if gone:
                f.unlink()
                removed += 1
        return removed

    def delete_scope(self, scope):
        files = self._files(scope)
        for f in files:
            f.unlink()
        (self._dir(scope) / "claims.json").unlink(missing_ok=True)
        return len(files)

    def claim(self, scope, holder):
        self._dir(scope).mkdir(exist_ok=True)
        claims = self.claims(scope)
        claims[holder] = time.time()
        (self._dir(scope) / "claims.json").write_text(json.dumps(claims))

    def claims(self, scope):
        path = self._dir(scope) / "claims.json"
        return json.loads(path.read_text()) if path.exists() else {}
''')
# Its registry line, as a pytest plugin loads it into a test run of its own.
REGISTRY_LINE = ('from codekv.stores import STORES, StoreKind\n'
                 'STORES["throwaway"] = StoreKind("throwaway_store:ThrowawayKVStore")\n')


def plugin_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "plugin"
    directory.mkdir()
    (directory / "throwaway_store.py").write_text(THROWAWAY_STORE)
    (directory / "throwaway_registry.py").write_text(REGISTRY_LINE)
    return directory


def test_the_contract_tests_run_on_a_store_added_by_its_registry_line(tmp_path):
    directory = plugin_dir(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(directory), str(ROOT)))}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p",
         "throwaway_registry", "tests/test_stores_contract.py", "-k", "throwaway"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    outcomes = re.findall(r"::(test_\w+)\[(local,)?throwaway[^\]]*\] (\w+)", run.stdout)
    assert {outcome for *_, outcome in outcomes} == {"PASSED"}
    # The store alone and the local store in front of it, each through the contract: every
    # test that runs on all stores (those needing raw bytes run where the tests have them).
    alone = {name for name, tiered, _ in outcomes if not tiered}
    assert {name for name, tiered, _ in outcomes if tiered} <= alone
    assert {"test_round_trip_is_exact", "test_a_poisoned_entry_is_never_returned_and_is_deleted",
            "test_collect_keeps_what_another_holder_claimed", "test_lru_eviction_on_put",
            "test_claims_are_per_scope_and_renewed"} <= alone


def test_the_command_line_opens_a_store_added_by_its_registry_line(tmp_path, monkeypatch,
                                                                 git_repo, byte_counter):
    directory = plugin_dir(tmp_path)
    monkeypatch.syspath_prepend(str(directory))
    monkeypatch.setitem(STORES, "throwaway", StoreKind("throwaway_store:ThrowawayKVStore"))
    git_repo.commit({"a.py": "x = 1\n"})
    url = f"throwaway://{tmp_path / 'kv'}"
    assert check_spec(f"local,{url}") == ["local", url]
    result = CliRunner().invoke(main, ["gc", str(git_repo.root), "--store", url])
    assert result.exit_code == 0, result.output
    assert "0 chunk KV files" in result.output
    store = open_kv_store(url)
    assert type(store).__name__ == "ThrowawayKVStore" and store.location == url

    from codekv.index import Index

    index = Index(git_repo.root)
    assert len(store.claims(default_scope(index))) == 1  # gc recorded its home's claim there
    index.close()


def test_gc_opens_a_store_without_the_composer_or_torch(git_repo, tmp_path):
    """``codekv gc`` on a fresh home: no composer, no torch, no transformers."""
    git_repo.commit({"a.py": "x = 1\n"})
    code = textwrap.dedent(f"""
        import sys
        from click.testing import CliRunner
        import codekv.tokens
        from codekv.cli import main
        from codekv.tokens import CounterSpec
        codekv.tokens.default_counter_spec = lambda: CounterSpec("bytes")
        import codekv.index
        codekv.index.default_counter_spec = lambda: CounterSpec("bytes")
        result = CliRunner().invoke(main, ["gc", {str(git_repo.root)!r}])
        assert result.exit_code == 0, result.output
        print(" ".join(sys.modules))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CODEKV_HOME": str(tmp_path / "home")}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    loaded = set(run.stdout.split())
    assert "codekv.stores.local" in loaded  # it did open the store
    assert not loaded & {"torch", "transformers", "codekv.compose"}


def test_gc_refuses_a_scope_that_is_not_utf8_before_removing_anything(git_repo, monkeypatch,
                                                                      byte_counter):
    git_repo.commit({"a.py": "x = 1\n"})
    assert CliRunner().invoke(main, ["index", str(git_repo.root)]).exit_code == 0
    monkeypatch.setenv("CODEKV_SCOPE", os.fsdecode(b"team-\xff\xfe"))
    result = CliRunner().invoke(main, ["gc", str(git_repo.root)])
    assert result.exit_code == 1 and not isinstance(result.exception, UnicodeError)
    assert "CODEKV_SCOPE=b'team-\\xff\\xfe' is not UTF-8 text" in result.output
