"""The OpenAI-compatible HTTP surface of ``codekv serve`` (Starlette; streams as server-sent
events with sse-starlette; Prometheus metrics).

Requests are checked here, before they queue; every refusal is an OpenAI error object with its
status code, never a traceback. Each reply carries a ``codekv`` object (and the final chunk of
a stream does) saying how its prompt was served, and the header ``x-codekv-status``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import secrets
import time
import uuid

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from codekv.serve import chat
from codekv.serve.engine import Engine, Job, Outcome, Prompt, QueueFull, RequestError, Sampling
from codekv.serve.segments import tool_descriptions

log = logging.getLogger("codekv.serve")
ROLES = {"system", "developer", "user", "assistant", "tool"}
MAX_STOPS = 4
RETRY_AFTER_S = 2
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # as OpenAI's legacy completions endpoint
TOKEN_KINDS = ("exact_prefix", "reused", "recomputed", "prefilled")


def scope_of_key(key: str) -> str:
    """One chunk store scope per API key (named by a digest: the key itself is never stored)."""
    return "serve:" + hashlib.sha256(key.encode()).hexdigest()[:16]


class Metrics:
    """Counters per status, as the responses report them (one registry per app)."""

    def __init__(self, engine: Engine):
        self.registry = CollectorRegistry()
        self.requests = Counter("codekv_requests", "Requests served, by how their prompt was",
                                ["endpoint", "status"], registry=self.registry)
        self.errors = Counter("codekv_errors", "Requests refused or failed, by HTTP status",
                              ["code"], registry=self.registry)
        self.prompt_tokens = Counter("codekv_prompt_tokens", "Prompt tokens, by how they were "
                                     "served", ["status", "kind"], registry=self.registry)
        self.completion_tokens = Counter("codekv_completion_tokens", "Tokens generated",
                                         registry=self.registry)
        self.ttft = Histogram("codekv_ttft_seconds", "Prompt to first token's logits",
                              ["status"], registry=self.registry)
        waiting = Gauge("codekv_queue_waiting", "Requests waiting for the model",
                        registry=self.registry)
        waiting.set_function(lambda: engine.waiting)
        cancelled = Gauge("codekv_cancelled_requests", "Replies cut short: their client left",
                          registry=self.registry)
        cancelled.set_function(lambda: engine.cancelled)
        prefix = Gauge("codekv_exact_prefix_bytes", "KV the exact-prefix cache holds",
                       registry=self.registry)
        prefix.set_function(lambda: engine.prefix.bytes)

    def served(self, endpoint: str, outcome: Outcome, completion_tokens: int) -> None:
        self.requests.labels(endpoint, outcome.status).inc()
        for kind in TOKEN_KINDS:
            self.prompt_tokens.labels(outcome.status, kind).inc(
                getattr(outcome, f"{kind}_tokens"))
        self.completion_tokens.inc(completion_tokens)
        self.ttft.labels(outcome.status).observe(outcome.ttft_s)


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(error: RequestError) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if error.status in (429, 503) else None
    return JSONResponse(error_body(error.message, error.kind, error.param, error.code),
                        status_code=error.status, headers=headers)


# -- checking a request ----------------------------------------------------------------------
def _bad(message: str, param: str | None = None) -> RequestError:
    return RequestError(400, message, param, "invalid_value" if param else None)


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _bad(f"{name} must be a number, not {json.dumps(value)}", name)
    if not low <= value <= high:
        raise _bad(f"{name} must be from {low:g} to {high:g}, not {value}", name)
    return float(value)


def _sampling(body: dict, max_positions: int, default_max: int | None) -> Sampling:
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    if max_tokens is None:
        max_tokens = default_max
    elif isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise _bad(f"{name} must be an integer, not {json.dumps(max_tokens)}", name)
    elif not 1 <= max_tokens <= max_positions:
        raise _bad(f"{name} must be from 1 to the model's context of {max_positions} "
                   f"tokens, not {max_tokens}", name)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise _bad(f"seed must be an integer, not {json.dumps(seed)}", "seed")
    stop = body.get("stop")
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not (isinstance(stops, list) and all(isinstance(s, str) for s in stops)
            and len(stops) <= MAX_STOPS):
        raise _bad(f"stop must be a string or a list of at most {MAX_STOPS} strings", "stop")
    n = body.get("n", 1)
    if n != 1 or isinstance(n, bool):
        raise _bad(f"only n=1 is served, not {json.dumps(n)}", "n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad(f"stream must be true or false, not {json.dumps(stream)}", "stream")
    options = body.get("stream_options")
    if options is not None and not (isinstance(options, dict)
                                    and isinstance(options.get("include_usage", False), bool)):
        raise _bad("stream_options must be an object with a boolean include_usage",
                   "stream_options")
    return Sampling(max_tokens=max_tokens,
                    temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
                    top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
                    seed=seed, stop=[s for s in stops if s])


def _continuation(body: dict) -> str | None:
    """``codekv.continuation``: text forced as the reply, each token's NLL reported (how the
    replay benchmark scores a recorded reply under a composed state)."""
    extension = body.get("codekv")
    if extension is None:
        return None
    if not (isinstance(extension, dict) and set(extension) <= {"continuation"}
            and isinstance(extension.get("continuation"), str) and extension["continuation"]):
        raise _bad("codekv must be an object whose only field, continuation, is a non-empty "
                   "string", "codekv")
    return extension["continuation"]


def _content(message: dict, index: int) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "\n".join(p["text"] for p in content)
    raise _bad(f"messages[{index}].content must be a string or a list of text parts (only "
               "text is served)", f"messages[{index}].content")


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list of {role, content} objects", "messages")
    out = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise _bad(f"messages[{index}] must be an object whose role is one of "
                       f"{', '.join(sorted(ROLES))}", f"messages[{index}]")
        out.append({"role": message["role"], "content": _content(message, index)})
    return out


def _tools(body: dict) -> list[dict]:
    tools = body.get("tools")
    if tools is None:
        return []
    if not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise _bad("tools must be a list of objects", "tools")
    return tools


def chat_prompt(backend, messages: list[dict], tools: list[dict]) -> Prompt:
    """The prompt as the model's own chat template renders it (with the assistant's turn),
    its special tokens the template's alone (``codekv.serve.chat``)."""
    template = backend.chat_template
    if not template:
        raise RequestError(400, "the model has no chat template: use /v1/completions",
                           "messages")
    if tools and "tools" not in template:
        raise RequestError(400, "the model's chat template cannot render tools: send them in "
                                "a message instead", "tools")
    try:
        rendered = chat.render(backend, messages, tools)
    except ValueError as error:
        raise RequestError(400, f"the model's chat template refused the messages: {error}",
                           "messages") from None
    text = rendered.text
    system_end = 0
    if messages[0]["role"] == "system" and messages[0]["content"]:
        at = text.find(messages[0]["content"])
        if at >= 0:
            system_end = at + len(messages[0]["content"])
    return Prompt(text, [m["content"] for m in messages], tool_descriptions(tools), system_end,
                  rendered.markers)


