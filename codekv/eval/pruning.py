"""KV pruning baselines at equal KV budgets, through kvpress (the ``eval`` extra).

kvpress semantics: the context is prefilled with a press active, which prunes each layer's
cache right after that layer's attention; the query is then appended, uncompressed, at its
true positions ``n..``. The prefill's hidden states never see a pruned cache (each layer
prunes only what later tokens will read), so one context prefill serves every press: a hook on
each attention layer hands the layer's full KV to every press's own ``compress`` and keeps what
each returns. A method's TTFT is that shared prefill, plus its own scoring and pruning, plus
its query forward (plus the request's tokenization, as for the other methods).

The rules are registered in ``codekv.eval.methods.RULES`` (listed there).

Pruning is query-agnostic, as in kvpress's pipeline: the query is not seen when pruning.
"""

from __future__ import annotations

import contextlib
import functools
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from codekv.compose import IDENTIFIER
from codekv.eval.methods import RULES, Method
from codekv.request import Report
from codekv.selection import Segment, SelectionContext
from codekv.selection.anchors import anchor_positions

PRUNED = "pruned"  # a result's status
KVPRESS_FAMILIES = ("llama", "mistral", "phi3", "qwen2", "qwen3")  # kvpress SUPPORTED_MODELS


@dataclass(frozen=True)
class Anchors:
    """Context positions of a request's anchors: key anchors, and every anchor."""

    key: tuple[int, ...] = ()
    every: tuple[int, ...] = ()


@dataclass
class Pruned:
    """A pruned request state, shaped like a ``ComposeResult`` for the runner's measures."""

    status: str
    report: Report
    state: object  # HFRequest: the cache holds fewer context entries than token_ids
    kv_bytes: int  # the kept context KV
    full_kv_bytes: int  # the context KV full prefill keeps

    @property
    def kv_kept(self) -> float:
        return self.kv_bytes / self.full_kv_bytes if self.full_kv_bytes else 1.0


@functools.cache
def load():
    """kvpress; None when it is not installed."""
    try:
        with warnings.catch_warnings():  # its dependency fire imports the deprecated pipes
            warnings.simplefilter("ignore", DeprecationWarning)
            import kvpress
    except ImportError:
        return None
    return kvpress


def unavailable(backend) -> str | None:
    """Why pruning cannot run on ``backend`` (None when it can)."""
    if load() is None:
        return "kvpress is not installed (pip install 'codekv[eval]'): KV pruning skipped"
    model = getattr(backend, "model", None)
    if model is None:
        return "KV pruning needs the transformers backend: skipped"
    if backend.info.family not in KVPRESS_FAMILIES:
        return f"kvpress does not support {backend.info.family} models: KV pruning skipped"
    if model.config._attn_implementation != "sdpa":
        return "KV pruning runs on SDPA attention only (ragged PyramidKV caches): skipped"
    return None


@contextlib.contextmanager
def ragged_attention():
    """SDPA taught about ragged caches, while the block runs (pruning and scoring its states).

    PyramidKV keeps a different number of entries per layer, but transformers builds one
    causal mask for all layers (from layer 0's length). Where the mask's width is not the
    layer's key count, the new tokens are the layer's last keys: rebuild the mask as causal
    from the bottom right. Nothing else changes (masks fit every other cache). transformers'
    attention table belongs to the whole process, so the original is put back on the way out,
    also on an error.
    """
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        if attention_mask is not None and attention_mask.shape[-1] != key.shape[-2]:
            attention_mask = _tail_causal_mask(query.shape[-2], key.shape[-2], attention_mask)
        return sdpa(module, query, key, value, attention_mask, *args, **kwargs)

    ALL_ATTENTION_FUNCTIONS["sdpa"] = attention
    try:
        yield
    finally:
        ALL_ATTENTION_FUNCTIONS["sdpa"] = sdpa


