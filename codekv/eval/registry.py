"""The workload registry: one entry per workload, naming everything that differs between them.

Torch-free: the support gate maps a request's chunks to the workload whose evidence licenses
them, and the command line lists workloads, without loading the evaluation. A new workload is
one module with a generator plus one line here; the generator is imported when tasks are made.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

OTHER_REPOS, OTHER_SEED = "repos", "seed"  # where held-out tasks are drawn from


@dataclass(frozen=True)
class Workload:
    name: str
    # "module:function" taking (n, seed, context_tokens, count, index, max_query_tokens) and
    # returning a list of ``codekv.eval.workloads.Task``; ``index`` is None unless needed.
    generator: str
    # What a request's chunks are when they belong to this workload (``Passage.kind``, "code"
    # for indexed chunks): the gate licenses them by this workload's evidence.
    chunk_kind: str
    needs_index: bool = False  # draws from indexed repositories (``--repo``)
    # Its tasks are code of a language each: the generator takes ``languages=`` (which ones
    # to draw; ``--language``) and records each task's ``language``.
    by_language: bool = False
    # Where held-out tasks come from: other repositories (OTHER_REPOS) or another seed.
    held_out_by: str = OTHER_SEED

    def generate(self, n: int, seed: int, context_tokens: int, count, index=None,
                 max_query_tokens: int = 256, languages: tuple[str, ...] | None = None) -> list:
        if self.needs_index and index is None:
            raise ValueError(f"{self.name} needs an index of a repository")
        module, _, function = self.generator.partition(":")
        make = getattr(importlib.import_module(module), function)
        if self.by_language:
            return make(n, seed, context_tokens, count, index, max_query_tokens,
                        languages=languages)
        return make(n, seed, context_tokens, count, index, max_query_tokens)


WORKLOADS: dict[str, Workload] = {}


def register(workload: Workload) -> Workload:
    if workload.held_out_by not in (OTHER_REPOS, OTHER_SEED):
        raise ValueError(f"{workload.name}: held_out_by must be {OTHER_REPOS!r} or "
                         f"{OTHER_SEED!r}, not {workload.held_out_by!r}")
    WORKLOADS[workload.name] = workload
    return workload


def workload_of(chunk_kind: str) -> str:
    """The workload whose evidence covers chunks of ``chunk_kind``."""
    for workload in WORKLOADS.values():
        if workload.chunk_kind == chunk_kind:
            return workload.name
    raise KeyError(f"no workload covers {chunk_kind!r} chunks")


register(Workload("code-qa", "codekv.eval.workloads:code_qa_tasks", "code", needs_index=True,
                  held_out_by=OTHER_REPOS, by_language=True))
register(Workload("rag", "codekv.eval.workloads:rag_tasks", "passage"))
register(Workload("tool-docs", "codekv.eval.workloads:tool_docs_tasks", "tool-doc"))
