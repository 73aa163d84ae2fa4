"""The OpenVINO engine on tiny random-weight models: every request against OpenVINO's own full
prefill (recomputing every token is exact whatever the order, repeats, neighbours or
positions), its one-call recompute against the transformers engine's, and what it refuses."""

from __future__ import annotations

import itertools

import pytest
from fixtures.compose import (
    B2,
    PREFIX,
    QUERY,
    TOL,
    A,
    B,
    C,
    assert_exact,
    make_composer,
    max_diff,
)
from fixtures.models import tiny_model, tiny_tokenizer
from fixtures.needs import require

from codekv.compose import COMPOSED
from codekv.selection import STRATEGIES

require("openvino", "openvino is not installed (the 'openvino' extra)")

FILE = ("class Rectangle:\n    def area(self, width, height):\n        return width * height\n\n"
        "    def perimeter(self, width, height):\n        return 2 * (width + height)\n")


@pytest.fixture(scope="module")
def openvino_of(tmp_path_factory, model_cache):
    """``make(family, seed=0)`` -> an OpenVINO backend of that tiny model (its IR exported
    once into the model cache), with the transformers backend of the same directory."""
    from codekv.backends.engines import ENGINES

    made = {}

    def make(family: str = "llama", seed: int = 0):
        if (family, seed) not in made:
            path = tiny_directory(tmp_path_factory, family, seed)
            made[family, seed] = (ENGINES["openvino"].load(path),
                                  ENGINES["transformers"].load(path))
        return made[family, seed]

    return make


def tiny_directory(tmp_path_factory, family: str = "llama", seed: int = 0):
    """The tiny model of ``family`` saved as a Hugging Face directory (once a session)."""
    path = tmp_path_factory.getbasetemp() / f"tiny-openvino-{family}-{seed}"
    if not (path / "config.json").is_file():
        tiny_model(family, seed).save_pretrained(path)
        tiny_tokenizer().save_pretrained(path)
    return path


@pytest.mark.parametrize("family", ["llama", "qwen3", "phi"])
def test_all_equals_openvinos_full_prefill(openvino_of, tmp_path, family):
    """Re-positioned chunk KV (Llama RoPE, k-norm before RoPE, partial rotary) with every
    token recomputed in one OpenVINO call is OpenVINO's full prefill, cold and from the store;
    which is the transformers engine's within rounding."""
    backend, transformers = openvino_of(family)
    composer = make_composer(backend, tmp_path)
    for attempt in ("cold", "warm"):
        result = composer.compose([A, B, C], QUERY, prefix=PREFIX, strategy="all")
        assert result.status == COMPOSED and result.report.reused_tokens == 0
        assert result.report.chunk_hits == (3 if attempt == "warm" else 0)
        reference = composer.full_prefill([A, B, C], QUERY, prefix=PREFIX)
        assert_exact(result, reference)
    theirs = make_composer(transformers, tmp_path / "transformers")
    assert_exact(result, theirs.full_prefill([A, B, C], QUERY, prefix=PREFIX))


def test_naive_composition_differs_from_full_prefill(openvino_of, tmp_path):
    """Not blind: reused KV of a chunk that follows another is not exact here either."""
    composer = make_composer(openvino_of()[0], tmp_path)
    result = composer.compose([A, B], QUERY, strategy="none")
    reference = composer.full_prefill([A, B], QUERY)
    assert max_diff(result.next_token_logits(), reference.next_token_logits()) > 1e-2


def test_every_order_and_a_repeated_chunk_are_exact(openvino_of, tmp_path):
    composer = make_composer(openvino_of()[0], tmp_path)
    for order in [*itertools.permutations([A, B, C]), (A, B, A)]:
        result = composer.compose(list(order), QUERY, strategy="all")
        assert_exact(result, composer.full_prefill(list(order), QUERY))
    assert composer.store.stats().entries == 3


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_rule_runs_and_equals_the_transformers_engines(openvino_of, tmp_path, strategy):
    """The probes that choose what to recompute (KV deviation, the query's attention) run in
    PyTorch on the same weights, so each rule selects what it selects on transformers, and
    OpenVINO's one-call recompute of that selection is transformers' within rounding."""
    backend, transformers = openvino_of()
    ours = make_composer(backend, tmp_path / "openvino").compose(
        [A, B, A], QUERY, prefix=PREFIX, strategy=strategy, ratio=0.3)
    theirs = make_composer(transformers, tmp_path / "transformers").compose(
        [A, B, A], QUERY, prefix=PREFIX, strategy=strategy, ratio=0.3)
    assert ours.status == theirs.status == COMPOSED
    assert ours.report.recomputed_tokens == theirs.report.recomputed_tokens
    assert max_diff(ours.next_token_logits(), theirs.next_token_logits()) <= TOL
    assert ours.generate(4) == theirs.generate(4)
    assert ours.score(" width") == pytest.approx(theirs.score(" width"), abs=TOL)


