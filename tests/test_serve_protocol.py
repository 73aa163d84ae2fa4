"""``codekv serve`` under hostile input: every refusal an OpenAI error with its ``param``, never a
500 or a traceback (a real server process on a tiny random-weight model, over real HTTP); and
failures inside a request, streamed or not, as OpenAI-shaped errors (the app in-process, its
engine made to fail)."""

from __future__ import annotations

import json

import pytest
from fixtures.needs import require
from fixtures.servers import TINY, ServeProcess, error_of

httpx = require("httpx", "httpx is not installed (the 'serve' extra)")
require("uvicorn", "uvicorn is not installed (the 'serve' extra)")

HI = '[{"role": "user", "content": "hi"}]'


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    process = ServeProcess(["--model", str(tiny_model_dir), "--served-model-name", TINY],
                           tmp_path_factory.mktemp("serve-protocol")).wait()
    yield process
    process.stop()
    assert "Traceback" not in process.log.read_text(errors="replace")


def post(server, raw: str, path: str = "/v1/chat/completions"):
    return httpx.post(server.url + path, content=raw.encode("utf-8"), timeout=120,
                      headers={"content-type": "application/json"})


def chat_body(fields: str, messages: str = HI) -> str:
    return f'{{"model": "{TINY}", "messages": {messages}, "max_tokens": 2{fields}}}'


DEEP = "[" * 5000 + "]" * 5000
HUGE = "1" + "0" * 5000


@pytest.mark.parametrize("raw, param, says", [
    (chat_body("", messages=DEEP), None, "nested too deeply"),
    (chat_body(f', "user": {{"deep": {DEEP}}}'), None, "nested too deeply"),
    (chat_body(f', "user": {HUGE}'), None, "digits"),
    (chat_body(f', "max_tokens": {HUGE}'), None, "digits"),
    (chat_body(f', "seed": {2**64}'), "seed", "less than or equal to"),
    (chat_body(f', "seed": {2**70}'), "seed", "less than or equal to"),
    (chat_body(f', "seed": {-2**63 - 1}'), "seed", "greater than or equal to"),
    (chat_body(f', "seed": {2**64}, "stream": true'), "seed", "less than or equal to"),
    (chat_body("", messages='[{"role": "user", "content": "a\\ud800b"}]'),
     "messages[0].content", "surrogate"),
    (chat_body("", messages='[{"role": "user", "content": [{"type": "text", '
                            '"text": "\\udfff"}]}]'), "messages[0].content[0].text",
     "surrogate"),
    (chat_body(', "stop": ["\\ud800"]'), "stop[0]", "surrogate"),
    (chat_body(', "tools": [{"type": "function", "function": {"name": "\\ud800"}}]'), "tools",
     "surrogate"),
    (chat_body(', "logprobs": true'), "logprobs", "not served"),
    (chat_body(', "top_logprobs": 3'), "top_logprobs", "not served"),
    (chat_body(', "n": 3'), "n", "not served"),
])
def test_hostile_chat_bodies_get_400_naming_the_field(server, raw, param, says):
    response = post(server, raw)
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert error["param"] == param and says in error["message"]
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("raw, param, says", [
    (f'{{"model": "{TINY}", "prompt": "\\ud800"}}', "prompt", "surrogate"),
    (f'{{"model": "{TINY}", "prompt": "def f():", "logprobs": 1}}', "logprobs", "not served"),
    (f'{{"model": "{TINY}", "prompt": ["a", "b"]}}', "prompt", "at most 1 item"),
    (f'{{"model": "{TINY}", "prompt": "x", "seed": {2**64}, "stream": true}}', "seed", "less"),
])
def test_hostile_completion_bodies_get_400_naming_the_field(server, raw, param, says):
    response = post(server, raw, "/v1/completions")
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert error["param"] == param and says in error["message"]


def test_seeds_at_the_sampler_s_bounds_are_served(server):
    for seed in (2**64 - 1, -2**63, 0):
        response = post(server, chat_body(f', "seed": {seed}, "temperature": 1.0'))
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["finish_reason"] in ("length", "stop")


def test_an_error_before_a_stream_starts_is_a_plain_error_response(server):
    """A stream refused before its first token (a prompt past the context) is an HTTP error
    with its JSON body, not a 200 stream with the error inside."""
    raw = chat_body(', "stream": true', messages=json.dumps(
        [{"role": "user", "content": "word " * 900}]))
    response = post(server, raw)
    assert response.status_code == 400
    assert response.headers["content-type"].startswith("application/json")
    assert error_of(response)["code"] == "context_length_exceeded"


# -- failures inside a request (the app in-process, its engine's backend made to fail) -------

@pytest.fixture
def app_client(tiny_backend, tmp_path):
    from starlette.testclient import TestClient

    from codekv.gate import SupportGate
    from codekv.serve.app import create_app
    from codekv.serve.engine import Engine
    from codekv.stores.local import LocalKVStore

    engine = Engine(tiny_backend(), LocalKVStore(tmp_path / "kv"), SupportGate([], "none"))
    with TestClient(create_app(engine, TINY), raise_server_exceptions=False) as client:
        yield client, engine.backend
    engine.close()


def completion(client, **fields):
    return client.post("/v1/completions", json={"model": TINY, "prompt": "def area(w, h):",
                                                "max_tokens": 8, "temperature": 0, **fields})


def events_of(response) -> list[dict]:
    return [json.loads(line[5:]) for line in response.iter_lines()
            if line.startswith("data:") and line != "data: [DONE]"]


def test_an_unexpected_failure_is_an_openai_500_streamed_or_not(app_client, monkeypatch):
    client, backend = app_client

    def broken(text, markers=()):
        raise IndexError("index out of range")

    monkeypatch.setattr(backend, "tokenize_prompt", broken)
    for stream in (False, True):
        response = completion(client, stream=stream)
        assert response.status_code == 500
        error = error_of(response)
        assert error["type"] == "server_error" and "IndexError" in error["message"]
    monkeypatch.undo()
    assert completion(client).status_code == 200  # and the server goes on


def test_a_failure_mid_stream_ends_it_with_an_error_of_the_same_shape(app_client, monkeypatch):
    client, backend = app_client

    def broken(state, ids):
        raise RuntimeError("the device went away")

    monkeypatch.setattr(backend, "extend", broken)
    with client.stream("POST", "/v1/completions", json={
            "model": TINY, "prompt": "def area(w, h):", "max_tokens": 8, "temperature": 0,
            "stream": True}) as response:
        assert response.status_code == 200  # the headers went with the first token
        events = events_of(response)
    assert all("choices" in event for event in events[:-1])
    assert events[-1] == {"error": {"message": "internal error: RuntimeError",
                                    "type": "server_error", "param": None, "code": None}}


def test_nulls_and_unknown_fields_leave_the_defaults(server):
    """What OpenAI's clients send for options left unset: null, or fields codekv has no use for."""
    response = post(server, chat_body(', "temperature": null, "top_p": null, "n": null, '
                                      '"stop": null, "seed": null, "stream_options": null, '
                                      '"tools": null, "logprobs": false, "user": "u-1", '
                                      '"presence_penalty": 0'))
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] <= 2
