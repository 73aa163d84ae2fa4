"""Gemma 3 270M end to end on both engines (``--model gemma3``): five of every six layers attend
through a 512-token window with their own RoPE base, so every request here runs past a window.
Composition with ``all`` against full prefill (llama.cpp: within its batch-split floor), the
adversarial cases, the tokenizer both engines read, and the gate. The model loads once per
session; without it these fail under CI=true.
"""

from __future__ import annotations

import json
from importlib import resources

import pytest
from fixtures.compose import B2, PREFIX, QUERY, A, B, make_composer
from fixtures.needs import missing

from codekv.compose import COMPOSED, FULL_PREFILL, Passage
from codekv.gate import GateRequest, SupportGate
from codekv.stdlib_repo import stdlib_dir

pytestmark = pytest.mark.model

WINDOW = 512


def _source(name: str, start: str, end: str) -> str:
    text = (stdlib_dir() / name).read_text()
    return text[text.index(start):text.index(end)]


# shlex.shlex.read_token: ~700 tokens alone, so the request crosses the window inside it.
LONG = Passage(_source("shlex.py", "    def read_token(self):", "    def sourcehook("),
               "read_token")


def assert_exact(result, reference) -> None:
    """Same tokens, next-token logits and KV in every layer as the full prefill, up to float32
    rounding: keys here reach ~100 (the tiny models' are O(1)), so KV is compared relative to
    its size, and logits within 1e-3 (acceptance runs saw 2e-5)."""
    assert result.token_ids == reference.token_ids
    logits = (result.next_token_logits() - reference.next_token_logits()).abs().max()
    assert logits <= 1e-3
    for ours, theirs in zip(result.state.cache.layers, reference.state.cache.layers, strict=True):
        for a, b in ((ours.keys, theirs.keys), (ours.values, theirs.values)):
            assert a.shape == b.shape
            assert (a - b).abs().max() <= 1e-4 * b.abs().max()


@pytest.fixture(scope="session")
def gemma3_path(model_cache):
    from codekv.models import ModelLoadError, resolve_model

    try:
        return resolve_model("gemma3")
    except ModelLoadError as error:
        missing(f"Gemma 3 cannot be loaded: {error}")


@pytest.fixture(scope="session")
def gemma3_hf(gemma3_path):
    from codekv.models import load_backend

    return load_backend(gemma3_path)


@pytest.fixture(scope="session")
def gemma3_llama(gemma3_path):
    try:
        from codekv.backends.llamacpp import LlamaCppBackend
    except ImportError:
        missing("llama-cpp-python is not installed (pip install 'codekv[llamacpp]')")
    return LlamaCppBackend(gemma3_path, n_ctx=2048)


@pytest.mark.llamacpp
def test_the_model_is_gemma3_with_its_windows(gemma3_hf, gemma3_llama):
    config = gemma3_hf.config
    assert (config.model_type, config.sliding_window, config.num_hidden_layers) == (
        "gemma3_text", WINDOW, 18)
    assert config.layer_types.count("full_attention") == 3  # every sixth layer
    rope = config.rope_parameters
    assert (rope["sliding_attention"]["rope_theta"], rope["full_attention"]["rope_theta"]) == (
        10_000.0, 1_000_000.0)
    assert gemma3_hf.info.unsupported is None and gemma3_llama.info.unsupported is None
    assert gemma3_llama.info.family == "gemma3"


@pytest.mark.llamacpp
def test_both_engines_read_the_same_tokens(gemma3_hf, gemma3_llama):
    """transformers' GGUF loader gives Gemma's tokenizer no merges (one token per character);
    the one built from the GGUF's scores reads what llama.cpp reads."""
    text = (LONG.text + "\nünïcödé 日本語 ✓\t tab\n\n  spaces   \r\n emoji 😀 "
            + (stdlib_dir() / "fnmatch.py").read_text())
    ids = gemma3_llama.tokenize(text)
    assert gemma3_hf.tokenize(text) == ids
    assert len(ids) < len(text) / 2.5
    assert gemma3_hf.detokenize(ids) == text
    turn = gemma3_hf.tokenizer.convert_tokens_to_ids("<end_of_turn>")
    assert turn in gemma3_hf.end_token_ids and turn in gemma3_llama.end_token_ids


def test_all_equals_full_prefill_past_the_window(gemma3_hf, tmp_path):
    composer = make_composer(gemma3_hf, tmp_path)
    chunks = [A, LONG, B]
    for attempt in ("cold", "warm"):  # chunk KV computed, then read back from the store
        result = composer.compose(chunks, QUERY, prefix=PREFIX, strategy="all")
        assert result.status == COMPOSED
        assert result.report.context_tokens > WINDOW + 200
        assert result.report.chunk_hits == (3 if attempt == "warm" else 0)
        reference = composer.full_prefill(chunks, QUERY, prefix=PREFIX)
        assert_exact(result, reference)
    assert result.generate(4) == reference.generate(4)
    naive = composer.compose(chunks, QUERY, prefix=PREFIX, strategy="none")
    diff = (naive.next_token_logits() - reference.next_token_logits()).abs().max()
    assert diff > 1e-2  # the check above can fail: reused KV alone is not exact


def test_order_neighbour_and_repeats_stay_exact(gemma3_hf, tmp_path):
    composer = make_composer(gemma3_hf, tmp_path)
    for chunks in ([A, LONG, B], [B, LONG, A], [B2, LONG, A], [A, LONG, A]):
        result = composer.compose(chunks, QUERY, strategy="all")
        assert_exact(result, composer.full_prefill(chunks, QUERY))
    assert composer.store.stats().entries == 4  # A, LONG, B, B2: each stored once


