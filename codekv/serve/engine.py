"""The server's request pipeline (``Pipeline``), and the worker thread that serves it one
request at a time (``Engine``).

A request's prompt is rendered (the model's own chat template) and tokenized, then built in
three parts, each counted apart:

1. the exact prefix: the longest common token prefix with a recent prompt of the same scope
   (``codekv.serve.prefix``), its KV used as it is;
2. after it, up to the last segment reused: segments whose KV the scope's last prompt
   (``codekv.serve.recent``, computed in place there) or else the chunk store (computed alone)
   holds, and the unchanged head and tail of a segment that changed since the last prompt, are
   composed (re-positioned, a share of their tokens recomputed by the rule) where the gate
   licenses their class from that source (or every class with ``experimental``): the last
   prompt's by the agent-session evidence, its parts' by the agent-session-text-parts evidence
   (a message's text) or the agent-session-parts evidence (a piece of code), the store's by
   the workload of their kind; so is a run of the text between segments (message framing,
   short messages) found in the last prompt, by the agent-session-runs evidence;
   every other token there (message headers, new or unlicensed segments) is computed in place,
   against the whole context, exactly as a full prefill would;
3. the rest is prefilled after it.

New segments of a licensed class are stored for next time (computed after what their key says)
once the reply is done. Only KV that is exact (a full prefill's, an exact prefix's, a composed
request's tokens before its first reused segment) enters the exact-prefix cache.

``reuse`` selects what a request may reuse: ``compose`` (the above), ``exact-only`` (part 1 alone,
as llama-server without ``--cache-reuse``) or ``shift-only`` (``codekv.serve.shift``: the
previous prompt's runs shifted into place, as llama-server's ``--cache-reuse``): the baselines
``benchmarks/bench_serve.py`` measures composition against.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from codekv.backends import rule_refusal
from codekv.chunk_cache import ChunkCache
from codekv.compose import AUTO, DEFAULT_RATIO, compose_state, licence, supported_rule
from codekv.gate import SupportGate
from codekv.request import COMPOSED, EXACT_PREFIX, FULL_PREFILL, RequestPiece
from codekv.schema import (
    FROM_LAST_PROMPT,
    LAST_PROMPT,
    LAST_PROMPT_RUN,
    PARTS,
    SOURCES,
    STORE,
    ChunkKind,
    part_source,
)
from codekv.selection import Segment as SelectionSegment
from codekv.selection import strategy as make_strategy
from codekv.serve import COMPOSE, REUSE_MODES, SHIFT_ONLY
from codekv.serve import segments as seg
from codekv.serve.prompt_cache import prompt_cache
from codekv.serve.recent import RecentPrompts, gaps
from codekv.serve.shift import ShiftSlots

log = logging.getLogger("codekv.serve")
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The query-aware rules' probe reads the attention of at most this many of the prompt's last
# tokens: the longest question the evidence's tasks had (``EvalConfig.max_query_tokens``). The
# rest of an agent's prompt after its last reused segment can be thousands of tokens, and the
# probe materialises the attention of every row it reads. The tail is read right after the
# reused context, as the evidence's questions were; the request itself is computed in place.
PROBE_TOKENS = 256


class RequestError(Exception):
    """A request the server refuses: an HTTP status and an OpenAI error's fields."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (
            status, message, param, code, kind)


def internal(error: BaseException) -> RequestError:
    """An unexpected failure as the client sees it: its type, never its text or traceback
    (the log has both)."""
    return RequestError(500, f"internal error: {type(error).__name__}", kind="server_error")


@dataclass
class Prompt:
    """What a request asks the model to continue: the rendered text, the message contents and
    tool descriptions in it, the characters of its leading system message and the spans of
    the template's markers (the only text read as special tokens)."""

    text: str
    contents: list[str]
    tool_docs: list[str] = field(default_factory=list)
    system_end: int = 0  # characters [0, system_end) hold the leading system message
    markers: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class Sampling:
    max_tokens: int | None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)