def test_a_changed_neighbour_reuses_the_chunk_and_stays_exact(openvino_of, tmp_path):
    composer = make_composer(openvino_of()[0], tmp_path)
    first = composer.compose([B, A], QUERY, strategy="all")
    second = composer.compose([B2, A], QUERY, strategy="all")
    assert (second.report.chunk_hits, second.report.chunk_misses) == (1, 1)
    assert_exact(second, composer.full_prefill([B2, A], QUERY))
    assert max_diff(first.next_token_logits(), second.next_token_logits()) > TOL


def test_positions_up_to_the_model_limit(openvino_of, tmp_path):
    backend = openvino_of()[0]
    composer = make_composer(backend, tmp_path)
    limit = backend.info.max_positions
    chunk_ids = len(composer._piece(A).ids)
    query_ids = len(backend.tokenize(QUERY))
    repeats = (limit - query_ids - 8) // chunk_ids
    prefix = "x" * (limit - query_ids - repeats * chunk_ids)
    result = composer.compose([A] * repeats, QUERY, prefix=prefix, strategy="all")
    assert result.report.total_tokens == limit
    assert_exact(result, composer.full_prefill([A] * repeats, QUERY, prefix=prefix))


def test_another_engine_or_model_never_reuses_its_entries(openvino_of, tmp_path):
    """The same weights on transformers are another model to the store (and to the gate),
    and so are other weights on OpenVINO."""
    backend, transformers = openvino_of()
    assert backend.info.engine == "openvino"
    assert backend.info.fingerprint != transformers.info.fingerprint
    ours = make_composer(backend, tmp_path)
    ours.compose([A, B], QUERY, strategy="all")
    for other in (transformers, openvino_of(seed=1)[0]):
        composer = make_composer(other, tmp_path)
        result = composer.compose([A, B], QUERY, strategy="all")
        assert (result.report.chunk_hits, result.report.chunk_misses) == (0, 2)
        assert_exact(result, composer.full_prefill([A, B], QUERY))


def test_the_ir_is_exported_once(openvino_of, tmp_path_factory, monkeypatch):
    from codekv.backends import openvino
    from codekv.backends.engines import ENGINES

    openvino_of()  # exported into the model cache

    def export(model):
        raise AssertionError("exported again")

    monkeypatch.setattr(openvino, "export", export)
    again = ENGINES["openvino"].load(tiny_directory(tmp_path_factory))
    assert again.info.fingerprint == openvino_of()[0].info.fingerprint


@pytest.mark.parametrize(("family", "dtype", "message"), [
    ("gemma3_text", "float32", "sliding-window layers"),
    ("llama", "float64", "runs float32 models, not float64"),
])
def test_what_it_cannot_run_is_refused_at_load(tmp_path, model_cache, family, dtype, message):
    from codekv.backends.engines import ENGINES
    from codekv.models import ModelLoadError

    path = tmp_path / family
    tiny_model(family).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    with pytest.raises(ModelLoadError, match=message):
        ENGINES["openvino"].load(path, dtype)


def test_served_over_http_with_every_token_recomputed_it_replies_as_full_prefill(
        tiny_model_dir, tmp_path, model_cache):
    """``codekv serve --backend openvino``: a re-sent file's segments are composed, and with
    every token recomputed the reply is the full prefill's, streamed or not."""
    require("openai", "the openai client is not installed (the 'serve' extra)")
    from fixtures.servers import TINY, ServeProcess, ask, assert_accounted, chat

    server = ServeProcess(["--backend", "openvino", "--model", str(tiny_model_dir),
                           "--served-model-name", TINY, "--experimental", "--strategy", "all",
                           "--prefix-cache-mb", "0", "--min-segment-tokens", "8"],
                          tmp_path / "home").wait()
    try:
        client = server.client()
        messages = chat(FILE, lead="A file.")
        full, report, _, status = ask(client, messages, max_tokens=16)
        assert status == "full-prefill" and report["segments_stored"] >= 1
        composed, report, usage, status = ask(client, messages, max_tokens=16)
        assert status == "composed" and report["segments_reused"] >= 1
        assert report["strategy"] == "all" and report["reused_tokens"] == 0
        assert_accounted(report, usage)
        assert composed == full and full
    finally:
        server.stop()
    assert "Traceback" not in server.log.read_text(errors="replace")
