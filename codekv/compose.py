"""``Composer``: build a request's KV state from cached chunk KV instead of a full prefill.

Per request: an optional exact prefix (served by an exact-prefix cache with its own keys and
counters), an ordered list of chunks (code chunks from the index, or free text passages and
tool docs), and the query. Each chunk's KV comes from the chunk KV cache
(``codekv.chunk_cache``: the store's, computed and stored on a miss), re-positioned to its
offset, and ``compose_state`` - the one composition, which ``codekv serve`` calls too - has a
rule recompute a selected set of tokens with the query against the whole context. The result
is committed into a fresh request state only when every step succeeded. Cached entries are
never mutated. The result says what it is (``codekv.request``): ``exact-prefix``,
``composed`` or ``full-prefill`` - a composed state is never an exact hit.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from codekv.backends import Backend, ModelInfo, RequestState, UnsupportedModel, rule_refusal
from codekv.chunk_cache import ChunkCache
from codekv.chunks import Chunk
from codekv.conditioning import DEFAULT_CONDITIONING, GRAPH_TOKENS
from codekv.conditioning import checked as checked_conditioning
from codekv.gate import GateRequest, SupportGate, Verdict
from codekv.request import (
    COMPOSED,
    EXACT_PREFIX,
    FULL_PREFILL,
    Counters,
    Passage,
    Report,
    Request,
    RequestPiece,
)
from codekv.schema import STORE, ChunkKind, workload_of
from codekv.selection import Segment, SelectionContext, Strategy, TokenAnchor
from codekv.selection import strategy as make_strategy
from codekv.stores import default_kv_store, default_scope, open_kv_store
from codekv.stores.base import KVStore
from codekv.stores.entry import token_hash

if TYPE_CHECKING:
    import torch

__all__ = ["AUTO", "COMPOSED", "EXACT_PREFIX", "FULL_PREFILL", "ChunkTooLongError",
           "ComposeResult", "Composer", "Passage", "Report", "compose_state"]

# ``compose(strategy=AUTO)``: the rule the support file records as passing for the workload.
# Where none passed (the request then falls back, unless experimental), the default rule:
# the best measured one the engine can run (docs/results.md: query has the lowest |dNLL| at
# every ratio and workload; where an engine cannot score the query's attention, boundary,
# which anchors never beat).
AUTO = "auto"
DEFAULT_STRATEGIES, DEFAULT_RATIO = ("query", "boundary"), 0.15
ANCHOR_TOKENS = 8  # an anchor contributes at most its first tokens (a branch spans a block)
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
NEIGHBOUR_CACHE = 4096  # definitions whose tokens graph conditioning keeps in memory


class ChunkTooLongError(ValueError):
    """A chunk longer than the model's positions: no request could use its KV."""


@dataclass
class ComposeResult:
    status: str
    report: Report
    state: RequestState
    backend: Backend = field(repr=False)

    @property
    def token_ids(self) -> list[int]:
        return self.state.token_ids

    def next_token_logits(self) -> torch.Tensor:
        return self.state.logits

    def generate(self, max_new_tokens: int = 64) -> str:
        return self.backend.detokenize(self.backend.generate(self.state, max_new_tokens))

    def score(self, target: str) -> float:
        """Mean NLL (nats/token) of ``target`` following the request."""
        return self.backend.score(self.state, self.backend.tokenize(target))


class ExactPrefixCache:
    """Exact-prefix KV keyed by the hash of the prefix's token ids (plus model and tokenizer).

    Its own namespace: composed states never populate or answer it. Entries are the
    backend's own chunk KV.
    """

    def __init__(self, max_entries: int = 16):
        self.entries: OrderedDict[str, object] = OrderedDict()
        self.max_entries = max_entries

    @staticmethod
    def key(model: str, tokenizer: str, token_ids: list[int]) -> str:
        return hashlib.sha256(f"{model}:{tokenizer}:{token_hash(token_ids)}".encode()).hexdigest()

    def get(self, key: str):
        kv = self.entries.get(key)
        if kv is not None:
            self.entries.move_to_end(key)
        return kv

    def put(self, key: str, kv) -> None:
        self.entries[key] = kv
        self.entries.move_to_end(key)
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)


