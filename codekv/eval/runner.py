"""Run the methods on the same token sequences and measure them against full prefill.

Per task: full prefill of the same tokens is the reference; then each kind of method - a
``MethodRunner``: ``Composition`` here, ``pruning.Pruning``, ``peer.Peers`` - yields a request
state per method. Every state (full prefill's too, which checks the scoring) is scored
teacher-forced, which gives in one pass per continuation:

- the answer's mean NLL (nats/token) and its difference from full prefill's;
- exact match: greedy decoding would reproduce the answer's tokens (every position's argmax
  is the answer's next token, which is what greedy decoding emits given the answer so far);
- KL(full || method) of the next-token distribution, and its mean over the answer's tokens;
- agreement: the share of full prefill's first ``greedy_tokens`` greedy tokens that are also
  the method's top-1 at the same position (teacher-forced on full's continuation), and
  greedy match: all of them are, i.e. greedy decoding gives exactly full prefill's tokens;
- decisive agreement: the same over the positions where full prefill's top token beats its
  runner-up by at least ``DECISIVE_MARGIN`` in probability; the others are near-ties, where any
  perturbation may flip the argmax, counted apart;
- the task score of the method's own greedy answer, the way code-completion benchmarks score
  it (``codekv.eval.scores``): exact match, edit similarity and identifier F1 against the
  expected answer (a completion on its first line). The greedy answer equals full prefill's up
  to the first position where the method's top-1 differs, so only the rest is decoded;
  ``same_answer``: it is full prefill's answer, token for token, as long as it is scored.

``Reordered`` adds the reference ``full-reordered``: full prefill of the same chunks in another
order, scored like a method, so every delta has the scale of what an agent's arbitrary chunk
order already moves.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import torch

from codekv.compose import Composer
from codekv.divergence import kl_divergence
from codekv.eval.measures import Measure
from codekv.eval.methods import FULL_REORDERED, REFERENCE, SHIFT_ONLY, Method
from codekv.eval.scores import score
from codekv.eval.workloads import Task

DECISIVE_MARGIN = 0.1  # top-1 minus runner-up probability under full prefill
ANSWER_TOKENS = 32  # at most this many tokens of a greedy answer are decoded and scored
COMPLETION_SLACK = 8  # a completion line may run longer than expected before it is cut
ONE_LINE = ("completion", "recall")  # task kinds whose answer is one line of code


class UnkeptChunks(RuntimeError):
    """The store failed to keep a task's chunks: a composed TTFT would not be cache-warm."""


class MethodRunner(Protocol):
    """One kind of method - codekv's composition, KV pruning, a peer library - run on a task.

    ``results`` yields one result per method, shaped like a ``ComposeResult`` (``status``,
    ``report``, ``state``); one holding less context KV than full prefill also has
    ``kv_bytes`` and ``full_kv_bytes``. A kind's methods run together because they share work
    on a task (pruning: one context prefill; a peer: its engine). ``prefix`` (a system prompt
    before the chunks) is for the kinds that support it; the others refuse it.
    """

    methods: list[Method]
    tasks: int | None  # run on the first ``tasks`` tasks of each workload (None: on all)
    # It runs agent-session tasks (a session's calls, ``Task.calls``) and no others; the
    # other kinds run every other task.
    sessions: bool

    def count(self, workload: str) -> int:
        """Requests per task of ``workload`` (for the progress total)."""

    def results(self, composer: Composer, task: Task, prefix: str | None = None
                ) -> Generator[tuple[Method, object], None, None]:
        """Each method's result; a result is scored before the next is asked for."""


