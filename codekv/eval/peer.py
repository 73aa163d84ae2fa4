"""kvboost, a peer chunk-reuse library, on the evaluation's own token sequences.

A reference row, never a gate candidate. kvboost's ``generate`` returns text and first-token
logits only, so it is driven through the steps its ``generate`` runs (split -> assemble ->
recompute -> live prefill) with the live prefill written into a codekv request state, which
the runner then scores like every other method. A test checks this against kvboost's own
``generate`` logits.

Two variants, both warmed per task with each piece alone, untimed, as the chunk store is:
- ``kvboost``: as designed - fixed 128-token windows counted from token 0, keyed by the chain
  of windows before them, boundary tokens recomputed. Reordered pieces rarely line up with
  those windows, so it mostly behaves as an exact prefix cache.
- ``kvboost-passage``: one kvboost chunk per request piece. A piece away from its warmed
  position is a content-only match, which kvboost always repairs with its CacheBlend pass at
  the method's ratio; it does not re-position keys (RoPE).

Needs ``kvboost==0.9.0`` installed with ``--no-deps`` (its requirements would replace the pinned
transformers); the steps used are kvboost internals, hence the exact pin. ``KVBoostRunner`` is
the one adapter that touches them.
"""

from __future__ import annotations

import contextlib
import time
import warnings

import torch
from transformers import DynamicCache

from codekv.backends.hf import HFRequest
from codekv.compose import ComposeResult
from codekv.eval.methods import PEERS, Method
from codekv.request import Report

PEER = "peer"  # a result's status: neither exact-prefix nor composed by codekv
KVBOOST_VERSION = "0.9.0"
WINDOW_TOKENS = 128  # kvboost's default chunk size


def available() -> str | None:
    """None when kvboost can run, else why not."""
    try:
        from importlib import metadata

        version = metadata.version("kvboost")
    except metadata.PackageNotFoundError:
        return f"kvboost is not installed (pip install --no-deps kvboost=={KVBOOST_VERSION})"
    if version != KVBOOST_VERSION:
        return f"kvboost {version} is installed; the adapter needs {KVBOOST_VERSION}"
    return None


class Peers:
    """The peer library's variants as a ``runner.MethodRunner``, on one kvboost engine."""

    sessions = False

    def __init__(self, methods: list[Method], tasks: int | None = None):
        self.methods, self.tasks = methods, tasks
        self.engine: KVBoostRunner | None = None  # made on first use, on the task's backend

    def count(self, workload: str) -> int:
        return len(self.methods)

    def results(self, composer, task, prefix: str | None = None):
        if prefix or composer.backend.leading_ids:
            raise ValueError("the peer library is measured without a request prefix (nor a "
                             "model's leading BOS: it starts every piece without one)")
        if self.engine is None or self.engine.backend is not composer.backend:
            self.engine = KVBoostRunner(composer.backend)
        request = composer.build_request(task.context, task.query)
        pieces = [piece.ids for piece in request.pieces]
        for method in self.methods:
            yield method, self.engine.run(pieces, request.query_ids, method.strategy,
                                          method.ratio)