class Composer:
    """Composes requests for one backend; agents call ``compose`` once per task.

    ``conditioning`` says what each chunk's KV is computed after (``codekv.conditioning``):
    ``"prefix"`` (default), ``"none"`` or ``"graph"``, each stored apart. Under ``"graph"`` a
    code chunk is computed after the prefix and the definitions it uses (up to
    ``graph_tokens``); passages have no graph and are computed after the prefix. "Alone"
    (``"none"``) is after the model's leading tokens (a BOS) where it has them.
    """

    def __init__(
        self,
        backend: Backend,
        index=None,
        store: KVStore | str | Path | None = None,
        scope: str | None = None,
        gate: SupportGate | None = None,
        experimental: bool = False,
        conditioning: str = DEFAULT_CONDITIONING,
        graph_tokens: int = GRAPH_TOKENS,
        holder: str | None = None,
    ):
        self.backend = backend
        self.index = index
        if isinstance(store, str | Path):
            store = open_kv_store(store)
        self.counters = Counters()
        # The claim on the scope names this home ``holder``; default: the index's home's.
        self.chunks = ChunkCache(backend, store or default_kv_store(),
                                 scope or default_scope(index), self.counters, holder,
                                 index.store_dir if index is not None else None)
        self.gate = gate or SupportGate.load()
        self.experimental = experimental
        self.conditioning = checked_conditioning(conditioning)
        self.graph_tokens = graph_tokens
        self._neighbours: OrderedDict[str, list[int]] = OrderedDict()  # neighbour tokens
        self.prefix_cache = ExactPrefixCache()

    @property
    def store(self) -> KVStore:
        return self.chunks.store

    @property
    def scope(self) -> str:
        return self.chunks.scope

    # -- public API ----------------------------------------------------------------------
    def compose(
        self,
        chunks: list,
        query: str,
        prefix: str | None = None,
        strategy: str = AUTO,
        ratio: float | None = None,
        max_new_tokens: int = 0,
        conditioning: str | None = None,
    ) -> ComposeResult:
        """Build the request state for ``prefix + chunks + query``.

        ``chunks`` holds ``Chunk`` objects, chunk ids, ``"path"`` / ``"path::qualname"``
        strings (these need an index) or ``Passage`` objects, in request order.
        ``strategy="auto"`` takes the rule and ratio the support file records as passing for
        the request's workloads (``ratio`` must then be None); a named strategy recomputes
        ``ratio`` of the chunk tokens (default ``DEFAULT_RATIO``). ``conditioning`` overrides
        the composer's for this request.
        """
        started = time.perf_counter()
        if not (isinstance(max_new_tokens, int) and max_new_tokens >= 0):
            raise ValueError(f"max_new_tokens must be a count of tokens from 0, not "
                             f"{max_new_tokens!r}")
        if strategy == AUTO and ratio is not None:
            raise ValueError("strategy 'auto' takes its ratio from the support file: name a "
                             "strategy to choose the ratio")
        if strategy != AUTO:
            ratio = DEFAULT_RATIO if ratio is None else ratio
            if not (isinstance(ratio, int | float) and math.isfinite(ratio) and 0 <= ratio <= 1):
                raise ValueError(f"ratio must be a number from 0 to 1, not {ratio!r}")
            make_strategy(strategy)  # an unknown name fails before any work
        if conditioning is not None:
            checked_conditioning(conditioning)
        request = self.build_request(chunks, query, prefix)
        prefix_ids, pieces, query_ids = request.prefix_ids, request.pieces, request.query_ids
        if strategy == AUTO:
            strategy, ratio, evidenced = self._supported_rule(request)
            conditioning = conditioning or evidenced
        conditioning = conditioning or self.conditioning
        self.chunks.claim()
        report = Report(strategy=strategy, ratio=ratio, conditioning=conditioning)
        selection = make_strategy(strategy)
        context_ids = request.context_ids
        report.prefix_tokens = len(prefix_ids)
        report.context_tokens = len(context_ids)
        report.query_tokens = len(query_ids)
        report.total_tokens = len(context_ids) + len(query_ids)
        limit = self.backend.info.max_positions
        if not report.total_tokens:
            raise ValueError("empty request: no prefix, chunk or query tokens")
        if report.total_tokens + max_new_tokens > limit:
            raise ValueError(
                f"request of {report.total_tokens} tokens (+{max_new_tokens} to generate) exceeds "
                f"the model's {limit} positions"
            )
        # A query alone (after the model's leading tokens at most) has no cached KV to reuse:
        # its full prefill is the answer.
        reason = (self._refusal(request, selection)
                  if len(context_ids) > len(self.backend.leading_ids)
                  else "no context: only a query")
        if reason is None:
            try:
                state = self._compose(prefix_ids, pieces, query_ids, selection, ratio, report,
                                      frozenset(IDENTIFIER.findall(query)), conditioning)
            except (UnsupportedModel, RuntimeError, ValueError) as error:
                reason = f"composition failed: {error}"
            else:
                report.status = COMPOSED if pieces else EXACT_PREFIX
                if pieces:
                    self.counters.composed += 1
                return self._finish(state, report, started)
        # Fallback: full prefill of exactly the same tokens, with the reason (and no rule).
        report.fallback_reason = reason
        report.strategy = report.ratio = report.conditioning = None
        self.counters.full_prefill += 1
        key = reason.split(":")[0]
        self.counters.fallbacks[key] = self.counters.fallbacks.get(key, 0) + 1
        report.reused_tokens = 0
        report.recomputed_tokens = len(context_ids)
        report.recompute_ratio = report.recompute_attention = 1.0 if context_ids else 0.0
        t0 = time.perf_counter()
        state = self.backend.full_prefill(context_ids + query_ids)
        report.timings["full_prefill"] = time.perf_counter() - t0
        report.status = FULL_PREFILL
        return self._finish(state, report, started)

    def full_prefill(self, chunks: list, query: str, prefix: str | None = None) -> ComposeResult:
        """The reference: full prefill of the same token sequence ``compose`` would build."""
        started = time.perf_counter()
        request = self.build_request(chunks, query, prefix)
        ids = request.context_ids
        report = Report(
            status=FULL_PREFILL, total_tokens=len(request.token_ids),
            context_tokens=len(ids), query_tokens=len(request.query_ids),
            prefix_tokens=len(request.prefix_ids), recomputed_tokens=len(ids),
            recompute_ratio=1.0 if ids else 0.0, recompute_attention=1.0 if ids else 0.0,
        )
        state = self.backend.full_prefill(request.token_ids)
        return self._finish(state, report, started)

    def prefill(self, chunks: list, prefix: str | None = None,
                conditioning: str | None = None) -> tuple[int, int]:
        """Fill the chunk store (for requests with ``prefix``, under ``conditioning``, default
        the composer's); returns (computed, cached).

        A chunk longer than the model's positions (after the prefix) is refused before any is
        computed (``ChunkTooLongError``): no request could ever use its KV.
        """
        conditioning = checked_conditioning(conditioning or self.conditioning)
        request = self.build_request(chunks, prefix=prefix)
        prefix_ids = (request.prefix_ids if conditioning != "none"
                      else list(self.backend.leading_ids))
        pieces = request.pieces
        limit = self.backend.info.max_positions
        for piece in pieces:
            if len(prefix_ids) + len(piece.ids) > limit:
                what = piece.provenance.get("path") or piece.provenance.get("kind", "passage")
                name = piece.provenance.get("name")
                raise ChunkTooLongError(
                    f"{what}{f' {name!r}' if name else ''} is {len(piece.ids)} tokens"
                    f"{f' after a {len(prefix_ids)}-token prefix' if prefix_ids else ''}: more "
                    f"than the model's {limit} positions, so no request could use its KV"
                )
        self.chunks.claim()
        computed = cached = 0
        for piece in pieces:
            after = self._after(piece, prefix_ids, conditioning)
            if self.store.contains(self.chunks.key(piece, after)):
                cached += 1
                continue
            self.chunks.kv(piece, after)
            computed += 1
        return computed, cached

    def build_request(self, chunks: list, query: str = "", prefix: str | None = None
                      ) -> Request:
        """The request ``prefix + chunks + query`` tokenized, each chunk with its identity and
        anchors: what ``compose``, ``full_prefill`` and ``prefill`` run on (``chunks`` as for
        ``compose``)."""
        prefix_ids = list(self.backend.leading_ids)  # a BOS, where the model starts with one
        prefix_ids += self.backend.tokenize(prefix) if prefix else []
        query_ids = self.backend.tokenize(query) if query else []
        return Request(prefix_ids, [self._piece(item) for item in chunks], query_ids)

    # -- steps ---------------------------------------------------------------------------
    def _supported_rule(self, request: Request) -> tuple[str, float, str | None]:
        """The rule, ratio and conditioning the support file records for the request's
        workloads; where one has none, the default rule (the gate then refuses unless
        ``experimental``). Several workloads that passed with different rules take the one
        recomputing most."""
        verdicts = self._verdicts(request)
        every = all(v.allowed and v.strategy for v in verdicts)
        return supported_rule(self.backend, verdicts if every else [])

    def _refusal(self, request: Request, selection) -> str | None:
        info = self.backend.info
        if info.unsupported:
            return f"unsupported: {info.unsupported}"
        refusal = rule_refusal(self.backend, selection)
        if refusal:
            return f"unsupported: strategy {selection.name}: {refusal}"
        if self.experimental or not request.pieces:
            return None
        for verdict in self._verdicts(request):
            if not verdict.allowed:
                return verdict.reason
        return None

    def _verdicts(self, request: Request) -> list:
        """The gate's verdict for each workload the request's chunks belong to, for this model,
        the languages of its code chunks and its context length."""
        languages = frozenset(p.chunk.language for p in request.pieces if p.chunk is not None)
        return [licence(self.gate, self.backend.info, kind, languages, len(request.context_ids))
                for kind in sorted({p.kind for p in request.pieces}, key=workload_of)]

    def _compose(self, prefix_ids, pieces, query_ids, selection, ratio, report: Report,
                 query_names: frozenset[str] = frozenset(),
                 conditioning: str = DEFAULT_CONDITIONING):
        timings = report.timings
        t0 = time.perf_counter()
        parts = []
        if prefix_ids:
            key = ExactPrefixCache.key(
                self.backend.info.fingerprint, self.backend.info.tokenizer_fingerprint, prefix_ids
            )
            prefix_kv = self.prefix_cache.get(key)
            report.exact_prefix_hit = prefix_kv is not None
            if prefix_kv is None:
                self.counters.exact_prefix_misses += 1
                prefix_kv = self.backend.prefill_chunk(prefix_ids)
                self.prefix_cache.put(key, prefix_kv)
            else:
                self.counters.exact_prefix_hits += 1
            parts.append(prefix_kv)
        timings["exact_prefix"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        cached = []
        for piece in pieces:
            after = self._after(piece, prefix_ids, conditioning)
            known = parts[0] if prefix_ids and after == prefix_ids else None  # not again
            kv, hit = self.chunks.kv(piece, after, report, known)
            report.chunk_hits += hit
            report.chunk_misses += not hit
            report.store_hits += hit
            report.store_misses += not hit
            cached.append(kv)
        timings["store_load"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        segments = []
        offset = len(prefix_ids)
        for piece, kv in zip(pieces, cached):
            parts.append(self.backend.reposition(kv, offset) if selection.reposition else kv)
            segments.append(Segment(offset, len(piece.ids), piece.chunk_id, piece.anchors))
            offset += len(piece.ids)
        timings["reposition"] = time.perf_counter() - t0
        context_ids = prefix_ids + [t for p in pieces for t in p.ids]
        state, selected = compose_state(
            self.backend, context_ids, parts, segments, query_ids, selection, ratio,
            prefix_length=len(prefix_ids), query_names=query_names, timings=timings)
        n_chunk_tokens = len(context_ids) - len(prefix_ids)
        report.recomputed_tokens = len(selected)
        report.reused_tokens = n_chunk_tokens - len(selected)
        report.recompute_ratio = len(selected) / n_chunk_tokens if n_chunk_tokens else 0.0
        n = len(context_ids)
        report.recompute_attention = (sum(p + 1 for p in selected) / (n * (n + 1) / 2)
                                      if n else 0.0)
        return state

    def _finish(self, state, report: Report, started: float) -> ComposeResult:
        report.ttft_s = time.perf_counter() - started
        report.store = self.store.location
        report.store_error = self.store.error
        report.timings = {k: round(v, 4) for k, v in report.timings.items()}
        return ComposeResult(report.status, report, state, self.backend)

    def _after(self, piece: RequestPiece, prefix_ids: list[int], conditioning: str) -> list[int]:
        """The tokens a chunk's KV is computed after, under ``conditioning``."""
        if conditioning == "none":  # alone: after nothing but the model's leading tokens
            return list(self.backend.leading_ids)
        if conditioning == "prefix" or piece.chunk is None or self.index is None:
            return prefix_ids
        room = self.backend.info.max_positions - len(prefix_ids) - len(piece.ids)
        return prefix_ids + self._neighbour_ids(piece.chunk, min(self.graph_tokens, room))

    def _neighbour_ids(self, chunk: Chunk, budget: int) -> list[int]:
        """The definitions ``chunk`` uses (as the index has them now), rendered as request
        chunks, most-used first (then first used), whole chunks only, at most ``budget``
        tokens together."""
        first_use: dict[str, int] = {}
        uses: dict[str, int] = {}
        for use in self.index.uses(chunk):
            first_use.setdefault(use.target, use.start_byte)
            uses[use.target] = uses.get(use.target, 0) + 1
        ids: list[int] = []
        for neighbour in sorted(self.index.depends_on(chunk),
                                key=lambda c: (-uses.get(c.id, 0), first_use.get(c.id, 0))):
            tokens = self._neighbour_tokens(neighbour)
            if len(ids) + len(tokens) <= budget:
                ids += tokens
        return ids

    def _neighbour_tokens(self, chunk: Chunk) -> list[int]:
        """A neighbour's tokens, kept by its blob and span (what its text is made of)."""
        key = f"{chunk.blob_hash}:{chunk.start_byte}:{chunk.end_byte}:{chunk.path}"
        tokens = self._neighbours.get(key)
        if tokens is None:
            tokens = self._neighbours[key] = self.backend.tokenize(self._code_text(chunk))
            while len(self._neighbours) > NEIGHBOUR_CACHE:
                self._neighbours.popitem(last=False)
        self._neighbours.move_to_end(key)
        return tokens

    # -- request pieces ------------------------------------------------------------------
    def _piece(self, item) -> RequestPiece:
        if isinstance(item, Passage):
            text = item.text if item.text.endswith("\n") else item.text + "\n"
            ids = self.backend.tokenize(text + "\n")
            identity = "text:" + hashlib.sha256(text.encode()).hexdigest()
            return RequestPiece(ids, identity, ChunkKind(item.kind), None, [],
                                {"kind": item.kind, "name": item.name})
        chunk = self._resolve_chunk(item)
        return self._code_piece(chunk)

    def _resolve_chunk(self, item) -> Chunk:
        if isinstance(item, Chunk):
            return item
        if self.index is None:
            raise ValueError(f"chunk {item!r} needs an index to resolve")
        return self.index.resolve(item)

    def _code(self, chunk: Chunk) -> bytes:
        code = self.index.text(chunk) if self.index is not None else None
        if code is None:
            raise ValueError(f"chunk {chunk.id} has no text source")
        return code

    def _code_text(self, chunk: Chunk, code: bytes | None = None) -> str:
        """How a code chunk reads in a request: a path header, then its code."""
        code = self._code(chunk) if code is None else code
        return f"# {chunk.path}\n" + code.decode("utf-8", "replace") + "\n\n"

    def _code_piece(self, chunk: Chunk) -> RequestPiece:
        header = f"# {chunk.path}\n"
        code = self._code(chunk)
        ids, offsets = self.backend.tokenize_with_offsets(self._code_text(chunk, code))
        anchors = []
        char_at = _byte_to_char(code)
        for anchor in self.index.anchors(chunk):
            start = len(header) + char_at(anchor.start_byte - chunk.start_byte)
            end = len(header) + char_at(anchor.end_byte - chunk.start_byte)
            tokens = _tokens_in(offsets, start, end)
            if tokens:
                first, last = tokens
                anchors.append(TokenAnchor(anchor.kind, anchor.name, first,
                                           min(last, first + ANCHOR_TOKENS), anchor.target))
        identity = f"chunk:{chunk.blob_hash}:{chunk.start_byte}:{chunk.end_byte}:{chunk.path}"
        provenance = {"kind": "code", "repository": getattr(self.index, "root", None),
                      "path": chunk.path, "blob": chunk.blob_hash, "chunk": chunk.id,
                      "name": chunk.qualname}
        return RequestPiece(ids, identity, ChunkKind.CODE, chunk.id, anchors, provenance, chunk)


def compose_state(backend: Backend, context_ids: list[int], parts: list, segments: list[Segment],
                  query_ids: list[int], selection: Strategy, ratio: float, *,
                  prefix_length: int, query_names: frozenset[str] = frozenset(),
                  in_place: Iterable[int] = (), placeholders: list[int] = (),
                  probe_tokens: int | None = None, timings: dict[str, float] | None = None
                  ) -> tuple[RequestState, list[int]]:
    """The one composition, for ``Composer``, the server and the evaluation alike: the request
    state of ``context_ids + query_ids`` from ``parts``, the context's KV in order, each part
    at its positions (an exact prefix, re-positioned reused ``segments``, text held in place).
    The rule ``selection`` chooses ``ratio`` of the segments' tokens to recompute against the
    whole context, never one before ``prefix_length`` (exact); the positions ``in_place``
    (text no cache held) are computed whatever it chooses, the query after them. Returns the
    state and the positions the rule chose, sorted.

    The query's probe (query-aware rules) reads at most its last ``probe_tokens`` tokens and
    ignores ``placeholders``, positions whose KV stands for text not computed yet. ``timings``
    receives the steps' seconds."""
    timings = {} if timings is None else timings
    t0 = time.perf_counter()
    context = backend.concat(parts)
    timings["reposition"] = timings.get("reposition", 0.0) + time.perf_counter() - t0
    deviation_cache: list[torch.Tensor] = []

    def deviation() -> torch.Tensor:
        if not deviation_cache:
            t = time.perf_counter()
            deviation_cache.append(backend.kv_deviation(context_ids, context))
            timings["deviation"] = time.perf_counter() - t
        return deviation_cache[0]

    relevance_cache: list[torch.Tensor] = []

    def relevance() -> torch.Tensor:
        if not relevance_cache:
            t = time.perf_counter()
            probe = query_ids if probe_tokens is None else query_ids[-probe_tokens:]
            relevance_cache.append(backend.query_relevance(
                context, probe, query_probe_layers(backend.info.n_layers, selection.deep_probe),
                placeholders))
            timings["relevance"] = time.perf_counter() - t
        return relevance_cache[0]

    selection_context = SelectionContext(
        len(context_ids), prefix_length, segments,
        round(ratio * sum(s.length for s in segments)), deviation, query_names,
        relevance if query_ids else None, backend.info.key_cost,
    )
    t0 = time.perf_counter()
    inside = {p for s in segments for p in range(s.start, s.end)}
    chosen = sorted(set(selection.select(selection_context)) & inside)
    timings["select"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    state = backend.recompute(context_ids, context, sorted(set(in_place) | set(chosen)),
                              query_ids)
    timings["recompute"] = time.perf_counter() - t0
    return state, chosen


def licence(gate: SupportGate, info: ModelInfo, kind: ChunkKind, languages: frozenset[str],
            context_tokens: int, source: str = STORE) -> Verdict:
    """The gate's verdict on composing chunks of ``kind`` (of ``languages``, in a context of
    ``context_tokens``) whose KV came from ``source``, for this model on its engine: by the
    evidence of the workload that measured them."""
    asked = GateRequest(info.fingerprint, languages, context_tokens)
    return gate.verdict(info.family, workload_of(kind, source), info.engine, asked)


def supported_rule(backend: Backend, verdicts: list[Verdict]) -> tuple[str, float, str | None]:
    """The rule, ratio and conditioning of the passing ``verdicts`` (several that name
    different rules: the one recomputing most); where none passed, the default rule, which
    the gate refuses unless the request is experimental."""
    allowed = [v for v in verdicts if v.allowed and v.strategy]
    if not allowed:
        return default_rule(backend), DEFAULT_RATIO, None
    chosen = recomputing_most(allowed)
    return chosen.strategy, chosen.ratio or 0.0, chosen.conditioning


def default_rule(backend: Backend) -> str:
    """The first of ``DEFAULT_STRATEGIES`` the backend can run: what an experimental request
    composes with where no evidence passed."""
    runnable = (name for name in DEFAULT_STRATEGIES
                if rule_refusal(backend, make_strategy(name)) is None)
    return next(runnable, DEFAULT_STRATEGIES[-1])


def recomputing_most(verdicts: list[Verdict]) -> Verdict:
    """Of passing verdicts that name different rules, the one that recomputes most."""
    return max(verdicts, key=lambda v: (v.ratio or 0.0, v.strategy))


def query_probe_layers(n_layers: int, deep: bool = False) -> tuple[int, ...]:
    """Where query-aware rules read the query's attention: every layer of the first half, or
    every layer (``deep``)."""
    return tuple(range(n_layers if deep else max(1, n_layers // 2)))


def _byte_to_char(data: bytes):
    """Byte offset -> character offset in ``data`` decoded as UTF-8 (identity for ASCII)."""
    if data.isascii():
        return lambda offset: offset
    return lambda offset: len(data[:offset].decode("utf-8", "replace"))


def _tokens_in(offsets: list[tuple[int, int]], start: int, end: int) -> tuple[int, int] | None:
    """The [first, last) token indices overlapping characters [start, end)."""
    first = last = None
    for index, (a, b) in enumerate(offsets):
        if b > start and a < end:
            if first is None:
                first = index
            last = index + 1
        elif a >= end:
            break
    return (first, last) if first is not None else None