@dataclass
class Outcome:
    """What happened to a request's prompt: the ``codekv`` object of a response."""

    status: str = FULL_PREFILL
    prompt_tokens: int = 0
    exact_prefix_tokens: int = 0
    reused_tokens: int = 0  # served from the chunk store or the last prompt, not recomputed
    recomputed_tokens: int = 0  # reused segments' tokens the rule recomputed
    prefilled_tokens: int = 0  # computed fresh: never reused
    strategy: str | None = None
    ratio: float | None = None
    fallback_reason: str | None = None
    ttft_s: float = 0.0
    queue_s: float = 0.0
    segments: int = 0  # reusable segments found after the exact prefix
    segments_reused: int = 0
    segments_from_last_prompt: int = 0  # of those, taken from the scope's last prompt
    parts_from_last_prompt: int = 0  # of those, the unchanged head or tail of a changed segment
    runs_from_last_prompt: int = 0  # of those, a run of the text between segments
    segments_stored: int = 0
    stored_tokens: int = 0  # tokens run to store them: each after what its key says
    store_error: str | None = None
    # With a forced continuation: each of its tokens' NLL (nats) after the prompt's state.
    continuation_nll: list[float] | None = None

    def as_json(self) -> dict:
        data = dict(self.__dict__)
        data["ttft_s"] = round(self.ttft_s, 4)
        data["queue_s"] = round(self.queue_s, 4)
        if self.continuation_nll is None:
            del data["continuation_nll"]
        return data


@dataclass(frozen=True)
class Prefilled:
    """The prompt is served (its reply's tokens follow): how."""

    outcome: Outcome


@dataclass(frozen=True)
class Partial:
    """The reply's next text."""

    text: str


@dataclass(frozen=True)
class Final:
    """The reply is done: why, and its tokens (``finish_reason`` ``cancelled``: its client
    left)."""

    finish_reason: str
    completion_tokens: int


@dataclass(frozen=True)
class Failed:
    """The request failed; after ``Prefilled`` its stream has started."""

    error: RequestError


Event = Prefilled | Partial | Final | Failed


@dataclass
class Job:
    """One request for the worker; ``emit`` receives its events, from the worker's thread:
    ``Prefilled``, then ``Partial`` text, then ``Final``; or ``Failed`` at any point. Once
    ``cancelled`` is set (its client left) it is dropped before its prefill, or stops between
    two decode steps."""

    scope: str
    prompt: Callable[[], Prompt]
    sampling: Sampling
    emit: Callable[[Event], None]
    chat: bool = True
    continuation: str | None = None  # text to force as the reply, scoring each token
    cancelled: threading.Event = field(default_factory=threading.Event)
    queued_at: float = field(default_factory=time.perf_counter)


class QueueFull(Exception):
    pass


@dataclass
class Served:
    """A prompt's request state as the pipeline built it, and what it leaves for later ones
    (``Pipeline.done``)."""

    ids: list[int]
    segments: list[seg.Segment]
    state: object
    outcome: Outcome
    pending: list  # (piece, after, after_kv): segments to store once the reply is out


