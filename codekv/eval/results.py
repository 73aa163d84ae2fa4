"""Per (workload, method) aggregates of the per-task measures: the rows of the result table."""

from __future__ import annotations

import math
from statistics import fmean, median, stdev

# The keys every result row has (the JSON schema of ``results``), in table order.
ROW_KEYS = (
    "workload", "method", "strategy", "ratio", "tasks", "delta_nll", "abs_delta_nll",
    "delta_nll_se", "nll", "agreement", "greedy_match", "exact_match", "kl", "kl_answer",
    "ttft_s", "full_ttft_s", "speedup", "recompute_ratio", "context_tokens", "store_load_s",
    "fallbacks", "kind", "budget", "kv_kept", "kv_bytes", "full_kv_bytes",
)


def aggregate(measures) -> list[dict]:
    """One row per (workload, method), in the order first measured.

    ``speedup`` is the median over tasks of full prefill's TTFT over the method's: a stall of
    the machine during one request (other processes on the cores) moves a mean, not a median.
    ``kind`` says what a row is: "reference" (full prefill), "composition", or "pruning" (then
    ``budget`` = ``ratio`` is the share of context KV kept, and ``kv_kept`` what was kept).
    """
    groups: dict[tuple[str, str], list] = {}
    for m in measures:
        groups.setdefault((m.workload, m.method), []).append(m)
    rows = []
    for (workload, method), group in groups.items():
        deltas = [m.delta_nll for m in group]
        ratios = [m.full_ttft_s / m.ttft_s for m in group if m.ttft_s > 0]
        rows.append({
            "workload": workload,
            "method": method,
            "strategy": group[0].strategy,
            "ratio": group[0].ratio,
            "tasks": len(group),
            "delta_nll": fmean(deltas),
            "abs_delta_nll": fmean(abs(d) for d in deltas),
            "delta_nll_se": stdev(deltas) / math.sqrt(len(deltas)) if len(deltas) > 1 else None,
            "nll": fmean(m.nll for m in group),
            "agreement": fmean(m.agreement for m in group),
            "greedy_match": fmean(float(m.greedy_match) for m in group),
            "exact_match": fmean(float(m.exact_match) for m in group),
            "kl": fmean(m.kl for m in group),
            "kl_answer": fmean(m.kl_answer for m in group),
            "ttft_s": fmean(m.ttft_s for m in group),
            "full_ttft_s": fmean(m.full_ttft_s for m in group),
            "speedup": median(ratios) if ratios else None,
            "recompute_ratio": fmean(m.recompute_ratio for m in group),
            "context_tokens": fmean(m.context_tokens for m in group),
            "store_load_s": fmean(m.store_load_s for m in group),
            "fallbacks": sum(1 for m in group
                             if m.status == "full-prefill" and m.strategy != "full"),
            "kind": group[0].kind,
            "budget": group[0].budget,
            "kv_kept": fmean(m.kv_kept for m in group),
            "kv_bytes": fmean(m.kv_bytes for m in group),
            "full_kv_bytes": fmean(m.full_kv_bytes for m in group),
        })
    return rows
