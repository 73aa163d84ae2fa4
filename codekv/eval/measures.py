"""What an evaluation records: one method on one task (``Measure``) and one method over a
workload's tasks (``ResultRow``, the rows of the result table).

Plain data without torch, so the grid, the Markdown tables and checkpoints read results
without loading a model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from codekv.conditioning import DEFAULT_CONDITIONING


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
    decisive_agreement: float | None  # None: every greedy position was a near-tie
    decisive_positions: int
    near_ties: int
    answer_exact: bool  # task score of the greedy answer: exact match,
    edit_similarity: float  # edit similarity (0-100),
    identifier_f1: float  # and identifier F1
    ttft_s: float
    full_ttft_s: float
    context_tokens: int
    query_tokens: int
    answer_tokens: int
    recomputed_tokens: int
    recompute_ratio: float
    store_load_s: float = 0.0
    conditioning: str = DEFAULT_CONDITIONING  # what the chunk KV was computed after
    offline_prefill_s: float = 0.0  # filling the chunk store for this task (cold chunks only)
    offline_tokens: int = 0  # tokens run through the model for it (chunks + their conditioning)
    fallback_reason: str | None = None
    kind: str = "composition"  # "reference" (full prefill), "composition", "pruning", "peer"
    budget: float | None = None  # pruning: the share of context KV kept
    kv_bytes: int = 0  # context KV the request state holds
    full_kv_bytes: int = 0  # context KV full prefill holds
    same_answer: bool | None = None  # its scored greedy answer is full prefill's, token for token

    @property
    def kv_kept(self) -> float:
        return self.kv_bytes / self.full_kv_bytes if self.full_kv_bytes else 1.0

    def as_json(self) -> dict:
        return dict(self.__dict__, kv_kept=self.kv_kept)

    @classmethod
    def from_json(cls, data: dict) -> Measure:
        """A measure as ``as_json`` wrote it (``kv_kept`` is derived, not read back)."""
        return cls(**{k: v for k, v in data.items() if k in _MEASURE_FIELDS})


_MEASURE_FIELDS = frozenset(f.name for f in fields(Measure))

Interval = list[float] | None  # a 95% bootstrap interval over tasks; None for fewer than two


@dataclass
class ResultRow:
    """One method over one workload's tasks: means of the measures, each ``*_ci`` a 95%
    bootstrap interval over the tasks (``codekv.eval.results.aggregate`` explains each)."""

    workload: str
    method: str
    strategy: str
    rule: str | None  # the strategy with its conditioning when not the default
    conditioning: str | None
    ratio: float
    tasks: int
    delta_nll: float | None
    delta_nll_ci: Interval
    abs_delta_nll: float | None
    abs_delta_nll_ci: Interval
    delta_nll_se: float | None
    nll: float
    agreement: float | None
    agreement_ci: Interval
    decisive_agreement: float | None  # None: every greedy position was a near-tie
    decisive_agreement_ci: Interval
    decisive_positions: int
    near_ties: int
    greedy_match: float
    exact_match: float
    answer_exact: float
    # Of the tasks full prefill solves (its greedy answer is the expected one), how many, and
    # the share this method still solves with its Wilson 95% interval (None: it solves none).
    solved: int
    retention: float | None
    retention_ci: Interval
    same_answer: float | None  # share of tasks whose greedy answer is full prefill's own
    edit_similarity: float | None
    edit_similarity_ci: Interval
    identifier_f1: float
    score_drop: float | None  # full prefill's edit similarity minus the method's
    score_drop_ci: Interval
    kl: float | None
    kl_ci: Interval
    kl_answer: float
    ttft_s: float
    full_ttft_s: float
    speedup: float | None  # median over tasks of full prefill's TTFT over the method's
    recompute_ratio: float
    context_tokens: float
    store_load_s: float
    offline_prefill_s: float
    offline_tokens: float
    fallbacks: int  # composition requests that fell back to full prefill
    kind: str | None  # "reference", "composition", "pruning" or "peer"
    budget: float | None  # pruning: the share of context KV kept
    kv_kept: float
    kv_bytes: float
    full_kv_bytes: float

    def as_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> ResultRow:
        """A row of an ``eval --json`` file; a key an older file lacks reads as None."""
        return cls(**{f.name: data.get(f.name) for f in fields(cls)})
