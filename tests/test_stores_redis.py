"""The shared chunk KV store on a real redis-server: keys, ACL scopes, failures, leases.

The guarantees it shares with every store (integrity, isolation, eviction, gc, claims) are
proven by tests/test_stores_contract.py, which runs on every registered store.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from fixtures.needs import require

from codekv.stores.entry import KVEntry, KVKey, decode_bytes, header_meta, token_hash
from codekv.stores.local import LocalKVStore

require("redis", "the redis client is not installed (the 'shared' extra)")

from redis.crc import key_slot  # noqa: E402
from redis.exceptions import NoPermissionError  # noqa: E402

from codekv.stores import StoreSpecError, check_spec, open_kv_store  # noqa: E402
from codekv.stores.base import StoreUnavailable  # noqa: E402
from codekv.stores.redis_store import (  # noqa: E402
    RedisKVStore,
    key_pattern,
    scope_tag,
    scope_user_rules,
)
from codekv.stores.tiered import TieredKVStore  # noqa: E402
from codekv.stores.urls import public_url  # noqa: E402


def make_key(chunk: str = "c1", scope: str = "repo:aaaa") -> KVKey:
    return KVKey(scope, "model", "tok", chunk, token_hash([1, 2, 3]))


def make_entry(seed: int = 0, n_tokens: int = 4) -> KVEntry:
    gen = torch.Generator().manual_seed(seed)
    keys = [torch.randn(2, n_tokens, 8, generator=gen) for _ in range(2)]
    values = [torch.randn(2, n_tokens, 8, generator=gen) for _ in range(2)]
    return KVEntry(keys, values, {"path": "a.py", "seed": seed})


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# -- keys ---------------------------------------------------------------------------------


def test_keys_carry_the_scope_in_a_hash_tag(redis_url, redis_server):
    store = RedisKVStore(redis_url)
    key = make_key()
    store.put(key, make_entry())
    names = sorted(n.decode() for n in redis_server.admin.keys("*"))
    assert names == [f"codekv:{{repo:aaaa}}:e:{key.digest()}", "codekv:{repo:aaaa}:lru"]
    assert len({key_slot(n.encode()) for n in names}) == 1  # one Redis Cluster slot per scope
    assert key_pattern("repo:aaaa") == "codekv:{repo:aaaa}:*"
    # A scope with characters a key pattern would misread is named by its hash.
    odd = "repo:/home/u/ü*[x]}"
    assert scope_tag(odd).startswith("#") and len(scope_tag(odd)) == 65
    assert scope_tag(odd) != scope_tag(odd + "x")


def test_value_has_the_local_file_format(redis_url, redis_server, tmp_path):
    key, entry = make_key(), make_entry()
    local = LocalKVStore(tmp_path / "kv")
    local.put(key, entry)
    RedisKVStore(redis_url).put(key, entry)
    value = redis_server.admin.get(f"codekv:{{repo:aaaa}}:e:{key.digest()}")
    file = local._path(key).read_bytes()
    assert len(value) == len(file) and header_meta(value) == header_meta(file)
    for got in (decode_bytes(value, key), decode_bytes(file, key)):
        assert all(torch.equal(g, w) for g, w in zip(got.keys + got.values,
                                                     entry.keys + entry.values))


def test_an_entry_is_never_overwritten(redis_url):
    store = RedisKVStore(redis_url)
    key = make_key()
    store.put(key, make_entry(seed=1))
    store.put(key, make_entry(seed=2))  # a racing writer of the same key: SET NX keeps the first
    got = store.get(key)
    assert got is not None and got.provenance["seed"] == 1


# -- URLs -----------------------------------------------------------------------------------


def test_reports_show_the_url_without_credentials():
    assert public_url("redis://alice:s3cret@cache.internal:6380/2?socket_timeout=1") == (
        "redis://cache.internal:6380/2"
    )
    assert public_url("rediss://h") == "rediss://h:6379/0"
    store = open_kv_store("redis://alice:s3cret@127.0.0.1:6379/3")
    assert store.url == "redis://127.0.0.1:6379/3" and "s3cret" not in repr(store)


@pytest.mark.parametrize("spec", ["http://host:6379/0", "redis://host:port/0", "redis://",
                                  "local,redis://h,redis://g", "redis://u:pw@host:x/0"])
def test_bad_store_specs_are_errors(spec):
    with pytest.raises(StoreSpecError) as error:
        check_spec(spec)
    assert ":pw@" not in str(error.value)


def test_a_url_is_never_taken_for_a_directory(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from codekv.cli import main

    monkeypatch.chdir(tmp_path)
    for command in (["compose", "--chunk", "a.py", "--query", "q"], ["prefill"], ["gc"]):
        result = CliRunner().invoke(main, [*command, "--store", "redis:/127.0.0.1:6379/0"])
        assert result.exit_code == 2 and "not a Redis URL" in result.output  # a slash short
        result = CliRunner().invoke(main, [*command, "--store", "htp://127.0.0.1:6379/0"])
        assert result.exit_code == 2 and "not a store URL" in result.output  # no such scheme
        result = CliRunner().invoke(main, [*command, "--store", "redis://127.0.0.1:6379/0"])
        assert "not inside a git repository" in result.output  # a valid URL: not a folder
    result = CliRunner().invoke(main, ["index", "--store", "redis://127.0.0.1:6379/0"])
    assert result.exit_code == 2 and "the index needs a directory" in result.output
    assert not any(p.name.startswith(("redis", "htp")) for p in tmp_path.rglob("*"))


# -- failures: the request goes on without the shared store ------------------------------


def test_unreachable_server_is_a_miss_with_a_reason_and_one_bounded_wait():
    store = RedisKVStore(f"redis://127.0.0.1:{closed_port()}/0")
    started = time.monotonic()
    assert store.get(make_key()) is None
    store.put(make_key(), make_entry())  # no raise: the caller keeps its KV
    assert not store.contains(make_key())
    for n in range(20):
        assert store.get(make_key(f"c{n}")) is None
    assert time.monotonic() - started < 5  # one connection attempt, then off for a while
    assert "ConnectionError" in store.error and store.url in store.error
    assert store.stats().entries == 0
    with pytest.raises(StoreUnavailable):
        store.gc()


class FakeServer:
    """Answers the client's handshake, then on GET either half-answers and hangs up (killed
    mid-request) or never answers (a timeout)."""

    def __init__(self, mode: str):
        self.mode = mode
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            while data := conn.recv(65536):
                if b"HELLO" in data:
                    conn.sendall(b"%1\r\n+proto\r\n:3\r\n")
                    continue
                if b"GET" not in data:
                    conn.sendall(b"+OK\r\n" * data.count(b"*"))
                    continue
                if self.mode == "killed":
                    conn.sendall(b"$1000000\r\n" + b"x" * 1000)
                    return
                time.sleep(3)
                return


@pytest.mark.parametrize("mode", ["killed", "silent"])
def test_server_dying_or_silent_mid_request(mode):
    server = FakeServer(mode)
    store = RedisKVStore(f"redis://127.0.0.1:{server.port}/0?socket_timeout=0.5")
    started = time.monotonic()
    assert store.get(make_key()) is None
    assert time.monotonic() - started < 2.5
    expected = "ConnectionError" if mode == "killed" else "TimeoutError"
    assert expected in store.error


def test_server_killed_then_requests_go_on(tmp_path, tiny_backend):
    from fixtures.stores import RedisServer

    from codekv.compose import Composer, Passage
    from codekv.gate import SupportGate

    server = RedisServer(tmp_path / "redis")
    url = server.url()
    try:
        passages = [Passage("alpha beta gamma"), Passage("delta epsilon")]
        local = LocalKVStore(tmp_path / "kv")
        both = Composer(tiny_backend("llama"), store=TieredKVStore(local, RedisKVStore(url)),
                        gate=SupportGate([], "test"), experimental=True)
        first = both.compose(passages, "zeta?", strategy="all")
        assert first.report.store_misses == 2 and first.report.store_error is None
        server.process.kill()
        server.process.wait()
        # Shared store only: every chunk is prefilled again, the reason is reported.
        alone = Composer(tiny_backend("llama"), store=url, gate=SupportGate([], "test"),
                         experimental=True)
        result = alone.compose(passages, "zeta?", strategy="all")
        assert result.status == "composed"
        assert (result.report.store_hits, result.report.store_misses) == (0, 2)
        assert "ConnectionError" in result.report.store_error
        assert result.report.store == url
        assert torch.allclose(result.next_token_logits(), first.next_token_logits(), atol=1e-4)
        # Local and shared: the local store still serves.
        again = both.compose(passages, "zeta?", strategy="all")
        assert (again.report.store_hits, again.report.store_misses) == (2, 0)
        assert again.report.store == f"local,{url}"
    finally:
        server.stop()


# -- scopes: ACL users limited to their key pattern ------------------------------------------


def test_acl_user_of_scope_a_cannot_read_scope_b(redis_server, redis_url):
    a, b = make_key(scope="repo:aaaa"), make_key(scope="repo:bbbb")
    for user, scope in (("alice", "repo:aaaa"), ("bob", "repo:bbbb")):
        redis_server.admin.acl_setuser(user, reset=True)  # then the documented rules:
        redis_server.admin.execute_command("ACL", "SETUSER", user,
                                           *scope_user_rules(f"pw-{user}", scope))
    alice = RedisKVStore(redis_server.url("alice", "pw-alice"))
    bob = RedisKVStore(redis_server.url("bob", "pw-bob"))
    alice.put(a, make_entry(seed=1))
    bob.put(b, make_entry(seed=2))
    assert alice.error is None and bob.error is None
    got = alice.get(a)
    assert got is not None and got.provenance["seed"] == 1  # her own scope works, leases too
    assert alice.get_or_lease(make_key("c9", "repo:aaaa")) is None and alice.error is None
    assert alice.get(b) is None
    assert "NOPERM" in alice.error and "'alice'" in alice.error and "repo:bbbb" in alice.error
    with pytest.raises(NoPermissionError):  # not codekv's doing: the server refuses the read
        alice._client.get(f"codekv:{{repo:bbbb}}:e:{b.digest()}")
    with pytest.raises(NoPermissionError):  # nor may she list key names
        alice._client.scan(0)
    # Bob still reads his entry: alice's refusal changed nothing.
    got = bob.get(b)
    assert got is not None and got.provenance["seed"] == 2


def test_a_request_in_a_scope_the_user_may_not_read_goes_on_and_says_why(
        redis_server, redis_url, tiny_backend):
    from codekv.compose import Composer, Passage
    from codekv.gate import SupportGate

    redis_server.admin.execute_command("ACL", "SETUSER", "alice",
                                       *scope_user_rules("pw", "repo:aaaa"))
    composer = Composer(tiny_backend("llama"), store=redis_server.url("alice", "pw"),
                        scope="repo:bbbb", gate=SupportGate([], "test"), experimental=True)
    result = composer.compose([Passage("alpha beta"), Passage("gamma")], "delta?",
                              strategy="all")
    assert result.status == "composed" and result.report.store_misses == 2
    assert "NOPERM" in result.report.store_error and "repo:bbbb" in result.report.store_error
    assert "pw" not in result.report.store and not redis_server.admin.keys("codekv:*")


# -- concurrency: leases ---------------------------------------------------------------------

WORKER = textwrap.dedent(
    """
    import random, sys, time, torch
    from codekv.stores.entry import KVEntry, KVKey, token_hash
    from codekv.stores.redis_store import RedisKVStore
    url, seed = sys.argv[1], int(sys.argv[2])
    store = RedisKVStore(url)
    chunks = [f"c{i}" for i in range(6)]
    random.Random(seed).shuffle(chunks)
    for chunk in chunks:
        key = KVKey("repo:aaaa", "model", "tok", chunk, token_hash([1]))
        entry = store.get_or_lease(key)
        if entry is None:  # this process computes the chunk
            store._client.incr(f"test:computed:{chunk}")
            time.sleep(0.3)
            t = torch.full((2, 3, 4), float(int(chunk[1:])))
            store.put(key, KVEntry([t], [t + 1], {"chunk": chunk}))
        else:
            assert entry.keys[0][0, 0, 0].item() == int(chunk[1:]), chunk
    print(store.stats().hits, store.waited, store.error)
    """
)


def test_an_entry_stored_between_a_miss_and_the_lease_is_not_computed_again(redis_url,
                                                                            redis_server):
    """Another process puts the entry (and frees its lease) right after this one missed: the
    lease this one then takes must not make it compute the chunk a second time."""
    key = KVKey("repo:aaaa", "model", "tok", "late", token_hash([1]))
    t = torch.full((2, 3, 4), 7.0)
    RedisKVStore(redis_url).put(key, KVEntry([t], [t + 1], {"chunk": "late"}))
    store = RedisKVStore(redis_url)
    fetch, calls = store._fetch, []

    def missed_first(wire_key):
        calls.append(wire_key)
        return None if len(calls) == 1 else fetch(wire_key)

    store._fetch = missed_first
    entry = store.get_or_lease(key)
    assert entry is not None and entry.keys[0][0, 0, 0].item() == 7.0
    assert not redis_server.admin.keys("codekv:*:lease:*")  # the lease it took is freed
    assert store.stats().hits == 1


def test_concurrent_processes_compute_each_chunk_once(redis_url, redis_server):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, redis_url, str(seed)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for seed in range(4)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    computed = {n.decode(): int(redis_server.admin.get(n))
                for n in redis_server.admin.keys("test:computed:*")}
    assert computed == {f"test:computed:c{i}": 1 for i in range(6)}  # each chunk once
    assert sum(int(out.split()[0]) for out, _ in outputs) == 4 * 6 - 6  # the others: hits
    store = RedisKVStore(redis_url)
    for i in range(6):
        got = store.get(KVKey("repo:aaaa", "model", "tok", f"c{i}", token_hash([1])))
        assert got is not None and got.keys[0][0, 0, 0].item() == i
    assert not redis_server.admin.keys("codekv:*:lease:*")  # released on put


# -- acceptance: two machines' homes, one Redis -------------------------------------------------


@pytest.mark.model
def test_second_home_composes_from_the_first_homes_entries(tmp_path, redis_url, default_backend,
                                                           monkeypatch):
    """Two clones in two CODEKV_HOMEs (two machines' worth), one scope, one Redis: the second
    prefills no chunk and answers exactly as the first."""
    import json

    from click.testing import CliRunner
    from fixtures.repos import GitRepo

    import codekv.models
    from codekv.cli import main
    from codekv.stdlib_repo import stdlib_dir

    monkeypatch.setattr(codekv.models, "load_backend",
                        lambda model=None, engine="transformers": default_backend)
    monkeypatch.setenv("CODEKV_SCOPE", "team:stdlib-sample")
    files = {name: (stdlib_dir() / name).read_bytes() for name in ("shlex.py", "fnmatch.py")}
    chunks = ["fnmatch.py::filter", "shlex.py::split", "shlex.py::quote"]
    query = "# Question: which function above splits a string like a shell?\n# Answer:"
    outputs = []
    for machine in ("a", "b"):
        clone = GitRepo(tmp_path / machine / "repo")
        clone.commit(files)
        monkeypatch.setenv("CODEKV_HOME", str(tmp_path / machine / "home"))
        args = ["compose", str(clone.root), "--query", query, "--strategy", "anchors",
                "--max-new-tokens", "12", "--experimental", "--json", "--store", redis_url]
        for chunk in chunks:
            args += ["--chunk", chunk]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        outputs.append(json.loads(result.stdout))
    first, second = outputs
    assert first["status"] == second["status"] == "composed"
    assert (first["report"]["store_hits"], first["report"]["store_misses"]) == (0, 3)
    assert (second["report"]["store_hits"], second["report"]["store_misses"]) == (3, 0)
    assert second["report"]["chunk_misses"] == 0 and second["report"]["store_error"] is None
    assert second["report"]["store"] == redis_url
    assert second["answer"] == first["answer"] and first["answer"].strip()
    assert not (tmp_path / "b" / "home" / "kv").exists()  # nothing went to the local disk


# -- 16-bit values on the wire ----------------------------------------------------------------


def test_16_bit_values_halve_the_bytes_and_come_back_in_the_stored_dtype(redis_url):
    full, half = RedisKVStore(redis_url), RedisKVStore(redis_url + "?kv_dtype=float16")
    key, entry = make_key(), make_entry(n_tokens=64)
    full.put(key, entry)
    half.put(key, entry)
    assert full.stats().entries == 2  # the precision is part of the entry's identity
    exact, rounded = full.get(key), half.get(key)
    assert all(torch.equal(g, w) for g, w in zip(exact.keys, entry.keys))
    for got, want in zip(rounded.keys + rounded.values, entry.keys + entry.values):
        assert got.dtype == torch.float32
        assert torch.equal(got, want.half().float())  # exactly the fp16 rounding, nothing else
    assert half.url == redis_url + "?kv_dtype=float16" != full.url
    sizes = sorted(full._sizes(full._scan("codekv:{*}:e:*")).values())
    assert sizes[0] < 0.55 * sizes[1]


def test_values_beyond_the_16_bit_range_are_stored_in_full(redis_url):
    half = RedisKVStore(redis_url + "?kv_dtype=float16")
    entry = make_entry()
    entry.keys[0][0, 0, 0] = 1e6  # would be inf in float16
    half.put(make_key(), entry)
    got = half.get(make_key())
    assert torch.equal(got.keys[0], entry.keys[0])


def test_bad_kv_dtype_is_an_error(redis_url):
    with pytest.raises(StoreSpecError, match="kv_dtype"):
        check_spec(redis_url + "?kv_dtype=int8")


def test_16_bit_store_keeps_all_exact(redis_url, tiny_backend):
    from codekv.compose import Composer, Passage
    from codekv.gate import SupportGate

    backend = tiny_backend("llama")
    passages = [Passage("alpha beta gamma delta"), Passage("epsilon zeta eta")]
    composer = Composer(backend, store=redis_url + "?kv_dtype=float16",
                        gate=SupportGate([], "test"), experimental=True)
    reference = composer.full_prefill(passages, "theta?").next_token_logits()
    composer.compose(passages, "theta?", strategy="all")  # fills the store
    result = composer.compose(passages, "theta?", strategy="all")
    assert result.report.store_hits == 2
    assert (result.next_token_logits() - reference).abs().max() <= 1e-4
    naive = composer.compose(passages, "theta?", strategy="none")
    assert naive.report.store_hits == 2  # reused 16-bit KV: close, not exact


# -- the store named by $CODEKV_STORE, and `codekv gc` on it ------------------------------------


def test_codekv_store_names_the_default_store(redis_url, monkeypatch, tmp_path):
    from click.testing import CliRunner

    from codekv.cli import main
    from codekv.stores import default_kv_store

    monkeypatch.setenv("CODEKV_STORE", redis_url)
    assert isinstance(default_kv_store(), RedisKVStore)
    monkeypatch.setenv("CODEKV_STORE", f"local,{redis_url}")
    both = default_kv_store(tmp_path)
    assert isinstance(both, TieredKVStore) and both.local.root == tmp_path / "kv"
    monkeypatch.setenv("CODEKV_STORE", "redis://127.0.0.1:notaport/0")
    monkeypatch.chdir(tmp_path)
    from fixtures.repos import GitRepo

    GitRepo(tmp_path / "repo").commit({"a.py": "x = 1\n"})
    result = CliRunner().invoke(main, ["gc", str(tmp_path / "repo")])
    assert result.exit_code == 1 and "$CODEKV_STORE: bad port" in result.output


def test_gc_on_the_shared_store_drops_kv_of_replaced_blobs(tiny_backend, git_repo, redis_url,
                                                          byte_counter):
    from click.testing import CliRunner

    from codekv.cli import main
    from codekv.compose import Composer, Passage
    from codekv.gate import SupportGate
    from codekv.index import Index

    git_repo.commit({"a.py": "def alpha(x):\n    return x * 2\n",
                     "b.py": "def beta():\n    return 1\n"})
    index = Index(git_repo.root)
    index.update()
    composer = Composer(tiny_backend("llama"), index, redis_url, gate=SupportGate([], "test"),
                        experimental=True)
    assert composer.prefill(["a.py::alpha", "b.py::beta", Passage("some notes")]) == (3, 0)
    index.close()
    git_repo.commit({"a.py": "def alpha(x):\n    return x * 3\n"})
    assert CliRunner().invoke(main, ["index", str(git_repo.root)]).exit_code == 0
    result = CliRunner().invoke(main, ["gc", str(git_repo.root), "--store", redis_url])
    assert result.exit_code == 0, result.output
    assert "1 chunk KV files" in result.output
    assert RedisKVStore(redis_url).stats().entries == 2  # beta and the passage stay


def test_a_lease_is_released_when_its_entry_does_not_fit(redis_url, redis_server):
    store = RedisKVStore(redis_url, max_bytes=100)
    assert store.get_or_lease(make_key()) is None  # this process computes it...
    assert redis_server.admin.keys("codekv:*:lease:*")
    store.put(make_key(), make_entry())  # ...but it is too big to keep: waiters compute it
    assert not redis_server.admin.keys("codekv:*") and store.error is None


def test_local_store_in_front_keeps_a_copy_of_shared_hits(redis_url, tmp_path):
    RedisKVStore(redis_url).put(make_key(), make_entry(seed=3))
    local = LocalKVStore(tmp_path / "kv")
    both = open_kv_store(f"local,{redis_url}", lambda: local)
    assert isinstance(both, TieredKVStore) and not local.contains(make_key())
    got = both.get(make_key())
    assert got is not None and got.provenance["seed"] == 3
    assert local.contains(make_key()) and local.get(make_key()).provenance["seed"] == 3


# -- hostile input: bad URLs, planted keys, poisoned entries, other homes ----------------------


@pytest.mark.parametrize("spec, expected", [
    ("redis://127.0.0.1:{port}/0?socket_timeout=abc", "socket_timeout=abc"),
    ("redis://127.0.0.1:{port}/0?socket_timeout=-1", "socket_timeout=-1"),
    ("redis://127.0.0.1:{port}/abc", "database 'abc'"),
    ("redis://127.0.0.1:{port}/0?colour=blue", "unknown option 'colour'"),
    ("redis:///0?password=hunter2", "not a Redis URL: redis:///0?password=***"),
    ("redis://alice:hunter2@127.0.0.1:x/0", "bad port in redis://alice:***@127.0.0.1:x/0"),
    ("redis://alice:hunter2@127.0.0.1:{port}/one", "redis://alice:***@127.0.0.1"),
    ("local,redis://alice:hunter2@127.0.0.1:{port}/0?kv_dtype=int8", "kv_dtype=int8"),
    # A password holding "@", "/" or a space is masked whole (the URL is parsed once).
    ("redis://:p@ss-hunter2@127.0.0.1:{port}/abc", "database 'abc' in redis://:***@127.0.0.1:"),
    ("redis://alice:pa ss@hunter2@127.0.0.1:x/0", "bad port in redis://alice:***@127.0.0.1:x/0"),
    ("local,redis://:pa/ss-hunter2@127.0.0.1:{port}/0", "percent-encode them (%2F"),
    ("redis+cluster://:a?b-hunter2@127.0.0.1:{port},127.0.0.1:1", "redis+cluster://:***@127.0"),
])
def test_a_bad_store_url_is_a_clear_error_that_shows_no_password(spec, expected, git_repo,
                                                                 byte_counter):
    """Refused when the option is parsed, naming the bad part, before anything is opened."""
    from click.testing import CliRunner

    from codekv.cli import main

    git_repo.commit({"a.py": "x = 1\n"})
    spec = spec.format(port=closed_port())
    for args in (["gc", str(git_repo.root)], ["prefill", str(git_repo.root)]):
        result = CliRunner().invoke(main, [*args, "--store", spec])
        assert result.exit_code == 2, result.output
        assert expected in result.output and "hunter2" not in result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)
    with pytest.raises(StoreSpecError) as error:
        open_kv_store(spec, lambda: None)
    assert expected in str(error.value) and "hunter2" not in str(error.value)


def test_credentials_are_masked_wherever_a_url_appears():
    from codekv.stores.urls import mask_credentials

    text = ("failed: rediss://svc:s3cret@kv:6380/2 then redis://h/0?password=hunter2&db=1 "
            "and http://x/?api_token=abc;auth=xyz and redis://bob@h/0 plain")
    masked = mask_credentials(text)
    for secret in ("s3cret", "hunter2", "abc", "xyz"):
        assert secret not in masked
    assert "rediss://svc:***@kv:6380/2" in masked and "password=***&db=1" in masked
    assert "redis://bob@h/0 plain" in masked  # a user name alone is not a secret
    assert mask_credentials("at redis://:p@ss/w-hunter2@h/0 now") == "at redis://:***@h/0 now"


def test_an_error_about_a_url_shows_none_of_its_secrets_whatever_they_hold():
    from codekv.stores.urls import mask_secrets, mask_url

    url = "rediss://alice:pa ss@w%2Fhunter2@kv:6380/0?password=s3cret&socket_timeout=2"
    assert mask_url(url) == "rediss://alice:***@kv:6380/0?password=***&socket_timeout=2"
    error = "AUTH failed for 'pa ss@w/hunter2' (password=s3cret) at kv:6380"
    assert mask_secrets(error, url) == "AUTH failed for '***' (password=***) at kv:6380"


def test_a_key_of_another_type_is_a_bad_entry_not_an_outage(redis_url, redis_server):
    """A value that is not a string at an entry key (any writer of the scope can SET one):
    deleted and recomputed like a damaged entry; the store stays on and gc goes on."""
    store = RedisKVStore(redis_url)
    planted, good = make_key("c1"), make_key("c2")
    store.put(good, make_entry())
    redis_server.admin.hset(store._entry_key(planted), "not", "an entry")
    assert store.get(planted) is None
    assert store.error is None and store.corrupt == 1
    assert not redis_server.admin.exists(store._entry_key(planted))
    assert store.get(good) is not None  # not switched off
    store.put(planted, make_entry(seed=5))
    assert store.get(planted).provenance["seed"] == 5
    other = make_key("c3")
    redis_server.admin.rpush(store._entry_key(other), "x")
    assert store.stats().entries == 2  # a key of another type is no entry
    assert store.gc() == 1 and not redis_server.admin.exists(store._entry_key(other))
    assert store.get(good) is not None and store.stats().entries == 2


def scope_user(redis_server, user: str, scope: str) -> str:
    redis_server.admin.execute_command("ACL", "SETUSER", user,
                                       *scope_user_rules(f"pw-{user}", scope))
    return redis_server.url(user, f"pw-{user}")


def test_a_scope_user_counts_and_collects_its_own_scope(redis_server, redis_url):
    alice = RedisKVStore(scope_user(redis_server, "alice", "team:a"))
    for chunk in ("c1", "c2", "c3"):
        alice.put(make_key(chunk, "team:a"), make_entry(seed=int(chunk[1])))
    RedisKVStore(redis_url).put(make_key("c1", "team:b"), make_entry())
    assert alice.stats("team:a").entries == 3 and alice.error is None
    assert alice.gc(lambda provenance: provenance["seed"] != 2, scope="team:a") == 1
    assert alice.stats("team:a").entries == 2
    assert alice.collect("team:a", lambda provenance: True, "home-a") == (0, [])
    with pytest.raises(StoreUnavailable, match="may not use every scope"):
        alice.gc()  # every scope: an administrator's job, and the message says so


def use_tiny_backend(monkeypatch, backend) -> None:
    import codekv.models

    monkeypatch.setattr(codekv.models, "load_backend",
                        lambda model=None, engine="transformers": backend)


def test_prefill_and_gc_as_a_scope_user(redis_server, redis_url, git_repo, tiny_backend,
                                        byte_counter, monkeypatch):
    from click.testing import CliRunner

    from codekv.cli import main

    use_tiny_backend(monkeypatch, tiny_backend("llama"))
    monkeypatch.setenv("CODEKV_SCOPE", "team:a")
    url = scope_user(redis_server, "alice", "team:a")
    git_repo.commit({"a.py": "def alpha(x):\n    return x * 2\n",
                     "b.py": "def beta():\n    return 1\n\n\ndef gamma():\n    return 3\n"})
    result = CliRunner().invoke(main, ["prefill", str(git_repo.root), "--store", url])
    assert result.exit_code == 0, result.output
    assert "computed 3" in result.output and ": 3 entries" in result.output
    assert "not used" not in result.output
    result = CliRunner().invoke(main, ["gc", str(git_repo.root), "--store", url])
    assert result.exit_code == 0, result.output
    assert "0 chunk KV files" in result.output and "pw-alice" not in result.output


def test_gc_from_a_home_that_never_indexed_leaves_the_shared_entries(
        redis_url, git_repo, tiny_backend, byte_counter, monkeypatch, tmp_path):
    """The data loss of issue 25: one home composes, a fresh home's gc used to wipe the
    repository's entries from the shared store."""
    from click.testing import CliRunner

    from codekv.cli import main
    from codekv.compose import Composer
    from codekv.gate import SupportGate
    from codekv.index import Index

    git_repo.commit({"a.py": "def alpha(x):\n    return x * 2\n",
                     "b.py": "def beta():\n    return 1\n"})
    index = Index(git_repo.root)
    index.update()
    composer = Composer(tiny_backend("llama"), index, redis_url, gate=SupportGate([], "test"),
                        experimental=True)
    assert composer.prefill(["a.py::alpha", "b.py::beta"]) == (2, 0)
    index.close()
    monkeypatch.setenv("CODEKV_HOME", str(tmp_path / "second-home"))
    result = CliRunner().invoke(main, ["gc", str(git_repo.root), "--store", redis_url])
    assert result.exit_code == 0, result.output
    assert "0 chunk KV files" in result.output
    assert RedisKVStore(redis_url).stats().entries == 2


def test_gc_keeps_what_another_home_claimed_until_its_claim_expires(
        redis_url, redis_server, git_repo, tiny_backend, byte_counter, monkeypatch, tmp_path):
    """Two homes on one repository path, one shared store: the second home, indexed after a
    commit the first has not seen, removes the first home's entries only once the first has
    not used the scope for longer than the retention window."""
    from click.testing import CliRunner

    from codekv.cli import main
    from codekv.compose import Composer
    from codekv.gate import SupportGate
    from codekv.index import Index
    from codekv.stores import default_holder, default_scope

    git_repo.commit({"a.py": "def alpha(x):\n    return x * 2\n",
                     "b.py": "def beta():\n    return 1\n"})
    index = Index(git_repo.root)
    index.update()
    Composer(tiny_backend("llama"), index, redis_url, gate=SupportGate([], "test"),
             experimental=True).prefill(["a.py::alpha", "b.py::beta"])
    scope, first = default_scope(index), default_holder(index.store_dir)
    index.close()
    git_repo.commit({"a.py": "def alpha(x):\n    return x * 3\n"})
    monkeypatch.setenv("CODEKV_HOME", str(tmp_path / "second-home"))
    assert CliRunner().invoke(main, ["index", str(git_repo.root)]).exit_code == 0
    result = CliRunner().invoke(main, ["gc", str(git_repo.root), "--store", redis_url])
    assert result.exit_code == 0, result.output
    assert "0 chunk KV files" in result.output and "1 other codekv home" in result.output
    assert RedisKVStore(redis_url).stats().entries == 2
    long_ago = time.time() - 8 * 24 * 3600
    redis_server.admin.hset(f"codekv:{{{scope_tag(scope)}}}:claims", first, repr(long_ago))
    result = CliRunner().invoke(main, ["gc", str(git_repo.root), "--store", redis_url])
    assert result.exit_code == 0, result.output
    assert "1 chunk KV files" in result.output
    assert RedisKVStore(redis_url).stats().entries == 1  # beta stays


def _planted(composer, passage, make):
    """Replace the stored entry of ``passage`` by ``make(entry)``, checksum and all: what any
    writer of the scope can do."""
    piece = composer._piece(passage)
    key = composer.chunks.key(piece, [])
    store = composer.store
    entry = store.get(key)
    store._client.delete(store._entry_key(key))
    store.put(key, make(entry))
    return key


@pytest.mark.parametrize("poison", ["nan", "other heads", "other token count", "other dtype"])
def test_a_poisoned_entry_is_recomputed_replaced_and_reported(redis_url, tiny_backend, poison):
    from codekv.compose import Composer, Passage
    from codekv.gate import SupportGate

    def make(entry):
        keys, values = list(entry.keys), list(entry.values)
        if poison == "nan":
            keys[0] = keys[0].clone()
            keys[0][0, 0, 0] = float("nan")
        elif poison == "other heads":
            keys = [torch.randn(1, k.shape[1], k.shape[2]) for k in keys]
            values = [torch.randn(1, v.shape[1], v.shape[2]) for v in values]
        elif poison == "other token count":
            keys = [torch.cat((k, k), dim=1) for k in keys]
            values = [torch.cat((v, v), dim=1) for v in values]
        else:
            keys, values = [k.double() for k in keys], [v.double() for v in values]
        return KVEntry(keys, values, entry.provenance)

    passages = [Passage("alpha beta gamma"), Passage("delta epsilon")]
    composer = Composer(tiny_backend("llama"), store=redis_url, gate=SupportGate([], "test"),
                        experimental=True)
    first = composer.compose(passages, "zeta?", strategy="all")
    key = _planted(composer, passages[0], make)
    result = composer.compose(passages, "zeta?", strategy="all")
    assert result.status == "composed" and result.report.store_error is None
    assert result.report.store_rejected == 1
    assert (result.report.store_hits, result.report.store_misses) == (1, 1)
    assert torch.allclose(result.next_token_logits(), first.next_token_logits(), atol=1e-5)
    replaced = composer.store.get(key)  # the recomputed entry took the bad one's place
    assert all(bool(torch.isfinite(k).all()) for k in replaced.keys)
    assert replaced.keys[0].shape == first_shape(composer, passages[0])
    again = composer.compose(passages, "zeta?", strategy="all")
    assert (again.report.store_hits, again.report.store_rejected) == (2, 0)


def first_shape(composer, passage):
    piece = composer._piece(passage)
    return composer.backend.prefill_chunk(piece.ids).keys[0].shape
