"""The Hugging Face transformers backend (PyTorch, CPU or CUDA).

Selective recompute runs in one forward pass over the selected tokens plus the query at their
true positions. The request state is built in place: it starts as every context token's reused,
re-positioned KV, and each layer's fresh KV of the selected tokens overwrites their stale
copies (the query's fills the tail) before that layer attends. Each input row then sees
exactly the positions up to its own, so every layer recomputes the selected tokens from their
recomputed previous-layer states (CacheBlend's partial recompute), and no commit step remains.
Attention runs in row blocks that skip the keys after a block's last position.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

from codekv.backends import (
    ModelInfo,
    UnsupportedModel,
    chat_template_of,
    mean_nll,
    prompt_tokens,
)
from codekv.stores.entry import BadEntry, KVEntry

# Families with rotate-half RoPE applied to keys after any key normalisation, so a cached key
# moves exactly by one more rotation (per layer, with that layer's own frequencies).
SUPPORTED_FAMILIES = {
    "llama": "Llama-style RoPE",
    "mistral": "Llama-style RoPE",
    "qwen2": "Llama-style RoPE",
    "qwen3": "k-norm before RoPE",
    "gpt_neox": "partial rotary",
    "phi": "partial rotary",
    "phi3": "Llama-style RoPE (fused projections)",
    "gemma3_text": "q/k norm before RoPE, a RoPE base per layer type, sliding-window layers",
}
# Families whose sliding-window layers are declared in ``layer_types`` and whose forward takes
# a mask per layer type: composition builds each layer type's mask itself (the window included),
# so reused KV outside a window is never attended to. Other families' windows are refused.
WINDOWED_FAMILIES = {"gemma3_text"}
LAYER_TYPES = {"full_attention", "sliding_attention"}
# "longrope" is not static: transformers switches to the long factors once a sequence exceeds
# the original context length, so a chunk prefilled alone can be rotated by other frequencies.
STATIC_ROPE_TYPES = {"default", "linear", "llama3", "yarn"}


@dataclass
class ChunkKV:
    """Per-layer keys and values of a token span, rotated for positions ``start``.."""

    keys: list[torch.Tensor]  # per layer, [kv_heads, n_tokens, head_dim]
    values: list[torch.Tensor]
    start: int = 0

    @property
    def n_tokens(self) -> int:
        return self.keys[0].shape[1] if self.keys else 0

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


@dataclass
class HFRequest:
    """A request's own KV cache (never shared with the chunk store) and next-token logits."""

    cache: DynamicCache
    token_ids: list[int]
    logits: torch.Tensor  # [vocab], predicting the token after token_ids

    @property
    def length(self) -> int:
        return len(self.token_ids)


def unsupported_reason(config) -> str | None:
    """Why composition would be wrong for this config, or None when it is exact to re-position."""
    family = getattr(config, "model_type", "?")
    if getattr(config, "vision_config", None) is not None or getattr(config, "audio_config", None):
        return f"multimodal model ({family}): only text inputs are composed"
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    if family not in SUPPORTED_FAMILIES:
        if getattr(text_config, "position_embedding_type", None) == "absolute" or family == "gpt2":
            return f"{family} uses absolute position embeddings: cached KV cannot be re-positioned"
        return f"model family {family!r} is not supported for composition"
    layer_types = getattr(text_config, "layer_types", None) or []
    windowed = family in WINDOWED_FAMILIES
    if not windowed and any(t != "full_attention" for t in layer_types):
        return f"{family} has sliding-window layers: reused KV outside the window is wrong"
    if windowed and not set(layer_types) <= LAYER_TYPES:
        return f"{family} has layer types {sorted(set(layer_types) - LAYER_TYPES)}"
    if windowed and getattr(text_config, "use_bidirectional_attention", False):
        return f"{family} attends bidirectionally: cached KV depends on later tokens"
    if getattr(text_config, "attn_logit_softcapping", None):
        return f"{family} soft-caps attention logits, which SDPA (full prefill too) leaves out"
    # Mistral and Phi-3 slide whenever ``sliding_window`` is set (no layer_types, no flag), and
    # the recompute mask is full attention: any window makes the result differ from full prefill.
    window = getattr(text_config, "sliding_window", None)
    if window and not windowed:
        return f"{family} uses sliding-window attention ({window} tokens)"
    for rope in _rope_per_layer_type(text_config).values():
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in STATIC_ROPE_TYPES:
            return f"RoPE type {rope_type!r} depends on sequence length: re-rotation is not exact"
    return None


