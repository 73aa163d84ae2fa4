"""Per (workload, method) aggregates of the per-task measures: the rows of the result table,
each mean with its paired-bootstrap 95% interval over tasks, and paired comparisons of rules."""

from __future__ import annotations

import math
from statistics import fmean, median, stdev

from codekv.conditioning import DEFAULT_CONDITIONING
from codekv.eval.measures import ResultRow
from codekv.eval.methods import SHIFT_ONLY
from codekv.eval.stats import bootstrap_ci, paired_difference, wilson_ci
from codekv.schema import rule_name

# Rules are compared with these baselines, at the same ratio, on the same tasks; ``query``
# so that its variants (``query-cost``, ``query-anchors``) show what their addition does.
BASELINES = ("deviation", "boundary", "query")


def mean_ci(values: list[float]) -> tuple[float | None, list[float] | None]:
    if not values:
        return None, None
    interval = bootstrap_ci(values)
    return fmean(values), list(interval) if interval else None


def aggregate(measures) -> list[ResultRow]:
    """One row per (workload, method), in the order first measured.

    ``speedup`` is the median over tasks of full prefill's TTFT over the method's: a stall of
    the machine during one request (other processes on the cores) moves a mean, not a median.
    ``kind`` says what a row is: "reference" (full prefill, and full prefill reordered),
    "composition", "pruning" (then ``budget`` = ``ratio`` is the share of context KV kept, and
    ``kv_kept`` what was kept) or "peer". ``score_drop`` is full prefill's edit similarity minus
    the method's, per task. ``retention``: of the tasks full prefill solves (its greedy answer
    is the expected one), the share the method still solves. Every other ``*_ci`` is a 95%
    bootstrap interval over the tasks; ``retention_ci`` is Wilson's.
    """
    groups: dict[tuple[str, str], list] = {}
    for m in measures:
        groups.setdefault((m.workload, m.method), []).append(m)
    full = {(m.workload, m.task): m for m in measures if m.method == "full"}
    rows = []
    for (workload, method), group in groups.items():
        deltas = [m.delta_nll for m in group]
        ratios = [m.full_ttft_s / m.ttft_s for m in group if m.ttft_s > 0]
        decisive = [m.decisive_agreement for m in group if m.decisive_agreement is not None]
        drops = [full[(m.workload, m.task)].edit_similarity - m.edit_similarity
                 for m in group if (m.workload, m.task) in full]
        solved = [m.answer_exact for m in group
                  if (m.workload, m.task) in full and full[(m.workload, m.task)].answer_exact]
        retention_ci = wilson_ci(sum(solved), len(solved))
        same = [m.same_answer for m in group if m.same_answer is not None]
        delta_nll, delta_nll_ci = mean_ci(deltas)
        abs_delta, abs_delta_ci = mean_ci([abs(d) for d in deltas])
        agreement, agreement_ci = mean_ci([m.agreement for m in group])
        decisive_agreement, decisive_ci = mean_ci(decisive)
        similarity, similarity_ci = mean_ci([m.edit_similarity for m in group])
        score_drop, score_drop_ci = mean_ci(drops)
        kl, kl_ci = mean_ci([m.kl for m in group])
        rows.append(ResultRow(
            workload=workload,
            method=method,
            strategy=group[0].strategy,
            rule=_rule(group[0]),
            conditioning=group[0].conditioning,
            ratio=group[0].ratio,
            tasks=len(group),
            delta_nll=delta_nll,
            delta_nll_ci=delta_nll_ci,
            abs_delta_nll=abs_delta,
            abs_delta_nll_ci=abs_delta_ci,
            delta_nll_se=stdev(deltas) / math.sqrt(len(deltas)) if len(deltas) > 1 else None,
            nll=fmean(m.nll for m in group),
            agreement=agreement,
            agreement_ci=agreement_ci,
            decisive_agreement=decisive_agreement,
            decisive_agreement_ci=decisive_ci,
            decisive_positions=sum(m.decisive_positions for m in group),
            near_ties=sum(m.near_ties for m in group),
            greedy_match=fmean(float(m.greedy_match) for m in group),
            exact_match=fmean(float(m.exact_match) for m in group),
            answer_exact=fmean(float(m.answer_exact) for m in group),
            solved=len(solved),
            retention=fmean(map(float, solved)) if solved else None,
            retention_ci=list(retention_ci) if retention_ci else None,
            same_answer=fmean(map(float, same)) if same else None,
            edit_similarity=similarity,
            edit_similarity_ci=similarity_ci,
            identifier_f1=fmean(m.identifier_f1 for m in group),
            score_drop=score_drop,
            score_drop_ci=score_drop_ci,
            kl=kl,
            kl_ci=kl_ci,
            kl_answer=fmean(m.kl_answer for m in group),
            ttft_s=fmean(m.ttft_s for m in group),
            full_ttft_s=fmean(m.full_ttft_s for m in group),
            speedup=median(ratios) if ratios else None,
            recompute_ratio=fmean(m.recompute_ratio for m in group),
            context_tokens=fmean(m.context_tokens for m in group),
            store_load_s=fmean(m.store_load_s for m in group),
            offline_prefill_s=fmean(m.offline_prefill_s for m in group),
            offline_tokens=fmean(m.offline_tokens for m in group),
            fallbacks=sum(1 for m in group
                          if m.status == "full-prefill" and m.kind == "composition"),
            kind=group[0].kind,
            budget=group[0].budget,
            kv_kept=fmean(m.kv_kept for m in group),
            kv_bytes=fmean(m.kv_bytes for m in group),
            full_kv_bytes=fmean(m.full_kv_bytes for m in group),
        ))
    return rows