def _tail_causal_mask(q: int, k: int, like: torch.Tensor) -> torch.Tensor:
    rows = torch.arange(k - q, k, device=like.device)[:, None]
    visible = torch.arange(k, device=like.device)[None, :] <= rows
    if like.dtype == torch.bool:
        return visible[None, None]
    mask = torch.zeros(visible.shape, dtype=like.dtype, device=like.device)
    return mask.masked_fill(~visible, torch.finfo(like.dtype).min)[None, None]


def anchor_tiers(prefix_length: int, pieces, query: str) -> Anchors:
    """The composer's anchor rule (``codekv.selection.anchors``) over the request's pieces.

    That rule drops the first chunk's positions when it starts at 0 (recomputing them changes
    nothing); pruning them does, so the segments are laid out one position later and shifted
    back.
    """
    segments, offset = [], prefix_length + 1
    for piece in pieces:
        segments.append(Segment(offset, len(piece.ids), piece.chunk_id, piece.anchors))
        offset += len(piece.ids)
    context = SelectionContext(offset, prefix_length + 1, segments, 0, None,
                               frozenset(IDENTIFIER.findall(query)))
    key = dict.fromkeys(p - 1 for p in anchor_positions(context, ranked_kinds=False))
    every = dict.fromkeys(p - 1 for p in anchor_positions(context, ranked_kinds=True))
    return Anchors(tuple(key), tuple(every))


def _attention(module, hidden: torch.Tensor, keys: torch.Tensor, position_embeddings):
    """The prefill's attention weights, as eager attention computes them."""
    from kvpress.utils import get_prerope_query_states
    from transformers.models.llama.modeling_llama import repeat_kv, rotate_half

    query = get_prerope_query_states(module, hidden)
    cos, sin = position_embeddings
    query = query * cos.unsqueeze(1) + rotate_half(query) * sin.unsqueeze(1)
    keys = repeat_kv(keys, query.shape[1] // keys.shape[1])
    weights = torch.matmul(query, keys.transpose(2, 3)) * module.scaling
    n = weights.shape[-1]
    future = torch.ones(n, n, dtype=torch.bool, device=weights.device).triu(1)
    weights.masked_fill_(future, float("-inf"))
    return torch.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)