def _rope_parameters(config) -> dict:
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return dict(rope)


def _rope_per_layer_type(config) -> dict[str, dict]:
    """RoPE parameters by layer type: Gemma 3 keeps one set per type (``{"full_attention":
    {...}, "sliding_attention": {...}}``), other families one set for every layer."""
    rope = _rope_parameters(config)
    if rope and all(isinstance(value, dict) for value in rope.values()):
        return {layer_type: dict(value) for layer_type, value in rope.items()}
    return {"full_attention": rope}


class HFBackend:
    """Composition on a loaded ``AutoModelForCausalLM`` and its tokenizer."""

    deviation_refusal = None  # values are tensors here: KV deviation can be scored
    relevance_refusal = None  # and the query's attention over them too
    unshifted_refusal = None  # and KV left at its own positions is just not rotated
    free_placeholders = True  # zeros: a recomputed position's KV is written before it is read

    def __init__(self, model, tokenizer, weights_fingerprint: str | None = None,
                 leading_ids: list[int] | None = None):
        """``leading_ids``: the tokens every sequence starts with (a GGUF's BOS, as its
        metadata says); by default those the tokenizer puts before any text."""
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.leading_ids = list(leading_ids) if leading_ids is not None else _leading(tokenizer)
        self.config = model.config
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        text_config = self.config.get_text_config()
        # Each layer's RoPE frequencies (Gemma 3: one set per layer type), None without RoPE.
        self._inv_freqs = _layer_inv_freqs(model, text_config)
        # Partial rotary (GPT-NeoX, Phi) rotates only as many dims as there are frequencies x2.
        self._rotary_dim = 2 * self._inv_freqs[0].numel() if self._inv_freqs else 0
        # The sliding window of each layer type that has one (composition masks it itself).
        self._windows = _windows(text_config)
        self.info = ModelInfo(
            family=self.config.model_type,
            fingerprint=self._fingerprint(weights_fingerprint),
            tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
            dtype=str(self.dtype).removeprefix("torch."),
            n_layers=text_config.num_hidden_layers,
            max_positions=getattr(text_config, "max_position_embeddings", 2048),
            unsupported=unsupported_reason(self.config),
            key_cost=key_cost(model, text_config),
        )

    # -- identity ------------------------------------------------------------------------
    def _fingerprint(self, weights: str | None) -> str:
        """Weights (hashed here when the loader did not), dtype, family and RoPE parameters."""
        if weights is None:
            digest = hashlib.sha256()
            for name, tensor in sorted(self.model.state_dict().items()):
                digest.update(name.encode())
                digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
            weights = digest.hexdigest()
        identity = {
            "weights": weights,
            "dtype": str(self.dtype),
            "family": self.config.model_type,
            "rope": _rope_parameters(self.config),
            "rotary_dim": self._rotary_dim,
        }
        if self._windows:  # only where there are windows: other models' fingerprints stay
            identity["windows"] = self._windows
        config = json.dumps(identity, sort_keys=True, default=str)
        return hashlib.sha256(config.encode()).hexdigest()[:32]

    # -- tokens --------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        """``text`` as text: a special token's spelling in it is read as characters."""
        return self.tokenizer(text, add_special_tokens=False,
                              split_special_tokens=True)["input_ids"]

    def tokenize_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids (as ``tokenize``) and each token's character span in ``text``."""
        encoded = self.tokenizer(text, add_special_tokens=False, split_special_tokens=True,
                                 return_offsets_mapping=True)
        return encoded["input_ids"], [tuple(span) for span in encoded["offset_mapping"]]

    @functools.cached_property
    def markers(self) -> dict[str, int]:
        return {token.content: index
                for index, token in self.tokenizer.added_tokens_decoder.items() if token.special}

    def detokenize(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    @property
    def chat_template(self) -> str | None:
        return getattr(self.tokenizer, "chat_template", None)

    def render_chat(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """The chat as the tokenizer's template (else ``CHATML``) renders it, ending with the
        assistant's turn."""
        try:
            return self.tokenizer.apply_chat_template(messages, tools=tools or None,
                                                      chat_template=chat_template_of(self),
                                                      tokenize=False, add_generation_prompt=True)
        except Exception as error:  # the template's own raise_exception, a Jinja error
            raise ValueError(str(error)) from None

    def tokenize_prompt(self, text: str, markers: Sequence[tuple[int, int]] = ()
                        ) -> tuple[list[int], list[tuple[int, int]]]:
        return prompt_tokens(self, text, markers)

    @property
    def eos_token_id(self) -> int | None:
        return self.tokenizer.eos_token_id

    @property
    def end_token_ids(self) -> frozenset[int]:
        """The tokenizer's end of sequence and the generation config's (a GGUF converted by
        transformers names ``<|im_start|>`` the former and ``<|im_end|>`` the latter)."""
        config = getattr(self.model, "generation_config", None)
        ends = getattr(config, "eos_token_id", None)
        ends = [] if ends is None else [ends] if isinstance(ends, int) else list(ends)
        if self.tokenizer.eos_token_id is not None:
            ends.append(self.tokenizer.eos_token_id)
        return frozenset(ends)

    # -- KV ------------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill_chunk(self, token_ids: list[int], prefix_ids: list[int] = (),
                      prefix_kv: ChunkKV | None = None) -> ChunkKV:
        """A chunk's KV computed alone from position 0, or right after ``prefix_ids`` (whose
        KV is dropped: the chunk's then starts at ``len(prefix_ids)``); with ``prefix_kv``
        (theirs, exact, at 0..) only the chunk's tokens are computed, against it."""
        n = len(prefix_ids)
        if prefix_kv is not None and n:
            if prefix_kv.n_tokens != n or prefix_kv.start != 0:
                raise ValueError(f"prefix KV of {prefix_kv.n_tokens} tokens at "
                                 f"{prefix_kv.start}, for {n} prefix ids at 0")
            state = self.recompute(list(prefix_ids), prefix_kv, [], list(token_ids))
            end = n + len(token_ids)
            layers = state.cache.layers
            return ChunkKV([layer.keys[0, :, n:end].clone() for layer in layers],
                           [layer.values[0, :, n:end].clone() for layer in layers], start=n)
        cache = _full_cache()
        ids = torch.tensor([list(prefix_ids) + list(token_ids)], device=self.device)
        self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        keys, values = _unpack(cache)
        if n:
            return ChunkKV([k[0, :, n:].contiguous() for k in keys],
                           [v[0, :, n:].contiguous() for v in values], start=n)
        return ChunkKV([k[0] for k in keys], [v[0] for v in values], start=0)

    def reposition(self, kv: ChunkKV, start: int) -> ChunkKV:
        """Rotate cached keys from positions ``kv.start``.. to ``start``..; values do not move."""
        delta = start - kv.start
        if delta == 0:
            return kv
        if self._inv_freqs is None:
            raise UnsupportedModel(f"{self.info.family} has no rotary embedding to re-position")
        rd = self._rotary_dim
        turns: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # one per distinct frequency set
        keys = []
        for key, inv_freq in zip(kv.keys, self._inv_freqs, strict=True):
            if id(inv_freq) not in turns:
                angles = delta * inv_freq
                emb = torch.cat((angles, angles))
                turns[id(inv_freq)] = (emb.cos().to(self.dtype).to(key.device),
                                       emb.sin().to(self.dtype).to(key.device))
            cos, sin = turns[id(inv_freq)]
            rotated, passed = key[..., :rd], key[..., rd:]
            rotated = rotated * cos + _rotate_half(rotated) * sin
            keys.append(torch.cat((rotated, passed), dim=-1) if passed.shape[-1] else rotated)
        return ChunkKV(keys, kv.values, start)

    def concat(self, parts: list[ChunkKV]) -> ChunkKV:
        """Consecutive spans joined into one, per layer along the token axis."""
        n_layers = len(parts[0].keys)
        keys = [torch.cat([p.keys[layer] for p in parts], dim=1) for layer in range(n_layers)]
        values = [torch.cat([p.values[layer] for p in parts], dim=1) for layer in range(n_layers)]
        return ChunkKV(keys, values, parts[0].start)

    def to_entry(self, kv: ChunkKV, provenance: dict) -> KVEntry:
        return KVEntry([k.contiguous() for k in kv.keys], [v.contiguous() for v in kv.values],
                       provenance)

    @property
    def _kv_layout(self) -> tuple[int, int]:
        """(KV heads, head size) of every layer's keys and values."""
        text_config = self.config.get_text_config()
        heads = text_config.num_attention_heads
        kv_heads = getattr(text_config, "num_key_value_heads", None) or heads
        return kv_heads, getattr(text_config, "head_dim", None) or text_config.hidden_size // heads

    def placeholder(self, token_ids: list[int], start: int) -> ChunkKV:
        """KV standing at ``start``.. for context tokens the request recomputes in place (in
        ``recompute``'s ``selected``): zeros, which nothing reads - each layer writes a
        selected position's fresh KV before any row attends to it - so computing the tokens
        first (alone) would be work thrown away. ``query_relevance`` must be told to hide them."""
        kv_heads, head_dim = self._kv_layout
        shape = (kv_heads, len(token_ids), head_dim)
        zeros = [torch.zeros(shape, dtype=self.dtype, device=self.device)
                 for _ in range(self.info.n_layers)]
        return ChunkKV(zeros, [z.clone() for z in zeros], start)

    def from_entry(self, entry: KVEntry, start: int) -> ChunkKV:
        """The stored KV on the model's device; raises ``BadEntry`` unless it has this model's
        layers, KV heads, head size and dtype (the store checked it is one finite layout)."""
        kv_heads, head_dim = self._kv_layout
        first = entry.keys[0] if entry.keys else None
        if (len(entry.keys) != self.info.n_layers or first.dtype != self.dtype
                or first.shape[0] != kv_heads or first.shape[2] != head_dim
                or entry.values[0].shape[2] != head_dim):
            shape = None if first is None else (tuple(first.shape), str(first.dtype))
            raise BadEntry(f"KV of {len(entry.keys)} layers of {shape}, not this model's "
                           f"{self.info.n_layers} of [{kv_heads}, n, {head_dim}] {self.dtype}")
        # The store reads onto the CPU; the model may live on an accelerator.
        return ChunkKV([k.to(self.device) for k in entry.keys],
                       [v.to(self.device) for v in entry.values], start)

    @torch.inference_mode()
    def kv_deviation(self, token_ids: list[int], context: ChunkKV, layer: int = 1) -> torch.Tensor:
        """Per-position distance between reused values and fresh ones at ``layer`` (CacheBlend).

        Runs all tokens through the first ``layer + 1`` layers only.
        """
        base = self.model.base_model
        layers = base.layers
        base.layers = layers[: layer + 1]
        try:
            cache = _full_cache()
            base(input_ids=torch.tensor([token_ids], device=self.device), past_key_values=cache,
                 use_cache=True)
        finally:
            base.layers = layers
        fresh = cache.layers[layer].values[0]
        return (fresh - context.values[layer]).float().norm(dim=-1).sum(dim=0).cpu()

    @torch.inference_mode()
    def query_relevance(self, context: ChunkKV, query_ids: list[int],
                        layers: tuple[int, ...], hidden: list[int] = ()) -> torch.Tensor:
        """Per context position, the attention the query pays it over the reused context.

        The query runs once through the first ``max(layers) + 1`` layers against the reused,
        re-positioned KV (what ``none`` would see); at each probe layer the attention of every
        query row and head over the context is taken, and the mean over rows, heads and probe
        layers is returned (ProphetKV / QCFuse-style query-aware selection). Costs a forward of
        the query tokens alone through those layers; ``context`` is not modified. ``hidden``
        context positions hold placeholders (``placeholder``): the query does not see them.
        """
        n, q = context.n_tokens, len(query_ids)
        if not q:
            raise ValueError("query relevance needs query tokens")
        last = max(layers)
        if not 0 <= min(layers) <= last < len(context.keys):
            raise ValueError(f"probe layers {layers} outside 0..{len(context.keys) - 1}")
        pos = torch.arange(n, n + q, device=self.device)
        mask = self._mask(pos, n + q, hidden)
        cache = _full_cache()
        cache.layers = [_SlotLayer(_with_room(key, n + q), _with_room(value, n + q), pos)
                        for key, value in zip(context.keys[: last + 1],
                                              context.values[: last + 1])]
        base = self.model.base_model
        all_layers = base.layers
        base.layers = all_layers[: last + 1]
        config = self.model.config
        inner = config._attn_implementation
        captured: dict[int, torch.Tensor] = {}
        token = _PROBE.set((frozenset(layers), n, captured))
        config._attn_implementation = PROBE_ATTENTION
        try:
            base(input_ids=torch.tensor([query_ids], device=self.device), position_ids=pos[None],
                 attention_mask=mask, past_key_values=cache, use_cache=True)
        finally:
            base.layers = all_layers
            config._attn_implementation = inner
            _PROBE.reset(token)
        return torch.stack([captured[layer] for layer in layers]).mean(dim=0).float().cpu()

    # -- requests ------------------------------------------------------------------------
    @torch.inference_mode()
    def full_prefill(self, token_ids: list[int]) -> HFRequest:
        cache = _full_cache()
        ids = torch.tensor([token_ids], device=self.device)
        out = self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return HFRequest(cache, list(token_ids), out.logits[0, -1].float())

    @torch.inference_mode()
    def recompute(
        self, context_ids: list[int], context: ChunkKV, selected: list[int], query_ids: list[int]
    ) -> HFRequest:
        """Recompute ``selected`` context positions and the query against the composed context.

        ``context`` holds KV for every context position (reused, already re-positioned);
        nothing in it is modified. Returns a fresh request state of context + query.
        """
        n = len(context_ids)
        selected = recomputed_positions(context_ids, context, selected, query_ids)
        positions = selected + list(range(n, n + len(query_ids)))
        input_ids = [context_ids[p] for p in selected] + list(query_ids)
        total = n + len(query_ids)
        pos = torch.tensor(positions, device=self.device)
        # The request state is built in place: each layer's fresh KV of the selected tokens
        # overwrites their reused copies and the query's fills the tail, so every row simply
        # sees the positions up to its own (rows are in position order), and in a sliding
        # layer only its window's.
        mask = self._mask(pos, total)
        cache = _full_cache()
        cache.layers = [
            _SlotLayer(_with_room(key, total), _with_room(value, total), pos)
            for key, value in zip(context.keys, context.values)
        ]
        with self._ragged_attention(positions):
            out = self.model(
                input_ids=torch.tensor([input_ids], device=self.device),
                position_ids=pos[None],
                attention_mask=mask,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        return HFRequest(cache, list(context_ids) + list(query_ids), out.logits[0, -1].float())

    def _mask(self, rows: torch.Tensor, total: int, hidden: list[int] = ()
              ) -> torch.Tensor | dict[str, torch.Tensor]:
        """The additive attention mask of rows at positions ``rows`` over keys 0..total-1:
        causal, as one ``[1, 1, rows, total]`` tensor; for a model with sliding-window layers,
        one per layer type, a sliding layer's row seeing only its window's last keys (as
        transformers masks it: key > row - window). No row sees a ``hidden`` key."""
        keys = torch.arange(total, device=self.device)[None, :]
        masks = {"full_attention": keys <= rows[:, None]}
        for layer_type, window in self._windows.items():
            masks[layer_type] = (keys <= rows[:, None]) & (keys > rows[:, None] - window)
        if len(hidden):
            shown = torch.ones(total, dtype=torch.bool, device=self.device)
            shown[torch.as_tensor(list(hidden), device=self.device)] = False
            masks = {layer_type: visible & shown for layer_type, visible in masks.items()}
        additive = {}
        for layer_type, visible in masks.items():
            mask = torch.zeros(visible.shape, dtype=self.dtype, device=self.device)
            additive[layer_type] = mask.masked_fill_(~visible, torch.finfo(self.dtype).min)[
                None, None]
        return additive if self._windows else additive["full_attention"]

    @contextlib.contextmanager
    def _ragged_attention(self, positions: list[int]):
        """Attend block by block, each block of rows only to the keys up to its last position.

        The selected rows spread over the whole context, so one dense pass would compute every
        row against every key; most of those scores are masked. Blocks skip them: same result,
        about half the attention work. Only for SDPA (the default); others run one dense pass.
        """
        config = self.model.config
        inner = config._attn_implementation
        if inner != "sdpa":
            yield
            return
        blocks = [
            (start, min(start + RAGGED_BLOCK_ROWS, len(positions)))
            for start in range(0, len(positions), RAGGED_BLOCK_ROWS)
        ]
        token = _RAGGED_PLAN.set([(start, end, positions[end - 1] + 1) for start, end in blocks])
        config._attn_implementation = RAGGED_ATTENTION
        try:
            yield
        finally:
            config._attn_implementation = inner
            _RAGGED_PLAN.reset(token)

    @torch.inference_mode()
    def extend(self, state: HFRequest, token_ids: list[int]) -> torch.Tensor:
        """Append tokens to the state; returns logits for every appended position."""
        n = state.length
        out = self.model(
            input_ids=torch.tensor([token_ids], device=self.device),
            position_ids=torch.arange(n, n + len(token_ids), device=self.device)[None],
            past_key_values=state.cache,
            use_cache=True,
        )
        state.token_ids.extend(token_ids)
        state.logits = out.logits[0, -1].float()
        return out.logits[0].float()

    def rewind(self, state: HFRequest, length: int, logits: torch.Tensor) -> None:
        # Drop the appended entries: a pruned cache holds fewer entries than tokens (a different
        # number per layer for PyramidKV), so cropping to ``length`` would keep them all.
        appended = state.length - length
        if appended > 0:
            state.cache.crop(-appended)  # negative: per layer, that many from the end
        del state.token_ids[length:]
        state.logits = logits

    @torch.inference_mode()
    def score(self, state: HFRequest, target_ids: list[int]) -> float:
        """Mean NLL (nats/token) of ``target_ids`` following the state; the state is unchanged."""
        return mean_nll(self, state, target_ids)

    def batch_floor(self, state: HFRequest) -> None:
        """None: batch shapes do not change transformers' results beyond rounding."""
        return None

    def kv_bytes(self, state: HFRequest) -> int:
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in state.cache.layers)

    def state_kv(self, state: HFRequest, n_tokens: int) -> ChunkKV:
        """The state's first ``n_tokens`` as chunk KV at position 0 (copied: generation goes
        on in the state's own cache)."""
        if not 0 < n_tokens <= state.length:
            raise ValueError(f"{n_tokens} tokens of a state of {state.length}")
        layers = state.cache.layers
        return ChunkKV([layer.keys[0, :, :n_tokens].clone() for layer in layers],
                       [layer.values[0, :, :n_tokens].clone() for layer in layers], 0)

    def head(self, kv: ChunkKV, n_tokens: int) -> ChunkKV:
        """``kv``'s first ``n_tokens`` (views: cached KV is never written to)."""
        if not 0 < n_tokens <= kv.n_tokens:
            raise ValueError(f"{n_tokens} tokens of chunk KV of {kv.n_tokens}")
        return self.span(kv, 0, n_tokens)

    def span(self, kv: ChunkKV, start: int, end: int) -> ChunkKV:
        """Tokens ``[start, end)`` of ``kv`` (counted from its first), at their positions
        (views, as ``head``)."""
        if not 0 <= start < end <= kv.n_tokens:
            raise ValueError(f"tokens {start}..{end} of chunk KV of {kv.n_tokens}")
        return ChunkKV([k[:, start:end] for k in kv.keys], [v[:, start:end] for v in kv.values],
                       kv.start + start)

    @torch.inference_mode()
    def generate(self, state: HFRequest, max_new_tokens: int) -> list[int]:
        """Greedy continuation up to an end token (``end_token_ids``); the state is left as it
        was."""
        length, first = state.length, state.logits
        ends = self.end_token_ids  # the default model ends its turn with the config's <|im_end|>
        out: list[int] = []
        limit = min(max_new_tokens, self.info.max_positions - length)
        for _ in range(limit):
            token = int(state.logits.argmax())
            if token in ends:
                break
            out.append(token)
            self.extend(state, [token])
        self.rewind(state, length, first)
        return out


# Rows per attention block in selective recompute: smaller blocks skip more masked scores but
# make more, smaller kernel calls.
RAGGED_BLOCK_ROWS = 64
RAGGED_ATTENTION = "codekv_ragged_sdpa"
_RAGGED_PLAN: contextvars.ContextVar[list[tuple[int, int, int]] | None] = contextvars.ContextVar(
    "codekv_ragged_plan", default=None
)


def _ragged_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """SDPA over row blocks ``(start, end, keys)``: rows ``start:end`` see the first ``keys``."""
    plan = _RAGGED_PLAN.get()
    if plan is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    # Grouped-query attention: the CPU kernels take the shared heads as they are; elsewhere a
    # mask sends enable_gqa to the slow math kernel, so the heads are repeated once per layer.
    gqa = query.shape[1] != key.shape[1]
    if gqa and query.device.type != "cpu":
        key, value = (repeat_kv(t, query.shape[1] // t.shape[1]) for t in (key, value))
        gqa = False
    outputs = [
        F.scaled_dot_product_attention(
            query[:, :, start:end], key[:, :, :keys], value[:, :, :keys],
            attn_mask=attention_mask[:, :, start:end, :keys], dropout_p=dropout, scale=scaling,
            enable_gqa=gqa,
        )
        for start, end, keys in plan
    ]
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


AttentionInterface.register(RAGGED_ATTENTION, _ragged_sdpa)


PROBE_ATTENTION = "codekv_query_probe"
# (probe layers, context length, captured per-layer relevance) while a query probe runs.
_PROBE: contextvars.ContextVar[tuple[frozenset[int], int, dict] | None] = contextvars.ContextVar(
    "codekv_query_probe", default=None
)


def _probe_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                     **kwargs):
    """Eager attention that also records, at probe layers, the mean attention of the query rows
    over the context keys; the output is what SDPA would give."""
    layers, n, captured = _PROBE.get()
    key = repeat_kv(key, query.shape[1] // key.shape[1])
    value = repeat_kv(value, query.shape[1] // value.shape[1])
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale + attention_mask
    probs = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    if module.layer_idx in layers:
        captured[module.layer_idx] = probs[0, :, :, :n].mean(dim=(0, 1))
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), None


AttentionInterface.register(PROBE_ATTENTION, _probe_attention)


class _SlotLayer(DynamicLayer):
    """A cache layer holding the composed request whose next update writes the given positions
    (recomputed tokens, then the query) in place instead of appending; later ones append."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor):
        super().__init__()
        self.keys, self.values, self.slots = keys, values, slots
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True

    def update(self, key_states, value_states, cache_kwargs=None):
        if self.slots is None:
            return super().update(key_states, value_states, cache_kwargs)
        self.keys.index_copy_(2, self.slots, key_states)
        self.values.index_copy_(2, self.slots, value_states)
        self.slots = None
        return self.keys, self.values


def recomputed_positions(context_ids: list[int], context: ChunkKV, selected: list[int],
                         query_ids: list[int]) -> list[int]:
    """The context positions a recompute runs, in order: ``selected``, and without a query the
    last one, whose output is the next-token prediction."""
    n = len(context_ids)
    if context.n_tokens != n:
        raise ValueError(f"context KV has {context.n_tokens} tokens, ids have {n}")
    selected = sorted(set(selected))
    if not query_ids and (not selected or selected[-1] != n - 1):
        selected.append(n - 1)
    return selected


def _leading(tokenizer) -> list[int]:
    """The special tokens ``tokenizer(text)`` puts before any text (a BOS), or []."""
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a", add_special_tokens=True)["input_ids"]
    if plain and len(full) > len(plain) and full[len(full) - len(plain):] == plain:
        return full[:len(full) - len(plain)]
    return []


def _with_room(tensor: torch.Tensor, length: int) -> torch.Tensor:
    """A new ``[1, heads, length, dim]`` tensor starting with ``tensor`` (the rest unset)."""
    heads, n, dim = tensor.shape
    out = tensor.new_empty((1, heads, length, dim))
    out[0, :, :n] = tensor
    return out


def _full_cache() -> DynamicCache:
    """A cache keeping every position in every layer. ``DynamicCache(config=...)`` drops a
    sliding layer's keys outside its window, but chunk KV, composed requests and prefixes
    read from a state need all of them; the masks apply the windows."""
    return DynamicCache()


def _layer_inv_freqs(model, text_config) -> list[torch.Tensor] | None:
    """Each layer's RoPE inverse frequencies (float64; the same tensor for layers sharing
    them), or None for a model without a rotary embedding."""
    rotary = getattr(model.base_model, "rotary_emb", None)
    if rotary is None:
        return None
    n_layers = text_config.num_hidden_layers
    shared = getattr(rotary, "inv_freq", None)
    if shared is not None:
        return [shared.detach().to(torch.float64)] * n_layers
    # Per layer type (Gemma 3): ``<layer type>_inv_freq``, each with its own base and scaling.
    layer_types = getattr(text_config, "layer_types", None) or []
    by_type = {t: getattr(rotary, f"{t}_inv_freq", None) for t in set(layer_types)}
    if len(layer_types) != n_layers or any(f is None for f in by_type.values()):
        return None
    by_type = {t: f.detach().to(torch.float64) for t, f in by_type.items()}
    return [by_type[t] for t in layer_types]


def _windows(text_config) -> dict[str, int]:
    """``{"sliding_attention": window}`` for a model whose ``layer_types`` has sliding layers,
    else empty."""
    layer_types = getattr(text_config, "layer_types", None) or []
    window = getattr(text_config, "sliding_window", None)
    if window and "sliding_attention" in layer_types:
        return {"sliding_attention": window}
    return {}


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _unpack(cache: DynamicCache) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    return [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers]


def key_cost(model, text_config) -> float:
    """FLOPs of one more key for one query row (q.k and p.v over every query head) over the
    FLOPs of that row's weight matrices in one decoder layer (two per weight)."""
    layers = getattr(model.base_model, "layers", None)
    heads = getattr(text_config, "num_attention_heads", 0)
    head_dim = getattr(text_config, "head_dim", None) or (
        text_config.hidden_size // heads if heads else 0
    )
    if not layers or not heads:
        return 0.0
    weights = sum(p.numel() for p in layers[0].parameters() if p.dim() == 2)
    return 4 * heads * head_dim / (2 * weights) if weights else 0.0


def tokenizer_fingerprint(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        text = backend.to_str()
    else:
        text = json.dumps(tokenizer.get_vocab(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]
