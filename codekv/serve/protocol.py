"""The OpenAI wire format ``codekv serve`` speaks: pydantic models of its requests, responses,
stream chunks and errors (as vLLM's ``entrypoints/openai`` protocol module).

A request is validated here before it queues; ``bad_request`` turns the first validation
error into an OpenAI error whose ``param`` names the field (``messages[0].content``).
Unknown top-level fields are ignored, as OpenAI's clients send many; what codekv does not
serve (``NOT_SERVED``: ``n`` > 1, ``logprobs``) is refused, never silently ignored.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

MAX_STOPS = 4
# The seeds the sampler's generator takes (torch.Generator.manual_seed).
SEED_RANGE = (-(2**63), 2**64 - 1)
CUSTOM = ("range", "unicode")  # the types of this module's own errors: they say it all
# Fields codekv refuses, rather than ignore, unless left at their defaults: what it does not do.
NOT_SERVED = {"n": "one choice is returned (n=1)",
              "logprobs": "codekv returns no log probabilities",
              "top_logprobs": "codekv returns no log probabilities"}


def _unicode(text: str) -> str:
    """Text the tokenizer can take: JSON's ``\\ud800`` escapes decode to lone surrogates."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise PydanticCustomError(
            "unicode", "holds a lone UTF-16 surrogate (U+{char} at {at}): text must be valid "
            "Unicode", {"char": f"{ord(text[error.start]):04X}", "at": error.start}) from None
    return text


Text = Annotated[str, Field(strict=True), AfterValidator(_unicode)]
Filled = Annotated[str, Field(strict=True, min_length=1), AfterValidator(_unicode)]
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class Extension(BaseModel):
    """``codekv``: ``continuation`` is text forced as the reply, each token's NLL reported (how
    the replay benchmark scores a recorded reply under a composed state)."""

    model_config = ConfigDict(extra="forbid")

    continuation: Filled


class Request(BaseModel):
    """What both endpoints take: the model, the sampling and the stream options."""

    model_config = ConfigDict(extra="ignore")

    model: Annotated[str, Field(strict=True)]
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = None  # None: 1
    top_p: Annotated[Number, Field(ge=0, le=1)] | None = None  # None: 1
    seed: Annotated[StrictInt, Field(ge=SEED_RANGE[0], le=SEED_RANGE[1])] | None = None
    stop: Text | Annotated[list[Text], Field(max_length=MAX_STOPS)] | None = None
    n: Literal[1] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    top_logprobs: None = None
    codekv: Extension | None = None

    @field_validator("max_tokens", "max_completion_tokens")
    @classmethod
    def _within_context(cls, value: int | None, info: ValidationInfo) -> int | None:
        limit = (info.context or {}).get("max_positions")
        if value is not None and limit is not None and not 1 <= value <= limit:
            raise PydanticCustomError(
                "range", "must be from 1 to the model's context of {limit} tokens, not {value}",
                {"limit": limit, "value": value})
        if value is not None and value < 1:
            raise PydanticCustomError("range", "must be at least 1, not {value}",
                                      {"value": value})
        return value

    @property
    def token_limit(self) -> int | None:
        return self.max_tokens if self.max_completion_tokens is None else (
            self.max_completion_tokens)

    @property
    def stops(self) -> list[str]:
        stops = [] if self.stop is None else [self.stop] if isinstance(self.stop, str) else (
            self.stop)
        return [s for s in stops if s]

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuation(self) -> str | None:
        return None if self.codekv is None else self.codekv.continuation


class TextPart(BaseModel):
    type: Literal["text"]
    text: Text


class Message(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


def _renderable(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    try:
        json.dumps(tools, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise PydanticCustomError("unicode", "hold a lone UTF-16 surrogate: text must be valid "
                                  "Unicode") from None
    return tools


class ChatRequest(Request):
    """``POST /v1/chat/completions``."""

    messages: Annotated[list[Message], Field(min_length=1)]
    tools: Annotated[list[dict[str, Any]], AfterValidator(_renderable)] | None = None
    logprobs: Literal[False] | None = None


class CompletionRequest(Request):
    """``POST /v1/completions``: one prompt (a list of one is taken as it)."""

    prompt: Filled | Annotated[list[Filled], Field(min_length=1, max_length=1)]
    logprobs: None = None

    @property
    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


FIELDS = frozenset(name for model in (ChatRequest, CompletionRequest, StreamOptions, Extension,
                                      TextPart, Message) for name in model.model_fields)


# -- responses ---------------------------------------------------------------------------------
class PromptTokensDetails(BaseModel):
    cached_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class ReplyMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: ReplyMessage
    finish_reason: str
    logprobs: None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    codekv: dict


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    codekv: dict


def _absent(value: Any) -> bool:
    return value is None


class Delta(BaseModel):
    role: Annotated[Literal["assistant"] | None, Field(exclude_if=_absent)] = None
    content: Annotated[str | None, Field(exclude_if=_absent)] = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: str | None = None
    logprobs: None = None


class Chunk(BaseModel):
    """A stream's chunk; the last one carries ``usage`` (when asked) and ``codekv``."""

    id: str
    object: Literal["chat.completion.chunk", "text_completion"]
    created: int
    model: str
    choices: list[ChunkChoice] | list[CompletionChoice]
    usage: Annotated[Usage | None, Field(exclude_if=_absent)] = None
    codekv: Annotated[dict | None, Field(exclude_if=_absent)] = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "codekv"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """An error, as a response's body or a stream's event alike."""

    error: ErrorDetail


# -- validation errors as OpenAI errors --------------------------------------------------------
def param_of(loc: tuple) -> str:
    """``("messages", 0, "content")`` as ``messages[0].content``, without the tags pydantic
    gives a union's members (``str``, ``list[TextPart]``)."""
    param = ""
    for part in loc:
        if isinstance(part, int):
            param += f"[{part}]"
        elif part in FIELDS:
            param += f".{part}" if param else part
    return param


def bad_request(error: ValidationError) -> tuple[str, str]:
    """(message, param) of a request's first invalid field: of the errors pydantic reports for
    it (one per member of a union), those that got furthest into the value, and of those the
    ones past its type (the member whose type matched)."""
    found = [(param_of(e["loc"]), e) for e in error.errors(include_url=False)]
    field = found[0][0].split(".")[0].split("[")[0]
    if field in NOT_SERVED:
        return f"{field} is not served: {NOT_SERVED[field]}", field
    same = [(p, e) for p, e in found if p.split(".")[0].split("[")[0] == field]
    param = max((p for p, _ in same), key=len)
    errors = [e for p, e in same if p == param]
    errors = [e for e in errors if not e["type"].endswith("_type")] or errors
    texts = list(dict.fromkeys(e["msg"] for e in errors))
    if errors[0]["type"] == "missing":
        return f"{param} is required", param
    if errors[0]["type"] == "string_unicode":  # pydantic-core's own check, on constrained text
        return f"{param} holds a lone UTF-16 surrogate: text must be valid Unicode", param
    if errors[0]["type"] in CUSTOM:
        message = f"{param} {texts[0]}"
    elif all(t.startswith("Input should be ") for t in texts):
        message = f"{param} should be " + " or ".join(
            t.removeprefix("Input should be ") for t in texts)
    else:
        message = f"{param}: " + "; ".join(t[0].lower() + t[1:] for t in texts)
    value = errors[0]["input"]
    if ", not " not in message and errors[0]["type"] not in CUSTOM and (
            value is None or isinstance(value, str | int | float | bool)):
        shown = json.dumps(value)
        message += f", not {shown if len(shown) <= 40 else shown[:37] + '...'}"
    return message, param
