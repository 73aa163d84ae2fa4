"""What the runtime knows of the evidence, importable without torch: the kinds of chunk a
request holds, the workload whose evidence licenses each kind, and the rules the support gate
may license.

A new workload is one module with a generator plus one line here; the generator is imported
only when tasks are made (``codekv eval``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from enum import StrEnum

from codekv.conditioning import DEFAULT_CONDITIONING
from codekv.selection import STRATEGIES as SELECTION


class ChunkKind(StrEnum):
    """What a request's chunk is: indexed code, a free text passage or a tool's documentation."""

    CODE = "code"
    PASSAGE = "passage"
    TOOL_DOC = "tool-doc"


OTHER_REPOS, OTHER_SEED = "repos", "seed"  # where held-out tasks are drawn from
# Where a reused segment's KV came from: the chunk store (computed alone, after what its key
# says), the scope's last prompt (computed there, among nearly the same neighbours), or the
# last prompt's part of a segment that changed since (its unchanged head or tail: computed
# there against the span that changed), a message's text (a system prompt after a new header,
# a summary that grew) apart from a piece of code (a function edited), or the last prompt's run
# of the text between segments (message framing, short messages: a history after a new header).
# The gate rules on each by the evidence of the workload that measured that source.
STORE, LAST_PROMPT = "store", "last-prompt"
LAST_PROMPT_TEXT_PART, LAST_PROMPT_PART = "last-prompt-text-part", "last-prompt-part"
LAST_PROMPT_RUN = "last-prompt-run"
PARTS = (LAST_PROMPT_TEXT_PART, LAST_PROMPT_PART)
SOURCES = (LAST_PROMPT, *PARTS, LAST_PROMPT_RUN, STORE)
FROM_LAST_PROMPT = (LAST_PROMPT, *PARTS, LAST_PROMPT_RUN)


def part_source(kind: ChunkKind) -> str:
    """The source of a changed segment's parts: a piece of code's, or any other text's."""
    return LAST_PROMPT_PART if kind == ChunkKind.CODE else LAST_PROMPT_TEXT_PART


def reads(source: str) -> tuple[str, ...]:
    """The sources a pipeline measuring ``source`` reads: parts of changed segments are
    measured together with the whole segments around them, and code's parts with text's too,
    as the server reuses them where both are licensed; runs with segments and text's parts."""
    return {LAST_PROMPT_TEXT_PART: (LAST_PROMPT, LAST_PROMPT_TEXT_PART),
            LAST_PROMPT_PART: (LAST_PROMPT, *PARTS),
            LAST_PROMPT_RUN: (LAST_PROMPT, LAST_PROMPT_TEXT_PART, LAST_PROMPT_RUN),
            }.get(source, (source,))


# What a request may be composed with, so what the gate may license: a rule that recomputes a
# share (not one that recomputes everything: that is full prefill at a higher cost) and
# re-positions (not the baseline that skips it: it only shows the damage), and not a control.
GATE_STRATEGIES = tuple(name for name, cls in SELECTION.items()
                        if not cls.recomputes_all and cls.reposition and not cls.control)


@dataclass(frozen=True)
class Workload:
    name: str
    # "module:function" taking (n, seed, context_tokens, count, index, max_query_tokens) and
    # returning a list of ``codekv.eval.workloads.Task``; ``index`` is None unless needed.
    generator: str
    # What a request's chunks are when they belong to this workload: the gate licenses them by
    # this workload's evidence.
    chunk_kind: ChunkKind
    needs_index: bool = False  # draws from indexed repositories (``--repo``)
    # Its tasks are code of a language each: the generator takes ``languages=`` (which ones
    # to draw; ``--language``) and records each task's ``language``.
    by_language: bool = False
    # The generator takes ``workload=``: workloads that draw the same tasks, each measuring
    # another source of reused KV, name their tasks after themselves.
    named: bool = False
    # Where held-out tasks come from: other repositories (OTHER_REPOS) or another seed.
    held_out_by: str = OTHER_SEED
    # Where the KV its methods reuse comes from (one of SOURCES): a workload of the last
    # prompt licenses segments of every kind taken from there, and ``chunk_kind`` is what most
    # of them are.
    source: str = STORE
    # Run when ``codekv eval`` is given no ``--workload`` (off for a workload whose tasks need
    # long contexts and take much longer).
    by_default: bool = True

    def generate(self, n: int, seed: int, context_tokens: int, count, index=None,
                 max_query_tokens: int = 256, languages: tuple[str, ...] | None = None) -> list:
        if self.needs_index and index is None:
            raise ValueError(f"{self.name} needs an index of a repository")
        module, _, function = self.generator.partition(":")
        make = getattr(importlib.import_module(module), function)
        options = {"languages": languages} if self.by_language else {}
        if self.named:
            options["workload"] = self.name
        return make(n, seed, context_tokens, count, index, max_query_tokens, **options)