def _rule(m) -> str:
    return rule_name(m.strategy, m.conditioning) if m.kind == "composition" else m.strategy


def comparisons(measures, baselines: tuple[str, ...] = BASELINES) -> list[dict]:
    """Each composition rule against each baseline rule at the same ratio (under the default
    conditioning), ``shift-only`` against ``none`` (what the previous request's order costs),
    and each rule under another conditioning against itself under the default,
    on the tasks both ran: the paired difference of mean |ΔNLL| (negative: the rule is closer
    to full prefill) with its interval, and the ratio of the two means (the issue's "at most
    half")."""
    by_method: dict[tuple[str, str, float], dict[str, float]] = {}
    for m in measures:
        if m.kind == "composition":
            by_method.setdefault((m.workload, _rule(m), m.ratio), {})[m.task] = abs(m.delta_nll)
    strategy_of = {_rule(m): m.strategy for m in measures if m.kind == "composition"}
    out = []
    for (workload, strategy, ratio), rule in by_method.items():
        against = list(baselines)
        if strategy_of[strategy] != strategy:
            against.append(strategy_of[strategy])
        if strategy_of[strategy] == SHIFT_ONLY:  # the same KV in the request's order
            against.append(rule_name("none", strategy.partition("+")[2] or DEFAULT_CONDITIONING))
        for baseline in dict.fromkeys(against):  # deviation+graph meets deviation once
            base = by_method.get((workload, baseline, ratio))
            if baseline == strategy or not base:
                continue
            tasks = sorted(set(rule) & set(base))
            if len(tasks) < 2:
                continue
            a, b = [rule[t] for t in tasks], [base[t] for t in tasks]
            difference, interval = paired_difference(a, b)
            out.append({
                "workload": workload, "strategy": strategy, "baseline": baseline,
                "ratio": ratio, "tasks": len(tasks), "metric": "abs_delta_nll",
                "mean": fmean(a), "baseline_mean": fmean(b), "difference": difference,
                "difference_ci": list(interval) if interval else None,
                "ratio_of_means": fmean(a) / fmean(b) if fmean(b) > 0 else None,
            })
    return out
