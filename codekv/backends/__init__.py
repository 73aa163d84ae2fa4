"""Compose backends: what composition needs from a model runtime, behind one small protocol.

A backend tokenizes, prefills a chunk alone into its own KV form, re-positions and joins
cached KV, recomputes a selected set of tokens plus the query against the composed context,
and scores or generates from the resulting request state. The composer never looks inside a
backend's KV: Hugging Face transformers keeps per-layer tensors, llama.cpp an opaque
per-sequence state. A backend also describes itself (engine, family, fingerprints) so that
cached KV is never used with a model, tokenizer or engine it was not made by.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from codekv.backends.engines import TRANSFORMERS

if TYPE_CHECKING:
    import torch

    from codekv.stores.entry import KVEntry


# What a chat is rendered with where the model ships no template: ChatML, as llama-server does.
# Its markers are text to a vocabulary that has no such special tokens (Gemma's).
CHATML = ("{%- for message in messages -%}"
          "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
          "{%- endfor -%}"
          "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")


def chat_template_of(backend) -> str:
    """The template ``backend`` renders chats with: the model's own, else ``CHATML``."""
    return backend.chat_template or CHATML


class UnsupportedModel(Exception):
    """Composition would be wrong for this model (or input): callers fall back to full prefill."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ModelInfo:
    family: str  # the model_type, e.g. "llama"
    fingerprint: str  # weights, dtype, family and RoPE parameters (and the engine's KV format)
    tokenizer_fingerprint: str
    dtype: str
    n_layers: int
    max_positions: int
    unsupported: str | None = None  # why composition is refused for this model, if it is
    engine: str = TRANSFORMERS  # the gate keys its evidence by engine and family
    # FLOPs of attending to one more key over FLOPs of a row's own projections and MLP, per
    # layer: a row at position p costs 1 + key_cost * (p + 1). 0 when unknown.
    key_cost: float = 0.0


def mean_nll(backend: Backend, state: RequestState, target_ids: list[int]) -> float:
    """Mean NLL (nats/token) of ``target_ids`` following ``state``, through the backend's own
    ``extend`` and ``rewind``: the state is left as it was. Every engine scores this way."""
    import torch

    if not target_ids:
        return 0.0
    length, first = state.length, state.logits
    logits = backend.extend(state, target_ids)
    backend.rewind(state, length, first)
    predictions = torch.cat((first[None], logits[:-1]), dim=0)
    targets = torch.tensor(target_ids, device=predictions.device)
    return torch.nn.functional.cross_entropy(predictions, targets).item()


def with_leading(leading: list[int], ids: list[int], spans: list[tuple[int, int]]
                 ) -> tuple[list[int], list[tuple[int, int]]]:
    """A prompt's ids and spans with the leading tokens first (spanning no characters),
    unless it starts with them already."""
    if not leading or ids[:len(leading)] == leading:
        return ids, spans
    return list(leading) + ids, [(0, 0)] * len(leading) + spans


def prompt_tokens(backend, text: str, markers: Sequence[tuple[int, int]] = ()
                  ) -> tuple[list[int], list[tuple[int, int]]]:
    """``tokenize_prompt`` for any backend: the text between markers is tokenized piece by
    piece (a tokenizer cuts its input at special tokens first, so the pieces are read as in
    one pass), each marker is its token, and the leading tokens go first unless the text
    starts with them (a template's ``<bos>``)."""
    ids: list[int] = []
    spans: list[tuple[int, int]] = []
    cursor = 0
    for start, end in [*markers, (len(text), len(text))]:
        if start > cursor:
            piece_ids, piece_spans = backend.tokenize_with_offsets(text[cursor:start])
            ids += piece_ids
            spans += [(cursor + first, cursor + last) for first, last in piece_spans]
        if end > start:
            ids.append(backend.markers[text[start:end]])
            spans.append((start, end))
        cursor = end
    return with_leading(backend.leading_ids, ids, spans)


class ChunkState(Protocol):
    """A backend's KV of a token span whose first token sits at position ``start``."""

    start: int

    @property
    def n_tokens(self) -> int: ...

    def nbytes(self) -> int: ...


class RequestState(Protocol):
    """A request's own KV (never shared with the chunk store) and its next-token logits; each
    engine has its own (``HFRequest``, ``LlamaRequest``)."""

    token_ids: list[int]
    logits: torch.Tensor  # [vocab], predicting the token after token_ids

    @property
    def length(self) -> int: ...


class Backend(Protocol):
    """What ``Composer`` and the evaluation call; ``KV`` below is the backend's ChunkState."""

    info: ModelInfo
    eos_token_id: int | None
    # Why this engine cannot score per-token KV deviation (CacheBlend's rule), None if it can:
    # a strategy that needs it is refused with this reason, never approximated.
    deviation_refusal: str | None
    # Why it cannot score the query's attention over reused KV (query-aware rules), or None.
    relevance_refusal: str | None
    # Why it cannot compose chunk KV left at the positions it was computed at (the
    # ``none-norope`` baseline, whose selection does not re-position), or None.
    unshifted_refusal: str | None
    # Whether ``placeholder`` computes nothing: then text a request recomputes in place is
    # best left to it, and anything else its tokens are needed for (storing them) done later.
    free_placeholders: bool

    def tokenize(self, text: str) -> list[int]: ...

    def tokenize_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]: ...

    def detokenize(self, token_ids: list[int]) -> str: ...

    # -- chat (what a server renders a request's messages with) -----------------------------
    chat_template: str | None  # the model's own (Jinja), None where it ships none

    def render_chat(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """The messages (and tools) as the chat template renders them (``CHATML`` where the
        model ships none), ending with the assistant's turn; ValueError where it refuses them."""
        ...

    # Every text the tokenizer reads as one special token only when told to (``<|im_start|>``),
    # and that token: what client text must never become (``codekv.serve.chat``). Added
    # tokens that are text (Gemma's runs of newlines) are read whole in any text.
    markers: dict[str, int]

    def tokenize_prompt(self, text: str, markers: Sequence[tuple[int, int]] = ()
                        ) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids and character spans of a prompt: the characters at ``markers`` (a
        template's own, in order) are the tokens they name, the rest is text as ``tokenize``
        reads it; the leading tokens first (``prompt_tokens``)."""
        ...

    # Tokens that end a reply: the tokenizer's end of sequence and the model's own end of turn
    # (a chat template's ``<|im_end|>``), which a server stops at.
    end_token_ids: frozenset[int]

    # Tokens every sequence starts with: the BOS of a model whose tokenizer adds one (Gemma's
    # ``<bos>``), [] where none is added (SmolLM2). Requests start with them, and a chunk's KV
    # is computed after them even "alone": the model never saw text without them.
    leading_ids: list[int]

    # -- chunk KV --------------------------------------------------------------------------
    def prefill_chunk(self, token_ids: list[int], prefix_ids: list[int] = (),
                      prefix_kv: Any = None) -> Any:
        """The chunk's KV computed alone from position 0, or right after ``prefix_ids`` (the
        chunk's then starts at ``len(prefix_ids)``). ``prefix_kv``, the exact KV of
        ``prefix_ids`` at 0.. (a part ``concat`` takes), spares computing them again."""
        ...

    def placeholder(self, token_ids: list[int], start: int) -> Any:
        """KV at ``start``.. for context tokens ``recompute`` will compute in place (among its
        ``selected``): whatever costs least that the engine can build a request from."""
        ...

    def reposition(self, kv: Any, start: int) -> Any: ...

    def concat(self, parts: list[Any]) -> Any: ...

    def to_entry(self, kv: Any, provenance: dict) -> KVEntry: ...

    def from_entry(self, entry: KVEntry, start: int) -> Any: ...

    def kv_deviation(self, token_ids: list[int], context: Any) -> torch.Tensor: ...

    def query_relevance(self, context: Any, query_ids: list[int],
                        layers: tuple[int, ...], hidden: list[int] = ()) -> torch.Tensor:
        """``hidden``: context positions holding placeholders that are not KV."""
        ...

    # -- requests --------------------------------------------------------------------------
    def full_prefill(self, token_ids: list[int]) -> RequestState: ...

    def recompute(self, context_ids: list[int], context: Any, selected: list[int],
                  query_ids: list[int]) -> RequestState: ...

    def extend(self, state: RequestState, token_ids: list[int]) -> torch.Tensor: ...

    def rewind(self, state: RequestState, length: int, logits: torch.Tensor) -> None: ...

    def score(self, state: RequestState, target_ids: list[int]) -> float: ...

    def generate(self, state: RequestState, max_new_tokens: int) -> list[int]: ...

    def kv_bytes(self, state: RequestState) -> int: ...

    def batch_floor(self, state: RequestState) -> RequestState | None:
        """``state``'s tokens decoded in the batches that built it, without composition: the
        engine's noise floor where its numerics depend on batch shapes (llama.cpp); None
        where they do not (transformers)."""
        ...

    # -- exact prefixes (a server keeps recent requests' KV and reuses their common prefix) ---
    def state_kv(self, state: RequestState, n_tokens: int) -> Any:
        """The KV of the state's first ``n_tokens`` as chunk KV at position 0: a copy, the
        state goes on."""
        ...

    def head(self, kv: Any, n_tokens: int) -> Any:
        """The KV of ``kv``'s first ``n_tokens``, at the same positions."""
        ...


def rule_refusal(backend: Backend, rule) -> str | None:
    """Why ``backend`` cannot run the selection rule ``rule`` (a ``Strategy``), or None: a
    rule needing what the engine cannot give is refused with this reason, never approximated."""
    for needed, refusal in ((rule.needs_deviation, backend.deviation_refusal),
                            (rule.needs_relevance, backend.relevance_refusal),
                            (not rule.reposition, backend.unshifted_refusal)):
        if needed and refusal:
            return refusal
    return None
