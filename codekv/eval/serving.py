"""Agent-session tasks served by ``codekv serve``'s own pipeline (``serve.engine.Pipeline``).

Each method is a pipeline of its own (its rule, reusing KV from the scope's last prompt alone:
the sources the task's workload measures, ``schema.reads``) that serves every call of a session
in order, as the server would: a call's last prompt is what that pipeline made of the call
before. A task's composed state is the one the pipeline builds for its call; the reference is
full prefill of the same prompt tokens (``full_prefill``).
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass, field

from codekv.eval.methods import Method
from codekv.request import FULL_PREFILL, Report
from codekv.schema import WORKLOADS, reads

PROMPT_BUDGET_BYTES = 2 << 30  # per pipeline: its exact prefixes and last prompts


@dataclass
class Served:
    """A request state as the runner scores it (``ComposeResult``'s shape)."""

    status: str
    report: Report
    state: object


def prompt_of(backend, call):
    """A session call as the server renders it: the messages through the model's chat
    template, then the reply it begins."""
    from codekv.serve.chat import chat_prompt

    prompt = chat_prompt(backend, call.messages)
    prompt.text += call.partial
    return prompt


def full_prefill(backend, task) -> Served:
    """The reference: full prefill of the tokens the pipeline serves for the task's call."""
    started = time.perf_counter()
    prompt = prompt_of(backend, task.calls[-1])
    ids, _ = backend.tokenize_prompt(prompt.text, prompt.markers)
    query = len(backend.tokenize(task.query))
    state = backend.full_prefill(ids)
    report = Report(status=FULL_PREFILL, total_tokens=len(ids), context_tokens=len(ids),
                    query_tokens=query, recomputed_tokens=len(ids), recompute_ratio=1.0,
                    recompute_attention=1.0)
    report.ttft_s = time.perf_counter() - started
    return Served(FULL_PREFILL, report, state)


@dataclass
class Serving:
    """The agent-session tasks' methods, each served by its pipeline; other tasks are not
    its."""

    methods: list[Method]
    tasks: int | None = None
    # (method label, sources) -> (Pipeline, scope -> calls)
    pipelines: dict = field(default_factory=dict)
    sessions = True

    def count(self, workload: str) -> int:
        return len(self.methods)

    def results(self, composer, task, prefix: str | None = None
                ) -> Generator[tuple[Method, object], None, None]:
        scope = f"{task.meta.get('repo', '')}/{task.meta['session']}"
        sources = reads(WORKLOADS[task.workload].source)
        for method in self.methods:
            pipeline, served = self._pipeline(composer, method, sources)
            # The session's earlier calls, where this pipeline has not served them (its first
            # task, or a run resumed from a checkpoint): served as the server would have.
            for call in task.calls[served.get(scope, 0):-1]:
                pipeline.done(scope, pipeline.prefill(scope, prompt_of(pipeline.backend, call)))
            result = pipeline.prefill(scope, prompt_of(pipeline.backend, task.calls[-1]))
            served[scope] = len(task.calls)
            report = _report(pipeline.backend, result.outcome, task)
            yield method, Served(result.outcome.status, report, result.state)
            pipeline.done(scope, result)  # the state as the prefill left it: scoring rewinds

    def _pipeline(self, composer, method: Method, sources: tuple[str, ...]):
        if (method.label, sources) not in self.pipelines:
            from codekv.gate import SupportGate
            from codekv.serve.engine import Pipeline

            # Experimental: the evidence measures what a licence would let through. The store
            # is the evaluation's, which a pipeline of the last prompt alone never reads.
            pipeline = Pipeline(composer.backend, composer.store,
                                SupportGate([], "the evaluation"),
                                experimental=True, strategy=method.strategy, ratio=method.ratio,
                                prefix_budget_bytes=PROMPT_BUDGET_BYTES, sources=sources)
            self.pipelines[method.label, sources] = (pipeline, {})
        return self.pipelines[method.label, sources]


def _report(backend, outcome, task) -> Report:
    """The pipeline's outcome as the runner's report: the prompt's tokens as the context
    (what the gate is asked about a served request), and as recomputed every token the model
    ran (the rule's share of reused segments and everything computed fresh)."""
    computed = outcome.recomputed_tokens + outcome.prefilled_tokens
    return Report(status=outcome.status, strategy=outcome.strategy, ratio=outcome.ratio,
                  total_tokens=outcome.prompt_tokens, prefix_tokens=outcome.exact_prefix_tokens,
                  context_tokens=outcome.prompt_tokens,
                  query_tokens=len(backend.tokenize(task.query)),
                  reused_tokens=outcome.reused_tokens, recomputed_tokens=computed,
                  recompute_ratio=computed / max(1, outcome.prompt_tokens),
                  chunk_hits=outcome.segments_reused,
                  exact_prefix_hit=bool(outcome.exact_prefix_tokens), ttft_s=outcome.ttft_s,
                  fallback_reason=outcome.fallback_reason)