# -- the app -----------------------------------------------------------------------------------
def create_app(engine: Engine, model_id: str, api_keys: list[str] | None = None,
               scope: str = "serve") -> Starlette:
    """The server over ``engine``; with ``api_keys``, every /v1 and /metrics request needs one
    (``Authorization: Bearer KEY``) and each key has its own scope; else all share ``scope``."""
    metrics = Metrics(engine)
    keys = {key: scope_of_key(key) for key in api_keys or []}
    max_positions = engine.backend.info.max_positions

    def authorized(request: Request) -> str:
        if not keys:
            return scope
        header = request.headers.get("authorization", "")
        given = header[7:].strip() if header[:7].lower() == "bearer " else ""
        for key, key_scope in keys.items():
            if given and secrets.compare_digest(given.encode(), key.encode()):
                return key_scope
        raise RequestError(401, "a valid API key is required (Authorization: Bearer KEY)",
                           code="invalid_api_key")

    async def body_of(request: Request) -> dict:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise RequestError(400, f"the body is not valid JSON: {error}") from None
        if not isinstance(body, dict):
            raise RequestError(400, "the body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str):
            raise _bad("model must be a string naming the served model", "model")
        if model != model_id:
            raise RequestError(404, f"the model {model!r} is not served here; this server "
                                    f"serves {model_id!r}", "model", "model_not_found")
        return body

    async def start(job: Job, events: asyncio.Queue) -> Outcome:
        """Queue ``job`` and wait for its prompt to be served."""
        try:
            engine.submit(job)
        except QueueFull:
            raise RequestError(503, "the server is busy: too many requests wait for the model",
                               code="server_busy", kind="server_error") from None
        event = await events.get()
        if event[0] == "error":
            raise event[1]
        return event[1]

    async def serve(request: Request, chat: bool) -> Response:
        job_scope = authorized(request)
        body = await body_of(request)
        if chat:
            messages, tools = _messages(body), _tools(body)

            def prompt() -> Prompt:
                return chat_prompt(engine.backend, messages, tools)
        else:
            text = body.get("prompt")
            if isinstance(text, list) and len(text) == 1:
                text = text[0]
            if not isinstance(text, str) or not text:
                raise _bad("prompt must be a non-empty string", "prompt")

            def prompt() -> Prompt:
                return Prompt(text, [text])
        sampling = _sampling(body, max_positions,
                             None if chat else COMPLETIONS_DEFAULT_MAX_TOKENS)
        continuation = _continuation(body)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        job = Job(job_scope, prompt, sampling,
                  lambda event: loop.call_soon_threadsafe(events.put_nowait, event), chat,
                  continuation)
        endpoint = "chat" if chat else "completions"
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        try:
            outcome = await start(job, events)
        except BaseException:
            job.cancelled.set()
            raise
        headers = {"x-codekv-status": outcome.status}
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return EventSourceResponse(
                stream(job, events, outcome, chat, ident, created, include_usage, endpoint),
                headers=headers, ping=600)
        parts: list[str] = []
        try:
            while True:
                event = await events.get()
                if event[0] == "text":
                    parts.append(event[1])
                elif event[0] == "done":
                    _, finish, count = event
                    break
                else:
                    raise event[1]
        finally:
            job.cancelled.set()  # a client gone mid-reply frees the model
        metrics.served(endpoint, outcome, count)
        text = "".join(parts)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                   "finish_reason": finish, "logprobs": None} if chat else
                  {"index": 0, "text": text, "finish_reason": finish, "logprobs": None})
        return JSONResponse({
            "id": ident, "object": "chat.completion" if chat else "text_completion",
            "created": created, "model": model_id, "choices": [choice],
            "usage": usage(outcome, count), "codekv": outcome.as_json(),
        }, headers=headers)

    async def stream(job: Job, events: asyncio.Queue, outcome: Outcome, chat: bool, ident: str,
                     created: int, include_usage: bool, endpoint: str):
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta: dict | str | None, finish: str | None = None, **extra) -> dict:
            if delta is None:
                choices = []
            elif chat:
                choices = [{"index": 0, "delta": delta, "finish_reason": finish,
                            "logprobs": None}]
            else:
                choices = [{"index": 0, "text": delta, "finish_reason": finish,
                            "logprobs": None}]
            return {"data": json.dumps({"id": ident, "object": kind, "created": created,
                                        "model": model_id, "choices": choices, **extra})}

        try:
            if chat:
                yield chunk({"role": "assistant", "content": ""})
            while True:
                event = await events.get()
                if event[0] == "text":
                    yield chunk({"content": event[1]} if chat else event[1])
                elif event[0] == "done":
                    _, finish, count = event
                    break
                else:  # headers are sent: the error goes in the stream, as OpenAI's does
                    error = event[1]
                    yield {"data": json.dumps(error_body(error.message, error.kind))}
                    return
            metrics.served(endpoint, outcome, count)
            report = {"codekv": outcome.as_json()}
            yield chunk({} if chat else "", finish, **({} if include_usage else report))
            if include_usage:
                yield chunk(None, usage=usage(outcome, count), **report)
            yield {"data": "[DONE]"}
        finally:
            job.cancelled.set()  # a client gone mid-stream frees the model

    async def chat_completions(request: Request) -> Response:
        return await serve(request, chat=True)

    async def completions(request: Request) -> Response:
        return await serve(request, chat=False)

    async def models(request: Request) -> Response:
        authorized(request)
        return JSONResponse({"object": "list", "data": [
            {"id": model_id, "object": "model", "created": 0, "owned_by": "codekv"}]})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": model_id, "busy": engine.busy,
                             "waiting": engine.waiting})

    async def metrics_endpoint(request: Request) -> Response:
        authorized(request)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def refused(request: Request, error: RequestError) -> Response:
        metrics.errors.labels(str(error.status)).inc()
        return error_response(error)

    async def http_error(request: Request, error: HTTPException) -> Response:
        metrics.errors.labels(str(error.status_code)).inc()
        return JSONResponse(error_body(str(error.detail)), status_code=error.status_code)

    async def failed(request: Request, error: Exception) -> Response:
        log.exception("request failed")
        metrics.errors.labels("500").inc()
        return JSONResponse(error_body(f"internal error: {type(error).__name__}",
                                       "server_error"), status_code=500)

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={
        RequestError: refused, HTTPException: http_error, Exception: failed})
    app.state.engine = engine
    return app


def usage(outcome: Outcome, completion_tokens: int) -> dict:
    return {"prompt_tokens": outcome.prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": outcome.prompt_tokens + completion_tokens,
            "prompt_tokens_details": {
                "cached_tokens": outcome.exact_prefix_tokens + outcome.reused_tokens}}
