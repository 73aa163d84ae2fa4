"""Run the methods on the same token sequences and measure them against full prefill.

Per task: the chunk store is filled first (untimed), so every composed TTFT is cache-warm and
includes reading the store; full prefill of the same tokens is the reference. Each method's
request state is then scored teacher-forced, which gives in one pass per continuation:

- the answer's mean NLL (nats/token) and its difference from full prefill's;
- exact match: greedy decoding would reproduce the answer's tokens (every position's argmax
  is the answer's next token, which is what greedy decoding emits given the answer so far);
- KL(full || method) of the next-token distribution, and its mean over the answer's tokens;
- agreement: the share of full prefill's first ``greedy_tokens`` greedy tokens that are also
  the method's top-1 at the same position (teacher-forced on full's continuation), and
  greedy match: all of them are, i.e. greedy decoding gives exactly full prefill's tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from codekv.compose import COMPOSED, Composer
from codekv.eval import pruning
from codekv.eval.workloads import Task

STRATEGIES = ("none", "none-norope", "boundary", "deviation", "anchors", "hybrid")
RATIOS = (0.0, 0.05, 0.10, 0.15, 0.25)
RATIO_FREE = ("none", "none-norope")  # recompute nothing whatever the ratio
FULL = "full"


@dataclass(frozen=True)
class Method:
    strategy: str
    ratio: float = 0.0

    @property
    def pruning(self) -> bool:
        """A KV pruning baseline: ``ratio`` is then the share of context KV kept."""
        return self.strategy in pruning.RULES

    @property
    def label(self) -> str:
        if self.strategy in (FULL, *RATIO_FREE):
            return self.strategy
        if self.pruning:
            return f"{self.strategy}@kv{self.ratio:g}"
        return f"{self.strategy}@{self.ratio:g}"


def methods(strategies=STRATEGIES, ratios=RATIOS) -> list[Method]:
    """Each strategy at each ratio where the ratio means something (none: only at 0)."""
    out = []
    for name in strategies:
        if name in RATIO_FREE:
            out.append(Method(name, 0.0))
        else:
            out.extend(Method(name, r) for r in ratios if r > 0)
    return out


def pruning_methods(names=pruning.PRUNING, budgets=pruning.BUDGETS) -> list[Method]:
    """Each pruning rule at each KV budget (the share of context KV kept)."""
    return [Method(name, budget) for name in names for budget in budgets]


@dataclass
class Measure:
    """One method on one task."""

    workload: str
    task: str
    method: str
    strategy: str
    ratio: float
    status: str
    nll: float
    delta_nll: float
    exact_match: bool
    kl: float
    kl_answer: float
    agreement: float
    greedy_match: bool
    ttft_s: float
    full_ttft_s: float
    context_tokens: int
    query_tokens: int
    answer_tokens: int
    recomputed_tokens: int
    recompute_ratio: float
    store_load_s: float = 0.0
    fallback_reason: str | None = None
    kind: str = "composition"  # "reference" (full prefill), "composition", "pruning", "peer"
    budget: float | None = None  # pruning: the share of context KV kept
    kv_bytes: int = 0  # context KV the request state holds
    full_kv_bytes: int = 0  # context KV full prefill holds

    @property
    def kv_kept(self) -> float:
        return self.kv_bytes / self.full_kv_bytes if self.full_kv_bytes else 1.0

    def as_json(self) -> dict:
        return dict(self.__dict__, kv_kept=self.kv_kept)


@dataclass
class _Reference:
    answer_ids: list[int]
    answer_logp: torch.Tensor  # [answer, vocab]
    greedy_ids: list[int]
    nll: float
    ttft_s: float


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


def _kl(reference: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """KL(reference || other) per row, from log-probabilities."""
    return (reference.exp() * (reference - other)).sum(-1).clamp_min(0.0)


def run_task(composer: Composer, task: Task, method_list: list[Method],
             greedy_tokens: int = 8, on_method: Callable[[], None] | None = None,
             pruning_list: list[Method] = (), peer_list: list[Method] = (),
             peer_runner=None, prefix: str | None = None) -> list[Measure]:
    """Full prefill, then every composition method, then every pruning method (kvpress, one
    shared context prefill), then the peer library's methods, on the same tokens, each scored
    the same way. ``prefix`` (a system prompt before the chunks) is for composition only."""
    if prefix and (pruning_list or peer_list):
        raise ValueError("a request prefix is measured for composition methods only")
    backend = composer.backend
    composer.prefill(task.context, prefix)  # cache-warm: composed TTFTs include the store read
    full = composer.full_prefill(task.context, task.query, prefix)
    answer_ids = backend.tokenize(task.answer)
    logp = forced_logprobs(backend, full.state, answer_ids)
    targets = torch.tensor(answer_ids)
    ref = _Reference(answer_ids, logp, greedy(backend, full.state, greedy_tokens),
                     float(-logp[torch.arange(len(answer_ids)), targets].mean()),
                     full.report.ttft_s)
    context_bytes = _context_kv_bytes(backend, full.state, full.report.context_tokens)
    measures = [_measure(task, FULL, Method(FULL, 1.0), full, ref, logp, None, len(answer_ids))]
    measures[0].kind = "reference"

    def scored(method, result):
        logp = forced_logprobs(backend, result.state, answer_ids)
        greedy_logp = forced_logprobs(backend, result.state, ref.greedy_ids)
        measures.append(_measure(task, method.label, method, result, ref, logp, greedy_logp,
                                 len(answer_ids)))
        if on_method is not None:
            on_method()
        return measures[-1]

    for method in method_list:
        result = composer.compose(task.context, task.query, prefix, strategy=method.strategy,
                                  ratio=method.ratio)
        scored(method, result)
    for measure in measures:
        measure.kv_bytes = measure.full_kv_bytes = context_bytes
    if pruning_list:
        for method, result in pruning.run(composer, task.context, task.query, pruning_list):
            measure = scored(method, result)
            measure.kind, measure.budget = "pruning", method.ratio
            measure.kv_bytes, measure.full_kv_bytes = result.kv_bytes, result.full_kv_bytes
            del result
    if peer_list:
        request = composer.build_request(task.context, task.query)
        for method in peer_list:
            result = peer_runner.run([p.ids for p in request.pieces], request.query_ids,
                                     method.strategy, method.ratio)
            measure = scored(method, result)
            measure.kind = "peer"
            measure.kv_bytes = measure.full_kv_bytes = context_bytes
    return measures


def _context_kv_bytes(backend, state, context_tokens: int) -> int:
    """The context's share of a full request state's KV."""
    return backend.kv_bytes(state) * context_tokens // max(1, state.length)


def _measure(task, label, method, result, ref: _Reference, logp, greedy_logp, n_answer) -> Measure:
    targets = torch.tensor(ref.answer_ids)
    nll = float(-logp[torch.arange(n_answer), targets].mean())
    kl = _kl(ref.answer_logp, logp)
    if greedy_logp is None:  # the reference itself
        agree = torch.ones(len(ref.greedy_ids), dtype=torch.bool)
    else:
        agree = greedy_logp.argmax(-1) == torch.tensor(ref.greedy_ids)
    report = result.report
    return Measure(
        workload=task.workload, task=task.id, method=label, strategy=method.strategy,
        ratio=method.ratio, status=result.status, nll=nll, delta_nll=nll - ref.nll,
        exact_match=bool((logp.argmax(-1) == targets).all()),
        kl=float(kl[0]), kl_answer=float(kl.mean()),
        agreement=float(agree.float().mean()), greedy_match=bool(agree.all()),
        ttft_s=report.ttft_s, full_ttft_s=ref.ttft_s,
        context_tokens=report.context_tokens, query_tokens=report.query_tokens,
        answer_tokens=n_answer, recomputed_tokens=report.recomputed_tokens,
        recompute_ratio=report.recompute_ratio,
        store_load_s=report.timings.get("store_load", 0.0),
        fallback_reason=report.fallback_reason,
    )


def warm_up(backend) -> None:
    """One short forward pass so the first timed request does not pay for lazy initialisation."""
    state = backend.full_prefill(backend.tokenize("def warm_up():\n    return 0\n"))
    backend.generate(state, 2)


def run(composer: Composer, tasks: list[Task], method_list: list[Method], greedy_tokens: int = 8,
        progress: Callable[[str, int], None] | None = None, pruning_list: list[Method] = (),
        pruning_tasks: int | None = None, peer_list: list[Method] = (),
        peer_tasks: int | None = None) -> list[Measure]:
    """All tasks, every method; the pruning methods on the first ``pruning_tasks`` tasks of
    each workload and the peer's on the first ``peer_tasks`` (all when None);
    ``progress(description, advance)`` after each method."""
    warm_up(composer.backend)
    peer_runner = None
    if peer_list:
        from codekv.eval.peer import KVBoostRunner

        peer_runner = KVBoostRunner(composer.backend)
    measures: list[Measure] = []
    seen: dict[str, int] = {}
    for task in tasks:
        started = time.perf_counter()
        seen[task.workload] = seen.get(task.workload, 0) + 1
        prune = pruning_tasks is None or seen[task.workload] <= pruning_tasks
        peer = peer_tasks is None or seen[task.workload] <= peer_tasks

        def step(task=task):
            if progress is not None:
                progress(task.id, 1)

        measures.extend(run_task(composer, task, method_list, greedy_tokens, step,
                                 pruning_list if prune else (), peer_list if peer else (),
                                 peer_runner))
        if progress is not None:
            progress(f"{task.id} done in {time.perf_counter() - started:.1f}s", 0)
    return measures


def composed_only(measures: list[Measure]) -> bool:
    return all(m.status == COMPOSED for m in measures if m.kind == "composition")
