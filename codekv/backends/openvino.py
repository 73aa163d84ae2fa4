"""OpenVINO as a compose engine: the model's forward runs as an OpenVINO IR on the CPU, with
its KV as explicit inputs (every earlier position's keys and values) and outputs (the new
positions' only), so codekv holds the KV as tensors exactly as on transformers.

OpenVINO GenAI keeps KV inside its pipeline (prefix caching only, no access to blocks), and a
stateful IR takes a 2-D attention mask, which cannot say that each recomputed row sees every
cached position before it *except* the stale copies of the rows recomputed with it. The IR here
takes that visibility as a 4-D boolean input instead: a selection anywhere in the context is
recomputed in one call, the fresh KV appended after the cached KV and put in place afterwards.
Everything else is the transformers engine's (``HFBackend``): tokens, re-positioning (RoPE
re-rotation of the cached keys on the host), spans, the store's entries, and the probes that
score KV deviation and the query's attention, which run on the same weights in PyTorch (they
only choose what to recompute; the recompute itself runs in OpenVINO).

The CPU plugin computes in bf16 where the processor has it unless told otherwise; that moved
SmolLM2's logits by up to 1.1 from PyTorch's, so the IR is compiled with an f32 inference
precision (then within 1e-4 of PyTorch, and recomputing every token equals full prefill).
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import replace

import numpy as np
import torch
from transformers import DynamicCache

from codekv.backends.engines import OPENVINO
from codekv.backends.hf import ChunkKV, HFBackend, HFRequest, recomputed_positions

# Compile settings: f32 inference (the plugin's default on bf16-capable processors is bf16).
PRECISION = {"INFERENCE_PRECISION_HINT": "f32"}


class Forward(torch.nn.Module):
    """What the IR computes: ``input_ids`` at ``position_ids`` after the ``past`` keys and
    values (each ``[1, kv_heads, P, head_dim]``, layer by layer), each input row attending
    where ``visible`` (``[1, 1, T, P + T]``) says; the logits of the rows ``logit_rows`` and the
    new positions' keys and values (``[1, kv_heads, T, head_dim]`` each)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, position_ids, visible, logit_rows, *past):
        mask = torch.zeros(visible.shape, dtype=past[0].dtype).masked_fill(
            ~visible, torch.finfo(past[0].dtype).min)
        # The layers are filled directly: DynamicCache's own first update concatenates onto an
        # empty 1-D tensor, which OpenVINO's conversion of ``cat`` refuses.
        cache = DynamicCache(config=self.model.config)
        for i, layer in enumerate(cache.layers):
            layer.dtype, layer.device = past[2 * i].dtype, past[2 * i].device
            layer.keys, layer.values = past[2 * i], past[2 * i + 1]
            layer.is_initialized = True
        out = self.model.base_model(input_ids=input_ids, position_ids=position_ids,
                                    attention_mask=mask, past_key_values=cache, use_cache=True,
                                    cache_position=position_ids[0])
        logits = self.model.get_output_embeddings()(
            out.last_hidden_state.index_select(1, logit_rows))
        n = input_ids.shape[1]
        new = []
        for layer in out.past_key_values.layers:
            new += [layer.keys[:, :, -n:], layer.values[:, :, -n:]]
        return (logits, *new)


def export(model):
    """The IR of ``model``'s ``Forward`` (``openvino.Model``), shapes dynamic in T and P."""
    import openvino as ov

    config = model.config.get_text_config()
    layers, heads = config.num_hidden_layers, config.num_key_value_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    past, new = 3, 5
    example = [torch.zeros(1, new, dtype=torch.long), torch.arange(past, past + new)[None],
               torch.ones(1, 1, new, past + new, dtype=torch.bool),
               torch.tensor([new - 1])]
    example += [torch.zeros(1, heads, past, dim)] * (2 * layers)
    shapes = [([1, -1], ov.Type.i64), ([1, -1], ov.Type.i64), ([1, 1, -1, -1], ov.Type.boolean),
              ([-1], ov.Type.i64)] + [([1, heads, -1, dim], ov.Type.f32)] * (2 * layers)
    implementation = model.config._attn_implementation
    model.config._attn_implementation = "sdpa"
    try:
        # The tracer warns that SDPA's is_causal is fixed; a mask is always given, so it is
        # never used. PyTorch's deprecation of the tracer is not ours to act on.
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            ir = ov.convert_model(Forward(model).eval(), example_input=tuple(example),
                                  input=[(ov.PartialShape(s), t) for s, t in shapes])
    finally:
        model.config._attn_implementation = implementation
    names = ["input_ids", "position_ids", "visible", "logit_rows"]
    names += [f"past_{kind}_{i}" for i in range(layers) for kind in ("key", "value")]
    for port, name in zip(ir.inputs, names, strict=True):
        port.get_tensor().set_names({name})
    outputs = ["logits"] + [f"new_{kind}_{i}" for i in range(layers) for kind in ("key", "value")]
    for port, name in zip(ir.outputs, outputs, strict=True):
        port.get_tensor().set_names({name})
    return ir