@dataclass
class Composition:
    """codekv's strategies. The chunk store is filled first, per conditioning, so every
    composed TTFT is cache-warm and includes reading the store; filling it is the offline
    cost (``offline``: seconds and tokens through the model for the task, by conditioning).

    ``shift-only`` is ``none`` over the chunks in the previous request's order
    (``previous_order``): their stored KV shifted to contiguous positions in that order,
    nothing recomputed, scored against full prefill of the task's own order."""

    methods: list[Method]
    tasks: int | None = None
    offline: dict[str, tuple[float, int]] = field(default_factory=dict)
    sessions = False

    def count(self, workload: str) -> int:
        return len(self.methods)

    def results(self, composer: Composer, task: Task, prefix: str | None = None
                ) -> Generator[tuple[Method, object], None, None]:
        self.offline = {}
        for conditioning in dict.fromkeys(m.conditioning for m in self.methods):
            tokens, started = composer.counters.chunk_prefill_tokens, time.perf_counter()
            errors = dict(composer.counters.store_errors)
            composer.prefill(task.context, prefix, conditioning)
            if composer.counters.store_errors != errors:
                raise UnkeptChunks(
                    f"{task.id}: the chunk store could not keep the task's chunks "
                    f"({', '.join(sorted(composer.counters.store_errors))}: a full disk?), so "
                    "its composed requests would recompute them and time that; nothing of the "
                    "task was recorded. Free space (or give --store) and run the same command: "
                    "a --checkpoint keeps the finished tasks")
            self.offline[conditioning] = (time.perf_counter() - started,
                                          composer.counters.chunk_prefill_tokens - tokens)
        for method in self.methods:
            if method.strategy == SHIFT_ONLY:
                yield method, composer.compose(previous_order(task), task.query, prefix,
                                               strategy="none", ratio=0.0,
                                               conditioning=method.conditioning)
                continue
            yield method, composer.compose(task.context, task.query, prefix,
                                           strategy=method.strategy, ratio=method.ratio,
                                           conditioning=method.conditioning)


@dataclass
class Reordered:
    """Full prefill of the task's chunks in another order (fixed by the task id): a reference
    for how much the order of a request's chunks alone moves the answer."""

    tasks: int | None = None
    methods: list[Method] = field(default_factory=lambda: [FULL_REORDERED])
    sessions = False

    def count(self, workload: str) -> int:
        return 1

    def results(self, composer: Composer, task: Task, prefix: str | None = None
                ) -> Generator[tuple[Method, object], None, None]:
        if len(task.context) < 2:
            return
        yield FULL_REORDERED, composer.full_prefill(reordered(task), task.query, prefix)


def reordered(task: Task) -> list:
    """The task's context in another order, the same for every run of the task (with fewer
    than two items, the only order there is)."""
    order = list(range(len(task.context)))
    rng = random.Random(f"reordered:{task.id}")
    while len(order) > 1 and order == sorted(order):
        rng.shuffle(order)
    return [task.context[i] for i in order]


def previous_order(task: Task) -> list:
    """The order in which the previous request held the task's chunks: ``reordered``'s, the
    one ``full-reordered`` prefills. An agent that read the same chunks before in another order
    is what an engine that can only shift cached KV (not reorder it) meets."""
    return reordered(task)


@dataclass
class _Reference:
    """Full prefill's answer log-probabilities and greedy tokens, which every method meets."""

    answer_ids: list[int]
    answer_logp: torch.Tensor  # [answer, vocab]
    greedy_ids: list[int]  # full prefill's greedy answer (``answer_tokens`` long at most)
    decisive: torch.Tensor  # [greedy_tokens] bool: full's top-1 clear of its runner-up
    nll: float
    ttft_s: float
    greedy_tokens: int  # agreement is measured over the first ones of ``greedy_ids``
    answer: str  # the expected answer
    one_line: bool  # a completion: scored on its first line
    answer_length: int  # a greedy answer is scored on its first tokens, this many

    @classmethod
    def of(cls, backend, full, task: Task, greedy_tokens: int) -> _Reference:
        answer_ids = backend.tokenize(task.answer)
        one_line = task.kind in ONE_LINE
        length = min(ANSWER_TOKENS, len(answer_ids) + (COMPLETION_SLACK if one_line else 0))
        greedy_ids = greedy(backend, full.state, max(greedy_tokens, length))
        top2 = forced_logprobs(backend, full.state, greedy_ids[:greedy_tokens]).exp().topk(2)
        margin = top2.values[:, 0] - top2.values[:, 1]
        logp = forced_logprobs(backend, full.state, answer_ids)
        return cls(answer_ids, logp, greedy_ids, margin >= DECISIVE_MARGIN,
                   _nll(logp, answer_ids), full.report.ttft_s, greedy_tokens, task.answer,
                   one_line, length)