WORKLOADS: dict[str, Workload] = {}


def register(workload: Workload) -> Workload:
    if workload.source not in SOURCES:
        raise ValueError(f"{workload.name}: source must be one of {', '.join(SOURCES)}, not "
                         f"{workload.source!r}")
    if workload.held_out_by not in (OTHER_REPOS, OTHER_SEED):
        raise ValueError(f"{workload.name}: held_out_by must be {OTHER_REPOS!r} or "
                         f"{OTHER_SEED!r}, not {workload.held_out_by!r}")
    WORKLOADS[workload.name] = workload
    return workload


def default_workloads() -> tuple[str, ...]:
    """The workloads ``codekv eval`` runs unless told which."""
    return tuple(name for name, workload in WORKLOADS.items() if workload.by_default)


def workload_of(chunk_kind: str, source: str = STORE) -> str:
    """The workload whose evidence covers chunks of ``chunk_kind`` whose KV came from
    ``source``."""
    for workload in WORKLOADS.values():
        if workload.source == source and (source in FROM_LAST_PROMPT
                                          or workload.chunk_kind == chunk_kind):
            return workload.name
    raise KeyError(f"no workload covers {chunk_kind!r} chunks from the {source}")


def rule_name(strategy: str, conditioning: str = DEFAULT_CONDITIONING) -> str:
    """A composition rule's strategy, with the conditioning when it is not the default."""
    return strategy if conditioning == DEFAULT_CONDITIONING else f"{strategy}+{conditioning}"


def rule_label(strategy: str, ratio: float, conditioning: str = DEFAULT_CONDITIONING) -> str:
    """How results and the support file name a rule: ``query@0.15``, ``query+graph@0.15``, or
    ``none`` (a rule that recomputes nothing has no ratio)."""
    name = rule_name(strategy, conditioning)
    return name if SELECTION[strategy].ratio_free else f"{name}@{ratio:g}"


register(Workload("code-qa", "codekv.eval.workloads:code_qa_tasks", ChunkKind.CODE,
                  needs_index=True, held_out_by=OTHER_REPOS, by_language=True))
register(Workload("rag", "codekv.eval.workloads:rag_tasks", ChunkKind.PASSAGE, needs_index=True,
                  held_out_by=OTHER_REPOS))
register(Workload("tool-docs", "codekv.eval.workloads:tool_docs_tasks", ChunkKind.TOOL_DOC,
                  needs_index=True, held_out_by=OTHER_REPOS))
# The same agent sessions, each workload serving them reading another source of the last
# prompt (``reads``): its whole segments; the unchanged parts of changed segments, code's and
# text's; those of changed text alone (the system prompt after a new header, a summary that
# grew); runs of the text between segments (a history's short messages, their framing).
for name, kind, source in (("agent-session", ChunkKind.CODE, LAST_PROMPT),
                           ("agent-session-parts", ChunkKind.CODE, LAST_PROMPT_PART),
                           ("agent-session-text-parts", ChunkKind.PASSAGE, LAST_PROMPT_TEXT_PART),
                           ("agent-session-runs", ChunkKind.PASSAGE, LAST_PROMPT_RUN)):
    register(Workload(name, "codekv.eval.sessions:agent_session_tasks", kind, needs_index=True,
                      held_out_by=OTHER_REPOS, by_language=True, named=True, source=source,
                      by_default=False))