class Pipeline:
    """The warm model, the chunk store and the gate: how a prompt's request state is built,
    and what it leaves for the next prompt of its scope. No thread of its own: the server's
    worker (``Engine``) and the agent-session evaluation (``codekv.eval.serving``) serve
    prompts through it, so the evidence measures the server's own path.

    ``sources``: where reused segments' KV may come from, the scope's last prompt
    (``LAST_PROMPT``, the unchanged parts of its segments: ``PARTS``, and runs of the text
    between them: ``LAST_PROMPT_RUN``) or the chunk store (``STORE``); the gate rules on each
    apart."""

    def __init__(self, backend, store, gate: SupportGate, *, experimental: bool = False,
                 strategy: str = AUTO, ratio: float | None = None,
                 min_segment_tokens: int = seg.MIN_TOKENS,
                 known_code: frozenset[str] = frozenset(),
                 prefix_budget_bytes: int | None = None, reuse: str = COMPOSE,
                 sources: tuple[str, ...] = SOURCES):
        if reuse not in REUSE_MODES:
            raise ValueError(f"reuse must be one of {', '.join(REUSE_MODES)}, not {reuse!r}")
        if not set(sources) <= set(SOURCES):
            raise ValueError(f"sources must be of {', '.join(SOURCES)}, not {sources!r}")
        self.backend = backend
        self.store = store
        self.gate = gate
        self.experimental = experimental
        self.strategy = strategy
        self.ratio = ratio
        self.min_segment_tokens = min_segment_tokens
        self.known_code = known_code
        self.sources = tuple(sources)
        self.split_code = seg.CodeSplitter()
        self.prompts = prompt_cache(backend, prefix_budget_bytes)
        self.prefix = self.prompts.prefix
        if reuse == SHIFT_ONLY and not self.prompts.supports_shift:
            raise ValueError(f"shift-only reuse shifts spans of kept prompts into place, which "
                             f"the prompt cache on {backend.info.engine} does not do")
        self.reuse = reuse
        self.slots = (ShiftSlots(backend, min_segment_tokens, self.prefix.budget_bytes)
                      if reuse == SHIFT_ONLY else None)
        self.recent = (RecentPrompts(backend, self.prefix.budget_bytes)
                       if reuse == COMPOSE and set(FROM_LAST_PROMPT) & set(self.sources)
                       and self.prompts.supports_last_prompt else None)
        self._chunk_caches: dict[str, ChunkCache] = {}

    def prefill(self, scope: str, prompt: Prompt, chat: bool = True) -> Served:
        """The request state of ``prompt`` (``RequestError`` for one the model cannot take);
        ``outcome.ttft_s`` is the time it took."""
        started = time.perf_counter()
        backend = self.backend
        ids, offsets = backend.tokenize_prompt(prompt.text, prompt.markers)
        limit = backend.info.max_positions
        if not ids:
            raise RequestError(400, "the prompt is empty", "messages" if chat else "prompt")
        if len(ids) >= limit:
            raise RequestError(400, f"the prompt is {len(ids)} tokens: the model's context is "
                                    f"{limit} (and the reply needs room)",
                               "messages" if chat else "prompt", "context_length_exceeded")
        spans = seg.prompt_spans(prompt.text, prompt.contents, prompt.tool_docs,
                                 self.known_code, self.split_code)
        segments = seg.token_segments(spans, offsets, ids, self.min_segment_tokens)
        system_tokens = sum(1 for _, end in offsets if end <= prompt.system_end)
        outcome = Outcome(prompt_tokens=len(ids))
        state, pending = self._prefill(scope, ids, segments, system_tokens, outcome)
        outcome.ttft_s = time.perf_counter() - started
        outcome.store_error = self.store.error
        return Served(ids, segments, state, outcome, pending)

    def done(self, scope: str, served: Served) -> None:
        """Once the reply is out: the new segments stored, the prompt kept as the scope's last
        (its state as the prefill left it: the reply's tokens are not part of it)."""
        # The state first: storing computes segments, which on llama.cpp takes the context.
        if self.recent is not None and not self.backend.info.unsupported:
            ids = served.ids
            # The exact-prefix cache holds the whole prompt when it was exact: no second copy.
            kept = self.prefix.holding(scope, ids)
            self.recent.remember(scope, ids, [(s.start, s.end) for s in served.segments],
                                 self.prompts.own(kept, len(ids)) if kept is not None
                                 else self.backend.state_kv(served.state, len(ids)))
        chunks = self._chunks(scope)
        for piece, after, after_kv in served.pending:
            chunks.kv(piece, after, after_kv=after_kv)

    def _chunks(self, scope: str) -> ChunkCache:
        """The scope's chunk KV cache: the keys and KV of its prompts' segments."""
        if scope not in self._chunk_caches:
            self._chunk_caches[scope] = ChunkCache(self.backend, self.store, scope)
        return self._chunk_caches[scope]

    def _verdict(self, segment: seg.Segment, prompt_tokens: int, source: str = STORE):
        """The gate's verdict on a segment's class whose KV came from ``source``, for this
        model, the segment's language and the prompt's length."""
        return licence(self.gate, self.backend.info, segment.kind,
                       frozenset([segment.language] if segment.language else []), prompt_tokens,
                       source)

    def _allowed(self, segment: seg.Segment, prompt_tokens: int, source: str) -> bool:
        """Whether the segment's KV may be reused from ``source``: one this pipeline reads,
        licensed (or ``experimental``)."""
        return source in self.sources and (
            self.experimental or self._verdict(segment, prompt_tokens, source).allowed)

    def _prefill(self, scope: str, ids: list[int], segments: list[seg.Segment],
                 system_tokens: int, outcome: Outcome):
        """The request state of ``ids`` and the segments to store after the reply."""
        backend = self.backend
        if self.slots is not None:
            return self.slots.prefill(scope, ids, outcome), []
        n, prefix_kv = self.prefix.longest(scope, ids, len(backend.leading_ids) + 1)
        n = min(n, len(ids) - 1)  # the last token's logits are computed, never cached
        n = self._before_segment(segments, n, len(ids))
        if n <= len(backend.leading_ids):  # a BOS alone is no shared prefix
            n = 0
        chunks = self._chunks(scope)
        again = self._again(scope, ids, n)
        reused_from = again.end if again else n
        candidates = [s for s in segments if s.start >= reused_from]
        outcome.segments = len(candidates) + (again is not None)
        refusals: dict[str, str] = {}
        if backend.info.unsupported and self.reuse == COMPOSE:
            refusals = {"model": f"unsupported: {backend.info.unsupported}"}
        reusing = self.reuse == COMPOSE and not backend.info.unsupported

        def after(segment: seg.Segment) -> list[int]:
            return ids[:system_tokens] if segment.start >= system_tokens else []

        def piece(segment: seg.Segment) -> RequestPiece:
            return RequestPiece(ids[segment.start:segment.end], segment.identity, segment.kind,
                                None, [], {"kind": segment.kind, "source": "serve"})

        def verdict(segment: seg.Segment, source: str, found: bool = True):
            return (self._verdict(segment, len(ids), source)
                    if found and source in self.sources else None)

        hits, pending, misses = [], [], []
        storing = False  # some segment was looked up in the store
        if again is not None:
            hits.append((again, self._verdict(again, len(ids), LAST_PROMPT), None,
                         self.recent.span(scope, again.start, again.end)))
        # A segment the exact prefix (or the run above) ends inside: the rest of it, after a
        # change deep inside (an id thousands of tokens into a system prompt).
        inside = next((s for s in segments if s.start < reused_from < s.end), None)
        if reusing and inside is not None:
            hits += self._parts(scope, ids, seg.Segment(reused_from, inside.end, inside.kind,
                                                        inside.identity, inside.language),
                                refusals)
        for segment in candidates if reusing else []:
            p = piece(segment)
            earlier = self.recent.find(scope, p.ids) if self.recent is not None else None
            last = verdict(segment, LAST_PROMPT, earlier is not None)
            stored = verdict(segment, STORE)
            from_last = last is not None and (last.allowed or self.experimental)
            to_store = stored is not None and (stored.allowed or self.experimental)
            storing |= to_store
            in_store = to_store and self.store.contains(chunks.key(p, after(segment)))
            parts = [] if from_last or in_store else self._parts(scope, ids, segment, refusals)
            if not (from_last or to_store or parts):
                refused = last if last is not None else stored
                if refused is not None:
                    refusals.setdefault(segment.kind, refused.reason)
                continue
            if from_last:
                hits.append((segment, last, p, earlier))
            elif in_store:
                hits.append((segment, stored, p, None))
            hits += parts
            if to_store and not in_store:  # for other scopes' prompts, and this one's later
                pending.append((p, after(segment)))
                if not (from_last or parts):
                    misses.append((segment, p))
        if reusing:
            hits += self._runs(scope, ids, segments, reused_from, refusals)
            hits.sort(key=lambda hit: hit[0].start)
        if not backend.info.unsupported and self.reuse == COMPOSE:
            pending += self._lost_in_prefix(chunks, segments, n, len(ids), piece, after)
        if storing and self.store.error:  # its lookups failed: every segment was a miss
            refusals["store"] = f"the chunk store failed: {self.store.error}"
        outcome.fallback_reason = "; ".join(sorted(set(refusals.values()))) or None
        state, stored = None, []
        if hits:
            try:
                state, exact = self._compose(chunks, ids, n, prefix_kv, hits, after, outcome,
                                             misses, system_tokens, stored)
            except Exception as error:  # noqa: BLE001 - any failure falls back, with its reason
                log.warning("composition failed: %s", error)
                outcome.fallback_reason = f"composition failed: {error}"
                state = None
        if state is None:
            outcome.strategy = outcome.ratio = None
            outcome.reused_tokens = outcome.recomputed_tokens = 0
            outcome.segments_reused = outcome.segments_from_last_prompt = 0
            outcome.parts_from_last_prompt = outcome.runs_from_last_prompt = 0
            if n:
                context = backend.concat([self.prompts.part(prefix_kv, n)])
                state = backend.recompute(ids[:n], context, [], ids[n:])
                outcome.status = EXACT_PREFIX
            else:
                state = backend.full_prefill(ids)
                outcome.status = FULL_PREFILL
            outcome.exact_prefix_tokens = n
            outcome.prefilled_tokens = len(ids) - n
            exact = len(ids)
        if exact > 0:  # composed: only the tokens before its first reused segment are exact
            self.prompts.keep(scope, ids[:exact], state)
        if state is not None and outcome.status == COMPOSED:  # else nothing was stored early
            pending = [(p, after) for p, after in pending if not any(p is s for s in stored)]
        else:
            stored = []
        system_kv = self._kept_part(scope, ids[:system_tokens]) if pending else None
        pending = [(p, after, system_kv if after else None) for p, after in pending]
        outcome.segments_stored = len(pending) + len(stored)
        outcome.stored_tokens = sum(len(p.ids) for p in stored) + sum(
            len(p.ids) + (len(after) if kv is None else 0) for p, after, kv in pending)
        return state, pending

    def _again(self, scope: str, ids: list[int], n: int) -> seg.Segment | None:
        """The prompt's common prefix with the scope's last prompt past the exact prefix ``n``,
        as one segment reused in place (where that prompt was composed, its KV past its first
        reused segment is not exact, so the exact-prefix cache does not keep it), where the
        last prompt's class is licensed; None when shorter than a segment's minimum."""
        if self.recent is None or self.backend.info.unsupported:
            return None
        end = min(self.recent.common(scope, ids), len(ids) - 1)
        if end - n < self.min_segment_tokens:
            return None
        again = seg.Segment(n, end, ChunkKind.PASSAGE, "last-prompt")
        return again if self._allowed(again, len(ids), LAST_PROMPT) else None

    def _parts(self, scope: str, ids: list[int], segment: seg.Segment,
                refusals: dict[str, str]) -> list:
        """Hits for the unchanged head and tail of ``segment``, which the scope's last prompt
        no longer holds whole, where that class (code's parts or text's) is licensed (a
        refusal says why not)."""
        source = part_source(segment.kind)
        if self.recent is None or source not in self.sources:
            return []
        parts = self.recent.parts(scope, ids[segment.start:segment.end],
                                  self.min_segment_tokens)
        if not parts:
            return []
        # The class, language and prompt length decide the verdict: one for all its parts.
        verdict = self._verdict(segment, len(ids), source)
        if not (verdict.allowed or self.experimental):
            refusals.setdefault(source, verdict.reason)
            return []
        return [(seg.Segment(segment.start + part.offset,
                             segment.start + part.offset + part.length, segment.kind,
                             source, segment.language), verdict, None,
                 self.recent.span(scope, part.start, part.start + part.length))
                for part in parts]

    def _runs(self, scope: str, ids: list[int], segments: list[seg.Segment], start: int,
              refusals: dict[str, str]) -> list:
        """Hits for the text between the prompt's segments past ``start`` (message framing,
        messages shorter than a segment): each stretch's head and tail found in the last
        prompt's, where that class is licensed. What follows the last segment is the request,
        computed."""
        if self.recent is None or LAST_PROMPT_RUN not in self.sources or not segments:
            return []
        hits = []
        spans = [(s.start, s.end) for s in segments]
        for first, last in gaps(spans, start, segments[-1].end):
            runs = self.recent.runs(scope, ids[first:last], self.min_segment_tokens)
            if not runs:
                continue
            # One verdict for all: the class and the prompt's length decide it.
            verdict = self._verdict(seg.Segment(first, last, ChunkKind.PASSAGE, LAST_PROMPT_RUN),
                                    len(ids), LAST_PROMPT_RUN)
            if not (verdict.allowed or self.experimental):
                refusals.setdefault(LAST_PROMPT_RUN, verdict.reason)
                return []
            hits += [(seg.Segment(first + run.offset, first + run.offset + run.length,
                                  ChunkKind.PASSAGE, LAST_PROMPT_RUN), verdict, None,
                      self.recent.span(scope, run.start, run.start + run.length))
                     for run in runs]
        return hits

    def _before_segment(self, segments: list[seg.Segment], n: int, prompt_tokens: int) -> int:
        """Where the exact prefix stops: at ``n``, or at the start of a licensed segment it
        runs into by fewer tokens than a segment's minimum. A block that happens to begin with
        the tokens an earlier prompt had there (``def``, ``import``, ``class``) is then reused,
        or computed once and stored, whole, not split for a few exact tokens. A longer run
        into a segment stays exact: exact tokens cost nothing and change nothing, and a
        replay showed what trading them for a stored segment costs (a prefix cut back by
        3,300 tokens)."""
        if self.reuse != COMPOSE or self.backend.info.unsupported:
            return n
        for segment in segments:
            if segment.start < n < segment.end:
                short = n - segment.start < self.min_segment_tokens
                licensed = any(self._allowed(segment, prompt_tokens, source)
                               for source in self.sources)
                return segment.start if short and licensed else n
        return n

    def _kept_part(self, scope: str, ids: list[int]):
        """The exact KV of ``ids`` as a request's first part where the exact-prefix cache
        keeps all of them (segments stored after them are then computed alone), else None."""
        kept = self.prefix.holding(scope, ids)
        return None if kept is None else self.prompts.part(kept, len(ids))

    def _lost_in_prefix(self, chunks: ChunkCache, segments: list[seg.Segment], n: int,
                        prompt_tokens: int, piece, after) -> list:
        """Licensed segments (partly) inside the exact prefix that the store lacks (their entry
        evicted or their write failed since an earlier request): served by the prefix, never
        reused here, but stored for reuse at another position. One lookup each; none while
        the store fails (a miss then says nothing, and storing would fail too)."""
        lost = []
        for segment in segments:
            if segment.start >= n or not self._allowed(segment, prompt_tokens, STORE):
                continue
            p = piece(segment)
            if not self.store.contains(chunks.key(p, after(segment))):
                if self.store.error:
                    return []
                lost.append((p, after(segment)))
        return lost

    def _rule(self, verdicts) -> tuple[str, float]:
        if self.strategy != AUTO:
            return self.strategy, DEFAULT_RATIO if self.ratio is None else self.ratio
        # Experimental, without evidence: the first default rule that runs.
        return supported_rule(self.backend, verdicts)[:2]

    def _compose(self, chunks: ChunkCache, ids, n, prefix_kv, hits, after, outcome: Outcome,
                 misses: list, system_tokens: int, stored: list):
        """The composed state and how many of its first tokens are exact. New segments between
        reused ones (``misses``) are computed once for the store and placed from that (``stored``
        lists them)."""
        backend = self.backend
        system_kv = (self.prompts.part(prefix_kv, system_tokens)
                     if 0 < system_tokens <= n else None)
        name, ratio = self._rule([verdict for _, verdict, _, _ in hits])
        selection = make_strategy(name)
        refusal = rule_refusal(backend, selection)
        if refusal:
            raise RuntimeError(f"strategy {name}: {refusal}")
        reused, kvs = [], []
        for segment, _, p, earlier in hits:
            kv, hit = (earlier, True) if earlier is not None else chunks.kv(
                p, after(segment))
            if hit:
                reused.append(segment)
                outcome.segments_from_last_prompt += earlier is not None
                outcome.parts_from_last_prompt += segment.identity in PARTS
                outcome.runs_from_last_prompt += segment.identity == LAST_PROMPT_RUN
            kvs.append((segment, kv, hit))
        if not reused:
            raise RuntimeError("the stored segments could not be read")
        end = max(s.end for s in reused)
        parts = [self.prompts.part(prefix_kv, n)] if n else []
        cursor = n
        computed: list[int] = []  # positions computed in place
        blank: list[int] = []  # of those, the ones held by placeholders until then
        for segment, kv, hit in kvs:
            if segment.end > end:
                break
            if segment.start > cursor:  # the text between: computed in place
                parts += self._between(chunks, ids, cursor, segment.start, misses, after,
                                       system_kv, stored, blank)
                computed += range(cursor, segment.start)
            parts.append(backend.reposition(kv, segment.start))
            if not hit:
                computed += range(segment.start, segment.end)
            cursor = segment.end
        context_ids, query_ids = ids[:end], ids[end:]
        hit_tokens = sum(s.length for s in reused)
        state, chosen = compose_state(
            backend, context_ids, parts, [SelectionSegment(s.start, s.length) for s in reused],
            query_ids, selection, ratio, prefix_length=n,
            query_names=frozenset(IDENTIFIER.findall(backend.detokenize(query_ids))),
            in_place=computed, placeholders=blank, probe_tokens=PROBE_TOKENS)
        outcome.status = COMPOSED
        outcome.strategy, outcome.ratio = name, ratio
        outcome.exact_prefix_tokens = n
        outcome.recomputed_tokens = len(chosen)
        outcome.reused_tokens = hit_tokens - len(chosen)
        outcome.prefilled_tokens = len(ids) - n - hit_tokens
        outcome.segments_reused = len(reused)
        return state, reused[0].start

    def _between(self, chunks: ChunkCache, ids, start: int, end: int, misses, after, system_kv,
                 stored: list, blank: list[int]) -> list:
        """KV standing for the text ``[start, end)`` between reused segments until it is
        computed in place: the engine's placeholder (``blank`` lists its positions). Where
        placeholders cost nothing (transformers: zeros), that is all of it, and a new segment
        there is stored after the reply, as any. Elsewhere (llama.cpp: the text computed alone)
        a new segment there is computed once, as its key says (after the system message's exact
        KV, which the exact prefix holds), stored, and placed from that, instead of being
        computed alone here and again for the store after the reply."""
        backend = self.backend
        parts, cursor = [], start

        def placeholder(first: int, last: int) -> None:
            parts.append(backend.placeholder(ids[first:last], first))
            blank.extend(range(first, last))

        for segment, p in sorted(misses if not backend.free_placeholders else [],
                                 key=lambda miss: miss[0].start):
            context = after(segment)
            if not (start <= segment.start and segment.end <= end) or (context and
                                                                       system_kv is None):
                continue
            if segment.start > cursor:
                placeholder(cursor, segment.start)
            kv, _ = chunks.kv(p, context, after_kv=system_kv if context else None)
            parts.append(backend.reposition(kv, segment.start))
            stored.append(p)
            cursor = segment.end
        if end > cursor:
            placeholder(cursor, end)
        return parts