class KVBoostRunner:
    """One kvboost engine on the backend's model, reset for every task.

    The adapter to kvboost's internals, written against kvboost 0.9.0 (``KVBOOST_VERSION``;
    ``available`` refuses any other version): its ``generate`` returns no request state, so
    the steps it runs are called one by one. Every use of a private kvboost name is in the
    methods under "kvboost 0.9.0 internals" below, and nowhere else in codekv.
    """

    def __init__(self, backend):
        reason = available()
        if reason:
            raise RuntimeError(reason)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its import warns about a deprecated torch API
            from kvboost import KVBoost

        self.backend = backend
        self.engine = KVBoost(model=backend.model, tokenizer=backend.tokenizer,
                              max_cache_bytes=4 * 2**30, chunk_size=WINDOW_TOKENS,
                              recompute_strategy="selective", device=str(backend.device))
        self._fixed_split = self.engine._split_tokens

    def run(self, pieces: list[list[int]], query_ids: list[int], variant: str,
            ratio: float) -> ComposeResult:
        """The request state kvboost builds for ``pieces + query`` (all token ids)."""
        if variant not in PEERS:
            raise ValueError(f"unknown kvboost variant {variant!r}; one of {PEERS}")
        self.engine.reset_cache()
        context_ids = [t for piece in pieces for t in piece]
        ids = context_ids + list(query_ids)
        with self._splits(pieces, variant):
            for piece in pieces:  # warm, untimed: each piece alone at position 0
                self._warm(piece)
            started = time.perf_counter()
            assembled = self._assemble(ids, ratio)
            state = self._live_prefill(ids, assembled)
            seconds = time.perf_counter() - started
        reused = assembled.cached_length
        report = Report(status=PEER, strategy=variant, ratio=ratio, total_tokens=len(ids),
                        context_tokens=len(context_ids), query_tokens=len(query_ids),
                        reused_tokens=min(reused, len(context_ids)),
                        recomputed_tokens=max(0, len(context_ids) - reused), ttft_s=seconds)
        report.recompute_ratio = report.recomputed_tokens / max(1, len(context_ids))
        return ComposeResult(PEER, report, state, self.backend)

    # -- kvboost 0.9.0 internals ---------------------------------------------------------------
    def _warm(self, piece: list[int]) -> None:
        """Cache ``piece``'s chunks as kvboost's ``warm`` does, from token ids."""
        self.engine._store_prompt_chunks(piece)

    def _assemble(self, ids: list[int], ratio: float):
        """The cached KV kvboost assembles for ``ids``, repaired as its ``generate`` does."""
        engine = self.engine
        engine.cacheblend_recompute.recompute_ratio = ratio
        assembled = engine.assembler.assemble(ids, chunk_splits=engine._split_tokens(ids))
        if len(assembled.chunk_boundaries) > 1:  # the branch of kvboost's generate
            recompute = (engine.cacheblend_recompute if assembled.has_approximate
                         else engine.selective_recompute)
            assembled = recompute.apply(assembled, engine.model)
        return assembled

    @contextlib.contextmanager
    def _splits(self, pieces: list[list[int]], variant: str):
        """``kvboost-passage``: kvboost splits the request at the pieces, and a piece alone
        into itself; ``kvboost`` keeps its own fixed windows. The engine's own split is put
        back on the way out, also on an error."""
        if variant == "kvboost":
            yield
            return
        spans, start = [], 0
        for piece in pieces:
            spans.append((start, start + len(piece), list(piece)))
            start += len(piece)
        context = [t for piece in pieces for t in piece]

        def split(token_ids, text=""):
            if list(token_ids[: len(context)]) == context:
                tail = list(token_ids[len(context):])
                return spans + ([(start, start + len(tail), tail)] if tail else [])
            return [(0, len(token_ids), list(token_ids))]

        self.engine._split_tokens = split
        try:
            yield
        finally:
            self.engine._split_tokens = self._fixed_split

    @torch.inference_mode()
    def _live_prefill(self, ids: list[int], assembled) -> HFRequest:
        """Prefill what kvboost did not reuse on top of what it assembled."""
        model = self.engine.model
        cache = DynamicCache(config=model.config)
        for layer, (key, value) in enumerate(assembled.cached_past_kv or ()):
            cache.update(key.to(self.backend.device), value.to(self.backend.device), layer)
        n = min(assembled.cached_length, len(ids) - 1)  # the last token makes the logits
        cache.crop(n)
        out = model(input_ids=torch.tensor([ids[n:]], device=self.backend.device),
                    position_ids=torch.arange(n, len(ids), device=self.backend.device)[None],
                    past_key_values=cache, use_cache=True, logits_to_keep=1)
        return HFRequest(cache, list(ids), out.logits[0, -1].float())