@pytest.mark.llamacpp
def test_llama_cpp_all_is_within_the_batch_floor_past_the_window(gemma3_llama, tmp_path):
    from fixtures.llamacpp import check_all

    floor, report = check_all(gemma3_llama, make_composer(gemma3_llama, tmp_path), [A, LONG, B])
    assert report.context_tokens > 2 * WINDOW + 100
    assert floor < 0.05


@pytest.mark.llamacpp
def test_llama_cpp_all_after_a_prefix_is_within_the_batch_floor(gemma3_llama, tmp_path):
    """Once a defect: placing the later parts let llama.cpp's window cache take the prefix's
    cells as free (a window behind the request's last position), so the run recomputed after
    them missed them (`all` KL 0.044 where the floor is 0.005). Every request cell is now held
    twice (``PIN``), so none is taken."""
    from fixtures.llamacpp import check_all

    comp = make_composer(gemma3_llama, tmp_path)
    for chunks in ([A, LONG, B], [A, LONG, A]):  # a repeated chunk was furthest off (0.23)
        check_all(gemma3_llama, comp, chunks, PREFIX)


@pytest.mark.llamacpp
def test_llama_cpp_recomputes_inside_a_chunk_longer_than_the_window(gemma3_llama):
    """A run inside a long chunk attends to the window's cells before it: a chunk state keeps
    them (a sequence's own state keeps only its last window's). Against full prefill, within
    the batch-split floor: the chunk's cells were made in other batches than the floor's."""
    from codekv.divergence import logits_kl

    backend = gemma3_llama
    ids, query = backend.tokenize(LONG.text), backend.tokenize(QUERY)
    assert len(ids) > 2 * WINDOW + 100
    state = backend.recompute(ids, [backend.prefill_chunk(ids)], [300, 301, 302], query)
    logits = state.logits
    assert state.cuts == [300, 303, 512, 1024, len(ids)]
    floor = logits_kl(backend.full_prefill(ids + query).logits,
                      backend.batch_reference(ids + query, state.cuts).logits)
    full = backend.full_prefill(ids + query).logits
    assert logits_kl(full, logits) <= floor + 0.005


@pytest.mark.llamacpp
def test_smollm2_evidence_does_not_license_gemma3(gemma3_hf, gemma3_llama, tmp_path):
    """The shipped support file has no passage evidence for Gemma 3 (its entries: code QA and
    the last prompt's segments): these requests fall back, and the reason names the family;
    relabelled as Gemma's family, SmolLM2's evidence still names its own model."""
    for backend in (gemma3_hf, gemma3_llama):
        composer = make_composer(backend, tmp_path, experimental=False, gate=SupportGate.load())
        result = composer.compose([A, B], QUERY)
        assert result.status == FULL_PREFILL
        reason = result.report.fallback_reason
        assert f"no evidence for {backend.info.family}/rag" in reason, reason
    document = json.loads(resources.files("codekv").joinpath("data", "support.json").read_text())
    document["entries"] = [entry for entry in document["entries"] if entry["family"] == "llama"]
    for entry in document["entries"]:
        entry["family"] = gemma3_hf.info.family
    relabelled = tmp_path / "relabelled.json"
    relabelled.write_text(json.dumps(document))
    request = GateRequest(gemma3_hf.info.fingerprint, frozenset({"python"}), 1000)
    verdict = SupportGate.load(relabelled).verdict(gemma3_hf.info.family, "code-qa",
                                                   request=request)
    assert not verdict.allowed
    assert "evidence is for SmolLM2-135M-Instruct" in verdict.reason
    assert f"another gemma3_text model (fingerprint {gemma3_hf.info.fingerprint[:12]})" \
        in verdict.reason


def test_the_shipped_gate_composes_python_code_with_gemma3_s_own_rule(gemma3_hf, git_repo,
                                                                      tmp_path):
    """Gemma 3's own code-QA entry on transformers (``query@0.25``, confirmed held out)
    licenses its Python chunks from the store without ``--experimental``: the request is
    composed with that rule, not SmolLM2's, and its next-token distribution stays near full
    prefill's, far nearer than with nothing recomputed."""
    from codekv.compose import Composer
    from codekv.divergence import logits_kl
    from codekv.index import Index
    from codekv.stores.local import LocalKVStore

    git_repo.commit({"shlex.py": (stdlib_dir() / "shlex.py").read_bytes()})
    index = Index(git_repo.root)
    index.update()
    composer = Composer(gemma3_hf, index, store=LocalKVStore(tmp_path / "kv"),
                        gate=SupportGate.load())
    chunks = ["shlex.py::split", "shlex.py::quote", "shlex.py::shlex.read_token"]
    query = "# Question: which function above splits a string like a shell?\n# Answer:"
    composer.compose(chunks, query)  # stores each chunk's KV
    result = composer.compose(chunks[::-1], query)
    assert result.status == COMPOSED, result.report.fallback_reason
    assert (result.report.strategy, result.report.ratio) == ("query", 0.25)
    assert result.report.context_tokens > WINDOW  # past the sliding window
    full = composer.full_prefill(chunks[::-1], query)
    assert result.token_ids == full.token_ids
    kl = logits_kl(full.next_token_logits(), result.next_token_logits())
    # the control: the same chunks reused with nothing recomputed (measured 0.029 against
    # the rule's 0.00003)
    bare = Composer(gemma3_hf, index, store=LocalKVStore(tmp_path / "kv"), experimental=True)
    none = bare.compose(chunks[::-1], query, strategy="none")
    assert none.status == COMPOSED
    assert kl <= 0.003 and 10 * kl <= logits_kl(full.next_token_logits(),
                                                 none.next_token_logits())
