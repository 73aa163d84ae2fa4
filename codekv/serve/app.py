"""The OpenAI-compatible HTTP surface of ``codekv serve`` (Starlette; streams as server-sent
events with sse-starlette; Prometheus metrics).

Requests are checked against the wire types (``codekv.serve.protocol``) before they queue;
every refusal is an OpenAI error object with its status code, never a traceback. A client that
closes its connection cancels its job, queued or running; while the server drains
(``codekv.serve.drain``) new requests get 503. Each reply carries a ``codekv`` object (and
the final chunk of a stream does) saying how its prompt was served, and the header
``x-codekv-status``.
"""

from __future__ import annotations

import asyncio
import json
import logging
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
from pydantic import ValidationError
from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from codekv.serve import protocol as wire
from codekv.serve.chat import chat_prompt
from codekv.serve.drain import Drain, InFlight
from codekv.serve.engine import (
    Engine,
    Event,
    Failed,
    Final,
    Job,
    Outcome,
    Prompt,
    QueueFull,
    RequestError,
    Sampling,
    internal,
)
from codekv.serve.keys import scope_of_key

log = logging.getLogger("codekv.serve")
RETRY_AFTER_S = 2
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # as OpenAI's legacy completions endpoint
TOKEN_KINDS = ("exact_prefix", "reused", "recomputed", "prefilled")
CLIENT_GONE = 499  # nginx's "client closed request": what the log shows for a client that left


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
        cancelled = Gauge("codekv_cancelled_requests", "Requests whose client left: dropped "
                          "from the queue or their reply cut short",
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
    return wire.ErrorResponse(error=wire.ErrorDetail(message=message, type=kind, param=param,
                                                     code=code)).model_dump()


def error_of(error: RequestError) -> dict:
    return error_body(error.message, error.kind, error.param, error.code)


def error_response(error: RequestError) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if error.status in (429, 503) else None
    return JSONResponse(error_of(error), status_code=error.status, headers=headers)


def sampling_of(request: wire.Request, default_max: int | None) -> Sampling:
    limit = request.token_limit
    return Sampling(max_tokens=default_max if limit is None else limit,
                    temperature=1.0 if request.temperature is None else request.temperature,
                    top_p=1.0 if request.top_p is None else request.top_p, seed=request.seed,
                    stop=request.stops)


class ClientGone(Exception):
    """The client closed its connection before its reply was done."""


async def gone(request: Request) -> None:
    """Returns once the client has closed its connection (the body is read by then)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def next_event(events: asyncio.Queue, left: asyncio.Task) -> Event:
    """The job's next event; ``ClientGone`` as soon as ``left`` is done."""
    getter = asyncio.ensure_future(events.get())
    await asyncio.wait({getter, left}, return_when=asyncio.FIRST_COMPLETED)
    if getter.done():
        return getter.result()
    getter.cancel()
    raise ClientGone()


# -- the app -----------------------------------------------------------------------------------
def create_app(engine: Engine, model_id: str, api_keys: list[str] | None = None,
               scope: str = "serve", key_secret: bytes = b"",
               drain: Drain | None = None) -> Starlette:
    """The server over ``engine``; with ``api_keys``, every /v1 and /metrics request needs one
    (``Authorization: Bearer KEY``) and each key has its own scope (named with ``key_secret``,
    ``codekv.serve.keys``); else all share ``scope``. While ``drain`` drains, new requests get
    503."""
    metrics = Metrics(engine)
    drain = drain or Drain()
    keys = {key: scope_of_key(key, key_secret) for key in api_keys or []}
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

    async def body_of(request: Request, kind: type[wire.Request]) -> wire.Request:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise RequestError(400, f"the body is not valid JSON: {error}") from None
        except RecursionError:
            raise RequestError(400, "the body is nested too deeply to be read") from None
        except ValueError as error:  # an integer past Python's limit on digits
            raise RequestError(400, f"the body cannot be read: {error}") from None
        if not isinstance(body, dict):
            raise RequestError(400, "the body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str):
            raise RequestError(400, "model must be a string naming the served model", "model",
                               "invalid_value")
        if model != model_id:
            raise RequestError(404, f"the model {model!r} is not served here; this server "
                                    f"serves {model_id!r}", "model", "model_not_found")
        try:
            return kind.model_validate(body, context={"max_positions": max_positions})
        except ValidationError as error:
            message, param = wire.bad_request(error)
            raise RequestError(400, message, param, "invalid_value") from None

    async def serve(request: Request, chat: bool) -> Response:
        job_scope = authorized(request)
        if drain.draining:
            raise RequestError(503, "the server is shutting down: it finishes the requests in "
                                    "flight and takes no new ones", code="server_shutting_down",
                               kind="server_error")
        asked = await body_of(request, wire.ChatRequest if chat else wire.CompletionRequest)
        if chat:
            messages = [{"role": m.role, "content": m.text} for m in asked.messages]
            tools = asked.tools or []

            def prompt() -> Prompt:
                return chat_prompt(engine.backend, messages, tools)
        else:
            text = asked.text

            def prompt() -> Prompt:
                return Prompt(text, [text])
        sampling = sampling_of(asked, None if chat else COMPLETIONS_DEFAULT_MAX_TOKENS)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        job = Job(job_scope, prompt, sampling,
                  lambda event: loop.call_soon_threadsafe(events.put_nowait, event), chat,
                  asked.continuation)
        endpoint = "chat" if chat else "completions"
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        left = asyncio.ensure_future(gone(request))
        streaming = False
        try:
            try:
                engine.submit(job)
            except QueueFull:
                raise RequestError(503, "the server is busy: too many requests wait for the "
                                        "model", code="server_busy", kind="server_error") from None
            event = await next_event(events, left)  # queued, then prefilled
            if isinstance(event, Failed):
                raise event.error
            outcome = event.outcome
            headers = {"x-codekv-status": outcome.status}
            if asked.stream:
                left.cancel()  # the stream watches its client itself
                streaming = True
                return EventSourceResponse(
                    stream(job, events, outcome, chat, ident, created, asked.include_usage,
                           endpoint), headers=headers, ping=600)
            parts: list[str] = []
            while not isinstance(event := await next_event(events, left), Final):
                if isinstance(event, Failed):
                    raise event.error
                parts.append(event.text)
        except ClientGone:
            return Response(status_code=CLIENT_GONE)
        finally:
            left.cancel()
            if not streaming:
                job.cancelled.set()  # a client gone (or an error) frees the model
        metrics.served(endpoint, outcome, event.completion_tokens)
        text, finish, usage = "".join(parts), event.finish_reason, usage_of(
            outcome, event.completion_tokens)
        reply = (wire.ChatCompletion(
            id=ident, created=created, model=model_id, usage=usage, codekv=outcome.as_json(),
            choices=[wire.ChatChoice(message=wire.ReplyMessage(content=text),
                                     finish_reason=finish)]) if chat else wire.Completion(
            id=ident, created=created, model=model_id, usage=usage, codekv=outcome.as_json(),
            choices=[wire.CompletionChoice(text=text, finish_reason=finish)]))
        return JSONResponse(reply.model_dump(), headers=headers)

    async def stream(job: Job, events: asyncio.Queue, outcome: Outcome, chat: bool, ident: str,
                     created: int, include_usage: bool, endpoint: str):
        kind = "chat.completion.chunk" if chat else "text_completion"

        def data(choices: list, **extra) -> dict:
            return {"data": wire.Chunk(id=ident, object=kind, created=created, model=model_id,
                                       choices=choices, **extra).model_dump_json()}

        def chunk(text: str | None, finish: str | None = None, first: bool = False,
                  **extra) -> dict:
            """A choice's chunk; ``text`` None: the last one (an empty delta)."""
            return data([wire.ChunkChoice(delta=wire.Delta(
                role="assistant" if first else None, content=text), finish_reason=finish)]
                if chat else [wire.CompletionChoice(text=text or "", finish_reason=finish)],
                **extra)

        try:
            if chat:
                yield chunk("", first=True)
            while not isinstance(event := await events.get(), Final):
                if isinstance(event, Failed):  # headers are sent: the error goes in the stream
                    yield {"data": json.dumps(error_of(event.error))}
                    return
                yield chunk(event.text)
            count = event.completion_tokens
            metrics.served(endpoint, outcome, count)
            report = outcome.as_json()
            yield chunk(None, event.finish_reason, **({} if include_usage else {"codekv": report}))
            if include_usage:
                yield data([], usage=usage_of(outcome, count), codekv=report)
            yield {"data": "[DONE]"}
        except Exception as error:  # noqa: BLE001 - the stream ends with an error, as OpenAI's
            log.exception("a stream failed")
            metrics.errors.labels("500").inc()
            yield {"data": json.dumps(error_of(internal(error)))}
        finally:
            job.cancelled.set()  # a client gone mid-stream frees the model

    async def chat_completions(request: Request) -> Response:
        return await serve(request, chat=True)

    async def completions(request: Request) -> Response:
        return await serve(request, chat=False)

    async def models(request: Request) -> Response:
        authorized(request)
        return JSONResponse(wire.ModelList(data=[wire.ModelCard(id=model_id)]).model_dump())

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "draining" if drain.draining else "ok",
                             "model": model_id, "busy": engine.busy, "waiting": engine.waiting},
                            status_code=503 if drain.draining else 200)

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
        return error_response(internal(error))

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(InFlight, drain=drain)],
                    exception_handlers={RequestError: refused, HTTPException: http_error,
                                        Exception: failed})
    app.state.engine = engine
    app.state.drain = drain
    return app


def usage_of(outcome: Outcome, completion_tokens: int) -> wire.Usage:
    return wire.Usage(
        prompt_tokens=outcome.prompt_tokens, completion_tokens=completion_tokens,
        total_tokens=outcome.prompt_tokens + completion_tokens,
        prompt_tokens_details=wire.PromptTokensDetails(
            cached_tokens=outcome.exact_prefix_tokens + outcome.reused_tokens))