def forced_logprobs(backend, state, token_ids: list[int]) -> torch.Tensor:
    """Log-probabilities predicting each of ``token_ids`` after ``state``; state unchanged."""
    length, first = state.length, state.logits
    logits = backend.extend(state, token_ids)
    backend.rewind(state, length, first)
    return torch.log_softmax(torch.cat((first[None], logits[:-1])).float(), dim=-1)


def greedy(backend, state, n: int) -> list[int]:
    """Full prefill's first ``n`` greedy tokens (an end-of-sequence token included, then stop)."""
    length, first = state.length, state.logits
    eos = backend.eos_token_id
    out: list[int] = []
    for _ in range(n):
        token = int(state.logits.argmax())
        out.append(token)
        if token == eos or len(out) == n:
            break
        backend.extend(state, [token])
    backend.rewind(state, length, first)
    return out


def run_task(composer: Composer, task: Task, runners: list[MethodRunner],
             greedy_tokens: int = 8, on_method: Callable[[], None] | None = None,
             prefix: str | None = None) -> list[Measure]:
    """Full prefill, then every runner's methods, on the same tokens, each scored the same way
    (full prefill too: its row checks the scoring). ``prefix``: a system prompt before the
    chunks, for the runners that support one."""
    backend = composer.backend
    if task.calls is not None:  # an agent session's call: its prompt as the server renders it
        from codekv.eval.serving import full_prefill

        full = full_prefill(backend, task)
    else:
        full = composer.full_prefill(task.context, task.query, prefix)
    reference = _Reference.of(backend, full, task, greedy_tokens)
    context_bytes = _context_kv_bytes(backend, full.state, full.report.context_tokens)

    def scored(method: Method, result) -> Measure:
        measure = _measure(backend, task, method, result, reference)
        measure.kv_bytes = getattr(result, "kv_bytes", context_bytes)
        measure.full_kv_bytes = getattr(result, "full_kv_bytes", context_bytes)
        return measure

    measures = [scored(REFERENCE, full)]
    for runner in runners:
        # Closed on an error too: a runner may hold a setting for its results' scoring.
        with contextlib.closing(runner.results(composer, task, prefix)) as results:
            for method, result in results:
                measure = scored(method, result)
                measure.offline_prefill_s, measure.offline_tokens = getattr(
                    runner, "offline", {}).get(method.conditioning, (0.0, 0))
                measures.append(measure)
                if on_method is not None:
                    on_method()
    return measures


def _context_kv_bytes(backend, state, context_tokens: int) -> int:
    """The context's share of a full request state's KV."""
    return backend.kv_bytes(state) * context_tokens // max(1, state.length)


def _nll(logp: torch.Tensor, answer_ids: list[int]) -> float:
    return float(-logp[torch.arange(len(answer_ids)), torch.tensor(answer_ids)].mean())


def greedy_answer(backend, state, ref: _Reference, top1: torch.Tensor) -> list[int]:
    """The state's own greedy answer, as long as full prefill's: full's tokens up to the first
    position where the state's top-1 (``top1``, teacher-forced on full's tokens) differs, then
    decoded from there; the state is left as it was."""
    same = (top1 == torch.tensor(ref.greedy_ids)).tolist()
    if all(same):
        return list(ref.greedy_ids)
    first = same.index(False)
    answer = ref.greedy_ids[:first] + [int(top1[first])]
    if len(answer) == len(ref.greedy_ids) or answer[-1] == backend.eos_token_id:
        return answer
    length, logits = state.length, state.logits
    backend.extend(state, answer)
    try:
        return answer + greedy(backend, state, len(ref.greedy_ids) - len(answer))
    finally:
        backend.rewind(state, length, logits)