@torch.inference_mode()
def prune(backend, context_ids: list[int], query_ids: list[int], presses: dict,
          needs_attention: set | None = None, extra_s: dict | None = None) -> Iterator:
    """Prefill ``context_ids`` once; per press (a dict key -> kvpress press), yield
    ``(key, Pruned)`` with the query appended. ``extra_s[key]``: seconds added to its TTFT."""
    from transformers import DynamicCache

    from codekv.backends.hf import HFRequest

    needs_attention = needs_attention or set()
    extra_s = extra_s or {}
    model = backend.model
    cache = DynamicCache(config=backend.config)
    kept: dict = {key: [] for key in presses}
    own = dict.fromkeys(presses, 0.0)  # each press's scoring and pruning
    shared = [0.0]  # attention weights: computed once per layer, charged to each user

    def hook(module, args, kwargs, output):
        layer = kwargs["past_key_values"].layers[module.layer_idx]
        hidden = kwargs["hidden_states"]
        attentions = output[1]
        if attentions is None and needs_attention:
            t0 = time.perf_counter()
            attentions = _attention(module, hidden, layer.keys, kwargs["position_embeddings"])
            shared[0] += time.perf_counter() - t0
        for key, press in presses.items():
            t0 = time.perf_counter()
            keys, values = press.compress(module, hidden, layer.keys, layer.values,
                                          attentions if key in needs_attention else output[1],
                                          kwargs)
            own[key] += time.perf_counter() - t0
            kept[key].append((keys, values))
        return output

    hooks = [layer.self_attn.register_forward_hook(hook, with_kwargs=True)
             for layer in model.base_model.layers]
    try:
        t0 = time.perf_counter()
        out = model(input_ids=torch.tensor([context_ids], device=backend.device),
                    past_key_values=cache, use_cache=True, logits_to_keep=1)
        prefill_s = time.perf_counter() - t0 - shared[0] - sum(own.values())
    finally:
        for handle in hooks:
            handle.remove()
    full_bytes = _nbytes((layer.keys, layer.values) for layer in cache.layers)
    del cache
    n = len(context_ids)
    for key in presses:
        layers = kept.pop(key)
        pruned = DynamicCache(config=backend.config)
        for index, (keys, values) in enumerate(layers):
            pruned.update(keys, values, index)
        kv_bytes = _nbytes(layers)
        del layers
        t0 = time.perf_counter()
        logits = out.logits[0, -1].float()
        if query_ids:
            positions = torch.arange(n, n + len(query_ids), device=backend.device)
            query = model(input_ids=torch.tensor([query_ids], device=backend.device),
                          position_ids=positions[None], past_key_values=pruned, use_cache=True,
                          logits_to_keep=1)
            logits = query.logits[0, -1].float()
        query_s = time.perf_counter() - t0
        state = HFRequest(pruned, list(context_ids) + list(query_ids), logits)
        compress_s = own[key] + (shared[0] if key in needs_attention else 0.0)
        timings = {"prefill": prefill_s, "compress": compress_s, "query": query_s,
                   "tokenize": extra_s.get(key, 0.0)}
        report = Report(status=PRUNED, total_tokens=n + len(query_ids), context_tokens=n,
                        query_tokens=len(query_ids), recomputed_tokens=n,
                        recompute_ratio=1.0 if n else 0.0,
                        timings={k: round(v, 4) for k, v in timings.items()},
                        ttft_s=sum(timings.values()))
        yield key, Pruned(PRUNED, report, state, kv_bytes, full_bytes)


def _nbytes(layers) -> int:
    return sum(t.numel() * t.element_size() for pair in layers for t in pair)


@dataclass
class Pruning:
    """The pruning rules as a ``runner.MethodRunner``: one context prefill per task."""

    methods: list[Method]
    tasks: int | None = None
    sessions = False

    def count(self, workload: str) -> int:
        # Only code has anchors; elsewhere anchor-preserving would be snapkv and is not run.
        return sum(workload == "code-qa" or not RULES[m.strategy].needs_anchors
                   for m in self.methods)

    def results(self, composer, task, prefix: str | None = None) -> Iterator:
        if prefix:
            raise ValueError("KV pruning is measured without a request prefix")
        yield from run(composer, task.context, task.query, self.methods)


def run(composer, chunks: list, query: str, methods: list[Method]) -> Iterator:
    """Each method (``.strategy`` a rule name, ``.ratio`` the share of KV kept) on the request
    ``chunks + query``, tokenized exactly as ``Composer.full_prefill`` does; yields
    ``(method, Pruned)``. Methods needing anchors are left out for requests without any.
    A state yielded here is scored before the next is asked for: ragged attention is on until
    the generator finishes or is closed."""
    kvpress = load()
    t0 = time.perf_counter()
    request = composer.build_request(chunks, query)
    context_ids, query_ids = request.context_ids, request.query_ids
    tokenize_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    anchors = anchor_tiers(len(request.prefix_ids), request.pieces, query)
    anchors_s = time.perf_counter() - t0
    n = len(context_ids)
    presses, attention, extra = {}, set(), {}
    for method in methods:
        rule = RULES[method.strategy]
        if rule.needs_anchors and not anchors.every:
            continue
        presses[method] = rule.make(kvpress, 1.0 - method.ratio, n, anchors)
        extra[method] = tokenize_s + (anchors_s if rule.needs_anchors else 0.0)
        if rule.needs_attention:
            attention.add(method)
    if presses:
        with ragged_attention():  # while the caller scores each state too
            yield from prune(composer.backend, context_ids, query_ids, presses, attention,
                             extra)
