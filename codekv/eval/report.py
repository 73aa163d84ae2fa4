"""Showing results: the rich table, the gate verdicts, the reuse simulation, and PNG plots."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from codekv.eval.measures import Measure, ResultRow


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def is_pruning(row: ResultRow) -> bool:
    return row.kind == "pruning"


def is_peer(row: ResultRow) -> bool:
    return row.kind == "peer"


def ci(value, interval, fmt: str) -> str:
    """A mean and its 95% interval: ``+0.052 [+0.031, +0.078]``."""
    if value is None:
        return "-"
    if not interval:
        return format(value, fmt)
    return f"{value:{fmt}} [{interval[0]:{fmt}}, {interval[1]:{fmt}}]"


def retained(retention, interval, solved) -> str:
    """Retention with its interval and the tasks full prefill solves (``-``: it solves none)."""
    if retention is None:
        return "-"
    return f"{ci(retention, interval, '.2f')} of {solved}"


def results_table(rows: list[ResultRow], title: str = "codekv eval") -> Table:
    table = Table(title=title + " (95% intervals over tasks)")
    for name in ("workload", "method", "tasks", "dNLL", "|dNLL|", "agree", "decisive",
                 "ties", "retention", "ES drop", "KL", "TTFT s", "speedup", "recomp"):
        table.add_column(name, justify="left" if name in ("workload", "method") else "right")
    for r in rows:
        if is_pruning(r):
            continue
        table.add_row(
            r.workload, r.method, str(r.tasks),
            ci(r.delta_nll, r.delta_nll_ci, "+.3f"),
            ci(r.abs_delta_nll, r.abs_delta_nll_ci, ".3f"), _num(r.agreement, ".1%"),
            _num(r.decisive_agreement, ".1%"), str(r.near_ties),
            retained(r.retention, r.retention_ci, r.solved),
            ci(r.score_drop, r.score_drop_ci, "+.1f"), _num(r.kl, ".3f"),
            _num(r.ttft_s, ".2f"), _num(r.speedup, ".1f") + "x",
            _num(r.recompute_ratio, ".0%"),
        )
    return table


def comparisons_table(comparisons: list[dict]) -> Table:
    """Paired differences of mean |dNLL| between rules at the same ratio, on the same tasks."""
    table = Table(title="rules against baselines at the same ratio (paired, 95% intervals)")
    for name in ("workload", "rule", "vs", "ratio", "tasks", "|dNLL|", "baseline", "difference",
                 "rule/baseline"):
        table.add_column(name, justify="left" if name in ("workload", "rule", "vs") else "right")
    for c in comparisons:
        table.add_row(c["workload"], c["strategy"], c["baseline"], f"{c['ratio']:g}",
                      str(c["tasks"]), f"{c['mean']:.3f}", f"{c['baseline_mean']:.3f}",
                      ci(c["difference"], c["difference_ci"], "+.3f"),
                      _num(c["ratio_of_means"], ".2f"))
    return table


def pruning_table(rows: list[ResultRow]) -> Table:
    """KV pruning baselines at equal budgets: quality for the share of context KV kept."""
    table = Table(title="KV pruning (kvpress) at equal KV budgets, against full prefill")
    for name in ("workload", "method", "budget", "KV kept", "tasks", "dNLL", "|dNLL|", "agree",
                 "greedy=", "EM", "KL", "TTFT s", "speedup", "KV MiB"):
        table.add_column(name, justify="left" if name in ("workload", "method") else "right")
    for r in rows:
        if not is_pruning(r):
            continue
        table.add_row(
            r.workload, r.strategy, _num(r.budget, ".0%"), _num(r.kv_kept, ".1%"),
            str(r.tasks), _num(r.delta_nll, "+.3f"), _num(r.abs_delta_nll, ".3f"),
            _num(r.agreement, ".1%"), _num(r.greedy_match, ".0%"),
            _num(r.exact_match, ".0%"), _num(r.kl, ".3f"), _num(r.ttft_s, ".2f"),
            _num(r.speedup, ".1f") + "x", _num(r.kv_bytes / 2**20, ".1f"),
        )
    return table


def throughput_table(rows: list[dict]) -> Table:
    """One agent session served by each method from a cold chunk store."""
    table = Table(title="throughput: one agent session, cold chunk store")
    for name in ("method", "requests", "tokens", "seconds", "req/s", "vs full", "median TTFT s",
                 "store MiB", "peak RSS MiB", "over model"):
        table.add_column(name, justify="left" if name == "method" else "right")
    for r in rows:
        table.add_row(r["method"], str(r["requests"]), str(r["tokens"]), _num(r["seconds"], ".1f"),
                      _num(r["requests_per_s"], ".2f"), _num(r["speedup"], ".2f") + "x",
                      _num(r["median_ttft_s"], ".2f"), _num(r["store_bytes"] / 2**20, ".0f"),
                      _num(r.get("peak_rss_mib"), ".0f"),
                      _num(r.get("peak_over_model_mib"), "+.0f"))
    return table


def gate_table(entries: list[dict]) -> Table:
    # An evidence run's verdicts: a pass licenses composition once held-out tasks confirm it.
    table = Table(title="support gate: this run's tasks")
    for name in ("family", "workload", "verdict", "method", "reason"):
        table.add_column(name)
    for e in entries:
        verdict = "[green]pass[/green]" if e["passed"] else "[red]fail[/red]"
        table.add_row(e["family"], e["workload"], verdict, e.get("method") or "-", e["reason"])
    return table


def print_report(console: Console, rows: list[ResultRow], entries: list[dict] | None,
                 reuse: dict | None, notes: list[str], throughput: list[dict] = (),
                 comparisons: list[dict] = ()) -> None:
    console.print(results_table(rows))
    if comparisons:
        console.print(comparisons_table(comparisons))
    if any(is_pruning(r) for r in rows):
        console.print(pruning_table(rows))
    if throughput:
        console.print(throughput_table(throughput))
    if entries:
        console.print(gate_table(entries))
    if reuse:
        console.print(
            f"prefill reuse over {reuse['sessions']} simulated sessions x "
            f"{reuse['tasks_per_session']} tasks ({reuse['prefill_tokens']} tokens): exact prefix "
            f"cache {reuse['exact_prefix_share']:.1%}, chunk composition "
            f"{reuse['composition_share']:.1%} ({reuse['composition_share_after_recompute']:.1%} "
            f"after recomputing {reuse['recompute_ratio']:.0%})"
        )
    for note in notes:
        console.print(f"[yellow]note[/yellow]: {note}")


def plot(rows: list[ResultRow], measures: list[Measure], directory: str | Path) -> list[Path] | str:
    """Quality vs recompute ratio per strategy, TTFT vs context length, and (when pruning ran)
    quality vs KV budget per pruning rule; returns the files, or why there are none
    (matplotlib is an optional extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'codekv[eval]'): no plots"
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    pruned = [r for r in rows if is_pruning(r)]
    rows = [r for r in rows if not is_pruning(r) and not is_peer(r)]
    measures = [m for m in measures if m.kind not in ("pruning", "peer")]
    workloads = list(dict.fromkeys(r.workload for r in rows))
    files = []

    fig, axes = plt.subplots(2, len(workloads), figsize=(5 * len(workloads), 7), squeeze=False)
    for column, workload in enumerate(workloads):
        mine = [r for r in rows if r.workload == workload and r.strategy != "full"]
        for strategy in dict.fromkeys(r.rule for r in mine):
            points = sorted((r.ratio, r.abs_delta_nll, r.agreement)
                            for r in mine if r.rule == strategy)
            if strategy in ("none", "none-norope"):  # no ratio: a level to beat
                axes[0][column].axhline(points[0][1], linestyle="--", label=strategy,
                                        color="grey" if strategy == "none" else "silver")
                axes[1][column].axhline(points[0][2], linestyle="--", label=strategy,
                                        color="grey" if strategy == "none" else "silver")
                continue
            x = [p[0] for p in points]
            axes[0][column].plot(x, [p[1] for p in points], "o-", label=strategy)
            axes[1][column].plot(x, [p[2] for p in points], "o-", label=strategy)
        axes[0][column].set_title(workload)
        axes[0][column].set_ylabel("mean |delta NLL| (nats/token)")
        axes[1][column].set_ylabel("greedy agreement")
        axes[1][column].set_xlabel("recompute ratio")
        axes[0][column].legend(fontsize="small")
    fig.tight_layout()
    files.append(directory / "quality_vs_ratio.png")
    fig.savefig(files[-1], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 5))
    full = {(m.workload, m.task): m for m in measures if m.strategy == "full"}
    ax.scatter([m.context_tokens for m in full.values()],
               [m.ttft_s for m in full.values()], label="full prefill", marker="s")
    for method in dict.fromkeys(m.method for m in measures if m.strategy != "full"):
        if method.endswith("@0.15") or method == "none":
            mine = [m for m in measures if m.method == method]
            ax.scatter([m.context_tokens for m in mine], [m.ttft_s for m in mine],
                       label=method, s=12)
    ax.set_xlabel("context tokens")
    ax.set_ylabel("TTFT (s)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    files.append(directory / "ttft_vs_context.png")
    fig.savefig(files[-1], dpi=100)
    plt.close(fig)
    if pruned:
        files.append(_plot_pruning(plt, pruned, directory / "pruning_vs_budget.png"))
    return files


def _plot_pruning(plt, rows: list[ResultRow], path: Path) -> Path:
    """Per workload: |delta NLL| and greedy agreement against the share of context KV kept."""
    workloads = list(dict.fromkeys(r.workload for r in rows))
    fig, axes = plt.subplots(2, len(workloads), figsize=(5 * len(workloads), 7), squeeze=False)
    for column, workload in enumerate(workloads):
        mine = [r for r in rows if r.workload == workload]
        for strategy in dict.fromkeys(r.strategy for r in mine):
            points = sorted((r.budget, r.abs_delta_nll, r.agreement)
                            for r in mine if r.strategy == strategy)
            x = [p[0] for p in points]
            style = "s-" if strategy == "anchor-preserving" else "o-"
            axes[0][column].plot(x, [p[1] for p in points], style, label=strategy)
            axes[1][column].plot(x, [p[2] for p in points], style, label=strategy)
        for row in (0, 1):  # budgets are shares: show all of 0..1, and full prefill's level
            axes[row][column].set_xlim(0, 1.05)
            axes[row][column].axhline(row, linestyle="--", color="grey", label="full")
        axes[0][column].set_ylim(bottom=0)
        axes[0][column].set_title(f"{workload} ({mine[0].tasks} tasks)")
        axes[0][column].set_ylabel("mean |delta NLL| (nats/token)")
        axes[1][column].set_ylabel("greedy agreement")
        axes[1][column].set_xlabel("share of context KV kept")
        axes[0][column].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