def _measure(backend, task: Task, method: Method, result, ref: _Reference) -> Measure:
    logp = forced_logprobs(backend, result.state, ref.answer_ids)
    top1 = forced_logprobs(backend, result.state, ref.greedy_ids).argmax(-1)
    nll = _nll(logp, ref.answer_ids)
    kl = kl_divergence(ref.answer_logp, logp)
    agree = top1[: ref.greedy_tokens] == torch.tensor(ref.greedy_ids[: ref.greedy_tokens])
    decisive = ref.decisive[: len(agree)]
    answer_ids = greedy_answer(backend, result.state, ref, top1)[: ref.answer_length]
    same_answer = answer_ids == ref.greedy_ids[: ref.answer_length]
    answer = score(backend.detokenize(answer_ids), ref.answer, one_line=ref.one_line)
    report = result.report
    return Measure(
        workload=task.workload, task=task.id, method=method.label, strategy=method.strategy,
        ratio=method.ratio, conditioning=method.conditioning, status=result.status, nll=nll,
        delta_nll=nll - ref.nll,
        exact_match=bool((logp.argmax(-1) == torch.tensor(ref.answer_ids)).all()),
        kl=float(kl[0]), kl_answer=float(kl.mean()),
        agreement=float(agree.float().mean()), greedy_match=bool(agree.all()),
        decisive_agreement=float(agree[decisive].float().mean()) if decisive.any() else None,
        decisive_positions=int(decisive.sum()), near_ties=int((~decisive).sum()),
        answer_exact=answer.exact_match, edit_similarity=answer.edit_similarity,
        identifier_f1=answer.identifier_f1,
        ttft_s=report.ttft_s, full_ttft_s=ref.ttft_s,
        context_tokens=report.context_tokens, query_tokens=report.query_tokens,
        answer_tokens=len(ref.answer_ids), recomputed_tokens=report.recomputed_tokens,
        recompute_ratio=report.recompute_ratio,
        store_load_s=report.timings.get("store_load", 0.0),
        fallback_reason=report.fallback_reason, kind=method.kind,
        budget=method.ratio if method.kind == "pruning" else None, same_answer=same_answer,
    )


def warm_up(backend) -> None:
    """One short forward pass so the first timed request does not pay for lazy initialisation."""
    state = backend.full_prefill(backend.tokenize("def warm_up():\n    return 0\n"))
    backend.generate(state, 2)


def schedule(tasks: list[Task], runners: list[MethodRunner], shard: tuple[int, int] | None = None
             ) -> Iterator[tuple[Task, list[MethodRunner]]]:
    """Each task with the runners that run on it: each on its first ``tasks`` per workload,
    agent-session tasks on the runners of sessions alone; of ``shard`` (K, N), the tasks whose
    place is K modulo N only."""
    seen: Counter[str] = Counter()
    for place, task in enumerate(tasks):
        seen[task.workload] += 1
        if shard is None or place % shard[1] == shard[0]:
            yield task, [r for r in runners if r.sessions == (task.calls is not None)
                         and (r.tasks is None or seen[task.workload] <= r.tasks)]


def requests(tasks: list[Task], runners: list[MethodRunner],
             shard: tuple[int, int] | None = None) -> int:
    """How many method requests ``run`` makes (each is one progress step)."""
    return sum(r.count(task.workload) for task, active in schedule(tasks, runners, shard)
               for r in active)


def run(composer_for: Callable[[Task], Composer], tasks: list[Task],
        runners: list[MethodRunner], greedy_tokens: int = 8,
        progress: Callable[[str, int], None] | None = None, prefix: str | None = None,
        done: dict[str, list[Measure]] | None = None,
        on_task: Callable[[Task, list[Measure]], None] | None = None,
        shard: tuple[int, int] | None = None) -> list[Measure]:
    """All tasks (of ``shard``), each with the runners scheduled on it and the composer of its
    repository; ``progress(description, advance)`` after each method. Tasks in ``done`` (a
    checkpoint's) are not run again; ``on_task`` gets each newly measured task."""
    done = done or {}
    measures: list[Measure] = []
    warmed = False
    for task, active in schedule(tasks, runners, shard):
        if task.id in done:
            measures.extend(done[task.id])
            if progress is not None:
                progress(f"{task.id} (from the checkpoint)",
                         sum(r.count(task.workload) for r in active))
            continue
        composer = composer_for(task)
        if not warmed:
            warm_up(composer.backend)
            warmed = True
        started = time.perf_counter()

        def step(task=task):
            if progress is not None:
                progress(task.id, 1)

        measured = run_task(composer, task, active, greedy_tokens, step, prefix)
        if on_task is not None:
            on_task(task, measured)
        measures.extend(measured)
        if progress is not None:
            progress(f"{task.id} done in {time.perf_counter() - started:.1f}s", 0)
    return measures
