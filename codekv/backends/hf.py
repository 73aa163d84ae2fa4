"""The Hugging Face transformers backend (PyTorch, CPU or CUDA).

Selective recompute runs in one forward pass: the cache holds every context token's reused,
re-positioned KV; the input is the selected tokens plus the query at their true positions; a
4-D mask lets each input row see the cached keys at earlier positions except the stale copies
of selected tokens, plus the fresh keys at positions <= its own. Every layer thus recomputes the
selected tokens from their recomputed previous-layer states (CacheBlend's partial recompute),
and the fresh KV then replaces the stale slots in a new request state.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from codekv.backends import ChunkKV, ModelInfo, UnsupportedModel

# Families whose attention is full (no sliding window) with rotate-half RoPE applied to keys
# after any key normalisation, so a cached key moves exactly by one more rotation.
SUPPORTED_FAMILIES = {
    "llama": "Llama-style RoPE",
    "mistral": "Llama-style RoPE",
    "qwen2": "Llama-style RoPE",
    "qwen3": "k-norm before RoPE",
    "gpt_neox": "partial rotary",
    "phi": "partial rotary",
    "phi3": "Llama-style RoPE (fused projections)",
}
# "longrope" is not static: transformers switches to the long factors once a sequence exceeds
# the original context length, so a chunk prefilled alone can be rotated by other frequencies.
STATIC_ROPE_TYPES = {"default", "linear", "llama3", "yarn"}


@dataclass
class RequestState:
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
    if any(t != "full_attention" for t in layer_types):
        return f"{family} has sliding-window layers: reused KV outside the window is wrong"
    # Mistral and Phi-3 slide whenever ``sliding_window`` is set (no layer_types, no flag), and
    # the recompute mask is full attention: any window makes the result differ from full prefill.
    window = getattr(text_config, "sliding_window", None)
    if window:
        return f"{family} uses sliding-window attention ({window} tokens)"
    rope = _rope_parameters(text_config)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in STATIC_ROPE_TYPES:
        return f"RoPE type {rope_type!r} depends on sequence length: re-rotation is not exact"
    return None


def _rope_parameters(config) -> dict:
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return dict(rope)


class HFBackend:
    """Composition on a loaded ``AutoModelForCausalLM`` and its tokenizer."""

    def __init__(self, model, tokenizer, weights_fingerprint: str | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.config = model.config
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        text_config = self.config.get_text_config()
        rotary = getattr(model.base_model, "rotary_emb", None)
        inv_freq = getattr(rotary, "inv_freq", None)  # absent for per-layer-type RoPE (Gemma 3)
        self._inv_freq = inv_freq.detach().to(torch.float64) if inv_freq is not None else None
        # Partial rotary (GPT-NeoX, Phi) rotates only as many dims as there are frequencies x2.
        self._rotary_dim = 2 * self._inv_freq.numel() if self._inv_freq is not None else 0
        self.info = ModelInfo(
            family=self.config.model_type,
            fingerprint=self._fingerprint(weights_fingerprint),
            tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
            dtype=str(self.dtype).removeprefix("torch."),
            n_layers=text_config.num_hidden_layers,
            max_positions=getattr(text_config, "max_position_embeddings", 2048),
            unsupported=unsupported_reason(self.config),
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
        config = json.dumps(
            {
                "weights": weights,
                "dtype": str(self.dtype),
                "family": self.config.model_type,
                "rope": _rope_parameters(self.config),
                "rotary_dim": self._rotary_dim,
            },
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(config.encode()).hexdigest()[:32]

    # -- tokens --------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def tokenize_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids (as ``tokenize``) and each token's character span in ``text``."""
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return encoded["input_ids"], [tuple(span) for span in encoded["offset_mapping"]]

    def detokenize(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    # -- KV ------------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill_chunk(self, token_ids: list[int]) -> ChunkKV:
        """A chunk's KV computed alone, from position 0."""
        cache = DynamicCache(config=self.config)
        ids = torch.tensor([token_ids], device=self.device)
        self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        keys, values = _unpack(cache)
        return ChunkKV([k[0] for k in keys], [v[0] for v in values], start=0)

    def reposition(self, kv: ChunkKV, start: int) -> ChunkKV:
        """Rotate cached keys from positions ``kv.start``.. to ``start``..; values do not move."""
        delta = start - kv.start
        if delta == 0:
            return kv
        if self._inv_freq is None:
            raise UnsupportedModel(f"{self.info.family} has no rotary embedding to re-position")
        angles = delta * self._inv_freq
        emb = torch.cat((angles, angles))
        cos = emb.cos().to(self.dtype)
        sin = emb.sin().to(self.dtype)
        rd = self._rotary_dim
        keys = []
        for key in kv.keys:
            rotated, passed = key[..., :rd], key[..., rd:]
            rotated = rotated * cos.to(key.device) + _rotate_half(rotated) * sin.to(key.device)
            keys.append(torch.cat((rotated, passed), dim=-1) if passed.shape[-1] else rotated)
        return ChunkKV(keys, kv.values, start)

    @torch.inference_mode()
    def kv_deviation(self, token_ids: list[int], context: ChunkKV, layer: int = 1) -> torch.Tensor:
        """Per-position distance between reused values and fresh ones at ``layer`` (CacheBlend).

        Runs all tokens through the first ``layer + 1`` layers only.
        """
        base = self.model.base_model
        layers = base.layers
        base.layers = layers[: layer + 1]
        try:
            cache = DynamicCache(config=self.config)
            base(input_ids=torch.tensor([token_ids], device=self.device), past_key_values=cache,
                 use_cache=True)
        finally:
            base.layers = layers
        fresh = cache.layers[layer].values[0]
        return (fresh - context.values[layer]).float().norm(dim=-1).sum(dim=0).cpu()

    # -- requests ------------------------------------------------------------------------
    @torch.inference_mode()
    def full_prefill(self, token_ids: list[int]) -> RequestState:
        cache = DynamicCache(config=self.config)
        ids = torch.tensor([token_ids], device=self.device)
        out = self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return RequestState(cache, list(token_ids), out.logits[0, -1].float())

    @torch.inference_mode()
    def recompute(
        self, context_ids: list[int], context: ChunkKV, selected: list[int], query_ids: list[int]
    ) -> RequestState:
        """Recompute ``selected`` context positions and the query against the composed context.

        ``context`` holds KV for every context position (reused, already re-positioned);
        nothing in it is modified. Returns a fresh request state of context + query.
        """
        n = len(context_ids)
        if context.n_tokens != n:
            raise ValueError(f"context KV has {context.n_tokens} tokens, ids have {n}")
        selected = sorted(set(selected))
        if not query_ids and (not selected or selected[-1] != n - 1):
            selected.append(n - 1)  # its output is the next-token prediction
        positions = selected + list(range(n, n + len(query_ids)))
        input_ids = [context_ids[p] for p in selected] + list(query_ids)
        pos = torch.tensor(positions, device=self.device)
        stale = torch.zeros(n, dtype=torch.bool, device=self.device)
        stale[torch.tensor(selected, dtype=torch.long, device=self.device)] = True
        cached_visible = (torch.arange(n, device=self.device)[None, :] < pos[:, None]) & ~stale
        fresh_visible = pos[None, :] <= pos[:, None]
        visible = torch.cat((cached_visible, fresh_visible), dim=1)
        mask = torch.zeros(visible.shape, dtype=self.dtype, device=self.device)
        mask.masked_fill_(~visible, torch.finfo(self.dtype).min)
        # The cache only ever concatenates onto these: the cached tensors are never written.
        cache = DynamicCache(config=self.config)
        for layer, (key, value) in enumerate(zip(context.keys, context.values)):
            cache.update(key[None], value[None], layer)
        out = self.model(
            input_ids=torch.tensor([input_ids], device=self.device),
            position_ids=pos[None],
            attention_mask=mask[None, None],
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        # Commit: fresh KV replaces the stale slots; query KV follows the context.
        keys, values = _unpack(cache)
        index = torch.tensor(selected, dtype=torch.long, device=self.device)
        k_sel = len(selected)
        final = DynamicCache(config=self.config)
        for layer, (key, value) in enumerate(zip(keys, values)):
            merged_k = torch.cat((key[:, :, :n], key[:, :, n + k_sel :]), dim=2)
            merged_v = torch.cat((value[:, :, :n], value[:, :, n + k_sel :]), dim=2)
            merged_k[:, :, index] = key[:, :, n : n + k_sel]
            merged_v[:, :, index] = value[:, :, n : n + k_sel]
            final.update(merged_k, merged_v, layer)
        return RequestState(final, list(context_ids) + list(query_ids), out.logits[0, -1].float())

    @torch.inference_mode()
    def extend(self, state: RequestState, token_ids: list[int]) -> torch.Tensor:
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

    def rewind(self, state: RequestState, length: int, logits: torch.Tensor) -> None:
        state.cache.crop(length)
        del state.token_ids[length:]
        state.logits = logits

    @torch.inference_mode()
    def score(self, state: RequestState, target_ids: list[int]) -> float:
        """Mean NLL (nats/token) of ``target_ids`` following the state; the state is unchanged."""
        if not target_ids:
            return 0.0
        length, first = state.length, state.logits
        logits = self.extend(state, target_ids)
        self.rewind(state, length, first)
        predictions = torch.cat((first[None], logits[:-1]), dim=0)
        targets = torch.tensor(target_ids, device=predictions.device)
        return torch.nn.functional.cross_entropy(predictions, targets).item()

    @torch.inference_mode()
    def generate(self, state: RequestState, max_new_tokens: int) -> list[int]:
        """Greedy continuation; the state is left as it was."""
        length, first = state.length, state.logits
        eos = self.tokenizer.eos_token_id
        out: list[int] = []
        limit = min(max_new_tokens, self.info.max_positions - length)
        for _ in range(limit):
            token = int(state.logits.argmax())
            if token == eos:
                break
            out.append(token)
            self.extend(state, [token])
        self.rewind(state, length, first)
        return out


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _unpack(cache: DynamicCache) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    return [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers]


def tokenizer_fingerprint(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        text = backend.to_str()
    else:
        text = json.dumps(tokenizer.get_vocab(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]
