"""Render an evaluation's JSON (``codekv eval --json``) as the Markdown tables of docs/results.md.

Usage: ``python -m codekv.eval.markdown results.json > docs/results.md.tables``
"""

from __future__ import annotations

import json
import sys


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _pruning(row: dict) -> bool:
    return row.get("kind") == "pruning"


def results_tables(data: dict) -> str:
    lines = []
    for workload in dict.fromkeys(r["workload"] for r in data["results"]):
        lines += [f"### {workload}", ""]
        lines.append(_row(["method", "ratio", "tasks", "ΔNLL", "agreement", "exact match",
                           "KL", "TTFT s", "speedup"]))
        lines.append(_row(["---"] * 9))
        for r in data["results"]:
            if r["workload"] != workload or _pruning(r):
                continue
            lines.append(_row([
                r["strategy"] if "strategy" in r and r["strategy"] else r["method"],
                f"{r['ratio']:.2f}", r["tasks"], f"{r['delta_nll']:+.3f}",
                f"{r['agreement']:.2f}", f"{r['exact_match']:.2f}", f"{r['kl']:.3f}",
                f"{r['ttft_s']:.2f}", f"{r['speedup']:.2f}x",
            ]))
        lines.append("")
    return "\n".join(lines)


def pruning_tables(data: dict) -> str:
    """KV pruning baselines (kvpress) at equal KV budgets, per workload; empty without any."""
    rows = [r for r in data["results"] if _pruning(r)]
    lines = []
    for workload in dict.fromkeys(r["workload"] for r in rows):
        lines += [f"### {workload}: KV pruning at equal budgets", ""]
        lines.append(_row(["method", "KV budget", "KV kept", "tasks", "ΔNLL", "agreement",
                           "exact match", "KL", "TTFT s", "speedup"]))
        lines.append(_row(["---"] * 10))
        for r in rows:
            if r["workload"] == workload:
                lines.append(_row([
                    r["strategy"], f"{r['budget']:.0%}", f"{r['kv_kept']:.1%}", r["tasks"],
                    f"{r['delta_nll']:+.3f}", f"{r['agreement']:.2f}", f"{r['exact_match']:.2f}",
                    f"{r['kl']:.3f}", f"{r['ttft_s']:.2f}", f"{r['speedup']:.2f}x",
                ]))
        lines.append("")
    return "\n".join(lines)


def gate_table(data: dict) -> str:
    lines = [_row(["family", "workload", "verdict", "best / closest", "ΔNLL", "agreement",
                   "speedup"]), _row(["---"] * 7)]
    for entry in data.get("gate", []):
        measured = entry.get("measured", {})
        lines.append(_row([
            entry["family"], entry["workload"], "pass" if entry["passed"] else "fail",
            entry.get("method") or entry.get("closest") or "-",
            f"{measured.get('delta_nll', float('nan')):+.3f}",
            f"{measured.get('agreement', float('nan')):.2f}",
            f"{measured.get('speedup', float('nan')):.2f}x",
        ]))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    data = json.loads(open(argv[1]).read())
    print(f"Command: `{data['command']}`\n")
    print(gate_table(data))
    print()
    print(results_tables(data))
    pruning = pruning_tables(data)
    if pruning:
        print(pruning)
    reuse = data.get("reuse")
    if reuse:
        print(f"Reuse on simulated agent sessions ({reuse['sessions']} sessions x "
              f"{reuse['tasks_per_session']} tasks, {reuse['prefill_tokens']} prefill tokens): "
              f"an exact prefix cache could reuse {reuse['exact_prefix_share']:.1%}, chunk "
              f"composition {reuse['composition_share']:.1%} "
              f"({reuse['composition_share_after_recompute']:.1%} after recomputing "
              f"{reuse['recompute_ratio']:.0%}).")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