class OpenVINOBackend(HFBackend):
    """Composition with the forward passes in OpenVINO (``compiled``: the ``Forward`` IR)."""

    def __init__(self, model, tokenizer, compiled, weights_fingerprint: str | None = None,
                 leading_ids: list[int] | None = None, runtime: str = ""):
        super().__init__(model, tokenizer, weights_fingerprint, leading_ids)
        self._request = compiled.create_infer_request()
        # The same weights' results in another runtime: evidence licenses each engine apart.
        fingerprint = hashlib.sha256(
            f"{self.info.fingerprint}:openvino:{runtime}:f32".encode()).hexdigest()[:32]
        self.info = replace(self.info, engine=OPENVINO, fingerprint=fingerprint)

    def _run(self, ids: list[int], positions: list[int], visible: np.ndarray,
             past: ChunkKV | None, logit_rows: list[int]):
        """One forward in OpenVINO: the logits of ``logit_rows`` and the new keys and values
        (``[heads, T, dim]`` per layer)."""
        n_layers = self.info.n_layers
        if past is None:
            heads, dim = self._kv_layout
            empty = np.zeros((1, heads, 0, dim), dtype=np.float32)
            keys = values = [empty] * n_layers
        else:
            keys = [k[None].numpy() for k in past.keys]
            values = [v[None].numpy() for v in past.values]
        feed = {"input_ids": np.asarray([ids], dtype=np.int64),
                "position_ids": np.asarray([positions], dtype=np.int64),
                "visible": visible[None, None], "logit_rows": np.asarray(logit_rows, np.int64)}
        for i in range(n_layers):
            feed[f"past_key_{i}"] = np.ascontiguousarray(keys[i], dtype=np.float32)
            feed[f"past_value_{i}"] = np.ascontiguousarray(values[i], dtype=np.float32)
        out = self._request.infer(feed)
        by_name = {port.get_any_name(): value for port, value in out.items()}
        logits = torch.from_numpy(np.array(by_name["logits"][0]))
        new_keys = [torch.from_numpy(np.array(by_name[f"new_key_{i}"][0]))
                    for i in range(n_layers)]
        new_values = [torch.from_numpy(np.array(by_name[f"new_value_{i}"][0]))
                      for i in range(n_layers)]
        return logits, new_keys, new_values

    @staticmethod
    def _causal(n: int, past: int = 0) -> np.ndarray:
        """``n`` rows after ``past`` cached positions, each seeing those and itself back."""
        rows = np.arange(n)[:, None]
        return np.concatenate([np.ones((n, past), dtype=bool),
                               np.arange(n)[None, :] <= rows], axis=1)

    def _cache(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> DynamicCache:
        cache = DynamicCache()
        for i, (k, v) in enumerate(zip(keys, values, strict=True)):
            cache.update(k[None], v[None], i)
        return cache

    # -- what runs in OpenVINO -------------------------------------------------------------
    @torch.inference_mode()
    def prefill_chunk(self, token_ids: list[int], prefix_ids: list[int] = (),
                      prefix_kv: ChunkKV | None = None) -> ChunkKV:
        n = len(prefix_ids)
        if prefix_kv is not None and n:
            return super().prefill_chunk(token_ids, prefix_ids, prefix_kv)  # via recompute
        ids = list(prefix_ids) + list(token_ids)
        _, keys, values = self._run(ids, list(range(len(ids))), self._causal(len(ids)), None,
                                    [len(ids) - 1])
        return ChunkKV([k[:, n:].contiguous() for k in keys],
                       [v[:, n:].contiguous() for v in values], start=n)

    @torch.inference_mode()
    def full_prefill(self, token_ids: list[int]) -> HFRequest:
        n = len(token_ids)
        logits, keys, values = self._run(list(token_ids), list(range(n)), self._causal(n),
                                         None, [n - 1])
        return HFRequest(self._cache(keys, values), list(token_ids), logits[-1].float())

    @torch.inference_mode()
    def recompute(self, context_ids: list[int], context: ChunkKV, selected: list[int],
                  query_ids: list[int]) -> HFRequest:
        """As on transformers, in one call: the selected positions and the query at their
        positions, after the reused KV of every other context position; a row sees those up to
        its own position, and the fresh positions up to its own (appended after them, in
        position order). The selected positions' stale copies are left out of the call: no
        row may see them."""
        n = len(context_ids)
        selected = recomputed_positions(context_ids, context, selected, query_ids)
        positions = np.asarray(selected + list(range(n, n + len(query_ids))), dtype=np.int64)
        stale = np.zeros(n, dtype=bool)
        stale[selected] = True
        kept = np.flatnonzero(~stale)
        rows = torch.from_numpy(kept)
        past = ChunkKV([k[:, rows] for k in context.keys], [v[:, rows] for v in context.values])
        cached = kept[None, :] <= positions[:, None]
        fresh = positions[None, :] <= positions[:, None]
        ids = [context_ids[p] for p in selected] + list(query_ids)
        logits, new_keys, new_values = self._run(
            ids, positions.tolist(), np.concatenate([cached, fresh], axis=1), past,
            [len(ids) - 1])
        index = torch.as_tensor(selected, dtype=torch.long)
        keys, values = [], []
        for old, new, out in ((context.keys, new_keys, keys), (context.values, new_values,
                                                                 values)):
            for cached_kv, fresh_kv in zip(old, new, strict=True):
                whole = torch.cat([cached_kv, fresh_kv[:, len(selected):]], dim=1)
                whole[:, index] = fresh_kv[:, :len(selected)]
                out.append(whole)
        return HFRequest(self._cache(keys, values), list(context_ids) + list(query_ids),
                         logits[-1].float())

    @torch.inference_mode()
    def extend(self, state: HFRequest, token_ids: list[int]) -> torch.Tensor:
        n, count = state.length, len(token_ids)
        layers = state.cache.layers
        past = ChunkKV([layer.keys[0] for layer in layers],
                       [layer.values[0] for layer in layers], 0)
        logits, keys, values = self._run(list(token_ids), list(range(n, n + count)),
                                         self._causal(count, n), past, list(range(count)))
        for i, (k, v) in enumerate(zip(keys, values, strict=True)):
            state.cache.update(k[None], v[None], i)
        state.token_ids.extend(token_ids)
        state.logits = logits[-1].float()
        return logits.float()