class Engine(Pipeline):
    """The pipeline and the one worker thread that serves its queue."""

    def __init__(self, backend, store, gate: SupportGate, *, max_queue: int = 16, **settings):
        super().__init__(backend, store, gate, **settings)
        self._jobs: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self.busy = False
        self.cancelled = 0  # requests whose client left before their reply was done
        self._worker = threading.Thread(target=self._run, name="codekv-serve-worker",
                                        daemon=True)
        self._worker.start()

    # -- the queue -----------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Queue ``job``; ``QueueFull`` when ``max_queue`` requests already wait."""
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            raise QueueFull() from None

    @property
    def waiting(self) -> int:
        return self._jobs.qsize()

    def close(self) -> None:
        self._jobs.put(None)
        self._worker.join(timeout=30)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if job.cancelled.is_set():  # its client left while it waited
                self.cancelled += 1
                continue
            self.busy = True
            try:
                self._serve(job)
            except RequestError as error:
                job.emit(Failed(error))
            except Exception as error:  # the server goes on serving the others
                log.exception("request failed")
                job.emit(Failed(internal(error)))
            finally:
                self.busy = False

    # -- one request ---------------------------------------------------------------------
    def _serve(self, job: Job) -> None:
        started = time.perf_counter()
        served = self.prefill(job.scope, job.prompt(), job.chat)
        outcome = served.outcome
        outcome.queue_s = started - job.queued_at
        outcome.ttft_s = time.perf_counter() - started
        job.emit(Prefilled(outcome))
        forced = None if job.continuation is None else self.backend.tokenize(job.continuation)
        if forced is not None:
            outcome.continuation_nll = []
        finish, count = self._generate(served.state, job, forced, outcome)
        job.emit(Final(finish, count))
        self.done(job.scope, served)

    # -- the reply -----------------------------------------------------------------------
    def _generate(self, state, job: Job, forced: list[int] | None = None,
                  outcome: Outcome | None = None) -> tuple[str, int]:
        """Sample the reply into ``job.emit`` as text deltas; (finish_reason, tokens). With
        ``forced`` tokens, those are the reply, and each one's NLL goes to ``outcome``."""
        backend, sampling = self.backend, job.sampling
        room = backend.info.max_positions - state.length
        budget = room if sampling.max_tokens is None else min(sampling.max_tokens, room)
        if forced is not None:
            budget = min(budget, len(forced))
        generator = None
        if sampling.temperature > 0:
            generator = torch.Generator()
            generator.manual_seed(sampling.seed if sampling.seed is not None
                                  else int.from_bytes(os.urandom(8), "little"))
        ends = backend.end_token_ids
        tokens: list[int] = []
        sent = 0
        finish = "length"
        holdback = max((len(s) for s in sampling.stop), default=1) - 1
        while len(tokens) < budget:
            if job.cancelled.is_set():
                self.cancelled += 1
                return "cancelled", len(tokens)
            if forced is not None:
                token = forced[len(tokens)]
                outcome.continuation_nll.append(
                    -float(torch.log_softmax(state.logits.float(), dim=-1)[token]))
            else:
                token = pick(state.logits, sampling.temperature, sampling.top_p, generator)
            if token in ends and forced is None:
                finish = "stop"
                break
            tokens.append(token)
            text = backend.detokenize(tokens)
            cut = first_stop(text, sampling.stop)
            if cut is not None:
                if cut > sent:
                    job.emit(Partial(text[sent:cut]))
                return "stop", len(tokens)
            safe = len(text) - holdback
            while safe > sent and text[safe - 1] == "\ufffd":  # an unfinished character
                safe -= 1
            if safe > sent:
                job.emit(Partial(text[sent:safe]))
                sent = safe
            if len(tokens) < budget:
                backend.extend(state, [token])
        text = backend.detokenize(tokens)
        if len(text) > sent:
            job.emit(Partial(text[sent:]))
        return finish, len(tokens)


def pick(logits: torch.Tensor, temperature: float, top_p: float,
         generator: torch.Generator | None) -> int:
    """Greedy at temperature 0; else a sample from the nucleus ``top_p`` at ``temperature``."""
    if temperature <= 0 or generator is None:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        ordered, order = probs.sort(descending=True)
        keep = ordered.cumsum(0) - ordered < top_p
        keep[0] = True  # the most likely token always stays (top_p=0: greedy)
        probs = torch.zeros_like(probs).scatter(0, order[keep], ordered[keep])
    return int(torch.multinomial(probs, 1, generator=generator))


def first_stop(text: str, stops: list[str]) -> int | None:
    """Where the first stop string starts in ``text``, or None."""
    found = [text.find(s) for s in stops if s and s in text]
    return min(found) if found else None

