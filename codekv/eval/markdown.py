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


def _peer(row: dict) -> bool:
    return row.get("kind") == "peer"


def results_tables(data: dict) -> str:
    lines = []
    for workload in dict.fromkeys(r["workload"] for r in data["results"]):
        lines += [f"### {workload}", ""]
        lines.append(_row(["method", "ratio", "tasks", "ΔNLL", "agreement", "exact match",
                           "KL", "TTFT s", "speedup"]))
        lines.append(_row(["---"] * 9))
        for r in data["results"]:
            if r["workload"] != workload or _pruning(r) or _peer(r):
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


def peer_table(data: dict) -> str:
    """The peer library (kvboost) on the same tokens; empty when it did not run."""
    rows = [r for r in data["results"] if _peer(r)]
    if not rows:
        return ""
    lines = [_row(["workload", "method", "tasks", "reused", "ΔNLL", "agreement", "exact match",
                   "KL", "TTFT s", "speedup"]), _row(["---"] * 10)]
    for r in rows:
        lines.append(_row([
            r["workload"], r["method"], r["tasks"], f"{1 - r['recompute_ratio']:.0%}",
            f"{r['delta_nll']:+.3f}", f"{r['agreement']:.2f}", f"{r['exact_match']:.2f}",
            f"{r['kl']:.3f}", f"{r['ttft_s']:.2f}", f"{r['speedup']:.2f}x",
        ]))
    return "\n".join(lines) + "\n"


def throughput_table(data: dict) -> str:
    """Requests per second over one agent session; empty when not measured."""
    rows = data.get("throughput") or []
    if not rows:
        return ""
    lines = [_row(["method", "requests", "tokens", "seconds", "requests/s", "vs full",
                   "median TTFT s", "store MiB", "peak RSS MiB (over model)"]),
             _row(["---"] * 9)]
    for r in rows:
        lines.append(_row([
            r["method"], r["requests"], r["tokens"], f"{r['seconds']:.1f}",
            f"{r['requests_per_s']:.2f}", f"{r['speedup']:.2f}x", f"{r['median_ttft_s']:.2f}",
            f"{r['store_bytes'] / 2**20:.0f}",
            "-" if r.get("peak_rss_mib") is None
            else f"{r['peak_rss_mib']:.0f} ({r['peak_over_model_mib']:+.0f})",
        ]))
    return "\n".join(lines) + "\n"


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
    for title, table in (("Peer library", peer_table(data)),
                         ("Throughput", throughput_table(data))):
        if table:
            print(f"### {title}\n\n{table}")
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
